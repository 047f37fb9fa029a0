r"""GRFAttention (:mod:`pyg_grf.nn.attention.grf.layer`) against independent dense O(N^2)
re-implementations, on every backend ('pairs', 'sparse', 'auto') and mode; walk draws
per head and layer, mask coefficient modes (f_mode), samples on one shared graph (x [B, n, C]),
gradients, low precision, torch.compile, and the errors for bad settings and inputs."""

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.datasets import grid_edge_index
from pyg_grf.features import GRFLoads
from pyg_grf.masks import GRFMask
from pyg_grf.nn import GRFAttention
from pyg_grf.nn.attention.grf import GRFPlan
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import (
    BACKENDS,
    MODES,
    D,
    batch_of_three,
    batch_with_draws,
    dense_grf_attention,
    dense_phi,
    dense_reference,
    draws_reference,
    layer_mask,
    make_batch,
    make_layer,
)


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
def test_grf_attention_equals_dense_reimplementation(mode):
    b = batch_of_three()
    # ELU+1 features are positive, so no row's normaliser vanishes (ReLU can zero a row)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, eps=0.0, feature_map='elu').double()
    with torch.no_grad():
        layer.f.copy_(torch.rand(2, 4) + 0.1)
    out = layer(b.x, b.batch, grf=GRFLoads.from_data(b))
    ref = dense_grf_attention(layer, b.x, b.grf_index, b.grf_length, b.grf_load)
    assert out.shape == (25, 8)
    assert torch.allclose(out, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
def test_batch_equals_per_graph(mode):
    b = batch_of_three()
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode).double()
    out = layer(b.x, b.batch, grf=GRFLoads.from_data(b))
    for g in range(3):
        d = b.get_example(g)
        out_g = layer(d.x, grf=GRFLoads.from_data(d))
        assert torch.allclose(out[b.batch == g], out_g, atol=1e-10)


def test_gradcheck_f_and_projections():
    b = batch_of_three(channels=4)
    layer = GRFAttention(4, heads=2, max_length=3).double()
    with torch.no_grad():
        layer.f.copy_(torch.rand(2, 4) + 0.1)
    params = dict(layer.named_parameters())

    def fn(f, w, x):
        p = {'f': f, 'to_qkv.weight': w}
        grf = GRFLoads(b.grf_index, b.grf_length, b.grf_load, x.size(0))
        return torch.func.functional_call(layer, p, (x,), {'grf': grf})

    args = tuple(params[n].detach().clone().requires_grad_() for n in ('f', 'to_qkv.weight')) \
        + (b.x.clone().requires_grad_(),)
    assert torch.autograd.gradcheck(fn, args, atol=1e-6)
    out = layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.x.size(0)))
    out.square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


def test_repr_and_reset():
    layer = GRFAttention(16, heads=4, max_length=5)
    assert str(layer) == ("GRFAttention(16, heads=4, feature_map='relu', max_length=5, "
                          "mode='symmetric', backend='auto')")
    assert torch.allclose(layer.f[0], 0.5 ** torch.arange(6.0))
    with torch.no_grad():
        layer.f.zero_()
    layer.reset_parameters()
    assert layer.f[3, 2].item() == 0.25
    assert str(GRFAttention(8, heads=2, mode='asymmetric', feature_map='elu')) == \
        "GRFAttention(8, heads=2, feature_map='elu', max_length=4, mode='asymmetric', " \
        "backend='auto')"


def test_favor_plus_feature_map_and_redraw():
    layer = GRFAttention(8, heads=2, max_length=3, feature_map='favor+',
                         feature_map_kwargs={'num_features': 16})
    b = batch_of_three()
    out = layer(b.x.float(), grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.x.size(0)))
    assert out.shape == (25, 8) and bool(torch.isfinite(out).all())
    before = layer.feature_map.projection.clone()
    layer.feature_map.redraw()
    assert not torch.equal(before, layer.feature_map.projection)


@pytest.mark.parametrize('kwargs,match', [
    (dict(mode='dense'), 'mode'),
    (dict(heads=3), 'divisible'),
    (dict(max_length=-1), 'max_length'),
    (dict(feature_map='tanh'), 'feature map'),
    (dict(dropout=1.5), 'dropout'),
])
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRFAttention(8, **kwargs)


def test_bad_forward_input():
    b = batch_of_three()
    layer = GRFAttention(8, heads=2, max_length=3).double()
    with pytest.raises(ValueError, match=r'\[N, 8\]'):
        layer(b.x[:, :4], grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.x.size(0)))
    with pytest.raises(ValueError, match=r'node ids in \[0, 10\), got ids in \[0, 24\]'):
        layer(b.x[:10], grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, 10))
    with pytest.raises(ValueError, match='one per entry'):
        layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length[1:], b.grf_load, b.x.size(0)))


def test_isolated_nodes_and_empty_graph():
    t = AddGraphRandomFeatures(num_walks=3, max_length=2, seed=0)
    layer = GRFAttention(4, max_length=2)
    d = t(Data(x=torch.randn(3, 4), edge_index=torch.empty(2, 0, dtype=torch.long)))
    out = layer(d.x, grf=GRFLoads.from_data(d))
    assert out.shape == (3, 4) and bool(torch.isfinite(out).all())
    d = t(Data(x=torch.randn(0, 4), edge_index=torch.empty(2, 0, dtype=torch.long)))
    assert layer(d.x, grf=GRFLoads.from_data(d)).shape == (0, 4)


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


@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
def test_independent_keys_every_backend(backend):
    b = make_batch(key=True)
    layer = make_layer('symmetric', backend)
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    assert torch.allclose(layer(b.x, grf=grf), dense_reference(layer, b, key=True), atol=1e-9)


@pytest.mark.parametrize('mode', MODES)
def test_backends_have_equal_gradients(mode):
    b = make_batch()
    grads = {}
    for backend in ['sparse', 'pairs']:
        layer = make_layer(mode, backend)
        x = b.x.clone().requires_grad_()
        out = layer(x, grf=GRFLoads.from_data(b))
        (out * torch.linspace(-1, 1, out.numel(), dtype=D).view_as(out)).sum().backward()
        grads[backend] = [x.grad] + [p.grad for p in layer.parameters()]
    for backend in ['pairs']:
        for g_ref, g in zip(grads['sparse'], grads[backend]):
            assert torch.allclose(g, g_ref, atol=1e-9, rtol=1e-7)
    assert float(grads['pairs'][0].abs().sum()) > 0


@pytest.mark.parametrize('backend', ['pairs'])
@pytest.mark.parametrize('mode', MODES)
def test_gradcheck_pairs_and_dense_backends(mode, backend):
    b = make_batch(channels=4)
    torch.manual_seed(1)
    layer = GRFAttention(4, heads=2, max_length=3, mode=mode, feature_map='elu',
                         backend=backend).double()
    grf = GRFLoads.from_data(b)

    def fn(f, x):
        return torch.func.functional_call(layer, {'f': f}, (x,), {'grf': grf})

    f = (torch.rand(2, 4, dtype=D) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(fn, (f, b.x.clone().requires_grad_()), atol=1e-6)


@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
def test_single_graph_without_batch_vector(backend):
    b = make_batch()
    d = b.get_example(0)
    layer = make_layer('symmetric', backend)
    out = layer(d.x, grf=GRFLoads.from_data(d))
    full = layer(b.x, grf=GRFLoads.from_data(b))
    assert torch.allclose(out, full[b.batch == 0], atol=1e-10)


@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
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


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
@pytest.mark.parametrize('autocast', [False, True])
def test_half_precision_gradients_are_finite_where_query_features_vanish(mode, backend, dtype,
                                                                         autocast):
    # issue 39: with the relu feature map a row whose query features are all zero has numerator
    # and normaliser 0; the division's gradient -o / (z + eps)^2 overflowed in float16 (eps 1e-6)
    # and made every parameter gradient NaN. The division runs in float32 now.
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, backend=backend)
    with torch.no_grad():  # queries of the first 5 nodes: relu(negative) = 0
        layer.to_qkv.bias[:8] = -1e3 * (b.x[:5].float().abs().sum() + 1)
        layer.to_qkv.weight[:8] = 0.0
    x = b.x.float()
    x[:5] = 1.0
    grf = GRFLoads.from_data(b)
    if autocast:
        with torch.autocast('cpu', dtype=dtype):
            out = layer(x, grf=grf)
    else:
        layer = layer.to(dtype)
        out = layer(x.to(dtype), grf=grf)
    out.float().square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
    assert bool(torch.isfinite(out.float()).all())


def dense_global_reference(layer, b):
    """O(N^2) reference of the global + topological mask beta_h 1 1^T (per graph) + GRF mask."""
    x = b.x
    N, H, C = x.size(0), layer.heads, layer.head_channels
    q, k, v = (x @ layer.to_qkv.weight.T + layer.to_qkv.bias).view(N, 3, H, C).unbind(1)
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


@pytest.mark.parametrize('backend', ['sparse'])
def test_sparse_softmax_dropout_is_applied_once(backend, monkeypatch):
    # dropout belongs on the attention coefficients, once, not on the output a second time
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


def test_plan_holds_the_loads_of_the_data():
    b = make_batch()
    layer = make_layer('symmetric', 'sparse')
    M1 = layer_mask(layer, GRFLoads.from_data(b)).to_dense()
    M2 = layer_mask(layer, GRFPlan.build(b).loads).to_dense()
    assert torch.allclose(M1, M2)


def test_layer_reads_the_plans_batch_vector_and_refuses_another_shape():
    # the plan holds the batch vector it was built with, and the layer uses it (no
    # data-dependent check in the forward): a batch vector given beside it changes nothing
    b = make_batch()
    layer = GRFAttention(8, heads=2, max_length=3, backend='pairs').double()
    plan = layer.payload(b)['grf']
    outs = [layer(b.x, b.batch.clone(), grf=plan) for _ in range(2)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], layer(b.x, None, grf=plan))
    with pytest.raises(ValueError, match=r"'batch' must have shape \[26\]"):
        layer(b.x, b.batch[:-1], grf=plan)


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'auto'])
def test_per_head_draws_equal_dense_reference(mode, backend):
    b = batch_with_draws(8)
    grf = GRFLoads.from_data(b)
    assert grf.num_draws == 8
    x = b.x.to(D)
    for layer_index in (0, 1):
        torch.manual_seed(1)
        layer = GRFAttention(8, heads=4, max_length=3, mode=mode, backend=backend,
                             layer_index=layer_index, f_mode='free').to(D)
        with torch.no_grad():
            layer.f.copy_(torch.rand(4, 4) + 0.05)
        assert layer.draws(8) == ((0, 1, 2, 3) if layer_index == 0 else (4, 5, 6, 7))
        out = layer(x, grf=grf, batch=b.batch)
        assert torch.allclose(out, draws_reference(layer, x, grf, b.batch), atol=1e-12)


def test_per_head_draws_gradients_and_key_side():
    b = batch_with_draws(4, key=True)
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    x = b.x.to(D).requires_grad_()
    outs = {}
    for backend in ('sparse', 'pairs'):
        torch.manual_seed(2)
        layer = GRFAttention(8, heads=4, max_length=3, backend=backend).to(D)
        out = layer(x, grf=grf, batch=b.batch)
        gx, gf = torch.autograd.grad(out.square().sum(), (x, layer.f))
        outs[backend] = (out, gx, gf)
    for backend in ('pairs',):
        for a, r in zip(outs[backend], outs['sparse']):
            assert torch.allclose(a, r, atol=1e-11)
    # the key side folds with the query side: head h's mask is Phi_Q^(d) Phi_K^(d)T
    sub = grf.fold((2,))
    assert sub.key is not None and sub.key.nnz == int((b.grf_key_draw == 2).sum())


def test_abs_and_signed_f_keep_outputs_bounded():
    # adversarial coefficients (the paper's unconstrained f at -0.9): with |f| every output row
    # is a convex combination of the value rows, so |out| <= max |v| before to_out
    b = batch_with_draws(1, sizes=(30, 25))
    grf = GRFLoads.from_data(b)
    x = torch.randn(b.num_nodes, 8, dtype=D) * 3
    bounds = {}
    for f_mode in ('abs', 'signed', 'free'):
        torch.manual_seed(0)
        layer = GRFAttention(8, heads=2, max_length=3, f_init=-0.9, f_mode=f_mode,
                             backend='sparse').to(D)
        layer.to_out = torch.nn.Identity()
        v = layer.to_qkv(x)[:, 2 * 8:]
        out = layer(x, grf=grf)
        bounds[f_mode] = float(out.abs().max() / v.abs().max())
        mask = GRFMask.from_loads(grf, f=layer.coefficients()).to_dense()
        assert (float(mask.min()) >= 0) == (f_mode == 'abs')
    assert bounds['abs'] <= 1 + 1e-9
    assert bounds['signed'] <= 1 + 1e-9  # a signed mask, its normaliser from |f|
    assert bounds['free'] > 1.5  # what the guard prevents: the normaliser near 0


def test_coefficients_and_old_state_dicts():
    layer = GRFAttention(8, heads=2, max_length=2)
    with torch.no_grad():
        layer.f.copy_(torch.tensor([[1.0, -0.5, 0.2], [0.3, 0.1, -0.7]]))
    assert torch.equal(layer.coefficients(), layer.f.abs())
    # the unconstrained opt-in says what it risks, never silently
    with pytest.warns(UserWarning, match="f_mode='free'\\) leaves the mask coefficients "
                                         "unconstrained"):
        free = GRFAttention(8, heads=2, max_length=2, f_mode='free')
    free.load_state_dict(layer.state_dict())  # same parameters, only the mapping differs
    assert torch.equal(free.coefficients(), layer.f)
    assert 'f_mode' not in repr(layer) and "f_mode='free'" in repr(free)
    with pytest.raises(ValueError, match="'f_mode' must be one of"):
        GRFAttention(8, f_mode='positive')
    # the softmax mode's weights turn negative with a free f too: the same warning
    with pytest.warns(UserWarning, match="f_mode='free'\\) leaves the mask coefficients"):
        GRFAttention(8, heads=2, mode='sparse_softmax', f_mode='free')
    from pyg_grf.nn import GridRPEAttention  # exported with the other layers
    assert GridRPEAttention.__module__ == 'pyg_grf.nn.attention.grid'
    with pytest.raises(ValueError, match="f_mode='signed' needs a linear mode"):
        GRFAttention(8, f_mode='signed', mode='sparse_softmax')


@pytest.mark.parametrize('num_draws', [1, 4])
@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
@pytest.mark.parametrize('mode', MODES)
def test_shared_graph_equals_batch_of_copies(mode, backend, num_draws):
    # issue 39: sparse_softmax with walks per head on a shared graph was off by 0.875 on the
    # removed 'dense' backend; every mode and backend equals the batch of B copies, and with
    # walks per head the independent per-draw dense reference
    B, h, w = 5, 3, 4
    grid = Data(edge_index=grid_edge_index(h, w), num_nodes=h * w)
    grid = AddGraphRandomFeatures(num_walks=6, max_length=3, seed=0, num_draws=num_draws)(grid)
    grf = GRFLoads.from_data(grid)
    x = torch.randn(B, h * w, 16, dtype=D)
    torch.manual_seed(0)
    beta = None if mode == 'sparse_softmax' else 0.3
    layer = GRFAttention(16, heads=4, max_length=3, backend=backend, mode=mode,
                         global_beta=beta).to(D)
    out = layer(x, grf=grf)
    assert out.shape == (B, h * w, 16)
    copies = Batch.from_data_list([grid.clone() for _ in range(B)])
    ref = layer(x.reshape(B * h * w, 16), grf=GRFLoads.from_data(copies), batch=copies.batch)
    assert torch.allclose(out.reshape(B * h * w, 16), ref, atol=1e-12)
    if num_draws > 1:
        layer = GRFAttention(16, heads=4, max_length=3, backend=backend, mode=mode).to(D)
        out = layer(x, grf=grf).reshape(B * h * w, 16)
        dense = draws_reference(layer, x.reshape(B * h * w, 16), GRFLoads.from_data(copies),
                                copies.batch)
        assert torch.allclose(out, dense, atol=1e-10)


def test_shared_graph_errors():
    grid = AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)(
        Data(edge_index=grid_edge_index(3, 3), num_nodes=9))
    grf = GRFLoads.from_data(grid)
    layer = GRFAttention(8, heads=2, max_length=2)
    with pytest.raises(ValueError, match="holds 2 samples of 10 nodes, but the GRF plan covers 9"):
        layer(torch.randn(2, 10, 8), grf=grf)
    with pytest.raises(ValueError, match=r"expects x of shape \[N, 8\] .* got \(2, 3, 9, 8\)"):
        layer(torch.randn(2, 3, 9, 8), grf=grf)
    with pytest.raises(ValueError, match="'batch' is not used"):
        layer(torch.randn(2, 9, 8), grf=grf, batch=torch.zeros(18, dtype=torch.long))


def _compile_run(backend, compile_backend):
    from torch_geometric.loader import DataLoader

    from pyg_grf.datasets import MotifDataset
    torch._dynamo.reset()
    ds = MotifDataset(num_graphs=48, num_nodes=20, seed=0,
                      pre_transform=AddGraphRandomFeatures(num_walks=4, max_length=3, seed=0,
                                                           num_draws=2))
    torch.manual_seed(0)
    layer = GRFAttention(5, heads=2, head_channels=4, max_length=3, backend=backend)
    compiled = torch.compile(layer, backend=compile_backend)
    from torch._dynamo.utils import counters
    counters.clear()
    for b in DataLoader(ds, batch_size=16):  # three batches of different sizes
        grf = layer.payload(b)['grf']
        out = compiled(b.x, grf=grf, batch=b.batch)
        out.sum().backward()
        ref = layer(b.x, grf=grf, batch=b.batch)
        assert torch.allclose(out, ref, atol=1e-5), float((out - ref).abs().max())
    # the plan runs eagerly: no recompilation per batch or per GRFPlan object (at most one
    # more graph when the node count first changes and dynamo marks it dynamic)
    return counters['stats']['unique_graphs']


@pytest.mark.parametrize('backend', ['auto', 'pairs', 'sparse'])
def test_torch_compile(backend):
    # every backend runs under dynamo without recompiling per batch; the engine ('pairs', and
    # 'auto' here) is traced through, the low-rank fallback runs eagerly (two graphs around it)
    assert _compile_run(backend, 'aot_eager') <= (4 if backend != 'sparse' else 6)


@pytest.mark.slow
def test_torch_compile_default_backend():
    assert _compile_run('auto', 'inductor') <= 4


@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_signed_f_equals_its_dense_definition(backend, mode):
    # f_mode='signed': numerator from the signed mask of f, normaliser from the mask of |f|
    b = batch_with_draws(1, sizes=(9, 13))
    grf = GRFLoads.from_data(b)
    x = torch.randn(b.num_nodes, 8, dtype=D)
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, f_mode='signed', mode=mode,
                         backend=backend).to(D)
    with torch.no_grad():
        layer.f.copy_(torch.tensor([[1.0, -0.6, 0.3, -0.2], [0.5, 0.4, -0.7, 0.1]]))
    out = layer(x, grf=grf)
    q, k, v = layer.project(x)
    pq, pk = layer.features(q, k, b.batch)
    asym = mode == 'asymmetric'
    Mf = GRFMask.from_loads(grf, f=layer.f, asymmetric=asym).to_dense()
    Ma = GRFMask.from_loads(grf, f=layer.f.abs(), asymmetric=asym).to_dense()
    assert float(Mf.min()) < 0  # a signed mask
    a = torch.einsum('ihm,jhm->hij', pq, pk)
    num = torch.einsum('hij,jhd->ihd', a * Mf, v)
    den = (a * Ma).sum(-1).t().unsqueeze(-1)
    ref = layer.to_out((num / (den + layer.eps)).reshape(x.size(0), -1))
    assert torch.allclose(out, ref, atol=1e-12)


def test_docs_grf_mask_value_examples_run():
    import re

    from tests.conftest import REPO
    text = (REPO / 'docs' / 'grf_mask_value.md').read_text()
    blocks = re.findall(r'```python\n(.*?)```', text, re.S)
    assert len(blocks) == 2
    scope = {}
    for block in blocks:
        exec(compile(block, 'docs/grf_mask_value.md', 'exec'), scope)
    assert scope['out'].shape == (32, 64, 64) and torch.isfinite(scope['out']).all()
    assert scope['plan'].loads.num_draws == 4  # the grid's GRFPlan


def test_global_term_stays_inside_each_graph_with_the_payloads_batch():
    # the global term (and FAVOR+'s key stabilisation) is per graph; a payload
    # built from the batch carries the batch vector, so no graph's input moves another's output
    b = batch_with_draws(1, sizes=(7, 12, 9))
    grf = GRFLoads.from_data(b)
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, global_beta=1.0,
                         feature_map='favor+').to(D)
    x = torch.randn(b.num_nodes, 8, dtype=D)
    out = layer(x, grf=grf)
    x2 = x.clone()
    x2[b.batch == 0] += 3.0
    out2 = layer(x2, grf=grf)
    assert torch.allclose(out2[b.batch != 0], out[b.batch != 0], atol=1e-12)
    assert not torch.allclose(out2[b.batch == 0], out[b.batch == 0])


def test_max_length_shorter_than_the_loads_is_refused():
    b = make_batch()
    layer = GRFAttention(8, heads=2, max_length=1).double()  # the transform used max_length=3
    with pytest.raises(ValueError, match=r'hop counts up to 3 but GRFAttention\(max_length=1\)'):
        layer(b.x, grf=GRFLoads.from_data(b))
