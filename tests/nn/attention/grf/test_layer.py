import copy

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads, dense_adjacency, power_series_kernel, self_convolution
from pyg_grf.nn import GRFAttention, LinearAttention, PowerSeriesAttention, SoftmaxAttention
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import er_graph, grid_graph, path_graph

D = torch.float64


def batch_of_three(channels=8, seed=0):
    torch.manual_seed(seed)
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=seed)
    graphs = [Data(x=torch.randn(n, channels, dtype=D), edge_index=ei)
              for n, ei in [(9, grid_graph(3, 3)), (5, path_graph(5)),
                            (11, er_graph(11, 0.3, seed=2))]]
    return Batch.from_data_list([t(g) for g in graphs])


def dense_grf_attention(layer, x, index, length, load, key_scale=None):
    """Independent O(N^2) re-implementation of GRFAttention from its weights; ``key_scale``
    ``[N, H]`` multiplies the coefficients of each key column in the numerator only (the
    linear modes' dropout)."""
    N, H, C = x.size(0), layer.heads, layer.head_channels
    q = (x @ layer.to_q.weight.T + layer.to_q.bias).view(N, H, C)
    k = (x @ layer.to_k.weight.T + layer.to_k.bias).view(N, H, C)
    v = (x @ layer.to_v.weight.T + layer.to_v.bias).view(N, H, C)
    outs = []
    for h in range(H):
        f = layer.f[h]
        keep = length < f.numel()
        phi = torch.zeros(N, N, dtype=D).index_put(
            (index[0, keep], index[1, keep]), f[length[keep].long()] * load[keep].to(D), accumulate=True)
        if layer.mode == 'sparse_softmax':
            s = torch.exp(q[:, h] @ k[:, h].T / C ** 0.5) * phi
        else:
            M = phi @ phi.T if layer.mode == 'symmetric' else phi
            fq, fk = layer.feature_map(q[:, h]), layer.feature_map(k[:, h])
            s = (fq @ fk.T) * M
        num = s if key_scale is None else s * key_scale[:, h].unsqueeze(0)
        outs.append(num @ v[:, h] / s.sum(1, keepdim=True))
    out = torch.cat(outs, dim=1)
    return out @ layer.to_out.weight.T + layer.to_out.bias


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

    def fn(f, wq, wk, wv, x):
        p = {'f': f, 'to_q.weight': wq, 'to_k.weight': wk, 'to_v.weight': wv}
        grf = GRFLoads(b.grf_index, b.grf_length, b.grf_load, x.size(0))
        return torch.func.functional_call(layer, p, (x,), {'grf': grf})

    args = tuple(params[n].detach().clone().requires_grad_() for n in
                 ('f', 'to_q.weight', 'to_k.weight', 'to_v.weight')) + (b.x.clone().requires_grad_(),)
    assert torch.autograd.gradcheck(fn, args, atol=1e-6)
    out = layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.x.size(0)))
    out.square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


def test_power_series_attention_is_the_expectation_reference():
    b = batch_of_three()
    grf = GRFAttention(8, heads=2, max_length=3, feature_map='elu').double()
    ref = PowerSeriesAttention(8, heads=2, max_length=3, feature_map='elu').double()
    ref.load_state_dict(grf.state_dict())
    # its mask is exactly sum_k (f*f)_k W^k (block-diagonal over the batch)
    M = ref.dense_mask(b.edge_index, b.num_nodes)
    exact = power_series_kernel(b.edge_index, b.num_nodes, self_convolution(grf.f[1].double()))
    assert torch.allclose(M[1], exact)
    out = ref(b.x, b.batch, edge_index=b.edge_index)
    for g in range(3):
        d = b.get_example(g)
        assert torch.allclose(out[b.batch == g], ref(d.x, edge_index=d.edge_index), atol=1e-10)


def test_linear_and_softmax_references_are_per_graph():
    b = batch_of_three()
    lin, soft = LinearAttention(8, heads=2).double(), SoftmaxAttention(8, heads=2).double()
    for layer in (lin, soft):
        out = layer(b.x, b.batch)
        for g in range(3):
            d = b.get_example(g)
            assert torch.allclose(out[b.batch == g], layer(d.x), atol=1e-10)
    # softmax: dense reference
    d = b.get_example(0)
    N, H, C = 9, 2, 4
    q = soft.to_q(d.x).view(N, H, C)
    k = soft.to_k(d.x).view(N, H, C)
    v = soft.to_v(d.x).view(N, H, C)
    a = torch.softmax(torch.einsum('ihc,jhc->hij', q, k) / C ** 0.5, -1)
    ref = soft.to_out(torch.einsum('hij,jhc->ihc', a, v).reshape(N, -1))
    assert torch.allclose(soft(d.x), ref, atol=1e-10)


def test_repr_and_reset():
    layer = GRFAttention(16, heads=4, max_length=5)
    assert str(layer) == "GRFAttention(16, heads=4, feature_map='relu', max_length=5, mode='symmetric', backend='auto')"
    assert torch.allclose(layer.f[0], 0.5 ** torch.arange(6.0))
    with torch.no_grad():
        layer.f.zero_()
    layer.reset_parameters()
    assert layer.f[3, 2].item() == 0.25
    assert str(GRFAttention(8, heads=2, mode='asymmetric', feature_map='elu')) == \
        "GRFAttention(8, heads=2, feature_map='elu', max_length=4, mode='asymmetric', backend='auto')"


def test_favor_plus_feature_map_and_redraw():
    layer = GRFAttention(8, heads=2, max_length=3, feature_map='favor+',
                         feature_map_kwargs={'num_features': 16})
    b = batch_of_three()
    out = layer(b.x.float(), grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.x.size(0)))
    assert out.shape == (25, 8) and bool(torch.isfinite(out).all())
    before = layer.feature_map.projection.clone()
    layer.feature_map.redraw()
    assert not torch.equal(before, layer.feature_map.projection)


def test_favor_plus_estimates_softmax_kernel():
    from pyg_grf.nn import FAVORPlus
    torch.manual_seed(0)
    q, k = torch.randn(5, 4, dtype=D) * 0.5, torch.randn(6, 4, dtype=D) * 0.5
    exact = torch.exp(q @ k.T / 4 ** 0.5)
    for orthogonal in (False, True):
        fm = FAVORPlus(4, num_features=4096, stabilize=False, orthogonal=orthogonal).double()
        errs = []
        for _ in range(20):
            fm.redraw()
            errs.append(fm(q) @ fm(k).T / exact - 1)
        errs = torch.stack(errs)
        # unbiased: mean relative error within 5 standard errors; spread ~ 0.02 at m = 4096
        assert float(errs.mean().abs()) < 5 * float(errs.std()) / (errs.numel() ** 0.5)
        assert float(errs.std()) < 0.05
    # stabilised features give the same attention weights (the shift cancels)
    fm = FAVORPlus(4, num_features=64).double()
    a = fm(q, is_query=True) @ fm(k).T
    fm.stabilize = False
    b = fm(q) @ fm(k).T
    assert torch.allclose(a / a.sum(1, keepdim=True), b / b.sum(1, keepdim=True))


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
