r"""The :class:`MaskOperator` interface and the simplest masks.

A mask operator stands for an :math:`N \times N` matrix :math:`M` (or one per head,
:math:`H \times N \times N`) through a fast product :math:`M X`, all that masked low-rank
attention needs (FTFI paper, Sec. 2, Lemma 2.1 "Tractable Mask Lemma" and Algorithm 1).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor


class MaskOperator:
    r"""Base class of all masks.

    Subclasses implement :meth:`_matmul` for a 2-D input ``[N, C]`` (shared masks) or a 3-D input
    ``[N, H, C]`` (per-head masks, :obj:`num_heads` set), and :meth:`to_dense`.

    Attributes:
        num_nodes (int): :math:`N`.
        num_heads (int or None): number of per-head masks, :obj:`None` if one mask is shared by
            all heads.
    """

    num_nodes: int
    num_heads: Optional[int] = None

    def matmul(self, x: Tensor) -> Tensor:
        r"""Returns :math:`M X`.

        Args:
            x (Tensor): ``[N, C]`` or ``[N, H, C]``. A shared mask applies to every head; a
                per-head mask needs ``[N, H, C]`` with ``H == num_heads`` (a 2-D input is then
                broadcast to all heads and a ``[N, H, C]`` result is returned).
        """
        if x.dim() not in (2, 3):
            raise ValueError(f"{self.__class__.__name__}.matmul expects a tensor of shape [N, C] "
                             f"or [N, H, C], got {tuple(x.shape)}")
        if x.size(0) != self.num_nodes:
            raise ValueError(f"{self.__class__.__name__} covers {self.num_nodes} nodes but the "
                             f"input has {x.size(0)} rows")
        if self.num_heads is None:
            if x.dim() == 2:
                return self._matmul(x)
            N, H, C = x.shape
            return self._matmul(x.reshape(N, H * C)).view(N, H, C)
        if x.dim() == 2:
            x = x.unsqueeze(1).expand(-1, self.num_heads, -1)
        if x.size(1) != self.num_heads:
            raise ValueError(f"{self.__class__.__name__} has {self.num_heads} heads but the input "
                             f"has {x.size(1)}")
        return self._matmul(x)

    __matmul__ = matmul

    def _matmul(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dense(self) -> Tensor:  # pragma: no cover - abstract
        r"""The mask as a dense ``[N, N]`` (or ``[H, N, N]``) tensor. For references and tests
        only: :math:`O(N^2)` memory."""
        raise NotImplementedError

    def __repr__(self) -> str:
        heads = '' if self.num_heads is None else f', heads={self.num_heads}'
        return f'{self.__class__.__name__}(num_nodes={self.num_nodes}{heads})'


def head_param(v: Union[float, Tensor], name: str, device) -> Tensor:
    r"""A mask parameter as a floating tensor, a scalar or ``[H]`` (one per head). Python
    numbers keep their double precision; products run in the input's dtype."""
    if not isinstance(v, Tensor):
        v = torch.tensor(float(v), dtype=torch.float64, device=device)
    if v.dim() > 1:
        raise ValueError(f"'{name}' must be a scalar or a [H] tensor, got {tuple(v.shape)}")
    return v if v.is_floating_point() else v.float()


def format_param(p: Tensor):
    r"""A parameter for ``__repr__``: 6 significant digits, a number or a list."""
    vals = [float(f'{v:.6g}') for v in p.detach().reshape(-1).tolist()]
    return vals if p.dim() > 0 else vals[0]


def dense_matmul(m: Tensor, x: Tensor) -> Tensor:
    if m.dim() == 2:
        return m.to(x.dtype) @ x
    # m: [H, N, N], x: [N, H, C]
    return torch.einsum('hij,jhc->ihc', m.to(x.dtype), x)


class DenseMask(MaskOperator):
    r"""An explicit mask :math:`M` (``[N, N]``, or ``[H, N, N]`` for one per head).
    :math:`O(N^2)`: the reference every fast mask is tested against.

    Args:
        mask (Tensor): ``[N, N]`` or ``[H, N, N]``.
    """

    def __init__(self, mask: Tensor):
        if mask.dim() not in (2, 3) or mask.size(-1) != mask.size(-2):
            raise ValueError(f"'mask' must have shape [N, N] or [H, N, N], got {tuple(mask.shape)}")
        self.mask = mask
        self.num_nodes = mask.size(-1)
        self.num_heads = mask.size(0) if mask.dim() == 3 else None

    def _matmul(self, x: Tensor) -> Tensor:
        return dense_matmul(self.mask, x)

    def to_dense(self) -> Tensor:
        return self.mask


class LowRankMask(MaskOperator):
    r"""A low-rank mask :math:`M = L R` with :math:`L \in \mathbb{R}^{N\times r}`,
    :math:`R \in \mathbb{R}^{r\times N}`; :math:`MX = L(RX)` in :math:`O(Nr C)`.

    Args:
        left (Tensor): ``[N, r]``.
        right (Tensor): ``[r, N]``.
    """

    def __init__(self, left: Tensor, right: Tensor):
        if left.dim() != 2 or right.dim() != 2:
            raise ValueError(f"'left' and 'right' must be 2-D, got {tuple(left.shape)} and "
                             f"{tuple(right.shape)}")
        if left.size(1) != right.size(0) or left.size(0) != right.size(1):
            raise ValueError(f"'left' [N, r] and 'right' [r, N] do not match: {tuple(left.shape)} "
                             f"and {tuple(right.shape)}")
        self.left, self.right = left, right
        self.num_nodes = left.size(0)

    def _matmul(self, x: Tensor) -> Tensor:
        return self.left.to(x.dtype) @ (self.right.to(x.dtype) @ x)

    def to_dense(self) -> Tensor:
        return self.left @ self.right

    def __repr__(self) -> str:
        return f'LowRankMask(num_nodes={self.num_nodes}, rank={self.left.size(1)})'
