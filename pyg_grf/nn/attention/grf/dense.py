r"""The ``'dense'`` backend of :class:`~pyg_grf.nn.GRFAttention`: padded ``[B, n, n]`` blocks.
:math:`\widehat\Phi` is scattered into one dense block per graph, the symmetric mask is one
batched product :math:`\widehat\Phi_Q\widehat\Phi_K^\top` per graph (no join of the walks), and
the attention :math:`A = (\phi(Q)\phi(K)^\top) \odot M` is formed per graph:
:math:`O(\sum_b n_{max}^2)` cells, best for batches of small graphs that the mask fills. The
structures: the block layout and the block cell of every walk entry (``int64``, 8 bytes per
entry), and for ``'sparse_softmax'`` the support of :math:`\widehat\Phi` with its statistics.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from pyg_grf.features.blocks import (
    BlockLayout,
    BlockTerms,
    block_coords,
    block_layout,
    mask_statistics,
)
from pyg_grf.features.loads import GRFLoads
from pyg_grf.nn import functional as F
from pyg_grf.nn.attention.grf.pairs import coefficient_pairs


class DenseStructures(NamedTuple):
    r"""Plan structures of the ``'dense'`` backend."""
    loads: GRFLoads
    layout: BlockLayout
    cells: Tensor                 # [nnz] block cell of every entry
    key_cells: Optional[Tensor]   # [nnz_key] of the key-side walks
    group: Optional[Tensor]       # [nnz] coefficient row of every entry (folded loads)
    key_group: Optional[Tensor]
    terms: Optional[BlockTerms]   # sparse_softmax: statistics of Phi per cell
    support: Optional[Tensor]     # sparse_softmax: [B, n, n] cells of Phi
    copies: int = 1               # disjoint copies of the batch (samples on a shared graph)

    def to(self, device) -> 'DenseStructures':
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        lay = self.layout
        return DenseStructures(self.loads.to(device), lay._replace(
            pos=lay.pos.to(device), ptr=lay.ptr.to(device)), self.cells.to(device),
            mv(self.key_cells), mv(self.group), mv(self.key_group),
            None if self.terms is None else BlockTerms(*(mv(t) for t in self.terms)),
            mv(self.support), self.copies)

    def repeat(self, copies: int) -> 'DenseStructures':
        r"""``copies`` disjoint copies of the batch (copy :math:`c` on graphs
        :math:`c B + b`): the cells shifted per copy, the statistics shared."""
        if copies == 1:
            return self
        lay = self.layout
        B, n, dev = lay.num_graphs, lay.n, lay.pos.device
        off = torch.arange(copies, device=dev).view(-1, 1)

        def shift(t: Optional[Tensor], step: int) -> Optional[Tensor]:
            return None if t is None else (t.view(1, -1) + off * step).view(-1)
        N = lay.pos.numel()
        ptr = shift(lay.ptr, N)
        rep = BlockLayout(copies * B, n, shift(lay.pos, B * n), lay.sizes.repeat(copies), ptr)
        terms = self.terms
        support = self.support
        if terms is not None:
            cell = shift(terms.cell, B * n * n)
            src = torch.arange(terms.stats.size(0), device=dev).repeat(copies) \
                if terms.src is None else terms.src.repeat(copies)
            terms = BlockTerms(cell, terms.stats, src)
            support = support.repeat(copies, 1, 1)
        return self._replace(layout=rep, cells=shift(self.cells, B * n * n),
                             key_cells=shift(self.key_cells, B * n * n), terms=terms,
                             support=support, copies=self.copies * copies)

    def nbytes(self) -> int:
        ts = [self.cells, self.key_cells, self.group, self.key_group, self.support,
              self.layout.pos]
        if self.terms is not None:
            ts += list(self.terms)
        return sum(t.numel() * t.element_size() for t in ts if isinstance(t, Tensor))

    def phi_blocks(self, f: Tensor, key: bool = False) -> Tensor:
        r""":math:`\widehat\Phi` as dense ``[B, h, n, n]`` blocks per graph, differentiable in
        ``f``."""
        loads = self.loads.key if key else self.loads
        v = loads.entry_values(f, self.key_group if key else self.group)
        if v.dim() == 1:
            v = v.unsqueeze(0)
        if self.copies > 1:
            v = v.repeat(1, self.copies)
        lay = self.layout
        cells = self.key_cells if key else self.cells
        out = v.new_zeros(v.size(0), lay.num_cells).index_add(1, cells, v)
        return out.view(-1, lay.num_graphs, lay.n, lay.n).transpose(0, 1)


def build(loads: GRFLoads, mode: str, dtype: torch.dtype, groups: int = 1,
          max_cells: Optional[int] = None) -> DenseStructures:
    r"""The plan structures of ``mode``."""
    lay = block_layout(loads.batch, loads.num_nodes, loads.device)
    n = lay.n

    def cells_of(side: GRFLoads) -> Tensor:
        prow, pcol = block_coords(lay, side.index)
        return prow * n + pcol

    def group_of(side: GRFLoads) -> Optional[Tensor]:
        return None if groups == 1 else side.index[0].long() // (loads.num_nodes // groups)
    key = loads.key if mode == 'symmetric' and loads.key is not None else None
    terms = support = None
    if mode == 'sparse_softmax':
        terms = mask_statistics(loads, lay, False, dtype)
        support = torch.zeros(lay.num_cells, dtype=torch.bool, device=loads.device)
        support[terms.cell] = True
        support = support.view(lay.num_graphs, n, n)
    return DenseStructures(loads, lay, cells_of(loads), None if key is None else cells_of(key),
                           group_of(loads), None if key is None else group_of(key), terms,
                           support)


def memory(num_cells: int, heads: int, itemsize: int = 4) -> int:
    r"""Peak bytes of one layer: about six ``[B, H, n, n]`` tensors (the blocks of
    :math:`\widehat\Phi`, the mask, the attention and their gradients)."""
    return 6 * num_cells * heads * max(itemsize, 4)


def linear_sums(st: DenseStructures, phi_q: Tensor, phi_k: Tensor, v: Tensor, f: Tensor,
                symmetric: bool) -> Tensor:
    r"""``[N, h, d + 1]``: the masked sums (numerator, then the normaliser)."""
    lay = st.layout
    M = st.phi_blocks(f)
    if symmetric:
        K = M if st.key_cells is None else st.phi_blocks(f, key=True)
        M = M @ K.transpose(-1, -2)
    o = F.block_masked_linear_attention(F.to_blocks(phi_q, lay), F.to_blocks(phi_k, lay),
                                        F.to_blocks(v, lay), M, return_sums=True)
    return F.from_blocks(o, lay)


def softmax(st: DenseStructures, q: Tensor, k: Tensor, v: Tensor, f: Tensor, dropout: float,
            training: bool) -> Tensor:
    r"""``[N, h, C]``: the ``'sparse_softmax'`` mode on padded blocks."""
    lay, terms = st.layout, st.terms
    coef = coefficient_pairs(f, terms.num_coef, False).to(terms.stats.dtype)
    if st.group is None:
        vals = terms.values(coef)
    else:  # folded loads: every cell with its group's coefficients
        n = lay.n
        group = (terms.cell // (n * n)) // (lay.num_graphs // coef.size(0))
        vals = (terms.cell_stats() * coef[group]).sum(-1).unsqueeze(0)
    W = F.blocks_from_values(vals.to(q.dtype), terms.cell, lay)
    out = F.block_weighted_softmax_attention(F.to_blocks(q, lay), F.to_blocks(k, lay),
                                             F.to_blocks(v, lay), W, st.support, dropout,
                                             training)
    return F.from_blocks(out, lay)
