r"""The pair backend (:mod:`pyg_grf.nn.attention.grf.pairs`): the compiled join within the
memory budget, and one big graph in a locality order."""

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn.attention.grf import GRFPlan
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import D, dense_reference, make_batch, make_layer
from tests.utils import er_graph


def test_a_budget_too_small_for_the_mask_moves_auto_off_pairs(monkeypatch):
    # a memory budget that the low-rank path fits and the mask's support does not: 'auto'
    # falls back to it (and equals the dense reference), an explicit 'pairs' is refused
    from pyg_grf.nn.attention.grf import BackendMemoryError, pairs, sparse
    n = 400  # a star: every walk passes the hub, the mask fills the graph
    ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    star = Data(x=torch.randn(n, 8, dtype=D), edge_index=torch.cat([ei, ei.flip(0)], 1))
    b = Batch.from_data_list([AddGraphRandomFeatures(num_walks=4, max_length=3, seed=0)(star)])
    layer = make_layer('symmetric', 'auto')
    full = GRFPlan.build(b, [make_layer('symmetric', 'pairs')])
    st = next(iter(full.parts.values())).structures
    assert st.nnz > n * n // 2  # most pairs of the star
    loads = GRFLoads.from_data(b)
    need_sparse = sparse.memory(n, loads.pairs()[0].size(1), 2, 4, 4, 8)
    need_pairs = pairs.memory(st.nnz, st.stats.size(1), 2, 8)
    assert need_sparse < need_pairs
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', str((need_sparse + need_pairs) // 2))
    plan = GRFPlan.build(b, [layer])
    assert [p.backend for p in plan.parts.values()] == ['sparse']
    assert torch.allclose(layer(b.x, b.batch, grf=plan), dense_reference(layer, b), atol=1e-9)
    with pytest.raises(BackendMemoryError, match=r"backend='pairs'.*Use backend='auto'"):
        GRFPlan.build(b, [make_layer('symmetric', 'pairs')])


def star_or_path(graph, n):
    # a star (every walk passes the hub: the mask fills the graph) or a path (the mask stays
    # near the walks' support), with 4 walks per node
    if graph == 'star':
        ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    else:
        ei = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    data = Data(x=torch.randn(n, 8, dtype=D), edge_index=torch.cat([ei, ei.flip(0)], 1))
    return Batch.from_data_list([AddGraphRandomFeatures(num_walks=4, max_length=3, seed=0)(data)])


@pytest.mark.parametrize('graph', ['star', 'path'])
def test_auto_runs_the_computation_with_fewer_multiply_adds(graph):
    # with no memory pressure 'auto' compares the two computations' multiply-adds, counted
    # here from the dense mask: a star's mask fills the graph (the walks' pairs are far
    # fewer, so the low-rank path is cheaper); a long path's stays near the walks' support
    from pyg_grf.nn.attention.grf.plan import multiply_adds
    n = 300
    b = star_or_path(graph, n)
    phi = torch.zeros(n, n, dtype=D).index_put(
        (b.grf_index[0], b.grf_index[1]), torch.ones(b.grf_index.size(1), dtype=D),
        accumulate=True) != 0
    cells = int(((phi.to(D) @ phi.to(D).t()) != 0).sum())
    pairs_ = int(phi.sum())
    H, m, d = 2, 4, 4  # make_layer: 2 heads of 4 channels, ELU features (m = d)
    engine = H * cells * (m + d + 1)  # the mask values' cost left out: a lower bound
    low = H * (2 * pairs_ + 2 * n) * m * (d + 1)
    expected = 'sparse' if low < engine else 'pairs'
    assert expected == ('sparse' if graph == 'star' else 'pairs')  # the cases differ
    assert multiply_adds('sparse', n, 2 * pairs_, H, m, d) == low
    layer = make_layer('symmetric', 'auto')
    plan = GRFPlan.build(b, [layer])
    assert [p.backend for p in plan.parts.values()] == [expected]
    assert torch.allclose(layer(b.x, b.batch, grf=plan), dense_reference(layer, b), atol=1e-9)


@pytest.mark.parametrize('key', [False, True])
def test_sampled_cells_estimate_the_mask_support(key):
    # cells per row of the symmetric support counted from a sample of rows: every row gives
    # the dense count exactly; 100 of 400 rows a mean within 4 standard errors of it
    from pyg_grf.nn.attention.grf.plan import sampled_cells
    n = 400
    g = Data(x=torch.randn(n, 8, dtype=D), edge_index=er_graph(n, 0.02, seed=1))
    g = AddGraphRandomFeatures(num_walks=4, max_length=3, seed=0)(g)
    if key:
        g = AddGraphRandomFeatures(num_walks=3, max_length=3, seed=1, attr_prefix='grf_key')(g)
    b = Batch.from_data_list([g])
    loads = GRFLoads.from_data(b, key_prefix='grf_key' if key else None)

    def support(i):
        return torch.zeros(n, n, dtype=D).index_put((i[0], i[1]), torch.ones(i.size(1), dtype=D),
                                                    accumulate=True).clamp(max=1)
    other = b.grf_key_index if key else b.grf_index
    cells = ((support(b.grf_index) @ support(other).t()) != 0).sum(1).to(D)
    mean, se = sampled_cells(loads, n)
    assert mean == pytest.approx(float(cells.mean()), abs=1e-12) and se == 0
    mean, se = sampled_cells(loads, 100)
    assert se > 0 and abs(mean - float(cells.mean())) <= 4 * se


@pytest.mark.parametrize('graph', ['star', 'path'])
def test_auto_skips_the_join_only_when_the_sample_is_conclusive(graph, monkeypatch):
    # with a small sampling budget, the star (whose mask fills the graph) is sent to the
    # low-rank path without running the join; the path, whose sample says the engine is
    # cheaper, still runs it; both equal the dense reference
    from pyg_grf.nn.attention.grf import pairs
    from pyg_grf.nn.attention.grf import plan as plan_module
    monkeypatch.setattr(plan_module, 'ESTIMATE_TERMS', 1000)
    joined = []
    build = pairs.build
    monkeypatch.setattr(pairs, 'build', lambda *a, **k: joined.append(1) or build(*a, **k))
    n = 300
    b = star_or_path(graph, n)
    layer = make_layer('symmetric', 'auto')
    plan = GRFPlan.build(b, [layer])
    expected = 'sparse' if graph == 'star' else 'pairs'
    assert [p.backend for p in plan.parts.values()] == [expected]
    assert bool(joined) == (graph == 'path')
    assert torch.allclose(layer(b.x, b.batch, grf=plan), dense_reference(layer, b), atol=1e-9)


def test_auto_bounds_the_cells_by_the_graph_sizes_before_sampling(monkeypatch):
    # a batch of small dense graphs: the join's products alone would leave the choice open
    # (the engine counted at that many cells exceeds the low-rank path), but no row has more
    # cells than its graph has nodes, which settles it for the engine without a sample
    from pyg_grf.features.blocks import num_join_terms
    from pyg_grf.nn.attention.grf import plan as plan_module
    monkeypatch.setattr(plan_module, 'ESTIMATE_TERMS', 1000)
    sampled = []
    monkeypatch.setattr(plan_module, 'sampled_cells', lambda *a: sampled.append(a) or (0.0, 0.0))
    t = AddGraphRandomFeatures(num_walks=16, max_length=3, seed=0)
    b = Batch.from_data_list([t(Data(x=torch.randn(12, 8, dtype=D),
                                     edge_index=er_graph(12, 0.6, seed=s))) for s in range(20)])
    loads = GRFLoads.from_data(b)
    N, P = b.num_nodes, loads.num_pairs()
    low = plan_module.multiply_adds('sparse', N, 2 * P, 2, 4, 4)
    assert plan_module.multiply_adds('pairs', N, num_join_terms(loads), 2, 4, 4) > low
    assert plan_module.multiply_adds('pairs', N, N * 12, 2, 4, 4) <= low
    layer = make_layer('symmetric', 'auto')
    plan = GRFPlan.build(b, [layer])
    assert sampled == [] and [p.backend for p in plan.parts.values()] == ['pairs']
    assert torch.allclose(layer(b.x, b.batch, grf=plan), dense_reference(layer, b), atol=1e-9)


def test_layers_of_other_widths_get_their_own_choice():
    # one plan for two layers that differ only in width: on a star the count favours the
    # low-rank path for narrow heads (its cost grows with m (d + 1), the engine's with
    # m + d + 1) and the engine for wide ones; each layer gets its own backend (the shared
    # structures are built once) and equals the dense reference
    from pyg_grf.nn import GRFAttention
    from pyg_grf.nn.attention.grf.plan import multiply_adds
    n = 300
    ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    data = Data(x=torch.randn(n, 256, dtype=D), edge_index=torch.cat([ei, ei.flip(0)], 1))
    b = Batch.from_data_list([AddGraphRandomFeatures(num_walks=4, max_length=3, seed=0)(data)])
    torch.manual_seed(0)
    layers = [GRFAttention(c, heads=2, max_length=3, eps=0.0, feature_map='elu').double()
              for c in (8, 256)]
    st = next(iter(GRFPlan.build(b, [make_layer('symmetric', 'pairs')]).parts.values())).structures
    sides = 2 * GRFLoads.from_data(b).num_pairs()
    expected = []
    for c in (8, 256):
        m = d = c // 2
        engine = multiply_adds('pairs', n, st.nnz, 2, m, d, st.stats.numel())
        expected.append('sparse' if multiply_adds('sparse', n, sides, 2, m, d) < engine
                        else 'pairs')
    assert expected == ['sparse', 'pairs']
    plan = GRFPlan.build(b, layers)
    assert [plan.part(layer.spec()).backend for layer in layers] == expected
    for c, layer in zip((8, 256), layers):
        bc = b.clone()
        bc.x = b.x[:, :c]
        assert torch.allclose(layer(bc.x, bc.batch, grf=plan), dense_reference(layer, bc),
                              atol=1e-9)


@pytest.mark.parametrize('per_head', [False, True])
@pytest.mark.parametrize('key', [False, True])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_pairs_in_locality_order_equals_dense(mode, key, per_head, monkeypatch):
    # one big graph gets its pair structures in a reverse Cuthill-McKee order; inputs are
    # gathered into it and the sums gathered back out (every head at once, also when the
    # kernel runs one head a call, as for a graph too big to keep the per-head index): the
    # same outputs and gradients
    from pyg_grf.nn.attention.grf import pairs
    monkeypatch.setattr(pairs, 'REORDER_MIN_NODES', 8)
    if per_head:
        monkeypatch.setattr(pairs, 'KERNEL_INDEX_BYTES', 0)
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=0)
    tk = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=1,
                                attr_prefix='grf_key')
    torch.manual_seed(0)
    g = t(Data(x=torch.randn(40, 8, dtype=D), edge_index=er_graph(40, 0.1, seed=3)))
    b = Batch.from_data_list([tk(g) if key else g])
    layer = make_layer(mode, 'pairs')
    plan = GRFPlan.build(b, [layer])
    st = next(iter(plan.parts.values())).structures
    assert st.perm is not None and not torch.equal(st.perm.long(), torch.arange(40))
    assert (st.index is None) == per_head
    x = b.x.clone().requires_grad_()
    out = layer(x, b.batch, grf=plan)
    b.x = x
    assert torch.allclose(out, dense_reference(layer, b, key=key), atol=1e-9, rtol=0)
    gx, gf = torch.autograd.grad(out.square().sum(), (x, layer.f))
    ref = dense_reference(layer, b, key=key)
    rx, rf = torch.autograd.grad(ref.square().sum(), (x, layer.f))
    assert torch.allclose(gx, rx, atol=1e-9) and torch.allclose(gf, rf, atol=1e-9)


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
@pytest.mark.parametrize('limits', [('KEEP_SCORES_BYTES',), ('CHUNK_BYTES',),
                                    ('KERNEL_INDEX_BYTES',),
                                    ('KERNEL_INDEX_BYTES', 'KEEP_SCORES_BYTES')])
def test_scores_computed_again_in_the_backward_give_the_same_gradients(mode, limits,
                                                                       monkeypatch):
    # above KEEP_SCORES_BYTES the kernel keeps no scores for its backward and computes them
    # again; above CHUNK_BYTES or KERNEL_INDEX_BYTES (one huge graph) the heads run one after
    # another on the base structures, inside one call: outputs and gradients equal the dense
    # reference all the same
    from pyg_grf.nn.attention.grf import pairs
    for limit in limits:  # the last: heads one after another, scores computed again
        monkeypatch.setattr(pairs, limit, 0 if limit != 'CHUNK_BYTES' else 1)
    b = make_batch()
    layer = make_layer(mode, 'pairs')
    x = b.x.clone().requires_grad_()
    out = layer(x, b.batch, **layer.payload(b))
    b.x = x
    ref = dense_reference(layer, b)
    assert torch.allclose(out, ref, atol=1e-9, rtol=0)
    g = torch.autograd.grad(out.square().sum(), (x, layer.f, layer.to_qkv.weight))
    r = torch.autograd.grad(ref.square().sum(), (x, layer.f, layer.to_qkv.weight))
    for a, c in zip(g, r):
        assert torch.allclose(a, c, atol=1e-9)


@pytest.mark.parametrize('limit', [None, 'CHUNK_BYTES', 'KERNEL_INDEX_BYTES'])
def test_samples_on_a_shared_graph_in_locality_order_equal_a_batch_of_copies(limit,
                                                                            monkeypatch):
    # the pair structures of one graph in a locality order, repeated for B samples (also in
    # chunks of one head, and with the per-head index built per call)
    from pyg_grf.nn.attention.grf import pairs
    monkeypatch.setattr(pairs, 'REORDER_MIN_NODES', 8)
    if limit is not None:
        monkeypatch.setattr(pairs, limit, 1 if limit == 'CHUNK_BYTES' else 0)
    g = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=0)(
        Data(edge_index=er_graph(30, 0.15, seed=4), num_nodes=30))
    layer = make_layer('symmetric', 'pairs')
    plan = GRFPlan.build(g, [layer])
    assert next(iter(plan.parts.values())).structures.perm is not None
    x = torch.randn(3, 30, 8, dtype=D, generator=torch.Generator().manual_seed(0))
    out = layer(x, grf=plan)
    copies = Batch.from_data_list([g] * 3)
    ref = layer(x.reshape(90, 8), copies.batch, grf=GRFLoads.from_data(copies))
    assert torch.allclose(out.reshape(90, 8), ref, atol=1e-10)
