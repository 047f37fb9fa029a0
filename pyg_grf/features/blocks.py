r"""The dense-block layout of a PyG batch (graph ``b`` owns the cells ``[b, :n_b, :n_b]`` of a
``[B, n, n]`` array) and the mask statistics coalesced per cell (the torch join), behind the
engine of :class:`~pyg_grf.nn.GRFAttention`: pure functions of the loads."""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import check_sorted_batch
from pyg_grf.features.join import CompiledJoinError, compiled_join, compiled_join_available


class BlockLayout(NamedTuple):
    r"""Dense-block layout of a batch of graphs: graph ``b`` occupies rows ``ptr[b]:ptr[b+1]``
    and is padded to ``n`` nodes."""
    num_graphs: int  # B
    n: int           # the largest graph size n_max
    pos: Tensor      # [N] position of every node in the padded [B * n] layout
    sizes: Tensor    # [B] graph sizes (CPU)
    ptr: Tensor      # [B] first node of every graph

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
        cell (Tensor): ``[P]`` distinct flat cells in ``[B, n, n]`` holding a mask entry
            (:obj:`None` with ``index``).
        stats (Tensor): ``[P, num_coef]`` summed load products per coefficient id, or with
            ``src`` ``[P', num_coef]`` for the upper triangle of a symmetric mask only.
        src (Tensor, optional): ``[P]`` row of ``stats`` of every cell (a cell below the
            diagonal reads its mirror).
        mirror (Tensor, optional): ``[P]`` position of the mirror cell :math:`(j, i)` of every
            cell :math:`(i, j)` of a symmetric mask.
        index (tuple of Tensor, optional): ``(row, col)``, the global node ids of the cells.
    """
    cell: Optional[Tensor]
    stats: Tensor
    src: Optional[Tensor] = None
    mirror: Optional[Tensor] = None
    index: Optional[Tuple[Tensor, Tensor]] = None


def _distinct(cell: Tensor, num_cells: int, terms: int) -> Tuple[Tensor, Tensor]:
    # the distinct cells, sorted, and the slot of every given one: by a mark-and-count over the
    # cell range when it is small against the terms (no sort), else by a sort (a graph of 4096
    # nodes has 2^24 cells: marking them took 0.3-0.5 s where sorting its 42k terms takes 9 ms)
    if num_cells <= max(8 * terms, 1 << 20):
        mark = torch.zeros(num_cells, dtype=torch.bool, device=cell.device)
        mark[cell] = True
        return mark.nonzero().view(-1), (torch.cumsum(mark, 0) - 1).index_select(0, cell)
    return torch.unique(cell, sorted=True, return_inverse=True)


def coalesce_terms(cell: Tensor, kid: Tensor, value: Tensor, num_coef: int,
                    num_cells: int) -> BlockTerms:
    cells, slot = _distinct(cell, num_cells, cell.numel())
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


def block_layout(batch: Optional[Tensor], num_nodes: int, device=None) -> BlockLayout:
    r"""Dense-block layout of a batch vector (graphs must be contiguous, as in PyG batches);
    ``device``: where the layout of one graph (``batch=None``) lives."""
    if batch is None or num_nodes == 0:
        pos = torch.arange(num_nodes, device=batch.device if batch is not None else device)
        return BlockLayout(1, max(num_nodes, 1), pos, torch.tensor([num_nodes]),
                           torch.zeros(1, dtype=torch.long, device=pos.device))
    batch = batch.long()
    check_sorted_batch(batch)
    sizes = torch.bincount(batch)
    B = sizes.numel()
    n = int(sizes.max())
    ptr = torch.cumsum(sizes, 0) - sizes
    pos = batch * n + (torch.arange(num_nodes, device=batch.device) - ptr[batch])
    return BlockLayout(B, max(n, 1), pos, sizes.cpu(), ptr)


def symmetric_ids(K: int, device=None) -> Tensor:
    r"""``[K, K]`` id of the unordered pair :math:`\{l, l'\}` among the :math:`K(K + 1)/2`
    upper-triangle pairs (row-major: ``torch.triu_indices(K, K)`` order), for both orders."""
    iu = torch.triu_indices(K, K, device=device)
    ids = torch.empty(K, K, dtype=torch.long, device=device)
    pos = torch.arange(iu.size(1), device=device)
    ids[iu[0], iu[1]] = pos
    ids[iu[1], iu[0]] = pos
    return ids


def join_terms(lay: BlockLayout, prow: Tensor, col: Tensor, hop: Tensor, load: Tensor,
               kprow: Tensor, kcol: Tensor, khop: Tensor, kload: Tensor, K: int,
               num_nodes: int) -> BlockTerms:
    r"""The statistics of :math:`\widehat\Phi_Q\widehat\Phi_K^\top` (module docstring of
    :mod:`~pyg_grf.features.join`): every query entry (padded row ``prow``, visited node
    ``col``, hop ``hop``, ``load``) joined with every key entry of the same visited node, one
    term per pair on cell (query start, key start) with id :func:`symmetric_ids` of the hops."""
    n = lay.n
    krow_local = kprow % n
    # the partners of a query entry are the key entries of its column, contiguous in the key
    # entries sorted by column
    kcol, col = kcol.long(), col.long()
    order = torch.argsort(kcol, stable=True)
    count = torch.bincount(kcol, minlength=num_nodes)
    reps = count[col]
    T = int(reps.sum())
    first = torch.cumsum(reps, 0) - reps
    base = (torch.cumsum(count, 0) - count)[col] - first  # partner slot = base[e] + t
    # cell * K^2 + kid = [(prow n) K^2 + l K][e] + [j_local K^2 + l'][partner]
    KK = K * K
    qkey = torch.repeat_interleave(prow * (n * KK) + hop * K, reps, output_size=T)
    partner = order[torch.repeat_interleave(base, reps, output_size=T)
                    + torch.arange(T, device=col.device)]
    ckey = qkey + (krow_local * KK + khop)[partner]
    value = torch.repeat_interleave(load, reps, output_size=T) * kload[partner]
    cell, kid = ckey // KK, ckey % KK
    # (l, l') and (l', l) share the coefficient f_l f_l': one statistic, id in triu order
    tri = symmetric_ids(K, cell.device)
    return coalesce_terms(cell, tri.view(-1)[kid], value, K * (K + 1) // 2, lay.num_cells)


def self_join_terms(lay: BlockLayout, prow: Tensor, col: Tensor, hop: Tensor, load: Tensor,
                    K: int, num_nodes: int) -> BlockTerms:
    r""":func:`join_terms` of the entries with themselves (:math:`\widehat\Phi\widehat\Phi^\top`,
    no separate key walks) at half the work: the mask and its statistics are symmetric
    (:math:`S_{ij}^{l l'} = S_{ji}^{l' l}`, and the ids already merge :math:`(l, l')` with
    :math:`(l', l)`), so each unordered pair of entries of a visited node is formed once, summed
    on the upper-triangle cell (min start, max start), and the strict upper triangle is then
    mirrored. A pair of distinct entries with the same start node counts twice on its diagonal
    cell (both orders land there)."""
    n, dev = lay.n, prow.device
    nnz = prow.numel()
    col = col.long()
    order = torch.argsort(col, stable=True)
    count = torch.bincount(col, minlength=num_nodes)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(nnz, device=dev)  # slot of every entry in column order
    # partners: the entries of the same column at or after its slot
    reps = count.index_select(0, col) - pos + (torch.cumsum(count, 0) - count).index_select(0, col)
    T = int(reps.sum())
    first = torch.cumsum(reps, 0) - reps
    offset = torch.arange(T, device=dev) - torch.repeat_interleave(first, reps, output_size=T)
    partner = order.index_select(0, torch.repeat_interleave(pos, reps, output_size=T) + offset)
    # per term: graph base row b n, both start nodes (local), hops and loads (gathers by
    # index_select: several times faster than advanced indexing on CPU)
    local = prow % n
    row1 = torch.repeat_interleave(prow, reps, output_size=T)
    local2 = local.index_select(0, partner)
    local1 = torch.repeat_interleave(local, reps, output_size=T)
    lo, hi = torch.minimum(local1, local2), torch.maximum(local1, local2)
    cell = (row1 - local1 + lo) * n + hi
    tri = symmetric_ids(K, dev).view(-1)
    kid = tri.index_select(0, torch.repeat_interleave(hop * K, reps, output_size=T)
                           + hop.index_select(0, partner))
    value = torch.repeat_interleave(load, reps, output_size=T) * load.index_select(0, partner)
    value = torch.where((local1 == local2) & (offset > 0), 2 * value, value)
    upper = coalesce_terms(cell, kid, value, K * (K + 1) // 2, lay.num_cells)
    # mirror the strict upper triangle into row-major order of all cells: each cell's rank
    # among the marked cells is its row (no sort, no copy of the statistics but the mirror's)
    c = upper.cell
    r_, c_ = (c // n) % n, c % n
    strict = (r_ < c_).nonzero().view(-1)
    mirrored = ((c.index_select(0, strict) // (n * n)) * n + c_.index_select(0, strict)) * n \
        + r_.index_select(0, strict)
    cells, slot = _distinct(torch.cat([c, mirrored]), lay.num_cells, T)
    slot_u, slot_m = slot[:c.numel()], slot[c.numel():]
    src = torch.empty_like(cells)
    src.index_copy_(0, slot_u, torch.arange(c.numel(), device=dev))
    src.index_copy_(0, slot_m, strict)
    mirror = torch.arange(cells.numel(), device=dev)
    up = slot_u.index_select(0, strict)
    mirror.index_copy_(0, up, slot_m)
    mirror.index_copy_(0, slot_m, up)
    return BlockTerms(cells, upper.stats, src, mirror)


def mask_statistics(loads, lay: BlockLayout, symmetric: bool, dtype: torch.dtype,
                    max_cells: Optional[int] = None) -> BlockTerms:
    r"""The f-independent mask statistics of ``loads`` (a :class:`~pyg_grf.features.GRFLoads`)
    in the layout ``lay`` (module docstring of :mod:`~pyg_grf.features.join`), summed per cell
    and coefficient id so that a layer's mask values are ``stats @ coef``: ``symmetric`` for
    :math:`\widehat\Phi_Q\widehat\Phi_K^\top` (a join of the entries on their visited node),
    else :math:`\widehat\Phi`. Summed in float64 for ``dtype=float64``, else float32, returned in
    ``dtype``; ``max_cells`` bounds the cells of the compiled join
    (:class:`~pyg_grf.features.join.JoinMemoryError`). The compiled join's result keeps its
    global ``(row, col)`` ids (``index``) instead of the block cells (8 bytes per cell less),
    as the pair backend needs."""
    n = lay.n
    K = loads.max_hop + 1
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    prow, pcol = block_coords(lay, loads.index)
    hop, load = loads.hop.long(), loads.load.to(acc)
    if not symmetric:
        terms = coalesce_terms(prow * n + pcol, hop, load, K, lay.num_cells)
        return terms._replace(stats=terms.stats.to(dtype))
    other = loads if loads.key is None else loads.key
    K = max(K, other.max_hop + 1)
    if compiled_join_available(prow.device):  # the same sums, compiled (features/join.py)
        if other is not loads:
            block_coords(lay, other.index)  # checks that no key entry crosses graphs
        try:
            j = compiled_join(loads.index, hop, load, *((None,) * 3 if other is loads else
                                                        (other.index, other.hop,
                                                         other.load.to(acc))),
                              K, loads.num_nodes, max_cells)
        except CompiledJoinError:  # cannot compile here (warned once): the torch join
            pass
        else:
            return BlockTerms(None, j.stats.to(dtype), j.src, j.mirror, (j.row, j.col))
    if other is loads:  # Phi Phi^T: each unordered pair of entries once, then mirrored
        terms = self_join_terms(lay, prow, loads.index[1], hop, load, K, loads.num_nodes)
    else:
        terms = join_terms(lay, prow, loads.index[1], hop, load,
                           block_coords(lay, other.index)[0], other.index[1],
                           other.hop.long(), other.load.to(acc), K, loads.num_nodes)
    return terms._replace(stats=terms.stats.to(dtype))


def num_join_terms(loads) -> int:
    r"""Number of query/key entry pairs of ``loads`` that share a visited node: the size
    :math:`T` of the join behind the symmetric mask statistics, known before it is run."""
    other = loads if loads.key is None else loads.key
    cnt = torch.bincount(other.index[1].long(), minlength=loads.num_nodes)
    return int(cnt.index_select(0, loads.index[1].long()).sum())
