import pytest
import torch

from pyg_grf.masks import DenseMask, LowRankMask, PackingMask

D = torch.float64


def test_dense_mask_shared_and_per_head():
    m = torch.rand(5, 5, dtype=D)
    x = torch.randn(5, 3, dtype=D)
    assert torch.allclose(DenseMask(m).matmul(x), m @ x)
    xh = torch.randn(5, 2, 3, dtype=D)
    assert torch.allclose(DenseMask(m).matmul(xh), torch.einsum('ij,jhc->ihc', m, xh))
    mh = torch.rand(2, 5, 5, dtype=D)
    out = DenseMask(mh).matmul(xh)
    assert torch.allclose(out[:, 1], mh[1] @ xh[:, 1])
    assert DenseMask(mh).matmul(x).shape == (5, 2, 3)  # broadcast to heads


def test_low_rank_mask():
    left, right = torch.randn(6, 2, dtype=D), torch.randn(2, 6, dtype=D)
    x = torch.randn(6, 4, dtype=D)
    mask = LowRankMask(left, right)
    assert torch.allclose(mask.matmul(x), mask.to_dense() @ x)
    assert torch.allclose(mask.to_dense(), left @ right)
    with pytest.raises(ValueError, match='do not match'):
        LowRankMask(left, torch.randn(3, 6))


def test_packing_mask_matches_block_diagonal_ones():
    batch = torch.tensor([0, 0, 1, 1, 1, 2, 0])  # unsorted on purpose
    ref = (batch[:, None] == batch[None, :]).to(D)
    mask = PackingMask(batch)
    assert torch.equal(mask.to_dense().to(D), ref)
    x = torch.randn(7, 2, 3, dtype=D)
    assert torch.allclose(mask.matmul(x), torch.einsum('ij,jhc->ihc', ref, x))


def test_mask_shape_errors():
    with pytest.raises(ValueError, match=r'covers 5 nodes but the input has 4 rows'):
        DenseMask(torch.rand(5, 5)).matmul(torch.randn(4, 2))
    with pytest.raises(ValueError, match='has 2 heads but the input has 3'):
        DenseMask(torch.rand(2, 5, 5)).matmul(torch.randn(5, 3, 2))
    with pytest.raises(ValueError, match=r'\[N, N\]'):
        DenseMask(torch.rand(5, 4))
    with pytest.raises(ValueError, match='1-D'):
        PackingMask(torch.zeros(2, 2, dtype=torch.long))
