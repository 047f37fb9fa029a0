import itertools

import pytest
import torch

from pyg_grf.masks import GridRPEMask
from tests.masks._utils import check_attention, dense_apply

SHAPES = [(7, ), (4, 5), (3, 4, 2), (1, 6)]


def brute_force(shape, f):
    cells = list(itertools.product(*[range(s) for s in shape]))  # row-major order
    N = len(cells)
    out = torch.zeros(f.shape[:-1] + (N, N), dtype=f.dtype)
    for i, ci in enumerate(cells):
        for j, cj in enumerate(cells):
            out[..., i, j] = f[..., sum(abs(a - b) for a, b in zip(ci, cj))]
    return out


@pytest.mark.parametrize('shape', SHAPES)
def test_grid_mask(shape):
    K = sum(s - 1 for s in shape) + 1
    f = torch.randn(K, dtype=torch.float64)
    mask = GridRPEMask(shape, f)
    N = mask.num_nodes
    assert str(mask) == f'GridRPEMask(shape={shape})'
    assert torch.equal(mask.to_dense(), brute_force(shape, f))
    x = torch.randn(N, 5, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), brute_force(shape, f) @ x, atol=1e-12)
    x = torch.randn(N, 2, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(mask.to_dense(), x), atol=1e-12)


@pytest.mark.parametrize('shape', SHAPES)
def test_grid_mask_per_head(shape):
    K = sum(s - 1 for s in shape) + 1
    f = torch.randn(3, K + 2, dtype=torch.float64)  # longer f: extra entries unused
    mask = GridRPEMask(shape, f)
    assert mask.num_heads == 3
    dense = mask.to_dense()
    assert torch.equal(dense, brute_force(shape, f))
    x = torch.randn(mask.num_nodes, 3, 4, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(dense, x), atol=1e-12)
    check_attention(GridRPEMask(shape, torch.rand(3, K, dtype=torch.float64)))


def test_grid_gradcheck():
    f = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    x = torch.randn(12, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda f, x: GridRPEMask((3, 2, 2), f).matmul(x), (f, x))
    x2 = torch.randn(12, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda f: GridRPEMask((4, 3), f[0]).matmul(x2), (f, ))


def test_grid_bad_input():
    with pytest.raises(ValueError, match=r'needs at least 7 entries, got 6'):
        GridRPEMask((4, 4), torch.randn(6))
    with pytest.raises(ValueError, match='positive integers'):
        GridRPEMask((4, 0), torch.randn(6))
    with pytest.raises(ValueError, match=r"'f' must have shape \[K\] or \[H, K\]"):
        GridRPEMask((2, 2), torch.randn(1, 1, 3))
    with pytest.raises(ValueError, match='covers 6 nodes but the input has 5 rows'):
        GridRPEMask((2, 3), torch.randn(4)).matmul(torch.randn(5, 1))


@pytest.mark.parametrize('shape', [(4, 4), (3, 5, 2), (40, 30)])
def test_dense_and_fft_methods_agree(shape):
    # 'auto' multiplies densely up to DENSE_MAX_NODES nodes; both equal the FFT path
    from pyg_grf.masks.grid import DENSE_MAX_NODES
    torch.manual_seed(0)
    K = sum(s - 1 for s in shape) + 1
    N = 1
    for s in shape:
        N *= s
    for f, x in ((torch.rand(K, dtype=torch.float64), torch.randn(N, 3, dtype=torch.float64)),
                 (torch.rand(2, K, dtype=torch.float64),
                  torch.randn(N, 2, 3, dtype=torch.float64))):
        auto = GridRPEMask(shape, f)
        assert auto.method == ('dense' if N <= DENSE_MAX_NODES else 'fft')
        ref = GridRPEMask(shape, f, method='fft').matmul(x)
        assert torch.allclose(GridRPEMask(shape, f, method='dense').matmul(x), ref, atol=1e-12)
        assert torch.allclose(auto.matmul(x), ref, atol=1e-12)
    with pytest.raises(ValueError, match="'method' must be 'auto', 'fft' or 'dense'"):
        GridRPEMask(shape, f, method='conv')


def test_learnable_grid_rpe_module_in_graph_transformer():
    from torch_geometric.data import Batch, Data

    from pyg_grf.datasets import grid_edge_index
    from pyg_grf.masks import GridRPE
    from pyg_grf.nn import GraphTransformer
    from pyg_grf.nn.attention.masked import MaskedLinearAttention
    torch.manual_seed(0)
    rpe = GridRPE((3, 4), heads=2, f_init=0.5)
    assert torch.allclose(rpe.f[0], 0.5 ** torch.arange(6.0))
    mask = rpe()
    assert float(mask.to_dense().min()) >= 0 and mask.num_heads == 2
    graphs = [Data(x=torch.randn(12, 5), edge_index=grid_edge_index(3, 4), y=torch.tensor([0]))
              for _ in range(3)]
    b = Batch.from_data_list(graphs)
    model = GraphTransformer(5, 8, 2, num_layers=1, heads=2, attn_type='grid_rpe',
                             attn_kwargs={'grid_shape': [3, 4]})
    out = model(b)
    out.sum().backward()
    layer = model.blocks[0].attn
    assert isinstance(layer, MaskedLinearAttention) and layer.mask_module.f.grad is not None
    bad = Batch.from_data_list([graphs[0], Data(x=torch.randn(6, 5),
                                                edge_index=grid_edge_index(2, 3),
                                                y=torch.tensor([0]))])
    with pytest.raises(ValueError, match="needs every graph of the batch to be the grid of 12"):
        model(bad)
    with pytest.raises(ValueError, match="needs the grid's shape"):
        GraphTransformer(5, 8, 2, num_layers=1, heads=2, attn_type='grid_rpe')
