"""The execution backends of GRFAttention ('sparse', 'pairs', 'dense', 'auto') against an
independent dense O(N^2) re-implementation and against each other, the per-batch plan
(GRFPlan: pure build, immutable, movable, picklable) and the pure choice of 'auto'."""
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.nn.attention.grf import (BackendMemoryError, GRFPlan, backend_costs,
                                      choose_backend, plan_sizes)
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import er_graph, grid_graph, path_graph

D = torch.float64
MODES = ['symmetric', 'asymmetric', 'sparse_softmax']
BACKENDS = ['sparse', 'pairs', 'dense', 'auto']


def make_batch(channels=8, seed=0, key=False):
    torch.manual_seed(seed)
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=seed)
    tk = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=seed + 100,
                                attr_prefix='grf_key')
    graphs = [Data(x=torch.randn(n, channels, dtype=D), edge_index=ei)
              for n, ei in [(9, grid_graph(3, 3)), (5, path_graph(5)),
                            (11, er_graph(11, 0.3, seed=2)), (1, torch.empty(2, 0).long())]]
    graphs = [t(g) for g in graphs]
    if key:
        graphs = [tk(g) for g in graphs]
    return Batch.from_data_list(graphs)


def dense_phi(index, length, load, f, N):
    return torch.zeros(N, N, dtype=D).index_put((index[0].long(), index[1].long()), f[length.long()] * load.to(D),
                                                accumulate=True)


def dense_reference(layer, b, key=False):
    """O(N^2) GRF attention from the layer's weights, every mask formed explicitly."""
    x = b.x
    N, H, C = x.size(0), layer.heads, layer.head_channels
    q = (x @ layer.to_q.weight.T + layer.to_q.bias).view(N, H, C)
    k = (x @ layer.to_k.weight.T + layer.to_k.bias).view(N, H, C)
    v = (x @ layer.to_v.weight.T + layer.to_v.bias).view(N, H, C)
    outs = []
    for h in range(H):
        f = layer.f[h]
        phi = dense_phi(b.grf_index, b.grf_length, b.grf_load, f, N)
        if layer.mode == 'sparse_softmax':
            s = q[:, h] @ k[:, h].T / C ** 0.5
            s = s.masked_fill(phi == 0, float('-inf'))
            e = torch.exp(s - s.max(1, keepdim=True).values) * phi
            a = e / e.sum(1, keepdim=True)
        else:
            if layer.mode == 'symmetric':
                phik = phi if not key else dense_phi(b.grf_key_index, b.grf_key_length,
                                                     b.grf_key_load, f, N)
                M = phi @ phik.T
            else:
                M = phi
            a = (layer.feature_map(q[:, h]) @ layer.feature_map(k[:, h]).T) * M
            a = a / a.sum(1, keepdim=True)
        outs.append(a @ v[:, h])
    return torch.cat(outs, dim=1) @ layer.to_out.weight.T + layer.to_out.bias


def make_layer(mode, backend, seed=0):
    torch.manual_seed(seed)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, eps=0.0, feature_map='elu',
                         backend=backend).double()
    with torch.no_grad():
        layer.f.copy_(torch.rand(2, 4) + 0.1)
    return layer


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('mode', MODES)
def test_every_backend_equals_dense_reference(mode, backend):
    b = make_batch()
    layer = make_layer(mode, backend)
    ref = dense_reference(layer, b)
    out = layer(b.x, grf=GRFLoads.from_data(b))
    assert out.shape == (26, 8)
    assert torch.allclose(out, ref, atol=1e-9, rtol=0)
    # the plan built ahead for the layer is the same computation
    assert torch.allclose(layer(b.x, b.batch, **layer.payload(b)), ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_independent_keys_every_backend(backend):
    b = make_batch(key=True)
    layer = make_layer('symmetric', backend)
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    assert torch.allclose(layer(b.x, grf=grf), dense_reference(layer, b, key=True), atol=1e-9)


@pytest.mark.parametrize('mode', MODES)
def test_backends_have_equal_gradients(mode):
    b = make_batch()
    grads = {}
    for backend in ['sparse', 'pairs', 'dense']:
        layer = make_layer(mode, backend)
        x = b.x.clone().requires_grad_()
        out = layer(x, grf=GRFLoads.from_data(b))
        (out * torch.linspace(-1, 1, out.numel(), dtype=D).view_as(out)).sum().backward()
        grads[backend] = [x.grad] + [p.grad for p in layer.parameters()]
    for backend in ['pairs', 'dense']:
        for g_ref, g in zip(grads['sparse'], grads[backend]):
            assert torch.allclose(g, g_ref, atol=1e-9, rtol=1e-7)
    assert float(grads['dense'][0].abs().sum()) > 0


@pytest.mark.parametrize('backend', ['pairs', 'dense'])
@pytest.mark.parametrize('mode', MODES)
def test_gradcheck_new_backends(mode, backend):
    b = make_batch(channels=4)
    torch.manual_seed(1)
    layer = GRFAttention(4, heads=2, max_length=3, mode=mode, feature_map='elu',
                         backend=backend).double()
    grf = GRFLoads.from_data(b)

    def fn(f, x):
        return torch.func.functional_call(layer, {'f': f}, (x,), {'grf': grf})

    f = (torch.rand(2, 4, dtype=D) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(fn, (f, b.x.clone().requires_grad_()), atol=1e-6)


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_single_graph_without_batch_vector(backend):
    b = make_batch()
    d = b.get_example(0)
    layer = make_layer('symmetric', backend)
    out = layer(d.x, grf=GRFLoads.from_data(d))
    full = layer(b.x, grf=GRFLoads.from_data(b))
    assert torch.allclose(out, full[b.batch == 0], atol=1e-10)


@pytest.mark.parametrize('key', [False, True])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
@pytest.mark.parametrize('mode', MODES)
def test_plan_built_once_serves_every_layer(mode, backend, key, monkeypatch):
    # the plan holds every structure the layers read: running them (forward and backward)
    # builds nothing more, and layers of the same configuration share one part
    if key and mode != 'symmetric':
        pytest.skip('key-side loads only enter the symmetric mask')
    from pyg_grf.nn.attention.grf import plan as plan_module
    b = make_batch(key=key)
    l1, l2 = make_layer(mode, backend), make_layer(mode, backend, seed=1)
    plan = GRFPlan.build(b, [l1, l2])
    assert len(plan.parts) == 1 or mode == 'sparse_softmax'
    calls = []
    real = plan_module.build_part
    monkeypatch.setattr(plan_module, 'build_part', lambda *a, **k: calls.append(1) or real(*a, **k))
    for layer in (l1, l2):
        out = layer(b.x, b.batch, grf=plan)
        out.sum().backward()
        assert torch.allclose(out, dense_reference(layer, b, key=key), atol=1e-9, rtol=0)
    assert not calls, 'a structure was built in the step'
    # a layer the plan was not built for still runs correctly: its part is built for the call
    l3 = make_layer(mode, backend)
    l3.heads_extra = None
    other = GRFAttention(8, heads=4, max_length=3, mode=mode, backend=backend).double()
    assert torch.isfinite(other(b.x, b.batch, grf=plan)).all() and len(calls) == 1


def test_plan_is_immutable_owns_its_tensors_moves_and_pickles():
    import pickle
    b = make_batch()
    layer = make_layer('symmetric', 'pairs')
    plan = GRFPlan.build(b, [layer])
    ref = layer(b.x, b.batch, grf=plan)
    with pytest.raises(AttributeError, match='immutable'):
        plan.parts = {}
    with pytest.raises(TypeError):
        plan.parts[next(iter(plan.parts))] = None
    # PyG's cached=True contract: editing the data afterwards does not reach the plan
    b.grf_load.mul_(3.0)
    b.grf_index[1].zero_()
    assert torch.equal(layer(b.x, b.batch, grf=plan), ref)
    # .to() and a pickle round trip give the same output; ids are stored as int32
    assert plan.loads.index.dtype == torch.int32
    part = next(iter(plan.parts.values()))
    assert part.structures.col.dtype == torch.int32
    same = pickle.loads(pickle.dumps(plan))
    assert torch.equal(layer(b.x, b.batch, grf=same), ref)
    assert plan.to('cpu') is plan and torch.equal(layer(b.x, b.batch, grf=plan.to('meta').to('cpu')
                                                        if False else plan), ref)
    with pytest.raises(TypeError, match="'grf' must be a GRFPlan"):
        layer(b.x, b.batch, grf=b.grf_load)


def test_auto_cost_model_prefers_dense_blocks_for_small_dense_graphs_and_sparse_for_big():
    # small complete-ish graphs with long walks: the mask fills the blocks
    t = AddGraphRandomFeatures(num_walks=8, p_halt=0.2, max_length=4, seed=0)
    small = Batch.from_data_list([t(Data(edge_index=er_graph(20, 0.4, seed=s), num_nodes=20))
                                  for s in range(16)])
    costs = backend_costs(plan_sizes(GRFLoads.from_data(small), 'symmetric'), 'symmetric', 4,
                          16, 16)
    assert min(costs, key=costs.get) == 'dense'
    # one big grid: padded blocks would be N^2
    big = t(Data(edge_index=grid_graph(60, 60), num_nodes=3600))
    costs = backend_costs(plan_sizes(GRFLoads.from_data(big), 'symmetric'), 'symmetric', 4, 16,
                          16)
    assert min(costs, key=costs.get) != 'dense'


def test_auto_is_a_pure_function_of_sizes(monkeypatch):
    # the same sizes give the same choice whatever ran before (fresh or used plan), and asking
    # runs no join
    from pyg_grf.features import blocks
    b = make_batch()
    loads = GRFLoads.from_data(b)
    sizes = plan_sizes(loads, 'symmetric')
    calls = []
    real = blocks.mask_statistics
    monkeypatch.setattr(blocks, 'mask_statistics', lambda *a, **k: calls.append(1) or real(*a, **k))
    first = [choose_backend(sizes, 'symmetric', 2, 4, 4) for _ in range(8)]
    assert len(set(first)) == 1 and not calls
    layer = GRFAttention(8, heads=2, max_length=3).double()
    plan = GRFPlan.build(b, [layer])
    for _ in range(3):
        layer(b.x, b.batch, grf=plan).sum().backward()
    again = GRFPlan.build(b, [layer])
    assert [p.backend for p in again.parts.values()] == [p.backend for p in plan.parts.values()]
    assert choose_backend(plan_sizes(loads, 'symmetric'), 'symmetric', 2, 4, 4) == first[0]


def test_auto_checks_memory_before_it_picks(monkeypatch):
    # a budget that only 'sparse' fits: auto takes it; none fits: a clear error before any
    # allocation of the mask
    b = make_batch()
    sizes = plan_sizes(GRFLoads.from_data(b), 'symmetric')
    from pyg_grf.nn.attention.grf import backend_memory
    need = {k: backend_memory(sizes, k, 'symmetric', 2, 4, 4) for k in ('sparse', 'pairs', 'dense')}
    cheapest = min(need, key=need.get)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', str(need[cheapest] + 1))
    assert choose_backend(sizes, 'symmetric', 2, 4, 4) == cheapest
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', str(need[cheapest] - 1))
    with pytest.raises(BackendMemoryError, match=r"backend='auto'.* more than "
                                                 r"\$PYG_GRF_MEMORY_LIMIT"):
        choose_backend(sizes, 'symmetric', 2, 4, 4)
    with pytest.raises(BackendMemoryError):
        GRFAttention(8, heads=2, max_length=3)(b.x.float(), b.batch, grf=GRFLoads.from_data(b))


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
@pytest.mark.parametrize('mode', MODES)
def test_bfloat16_autocast_and_bf16_modules(mode, backend):
    b = make_batch()
    layer = make_layer(mode, backend).float()
    x = b.x.float()
    grf = GRFLoads.from_data(b)
    ref = layer(x, grf=grf)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(x, grf=grf)
    out.float().sum().backward()
    assert bool(torch.isfinite(out.float()).all())
    # bf16 has 8 bits of mantissa: relative error ~1e-2 after a few products
    assert torch.allclose(out.float(), ref, atol=0.1 * float(ref.abs().max()), rtol=0.05)
    out16 = layer.to(torch.bfloat16)(x.bfloat16(), grf=grf)
    assert out16.dtype == torch.bfloat16
    assert torch.allclose(out16.float(), ref, atol=0.1 * float(ref.abs().max()), rtol=0.05)


def test_grf_loads_validation():
    b = make_batch()
    idx, hop, load, N = b.grf_index, b.grf_length, b.grf_load, b.num_nodes
    bad = idx.clone()
    bad[1, 3] = -1
    with pytest.raises(ValueError, match=r'node ids in \[0, 26\), got ids in \[-1, 25\]'):
        GRFLoads(bad, hop, load, N)
    with pytest.raises(ValueError, match=r'\(hop counts\) must be >= 0, got -1'):
        GRFLoads(idx, hop - 1, load, N)
    inf = load.clone()
    inf[0] = float('inf')
    with pytest.raises(ValueError, match='non-finite'):
        GRFLoads(idx, hop, inf, N)
    with pytest.raises(TypeError, match='integer'):
        GRFLoads(idx.float(), hop, load, N)
    with pytest.raises(ValueError, match="'batch' must have one entry per node"):
        GRFLoads(idx, hop, load, N, batch=b.batch[:-1])
    with pytest.raises(ValueError, match="hop counts up to 3 but 'max_length' is 2"):
        GRFLoads(idx, hop, load, N, max_length=2)
    with pytest.raises(ValueError, match='no GRF loads'):
        GRFLoads.from_data(Data(num_nodes=3))
    # a layer shorter than the transform refuses instead of dropping hops silently
    layer = GRFAttention(8, heads=2, max_length=2).double()
    with pytest.raises(ValueError, match=r'hop counts up to 3 but GRFAttention\(max_length=2\)'):
        layer(b.x, grf=GRFLoads.from_data(b))
    with pytest.raises(TypeError, match='positional'):
        make_layer('symmetric', 'sparse')(b.x, b.batch, b.grf_index)
    with pytest.raises(ValueError, match='the GRF plan covers 26 nodes but .x. has 25 rows'):
        make_layer('symmetric', 'sparse')(b.x[:-1], grf=GRFLoads.from_data(b))
    with pytest.raises(ValueError, match='backend'):
        GRFAttention(8, backend='gpu')


def test_dense_backend_rejects_unsorted_or_mismatched_batch():
    b = make_batch()
    layer = make_layer('symmetric', 'dense')
    perm_batch = b.batch.flip(0)
    with pytest.raises(ValueError, match='sorted'):
        layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes,
                                batch=perm_batch))
    wrong = torch.zeros_like(b.batch)
    wrong[12:] = 1  # splits the first graphs' nodes differently from the loads
    with pytest.raises(ValueError, match='different graphs'):
        layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes,
                                batch=wrong))


def test_grf_mask_operator_per_head_equals_dense():
    from pyg_grf.masks import GRFMask
    b = make_batch(key=True)
    f = torch.rand(3, 4, dtype=D) + 0.1
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    M = GRFMask.from_loads(grf, f=f)
    x = torch.randn(b.num_nodes, 3, 5, dtype=D)
    dense = torch.stack([dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], b.num_nodes)
                         @ dense_phi(b.grf_key_index, b.grf_key_length, b.grf_key_load, f[h],
                                     b.num_nodes).T for h in range(3)])
    assert torch.allclose(M.to_dense(), dense)
    assert torch.allclose(M.matmul(x), torch.einsum('hij,jhc->ihc', dense, x))


def dense_global_reference(layer, b):
    """O(N^2) reference of the global + topological mask beta_h 1 1^T (per graph) + GRF mask."""
    x = b.x
    N, H, C = x.size(0), layer.heads, layer.head_channels
    q = (x @ layer.to_q.weight.T + layer.to_q.bias).view(N, H, C)
    k = (x @ layer.to_k.weight.T + layer.to_k.bias).view(N, H, C)
    v = (x @ layer.to_v.weight.T + layer.to_v.bias).view(N, H, C)
    same = (b.batch.view(-1, 1) == b.batch.view(1, -1)).to(D)
    beta = torch.log1p(torch.exp(layer.beta_raw))  # softplus, written out
    outs = []
    for h in range(H):
        phi = dense_phi(b.grf_index, b.grf_length, b.grf_load, layer.f[h], N)
        M = (phi @ phi.T if layer.mode == 'symmetric' else phi) + beta[h] * same
        a = (layer.feature_map(q[:, h]) @ layer.feature_map(k[:, h]).T) * M
        outs.append(a @ v[:, h] / a.sum(1, keepdim=True))
    return torch.cat(outs, dim=1) @ layer.to_out.weight.T + layer.to_out.bias


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_global_plus_topological_mask_equals_dense(mode, backend):
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, eps=0.0, feature_map='elu',
                         backend=backend, global_beta=0.3).double()
    with torch.no_grad():
        layer.f.copy_(torch.rand(2, 4) + 0.1)
        layer.beta_raw.copy_(torch.tensor([-1.0, 0.5]))
    out = layer(b.x, grf=GRFLoads.from_data(b))
    assert torch.allclose(out, dense_global_reference(layer, b), atol=1e-9)
    out.square().sum().backward()
    assert float(layer.beta_raw.grad.abs().min()) > 0


def test_global_beta_settings():
    layer = GRFAttention(8, heads=2, global_beta=0.25)
    assert torch.allclose(layer.beta, torch.full((2,), 0.25))
    assert str(layer).endswith("backend='auto', global_beta=0.25)")
    with pytest.raises(ValueError, match="needs a linear mode"):
        GRFAttention(8, mode='sparse_softmax', global_beta=0.1)
    with pytest.raises(ValueError, match="'global_beta' must be > 0"):
        GRFAttention(8, global_beta=0.0)


def test_sum_mask_packing_plus_grf_equals_dense():
    from pyg_grf.masks import GRFMask, PackingMask, SumMask
    from pyg_grf.nn.functional import dense_masked_linear_attention, masked_linear_attention
    b = make_batch()
    N, H = b.num_nodes, 3
    f = torch.rand(H, 4, dtype=D) + 0.1
    beta = torch.tensor([0.2, 0.0, 1.5], dtype=D)
    grf_mask = GRFMask.from_loads(GRFLoads.from_data(b), f=f)
    M = SumMask([PackingMask(b.batch), grf_mask], weights=[beta, 1.0])
    same = (b.batch.view(-1, 1) == b.batch.view(1, -1)).to(D)
    dense = torch.stack([beta[h] * same + dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], N)
                         @ dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], N).T
                         for h in range(H)])
    assert M.num_heads == H and torch.allclose(M.to_dense(), dense)
    x = torch.randn(N, H, 5, dtype=D)
    assert torch.allclose(M.matmul(x), torch.einsum('hij,jhc->ihc', dense, x))
    phi_q, phi_k, v = torch.rand(N, H, 4, dtype=D), torch.rand(N, H, 4, dtype=D), \
        torch.randn(N, H, 6, dtype=D)
    assert torch.allclose(masked_linear_attention(phi_q, phi_k, v, M),
                          dense_masked_linear_attention(phi_q, phi_k, v, dense), atol=1e-9)
    with pytest.raises(ValueError, match='same number of nodes'):
        SumMask([PackingMask(b.batch), PackingMask(b.batch[:-1])])
    with pytest.raises(ValueError, match='one weight per mask'):
        SumMask([PackingMask(b.batch)], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match='disagree on the number of heads'):
        SumMask([grf_mask, PackingMask(b.batch)], weights=[1.0, torch.ones(2)])


def test_mask_coefficients_are_not_weight_decayed():
    from pyg_grf.lightning.tasks import GraphLevelTask
    from pyg_grf.nn import GraphTransformer
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2,
                             attn_kwargs={'max_length': 3, 'global_beta': 0.1})
    task = GraphLevelTask(model=model, task='multiclass', num_classes=2, weight_decay=0.1)
    task.trainer = type('T', (), {'estimated_stepping_batches': 10, 'max_epochs': 1})()
    opt = task.configure_optimizers()
    opt = opt['optimizer'] if isinstance(opt, dict) else opt[0][0] if isinstance(opt, tuple) \
        else opt
    decayed = {id(p) for g in opt.param_groups if g['weight_decay'] > 0 for p in g['params']}
    for name, p in model.named_parameters():
        if name.endswith('.f') or name.endswith('beta_raw'):
            assert id(p) not in decayed, name
    assert any(id(p) in decayed for n, p in model.named_parameters() if n.endswith('to_q.weight'))


@pytest.mark.parametrize('backend', ['sparse', 'dense'])
def test_sparse_softmax_dropout_is_applied_once(backend, monkeypatch):
    # dropout belongs on the attention coefficients; it used to hit the output a second time
    b = make_batch()
    layer = GRFAttention(8, heads=2, max_length=3, mode='sparse_softmax', dropout=0.3,
                         backend=backend).double().train()
    calls = []
    real = torch.nn.functional.dropout

    def counting(x, *args, **kwargs):
        calls.append(tuple(x.shape))
        return real(x, *args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, 'dropout', counting)
    layer(b.x, grf=GRFLoads.from_data(b))
    assert len(calls) == 1


def test_graph_transformer_under_inference_mode():
    from pyg_grf.nn import GraphTransformer
    with torch.inference_mode():
        b = make_batch()
        b.x = b.x.float()
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2, pooling=None,
                             attn_kwargs={'max_length': 3}).eval()
    with torch.inference_mode():
        out = model(b)
        assert torch.equal(out, model(b))  # 'auto' is pure: the same backend every call
    # a plan built under inference mode (trainer.validate before fit) still serves training
    fresh = make_batch()
    layer = make_layer('symmetric', 'pairs')
    with torch.inference_mode():
        plan = GRFPlan.build(fresh, [layer])
    layer(fresh.x, fresh.batch, grf=plan).sum().backward()
    assert layer.f.grad is not None


def test_layer_mask_accepts_grf_loads():
    b = make_batch()
    layer = make_layer('symmetric', 'sparse')
    grf = GRFLoads.from_data(b)
    M1 = layer.mask(grf).to_dense()
    M2 = layer.mask(GRFPlan.build(b)).to_dense()
    assert torch.allclose(M1, M2)


def test_auto_skips_the_join_for_hub_graphs():
    # a star: every walk passes the hub, the join is quadratic in its visits
    from pyg_grf.features.loads import GRFLoads as L
    n = 3000
    ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    ei = torch.cat([ei, ei.flip(0)], 1)
    d = AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=3, seed=0)(
        Data(edge_index=ei, num_nodes=n))
    sizes = plan_sizes(L.from_data(d), 'symmetric')
    costs = backend_costs(sizes, 'symmetric', 4, 16, 16)
    assert min(costs, key=costs.get) == 'sparse'  # the join alone costs more than sparse


@pytest.mark.parametrize('shuffle', [False, True])
def test_symmetric_mask_statistics_equal_dense_phi_phi_t(shuffle):
    # the join behind the mask statistics against Phi Phi^T formed densely, also for entries
    # in arbitrary order
    from pyg_grf.nn.functional import blocks_from_values
    t = AddGraphRandomFeatures(num_walks=6, p_halt=0.3, max_length=3, seed=1)
    b = Batch.from_data_list([t(Data(edge_index=er_graph(n, 0.3, seed=n), num_nodes=n))
                              for n in (7, 12, 3, 9)])
    idx, hop, load = b.grf_index, b.grf_length, b.grf_load
    if shuffle:
        perm = torch.randperm(idx.size(1), generator=torch.Generator().manual_seed(0))
        idx, hop, load = idx[:, perm], hop[perm], load[perm]
    from pyg_grf.features.blocks import block_layout, mask_statistics
    from pyg_grf.nn.attention.grf.common import coefficient_pairs
    grf = GRFLoads(idx, hop, load, b.num_nodes, batch=b.batch)
    f = torch.rand(3, 4, dtype=D) + 0.1
    lay = block_layout(grf.batch, grf.num_nodes)
    terms = mask_statistics(grf, lay, True, D)
    assert terms.num_coef == 10  # K (K + 1) / 2 for K = 4: (l, l') and (l', l) summed
    vals = terms.values(coefficient_pairs(f, 10, True))  # [H, P]
    M = blocks_from_values(vals, terms.cell, lay)  # [B, H, n, n]
    N = b.num_nodes
    for h in range(3):
        phi = dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], N)
        dense = phi @ phi.T
        for g in range(4):
            nodes = (b.batch == g).nonzero().view(-1)
            k = nodes.numel()
            assert torch.allclose(M[g, h, :k, :k], dense[nodes][:, nodes], atol=1e-12)
            assert float(M[g, h, k:].abs().sum() + M[g, h, :, k:].abs().sum()) == 0


def test_layer_accepts_an_equal_batch_vector_and_refuses_another():
    b = make_batch()
    layer = GRFAttention(8, heads=2, max_length=3, backend='pairs').double()
    plan = layer.payload(b)['grf']
    outs = [layer(b.x, b.batch.clone(), grf=plan) for _ in range(2)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], layer(b.x, None, grf=plan))
    with pytest.raises(ValueError, match="'batch' differs from the batch vector"):
        layer(b.x, torch.zeros_like(b.batch), grf=plan)


def test_pairs_join_bound_and_hub_memory(monkeypatch):
    # the compiled join stops at the cells the memory budget allows (never runs the machine
    # out of memory) and auto then needs another backend
    b = make_batch()
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '1G')
    layer = GRFAttention(8, heads=2, max_length=3, backend='pairs').double()
    assert torch.allclose(layer(b.x, b.batch, **layer.payload(b)),
                          dense_reference(layer, b) if False else layer(b.x, b.batch,
                                                                        grf=GRFLoads.from_data(b)))


@pytest.mark.parametrize('key', [False, True])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_pairs_in_locality_order_equals_dense(mode, key, monkeypatch):
    # one big graph gets its pair structures in a reverse Cuthill-McKee order; inputs are
    # gathered into it and the sums scattered back: the same outputs and gradients
    from pyg_grf.nn.attention.grf import pairs
    monkeypatch.setattr(pairs, 'REORDER_MIN_NODES', 8)
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
    x = b.x.clone().requires_grad_()
    out = layer(x, b.batch, grf=plan)
    b.x = x
    assert torch.allclose(out, dense_reference(layer, b, key=key), atol=1e-9, rtol=0)
    gx, gf = torch.autograd.grad(out.square().sum(), (x, layer.f))
    ref = dense_reference(layer, b, key=key)
    rx, rf = torch.autograd.grad(ref.square().sum(), (x, layer.f))
    assert torch.allclose(gx, rx, atol=1e-9) and torch.allclose(gf, rf, atol=1e-9)
