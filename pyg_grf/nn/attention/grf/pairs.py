r"""The ``'pairs'`` backend of :class:`~pyg_grf.nn.GRFAttention`: the mask on its support.

For every pair :math:`(i, j)` with :math:`M_{ij} \neq 0` the layer forms
:math:`a_{ij} = M_{ij}\,\phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)` (one sampled product) and
sums :math:`\sum_j a_{ij} [\mathbf{v}_j, 1]` (one CSR product): :math:`O(\mathrm{nnz}(M)
(m + d))` per head (GRF paper, Sec. 3.2; the masked sums of Algorithm 1 on the mask's support).
The mask values are one small product of f-independent statistics, joined once per batch
(:func:`~pyg_grf.features.blocks.mask_statistics`), with the layer's :math:`f_l f_{l'}`:

.. math::
    M_{ij} = \sum_{l \le l'} f_l f_{l'}\, S_{ij}^{l l'}.

Per mask cell the structures hold the column, the row of its statistics and the position of
the mirror cell (``int32`` each), and per stored statistic row :math:`K (K + 1) / 2` values
(``float32``; a symmetric mask stores each row once): about ``12 + K (K + 1)`` bytes per cell
(42 for :math:`K = 5`). The kernel runs the heads one after another on the one pattern and keeps
for its backward only the sampled products (4 bytes per cell and head).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from pyg_grf.features.blocks import block_layout, mask_statistics
from pyg_grf.features.loads import GRFLoads, narrow_index
from pyg_grf.ops import csr_tensor


def csr(crow: Tensor, col: Tensor, values: Tensor, size: int) -> Tensor:
    r"""The square ``[size, size]`` CSR matrix with ``values`` on the support."""
    return csr_tensor(crow, col, values, (size, size))


def coefficient_pairs(f: Tensor, num_coef: int, symmetric: bool) -> Tensor:
    r"""``[h, C]`` coefficients of the statistics: :math:`f_l f_{l'}` for :math:`l \le l'` in
    ``torch.triu_indices(K, K)`` order (symmetric mask), else :math:`f_l` (asymmetric)."""
    if not symmetric:
        return f[:, :num_coef]
    K = int(round(((8 * num_coef + 1) ** 0.5 - 1) / 2))
    if f.size(1) < K:  # statistics of longer walks than f covers: their coefficients are 0
        f = torch.cat([f, f.new_zeros(f.size(0), K - f.size(1))], dim=1)
    iu = torch.triu_indices(K, K, device=f.device)
    return f[:, iu[0]] * f[:, iu[1]]


class PairsStructures(NamedTuple):
    r"""Plan structures of the ``'pairs'`` backend (module docstring)."""
    num_nodes: int
    crow: Tensor               # [N + 1] CSR row pointer of the mask's support
    col: Tensor                # [P] columns, row-major
    src: Optional[Tensor]      # [P] row of stats of every cell (symmetric masks)
    stats: Tensor              # [P', C] statistics (C coefficient ids)
    mirror: Optional[Tensor]   # [P] position of the cell (j, i)
    tperm: Optional[Tensor]    # the transpose's CSR (when there is no mirror)
    tcrow: Optional[Tensor]
    tcol: Optional[Tensor]
    symmetric: bool            # whether stats are the symmetric mask's (ids of hop pairs)
    group_ptr: Optional[tuple]  # folded loads: the first statistic row of every group
    perm: Optional[Tensor] = None  # [N] node of every row, in a locality order

    @property
    def nnz(self) -> int:
        return self.col.numel()

    def stat_values(self, f: Tensor) -> Tensor:
        r"""``[h, P']``: the mask value of every stored statistic row (each cell reads row
        ``src``); differentiable in ``f``. The kernel gathers them per head, so that the
        ``[h, P]`` values are never formed."""
        coef = coefficient_pairs(f, self.stats.size(1), self.symmetric).to(self.stats.dtype)
        if self.group_ptr is None:
            vals = coef @ self.stats.t()
        else:  # each group's statistic rows with its own coefficients (groups are few)
            p = self.group_ptr
            vals = torch.cat([self.stats[p[g]:p[g + 1]] @ coef[g]
                              for g in range(len(p) - 1)]).unsqueeze(0)
        return vals

    def repeat(self, copies: int) -> 'PairsStructures':
        r"""The structures of ``copies`` disjoint copies of the graph (a shared graph for a
        batch of samples); the statistics are not copied (every copy reads the same rows)."""
        if copies == 1:
            return self
        N, P, dev = self.num_nodes, self.nnz, self.col.device
        off = torch.arange(copies, device=dev).view(-1, 1)

        def rep(t: Optional[Tensor], step: int, bound: int) -> Optional[Tensor]:
            if t is None:
                return None
            return narrow_index((t.long().view(1, -1) + off * step).view(-1), bound)
        crow = torch.cat([(self.crow[:-1].long().view(1, -1) + off * P).view(-1),
                          self.crow.new_full((1,), copies * P).long()])
        tcrow = None if self.tcrow is None else torch.cat(
            [(self.tcrow[:-1].long().view(1, -1) + off * P).view(-1),
             self.tcrow.new_full((1,), copies * P).long()])
        src = (self.src.long().repeat(copies) if self.src is not None
               else torch.arange(P, device=dev).repeat(copies))
        return PairsStructures(
            copies * N, narrow_index(crow, copies * P), rep(self.col, N, copies * N),
            narrow_index(src, self.stats.size(0)), self.stats, rep(self.mirror, P, copies * P),
            rep(self.tperm, P, copies * P), None if tcrow is None
            else narrow_index(tcrow, copies * P), rep(self.tcol, N, copies * N),
            self.symmetric, self.group_ptr, rep(self.perm, N, copies * N))

    def to(self, device) -> 'PairsStructures':
        return type(self)(*(t.to(device) if isinstance(t, Tensor) else t for t in self))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self if isinstance(t, Tensor))


#: Single graphs of at least this many nodes get their structures in a locality order.
REORDER_MIN_NODES = 2 ** 15


def locality_order(loads: GRFLoads) -> Optional[Tensor]:
    r"""A node order in which the mask's neighbours lie close (the sparse products gather
    feature rows per mask cell): the reverse Cuthill-McKee order of the symmetrised walk graph,
    for one graph of at least :data:`REORDER_MIN_NODES` nodes on the CPU (:obj:`None`
    otherwise: batches of small graphs are local already)."""
    N = loads.num_nodes
    if loads.num_graphs > 1 or N < REORDER_MIN_NODES or loads.device.type != 'cpu':
        return None
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    i = loads.index.numpy()
    A = sp.csr_matrix((np.ones(i.shape[1], dtype=np.int8), (i[0], i[1])), shape=(N, N))
    return torch.from_numpy(reverse_cuthill_mckee(A + A.T, symmetric_mode=True).astype(np.int64))


def relabel(loads: GRFLoads, perm: Tensor) -> GRFLoads:
    r"""The loads with node ``perm[u]`` renamed ``u`` (one graph, no batch vector)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    key = None if loads.key is None else relabel(loads.key, perm)
    return GRFLoads(inv[loads.index.long()], loads.hop, loads.load, loads.num_nodes,
                    max_length=loads.max_length, key=key)


def _stat_rows(row: Tensor, src: Tensor, stats: Tensor) -> Tensor:
    # the row of every statistic row: that of its first cell (statistics are sorted like cells)
    out = torch.full((stats.size(0),), -1, dtype=row.dtype, device=row.device)
    return out.scatter_reduce(0, src.long(), row, 'amin', include_self=False)


def memory(num_cells: int, num_coef: int, heads: int, itemsize: int = 4,
           symmetric: bool = True) -> int:
    r"""Peak bytes of the plan structures (and the join that builds them, about two cells'
    worth per stored one) plus one layer's forward and backward for ``num_cells`` mask cells:
    per cell and head the mask value, the sampled product kept for the backward and two
    transients."""
    plan = num_cells * (12 + (2 if symmetric else 4) * num_coef) + 2 * num_cells * 32
    return plan + 4 * num_cells * heads * max(itemsize, 4)


#: Scores (4 bytes per mask cell and head) kept for the backward up to this many bytes; larger
#: ones are computed again there (about 5 % more time on a 262k-node kNN graph).
KEEP_SCORES_BYTES = 2 ** 26


class _PairAttention(torch.autograd.Function):
    r"""Masked sums on the support, heads one after another: ``[N, h, C]`` for ``phi_q``,
    ``phi_k`` ``[N, h, m]``, ``v1`` ``[N, h, C]`` and the values ``w`` ``[h, P']`` of the
    statistic rows (gathered to the cells one head at a time)."""

    @staticmethod
    def forward(ctx, phi_q: Tensor, phi_k: Tensor, v1: Tensor, w: Tensor,
                st: PairsStructures) -> Tensor:
        with torch.autocast(phi_q.device.type, enabled=False):  # the dtype chosen here
            N, h, _ = phi_q.shape
            # float32 for half precision (torch's sparse CSR kernels have no half CPU version)
            dt = torch.float32 if phi_q.dtype in (torch.float16, torch.bfloat16) else phi_q.dtype
            out = v1.new_empty(h, N, v1.size(-1), dtype=dt)
            # the scores q_i . k_j are kept for the backward unless they are large: then one
            # buffer serves every head and the backward computes them again (one more sampled
            # product per head, 4 bytes per cell and head less at the peak)
            keep = h * st.nnz * out.element_size() <= KEEP_SCORES_BYTES
            scores = out.new_zeros(h if keep else 1, st.nnz)  # read by sampled_addmm: no NaN
            for i in range(h):  # one shared pattern; heads are few
                s = _sddmm(st, _head(phi_q, i, st.perm, dt), _head(phi_k, i, st.perm, dt),
                           scores[i if keep else 0])
                torch.mm(csr(st.crow, st.col, s * _cell_values(st, w[i], dt), N),
                         _head(v1, i, st.perm, dt), out=out[i])
            ctx.st, ctx.keep = st, keep
            # the operands as given; each head's contiguous copy is made again in the backward
            ctx.save_for_backward(phi_q, phi_k, v1, w, scores if keep else scores[:0])
            ctx.dtypes = (phi_q.dtype, phi_k.dtype, v1.dtype)
            return _node_major(out, st.perm).to(v1.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        with torch.autocast(grad.device.type, enabled=False):
            phi_q, phi_k, v1, w, scores = ctx.saved_tensors
            st = ctx.st
            dt = scores.dtype
            N, h, _ = phi_q.shape
            need = ctx.needs_input_grad
            dq, dk, dv = ctx.dtypes
            # the gradients, every head's rows written whole by its product (no zero fill): in
            # head-major buffers returned as [N, h, C] views, or, with a locality order, in node
            # order [N, h, C], scattered from one [N, C] product buffer
            perm = None if st.perm is None else st.perm.long()

            def grad_of(width: int, dtype: torch.dtype, flag: bool) -> Optional[Tensor]:
                if not flag:
                    return None
                if perm is None:
                    return scores.new_empty(h, N, width)
                return scores.new_empty(N, h, width, dtype=dtype)
            g_q, g_k, g_v = (grad_of(phi_q.size(-1), dq, need[0]),
                             grad_of(phi_k.size(-1), dk, need[1]),
                             grad_of(v1.size(-1), dv, need[2]))
            tmp = (scores.new_empty(N, max(phi_q.size(-1), v1.size(-1)))
                   if perm is not None else None)

            def product(A: Tensor, x: Tensor, target: Tensor, i: int) -> None:
                if perm is None:
                    torch.mm(A, x, out=target[i])
                    return
                out = tmp[:, :x.size(-1)]
                torch.mm(A, x, out=out)
                target[:, i].index_copy_(0, perm, out.to(target.dtype))
            g_w = torch.zeros_like(w, dtype=dt) if need[3] else None
            src = None if st.src is None else st.src.long()  # for the scatter back to the rows
            g_e = scores.new_zeros(st.nnz)  # reused by every head (finite values: beta = 0 is safe)
            buf = None if ctx.keep else scores.new_zeros(st.nnz)
            for i in range(h):  # each head's operands copied contiguous in turn (not all at once)
                qi, ki = _head(phi_q, i, st.perm, dt), _head(phi_k, i, st.perm, dt)
                gi, vi = _head(grad, i, st.perm, dt), _head(v1, i, st.perm, dt)
                s = scores[i] if ctx.keep else _sddmm(st, qi, ki, buf)
                wi = _cell_values(st, w[i], dt)
                _sddmm(st, gi, vi, g_e)   # dL/da_ij = <dO_i, v1_j>
                if g_w is not None:  # to the statistic rows the cells read
                    if src is None:
                        torch.mul(g_e, s, out=g_w[i])
                    else:
                        g_w[i].index_add_(0, src, g_e * s)
                if g_v is not None:
                    product(_transposed(st, s * wi), gi, g_v, i)
                g_s = g_e.mul_(wi)
                if g_q is not None:
                    product(csr(st.crow, st.col, g_s, N), ki, g_q, i)
                if g_k is not None:
                    product(_transposed(st, g_s), qi, g_k, i)
            if perm is None:  # [h, N, C] -> [N, h, C] views
                g_q, g_k, g_v = (None if g is None else g.transpose(0, 1).to(d)
                                 for g, d in ((g_q, dq), (g_k, dk), (g_v, dv)))
            return g_q, g_k, g_v, None if g_w is None else g_w.to(w.dtype), None


def _head(x: Tensor, i: int, perm: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    # head i of [N, h, C] as a contiguous [N, C], rows in the structures' order (one copy)
    x = x[:, i]
    return (x.contiguous() if perm is None else x.index_select(0, perm)).to(dtype)


def _node_major(y: Tensor, perm: Optional[Tensor]) -> Tensor:
    # [h, N, C] in the structures' row order -> [N, h, C] in node order
    y = y.transpose(0, 1)
    if perm is None:
        return y
    return torch.empty_like(y, memory_format=torch.contiguous_format).index_copy_(
        0, perm.long(), y)


def _cell_values(st: PairsStructures, vals: Tensor, dtype: torch.dtype) -> Tensor:
    # one head's mask values on the cells, from the values of the statistic rows
    vals = vals.to(dtype)
    return vals if st.src is None else vals.index_select(0, st.src)


def _sddmm(st: PairsStructures, a: Tensor, b: Tensor, out: Tensor) -> Tensor:
    # <a_i, b_j> on the support, written into ``out`` (finite values: sampled_addmm multiplies
    # its input by beta = 0, which keeps a NaN), since torch otherwise copies its holder
    holder = csr(st.crow, st.col, out, st.num_nodes)
    torch.sparse.sampled_addmm(holder, a, b.t(), beta=0.0, out=holder)
    return out


def _transposed(st: PairsStructures, vals: Tensor) -> Tensor:
    # the transpose of the matrix with ``vals`` on the support: the same indices with mirrored
    # values (symmetric support), else the transpose's own CSR
    if st.mirror is not None:  # int32 ids index directly (no int64 copy of P ids)
        return csr(st.crow, st.col, vals.index_select(0, st.mirror), st.num_nodes)
    return csr(st.tcrow, st.tcol, vals.index_select(0, st.tperm), st.num_nodes)


def linear_sums(st: PairsStructures, phi_q: Tensor, phi_k: Tensor, v: Tensor,
                f: Tensor) -> Tensor:
    r"""``[N, h, d + 1]``: the masked sums :math:`\sum_j M_{ij}\,\phi(\mathbf{q}_i)^\top
    \phi(\mathbf{k}_j)\,[\mathbf{v}_j, 1]` (numerator, then the normaliser)."""
    v1 = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)
    if st.nnz == 0:
        return v1.new_zeros(v1.shape) + 0 * (phi_q.sum() + phi_k.sum() + f.sum())
    # with a locality order (st.perm) the kernel gathers its operands into it and scatters
    # the sums and gradients back, each in the copy it makes anyway
    return _PairAttention.apply(phi_q, phi_k, v1, st.stat_values(f), st)


def build(loads: GRFLoads, mode: str, dtype: torch.dtype, groups: int = 1,
          max_cells: Optional[int] = None) -> PairsStructures:
    r"""The structures of ``loads`` (folded into ``groups`` copies, or not) for the symmetric
    mask :math:`\widehat\Phi_Q\widehat\Phi_K^\top` (``mode='symmetric'``) or the asymmetric
    :math:`\widehat\Phi`, statistics in ``dtype``."""
    symmetric = mode == 'symmetric'
    N = loads.num_nodes
    perm = locality_order(loads) if groups == 1 else None
    if perm is not None:
        loads = relabel(loads, perm)
    lay = block_layout(loads.batch, N, loads.device)
    terms = mask_statistics(loads, lay, symmetric, dtype, max_cells, cells=False)
    if terms.index is not None:
        row, col = terms.index[0].long(), terms.index[1]
    else:  # global ids of the block cells (graphs are contiguous: row-major order holds)
        n = lay.n
        b, rc = terms.cell // (n * n), terms.cell % (n * n)
        start = lay.ptr[b]
        row, col = start + rc // n, start + rc % n
    crow = torch.ops.aten._convert_indices_from_coo_to_csr(row, N)
    mirror = terms.mirror
    tperm = tcrow = tcol = None
    if mirror is None:  # a non-symmetric support: the transpose's own CSR
        tperm = torch.argsort(col * N + row)
        tcrow = torch.ops.aten._convert_indices_from_coo_to_csr(col[tperm], N)
        tcol = narrow_index(row[tperm], N)
        tperm = narrow_index(tperm, row.numel())
    group_ptr = None
    if groups > 1:  # statistic rows of group g: those of rows [g N / G, (g + 1) N / G)
        stat_row = row if terms.src is None else _stat_rows(row, terms.src, terms.stats)
        bounds = torch.arange(groups + 1, device=row.device) * (N // groups)
        group_ptr = tuple(torch.searchsorted(stat_row, bounds).tolist())
    P = col.numel()
    return PairsStructures(
        N, narrow_index(crow, P), narrow_index(col, N),
        None if terms.src is None else narrow_index(terms.src, terms.stats.size(0)),
        terms.stats, None if mirror is None else narrow_index(mirror, P),
        tperm, None if tcrow is None else narrow_index(tcrow, P), tcol, symmetric,
        group_ptr, None if perm is None else narrow_index(perm, N))
