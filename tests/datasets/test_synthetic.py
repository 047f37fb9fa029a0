import networkx as nx
import numpy as np
import pytest
import torch
from networkx.algorithms.isomorphism import GraphMatcher
from torch_geometric.loader import DataLoader
from torch_geometric.utils import is_undirected, to_networkx

from pyg_grf.datasets import MOTIFS, InducedCycleDataset, MotifDataset, motif_graph
from pyg_grf.datasets.synthetic import node_features, random_binary_trees, tree_distances


def graphs_equal(a, b):
    return (a.num_nodes == b.num_nodes and torch.equal(a.edge_index, b.edge_index)
            and torch.equal(a.x, b.x) and torch.equal(a.y, b.y))


def as_nx(data):
    return to_networkx(data, to_undirected=True)


@pytest.mark.parametrize('cls,kwargs', [
    (MotifDataset, dict(motif='grid')),
    (InducedCycleDataset, {}),
])
def test_deterministic_from_seed(cls, kwargs):
    a = cls(num_graphs=20, seed=3, **kwargs)
    b = cls(num_graphs=20, seed=3, **kwargs)
    c = cls(num_graphs=20, seed=4, **kwargs)
    assert all(graphs_equal(a[i], b[i]) for i in range(20))
    assert not all(graphs_equal(a[i], c[i]) for i in range(20))


@pytest.mark.parametrize('cls,kwargs', [
    (MotifDataset, dict(motif='circle')),
    (InducedCycleDataset, {}),
])
@pytest.mark.parametrize('num_graphs', [10, 11])
def test_balanced_and_well_formed(cls, kwargs, num_graphs):
    dataset = cls(num_graphs=num_graphs, **kwargs)
    assert len(dataset) == num_graphs and dataset.num_classes == 2
    y = dataset.y
    assert y.dtype == torch.long and y.shape == (num_graphs, )
    assert abs(int((y == 1).sum()) - int((y == 0).sum())) <= 1
    for data in dataset:
        assert is_undirected(data.edge_index)
        assert not (data.edge_index[0] == data.edge_index[1]).any()  # no self-loops
        assert data.edge_index.unique(dim=1).size(1) == data.num_edges  # no duplicates
        assert data.x.shape == (data.num_nodes, 5) and data.x.dtype == torch.float


@pytest.mark.parametrize('motif', MOTIFS)
def test_motif_construction(motif):
    dataset = MotifDataset(motif=motif, num_graphs=8, seed=1)
    pattern = motif_graph(motif)
    h = pattern.number_of_nodes()
    assert h >= 9  # as in the paper (Fig. 5)
    assert nx.is_connected(pattern)
    for data in dataset:
        assert data.num_nodes == 100 + h  # both classes have the same size
        graph = as_nx(data)
        if int(data.y) == 1:  # positives contain the motif as a subgraph
            assert GraphMatcher(graph, pattern).subgraph_is_monomorphic()


def test_motif_average_degree():
    # The large ER graph has the motif's average degree: 3 for the 'caveman' motif.
    dataset = MotifDataset(motif='caveman', num_graphs=200, seed=0, num_join_edges=1)
    avg_edges = dataset.edge_index.size(1) / 2 / len(dataset)
    # E[#edges] = 150 (ER) + 18 (motif or its ER stand-in, in expectation) + 1 (join).
    assert abs(avg_edges - 169) < 3


@pytest.mark.parametrize('seed', [0, 1])
def test_induced_cycle_construction(seed):
    dataset = InducedCycleDataset(num_graphs=24, seed=seed)
    for data in dataset:
        graph = as_nx(data)
        assert data.num_nodes == 50
        assert nx.is_connected(graph)
        assert graph.number_of_edges() == 50  # a tree on 50 nodes plus one edge
        cycles = nx.cycle_basis(graph)
        assert len(cycles) == 1  # exactly one cycle (hence induced)
        length = len(cycles[0])
        assert length >= 3
        cycle_edges = list(zip(cycles[0], cycles[0][1:] + cycles[0][:1]))
        # The tree is the graph minus one cycle edge whose removal leaves max degree <= 3
        # (a binary tree: root with <= 2 children, other nodes with a parent and <= 2 children).
        diameters = []
        for u, v in cycle_edges:
            tree = graph.copy()
            tree.remove_edge(u, v)
            assert nx.is_tree(tree)
            if max(dict(tree.degree()).values()) <= 3:
                diameters.append(nx.diameter(tree))
        assert diameters
        if int(data.y) == 1:
            # The added edge joined two farthest nodes of its tree: cycle length = diameter + 1.
            assert length - 1 in diameters
        else:
            # The added edge joined nodes closer than the diameter of its tree.
            assert max(diameters) > length - 1


def test_binary_trees_and_distances():
    rng = np.random.default_rng(0)
    parents = random_binary_trees(rng, 16, 30)
    dist = tree_distances(parents)
    for parent, d in zip(parents, dist):
        assert parent[0] == -1 and (parent[1:] < np.arange(1, 30)).all()
        assert np.bincount(parent[1:], minlength=30).max() <= 2  # at most two children
        tree = nx.Graph(list(zip(range(1, 30), parent[1:].tolist())))
        ref = dict(nx.all_pairs_shortest_path_length(tree))
        assert all(d[i, j] == ref[i][j] for i in range(30) for j in range(30))


def test_node_features():
    # Path 0-1-2-3 plus edge 1-3: degrees 1, 3, 2, 2.
    edges = np.array([[0, 1], [1, 2], [2, 3], [1, 3]]).T
    edge_index = np.concatenate([edges, edges[::-1]], axis=1)
    x = node_features(edge_index, 5, 'neighbor_degrees')
    assert x.tolist() == [[3, 0, 0, 0, 0], [2, 2, 1, 0, 0], [3, 2, 0, 0, 0], [3, 2, 0, 0, 0],
                          [0, 0, 0, 0, 0]]
    assert node_features(edge_index, 5, 'degree').view(-1).tolist() == [1, 3, 2, 2, 0]
    assert node_features(edge_index, 5, 'constant').tolist() == [[1]] * 5
    dataset = InducedCycleDataset(num_graphs=4, features='degree')
    assert dataset[0].x.shape == (50, 1)


def test_cache_root_transforms_and_loader(tmp_path):
    class AddOne:
        def __call__(self, data):
            data = data.clone()
            data.x = data.x + 1
            return data

        def __repr__(self):
            return 'AddOne()'

    in_memory = MotifDataset(motif='ladder', num_graphs=6)
    cached = MotifDataset(str(tmp_path), motif='ladder', num_graphs=6)
    assert len(list((tmp_path / 'MotifDataset').glob('processed_*/MANIFEST.json'))) == 1
    again = MotifDataset(str(tmp_path), motif='ladder', num_graphs=6)
    for i in range(6):
        assert graphs_equal(in_memory[i], cached[i]) and graphs_equal(cached[i], again[i])

    pre = InducedCycleDataset(num_graphs=6, pre_transform=AddOne())
    post = InducedCycleDataset(num_graphs=6, transform=AddOne())
    plain = InducedCycleDataset(num_graphs=6)
    assert torch.equal(pre[0].x, plain[0].x + 1) and torch.equal(post[0].x, plain[0].x + 1)
    filtered = InducedCycleDataset(num_graphs=6, pre_filter=lambda d: int(d.y) == 1)
    assert len(filtered) == 3 and bool((filtered.y == 1).all())

    batch = next(iter(DataLoader(in_memory, batch_size=4)))
    assert batch.num_graphs == 4 and batch.y.shape == (4, )
    assert str(in_memory) == "MotifDataset(6, motif='ladder', seed=0)"
    assert str(plain) == 'InducedCycleDataset(6, seed=0)'


def test_default_size_matches_paper():
    dataset = InducedCycleDataset()
    assert len(dataset) == 4096 and int(dataset.y.sum()) == 2048


def test_bad_input():
    with pytest.raises(ValueError, match="Unknown motif 'star'; expected one of"):
        MotifDataset(motif='star')
    with pytest.raises(ValueError, match="Unknown node features 'pagerank'"):
        InducedCycleDataset(num_graphs=4, features='pagerank')
    with pytest.raises(ValueError, match='at least 2 graphs'):
        MotifDataset(num_graphs=1)
    with pytest.raises(ValueError, match='num_nodes >= 5'):
        InducedCycleDataset(num_graphs=4, num_nodes=4)
    with pytest.raises(TypeError, match="'root' to be a path or None"):
        InducedCycleDataset(100, 8)


def test_cache_is_keyed_on_the_transforms_full_configuration(tmp_path):
    # PyG's AddRandomWalkPE repr hides walk_length; asking for 4 after 8 used
    # to return the cached 8-dimensional PE
    from torch_geometric.transforms import AddRandomWalkPE

    from pyg_grf.datasets.cache import cache_folder_name, describe
    from pyg_grf.transforms import AddGraphRandomFeatures
    assert repr(AddRandomWalkPE(8)) == repr(AddRandomWalkPE(4))  # the trap
    a = MotifDataset(str(tmp_path), num_graphs=8, pre_transform=AddRandomWalkPE(8, 'pe'))
    b = MotifDataset(str(tmp_path), num_graphs=8, pre_transform=AddRandomWalkPE(4, 'pe'))
    assert a[0].pe.size(1) == 8 and b[0].pe.size(1) == 4
    # seeded transforms keep their key while their generator advances (private state)
    t = AddGraphRandomFeatures(num_walks=2, max_length=2, seed=0)
    before = cache_folder_name({}, t, None)
    t(MotifDataset(num_graphs=2)[0])
    assert cache_folder_name({}, t, None) == before
    assert describe(AddGraphRandomFeatures(num_draws=2)) != describe(AddGraphRandomFeatures())
