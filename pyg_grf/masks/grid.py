r"""Relative-position mask of a :math:`d`-dimensional grid, applied as a :math:`d`-level
block-Toeplitz matrix by a :math:`d`-dimensional FFT (FTFI paper, Sec. 3.2, Lemma 3.3 and
App. A.7)."""
from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator, dense_matmul
from pyg_grf.masks.toeplitz import next_fast_len

#: :class:`GridRPEMask` with ``method='auto'`` multiplies densely up to this many nodes.
DENSE_MAX_NODES = 1024


def grid_shape(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    r"""``shape`` as a non-empty tuple of positive integers (an int is a 1-D grid)."""
    shape = (shape, ) if isinstance(shape, int) else tuple(shape)
    if len(shape) == 0 or any(int(s) != s or s < 1 for s in shape):
        raise ValueError(f"'shape' must be a non-empty tuple of positive integers, got {shape}")
    return tuple(int(s) for s in shape)


class GridRPEMask(MaskOperator):
    r"""Mask of the nodes of a grid of shape :math:`(s_1, \dots, s_d)` (pixels, patches, voxels,
    video frames) numbered in row-major (C) order, weighted by a function of the grid
    (:math:`\ell_1`, shortest-path) distance:

    .. math::
        M_{ij} = f\big(\lVert \mathbf{c}_i - \mathbf{c}_j \rVert_1\big),

    where :math:`\mathbf{c}_i` is the integer cell of node :math:`i`. In row-major order this matrix
    is :math:`d`-level block-Toeplitz (Lemma 3.3): :math:`MX` is the :math:`d`-dimensional
    convolution of the grid-shaped :math:`X` with the kernel
    :math:`K[\mathbf{o}] = f(|o_1| + \dots + |o_d|)` over offsets
    :math:`|o_k| < s_k`. We compute it with ``torch.fft.rfftn`` on a zero-padded circulant
    embedding of fast FFT sizes :math:`n_k \ge 2 s_k - 1`: :math:`O(C\, N \log N)` for fixed
    :math:`d`. It is differentiable in ``f``.

    Args:
        shape (tuple of int): grid shape :math:`(s_1, \dots, s_d)`, :math:`N = \prod_k s_k`.
        f (Tensor): ``[K]`` (shared by all heads) or ``[H, K]`` (one per head; :obj:`num_heads`
            is then ``H``), with ``f[..., r]`` the weight of grid distance :math:`r`.
            :math:`K \ge \sum_k (s_k - 1) + 1` (the grid diameter plus one); extra entries are
            ignored.
        method (str, optional): ``'fft'`` (:math:`O(N \log N)`), ``'dense'`` (the
            :math:`N \times N` mask times :math:`X`, :math:`O(N^2)`, faster for small grids) or
            ``'auto'``: dense up to :data:`DENSE_MAX_NODES` nodes, FFT beyond
            (default: ``'auto'``).
    """

    def __init__(self, shape: Sequence[int], f: Tensor, method: str = 'auto'):
        if method not in ('auto', 'fft', 'dense'):
            raise ValueError(f"'method' must be 'auto', 'fft' or 'dense', got {method!r}")
        self.shape = grid_shape(shape)
        self.num_nodes = math.prod(self.shape)
        K = sum(s - 1 for s in self.shape) + 1
        if not isinstance(f, Tensor) or f.dim() not in (1, 2):
            got = tuple(f.shape) if isinstance(f, Tensor) else type(f)
            raise ValueError(f"'f' must have shape [K] or [H, K], got {got}")
        if f.size(-1) < K:
            raise ValueError(f"'f' is too short for a grid of shape {self.shape}: distances go up "
                             f"to {K - 1}, so it needs at least {K} entries, got {f.size(-1)}")
        if not f.is_floating_point():
            f = f.float()
        self.f = f
        self.num_distances = K
        self.num_heads = f.size(0) if f.dim() == 2 else None
        self.fft_shape = tuple(next_fast_len(2 * s - 1) for s in self.shape)
        if method == 'auto':
            method = 'dense' if self.num_nodes <= DENSE_MAX_NODES else 'fft'
        self.method = method

    def _distance_index(self, device) -> Tuple[Tensor, Tensor]:
        # For every position of the circulant kernel (index k along dim t means offset k if
        # k < s_t, offset k - n_t if k > n_t - s_t, no offset otherwise): |o|_1 and validity.
        d = len(self.shape)
        dist = torch.zeros(self.fft_shape, dtype=torch.long, device=device)
        valid = torch.ones(self.fft_shape, dtype=torch.bool, device=device)
        for t, (s, n) in enumerate(zip(self.shape, self.fft_shape)):
            k = torch.arange(n, device=device)
            off = torch.where(k < s, k, n - k)  # |offset|
            ok = (k < s) | (k > n - s)
            view = [1] * d
            view[t] = n
            dist = dist + off.view(view)
            valid = valid & ok.view(view)
        return dist.masked_fill(~valid, 0), valid

    def _kernel_fft(self, dtype: torch.dtype) -> Tensor:
        d = len(self.shape)
        dist, valid = self._distance_index(self.f.device)
        f = self.f.to(dtype)
        kern = f[..., dist] * valid.to(dtype)  # [*n] or [H, *n]
        dims = tuple(range(-d, 0))
        return torch.fft.rfftn(kern, s=self.fft_shape, dim=dims)

    def _matmul(self, x: Tensor) -> Tensor:
        if self.method == 'dense':
            return dense_matmul(self.to_dense(), x)
        d, N = len(self.shape), self.num_nodes
        kf = self._kernel_fft(x.dtype)
        rest = tuple(x.shape[1:])  # (C,) or (H, C)
        xg = x.reshape(self.shape + rest)
        dims = tuple(range(d))
        xf = torch.fft.rfftn(xg, s=self.fft_shape, dim=dims)
        if self.num_heads is None:
            kf = kf.view(kf.shape + (1, ))  # [*n', 1]
        else:
            kf = kf.permute(*range(1, d + 1), 0).unsqueeze(-1)  # [*n', H, 1]
        y = torch.fft.irfftn(xf * kf, s=self.fft_shape, dim=dims)
        y = y[tuple(slice(0, s) for s in self.shape)]
        return y.reshape((N, ) + rest)

    def to_dense(self) -> Tensor:
        grids = torch.meshgrid(*[torch.arange(s) for s in self.shape], indexing='ij')
        c = torch.stack([g.reshape(-1) for g in grids], dim=-1).to(self.f.device)  # cells [N, d]
        dist = (c.unsqueeze(1) - c.unsqueeze(0)).abs().sum(-1)
        return self.f[..., dist]

    def __repr__(self) -> str:
        heads = '' if self.num_heads is None else f', heads={self.num_heads}'
        return f'GridRPEMask(shape={self.shape}{heads})'


class GridRPE(torch.nn.Module):
    r"""A learnable grid relative-position mask (FTFI paper, Sec. 3.2): a mask module for
    :class:`~pyg_grf.nn.attention.masked.MaskedLinearAttention` that returns
    :class:`GridRPEMask` ``(shape, |f|)`` with one learnable :math:`f` per head over the grid
    distances, initialised to :math:`f_r = \mathrm{f\_init}^r`. :math:`|f|` keeps the mask
    non-negative, so the normaliser of linear attention cannot vanish (as
    :class:`~pyg_grf.nn.GRFAttention` does by default). This is the
    "Toeplitz-masked linear" variant of the GRF paper's Table 1.

    Args:
        shape (tuple of int): the grid's shape.
        heads (int): number of heads (default: :obj:`1`).
        f_init (float): initial decay per unit of grid distance (default: :obj:`0.5`).
        method (str): as :class:`GridRPEMask` (default: ``'auto'``).
    """

    def __init__(self, shape: Sequence[int], heads: int = 1, f_init: float = 0.5,
                 method: str = 'auto'):
        super().__init__()
        self.shape = grid_shape(shape)
        self.heads, self.f_init, self.method = heads, f_init, method
        self.f = torch.nn.Parameter(torch.empty(heads, sum(s - 1 for s in self.shape) + 1))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.f.copy_(self.f_init ** torch.arange(self.f.size(1), dtype=torch.float))

    def forward(self, **kwargs) -> GridRPEMask:
        return GridRPEMask(self.shape, self.f.abs(), method=self.method)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.shape}, heads={self.heads})'
