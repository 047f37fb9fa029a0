import pytest
import scipy.linalg
import torch

from pyg_grf.masks import ToeplitzMask
from pyg_grf.masks.toeplitz import next_fast_len
from tests.masks._utils import check_attention, dense_apply


@pytest.mark.parametrize('L', [1, 2, 7, 16, 33])
def test_toeplitz_dense_matches_scipy(L):
    w = torch.randn(2 * L - 1, dtype=torch.float64)
    mask = ToeplitzMask(w)
    assert mask.num_nodes == L and mask.num_heads is None
    # scipy.linalg.toeplitz(first column, first row): M[i, 0] = w[i + L - 1], M[0, j] = w[L-1-j].
    ref = scipy.linalg.toeplitz(w[L - 1:].numpy(), w[:L].flip(0).numpy())
    assert torch.allclose(mask.to_dense(), torch.from_numpy(ref))
    x = torch.randn(L, 5, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), torch.from_numpy(ref) @ x, atol=1e-12)
    x = torch.randn(L, 3, 2, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(mask.to_dense(), x), atol=1e-12)


def test_toeplitz_per_head():
    w = torch.randn(3, 2 * 9 - 1, dtype=torch.float64)
    mask = ToeplitzMask(w)
    assert str(mask) == 'ToeplitzMask(num_nodes=9, heads=3)'
    dense = mask.to_dense()
    assert dense.shape == (3, 9, 9)
    for h in range(3):
        ref = scipy.linalg.toeplitz(w[h, 8:].numpy(), w[h, :9].flip(0).numpy())
        assert torch.allclose(dense[h], torch.from_numpy(ref))
    x = torch.randn(9, 3, 4, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(dense, x), atol=1e-12)
    x2 = torch.randn(9, 4, dtype=torch.float64)  # broadcast to all heads
    assert torch.allclose(mask.matmul(x2), dense_apply(dense, x2), atol=1e-12)
    check_attention(mask)
    check_attention(ToeplitzMask(torch.rand(2 * 9 - 1, dtype=torch.float64)))


def test_toeplitz_float32():
    mask = ToeplitzMask(torch.randn(2 * 20 - 1))
    x = torch.randn(20, 6)
    assert mask.matmul(x).dtype == torch.float32
    assert torch.allclose(mask.matmul(x), mask.to_dense() @ x, atol=1e-4)


def test_toeplitz_gradcheck():
    x = torch.randn(6, 2, dtype=torch.float64)
    w = torch.randn(2, 11, dtype=torch.float64, requires_grad=True)
    xh = torch.randn(6, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: ToeplitzMask(w[0]).matmul(x), (w, ))
    assert torch.autograd.gradcheck(lambda w, xh: ToeplitzMask(w).matmul(xh), (w, xh))


def test_next_fast_len():
    for n in [1, 2, 7, 11, 97, 1000, 4097]:
        m = next_fast_len(n)
        assert m >= n and m <= 2 * n
        r = m
        for p in (2, 3, 5):
            while r % p == 0:
                r //= p
        assert r == 1


def test_toeplitz_bad_input():
    with pytest.raises(ValueError, match=r'odd length.*got \(4,\)'):
        ToeplitzMask(torch.randn(4))
    with pytest.raises(ValueError, match=r'\[2L - 1\] or \[H, 2L - 1\]'):
        ToeplitzMask(torch.randn(2, 2, 3))
    with pytest.raises(ValueError, match='has 2 heads but the input has 3'):
        ToeplitzMask(torch.randn(2, 5)).matmul(torch.randn(3, 3, 1))
