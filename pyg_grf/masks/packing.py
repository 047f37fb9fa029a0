r"""Packing mask: unmasked attention inside each graph of a PyG mini-batch (FTFI paper,
Sec. 3.1)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator


class PackingLayout(NamedTuple):
    r"""Where the nodes of a batch sit in a zero-padded buffer of per-graph blocks, so that
    per-graph products run as a few batched dense products: ``pos`` ``[N]`` is the row of every
    node, ``buckets`` holds ``(offset, num_graphs, n)`` per bucket (rows
    ``offset : offset + num_graphs * n``, graphs padded to ``n`` rows each), ``num_rows`` the
    rows of the buffer (see :func:`packing_layout`)."""
    pos: Tensor
    buckets: Tuple[Tuple[int, int, int], ...]
    num_rows: int


def packing_layout(batch: Tensor, num_graphs: Optional[int] = None,
                   max_padding: float = 2.0) -> PackingLayout:
    r"""The :class:`PackingLayout` of a batch vector, sorted (PyG) or not.

    If padding every graph to the largest one costs at most ``max_padding`` times the nodes
    (``B * n_max <= max_padding * N``), all graphs form one bucket. Otherwise graphs are
    bucketed by size, sizes in :math:`(2^{k-1}, 2^k]` together, each bucket padded to its own
    largest graph: fewer than :math:`2N` rows in all, in at most :math:`\log_2 n_{max} + 1`
    buckets.

    Args:
        batch (Tensor): ``[N]`` non-negative graph ids (integers; need not be sorted).
        num_graphs (int, optional): number of graphs (default: ``batch.max() + 1``).
        max_padding (float, optional): padded rows allowed per node before bucketing
            (default: :obj:`2.`).
    """
    if batch.dim() != 1:
        raise ValueError(f"'batch' must be 1-D, got shape {tuple(batch.shape)}")
    if batch.is_floating_point() or batch.dtype == torch.bool:
        raise TypeError(f"'batch' must hold integer graph ids, got {batch.dtype}")
    N = batch.numel()
    device = batch.device
    if N == 0:
        return PackingLayout(torch.zeros(0, dtype=torch.long, device=device), (), 0)
    batch = batch.long()
    lo, hi = torch.aminmax(batch)
    ordered = (batch[1:] >= batch[:-1]).all()
    lo, hi, ordered = torch.stack([lo, hi, ordered.long()]).tolist()  # one host read
    if lo < 0:
        raise ValueError(f"'batch' must hold non-negative graph ids, got {lo}")
    if num_graphs is not None and hi >= num_graphs:
        raise ValueError(f"'batch' holds graph id {hi} but 'num_graphs' is {num_graphs}")
    # the sizes by scatter_add: bincount would read the largest id from the device again
    sizes = torch.zeros(hi + 1, dtype=torch.long, device=device).scatter_add_(
        0, batch, torch.ones_like(batch))
    B = sizes.numel()
    ptr = torch.cumsum(sizes, 0) - sizes
    # rank of every node inside its graph (in node order)
    if ordered:
        local = torch.arange(N, device=device) - ptr[batch]
    else:
        perm = torch.argsort(batch, stable=True)
        local = torch.empty_like(batch)
        local[perm] = torch.arange(N, device=device) - ptr[batch[perm]]
    n = int(sizes.max())
    if B * n <= max_padding * N:  # one bucket: graph b at rows b n : (b + 1) n
        return PackingLayout(batch * n + local, ((0, B, n),), B * n)
    # buckets of sizes (2^(k-1), 2^k]; empty graphs (ids without nodes) take no rows
    key = torch.ceil(torch.log2(sizes.clamp(min=1).double())).long()
    key = torch.where(sizes > 0, key, torch.full_like(key, -1))
    base = torch.zeros(B, dtype=torch.long, device=device)  # first row of every graph
    buckets = []
    offset = 0
    for u in torch.unique(key).tolist():  # at most log2(n_max) + 1 buckets
        if u < 0:
            continue
        graphs = (key == u).nonzero().view(-1)
        Bu, nu = graphs.numel(), int(sizes[graphs].max())
        base[graphs] = offset + torch.arange(Bu, device=device) * nu
        buckets.append((offset, Bu, nu))
        offset += Bu * nu
    return PackingLayout(base[batch] + local, tuple(buckets), offset)


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
        self._layout: Optional[PackingLayout] = None

    def _matmul(self, x: Tensor) -> Tensor:
        sums = x.new_zeros((self.num_graphs, x.size(1))).index_add_(0, self.batch, x)
        # index_select, not sums[batch]: its backward is an index_add, not an
        # accumulating index_put
        return sums.index_select(0, self.batch)

    def layout(self) -> PackingLayout:
        r"""The padded per-graph :class:`PackingLayout` of the mask (computed once), for the
        batched-product path :func:`pyg_grf.nn.functional.packed_linear_attention`."""
        if self._layout is None:
            self._layout = packing_layout(self.batch, self.num_graphs)
        return self._layout

    def to_dense(self) -> Tensor:
        return (self.batch.view(-1, 1) == self.batch.view(1, -1)).float()

    def __repr__(self) -> str:
        return f'PackingMask(num_nodes={self.num_nodes}, num_graphs={self.num_graphs})'
