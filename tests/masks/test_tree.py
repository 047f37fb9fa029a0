import networkx as nx
import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.masks import TreeMask
from tests.masks._utils import check_attention, dense_apply


def random_forest(sizes, seed, weighted=True):
    r"""Random labelled trees of the given sizes, disjoint, with shuffled node ids. Returns the
    networkx graph and the PyG ``edge_index`` / ``edge_weight`` (both directions)."""
    rng = np.random.default_rng(seed)
    trees = [nx.random_labeled_tree(n, seed=int(rng.integers(1 << 30))) for n in sizes]
    G = nx.disjoint_union_all(trees)
    N = G.number_of_nodes()
    perm = rng.permutation(N)
    G = nx.relabel_nodes(G, {i: int(perm[i]) for i in range(N)})
    for u, v in G.edges:
        G[u][v]['weight'] = float(rng.uniform(0.1, 2.0)) if weighted else 1.0
    e = np.array(list(G.edges), dtype=np.int64).reshape(-1, 2).T
    w = np.array([G[u][v]['weight'] for u, v in G.edges])
    edge_index = torch.from_numpy(np.concatenate([e, e[::-1]], axis=1).copy())
    edge_weight = torch.from_numpy(np.concatenate([w, w]))
    return G, edge_index, edge_weight


def nx_distances(G, weighted):
    N = G.number_of_nodes()
    D = np.full((N, N), np.inf)
    for s, lengths in nx.shortest_path_length(G, weight='weight' if weighted else None):
        for t, d in lengths.items():
            D[s, t] = d
    return torch.from_numpy(D)


def exp_reference(D, a, b):
    same = torch.isfinite(D)
    return torch.where(same, torch.exp(a * D.nan_to_num(posinf=0.0) + b), torch.zeros_like(D))


def hop_reference(D, f):
    same = torch.isfinite(D)
    idx = D.nan_to_num(posinf=0.0).long()
    return f[..., idx] * same.to(f.dtype)


FORESTS = [([12], 0), ([1, 7, 12, 3], 1), ([20], 2), ([5, 5, 2, 1, 9], 3), ([30, 4], 4)]


@pytest.mark.parametrize('sizes,seed', FORESTS)
def test_tree_exp_mask_weighted(sizes, seed):
    G, edge_index, edge_weight = random_forest(sizes, seed)
    N = G.number_of_nodes()
    a, b = -0.7, 0.3
    mask = TreeMask(edge_index, N, edge_weight, a=a, b=b)
    assert mask.num_trees == len(sizes)
    ref = exp_reference(nx_distances(G, weighted=True), a, b)
    assert torch.allclose(mask.to_dense(), ref, atol=1e-12)
    x = torch.randn(N, 4, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), ref @ x, atol=1e-10)
    x = torch.randn(N, 2, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(ref, x), atol=1e-10)
    # One direction only gives the same forest.
    half = TreeMask(edge_index[:, :N - len(sizes)], N, edge_weight[:N - len(sizes)], a=a, b=b)
    assert torch.allclose(half.matmul(x), mask.matmul(x), atol=1e-12)


@pytest.mark.parametrize('sizes,seed', FORESTS)
def test_tree_hop_mask(sizes, seed):
    G, edge_index, _ = random_forest(sizes, seed, weighted=False)
    N = G.number_of_nodes()
    D = nx_distances(G, weighted=False)
    diam = int(D[torch.isfinite(D)].max())
    mask = TreeMask(edge_index, N, f=torch.randn(diam + 1, dtype=torch.float64))
    assert mask.diameter == diam
    ref = hop_reference(D, mask.f)
    assert torch.equal(mask.to_dense(), ref)
    x = torch.randn(N, 5, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), ref @ x, atol=1e-10)

    f = torch.randn(3, diam + 4, dtype=torch.float64)  # per head, longer than needed
    mask = TreeMask(edge_index, N, f=f)
    assert mask.num_heads == 3
    ref = hop_reference(D, f)
    assert torch.equal(mask.to_dense(), ref)
    x = torch.randn(N, 3, 2, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(ref, x), atol=1e-10)


def test_tree_exp_unweighted_equals_hop():
    G, edge_index, _ = random_forest([15, 6], seed=7, weighted=False)
    N = G.number_of_nodes()
    a, b = -0.4, 0.1
    exp_mask = TreeMask(edge_index, N, a=a, b=b)
    hop_mask = TreeMask(edge_index, N, f=torch.exp(a * torch.arange(N, dtype=torch.float64) + b))
    x = torch.randn(N, 3, dtype=torch.float64)
    assert torch.allclose(exp_mask.matmul(x), hop_mask.matmul(x), atol=1e-12)


def test_tree_per_head_exp():
    G, edge_index, edge_weight = random_forest([9, 4], seed=5)
    N = G.number_of_nodes()
    a = torch.tensor([-1.0, -0.2, 0.3], dtype=torch.float64)
    b = torch.tensor([0.0, 0.5, -0.5], dtype=torch.float64)
    mask = TreeMask(edge_index, N, edge_weight, a=a, b=b)
    assert mask.num_heads == 3
    D = nx_distances(G, weighted=True)
    ref = torch.stack([exp_reference(D, a[h], b[h]) for h in range(3)])
    assert torch.allclose(mask.to_dense(), ref, atol=1e-12)
    x = torch.randn(N, 3, 2, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(ref, x), atol=1e-10)
    # Per-head a with a shared b.
    mask = TreeMask(edge_index, N, edge_weight, a=a, b=0.2)
    ref = torch.stack([exp_reference(D, a[h], 0.2) for h in range(3)])
    assert torch.allclose(mask.matmul(x), dense_apply(ref, x), atol=1e-10)
    check_attention(mask)


def test_tree_pyg_batch():
    datas, Gs = [], []
    for seed, n in enumerate([6, 1, 11]):
        G, edge_index, edge_weight = random_forest([n], seed + 10)
        datas.append(Data(edge_index=edge_index, edge_weight=edge_weight, num_nodes=n))
        Gs.append(G)
    batch = Batch.from_data_list(datas)
    N = batch.num_nodes
    mask = TreeMask(batch.edge_index, N, batch.edge_weight, a=-0.5)
    ref = torch.block_diag(*[exp_reference(nx_distances(G, True), -0.5, 0.0) for G in Gs])
    assert torch.allclose(mask.to_dense(), ref, atol=1e-12)
    x = torch.randn(N, 2, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(ref, x), atol=1e-10)
    check_attention(mask)
    hop = TreeMask(batch.edge_index, N, f=torch.rand(2, 12, dtype=torch.float64))
    assert torch.allclose(hop.matmul(x), dense_apply(hop.to_dense(), x), atol=1e-10)
    check_attention(hop)


def test_tree_hand_written():
    # Star 0-1, 0-2, 2-3 plus an isolated node 4; dist(1, 3) = 1 + 2 + 3 with weights.
    edge_index = torch.tensor([[0, 0, 2], [1, 2, 3]])
    mask = TreeMask(edge_index, 5, torch.tensor([1.0, 2.0, 3.0]), a=-1.0, b=0.5)
    assert str(mask) == 'TreeMask(num_nodes=5, num_trees=2, a=-1.0, b=0.5, weighted=True)'
    dense = mask.to_dense()
    assert torch.isclose(dense[1, 3], torch.exp(torch.tensor(-6.0 + 0.5)))
    assert dense[4, 4] == torch.exp(torch.tensor(0.5)) and dense[0, 4] == 0
    hop = TreeMask(edge_index, 5, f=torch.tensor([1.0, 0.5, 0.25, 0.125]))
    assert str(hop) == 'TreeMask(num_nodes=5, num_trees=2, f=[4])'
    assert hop.to_dense()[1, 3] == 0.125 and hop.to_dense()[3, 4] == 0


def test_tree_deep_path():
    # A path: one level per node, the worst case for the level loop.
    N = 60
    edge_index = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    mask = TreeMask(edge_index, N, a=-0.1)
    i = torch.arange(N, dtype=torch.float64)
    ref = torch.exp(-0.1 * (i.view(-1, 1) - i.view(1, -1)).abs())
    x = torch.randn(N, 2, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), ref @ x, atol=1e-10)
    hop = TreeMask(edge_index, N, f=torch.randn(N, dtype=torch.float64))
    assert hop.diameter == N - 1
    assert torch.allclose(hop.matmul(x), hop.to_dense() @ x, atol=1e-10)


def test_tree_gradcheck():
    _, edge_index, edge_weight = random_forest([5, 3], seed=3)
    N = 8
    x = torch.randn(N, 2, dtype=torch.float64)
    a = torch.tensor(-0.6, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    M = edge_index.size(1) // 2  # one direction per edge, so perturbed weights stay consistent
    w = edge_weight[:M].clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: TreeMask(edge_index, N, edge_weight, a=a, b=b).matmul(x), (a, b))
    assert torch.autograd.gradcheck(
        lambda w: TreeMask(edge_index[:, :M], N, w, a=-0.6).matmul(x), (w, ))
    ah = torch.tensor([-0.6, 0.1], dtype=torch.float64, requires_grad=True)
    xh = torch.randn(N, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, x: TreeMask(edge_index, N, edge_weight, a=a).matmul(x), (ah, xh))
    f = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda f, x: TreeMask(edge_index, N, f=f).matmul(x), (f, xh))


def test_tree_bad_input():
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])  # a triangle
    with pytest.raises(ValueError, match=r'forest \(no cycles\).*3 undirected edges on 4 nodes'):
        TreeMask(edge_index, 4, a=-1.0)
    with pytest.raises(ValueError, match='self-loop at node 2'):
        TreeMask(torch.tensor([[0, 2], [1, 2]]), 3, a=-1.0)
    path = torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match=r'diameter 3.*at least 4 entries, got 3'):
        TreeMask(path, 4, f=torch.randn(3))
    with pytest.raises(ValueError, match="exactly one of 'a'"):
        TreeMask(path, 4)
    with pytest.raises(ValueError, match="exactly one of 'a'"):
        TreeMask(path, 4, a=1.0, f=torch.randn(4))
    with pytest.raises(ValueError, match="got both 'f' and 'edge_weight'"):
        TreeMask(path, 4, torch.ones(3), f=torch.randn(4))
    with pytest.raises(ValueError, match=r"'edge_weight' must have shape \[3\]"):
        TreeMask(path, 4, torch.ones(2), a=1.0)
    with pytest.raises(ValueError, match='different weights'):
        TreeMask(torch.tensor([[0, 1], [1, 0]]), 2, torch.tensor([1.0, 2.0]), a=1.0)
    with pytest.raises(ValueError, match=r'node ids in \[0, 3\)'):
        TreeMask(path, 3, a=1.0)
    with pytest.raises(ValueError, match='same length'):
        TreeMask(path, 4, a=torch.ones(2), b=torch.ones(3))


@pytest.mark.parametrize('dtype,a,tol', [(torch.float32, 0.05, 1e-4), (torch.float64, 0.3, 1e-10),
                                         (torch.float64, -0.3, 1e-10)])
def test_path_with_growing_mask_has_no_cancellation(dtype, a, tol):
    from pyg_grf.masks import TreeMask
    N = 300
    ei = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    mask = TreeMask(ei, N, a=a, b=0.1)
    x = torch.rand(N, 3, dtype=dtype) + 0.1
    out = mask.matmul(x)
    i = torch.arange(N, dtype=torch.float64)
    dense = torch.exp(a * (i.view(-1, 1) - i.view(1, -1)).abs() + 0.1)  # independent reference
    ref = dense @ x.double()
    rel = ((out.double() - ref).abs() / ref.abs()).max().item()
    assert rel < tol  # was 1.3 (float32, a = 0.05) and 1e23 (float64, a = 0.3)


def test_branching_tree_per_head_equals_dense():
    from pyg_grf.masks import TreeMask
    gen = torch.Generator().manual_seed(0)
    N = 400
    parent = (torch.rand(N - 1, generator=gen) * torch.arange(1, N)).long()  # random tree
    # plus a deep path hanging below the last node, and a star
    ei = torch.stack([torch.arange(1, N), parent])
    w = torch.rand(N - 1, generator=gen, dtype=torch.float64) + 0.5
    mask = TreeMask(ei, N, w, a=torch.tensor([0.4, -0.7, 0.05], dtype=torch.float64),
                    b=torch.tensor([0.0, 0.2, -0.1], dtype=torch.float64))
    x = torch.rand(N, 3, 2, generator=gen, dtype=torch.float64) + 0.1
    out = mask.matmul(x)
    ref = torch.einsum('hij,jhc->ihc', mask.to_dense(), x)
    assert ((out - ref).abs() / ref.abs()).max().item() < 1e-10
