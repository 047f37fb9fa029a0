"""LinearAttention (unmasked linear attention per graph) against a float64 per-graph dense
reference written with explicit loops over graphs and heads."""
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.datasets import grid_edge_index
from pyg_grf.features import power_series_kernel, self_convolution
from pyg_grf.nn import GRFAttention, LinearAttention, PowerSeriesAttention, SoftmaxAttention
from pyg_grf.nn.feature_maps import qk_features
from tests.nn.attention.grf.helpers import batch_of_three, batch_with_draws

D = torch.float64
SORTED = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 3])
UNSORTED = SORTED[torch.randperm(13, generator=torch.Generator().manual_seed(0))]


def loop_reference(layer, x, batch, keep=None):
    """out_i = phi(q_i)^T S_g / (phi(q_i)^T z_g + eps), S_g = sum_j phi(k_j) v_j^T and
    z_g = sum_j phi(k_j) over the graph g of i, each graph on its own (the feature maps too, so
    FAVOR+'s per-graph key stabilisation is its own); `keep` [N, H, 1] is a key-dropout draw."""
    N, H, C = x.size(0), layer.heads, layer.head_channels
    batch = torch.zeros(N, dtype=torch.long) if batch is None else batch
    out = torch.zeros(N, H, C, dtype=x.dtype)
    for g in batch.unique().tolist():
        idx = (batch == g).nonzero().view(-1)
        q, k, v = layer.project(x[idx])
        if keep is not None:
            v = v * keep[idx] / (1 - layer.dropout)
        phi_q, phi_k = qk_features(layer.feature_map, q, k, None)  # one graph
        for h in range(H):
            S = phi_k[:, h].t() @ v[:, h]                 # [m, C]
            z = phi_k[:, h].sum(0)                        # [m]
            out[idx, h] = (phi_q[:, h] @ S) / (phi_q[:, h] @ z + layer.eps).unsqueeze(-1)
    return layer.to_out(out.reshape(N, H * C))


@pytest.mark.parametrize('feature_map', ['relu', 'elu', 'favor+'])
@pytest.mark.parametrize('batch', [SORTED, UNSORTED, None], ids=['sorted', 'unsorted', 'none'])
@pytest.mark.parametrize('eps', [1e-6, 0.3])
def test_equals_dense_loop_reference(feature_map, batch, eps):
    torch.manual_seed(0)
    layer = LinearAttention(12, heads=3, head_channels=5, feature_map=feature_map,
                            eps=eps).double()
    x = torch.randn(13, 12, dtype=D)
    out = layer(x, batch)
    assert out.shape == (13, 12)
    assert torch.allclose(out, loop_reference(layer, x, batch), atol=1e-12, rtol=1e-10)


def test_unsorted_batch_is_a_permutation():
    torch.manual_seed(1)
    layer = LinearAttention(8, heads=2, feature_map='favor+').double()
    x = torch.randn(13, 8, dtype=D)
    perm = torch.randperm(13, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(layer(x[perm], SORTED[perm]), layer(x, SORTED)[perm], atol=1e-12)


def test_dropout_zeroes_keys_of_the_numerator():
    torch.manual_seed(2)
    layer = LinearAttention(8, heads=2, dropout=0.4).double().train()
    x = torch.randn(13, 8, dtype=D)
    torch.manual_seed(5)
    out = layer(x, UNSORTED)
    torch.manual_seed(5)  # the same draw: one per key and head, as key_dropout makes it
    keep = torch.empty(13, 2, 1, dtype=D).bernoulli_(0.6)
    assert not bool(keep.all())
    assert torch.allclose(out, loop_reference(layer, x, UNSORTED, keep), atol=1e-12)


def test_gradcheck():
    torch.manual_seed(3)
    layer = LinearAttention(4, heads=2, feature_map='elu').double()
    x = torch.randn(7, 4, dtype=D, requires_grad=True)
    batch = torch.tensor([1, 0, 1, 2, 0, 1, 1])
    assert torch.autograd.gradcheck(lambda t: layer(t, batch), (x,))
    # and the parameters receive gradients
    layer(x, batch).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_empty_batch_and_repr():
    layer = LinearAttention(8, heads=2)
    x = torch.zeros(0, 8, requires_grad=True)
    out = layer(x, torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 8)
    out.sum().backward()
    assert str(layer) == "LinearAttention(8, heads=2, feature_map='relu')"


def test_bad_input():
    layer = LinearAttention(8, heads=2)
    x = torch.randn(5, 8)
    with pytest.raises(ValueError, match=r"'batch' must have shape \[5\] \(one graph id per "
                                         r"node\), got \(4,\)"):
        layer(x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match='non-negative'):
        layer(x, torch.tensor([0, 0, -1, 1, 1]))
    with pytest.raises(ValueError, match=r'\[N, 8\]'):
        layer(torch.randn(5, 7), torch.zeros(5, dtype=torch.long))


def power_series_mask(layer, edge_index, num_nodes):
    """PowerSeriesAttention's exact mask [H, N, N], sum_k (f*f)_k W^k from its coefficients (the
    dense kernel of the whole batch's block-diagonal adjacency)."""
    alpha = torch.stack([self_convolution(f) for f in layer.coefficients()])
    return power_series_kernel(edge_index, num_nodes, alpha, normalization=layer.normalization)


def _power_series_dense(layer, x, edge_index, batch):
    # the O(N^2) reference over the whole batch: the dense kernel of the batch's block-diagonal
    # adjacency and the one masked-linear primitive
    from pyg_grf.masks import DenseMask
    from pyg_grf.nn.functional import masked_linear_attention
    q, k, v = layer.project(x)
    pq, pk = layer.features(q, k, batch)
    M = DenseMask(power_series_mask(layer, edge_index, x.size(0)).to(x.dtype))
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


def test_power_series_gradients_equal_dense_kernel():
    # the sparse Horner rule against the dense [N, N] kernel: gradients of every parameter
    b = batch_with_draws(2, sizes=(9, 5, 14))
    x = torch.randn(b.num_nodes, 8, dtype=D)
    torch.manual_seed(1)
    layer = PowerSeriesAttention(8, heads=2, max_length=3, f_mode='free').to(D)
    grads = []
    for fn in (lambda: layer(x, b.batch, edge_index=b.edge_index),
               lambda: _power_series_dense(layer, x, b.edge_index, b.batch)):
        layer.zero_grad()
        (fn() * torch.linspace(-1, 1, 8, dtype=D)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in layer.named_parameters()})
    assert grads[0].keys() == grads[1].keys() and grads[0]['f'].abs().sum() > 0
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-10), name


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
    Mf = power_series_mask(layer, b.edge_index, b.num_nodes).to(D)           # kernel of f
    with torch.no_grad():
        layer.f.abs_()
    Ma = power_series_mask(layer, b.edge_index, b.num_nodes).to(D)           # kernel of |f|
    a = torch.einsum('ihm,jhm->hij', pq, pk)
    num = torch.einsum('hij,jhd->ihd', a * Mf, v)
    den = (a * Ma).sum(-1).t().unsqueeze(-1)
    ref = layer.to_out((num / (den + layer.eps)).reshape(x.size(0), -1))
    assert torch.allclose(out, ref, atol=1e-12)
    assert float(out.abs().max()) < 1e3


def test_exact_kernel_memory_is_estimated_first(monkeypatch):
    # PowerSeriesAttention estimates its O(L N m d) key-value products first and names the way
    # out; it never forms the [N, N] kernel, so it runs where the public dense
    # power_series_kernel cannot (a 2000-node path: 16 MB of kernel, 2.2 MB of products)
    from torch_geometric.data import Data

    from pyg_grf.features.exact import power_series_kernel
    from pyg_grf.nn import PowerSeriesAttention
    N = 2000
    path = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    ei = torch.cat([path, path.flip(0)], 1)
    data = Data(x=torch.randn(N, 8), edge_index=ei, num_nodes=N)
    layer = PowerSeriesAttention(8, heads=2, max_length=2)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '1M')
    with pytest.raises(MemoryError, match=r"PowerSeriesAttention's exact kernel on 2000 nodes "
                                          r"\(1 x 2 x 4 x 5 key-value .* attn_type='grf'"):
        layer(data.x, **layer.payload(data))
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '10M')
    with pytest.raises(MemoryError, match=r"exact power-series kernel of 2000 nodes .* "
                                          r"GRFAttention"):
        power_series_kernel(ei, N, [1.0, 0.5, 0.25])
    assert torch.isfinite(layer(data.x, **layer.payload(data))).all()  # fits: runs


def test_power_series_attention_is_the_expectation_reference():
    b = batch_of_three()
    grf = GRFAttention(8, heads=2, max_length=3, feature_map='elu').double()
    ref = PowerSeriesAttention(8, heads=2, max_length=3, feature_map='elu').double()
    ref.load_state_dict(grf.state_dict())
    # its mask is exactly sum_k (f*f)_k W^k (block-diagonal over the batch)
    M = power_series_mask(ref, b.edge_index, b.num_nodes)
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
    q, k, v = soft.to_qkv(d.x).view(N, 3, H, C).unbind(1)
    a = torch.softmax(torch.einsum('ihc,jhc->hij', q, k) / C ** 0.5, -1)
    ref = soft.to_out(torch.einsum('hij,jhc->ihc', a, v).reshape(N, -1))
    assert torch.allclose(soft(d.x), ref, atol=1e-10)
