r"""Sums of masks: :math:`M = \sum_t w_t M_t` has the fast product
:math:`MX = \sum_t w_t (M_t X)` whenever every :math:`M_t` has one (FTFI paper, Lemma 2.1), e.g.
a global term plus a topological mask, :math:`\beta\,\mathbf{1}\mathbf{1}^\top + \widehat\Phi
\widehat\Phi^\top` per graph (:class:`~pyg_grf.masks.PackingMask` +
:class:`~pyg_grf.masks.GRFMask`)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

from torch import Tensor

from pyg_grf.masks.base import MaskOperator


class SumMask(MaskOperator):
    r"""Weighted sum of mask operators over the same nodes.

    Args:
        masks (sequence of MaskOperator): the terms :math:`M_t`.
        weights (sequence, optional): one weight per term, a float or a ``[H]`` tensor (one per
            head; differentiable, e.g. a learnable :math:`\beta \ge 0`) (default: all 1).
    """

    def __init__(self, masks: Sequence[MaskOperator],
                 weights: Optional[Sequence[Union[float, Tensor]]] = None):
        masks = list(masks)
        if len(masks) == 0 or not all(isinstance(m, MaskOperator) for m in masks):
            raise ValueError(f"'masks' must be a non-empty sequence of MaskOperator, got "
                             f"{[type(m).__name__ for m in masks]}")
        sizes = {m.num_nodes for m in masks}
        if len(sizes) != 1:
            raise ValueError(f"all masks must cover the same number of nodes, got {sorted(sizes)}")
        weights = [1.0] * len(masks) if weights is None else list(weights)
        if len(weights) != len(masks):
            raise ValueError(f"expected one weight per mask ({len(masks)}), got {len(weights)}")
        heads = {m.num_heads for m in masks if m.num_heads is not None}
        heads |= {w.numel() for w in weights if isinstance(w, Tensor) and w.dim() > 0}
        if len(heads) > 1:
            raise ValueError(f"the masks and weights disagree on the number of heads: "
                             f"{sorted(heads)}")
        self.masks, self.weights = masks, weights
        self.num_nodes = sizes.pop()
        self.num_heads = heads.pop() if heads else None

    @staticmethod
    def _scale(w: Union[float, Tensor], y: Tensor) -> Tensor:
        if isinstance(w, Tensor) and w.dim() > 0:  # per head: y is [N, H, C]
            return y * w.to(y.dtype).view(1, -1, 1)
        return y * w

    def _matmul(self, x: Tensor) -> Tensor:
        out = None
        for m, w in zip(self.masks, self.weights):  # loop over the few terms
            y = self._scale(w, m.matmul(x))
            out = y if out is None else out + y
        return out

    def to_dense(self) -> Tensor:
        out = None
        for m, w in zip(self.masks, self.weights):
            d = m.to_dense()
            if isinstance(w, Tensor) and w.dim() > 0:
                d = (d if d.dim() == 3 else d.unsqueeze(0)) * w.to(d.dtype).view(-1, 1, 1)
            else:
                d = d * w
            out = d if out is None else out + d
        return out

    def __repr__(self) -> str:
        return f'SumMask({", ".join(repr(m) for m in self.masks)})'
