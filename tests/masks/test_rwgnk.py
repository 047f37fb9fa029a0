import pytest
import torch
from torch_geometric.utils import to_undirected

from pyg_grf.features import rwgnk_features
from pyg_grf.masks import RWGNKMask


def graph():
    ei = to_undirected(torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 5, 4]]), num_nodes=6)
    return rwgnk_features(ei, 6, 4, lam=0.7, alpha=1.0, max_length=3, dtype=torch.float64)


def test_matmul_equals_dense():
    psi = graph()
    mask = RWGNKMask(psi)
    x = torch.randn(6, 5, dtype=torch.float64)
    dense = mask.to_dense()
    assert torch.allclose(dense, psi.to_dense() @ psi.to_dense().t())
    assert torch.allclose(mask.matmul(x), dense @ x)
    assert torch.allclose(mask @ x, dense @ x)
    # Per-head input [N, H, C] with a shared mask.
    x3 = torch.randn(6, 3, 4, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x3), torch.einsum('ij,jhc->ihc', dense, x3))
    assert str(mask) == f'RWGNKMask(num_nodes=6, nnz={psi._nnz()})'


def test_duplicates_and_csr():
    psi = graph()
    idx, val = psi.indices(), psi.values()
    # Shuffled, with duplicates split in two halves: the sums are what counts.
    perm = torch.randperm(val.numel())
    idx2 = torch.cat([idx[:, perm], idx[:, perm]], dim=1)
    val2 = torch.cat([val[perm], val[perm]]) / 2
    mask = RWGNKMask(torch.sparse_coo_tensor(idx2, val2, (6, 6)))
    x = torch.randn(6, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), RWGNKMask(psi).to_dense() @ x)
    assert torch.allclose(RWGNKMask(psi.to_sparse_csr()).to_dense(), RWGNKMask(psi).to_dense())


def test_gradients():
    psi = graph()
    idx = psi.indices()
    val = psi.values().clone().requires_grad_()
    x = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda v, x: RWGNKMask(torch.sparse_coo_tensor(idx, v, (6, 6))).matmul(x), (val, x))


def test_block_diagonal_over_batch():
    psi = graph()
    idx, val = psi.indices(), psi.values()
    mask = RWGNKMask(torch.sparse_coo_tensor(torch.cat([idx, idx + 6], 1), torch.cat([val, val]),
                                             (12, 12)))
    dense = mask.to_dense()
    assert torch.equal(dense[:6, 6:], torch.zeros(6, 6, dtype=torch.float64))
    assert torch.allclose(dense[6:, 6:], dense[:6, :6])


def test_bad_input():
    with pytest.raises(ValueError, match='sparse'):
        RWGNKMask(torch.eye(3))
    psi = graph()
    with pytest.raises(ValueError, match='covers 6 nodes'):
        RWGNKMask(psi).matmul(torch.randn(5, 2, dtype=torch.float64))
