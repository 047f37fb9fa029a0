r"""Linear attention masked by a learnable grid relative-position mask (the "Toeplitz-masked
linear" variant of the GRF paper's Table 1; FTFI paper, Sec. 3.2)."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator
from pyg_grf.nn.attention.masked import MaskedLinearAttention


class GridRPEAttention(MaskedLinearAttention):
    r"""Multi-head linear attention masked by
    :math:`M^{(h)}_{ij} = |f_h|(\lVert \mathbf{c}_i - \mathbf{c}_j \rVert_1)`, a learnable
    function of the grid distance between nodes :math:`i, j` (:class:`~pyg_grf.masks.grid.GridRPE`
    as the mask module of :class:`~pyg_grf.nn.attention.masked.MaskedLinearAttention`).

    Every graph of a batch must be the same grid of ``prod(grid_shape)`` nodes in row-major
    order (e.g. the ``DigitsGridDataset`` of ``experiments/image_grids.py``): ``x`` is
    ``[B, n, channels]``, or the ``[B n, channels]`` nodes of a PyG batch of such grids (checked
    against ``batch``).
    All samples share one mask: one mask product for the whole batch.

    Args:
        channels (int): input and output size.
        heads (int, optional): number of heads (default: :obj:`1`).
        grid_shape (sequence of int): the grid's shape, e.g. ``(4, 4)``.
        f_init (float, optional): initial decay of :math:`f_h` with distance (default: 0.5).
        method (str, optional): how the mask is applied, ``'auto'``, ``'fft'`` or ``'dense'``
            (see :class:`~pyg_grf.masks.grid.GridRPEMask`) (default: ``'auto'``).
        **kwargs: those of :class:`~pyg_grf.nn.attention.masked.MaskedLinearAttention`.
    """

    def __init__(self, channels: int, heads: int = 1,
                 grid_shape: Optional[Sequence[int]] = None, f_init: float = 0.5,
                 method: str = 'auto', **kwargs: Any):
        from pyg_grf.masks.grid import GridRPE
        if grid_shape is None:
            raise ValueError("GridRPEAttention needs the grid's shape: grid_shape=[height, "
                             "width] (in a GraphTransformer, attn_kwargs={'grid_shape': "
                             "[height, width]})")
        rpe = GridRPE(grid_shape, heads, f_init, method)
        super().__init__(channels, heads=heads, mask_module=rpe, **kwargs)
        self.grid_nodes = math.prod(rpe.shape)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None, *,
                mask: Optional[MaskOperator] = None) -> Tensor:
        r"""``x`` ``[B, n, channels]`` or ``[B n, channels]``; ``mask`` overrides the grid mask,
        as in :meth:`MaskedLinearAttention.forward
        <pyg_grf.nn.attention.masked.MaskedLinearAttention.forward>`."""
        kwargs = {} if mask is None else {'mask': mask}
        if x.dim() == 3:  # MaskedLinearAttention refuses a batch vector here
            return super().forward(x, batch, **kwargs)
        n, N = self.grid_nodes, x.size(0)
        B = N // n
        if N % n != 0 or (batch is not None and B > 0 and bool(
                (batch != torch.arange(B, device=x.device).repeat_interleave(n)).any())):
            raise ValueError(f"GridRPEAttention needs every graph of the batch to be the grid "
                             f"of {n} nodes (grid_shape), nodes in graph order; got {N} nodes"
                             + ('' if batch is None else
                                f" in {int(batch.max()) + 1 if batch.numel() else 0} graphs"))
        return super().forward(x.view(B, n, -1), **kwargs).view(N, -1)
