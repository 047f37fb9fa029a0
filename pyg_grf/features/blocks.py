r"""The dense-block layout of a PyG batch (graph ``b`` of at most ``n`` nodes owns the cells
``[b, :n_b, :n_b]`` of a ``[B, n, n]`` array) and the mask statistics coalesced per cell, the
structures behind the ``'dense'`` and ``'pairs'`` backends of :class:`~pyg_grf.nn.GRFAttention`
(built and cached per batch by :class:`~pyg_grf.features.GRFLoads`)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import is_sorted


class BlockLayout(NamedTuple):
    r"""Dense-block layout of a batch of graphs: graph ``b`` occupies rows ``ptr[b]:ptr[b+1]``
    and is padded to ``n`` nodes.

    Attributes:
        num_graphs (int): :math:`B`.
        n (int): the largest graph size :math:`n_{max}`.
        pos (Tensor): ``[N]`` position of every node in the padded ``[B * n]`` layout.
        sizes (Tensor): ``[B]`` graph sizes (CPU).
        ptr (Tensor): ``[B]`` first node of every graph.
    """
    num_graphs: int
    n: int
    pos: Tensor
    sizes: Tensor
    ptr: Tensor

    @property
    def num_cells(self) -> int:
        return self.num_graphs * self.n * self.n


class BlockTerms(NamedTuple):
    r"""Mask entries as f-independent statistics in the dense-block layout: the mask values of
    a layer are ``stats @ coef`` on the cells ``cell``, with ``coef`` the products
    :math:`f_l f_{l'}` for :math:`l \le l'` in ``torch.triu_indices(K, K)`` order (symmetric:
    the statistics of :math:`(l, l')` and :math:`(l', l)` summed, :math:`K(K + 1)/2` ids) or
    :math:`f` itself (asymmetric, id :math:`l`).

    Attributes:
        cell (Tensor): ``[P]`` distinct flat cells in ``[B, n, n]`` holding a mask entry.
        stats (Tensor): ``[P, num_coef]`` summed load products per coefficient id.
    """
    cell: Tensor
    stats: Tensor

    @property
    def num_coef(self) -> int:
        return self.stats.size(1)


def coalesce_terms(cell: Tensor, kid: Tensor, value: Tensor, num_coef: int,
                    num_cells: int) -> BlockTerms:
    if num_cells <= max(8 * cell.numel(), 1 << 24):
        # Distinct cells by a mark-and-count over the (bounded) cell range: no sort.
        mark = torch.zeros(num_cells, dtype=torch.bool, device=cell.device)
        mark[cell] = True
        cells = mark.nonzero().view(-1)
        slot = (torch.cumsum(mark, 0) - 1)[cell]
    else:  # one big graph: the cell range is N^2
        cells, slot = torch.unique(cell, sorted=True, return_inverse=True)
    flat = slot * num_coef + kid
    stats = value.new_zeros(cells.numel() * num_coef).index_add_(0, flat, value)
    return BlockTerms(cells, stats.view(-1, num_coef))


def block_coords(lay: BlockLayout, index: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Padded row ``b * n + r`` and local column ``c`` of entries ``(i, q)``; both ends must lie
    in the same graph ``b`` (walks never leave a graph), checked here once per batch."""
    n = lay.n
    prow, pq = lay.pos[index[0].long()], lay.pos[index[1].long()]
    if prow.numel() > 0 and not bool((prow // n == pq // n).all()):
        raise ValueError("the GRF loads connect nodes of different graphs of the batch: the "
                         "'batch' vector does not match the loads (walks never leave a graph)")
    return prow, pq % n


def block_layout(batch: Optional[Tensor], num_nodes: int) -> BlockLayout:
    r"""Dense-block layout of a batch vector (graphs must be contiguous, as in PyG batches)."""
    if batch is None or num_nodes == 0:
        pos = torch.arange(num_nodes, device=batch.device if batch is not None else None)
        return BlockLayout(1, max(num_nodes, 1), pos, torch.tensor([num_nodes]),
                           torch.zeros(1, dtype=torch.long, device=pos.device))
    batch = batch.long()
    if not is_sorted(batch):
        raise ValueError("'batch' must be sorted (the nodes of each graph contiguous, as in a "
                         "PyG mini-batch)")
    sizes = torch.bincount(batch)
    B = sizes.numel()
    n = int(sizes.max())
    ptr = torch.cumsum(sizes, 0) - sizes
    pos = batch * n + (torch.arange(num_nodes, device=batch.device) - ptr[batch])
    return BlockLayout(B, max(n, 1), pos, sizes.cpu(), ptr)
