r"""Packing mask: unmasked attention inside each graph of a PyG mini-batch (FTFI paper, Sec. 3.1)."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from pyg_grf.masks.base import MaskOperator


class PackingMask(MaskOperator):
    r"""Block-diagonal all-ones mask, :math:`M_{ij} = 1` iff nodes :math:`i` and :math:`j` belong
    to the same graph. :math:`MX` is a segment sum broadcast back to the nodes, :math:`O(NC)`.

    Args:
        batch (Tensor): ``[N]`` graph id of every node (PyG's ``batch`` vector; need not be
            sorted).
        num_graphs (int, optional): number of graphs (default: ``batch.max() + 1``).
    """

    def __init__(self, batch: Tensor, num_graphs: Optional[int] = None):
        if batch.dim() != 1:
            raise ValueError(f"'batch' must be 1-D, got shape {tuple(batch.shape)}")
        if batch.numel() > 0 and int(batch.min()) < 0:
            raise ValueError("'batch' must hold non-negative graph ids")
        self.batch = batch.long()
        self.num_nodes = batch.numel()
        if num_graphs is None:
            num_graphs = int(batch.max()) + 1 if batch.numel() > 0 else 0
        self.num_graphs = num_graphs

    def _matmul(self, x: Tensor) -> Tensor:
        sums = x.new_zeros((self.num_graphs, x.size(1))).index_add_(0, self.batch, x)
        return sums[self.batch]

    def to_dense(self) -> Tensor:
        return (self.batch.view(-1, 1) == self.batch.view(1, -1)).float()

    def __repr__(self) -> str:
        return f'PackingMask(num_nodes={self.num_nodes}, num_graphs={self.num_graphs})'
