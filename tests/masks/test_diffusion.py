import numpy as np
import pytest
import scipy.linalg
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_undirected

from pyg_grf.masks import DiffusionKernelMask
from pyg_grf.masks.diffusion import taylor_parameters
from tests.masks._utils import check_attention, dense_apply
from tests.utils import er_graph, grid_graph

OPERATORS = ['laplacian', 'normalized_laplacian', 'adjacency']


def reference_operator(edge_index, N, operator, edge_weight=None):
    r"""T built densely with numpy, independently of the mask code."""
    A = np.zeros((N, N))
    w = np.ones(edge_index.size(1)) if edge_weight is None else edge_weight.numpy()
    np.add.at(A, (edge_index[0].numpy(), edge_index[1].numpy()), w)
    d = A.sum(1)
    L = np.diag(d) - A
    if operator == 'laplacian':
        return L
    if operator == 'normalized_laplacian':
        return L @ np.linalg.pinv(np.diag(d))  # D^+: zero on isolated nodes
    return -A


def random_graph(N=25, seed=0):
    ei = er_graph(N, 0.12, seed)
    keep = (ei[0] != N - 1) & (ei[1] != N - 1)  # node N - 1 isolated
    return ei[:, keep]


@pytest.mark.parametrize('operator', OPERATORS)
@pytest.mark.parametrize('scale', [0.3, -0.2, 50.0])
def test_diffusion_matches_expm(operator, scale):
    N = 25
    edge_index = random_graph(N)
    T = reference_operator(edge_index, N, operator)
    # scale = lam * ||T||_inf for the large case: needs scaling (several Taylor steps).
    lam = scale / np.abs(T).sum(1).max() if scale == 50.0 else scale
    mask = DiffusionKernelMask(edge_index, N, torch.tensor(lam, dtype=torch.float64), operator)
    if scale == 50.0:
        assert mask.taylor_parameters()[1] > 1
    x = torch.randn(N, 4, dtype=torch.float64)
    E = scipy.linalg.expm(-lam * T)
    ref = E @ x.numpy()
    out = mask.matmul(x).numpy()
    assert np.abs(out - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max())
    assert np.allclose(mask.to_dense().numpy(), E, atol=1e-8 * max(1.0, np.abs(E).max()))
    xh = torch.randn(N, 2, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(xh), dense_apply(torch.from_numpy(E), xh), atol=1e-6)
    # The isolated node keeps its value: M_jj = 1, no coupling.
    assert np.isclose(E[N - 1, N - 1], 1.0) and np.allclose(out[N - 1], x[N - 1].numpy())


@pytest.mark.parametrize('operator', OPERATORS)
def test_diffusion_pyg_batch(operator):
    datas = [Data(edge_index=grid_graph(3, 4), num_nodes=12),
             Data(edge_index=er_graph(9, 0.4, seed=1), num_nodes=9),
             Data(edge_index=to_undirected(torch.tensor([[0, 1, 2], [1, 2, 3]])), num_nodes=5)]
    batch = Batch.from_data_list(datas)
    N = batch.num_nodes
    lam = 1.7
    mask = DiffusionKernelMask(batch.edge_index, N, torch.tensor(lam, dtype=torch.float64),
                               operator=operator)
    blocks = [scipy.linalg.expm(-lam * reference_operator(d.edge_index, d.num_nodes, operator))
              for d in datas]
    ref = torch.from_numpy(scipy.linalg.block_diag(*blocks))
    x = torch.randn(N, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), ref @ x, atol=1e-6)
    check_attention(mask)


def test_diffusion_weighted_per_head():
    N = 12
    edge_index = grid_graph(3, 4)
    w = torch.rand(edge_index.size(1), dtype=torch.float64) + 0.5
    w = (w + w[torch.argsort(edge_index[1] * N + edge_index[0])]) / 2  # symmetric weights
    lam = torch.tensor([0.5, 2.0, -0.3], dtype=torch.float64)
    mask = DiffusionKernelMask(edge_index, N, lam, 'laplacian', edge_weight=w)
    assert mask.num_heads == 3
    T = reference_operator(edge_index, N, 'laplacian', w)
    ref = torch.stack([torch.from_numpy(scipy.linalg.expm(-float(l) * T)) for l in lam])
    assert torch.allclose(mask.to_dense(), ref, atol=1e-10)
    x = torch.randn(N, 3, 4, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(ref, x), atol=1e-8)
    check_attention(mask)
    assert str(mask) == ("DiffusionKernelMask(num_nodes=12, lam=[0.5, 2.0, -0.3], "
                         "operator='laplacian', heads=3)")


def test_diffusion_float32():
    edge_index = grid_graph(4, 4)
    mask = DiffusionKernelMask(edge_index, 16, 0.8, 'normalized_laplacian')
    assert str(mask) == ("DiffusionKernelMask(num_nodes=16, lam=0.8, "
                         "operator='normalized_laplacian')")
    x = torch.randn(16, 3)
    out = mask.matmul(x)
    assert out.dtype == torch.float32 and mask.to_dense().dtype == torch.float32
    assert torch.allclose(out, mask.to_dense() @ x, atol=1e-5)


def test_diffusion_gradcheck():
    edge_index = er_graph(6, 0.5, seed=2)
    x = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    for operator in OPERATORS:
        lam = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda lam: DiffusionKernelMask(edge_index, 6, lam, operator).matmul(x.detach()),
            (lam, ))
    assert torch.autograd.gradcheck(
        lambda lam, x: DiffusionKernelMask(edge_index, 6, lam).matmul(x), (lam, x))
    lam = torch.tensor([0.7, 3.0], dtype=torch.float64, requires_grad=True)
    xh = torch.randn(6, 2, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda lam: DiffusionKernelMask(edge_index, 6, lam).matmul(xh),
                                    (lam, ))


def test_taylor_parameters():
    assert taylor_parameters(0.0) == (0, 1)
    m, s = taylor_parameters(50.0)
    assert s > 1 and 50.0 / s <= 9.9
    with pytest.raises(ValueError, match='finite'):
        taylor_parameters(float('inf'))


def test_diffusion_bad_input():
    edge_index = grid_graph(2, 2)
    with pytest.raises(ValueError, match=r"unknown operator 'heat'.*'laplacian'"):
        DiffusionKernelMask(edge_index, 4, 1.0, operator='heat')
    with pytest.raises(ValueError, match="'lam' must be finite, got nan"):
        DiffusionKernelMask(edge_index, 4, float('nan'))
    with pytest.raises(ValueError, match="'lam' must be finite"):
        DiffusionKernelMask(edge_index, 4, torch.tensor([1.0, float('inf')]))
    with pytest.raises(ValueError, match=r"scalar or a \[H\] tensor, got \(2, 2\)"):
        DiffusionKernelMask(edge_index, 4, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"'edge_weight' must have shape \[8\]"):
        DiffusionKernelMask(edge_index, 4, 1.0, edge_weight=torch.ones(3))
    with pytest.raises(ValueError, match=r'node ids in \[0, 3\)'):
        DiffusionKernelMask(edge_index, 3, 1.0)
    DiffusionKernelMask(edge_index, 4, -2.0)  # negative lam is allowed
