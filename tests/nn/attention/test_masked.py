import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_undirected

from pyg_grf.masks import (
    CausalMask,
    DenseMask,
    DiffusionKernelMask,
    GridRPEMask,
    PackingMask,
    ToeplitzMask,
    TreeMask,
)
from pyg_grf.nn import MaskedLinearAttention


def dense_reference(layer: MaskedLinearAttention, x: torch.Tensor, m: torch.Tensor):
    r"""The layer re-implemented with the N x N attention matrix formed explicitly, from the
    layer's weights: A_h = (phi(q_h) phi(k_h)^T) * M_h, rows normalised."""
    N, H, C = x.size(0), layer.heads, layer.head_channels
    q, k, v = (x @ layer.to_qkv.weight.T + layer.to_qkv.bias).view(N, 3, H, C).unbind(1)
    if layer.feature_map_name == 'elu':
        fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    else:
        assert layer.feature_map_name == 'relu'
        fq, fk = torch.relu(q), torch.relu(k)
    m = m if m.dim() == 3 else m.expand(H, N, N)
    outs = []
    for h in range(H):
        a = (fq[:, h] @ fk[:, h].t()) * m[h]
        outs.append((a @ v[:, h]) / (a.sum(1, keepdim=True) + layer.eps))
    return torch.cat(outs, 1) @ layer.to_out.weight.t() + layer.to_out.bias


def tree_batch():
    # Two trees of sizes 5 and 3 (a path and a star): a PyG batch, block-diagonal mask.
    t1 = Data(edge_index=to_undirected(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])), num_nodes=5)
    t2 = Data(edge_index=to_undirected(torch.tensor([[0, 0], [1, 2]])), num_nodes=3)
    return Batch.from_data_list([t1, t2])


def masks():
    torch.manual_seed(0)
    b = tree_batch()
    H = 2
    return [
        CausalMask(8),
        ToeplitzMask(torch.rand(2 * 8 - 1, dtype=torch.float64)),
        ToeplitzMask(torch.rand(H, 2 * 8 - 1, dtype=torch.float64)),
        GridRPEMask((2, 4), torch.rand(H, 5, dtype=torch.float64)),
        TreeMask(b.edge_index, b.num_nodes, a=torch.tensor([-0.5, -1.0], dtype=torch.float64)),
        DiffusionKernelMask(b.edge_index, b.num_nodes, lam=0.7),
        PackingMask(b.batch),
        DenseMask(torch.rand(8, 8, dtype=torch.float64)),
    ]


@pytest.mark.parametrize('mask', masks(), ids=lambda m: type(m).__name__)
@pytest.mark.parametrize('fmap', ['relu', 'elu'])
def test_layer_equals_dense_reimplementation(mask, fmap):
    torch.manual_seed(1)
    layer = MaskedLinearAttention(12, heads=2, feature_map=fmap).double()
    x = torch.randn(8, 12, dtype=torch.float64)
    out = layer(x, mask=mask)
    ref = dense_reference(layer, x, mask.to_dense().double())
    assert out.shape == (8, 12)
    assert torch.allclose(out, ref, atol=1e-10)


def test_no_mask_is_per_graph_attention():
    torch.manual_seed(2)
    b = tree_batch()
    layer = MaskedLinearAttention(8, heads=2).double()
    x = torch.randn(8, 8, dtype=torch.float64)
    out = layer(x, batch=b.batch)
    assert torch.allclose(out, layer(x, mask=PackingMask(b.batch)), atol=1e-12)
    # Each graph alone gives the same rows: no attention across graphs.
    assert torch.allclose(out[:5], layer(x[:5]), atol=1e-12)
    assert torch.allclose(out[5:], layer(x[5:]), atol=1e-12)


class LearnableRPE(torch.nn.Module):
    def __init__(self, max_len, heads):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(heads, 2 * max_len - 1, dtype=torch.float64))

    def reset_parameters(self):
        torch.nn.init.normal_(self.w, std=0.1)

    def forward(self, length):
        L = self.w.size(1) // 2 + 1
        return ToeplitzMask(self.w[:, L - length:L + length - 1].exp())


def test_mask_module_is_learned_with_the_layer():
    torch.manual_seed(3)
    rpe = LearnableRPE(16, 2)
    layer = MaskedLinearAttention(8, heads=2, mask_module=rpe).double()
    assert any(p is rpe.w for p in layer.parameters())
    assert 'mask_module=LearnableRPE' in repr(layer)
    x = torch.randn(10, 8, dtype=torch.float64)
    out = layer(x, length=10)
    ref = dense_reference(layer, x, rpe(10).to_dense())
    assert torch.allclose(out, ref, atol=1e-10)
    out.pow(2).sum().backward()
    assert rpe.w.grad is not None and rpe.w.grad[:, 15 - 9:15 + 9].abs().sum() > 0
    # Entries beyond the sequence length never touch the output.
    assert rpe.w.grad[:, :15 - 9].abs().sum() == 0
    # An explicit mask overrides the module.
    assert torch.allclose(layer(x, mask=CausalMask(10)),
                          dense_reference(layer, x, CausalMask(10).to_dense().double()),
                          atol=1e-10)


def test_gradcheck_through_tree_decay():
    torch.manual_seed(4)
    b = tree_batch()
    layer = MaskedLinearAttention(4, heads=2).double()
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    a = torch.tensor([-0.3, -0.8], dtype=torch.float64, requires_grad=True)
    fn = lambda x, a: layer(x, mask=TreeMask(b.edge_index, b.num_nodes, a=a))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, a))


def test_bad_input():
    layer = MaskedLinearAttention(8, heads=2)
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match='covers 5 nodes'):
        layer(x, mask=CausalMask(5))
    with pytest.raises(ValueError, match='has 3 heads'):
        layer(x, mask=ToeplitzMask(torch.rand(3, 11)))
    with pytest.raises(TypeError, match='MaskOperator'):
        layer(x, mask=torch.ones(6, 6))
    with pytest.raises(TypeError, match='mask module'):
        layer(x, length=6)
    with pytest.raises(ValueError, match=r"'batch' must have shape \[6\]"):
        layer(x, batch=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r'\[N, 8\]'):
        layer(torch.randn(6, 7), mask=CausalMask(6))
    with pytest.raises(TypeError, match='torch.nn.Module'):
        MaskedLinearAttention(8, mask_module=lambda: CausalMask(3))
    bad = MaskedLinearAttention(8, mask_module=torch.nn.Identity())
    with pytest.raises(TypeError, match='must return a MaskOperator'):
        bad(x, input=x)


# Samples on one shared mask (x [B, n, C]) ########################################################


def _block_diag_reference(layer, x, mask_dense):
    # the same samples as one batch of B copies: a block-diagonal [B n, B n] dense mask
    from pyg_grf.masks import DenseMask
    B, n, C = x.shape
    dense = mask_dense if mask_dense.dim() == 3 else mask_dense.unsqueeze(0)
    big = torch.stack([torch.block_diag(*([m] * B)) for m in dense])
    big = big if mask_dense.dim() == 3 else big[0]
    return layer(x.reshape(B * n, C), torch.arange(B).repeat_interleave(n),
                 mask=DenseMask(big)).view(B, n, C)


@pytest.mark.parametrize('per_head', [False, True])
def test_shared_mask_over_samples_equals_block_diagonal_batch(per_head):
    from pyg_grf.masks import GridRPEMask
    torch.manual_seed(0)
    B, shape, H = 3, (3, 4), 2
    K = sum(s - 1 for s in shape) + 1
    f = torch.rand(H, K, dtype=torch.float64) + 0.1 if per_head else \
        torch.rand(K, dtype=torch.float64) + 0.1
    mask = GridRPEMask(shape, f)
    layer = MaskedLinearAttention(8, heads=H).double()
    x = torch.randn(B, 12, 8, dtype=torch.float64)
    out = layer(x, mask=mask)
    assert out.shape == (B, 12, 8)
    assert torch.allclose(out, _block_diag_reference(layer, x, mask.to_dense()), atol=1e-12)


def test_shared_mask_without_mask_is_per_sample_linear_attention():
    torch.manual_seed(0)
    layer = MaskedLinearAttention(8, heads=2).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    out = layer(x)
    ref = torch.stack([layer(x[b]) for b in range(3)])  # one sample = one graph
    assert torch.allclose(out, ref, atol=1e-12)
    assert layer.feature_map_name == 'relu'  # the default of every layer now


def test_shared_mask_errors():
    from pyg_grf.masks import GridRPEMask
    layer = MaskedLinearAttention(8, heads=2)
    mask = GridRPEMask((3, 4), torch.rand(6))
    with pytest.raises(ValueError, match=r"covers 12 nodes but 'x' has 10 rows per sample "
                                         r"\(2 samples\)"):
        layer(torch.randn(2, 10, 8), mask=mask)
    with pytest.raises(ValueError, match="'batch' is not used"):
        layer(torch.randn(2, 12, 8), torch.zeros(24, dtype=torch.long), mask=mask)
