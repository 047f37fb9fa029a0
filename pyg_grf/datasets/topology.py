r"""A generated node task whose labels need the 2-hop neighbourhood: a check that an attention
layer sees the graph's topology."""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np
import torch
from torch_geometric.data import Data

from pyg_grf.datasets.synthetic import GeneratedDataset


class TwoHopMajorityDataset(GeneratedDataset):
    r"""Node classification on random graphs (Erdős–Rényi of :obj:`mean_degree` plus a random
    spanning tree): each node is red (probability :obj:`p_red`) or blue, one-hot as its feature,
    and has label 1 iff red outnumbers blue among the nodes at distance 1 or 2 (itself excluded;
    ties 0). Neither its own colour nor the graph's decide it, so attention without topology is
    near chance, while two rounds of message passing or a mask covering the 2-hop ball (GRFs with
    ``max_length=1``: :math:`\widehat\Phi\widehat\Phi^\top` covers walks of up to 2 hops) can
    solve it.

    Args:
        root (str, optional): Cache folder; :obj:`None` keeps the dataset in memory only.
        num_graphs, num_nodes (int): Number of graphs, and nodes per graph.
        mean_degree (float): Mean degree of the random edges.
        p_red (float): Probability that a node is red.
        seed (int): Seed of the generator.
        transform, pre_transform, pre_filter, force_reload: As in PyG datasets.

    **STATS** (defaults, seed 0): 64 graphs of 60 nodes, mean degree about 4, labels 1 on
    about 40 % of the nodes.
    """
    settings = ('num_graphs', 'num_nodes_graph', 'mean_degree', 'p_red', 'seed')

    def __init__(self, root: Optional[str] = None, num_graphs: int = 64, num_nodes: int = 60,
                 mean_degree: float = 2.0, p_red: float = 0.45, seed: int = 0,
                 transform: Optional[Callable] = None, pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False) -> None:
        if num_graphs < 1 or num_nodes < 3:
            raise ValueError(f"Expected num_graphs >= 1 and num_nodes >= 3 (got {num_graphs} and "
                             f"{num_nodes})")
        if not 0.0 < p_red < 1.0 or mean_degree < 0:
            raise ValueError(f"Expected 0 < p_red < 1 and mean_degree >= 0 (got {p_red} and "
                             f"{mean_degree})")
        self.num_graphs, self.num_nodes_graph = int(num_graphs), int(num_nodes)
        self.mean_degree, self.p_red, self.seed = float(mean_degree), float(p_red), int(seed)
        super().__init__(root, transform, pre_transform, pre_filter, force_reload)

    def generate(self) -> List[Data]:
        rng = np.random.default_rng(self.seed)
        n = self.num_nodes_graph
        out = []
        for _ in range(self.num_graphs):  # a few dozen small graphs: generation, not a hot path
            A = np.triu(rng.random((n, n)) < self.mean_degree / (n - 1), 1)
            parent = (rng.random(n - 1) * np.arange(1, n)).astype(np.int64)  # random tree
            A[parent, np.arange(1, n)] = True
            A = A | A.T
            red = rng.random(n) < self.p_red
            ball = (A | ((A.astype(np.int64) @ A.astype(np.int64)) > 0))
            np.fill_diagonal(ball, False)
            reds = ball.astype(np.int64) @ red.astype(np.int64)
            blues = ball.sum(1) - reds
            row, col = np.nonzero(A)
            out.append(Data(
                x=torch.from_numpy(np.stack([red, ~red], 1).astype(np.float32)),
                edge_index=torch.from_numpy(np.stack([row, col])).long(),
                y=torch.from_numpy((reds > blues).astype(np.int64)),
                num_nodes=n))
        return out
