r"""Independent walks per head and layer (AddGraphRandomFeatures(num_draws=D), GRFLoads.fold),
mask coefficient modes (f_mode) and samples on one shared graph (x [B, n, C]),
against dense references computed head by head."""
import math

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import erdos_renyi_graph, to_undirected

from pyg_grf.datasets import grid_edge_index
from pyg_grf.features import GRFLoads, power_series_kernel
from pyg_grf.masks import GRFMask
from pyg_grf.nn import GraphTransformer, GRFAttention
from pyg_grf.nn.functional import dense_masked_linear_attention
from pyg_grf.transforms import AddGraphRandomFeatures

D = torch.float64


def er(n, p, seed):
    torch.manual_seed(seed)
    return to_undirected(erdos_renyi_graph(n, p))


def batch_with_draws(num_draws, sizes=(7, 12, 9), seed=0, key=False):
    t = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=seed, num_draws=num_draws)
    tk = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=seed + 1, num_draws=num_draws,
                                attr_prefix='grf_key')
    graphs = []
    for i, n in enumerate(sizes):
        g = t(Data(edge_index=er(n, 0.4, i), num_nodes=n, x=torch.randn(n, 8)))
        graphs.append(tk(g) if key else g)
    return Batch.from_data_list(graphs)


def reference(layer, x, grf, batch):
    # head h: its own draw's mask, dense, with coefficients layer.coefficients()[h]
    q, k, v = layer.project(x)
    f = layer.coefficients()
    if layer.mode != 'sparse_softmax':
        pq, pk = layer.features(q, k, batch)
    outs = []
    for h, d in enumerate(layer.draws(grf.num_draws)):
        sub = grf.fold((d,))
        M = GRFMask.from_loads(sub, f=f[h], asymmetric=layer.mode != 'symmetric').to_dense()
        if layer.mode == 'sparse_softmax':
            s = (q[:, h] @ k[:, h].t()) * layer.head_channels ** -0.5
            s = s.masked_fill(M == 0, float('-inf'))
            e = torch.exp(s - s.amax(-1, keepdim=True)) * M
            outs.append((e / e.sum(-1, keepdim=True)) @ v[:, h])
        else:
            outs.append(dense_masked_linear_attention(pq[:, h:h + 1], pk[:, h:h + 1],
                                                      v[:, h:h + 1], M)[:, 0])
    return layer.to_out(torch.stack(outs, 1).reshape(x.size(0), -1))


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense', 'auto'])
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
        assert torch.allclose(out, reference(layer, x, grf, b.batch), atol=1e-12)


def test_per_head_draws_gradients_and_key_side():
    b = batch_with_draws(4, key=True)
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    x = b.x.to(D).requires_grad_()
    outs = {}
    for backend in ('sparse', 'pairs', 'dense'):
        torch.manual_seed(2)
        layer = GRFAttention(8, heads=4, max_length=3, backend=backend).to(D)
        out = layer(x, grf=grf, batch=b.batch)
        gx, gf = torch.autograd.grad(out.square().sum(), (x, layer.f))
        outs[backend] = (out, gx, gf)
    for backend in ('pairs', 'dense'):
        for a, r in zip(outs[backend], outs['sparse']):
            assert torch.allclose(a, r, atol=1e-11)
    # the key side folds with the query side: head h's mask is Phi_Q^(d) Phi_K^(d)T
    sub = grf.fold((2,))
    assert sub.key is not None and sub.key.nnz == int((b.grf_key_draw == 2).sum())


def test_draws_are_independent_samples_of_one_estimator():
    # every draw estimates F = sum_l f_l W^l (asymmetric features, unbiased); the mean of the D
    # draws converges like 1 / sqrt(D): a statistic with a variance-derived tolerance
    n, Dn = 10, 400
    ei = er(n, 0.5, 3)
    data = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=0,
                                  num_draws=Dn)(Data(edge_index=ei, num_nodes=n))
    grf = GRFLoads.from_data(data)
    f = torch.tensor([1.0, 0.7, 0.5, 0.3], dtype=D)
    phis = torch.stack([GRFMask.from_loads(grf.fold((d,)), f=f, asymmetric=True).to_dense()
                        for d in range(Dn)])  # [D, n, n]
    F = power_series_kernel(ei, n, f)  # the exact sum_l f_l W^l, by Horner's rule
    mean, se = phis.mean(0), phis.std(0) / math.sqrt(Dn)
    assert float(((mean - F).abs() - 5 * se - 1e-9).clamp_min(0).max()) == 0
    # distinct draws are not copies of each other
    assert not torch.allclose(phis[0], phis[1])


def test_fold_and_draw_errors():
    b = batch_with_draws(3)
    grf = GRFLoads.from_data(b)
    with pytest.raises(ValueError, match=r"draw ids in \[0, 3\)"):
        grf.fold((0, 3))
    # fewer draws than heads x layers: an error, never a silent reuse of the same walks
    with pytest.raises(ValueError, match=r"needs walk draws up to 3 .* the loads hold 3"):
        GRFAttention(8, heads=2, max_length=3, layer_index=1)(b.x, b.batch, grf=grf)
    with pytest.raises(ValueError, match=r"needs walk draws up to 3 .* the loads hold 3"):
        GRFAttention(8, heads=4, max_length=3).draws(3)
    with pytest.raises(ValueError, match="'grf_draw' .* must be >= 0"):
        GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, draw=-b.grf_draw.long() - 1)
    with pytest.raises(ValueError, match="one draw id per entry"):
        GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, draw=b.grf_draw[:-1])
    one = GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes)
    with pytest.raises(ValueError, match="key-side loads hold 1 walk draws"):
        GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, draw=b.grf_draw, key=one)
    with pytest.raises(ValueError, match="'num_draws' must be an integer"):
        AddGraphRandomFeatures(num_draws=0)
    with pytest.raises(ValueError, match="'layer_index' must be an integer"):
        GRFAttention(8, layer_index=-1)
    with pytest.raises(ValueError, match="one walk draw"):
        GRFAttention(8, heads=2, max_length=3).mask(grf)


def test_one_draw_is_the_old_transform():
    # num_draws=1 stores exactly what the transform stored before (no grf_draw)
    data = Data(edge_index=er(12, 0.3, 0), num_nodes=12)
    a = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=4)(data)
    b = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=4, num_draws=1)(data)
    assert 'grf_draw' not in b
    for name in ('grf_index', 'grf_length', 'grf_load'):
        assert torch.equal(a[name], b[name])


def test_graph_transformer_gives_each_layer_its_draws():
    b = batch_with_draws(8)
    model = GraphTransformer(8, 16, 3, num_layers=2, heads=4, attn_type='grf',
                             attn_kwargs={'max_length': 3})
    layers = [m for m in model.modules() if isinstance(m, GRFAttention)]
    assert [m.layer_index for m in layers] == [0, 1]
    assert layers[1].draws(8) == (4, 5, 6, 7)
    out = model(b)
    assert out.shape == (3, 3) and torch.isfinite(out).all()


# Non-negative coefficients ########################################################################


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
        v = layer.to_v(x)
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
    # the unconstrained opt-in says what it risks (issue #15 item 5: never silently)
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


# One graph shared by a batch of samples ##########################################################


@pytest.mark.parametrize('num_draws', [1, 4])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_shared_graph_equals_batch_of_copies(backend, num_draws):
    B, h, w = 5, 3, 4
    grid = Data(edge_index=grid_edge_index(h, w), num_nodes=h * w)
    grid = AddGraphRandomFeatures(num_walks=6, max_length=3, seed=0, num_draws=num_draws)(grid)
    grf = GRFLoads.from_data(grid)
    x = torch.randn(B, h * w, 16, dtype=D)
    torch.manual_seed(0)
    layer = GRFAttention(16, heads=4, max_length=3, backend=backend,
                         global_beta=0.3).to(D)
    out = layer(x, grf=grf)
    assert out.shape == (B, h * w, 16)
    copies = Batch.from_data_list([grid.clone() for _ in range(B)])
    ref = layer(x.reshape(B * h * w, 16), grf=GRFLoads.from_data(copies), batch=copies.batch)
    assert torch.allclose(out.reshape(B * h * w, 16), ref, atol=1e-12)


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
    with pytest.raises(ValueError, match="needs the loads of one graph, got a batch of 2"):
        GRFLoads.from_data(Batch.from_data_list([grid, grid])).repeat(2)
    with pytest.raises(ValueError, match="'copies' must be a positive integer"):
        grf.repeat(0)


# The exact mask (PowerSeriesAttention) per graph and on a shared graph ###########################


def _power_series_dense(layer, x, edge_index, batch):
    # the O(N^2) reference over the whole batch: the dense kernel of the batch's block-diagonal
    # adjacency and the one masked-linear primitive
    from pyg_grf.masks import DenseMask
    from pyg_grf.nn.functional import masked_linear_attention
    q, k, v = layer.project(x)
    pq, pk = layer.features(q, k, batch)
    M = DenseMask(layer.dense_mask(edge_index, x.size(0)).to(x.dtype))
    return layer.finish(masked_linear_attention(pq, pk, v, M, eps=layer.eps))


@pytest.mark.parametrize('f_mode', ['abs', 'free'])
def test_power_series_blocks_equal_whole_batch_kernel(f_mode):
    from pyg_grf.nn.attention.reference import PowerSeriesAttention
    b = batch_with_draws(1, sizes=(7, 12, 1, 9))
    x = torch.randn(b.num_nodes, 8, dtype=D)
    torch.manual_seed(0)
    layer = PowerSeriesAttention(8, heads=2, max_length=3, f_init=-0.4,
                                 f_mode=f_mode).to(D)
    out = layer(x, b.batch, edge_index=b.edge_index)
    if f_mode == 'abs':  # the reference below with f = |f|
        with torch.no_grad():
            layer.f.abs_()
    assert torch.allclose(out, _power_series_dense(layer, x, b.edge_index, b.batch), atol=1e-12)


def test_power_series_shared_graph_equals_batch_of_copies():
    from pyg_grf.nn.attention.reference import PowerSeriesAttention
    B, n = 4, 12
    ei = grid_edge_index(3, 4)
    x = torch.randn(B, n, 8, dtype=D)
    torch.manual_seed(0)
    layer = PowerSeriesAttention(8, heads=2, max_length=2).to(D)
    out = layer(x, edge_index=ei)
    copies = Batch.from_data_list([Data(edge_index=ei, num_nodes=n) for _ in range(B)])
    ref = layer(x.reshape(B * n, 8), copies.batch, edge_index=copies.edge_index)
    assert torch.allclose(out.reshape(B * n, 8), ref, atol=1e-12)
    with pytest.raises(ValueError, match="'edge_index' has node ids up to 11 but 'x' has 8 rows"):
        layer(torch.randn(8, 8, dtype=D), edge_index=ei)
    with pytest.raises(ValueError, match="holds 2 samples of 6 nodes"):
        layer(torch.randn(2, 6, 8, dtype=D), edge_index=ei)


def test_explicit_backend_refuses_what_cannot_fit(monkeypatch):
    # issue #15 item 7: 'pairs' / 'dense' on a star allocate GiBs with no estimate; now the
    # estimate is checked first and the error names the backend that fits
    from pyg_grf.nn.attention.grf import BackendMemoryError, backend_memory, plan_sizes
    N = 3000
    ei = torch.stack([torch.zeros(N - 1, dtype=torch.long), torch.arange(1, N)])
    star = Data(edge_index=torch.cat([ei, ei.flip(0)], 1), num_nodes=N)
    grf = GRFLoads.from_data(AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)(star))
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '100M')
    x = torch.randn(N, 8)
    for backend in ('dense', 'pairs'):
        need = backend_memory(plan_sizes(grf, 'symmetric'), backend, 'symmetric', 2, 4, 4)
        assert need > 100 * 2 ** 20
        with pytest.raises(BackendMemoryError, match=rf"backend='{backend}'.* more than "
                                                      rf"\$PYG_GRF_MEMORY_LIMIT .*Use "
                                                      rf"backend='sparse'"):
            GRFAttention(8, heads=2, max_length=2, backend=backend)(x, grf=grf)
    out = GRFAttention(8, heads=2, max_length=2, backend='sparse')(x, grf=grf)
    assert torch.isfinite(out).all()


def test_available_memory_respects_rlimit_as():
    import resource

    from pyg_grf.memory import _address_space_room, available_memory
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open('/proc/self/statm') as f:
        virtual = int(f.read().split()[0]) * resource.getpagesize()
    limit = virtual + 300 * 2 ** 20
    if hard != resource.RLIM_INFINITY and limit > hard:
        pytest.skip('hard RLIMIT_AS too low to test')
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        room = _address_space_room()
        assert room is not None and room <= 300 * 2 ** 20
        assert available_memory() <= 300 * 2 ** 20
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


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


@pytest.mark.parametrize('backend', ['auto', 'pairs', 'sparse', 'dense'])
def test_torch_compile(backend):
    # issue #15 item 18: 'auto' / 'pairs' crashed inside dynamo, the others recompiled per batch
    assert _compile_run(backend, 'aot_eager') <= 4


@pytest.mark.slow
def test_torch_compile_default_backend():
    assert _compile_run('auto', 'inductor') <= 4


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
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


def test_signed_power_series():
    from pyg_grf.nn.attention.reference import PowerSeriesAttention
    b = batch_with_draws(1, sizes=(7, 11))
    x = torch.randn(b.num_nodes, 8, dtype=D)
    torch.manual_seed(0)
    layer = PowerSeriesAttention(8, heads=2, max_length=2, f_mode='signed').to(D)
    with torch.no_grad():
        layer.f.copy_(torch.tensor([[1.0, -0.8, 0.3], [0.6, 0.5, -0.9]]))
    out = layer(x, b.batch, edge_index=b.edge_index)
    q, k, v = layer.project(x)
    pq, pk = layer.features(q, k, b.batch)
    Mf = layer.dense_mask(b.edge_index, b.num_nodes).to(D)           # kernel of f
    with torch.no_grad():
        layer.f.abs_()
    Ma = layer.dense_mask(b.edge_index, b.num_nodes).to(D)           # kernel of |f|
    a = torch.einsum('ihm,jhm->hij', pq, pk)
    num = torch.einsum('hij,jhd->ihd', a * Mf, v)
    den = (a * Ma).sum(-1).t().unsqueeze(-1)
    ref = layer.to_out((num / (den + layer.eps)).reshape(x.size(0), -1))
    assert torch.allclose(out, ref, atol=1e-12)
    assert float(out.abs().max()) < 1e3


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
    # issue #15 item 2: the global term (and FAVOR+'s key stabilisation) is per graph; a payload
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


def test_exact_kernel_memory_is_estimated_first(monkeypatch):
    # the adversarial review of issue #15 item 7: PowerSeriesAttention (and the public
    # power_series_kernel) on a 20k-node graph failed inside the allocator (3.2 GB for one
    # [N, N] block); the dense blocks are now estimated first, with the O(N) way out named
    from torch_geometric.data import Data
    from pyg_grf.features.exact import power_series_kernel
    from pyg_grf.nn import PowerSeriesAttention
    N = 2000
    path = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    ei = torch.cat([path, path.flip(0)], 1)
    data = Data(x=torch.randn(N, 8), edge_index=ei, num_nodes=N)
    layer = PowerSeriesAttention(8, heads=2, max_length=2)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '50M')
    with pytest.raises(MemoryError, match=r"PowerSeriesAttention's exact kernel on 1 graph\(s\) "
                                          r"of up to 2000 nodes .* attn_type='grf'"):
        layer(data.x, **layer.payload(data))
    with pytest.raises(MemoryError, match=r"exact power-series kernel of 2000 nodes .* "
                                          r"GRFAttention"):
        power_series_kernel(ei, N, [1.0, 0.5, 0.25])
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '2G')  # fits: runs
    assert torch.isfinite(layer(data.x, **layer.payload(data))).all()
