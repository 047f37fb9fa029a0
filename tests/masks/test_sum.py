r"""SumMask (:mod:`pyg_grf.masks.sum`): weighted sums of masks against their dense sum."""
import pytest
import torch

from pyg_grf.features import GRFLoads
from pyg_grf.nn.functional import masked_linear_attention
from tests.nn.attention.grf.helpers import D, dense_phi, make_batch
from tests.utils import dense_masked_linear_attention


def test_sum_mask_packing_plus_grf_equals_dense():
    from pyg_grf.masks import GRFMask, PackingMask, SumMask
    b = make_batch()
    N, H = b.num_nodes, 3
    f = torch.rand(H, 4, dtype=D) + 0.1
    beta = torch.tensor([0.2, 0.0, 1.5], dtype=D)
    grf_mask = GRFMask.from_loads(GRFLoads.from_data(b), f=f)
    M = SumMask([PackingMask(b.batch), grf_mask], weights=[beta, 1.0])
    same = (b.batch.view(-1, 1) == b.batch.view(1, -1)).to(D)
    dense = torch.stack([beta[h] * same + dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], N)
                         @ dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], N).T
                         for h in range(H)])
    assert M.num_heads == H and torch.allclose(M.to_dense(), dense)
    x = torch.randn(N, H, 5, dtype=D)
    assert torch.allclose(M.matmul(x), torch.einsum('hij,jhc->ihc', dense, x))
    phi_q, phi_k, v = torch.rand(N, H, 4, dtype=D), torch.rand(N, H, 4, dtype=D), \
        torch.randn(N, H, 6, dtype=D)
    assert torch.allclose(masked_linear_attention(phi_q, phi_k, v, M),
                          dense_masked_linear_attention(phi_q, phi_k, v, dense), atol=1e-9)
    with pytest.raises(ValueError, match='same number of nodes'):
        SumMask([PackingMask(b.batch), PackingMask(b.batch[:-1])])
    with pytest.raises(ValueError, match='one weight per mask'):
        SumMask([PackingMask(b.batch)], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match='disagree on the number of heads'):
        SumMask([grf_mask, PackingMask(b.batch)], weights=[1.0, torch.ones(2)])
