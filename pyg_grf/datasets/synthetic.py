r"""Generated graph tasks: the synthetic combinatorial-classification tasks of GKAT (Choromanski
et al., ICML 2022, *From block-Toeplitz matrices to differential equations on graphs*, Sec. 5.1 and
App. A.2), a node task whose labels need the 2-hop neighbourhood, and :class:`GeneratedDataset`,
the base of every generated dataset."""
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Tuple

import networkx as nx
import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.utils import to_undirected

from pyg_grf.datasets.cache import SafeCacheMixin

#: Number of neighbour degrees in the ``'neighbor_degrees'`` node features (GKAT Sec. 5.1.1).
NUM_NEIGHBOR_DEGREES = 5
FEATURES = ('neighbor_degrees', 'degree', 'constant')


_MOTIFS: Dict[str, Callable[[], nx.Graph]] = {
    'caveman': lambda: nx.connected_caveman_graph(3, 4),  # 3 rewired 4-cliques, 12 nodes
    'circle': lambda: nx.cycle_graph(10), 'grid': lambda: nx.grid_2d_graph(3, 3),
    'ladder': lambda: nx.ladder_graph(5), 'circular_ladder': lambda: nx.circular_ladder_graph(5)}
MOTIFS = tuple(_MOTIFS)


def motif_graph(name: str) -> nx.Graph:
    r"""The motif :obj:`name` (one of :obj:`MOTIFS`) with nodes :obj:`0, ..., h - 1`."""
    if name not in _MOTIFS:
        raise ValueError(f"Unknown motif {name!r}; expected one of {list(_MOTIFS)}")
    return nx.convert_node_labels_to_integers(_MOTIFS[name](), ordering='sorted')


def node_features(edge_index: np.ndarray, num_nodes: int, features: str) -> torch.Tensor:
    r"""Node features of a graph given by its (symmetric) :obj:`edge_index` [2, E]:

    * :obj:`"neighbor_degrees"`: the :obj:`NUM_NEIGHBOR_DEGREES` = 5 largest degrees of the
      node's neighbours in decreasing order, zero-padded (GKAT Sec. 5.1.1), float [N, 5];
    * :obj:`"degree"`: the node's degree, float [N, 1];
    * :obj:`"constant"`: ones, float [N, 1].
    """
    if features == 'constant':
        return torch.ones(num_nodes, 1)
    src, dst = edge_index
    deg = np.bincount(src, minlength=num_nodes)
    if features == 'degree':
        return torch.from_numpy(deg.astype(np.float32)).view(-1, 1)
    if features != 'neighbor_degrees':
        raise ValueError(f"Unknown node features {features!r}; expected one of {list(FEATURES)}")
    k = NUM_NEIGHBOR_DEGREES
    nbr_deg = deg[dst]
    order = np.lexsort((-nbr_deg, src))  # by source node, then by decreasing neighbour degree
    src, nbr_deg = src[order], nbr_deg[order]
    rank = np.arange(src.size) - np.searchsorted(src, src)  # position inside each source group
    keep = rank < k
    x = np.zeros((num_nodes, k), dtype=np.float32)
    x[src[keep], rank[keep]] = nbr_deg[keep]
    return torch.from_numpy(x)


def _to_data_list(rows: List[np.ndarray], cols: List[np.ndarray], num_nodes: int,
                  labels: np.ndarray, perms: np.ndarray, features: str) -> List[Data]:
    r"""One :class:`Data` per graph of :obj:`num_nodes` nodes from its undirected edges
    (:obj:`rows[g]`, :obj:`cols[g]`), relabelled by :obj:`perms[g]`, symmetrised, deduplicated and
    sorted, vectorised over the disjoint union."""
    G, N = len(rows), num_nodes
    sizes = np.array([r.size for r in rows])
    offset = np.repeat(np.arange(G, dtype=np.int64) * N, sizes)
    glob = (perms + np.arange(G)[:, None] * N).reshape(-1)  # global relabelling
    row = glob[np.concatenate(rows).astype(np.int64) + offset]
    col = glob[np.concatenate(cols).astype(np.int64) + offset]
    edge_index = to_undirected(torch.from_numpy(np.stack([row, col])), num_nodes=G * N)
    x = node_features(edge_index.numpy(), G * N, features)
    ptr = np.searchsorted(edge_index[0].numpy(), np.arange(G + 1) * N)
    edge_index = edge_index - torch.from_numpy(np.repeat(np.arange(G) * N, np.diff(ptr)))
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    return [Data(x=x[g * N:(g + 1) * N], edge_index=edge_index[:, ptr[g]:ptr[g + 1]],
                 y=y[g:g + 1]) for g in range(G)]


def _erdos_renyi(rng: np.random.Generator, p: float,
                 triu: Tuple[np.ndarray, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    mask = rng.random(triu[0].size) < p
    return triu[0][mask], triu[1][mask]


def _balanced_labels(rng: np.random.Generator, num_graphs: int) -> np.ndarray:
    labels = (np.arange(num_graphs) < (num_graphs + 1) // 2).astype(np.int64)
    rng.shuffle(labels)
    return labels


def _check_graphs(features: str, num_graphs: int) -> None:
    # The settings of both GKAT tasks: known node features, at least one graph per class.
    if features not in FEATURES:
        raise ValueError(f"Unknown node features {features!r}; expected one of {list(FEATURES)}")
    if num_graphs < 2:
        raise ValueError(f"Expected at least 2 graphs (got num_graphs={num_graphs})")


class GeneratedDataset(SafeCacheMixin, InMemoryDataset):
    r"""Base of the datasets made by :meth:`generate` from the attributes named in
    :attr:`settings`: in memory only without :obj:`root`, else cached to
    ``root/<class name>/processed_<hash>/data.pt``, the hash covering the settings and
    :attr:`version` (:class:`~.cache.SafeCacheMixin`)."""
    settings: Tuple[str, ...] = ()
    #: Bumped when :meth:`generate` changes, so that older caches are not reused.
    version: int = 1

    def __init__(self, root: Optional[str] = None, transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False) -> None:
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"Expected 'root' to be a path or None (got {type(root).__name__} "
                            f"{root!r}); pass the other settings by keyword")
        self._cached = root is not None
        super().__init__(None if root is None else str(root), transform, pre_transform,
                         pre_filter, force_reload=force_reload)
        if self._cached:
            self.load(self.processed_paths[0])
        else:
            self.data, self.slices = self.collate(self.pre_process(self.generate()))

    def generate(self) -> List[Data]:
        raise NotImplementedError

    @property
    def has_process(self) -> bool:
        return self._cached

    @property
    def raw_file_names(self) -> List[str]:
        return []

    def cache_key(self) -> Dict[str, Any]:
        return {'version': self.version, **{k: getattr(self, k) for k in self.settings}}

    @property
    def cache_parent(self) -> str:
        return osp.join(self.root, type(self).__name__)

    @property
    def processed_file_names(self) -> List[str]:
        return ['data.pt']

    def process(self) -> None:
        self.save(self.pre_process(self.generate()), self.processed_paths[0])

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({len(self)}, seed={self.seed})'


class MotifDataset(GeneratedDataset):
    r"""Erdos-Renyi graphs with or without a motif, the first combinatorial task of GKAT
    (`Choromanski et al., ICML 2022 <https://arxiv.org/abs/2107.07999>`_, Sec. 5.1.1 and
    App. A.2, after Nikolentzos & Vazirgiannis, 2020). Each graph joins an Erdos-Renyi graph on
    :obj:`num_nodes` nodes (the motif's expected average degree) by :obj:`num_join_edges` uniform
    distinct edges to a second part: the motif (:obj:`y = 1`) or an Erdos-Renyi graph of its size
    and average degree (:obj:`y = 0`; it may hold the motif by chance, labels follow the
    construction as in the paper). Motifs (>= 9 nodes, the paper's Fig. 5): :obj:`"caveman"`
    (connected caveman (3, 4)), :obj:`"circle"` (10-cycle), :obj:`"grid"` (3 x 3),
    :obj:`"ladder"` and :obj:`"circular_ladder"` (5 rungs). Node ids are shuffled per graph;
    features as :func:`node_features`; :obj:`y` long, balanced (odd: one more positive), shuffled.

    Args:
        root (str, optional): Cache folder; :obj:`None` keeps the dataset in memory only.
        motif (str): The motif.
        num_graphs (int): Number of graphs; the paper uses 2 x 2,048.
        seed (int): Seed of the generator; the dataset is a function of the arguments.
        num_nodes (int): Nodes of the large Erdos-Renyi graph.
        num_join_edges (int): Edges joining the two parts.
        features (str): Node features (:obj:`FEATURES`).
        transform, pre_transform, pre_filter, force_reload: As in PyG datasets (the
            ``pre_*`` ones applied once, after generation).

    **STATS** (defaults): 4,096 graphs, 2 classes; 112 nodes and ~171 undirected edges
    (caveman), 110 / ~113 (circle), 109 / ~148 (grid), 110 / ~146 (ladder), 110 / ~168
    (circular_ladder).
    """
    settings = ('motif', 'num_graphs', 'num_nodes_er', 'num_join_edges', 'seed', 'features')

    def __init__(self, root: Optional[str] = None, motif: str = 'caveman',
                 num_graphs: int = 4096, seed: int = 0, num_nodes: int = 100,
                 num_join_edges: int = 3, features: str = 'neighbor_degrees',
                 transform: Optional[Callable] = None, pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False) -> None:
        self.motif_graph = motif_graph(motif)  # validates the name
        _check_graphs(features, num_graphs)
        h = self.motif_graph.number_of_nodes()
        if not 1 <= num_join_edges <= num_nodes * h:
            raise ValueError(f"Expected 1 <= num_join_edges <= {num_nodes * h} "
                             f"(got {num_join_edges})")
        if num_nodes < 2:
            raise ValueError(f"Expected num_nodes >= 2 (got {num_nodes})")
        self.motif, self.name, self.features = motif, f'motif-{motif}', features
        self.num_graphs, self.seed = int(num_graphs), int(seed)
        self.num_nodes_er, self.num_join_edges = int(num_nodes), int(num_join_edges)
        super().__init__(root, transform, pre_transform, pre_filter, force_reload)

    def generate(self) -> List[Data]:
        rng = np.random.default_rng(self.seed)
        n = self.num_nodes_er
        motif = np.array(self.motif_graph.edges(), dtype=np.int64).T
        h = self.motif_graph.number_of_nodes()
        avg_degree = 2.0 * motif.shape[1] / h
        p_large = min(avg_degree / (n - 1), 1.0)
        p_small = min(avg_degree / (h - 1), 1.0)
        triu_large, triu_small = np.triu_indices(n, 1), np.triu_indices(h, 1)

        labels = _balanced_labels(rng, self.num_graphs)
        rows, cols, perms = [], [], []
        for label in labels:
            row_l, col_l = _erdos_renyi(rng, p_large, triu_large)
            if label == 1:
                row_s, col_s = motif
            else:
                row_s, col_s = _erdos_renyi(rng, p_small, triu_small)
            join = rng.choice(n * h, size=self.num_join_edges, replace=False)
            rows.append(np.concatenate([row_l, row_s + n, join // h]))
            cols.append(np.concatenate([col_l, col_s + n, join % h + n]))
            perms.append(rng.permutation(n + h))
        return _to_data_list(rows, cols, n + h, labels, np.stack(perms), self.features)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({len(self)}, motif={self.motif!r}, '
                f'seed={self.seed})')


def random_binary_trees(rng: np.random.Generator, num_trees: int, num_nodes: int) -> np.ndarray:
    r"""Random binary trees (:obj:`parent` [num_trees, num_nodes], root 0 with parent -1, parents
    before children): node :obj:`v` takes a uniform free child slot (the shapes of random binary
    search trees), vectorised over the trees."""
    T, n = num_trees, num_nodes
    parent = np.full((T, n), -1, dtype=np.int64)
    slots = np.zeros((T, n + 1), dtype=np.int64)  # before attaching v, slots[:, :v + 1] are free
    arange = np.arange(T)
    u = rng.random((T, n))
    for v in range(1, n):
        i = (u[:, v] * (v + 1)).astype(np.int64)  # uniform among the v + 1 free slots
        parent[:, v] = slots[arange, i]
        slots[arange, i] = slots[:, v]  # remove slot i (swap with the last free slot) ...
        slots[:, v] = v  # ... and add the two child slots of v
        slots[:, v + 1] = v
    return parent


def tree_distances(parent: np.ndarray) -> np.ndarray:
    r"""All-pairs hop distances [..., N, N] of rooted trees given by :obj:`parent` [..., N]
    (parents before children, root 0), from ancestor matrices:
    dist(i, j) = depth(i) + depth(j) - 2 depth(lca(i, j))."""
    batch_shape, n = parent.shape[:-1], parent.shape[-1]
    parent = parent.reshape(-1, n)
    T, arange = parent.shape[0], np.arange(parent.shape[0])
    anc = np.zeros((T, n, n), dtype=np.float32)  # anc[t, i, a] = 1 if a is i or an ancestor
    anc[:, 0, 0] = 1
    for v in range(1, n):
        anc[:, v] = anc[arange, parent[:, v]]
        anc[:, v, v] = 1
    depth = anc.sum(-1) - 1
    lca_depth = np.rint(anc @ anc.transpose(0, 2, 1)) - 1
    dist = depth[:, :, None] + depth[:, None, :] - 2 * lca_depth
    return dist.astype(np.int64).reshape(*batch_shape, n, n)


class InducedCycleDataset(GeneratedDataset):
    r"""Binary trees closed into one cycle, the second combinatorial task of GKAT
    (`Choromanski et al., ICML 2022 <https://arxiv.org/abs/2107.07999>`_, Sec. 5.1.2): is the
    (only, hence induced) cycle as long as the tree's diameter + 1, a global property local
    message passing cannot see? A random binary tree (:func:`random_binary_trees`) gets one edge
    between a uniform diameter pair (:obj:`y = 1`) or a uniform pair at distance in [2, diameter)
    (:obj:`y = 0`). Node ids shuffled per graph; features as :func:`node_features`; :obj:`y` long,
    balanced, shuffled.

    Args:
        root (str, optional): Cache folder; :obj:`None` keeps the dataset in memory only.
        num_graphs (int): Number of graphs; the paper uses 2,048 trees with one positive and
            one negative example each.
        seed (int): Seed of the generator.
        num_nodes (int): Nodes per tree.
        features (str): Node features (:obj:`FEATURES`).
        transform, pre_transform, pre_filter, force_reload: As in PyG datasets (the
            ``pre_*`` ones applied once, after generation).

    **STATS** (defaults): 4,096 graphs of 50 nodes and 50 undirected edges, 2 classes.
    """
    settings = ('num_graphs', 'num_nodes_tree', 'seed', 'features')

    def __init__(self, root: Optional[str] = None, num_graphs: int = 4096, seed: int = 0,
                 num_nodes: int = 50, features: str = 'neighbor_degrees',
                 transform: Optional[Callable] = None, pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False) -> None:
        _check_graphs(features, num_graphs)
        if num_nodes < 5:
            # A negative needs a pair at distance in [2, diameter), so diameter >= 3.
            raise ValueError(f"Expected num_nodes >= 5 (got {num_nodes})")
        self.name, self.features = 'induced-cycle', features
        self.num_graphs, self.num_nodes_tree, self.seed = int(num_graphs), int(num_nodes), int(seed)
        super().__init__(root, transform, pre_transform, pre_filter, force_reload)

    def generate(self) -> List[Data]:
        rng = np.random.default_rng(self.seed)
        G, n = self.num_graphs, self.num_nodes_tree
        labels = _balanced_labels(rng, G)
        triu = np.triu_indices(n, 1)
        rows, cols = [], []
        for start in range(0, G, 1024):  # chunks bound the [chunk, n, n] distance arrays
            lab = labels[start:start + 1024]
            parent = random_binary_trees(rng, lab.size, n)
            dist = tree_distances(parent)[:, triu[0], triu[1]]  # [chunk, n(n-1)/2]
            diameter = dist.max(1, keepdims=True)
            # A binary tree on >= 5 nodes has diameter >= 3, so both sets are never empty.
            allowed = np.where(lab[:, None] == 1, dist == diameter,
                               (dist >= 2) & (dist < diameter))
            # Uniform choice among the allowed pairs: argmax of uniform scores on them.
            pick = np.argmax(np.where(allowed, rng.random(dist.shape), -1.0), axis=1)
            for t in range(lab.size):
                rows.append(np.append(np.arange(1, n), triu[0][pick[t]]))
                cols.append(np.append(parent[t, 1:], triu[1][pick[t]]))
        perms = rng.permuted(np.tile(np.arange(n), (G, 1)), axis=1)
        return _to_data_list(rows, cols, n, labels, perms, self.features)


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
