r"""The engine of :class:`~pyg_grf.nn.GRFAttention`: the masked attention on the mask's support,
every head in one custom operator.

For every pair :math:`(i, j)` with :math:`M_{ij} \neq 0` and every head :math:`h` the operator
forms :math:`a^{(h)}_{ij} = M^{(h)}_{ij}\,\phi(\mathbf{q}^{(h)}_i)^\top\phi(\mathbf{k}^{(h)}_j)`
(one sampled product) and sums :math:`\sum_j a^{(h)}_{ij} [\mathbf{v}^{(h)}_j, 1]` (one CSR
product): :math:`O(\mathrm{nnz}(M) H (m + d))` (GRF paper, Sec. 3.2; the masked sums of
Algorithm 1 on the mask's support). The heads are the diagonal blocks of one block-diagonal
pattern over head-major operands ``[H N, C]``, so a head's rows are a view and no Python loop
over heads runs. The mask values are one small product of f-independent statistics, joined once
per batch (:func:`~pyg_grf.features.blocks.mask_statistics`), with the layer's
:math:`f_l f_{l'}`:

.. math::
    M_{ij} = \sum_{l \le l'} f_l f_{l'}\, S_{ij}^{l l'}.

The operator and its backward are ``torch.library`` custom operators (``pyg_grf::pair_sums`` and
``pyg_grf::pair_sums_backward``) with fake implementations, so ``torch.compile`` traces through
the layer and treats them as one node each. Per mask cell the base structures hold the column,
the statistic row and the transposed position (``int32`` each) and per statistic row
:math:`K (K + 1) / 2` values (``float32``; a symmetric mask stores each row once); the
per-head index (:class:`KernelIndex`, 12 bytes per cell and head) is kept in the plan up to
:data:`KERNEL_INDEX_BYTES`; beyond (one huge graph) the operator runs the heads one after
another on the base structures, inside the one call.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf.features.blocks import block_layout, mask_statistics
from pyg_grf.features.loads import GRFLoads, narrow_index
from pyg_grf.ops import csr_mm, csr_tensor, sampled_dot


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


class KernelIndex(NamedTuple):
    r"""The index tensors the operator reads, for ``copies`` diagonal blocks (heads, or heads
    times samples of a shared graph): the CSR of the support, the CSR of its transpose with the
    position of every transposed cell in the support (``tperm``), and the flat statistic value
    of every cell (``wsrc``, into ``[rows of coefficients, P']``)."""
    crow: Tensor
    col: Tensor
    tcrow: Tensor
    tcol: Tensor
    tperm: Tensor
    wsrc: Tensor

    def to(self, device) -> 'KernelIndex':
        return KernelIndex(*(t.to(device) for t in self))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self)


class PairsStructures(NamedTuple):
    r"""Plan structures of one mask (module docstring): the support of one graph (or of the
    heads folded into the nodes, with walks per head), its statistics, and the per-head kernel
    index when it was kept."""
    num_nodes: int             # rows of the base support
    crow: Tensor               # [N + 1] CSR row pointer of the support
    col: Tensor                # [P] columns, row-major
    tcrow: Tensor              # [N + 1] the transpose's CSR (the support's own if symmetric)
    tcol: Tensor               # [P]
    tperm: Tensor              # [P] position in the support of every transposed cell
    src: Tensor                # [P] statistic row of every cell
    stats: Tensor              # [P', C] statistics (C coefficient ids)
    symmetric: bool            # whether stats are the symmetric mask's (ids of hop pairs)
    group: Optional[Tensor]    # [P] coefficient row of every cell (folded walks per head)
    perm: Optional[Tensor] = None      # [N] node of every row, in a locality order
    index: Optional[KernelIndex] = None  # per-head index for `heads` blocks, when kept
    heads: int = 1

    @property
    def nnz(self) -> int:
        return self.col.numel()

    def expand(self, heads: int, samples: int = 1) -> KernelIndex:
        r"""The :class:`KernelIndex` of ``heads`` (times ``samples``) diagonal blocks: block
        ``c = h * samples + b`` reads coefficient row ``h``; with walks per head (``group``) the
        base already holds the heads and is repeated ``samples`` times."""
        if self.index is not None and samples == 1 and heads == self.heads:
            return self.index
        P, N, Ps = self.nnz, self.num_nodes, self.stats.size(0)
        copies = samples if self.group is not None else heads * samples
        dev = self.col.device
        blk = torch.arange(copies, device=dev).view(-1, 1)

        def rep(t: Tensor, step: int) -> Tensor:
            return (t.view(1, -1).long() + blk * step).view(-1)

        def ptr(t: Tensor) -> Tensor:
            return torch.cat([rep(t[:-1], P), t.new_full((1,), copies * P).long()])
        if self.group is not None:  # walks per head: the cell's own coefficient row
            w = (self.group.long() * Ps + self.src.long()).repeat(copies)
        else:
            w = (self.src.view(1, -1).long() + (blk // samples) * Ps).view(-1)
        out = (ptr(self.crow), rep(self.col, N), ptr(self.tcrow), rep(self.tcol, N),
               rep(self.tperm, P), w)
        Q, R = copies * P, copies * N
        return KernelIndex(*(narrow_index(t, max(Q, R) + 1) for t in out))

    def values(self, f: Tensor) -> Tensor:
        r"""``[rows, P']``: the mask value of every statistic row for every coefficient row of
        ``f`` (``[H, L + 1]``); differentiable in ``f``. The kernel gathers them to the cells."""
        coef = _as(coefficient_pairs(f, self.stats.size(1), self.symmetric), self.stats.dtype)
        return coef @ self.stats.t()

    def to(self, device) -> 'PairsStructures':
        return PairsStructures(*(t.to(device) if isinstance(t, (Tensor, KernelIndex)) else t
                                 for t in self))

    def nbytes(self) -> int:
        return sum(t.nbytes() if isinstance(t, KernelIndex) else t.numel() * t.element_size()
                   for t in self if isinstance(t, (Tensor, KernelIndex)))


#: The per-head kernel index is kept in the plan up to this many bytes (beyond, the heads run
#: one after another on the base structures, so that the plan of one huge graph stays small).
KERNEL_INDEX_BYTES = 2 ** 28
#: Heads run as one block while their scores (4 bytes per cell and head) stay below this many
#: bytes; beyond, one after another (samples of a shared graph: in chunks of heads), so that
#: one huge graph's transients stay bounded.
CHUNK_BYTES = 2 ** 30
#: Scores are kept for the backward up to this many bytes; larger ones are computed again there
#: (one more sampled product: about 5 % of a layer on a 262k-node kNN graph).
KEEP_SCORES_BYTES = 2 ** 26
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


def memory(num_cells: int, num_coef: int, heads: int, itemsize: int = 4,
           symmetric: bool = True) -> int:
    r"""Peak bytes of the plan structures (and the join that builds them, about two cells'
    worth per stored one) plus one layer's forward and backward for ``num_cells`` mask cells:
    per cell and head the index (12 bytes), the mask value, the score kept for the backward and
    two transients."""
    plan = num_cells * (16 + (2 if symmetric else 4) * num_coef) + 2 * num_cells * 32
    return plan + num_cells * heads * (12 + 4 * max(itemsize, 4))


def build(loads: GRFLoads, mode: str, dtype: torch.dtype, groups: int = 1,
          max_cells: Optional[int] = None, heads: int = 1) -> PairsStructures:
    r"""The structures of ``loads`` (folded into ``groups`` copies, or not) for the symmetric
    mask :math:`\widehat\Phi_Q\widehat\Phi_K^\top` (``mode='symmetric'``) or the asymmetric
    :math:`\widehat\Phi`, statistics in ``dtype``, with the kernel index of ``heads`` heads
    kept when it is small (:data:`KERNEL_INDEX_BYTES`)."""
    symmetric = mode == 'symmetric'
    N = loads.num_nodes
    perm = locality_order(loads) if groups == 1 else None
    if perm is not None:
        loads = relabel(loads, perm)
    lay = block_layout(loads.batch, N, loads.device)
    terms = mask_statistics(loads, lay, symmetric, dtype, max_cells)
    if terms.index is not None:
        row, col = terms.index[0].long(), terms.index[1].long()
    else:  # global ids of the block cells (graphs are contiguous: row-major order holds)
        n = lay.n
        b, rc = terms.cell // (n * n), terms.cell % (n * n)
        start = lay.ptr[b]
        row, col = start + rc // n, start + rc % n
    P = col.numel()
    crow = torch.ops.aten._convert_indices_from_coo_to_csr(row, N)
    if terms.mirror is not None:  # a symmetric support: the transpose is the mirror cell
        tperm, tcrow, tcol = terms.mirror, crow, col
    else:
        tperm = torch.argsort(col * N + row)
        tcrow = torch.ops.aten._convert_indices_from_coo_to_csr(col.index_select(0, tperm), N)
        tcol = row.index_select(0, tperm)
    src = torch.arange(P, device=col.device) if terms.src is None else terms.src
    group = None if groups == 1 else row // (N // groups)  # walks per head: the cell's head
    st = PairsStructures(N, narrow_index(crow, P), narrow_index(col, N), narrow_index(tcrow, P),
                         narrow_index(tcol, N), narrow_index(tperm, P),
                         narrow_index(src, terms.stats.size(0)), terms.stats, symmetric,
                         None if group is None else narrow_index(group, groups),
                         None if perm is None else narrow_index(perm, N))
    copies = 1 if group is not None else heads
    if 12 * P * copies <= KERNEL_INDEX_BYTES:
        st = st._replace(index=st.expand(copies), heads=copies)
    return st


def _spmm(crow: Tensor, col: Tensor, vals: Tensor, x: Tensor,
          out: Optional[Tensor] = None) -> Tensor:
    # the CSR product, into a fresh tensor or into rows of a larger result (``out``)
    return csr_mm(csr_tensor(crow, col, vals, (crow.numel() - 1, x.size(0))), x, out)


def _as(x: Tensor, dtype: torch.dtype) -> Tensor:
    # x in dtype, contiguous (no operator when it already is)
    x = x if x.dtype == dtype else x.to(dtype)
    return x if x.is_contiguous() else x.contiguous()


def _dtype(x: Tensor) -> torch.dtype:
    # float32 for half precision (torch's CSR kernels have no half CPU version, and
    # sampled_addmm none on CUDA)
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _block_sums(q: Tensor, k: Tensor, v: Tensor, w: Tensor, wsrc: Tensor, crow: Tensor,
                col: Tensor, out: Optional[Tensor] = None,
                buf: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    # one block of pair_sums: its sums (into ``out`` when given) and scores (into ``buf``,
    # finite, when given: the blocks share one buffer, which sampled_dot multiplies by 0)
    s = sampled_dot(crow, col, q, k, q.new_zeros(col.numel()) if buf is None else buf)
    return _spmm(crow, col, s * w.index_select(0, wsrc), v, out), s


@torch.library.custom_op('pyg_grf::pair_sums', mutates_args=())
def pair_sums(q: Tensor, k: Tensor, v: Tensor, w: Tensor, wsrc: Tensor, crow: Tensor,
              col: Tensor, tcrow: Tensor, tcol: Tensor, tperm: Tensor,
              keep_scores: bool, blocks: int) -> Tuple[Tensor, Tensor]:
    r"""``(out, scores)``: :math:`\mathrm{out}_i = \sum_j w_{ij} \langle q_i, k_j \rangle v_j`
    over the support ``(crow, col)`` (every head a diagonal block), with the mask value of cell
    ``c`` read from the statistic values ``w[wsrc[c]]``, and the scores
    :math:`\langle q_i, k_j \rangle` (empty unless ``keep_scores``). ``q``, ``k`` ``[R, m]``,
    ``v`` ``[R, C]``, ``w`` ``[S]`` (the small table of statistic values, not one per cell: the
    backward gathers it again); the transpose's index is read by the backward only. With
    ``blocks > 1`` the index is that of one block of ``R / blocks`` rows, and the blocks (heads
    of one huge graph) run one after another on it, block ``b`` reading the ``b``-th part of
    ``w``: no per-head copy of the index, and the results written in place."""
    with torch.autocast(q.device.type, enabled=False):
        dt = _dtype(q)
        qd, kd, vd, wd = (_as(t, dt) for t in (q, k, v, w))
        if blocks == 1:
            out, s = _block_sums(qd, kd, vd, wd, wsrc, crow, col)
            return _as(out, v.dtype), (s if keep_scores else s.new_empty(0))
        R, S, P = q.size(0) // blocks, w.numel() // blocks, col.numel()
        # the scores of every block when kept, else one buffer the blocks share
        out, scores = vd.new_empty(vd.shape), qd.new_zeros(blocks * P if keep_scores else P)
        for b in range(blocks):
            r = slice(b * R, (b + 1) * R)
            _block_sums(qd[r], kd[r], vd[r], wd[b * S:(b + 1) * S], wsrc, crow, col, out[r],
                        scores[b * P:(b + 1) * P] if keep_scores else scores)
        return _as(out, v.dtype), (scores if keep_scores else qd.new_empty(0))


@pair_sums.register_fake
def _(q, k, v, w, wsrc, crow, col, tcrow, tcol, tperm, keep_scores, blocks):
    n = blocks * col.numel() if keep_scores else 0
    return v.new_empty(q.size(0), v.size(1)), q.new_empty(n, dtype=_dtype(q))


def _block_grads(g_out: Tensor, q: Tensor, k: Tensor, v: Tensor, w: Tensor, wsrc: Tensor,
                 s: Optional[Tensor], crow: Tensor, col: Tensor, tcrow: Tensor, tcol: Tensor,
                 tperm: Tensor, needs: List[bool], outs, bufs=(None, None)
                 ) -> List[Optional[Tensor]]:
    # one block of pair_sums_backward, each gradient into its ``outs`` entry when given (the
    # statistic values' gradient added to it), the per-cell values into ``bufs`` when given
    wd = w.index_select(0, wsrc)
    P = col.numel()
    if s is None:
        s = sampled_dot(crow, col, q, k, q.new_zeros(P) if bufs[0] is None else bufs[0])
    g = sampled_dot(crow, col, g_out, v,  # dL/da_ij = <dO_i, v_j>
                    q.new_zeros(P) if bufs[1] is None else bufs[1])
    gw = (torch.zeros_like(w) if outs[3] is None else outs[3]).index_add_(0, wsrc, g * s) \
        if needs[3] else None
    gv = _spmm(tcrow, tcol, (s * wd).index_select(0, tperm), g_out, outs[2]) \
        if needs[2] else None
    g = g.mul_(wd)
    gq = _spmm(crow, col, g, k, outs[0]) if needs[0] else None
    gk = _spmm(tcrow, tcol, g.index_select(0, tperm), q, outs[1]) if needs[1] else None
    return [gq, gk, gv, gw]


@torch.library.custom_op('pyg_grf::pair_sums_backward', mutates_args=())
def pair_sums_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, w: Tensor, wsrc: Tensor,
                       scores: Tensor, crow: Tensor, col: Tensor, tcrow: Tensor, tcol: Tensor,
                       tperm: Tensor, needs: List[bool], blocks: int
                       ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The gradients of :func:`pair_sums` in ``q``, ``k``, ``v``, ``w`` (empty where
    ``needs`` says so), with :math:`g_{ij} = \langle \partial L / \partial o_i, v_j \rangle`:
    :math:`\partial w_{ij} = g_{ij} s_{ij}` (summed into the statistic values the cells read),
    :math:`\partial v = (w \odot s)^\top \partial o`, :math:`\partial q = (g \odot w) k`,
    :math:`\partial k = (g \odot w)^\top q`; ``blocks`` as in :func:`pair_sums`."""
    with torch.autocast(grad.device.type, enabled=False):
        dt = _dtype(q)
        qd, kd, gd, vd, wd = (_as(t, dt) for t in (q, k, grad, v, w))
        P = col.numel()
        if blocks == 1:
            grads = _block_grads(gd, qd, kd, vd, wd, wsrc, scores if scores.numel() == P
                                 else None, crow, col, tcrow, tcol, tperm, needs, [None] * 4)
        else:
            R, S = q.size(0) // blocks, w.numel() // blocks
            grads = [torch.empty_like(t) if n else None for t, n in zip((qd, kd, vd), needs)]
            grads.append(torch.zeros_like(wd) if needs[3] else None)
            kept = scores.numel() == blocks * P
            bufs = (None if kept else qd.new_zeros(P), qd.new_zeros(P))
            for b in range(blocks):
                r, t = slice(b * R, (b + 1) * R), slice(b * S, (b + 1) * S)
                _block_grads(gd[r], qd[r], kd[r], vd[r], wd[t], wsrc,
                             scores[b * P:(b + 1) * P] if kept else None, crow, col, tcrow,
                             tcol, tperm, needs,
                             [None if x is None else x[i] for x, i in zip(grads, (r, r, r, t))],
                             bufs)
        none = q.new_empty(0)
        return tuple(none if x is None else _as(x, like.dtype)
                     for x, like in zip(grads, (q, k, v, w)))


@pair_sums_backward.register_fake
def _(grad, q, k, v, w, wsrc, scores, crow, col, tcrow, tcol, tperm, needs, blocks):
    def like(x, flag):
        return torch.empty_like(x) if flag else x.new_empty(0)
    return like(q, needs[0]), like(k, needs[1]), like(v, needs[2]), like(w, needs[3])


def _setup(ctx, inputs, output):
    q, k, v, w, wsrc, crow, col, tcrow, tcol, tperm, _, blocks = inputs
    ctx.blocks = blocks
    ctx.save_for_backward(q, k, v, w, wsrc, output[1], crow, col, tcrow, tcol, tperm)


def _backward(ctx, grad, _grad_scores):
    q, k, v, w, wsrc, scores, crow, col, tcrow, tcol, tperm = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    out = pair_sums_backward(_as(grad, grad.dtype), q, k, v, w, wsrc, scores, crow, col, tcrow,
                             tcol, tperm, needs, ctx.blocks)
    return (*(g if n else None for g, n in zip(out, needs)),) + (None,) * 8


torch.library.register_autograd('pyg_grf::pair_sums', _backward, setup_context=_setup)


class _Permute(torch.autograd.Function):
    # rows ``perm`` of ``x`` along dim 1; the backward gathers with the inverse permutation
    # (torch's index_select backward zero-fills and scatter-adds: several times slower on the
    # CPU at 262k rows)
    @staticmethod
    def forward(ctx, x: Tensor, perm: Tensor, inv: Tensor) -> Tensor:
        ctx.save_for_backward(inv, perm)
        return x.index_select(1, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        inv, perm = ctx.saved_tensors
        return _Permute.apply(grad, inv, perm), None, None


def linear_sums(st: PairsStructures, phi_q: Tensor, phi_k: Tensor, v1: Tensor, f: Tensor,
                samples: int = 1) -> Tensor:
    r"""``[H, B n, C + 1]``: the masked sums :math:`\sum_j M_{ij}\,\phi(\mathbf{q}_i)^\top
    \phi(\mathbf{k}_j)\,[\mathbf{v}_j, 1]` (numerator, then the normaliser) of head-major
    operands ``[H, B n, m]`` (``v1``: the values with a column of ones), ``B = samples``
    copies of the graph. With walks per head the heads are already the diagonal blocks of the
    support (folded), in copy-major order."""
    H, R, _ = phi_q.shape
    if R == 0 or st.nnz == 0:  # no rows, or no mask cells: zero sums, still differentiable
        return v1.new_zeros(v1.shape) + 0 * (phi_q.sum() + phi_k.sum() + f.sum())
    N = st.num_nodes
    w_all = st.values(f)  # [coefficient rows, P']
    per_head = st.nnz * samples * 4  # bytes of one head's scores (all heads when folded)
    if st.group is not None:  # walks per head: the heads are the folded base's blocks
        if samples > 1:  # [H, B, n] -> [B, H, n]: the folded base repeated per sample
            def flat(t):
                return t.view(H, samples, -1, t.size(-1)).transpose(0, 1).reshape(
                    -1, t.size(-1))
        else:
            def flat(t):
                return t.reshape(-1, t.size(-1))
        idx = st.expand(1, samples)
        out, _ = pair_sums(flat(phi_q), flat(phi_k), flat(v1), w_all.reshape(-1), idx.wsrc,
                           idx.crow, idx.col, idx.tcrow, idx.tcol, idx.tperm,
                           per_head <= KEEP_SCORES_BYTES, 1)
        if samples > 1:
            out = out.view(samples, H, -1, out.size(-1)).transpose(0, 1)
        return out.reshape(H, R, -1)
    perm = inv = None
    if st.perm is not None:  # a locality order: operands gathered into it, sums back out of it
        perm = st.perm.long()
        if samples > 1:
            perm = (perm.view(1, -1) + torch.arange(samples, device=perm.device).view(-1, 1)
                    * N).view(-1)
        inv = torch.empty_like(perm).scatter_(0, perm, torch.arange(
            perm.numel(), device=perm.device))
        # every head at once (one gather per operand, and one for the sums)
        phi_q, phi_k, v1 = (_Permute.apply(t, perm, inv) for t in (phi_q, phi_k, v1))
    keep = H * per_head <= KEEP_SCORES_BYTES  # all heads' scores
    if samples == 1 and (st.index is None or H * per_head > CHUNK_BYTES):
        # one huge graph: the heads one after another on the base structures, in one call (no
        # per-head copy of the index, no chunks to join)
        out, _ = pair_sums(*(t.reshape(-1, t.size(-1)) for t in (phi_q, phi_k, v1)),
                           w_all.reshape(-1), st.src, st.crow, st.col, st.tcrow, st.tcol,
                           st.tperm, keep, H)
        out = out.view(H, R, -1)
        return out if perm is None else _Permute.apply(out, inv, perm)
    # every head in one call; samples of a shared graph in chunks of heads when the scores of
    # all heads would exceed CHUNK_BYTES (split, not sliced: the backward joins the chunks'
    # gradients in one copy)
    chunk = H if H * per_head <= CHUNK_BYTES else max(1, CHUNK_BYTES // per_head)
    outs = []
    parts = zip(*(t.split(chunk) if chunk < H else (t,) for t in (phi_q, phi_k, v1, w_all)))
    for q, k, v, w in parts:
        c = q.size(0)
        idx = st.expand(c, samples)  # heads h0 .. h0 + c - 1: their coefficient rows
        out, _ = pair_sums(*(t.reshape(-1, t.size(-1)) for t in (q, k, v)), w.reshape(-1),
                           idx.wsrc, idx.crow, idx.col, idx.tcrow, idx.tcol, idx.tperm, keep, 1)
        outs.append(out.view(c, R, -1))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out if perm is None else _Permute.apply(out, inv, perm)
