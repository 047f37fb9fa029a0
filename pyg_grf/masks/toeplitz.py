r"""1-D relative-position (Toeplitz) mask applied by FFT (FTFI paper, Sec. 3.2: the RPE mask
:math:`M_{ij} = f(i - j)` is Toeplitz, so :math:`MX` costs :math:`O(N \log N)`)."""
from __future__ import annotations

import scipy.fft
import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator


def next_fast_len(n: int) -> int:
    r"""The smallest integer :math:`\ge n` whose only prime factors are 2, 3 and 5 (fast FFT
    sizes)."""
    return scipy.fft.next_fast_len(max(int(n), 1), real=True)


class ToeplitzMask(MaskOperator):
    r"""Toeplitz mask of a sequence of :math:`L` tokens (1-D relative positional encoding),

    .. math::
        M_{ij} = w_{i - j + L - 1}, \qquad i, j = 0, \dots, L - 1,

    i.e. ``weights[L - 1]`` on the diagonal, ``weights[L - 1 + k]`` on the :math:`k`-th
    subdiagonal and ``weights[L - 1 - k]`` on the :math:`k`-th superdiagonal (FTFI paper,
    Sec. 3.2 and Definition 3.2). The product embeds :math:`M` into a circulant matrix of a fast
    FFT size :math:`n \ge 2L - 1` (zero padded) and multiplies with ``torch.fft.rfft`` /
    ``irfft``: :math:`O(C\, n \log n)`. It is differentiable in ``weights``.

    Args:
        weights (Tensor): ``[2L - 1]`` (one mask shared by all heads) or ``[H, 2L - 1]`` (one mask
            per head; :obj:`num_heads` is then ``H``).
    """

    def __init__(self, weights: Tensor):
        if not isinstance(weights, Tensor) or weights.dim() not in (1, 2) \
                or weights.size(-1) % 2 != 1:
            shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights)
            raise ValueError(f"'weights' must have shape [2L - 1] or [H, 2L - 1] (an odd length), "
                             f"got {shape}")
        if not weights.is_floating_point():
            weights = weights.float()
        self.weights = weights
        self.num_nodes = (weights.size(-1) + 1) // 2
        self.num_heads = weights.size(0) if weights.dim() == 2 else None
        self.fft_size = next_fast_len(2 * self.num_nodes - 1)

    def _kernel_fft(self, dtype: torch.dtype) -> Tensor:
        # First column of the circulant embedding: c[k] = M[k, 0], c[n - k] = M[0, k].
        L, n = self.num_nodes, self.fft_size
        w = self.weights.to(dtype)
        zeros = w.new_zeros(w.shape[:-1] + (n - 2 * L + 1,))
        col = torch.cat([w[..., L - 1:], zeros, w[..., :L - 1]], dim=-1)
        return torch.fft.rfft(col, n=n, dim=-1)  # [n//2+1] or [H, n//2+1]

    def _matmul(self, x: Tensor) -> Tensor:
        L, n = self.num_nodes, self.fft_size
        kf = self._kernel_fft(x.dtype)
        xf = torch.fft.rfft(x, n=n, dim=0)  # [n//2+1, C] or [n//2+1, H, C]
        if self.num_heads is None:
            yf = xf * kf.unsqueeze(-1)
        else:
            yf = xf * kf.t().unsqueeze(-1)
        return torch.fft.irfft(yf, n=n, dim=0)[:L]

    def to_dense(self) -> Tensor:
        L = self.num_nodes
        i = torch.arange(L, device=self.weights.device)
        return self.weights[..., i.view(-1, 1) - i.view(1, -1) + L - 1]
