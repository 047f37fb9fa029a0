"""Small graph builders shared by the tests (independent of the package under test)."""
import torch
from torch_geometric.utils import erdos_renyi_graph, to_undirected


def grid_graph(rows: int, cols: int) -> torch.Tensor:
    """4-neighbour grid, both directions, no self-loops."""
    idx = torch.arange(rows * cols).view(rows, cols)
    e = torch.cat([
        torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)]),
        torch.stack([idx[:-1].reshape(-1), idx[1:].reshape(-1)]),
    ], dim=1)
    return to_undirected(e, num_nodes=rows * cols)


def path_graph(n: int) -> torch.Tensor:
    return to_undirected(torch.stack([torch.arange(n - 1), torch.arange(1, n)]), num_nodes=n)


def er_graph(n: int, p: float, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return to_undirected(erdos_renyi_graph(n, p), num_nodes=n)
