r"""Shared helpers of the mask tests."""
import torch

from pyg_grf.nn.functional import masked_linear_attention
from tests.utils import dense_masked_linear_attention


def dense_apply(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    r"""``to_dense() @ x`` for a shared ``[N, N]`` or per-head ``[H, N, N]`` dense mask."""
    if m.dim() == 2:
        if x.dim() == 2:
            return m.to(x.dtype) @ x
        return torch.einsum('ij,jhc->ihc', m.to(x.dtype), x)
    if x.dim() == 2:
        x = x.unsqueeze(1).expand(-1, m.size(0), -1)
    return torch.einsum('hij,jhc->ihc', m.to(x.dtype), x)


def check_attention(mask, heads: int = 2, m: int = 3, d: int = 4):
    r"""The mask inside :func:`masked_linear_attention` equals the dense reference."""
    N = mask.num_nodes
    heads = mask.num_heads or heads
    phi_q = torch.rand(N, heads, m, dtype=torch.float64) + 0.1
    phi_k = torch.rand(N, heads, m, dtype=torch.float64) + 0.1
    v = torch.randn(N, heads, d, dtype=torch.float64)
    out = masked_linear_attention(phi_q, phi_k, v, mask)
    ref = dense_masked_linear_attention(phi_q, phi_k, v, mask.to_dense().double())
    assert out.shape == (N, heads, d)
    assert torch.allclose(out, ref, atol=1e-9, rtol=1e-7)
