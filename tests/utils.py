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


def cached_dataset(root, make_graphs, transform=None, pre_transform=None):
    """A PyG InMemoryDataset of ``make_graphs()`` cached under ``root``: ``pre_transform`` runs
    once and is saved, ``transform`` runs at every access (as with any PyG dataset)."""
    from torch_geometric.data import InMemoryDataset

    class _Cached(InMemoryDataset):
        def __init__(self):
            super().__init__(str(root), transform, pre_transform)
            self.load(self.processed_paths[0])

        @property
        def raw_file_names(self):
            return []

        @property
        def processed_file_names(self):
            return ['data.pt']

        def download(self):
            pass

        def process(self):
            data = make_graphs()
            if self.pre_transform is not None:
                data = [self.pre_transform(d) for d in data]
            self.save(data, self.processed_paths[0])

    return _Cached()


def dense_masked_linear_attention(phi_q, phi_k, v, mask=None, eps=1e-6):
    r"""Masked linear attention with the :math:`N \times N` matrix formed explicitly, O(N^2):
    :math:`A_{ij} = \phi(q_i)^\top\phi(k_j) M_{ij}`, rows normalised; ``phi_q``, ``phi_k``
    ``[N, H, m]``, ``v`` ``[N, H, d]``, ``mask`` ``[N, N]`` or ``[H, N, N]``."""
    a = torch.einsum('ihm,jhm->hij', phi_q, phi_k)
    if mask is not None:
        a = a * (mask if mask.dim() == 3 else mask.unsqueeze(0)).to(a.dtype)
    out = torch.einsum('hij,jhd->ihd', a, v)
    return out / (a.sum(-1).t().unsqueeze(-1) + eps)


def node_matrix(walks):
    """The walks of a RandomWalks as a padded [W, L + 1] matrix of visited nodes (-1 after the
    end); column 0 is the start node."""
    out = torch.full((walks.num_walkers, walks.max_length + 1), -1, dtype=torch.long)
    out[:, 0] = walks.start
    out[walks.record_walker(), walks.record_step()] = walks.node
    return out


def edge_matrix(walks):
    """[W, L] edge ids taken at each hop of a RandomWalks, -1 after the end."""
    out = torch.full((walks.num_walkers, walks.max_length), -1, dtype=torch.long)
    out[walks.record_walker(), walks.record_step() - 1] = walks.edge
    return out
