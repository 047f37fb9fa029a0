"""The execution backends of GRFAttention ('sparse', 'pairs', 'dense', 'auto') against an
independent dense O(N^2) re-implementation and against each other, and the typed payload
GRFLoads that carries the per-batch precomputation."""
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.nn.attention.grf import backend_costs
from pyg_grf.nn.attention.grf_backends import GRF_BACKENDS, get_backend, mask_values
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
    # the deprecated three-tensor form (with the batch vector) is the same computation
    with pytest.warns(FutureWarning, match='deprecated'):
        out3 = layer(b.x, b.grf_index, b.grf_length, b.grf_load, b.batch)
    assert torch.allclose(out3, ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_independent_keys_every_backend(backend):
    b = make_batch(key=True)
    layer = make_layer('symmetric', backend)
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    assert torch.allclose(layer(b.x, grf=grf), dense_reference(layer, b, key=True), atol=1e-9)


@pytest.mark.parametrize('key', [False, True])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
@pytest.mark.parametrize('mode', MODES)
def test_backend_plan_then_apply(mode, backend, key):
    # the backend interface: plan() builds everything the layer reads, so that applying the
    # layer (forward and backward) adds nothing to the loads' cache; the result is the dense
    # reference's
    if key and mode != 'symmetric':
        pytest.skip('key-side loads only enter the symmetric mask')
    b = make_batch(key=key)
    layer = make_layer(mode, backend)
    grf = GRFLoads.from_data(b, key_prefix='grf_key' if key else None)
    get_backend(backend).plan(grf, mode, layer.heads, layer.f.dtype)
    planned = set(grf._cache)
    out = layer(b.x, grf=grf)
    out.sum().backward()
    new = {k for k in set(grf._cache) - planned
           if not (isinstance(k, tuple) and k[0] in ('uses', '_check'))}
    assert not new, f'built in the step: {new}'
    assert torch.allclose(out, dense_reference(layer, b, key=key), atol=1e-9, rtol=0)


def test_backend_registry_bad_input():
    assert sorted(GRF_BACKENDS) == ['dense', 'pairs', 'sparse']
    for bad in ('auto', 'Sparse', None):
        with pytest.raises(ValueError, match=f"must be one of \\['dense', 'pairs', 'sparse'\\], "
                                             f"got {bad!r}"):
            get_backend(bad)


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


def test_grf_loads_caches_per_batch_work_for_all_layers():
    b = make_batch()
    grf = GRFLoads.from_data(b)
    l1, l2 = make_layer('symmetric', 'dense'), make_layer('symmetric', 'dense', seed=1)
    l1(b.x, grf=grf)
    terms = grf.block_terms(True)
    l2(b.x, grf=grf)
    assert grf.block_terms(True) is terms  # built once, shared
    p1 = grf.pairs()[1]
    make_layer('asymmetric', 'sparse')(b.x, grf=grf)
    assert grf.pairs()[1] is p1


def test_auto_cost_model_prefers_dense_blocks_for_small_dense_graphs_and_sparse_for_big():
    # small complete-ish graphs with long walks: the mask fills the blocks
    t = AddGraphRandomFeatures(num_walks=8, p_halt=0.2, max_length=4, seed=0)
    small = Batch.from_data_list([t(Data(edge_index=er_graph(20, 0.4, seed=s), num_nodes=20))
                                  for s in range(16)])
    costs = backend_costs(GRFLoads.from_data(small), 'symmetric', 4, 16, 16)
    assert min(costs, key=costs.get) == 'dense'
    # one big grid: padded blocks would be N^2
    big = t(Data(edge_index=grid_graph(60, 60), num_nodes=3600))
    costs = backend_costs(GRFLoads.from_data(big), 'symmetric', 4, 16, 16)
    assert min(costs, key=costs.get) != 'dense'


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
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match='either'):
        make_layer('symmetric', 'sparse')(b.x, b.grf_index, grf=GRFLoads.from_data(b))
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


def test_graph_transformer_reuses_loads_for_the_same_full_graph():
    from pyg_grf.nn import GraphTransformer
    b = make_batch()
    b.x = b.x.float()
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2, pooling=None,
                             attn_kwargs={'max_length': 3}).eval()
    out1 = model(b)
    first = model.payload(b)['grf']
    out2 = model(b)
    assert model.payload(b)['grf'] is first  # same tensors: no re-validation, no join
    # equal up to rounding: 'auto' may move to the pair backend once the join is amortised
    assert torch.allclose(out1, out2, atol=1e-5)
    b.grf_load.mul_(torch.linspace(0.2, 3.0, b.grf_load.numel()))  # in place: rebuilt
    out3 = model(b)
    assert model.payload(b)['grf'] is not first
    assert not torch.allclose(out3, out1)
    # an edit through .data (no version bump) is caught too (issue #15 item 3)
    second = model.payload(b)['grf']
    b.grf_load.data.mul_(torch.linspace(3.0, 0.5, b.grf_load.numel()))
    out4 = model(b)
    assert model.payload(b)['grf'] is not second
    fresh = b.clone()
    fresh.__dict__.pop('_grf_kept', None)
    fresh.grf_load = b.grf_load.clone()
    assert torch.allclose(out4, model(fresh), atol=1e-6)


def test_graph_transformer_under_inference_mode():
    from pyg_grf.nn import GraphTransformer
    with torch.inference_mode():
        b = make_batch()
        b.x = b.x.float()
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2, pooling=None,
                             attn_kwargs={'max_length': 3}).eval()
    with torch.inference_mode():
        out = model(b)
        # equal up to rounding ('auto' may move to the pairs once the join is amortised)
        assert torch.allclose(out, model(b), atol=1e-5)


def test_layer_mask_accepts_grf_loads():
    b = make_batch()
    layer = make_layer('symmetric', 'sparse')
    grf = GRFLoads.from_data(b)
    M1 = layer.mask(grf).to_dense()
    M2 = layer.mask(b.grf_index, b.grf_length, b.grf_load, b.num_nodes).to_dense()
    assert torch.allclose(M1, M2)


def test_auto_skips_the_join_for_hub_graphs():
    # a star: every walk passes the hub, the join is quadratic in its visits
    from pyg_grf.features.loads import GRFLoads as L
    n = 3000
    ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    ei = torch.cat([ei, ei.flip(0)], 1)
    d = AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=3, seed=0)(
        Data(edge_index=ei, num_nodes=n))
    grf = L.from_data(d)
    costs = backend_costs(grf, 'symmetric', 4, 16, 16)
    assert 'pairs' not in costs and min(costs, key=costs.get) == 'sparse'
    assert not any(k[0] == 'terms' for k in grf._cache if isinstance(k, tuple))  # no join run


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
    grf = GRFLoads(idx, hop, load, b.num_nodes, batch=b.batch)
    f = torch.rand(3, 4, dtype=D) + 0.1
    layer = GRFAttention(9, heads=3, max_length=3).double()
    with torch.no_grad():
        layer.f.copy_(f)
    terms = grf.block_terms(True, dtype=D)
    assert terms.num_coef == 10  # K (K + 1) / 2 for K = 4: (l, l') and (l', l) summed
    lay = grf.layout()
    vals = mask_values(grf, terms, layer.coefficients(), True, lay)  # [H, P]
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


def test_layer_reuses_the_loads_structures_for_an_equal_batch_vector(monkeypatch):
    # the structures are keyed by the loads' own batch vector: a layer called with a new tensor
    # of the same graphs (as every PyG step passes) does not rebuild the join, and gives the
    # same output as with the loads' own vector
    calls = []
    build = GRFLoads._build_terms
    monkeypatch.setattr(GRFLoads, '_build_terms',
                        lambda self, *a, **k: calls.append(1) or build(self, *a, **k))
    b = make_batch()
    grf = GRFLoads.from_data(b)
    layer = GRFAttention(8, heads=2, max_length=3, backend='pairs').double()
    outs = [layer(b.x, b.batch.clone(), grf=grf) for _ in range(3)]
    assert len(calls) == 1
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert torch.equal(outs[0], layer(b.x, None, grf=grf))


def test_prepare_fixes_the_backend_the_forward_runs():
    # a layer prepared ahead of the step (e.g. in a DataLoader worker) runs the backend it
    # planned, whatever the cost model's use counts say later; an in-place edit forgets it
    from pyg_grf.nn.attention.grf_backends import choose_backend, remember_choice
    b = make_batch()
    grf = GRFLoads.from_data(b)
    layer = GRFAttention(8, heads=2, max_length=3).double()
    chosen = layer.prepare(grf)
    m = layer.feature_map.output_dim(4) if layer.feature_map is not None else 4
    assert chosen == choose_backend(grf, 'symmetric', 2, m, 4, None, torch.float64)
    other = next(n for n in ('sparse', 'dense') if n != chosen)
    remember_choice(grf, other, 'symmetric', 2, m, 4)
    assert choose_backend(grf, 'symmetric', 2, m, 4, None, torch.float64) == other
    out = layer(b.x, b.batch, grf=grf)
    ref = GRFAttention(8, heads=2, max_length=3, backend=other).double()
    ref.load_state_dict(layer.state_dict())
    assert torch.allclose(out, ref(b.x, b.batch, grf=GRFLoads.from_data(b)), atol=1e-12)
    grf.load.mul_(2.0)  # edited in place: the caches and the remembered choice are dropped
    costs = backend_costs(grf, 'symmetric', 2, m, 4, None, torch.float64)
    assert choose_backend(grf, 'symmetric', 2, m, 4, None) == min(costs, key=costs.get)


def test_auto_leaves_pairs_when_the_compiled_join_outgrows_its_bound(monkeypatch):
    from pyg_grf.features.join import compiled_join_available
    from pyg_grf.nn.attention import grf_backends
    if not compiled_join_available():
        pytest.skip('numba is not installed')
    b = make_batch()
    free = GRFLoads.from_data(b)
    costs = backend_costs(free, 'symmetric', 2, 64, 64, None, torch.float64)
    # wide heads (64 channels): pairs is worth a join here
    assert 'pairs' in costs and free.has_terms(True)  # the join ran within the bound
    monkeypatch.setattr(grf_backends, '_JOIN_MEMORY', 1000)  # room for a few cells only
    tight = GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, batch=b.batch)
    calls = []
    real = tight.block_terms
    monkeypatch.setattr(tight, 'block_terms', lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(3):  # tried once, then remembered
        costs = backend_costs(tight, 'symmetric', 2, 64, 64, None, torch.float64)
        assert 'pairs' not in costs and not tight.has_terms(True)
    assert len(calls) == 1
    layer = GRFAttention(8, heads=2, max_length=3).double()
    ref = GRFAttention(8, heads=2, max_length=3, backend='dense').double()
    ref.load_state_dict(layer.state_dict())
    assert torch.allclose(layer(b.x, b.batch, grf=tight), ref(b.x, b.batch, grf=free),
                          atol=1e-12)
