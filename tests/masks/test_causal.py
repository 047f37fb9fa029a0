import pytest
import torch

from pyg_grf.masks import CausalMask
from tests.masks._utils import check_attention, dense_apply


def test_causal_mask():
    mask = CausalMask(5)
    assert str(mask) == 'CausalMask(num_nodes=5)'
    assert mask.num_heads is None
    expected = torch.tensor([[1., 0., 0., 0., 0.], [1., 1., 0., 0., 0.], [1., 1., 1., 0., 0.],
                             [1., 1., 1., 1., 0.], [1., 1., 1., 1., 1.]])
    assert torch.equal(mask.to_dense(), expected)

    x = torch.randn(5, 3, dtype=torch.float64)
    assert torch.allclose(mask.matmul(x), dense_apply(mask.to_dense(), x))
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    assert mask.matmul(x).shape == (5, 2, 3)
    assert torch.allclose(mask @ x, dense_apply(mask.to_dense(), x))
    check_attention(mask)


def test_causal_mask_bad_input():
    with pytest.raises(ValueError, match='non-negative integer'):
        CausalMask(-1)
    with pytest.raises(ValueError, match='covers 5 nodes but the input has 4 rows'):
        CausalMask(5).matmul(torch.randn(4, 2))
