"""LinearAttention (unmasked linear attention per graph) against a float64 per-graph dense
reference written with explicit loops over graphs and heads."""
import pytest
import torch

from pyg_grf.nn import LinearAttention
from pyg_grf.nn.feature_maps import qk_features

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
