r"""GKAT backend ``'pairs'``: attention over the support of the kernel, the pairs
:math:`(i, j)` with :math:`|\mathcal{K}_{ij}| > t` (:class:`~.plan.KernelPairs`), as PyG message
passing over those pairs (``edge_index`` = the support, as :class:`GATConv`'s over the edges):
the softmax of :math:`e_{ij} + \log\mathcal{K}_{ij}` (FTFI paper, App. A.5.2) or the linear
:math:`\mathcal{K}_{ij}\,\phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)` (Sec. 4.2). The products
run per head on the one CSR of the pairs (:func:`head_spmm`, :func:`head_sddmm`), never a
block-diagonal repeat of the pattern, each into a zeroed output with ``out=`` (torch's
``csr @ x`` computes into a temporary and copies it, ``sampled_addmm`` without ``out=`` copies
its whole input first).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing

from pyg_grf.ops import compute_dtype


def _spmm_heads(pattern, w: Tensor, x: Tensor, transpose: bool = False) -> Tensor:
    # [H, R, D]: A_h x[h] (or A_h^T x[h]) for head-major values w [H, P] and x [H, S, D], into
    # zeroed outputs (addmm's beta=0 still multiplies them: NaN in, NaN out)
    out = x.new_empty(x.size(0), pattern.size[1 if transpose else 0], x.size(-1))
    for h in range(w.size(0)):
        torch.addmm(out[h].zero_(), pattern.to_csr(w[h], transpose), x[h], beta=0.0,
                    out=out[h])
    return out


def _sddmm_heads(pattern, a: Tensor, b: Tensor) -> Tensor:
    # [H, P]: <a[h]_i, b[h]_j> at the pairs, written into the values of a holder on the pattern
    out = a.new_empty(a.size(0), pattern.nnz)
    for h in range(a.size(0)):
        holder = pattern.to_csr(out[h].zero_())
        torch.sparse.sampled_addmm(holder, a[h], b[h].t(), beta=0.0, out=holder)
        values = holder.values()
        if values.data_ptr() != out[h].data_ptr():
            out[h].copy_(values)
    return out


class _HeadProduct(torch.autograd.Function):
    # per head on the pairs, head-major: out[h] = A_h b[h] with the values a [H, P] of A_h
    # (b [H, N, D]), or, ``sampled``, out[h] = <a[h]_i, b[h]_j> ([H, P], a and b [H, N, m])
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, pattern, sampled: bool) -> Tensor:
        ctx.pattern, ctx.sampled = pattern, sampled
        ctx.save_for_backward(a, b)
        return _sddmm_heads(pattern, a, b) if sampled else _spmm_heads(pattern, a, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        pattern, grad = ctx.pattern, grad.contiguous()
        need_a, need_b = ctx.needs_input_grad[:2]
        if ctx.sampled:  # G the gradient on the pairs: G b and G^T a
            g_a = _spmm_heads(pattern, grad, b) if need_a else None
            g_b = _spmm_heads(pattern, grad, a, transpose=True) if need_b else None
        else:  # dL/dA_ij = <g_i, b_j>, and A^T g
            g_a = _sddmm_heads(pattern, grad, b) if need_a else None
            g_b = _spmm_heads(pattern, a, grad, transpose=True) if need_b else None
        return g_a, g_b, None, None


def head_spmm(pattern, w: Tensor, x: Tensor) -> Tensor:
    r"""Per-head products :math:`\mathbf{o}^{(h)}_i = \sum_j w^{(h)}_{ij}\mathbf{x}^{(h)}_j`
    over the one ``pattern`` (:class:`~pyg_grf.ops.SparsePattern` in row-major order, as
    :class:`~.plan.KernelPairs` keeps it), head-major: ``w`` ``[H, P]``, ``x`` ``[H, N, D]``,
    result ``[H, N, D]``; differentiable in ``w`` and ``x``."""
    dt = compute_dtype(x)
    if pattern.nnz == 0:
        return x.new_zeros(x.size(0), pattern.size[0], x.size(2)) + 0 * (w.sum() + x.sum())
    with torch.autocast(x.device.type, enabled=False):
        out = _HeadProduct.apply(w.to(dt).contiguous(), x.to(dt).contiguous(), pattern, False)
    return out.to(x.dtype)


def head_sddmm(pattern, a: Tensor, b: Tensor) -> Tensor:
    r"""Per-head sampled products :math:`\langle\mathbf{a}^{(h)}_i, \mathbf{b}^{(h)}_j\rangle`
    at the pairs of ``pattern``, head-major: ``a``, ``b`` ``[H, N, m]``, result ``[H, P]``."""
    dt = compute_dtype(a)
    if pattern.nnz == 0:
        return a.new_zeros(a.size(0), 0) + 0 * (a.sum() + b.sum())
    with torch.autocast(a.device.type, enabled=False):
        out = _HeadProduct.apply(a.to(dt).contiguous(), b.to(dt).contiguous(), pattern, True)
    return out.to(a.dtype)


def head_major(t: Tensor) -> Tensor:
    r"""``[N, H, ...]`` to a contiguous ``[H, N, ...]``."""
    return t.transpose(0, 1).contiguous()


class KernelSupportAttention(MessagePassing):
    r"""Aggregation :math:`\mathbf{o}_i = \sum_j \alpha_{ij}^{(h)} \mathbf{v}_j^{(h)}` over the
    kernel pairs, per head (PyG message passing: ``message`` is the plain gather, and
    ``message_and_aggregate`` the fused per-head CSR product :func:`head_spmm` that runs whenever
    ``edge_index`` is the pairs' :class:`~torch_geometric.EdgeIndex`). ``v`` ``[N, H, D]``,
    ``alpha`` head-major ``[H, P]``."""
    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(self):
        super().__init__(aggr='sum', node_dim=0)

    def forward(self, v: Tensor, alpha: Tensor, edge_index, pairs) -> Tensor:
        return self.propagate(edge_index, v=v, alpha=alpha, pairs=pairs)

    def message(self, v_j: Tensor, alpha: Tensor) -> Tensor:  # [P, H, D]
        return v_j * alpha.t().unsqueeze(-1)

    def message_and_aggregate(self, edge_index, v: Tensor, alpha: Tensor, pairs) -> Tensor:
        return head_spmm(pairs.pattern, alpha, head_major(v)).transpose(0, 1)


_AGGREGATE = KernelSupportAttention()


def edge_index(pairs, num_nodes: int) -> EdgeIndex:
    r"""The pairs as PyG's ``edge_index`` (source = key :math:`j`, target = query :math:`i`),
    sorted by target, as PyG's fused path expects."""
    index = pairs.index.long()
    return EdgeIndex(torch.stack([index[1], index[0]]), sparse_size=(num_nodes, num_nodes),
                     sort_order='col')


def logits(pairs, score: str, q, k, v: Tensor, att_src, att_dst,
           negative_slope: float) -> Tensor:
    r"""Head-major logits ``[H, P]`` of the pairs: ``score='gat'``,
    :math:`\mathrm{LeakyReLU}(\mathbf{a}_{dst}^\top\mathbf{v}_i +
    \mathbf{a}_{src}^\top\mathbf{v}_j)` (two gathers of ``[H, N]`` scores), or ``'dot'``,
    :math:`\mathbf{q}_i^\top\mathbf{k}_j / \sqrt{C}` (one sampled product per head)."""
    dst, src = pairs.pattern.row, pairs.pattern.col
    if score == 'gat':
        a_src = (v * att_src).sum(-1).t()                      # [H, N]
        a_dst = (v * att_dst).sum(-1).t()
        e = a_dst.index_select(1, dst) + a_src.index_select(1, src)
        return torch.nn.functional.leaky_relu(e, negative_slope)
    return head_sddmm(pairs.pattern, head_major(q), head_major(k)) / math.sqrt(v.size(-1))


def softmax_forward(pairs, logits: Tensor, v: Tensor, kernel_weighting: bool,
                    dropout: float, training: bool) -> Tensor:
    r"""``mode='softmax'``: head-major ``logits`` ``[H, P]`` of the pairs, ``v`` ``[N, H, C]``.

    The normaliser rides in the product: with :math:`w_{ij} = \mathcal{K}_{ij}
    \exp(e_{ij} - \mu_i)` and any row constant :math:`\mu_i` (the row maximum, for range,
    taken without gradient: the softmax does not depend on it),
    :math:`\mathbf{o}_i = \sum_j w_{ij}\mathbf{v}_j / \sum_j w_{ij}`, so one product with
    :math:`[\mathbf{v}_j, 1]` gives numerator and normaliser (no per-pair division)."""
    N, H, C = v.shape
    dst = pairs.pattern.row
    if kernel_weighting:  # K_ij exp(e_ij) = exp(e_ij + log K_ij)
        logits = logits + torch.log(pairs.value.to(logits.dtype))
    with torch.no_grad():  # mu_i = max_j: no overflow in exp
        top = logits.new_full((H, N), float('-inf')).scatter_reduce_(
            1, dst.view(1, -1).expand(H, -1), logits, 'amax', include_self=True)
    w = torch.exp(logits - top.index_select(1, dst))                  # [H, P]
    ones = v.new_ones(N, H, 1)
    if dropout > 0 and training:  # drop coefficients of the numerator only, as GAT does
        keep = torch.nn.functional.dropout(torch.ones_like(w), p=dropout, training=True)
        num = _AGGREGATE(v, w * keep, edge_index(pairs, N), pairs)
        den = _AGGREGATE(ones, w, edge_index(pairs, N), pairs)
    else:
        o = _AGGREGATE(torch.cat([v, ones], dim=-1), w, edge_index(pairs, N), pairs)
        num, den = o[..., :-1], o[..., -1:]
    return num / den.masked_fill(den == 0, 1.0)  # a row without pairs: zeros, as PyG's


def linear_forward(pairs, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float) -> Tensor:
    r"""``mode='linear'`` on the pairs: ``[N, H, C]`` outputs."""
    N, H, _ = phi_q.shape
    a = head_sddmm(pairs.pattern, head_major(phi_q), head_major(phi_k))  # [H, P]
    a = a * pairs.value.to(a.dtype)
    v1 = torch.cat([v, v.new_ones(N, H, 1)], dim=-1)
    o = _AGGREGATE(v1, a, edge_index(pairs, N), pairs)
    return o[..., :-1] / (o[..., -1:] + eps)
