import math

import pytest
import torch

from pyg_grf.walks import sample_walks
from tests.utils import edge_matrix, grid_graph, node_matrix, path_graph


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize('walker', ['iid', 'antithetic', 'repelling'])
def test_walks_follow_edges_and_are_reproducible(walker):
    ei = grid_graph(5, 6)
    N = 30
    rw = sample_walks(ei, N, 6, 0.3, 7, walker=walker, generator=gen(1))
    rw2 = sample_walks(ei, N, 6, 0.3, 7, walker=walker, generator=gen(1))
    nodes, edges = node_matrix(rw), edge_matrix(rw)
    assert torch.equal(nodes, node_matrix(rw2))
    assert nodes.shape == (N * 6, 8)
    assert torch.equal(nodes[:, 0], torch.arange(N).repeat_interleave(6))
    # every hop uses an edge that goes from the previous node to the next one
    valid = edges >= 0
    assert torch.equal(valid.sum(1), rw.length)
    e = edges[valid]
    assert torch.equal(ei[0, e], nodes[:, :-1][valid])
    assert torch.equal(ei[1, e], nodes[:, 1:][valid])
    # padding after the end
    ar = torch.arange(8).view(1, -1)
    assert torch.equal(nodes >= 0, ar <= rw.length.view(-1, 1))


@pytest.mark.parametrize('walker', ['iid', 'antithetic', 'repelling'])
@pytest.mark.parametrize('p_halt', [0.2, 0.5, 0.7])
def test_length_distribution_is_truncated_geometric(walker, p_halt):
    # On a graph without sinks, P(len >= k) = (1 - p)^k for k <= L for every scheme.
    ei = grid_graph(10, 10)
    L, n = 6, 50
    rw = sample_walks(ei, 100, n, p_halt, L, walker=walker, generator=gen(2))
    W = rw.length.numel()
    for k in range(1, L + 1):
        p = (1 - p_halt) ** k
        emp = (rw.length >= k).double().mean().item()
        # antithetic pairs are dependent: at most doubles the variance of the mean
        se = math.sqrt(2 * p * (1 - p) / W)
        assert abs(emp - p) < 5 * se + 1e-9, (k, emp, p)


def test_antithetic_pairs_never_halt_together():
    ei = grid_graph(6, 6)
    rw = sample_walks(ei, 36, 4, 0.5, 12, walker='antithetic', generator=gen(3))
    lengths = rw.length.view(36, 2, 2)  # [start, pair, member]
    # with p_halt = 1/2 exactly one walker of an active pair halts at each step
    assert bool((lengths[..., 0] != lengths[..., 1]).all())


@pytest.mark.parametrize('p_halt', [0.3, 0.5])
def test_antithetic_joint_law_of_pairs(p_halt):
    # Exact joint law of the lengths (a, b) of an antithetic pair under per-step coupled
    # uniforms u, (u + 1/2) mod 1 with p <= 1/2: before either halts, each step has outcomes
    # (first halts, second halts, neither) with probabilities (p, p, 1 - 2p); afterwards the
    # survivor halts with p per step; both truncated at L.
    L, n, S = 5, 8, 400
    p, q = p_halt, 1 - 2 * p_halt

    def exact(a, b):
        if a == b:
            return q ** L if a == L else 0.0
        lo, hi = min(a, b), max(a, b)
        tail = (1 - p) ** (hi - lo - 1) * (p if hi < L else 1.0)
        return q ** lo * p * tail

    ei = grid_graph(20, 20)
    rw = sample_walks(ei, S, n, p_halt, L, walker='antithetic', generator=gen(4))
    pairs = rw.length.view(S, n // 2, 2).reshape(-1, 2)
    M = pairs.size(0)
    counts = torch.zeros(L + 1, L + 1)
    counts.index_put_((pairs[:, 0], pairs[:, 1]), torch.ones(M), accumulate=True)
    total = 0.0
    for a in range(L + 1):
        for b in range(L + 1):
            pr = exact(a, b)
            total += pr
            se = math.sqrt(max(pr * (1 - pr), 1e-12) / M)
            assert abs(counts[a, b].item() / M - pr) < 5 * se + 1e-9, (a, b, counts[a, b] / M, pr)
    assert total == pytest.approx(1.0)


def test_repelling_walkers_take_distinct_neighbours():
    # Star: centre 0 with 6 leaves. 6 fixed-length walkers from the centre must spread over
    # all 6 leaves at their first hop.
    leaves = torch.arange(1, 7)
    ei = torch.cat([torch.stack([torch.zeros(6, dtype=torch.long), leaves]),
                    torch.stack([leaves, torch.zeros(6, dtype=torch.long)])], 1)
    for seed in range(20):
        rw = sample_walks(ei, 7, 6, None, 1, walker='repelling', fixed_length=True,
                          start=torch.tensor([0]), generator=gen(seed))
        first = node_matrix(rw)[:, 1]
        assert sorted(first.tolist()) == list(range(1, 7))


def test_repelling_marginal_is_uniform():
    # One walker's first hop from the centre of a star with 5 leaves, 3 walkers per start:
    # each leaf with probability 1/5 for walker 0.
    leaves = torch.arange(1, 6)
    ei = torch.cat([torch.stack([torch.zeros(5, dtype=torch.long), leaves]),
                    torch.stack([leaves, torch.zeros(5, dtype=torch.long)])], 1)
    S = 4000
    rw = sample_walks(ei, 6, 3, None, 1, walker='repelling', fixed_length=True,
                      start=torch.zeros(S, dtype=torch.long), generator=gen(4))
    first = node_matrix(rw)[::3, 1]  # walker 0 of every start
    counts = torch.bincount(first, minlength=6)[1:].double()
    expected = S / 5
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.5  # chi-square, 4 dof, p ~ 4e-4
    # and within each start the three walkers are distinct
    trip = node_matrix(rw)[:, 1].view(S, 3)
    assert bool((trip[:, 0] != trip[:, 1]).all() & (trip[:, 1] != trip[:, 2]).all()
                & (trip[:, 0] != trip[:, 2]).all())


def test_fixed_length_and_truncation():
    ei = path_graph(5)
    rw = sample_walks(ei, 5, 3, None, 4, fixed_length=True, generator=gen(0))
    assert bool((rw.length == 4).all())
    rw = sample_walks(ei, 5, 3, 0.01, 2, generator=gen(0))
    assert int(rw.length.max()) <= 2


def test_isolated_nodes_sinks_self_loops_multi_edges():
    # node 0 -> 1 (twice), 0 -> 2; 1 -> 1 (self-loop); 2 has no out-edges; 3 isolated.
    ei = torch.tensor([[0, 0, 0, 1], [1, 1, 2, 1]])
    rw = sample_walks(ei, 4, 3000, None, 3, fixed_length=True, start=torch.tensor([0, 2, 3]),
                      generator=gen(5))
    nodes = node_matrix(rw).view(3, 3000, 4)
    # isolated node and sink: no hops at all
    assert bool((rw.length.view(3, 3000)[1:] == 0).all())
    assert bool((nodes[1:, :, 1:] == -1).all())
    # from 0: multi-edge to 1 chosen with probability 2/3; then the self-loop keeps it at 1;
    # after stepping to the sink 2 the walk ends
    first = nodes[0, :, 1]
    frac = (first == 1).double().mean().item()
    assert abs(frac - 2 / 3) < 5 * math.sqrt(2 / 9 / 3000)
    to_one = first == 1
    assert bool((nodes[0, to_one, 2:] == 1).all())
    assert bool((rw.length.view(3, 3000)[0, ~to_one] == 1).all())
    assert bool((nodes[0, ~to_one, 2:] == -1).all())


def test_directed_graph_follows_edge_direction():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])  # directed 3-cycle
    rw = sample_walks(ei, 3, 2, None, 5, fixed_length=True, generator=gen(0))
    nodes = node_matrix(rw)
    assert torch.equal(nodes[:, 1:], (nodes[:, :-1] + 1) % 3)


def test_empty_graph_and_no_edges():
    rw = sample_walks(torch.empty(2, 0, dtype=torch.long), 0, 2, 0.5, 3)
    assert node_matrix(rw).shape == (0, 4)
    rw = sample_walks(torch.empty(2, 0, dtype=torch.long), 3, 2, 0.5, 3)
    assert bool((rw.length == 0).all())


@pytest.mark.parametrize('kwargs,match', [
    (dict(p_halt=0.0), 'p_halt'),
    (dict(p_halt=1.0), 'p_halt'),
    (dict(p_halt=float('nan')), 'p_halt'),
    (dict(num_walks=0), 'num_walks'),
    (dict(max_length=-1), 'max_length'),
    (dict(walker='lazy'), 'walker'),
])
def test_bad_arguments(kwargs, match):
    args = dict(num_walks=2, p_halt=0.5, max_length=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sample_walks(path_graph(3), 3, args.pop('num_walks'), args.pop('p_halt'),
                     args.pop('max_length'), **args)


def test_bad_edge_index():
    with pytest.raises(ValueError, match=r'node ids in \[0, 5\] but the graph has 3 nodes'):
        sample_walks(torch.tensor([[0, 5], [1, 2]]), 3, 1, 0.5, 2)
    with pytest.raises(ValueError, match='shape'):
        sample_walks(torch.tensor([0, 1]), 3, 1, 0.5, 2)
    with pytest.raises(ValueError, match='integers'):
        sample_walks(torch.tensor([[0.0], [1.0]]), 3, 1, 0.5, 2)
    with pytest.raises(ValueError, match='start'):
        sample_walks(path_graph(3), 3, 1, 0.5, 2, start=torch.tensor([7]))


def _big_graph(N=100_000):
    # A ring (2 N edges): only its size matters, nothing large is allocated when refused.
    i = torch.arange(N)
    return torch.stack([torch.cat([i, (i + 1) % N]), torch.cat([(i + 1) % N, i])])


def test_sample_walks_refuses_with_a_memory_estimate(monkeypatch):
    from pyg_grf import memory, walks
    monkeypatch.delenv('PYG_GRF_MEMORY_LIMIT', raising=False)
    monkeypatch.setattr(memory, 'available_memory', lambda device=None: 16 * 2**30)
    ei = _big_graph()
    with pytest.raises(walks.WalkMemoryError, match=r"num_walks=10000 = 1000000000 walkers.* "
                                                    r"about \d+\.\d GiB, more than 90% of the "
                                                    r"available memory.*Lower 'num_walks'.*"
                                                    r"memory_limit=float\('inf'\).*"
                                                    r"PYG_GRF_MEMORY_LIMIT=off"):
        walks.sample_walks(ei, 100_000, 10_000, 0.5, 4)
    # The transform goes through sample_walks and refuses the same way (was an OOM kill).
    from torch_geometric.data import Data

    from pyg_grf.transforms import AddRWGNKFeatures
    with pytest.raises(walks.WalkMemoryError):
        AddRWGNKFeatures(10_000, 0.8, 1.0, 4, p_halt=0.5)(Data(edge_index=ei, num_nodes=100_000))


def test_memory_limit_override(monkeypatch):
    from pyg_grf import walks
    ei = _big_graph(1000)
    with pytest.raises(walks.WalkMemoryError, match='more than memory_limit'):
        walks.sample_walks(ei, 1000, 8, 0.5, 4, memory_limit=1e5)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '100K')
    with pytest.raises(walks.WalkMemoryError, match=r'more than \$PYG_GRF_MEMORY_LIMIT'):
        walks.sample_walks(ei, 1000, 8, 0.5, 4)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', 'off')
    assert walks.sample_walks(ei, 1000, 8, 0.5, 4).num_walkers == 8000
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', 'lots')
    with pytest.raises(ValueError, match="PYG_GRF_MEMORY_LIMIT must be a size such as '64G'"):
        walks.sample_walks(ei, 1000, 8, 0.5, 4)


def test_memory_estimate_bounds_the_outputs():
    # The estimate is at least what the returned walks hold (independent: their tensor sizes).
    from pyg_grf.walks import estimate_walk_memory, sample_walks
    ei = _big_graph(5000)
    w = sample_walks(ei, 5000, 16, 0.2, 6, generator=torch.Generator().manual_seed(0))
    held = sum(t.numel() * t.element_size() for t in (w.start, w.length, w.order, w.node, w.edge))
    est = estimate_walk_memory(5000, 16, 6, 0.2, num_edges=ei.size(1), num_nodes=5000)
    assert held <= est <= 6 * held


def test_neighbour_choice_unbiased_at_high_degree():
    from pyg_grf.walks import sample_walks
    d = 3 * 2**19 + 1  # 1,572,865 leaves of one node
    # Reference, independent of the sampler: how often a float32 uniform (2^24 values j / 2^24)
    # times d lands on each leaf. About 2/3 of the leaves get 11 values, 1/3 get 10, so with
    # float32 those leaves are chosen with probability 11 / 2^24 instead of 1 / d.
    u = torch.arange(2**24, dtype=torch.float32) * 2.0**-24
    hits = torch.bincount((u * d).long().clamp_max_(d - 1), minlength=d)
    favoured = hits > hits.min()
    del u, hits
    leaves = torch.arange(1, d + 1)
    ei = torch.stack([torch.zeros(d, dtype=torch.long), leaves])
    n = 200_000
    walks = sample_walks(ei, d + 1, n, None, 1, fixed_length=True, start=torch.tensor([0]),
                         generator=torch.Generator().manual_seed(0))
    got = favoured[walks.node - 1].double().mean().item()
    exact = favoured.double().mean().item()  # a uniform choice
    sigma = (exact * (1 - exact) / n) ** 0.5
    # float32: ~0.69, about 20 sigma from the exact fraction; now within 5 sigma.
    assert abs(got - exact) < 5 * sigma, (got, exact, sigma)
