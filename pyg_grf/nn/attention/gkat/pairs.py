r"""GKAT's softmax mode: attention over the support of the kernel, the pairs :math:`(i, j)` with
:math:`|\mathcal{K}_{ij}| > t` (:class:`~.plan.KernelPairs`), as PyG message passing over those
pairs (``edge_index`` = the support, as :class:`GATConv`'s over the edges): the softmax of
:math:`e_{ij} + \log\mathcal{K}_{ij}` (FTFI paper, App. A.5.2). Every head runs in one CSR
product over the block-diagonal repeat of the pairs' pattern (:func:`pyg_grf.ops.head_spmm`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing

from pyg_grf.ops import head_major, head_spmm, sddmm


class KernelSupportAttention(MessagePassing):
    r"""Aggregation :math:`\mathbf{o}_i = \sum_j \alpha_{ij}^{(h)} \mathbf{v}_j^{(h)}` over the
    kernel pairs, per head (PyG message passing: ``message`` is the plain gather, and
    ``message_and_aggregate`` the fused CSR product of all heads, :func:`~pyg_grf.ops.head_spmm`,
    that runs whenever
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
        return head_spmm(pairs.pattern, alpha, v)


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
    H = q.size(1)  # the pairs are row-major: the repeat's order is [H, P]
    return sddmm(pairs.pattern.repeat(H), head_major(q), head_major(k)).view(H, -1) \
        / math.sqrt(v.size(-1))


def softmax_forward(pairs, logits: Tensor, v: Tensor, kernel_weighting: bool,
                    dropout: float, training: bool) -> Tensor:
    r"""``mode='softmax'``: head-major ``logits`` ``[H, P]`` of the pairs (overwritten),
    ``v`` ``[N, H, C]``.

    The normaliser rides in the product: with :math:`w_{ij} = \mathcal{K}_{ij}
    \exp(e_{ij} - \mu_i)` and any row constant :math:`\mu_i` (the row maximum, for range,
    taken without gradient: the softmax does not depend on it),
    :math:`\mathbf{o}_i = \sum_j w_{ij}\mathbf{v}_j / \sum_j w_{ij}`, so one product with
    :math:`[\mathbf{v}_j, 1]` gives numerator and normaliser (no per-pair division)."""
    N, H, C = v.shape
    dst = pairs.pattern.row
    # in place on the fresh [H, P] logits (no operator here saves its input for the backward):
    # one buffer instead of four
    if kernel_weighting:  # K_ij exp(e_ij) = exp(e_ij + log K_ij)
        logits = logits.add_(torch.log(pairs.value.to(logits.dtype)))
    with torch.no_grad():  # mu_i = max_j: no overflow in exp
        top = logits.new_full((H, N), float('-inf')).scatter_reduce_(
            1, dst.view(1, -1).expand(H, -1), logits, 'amax', include_self=True)
    w = logits.sub_(top.index_select(1, dst)).exp_()                  # [H, P]
    ones = v.new_ones(N, H, 1)
    if dropout > 0 and training:  # drop coefficients of the numerator only, as GAT does
        keep = torch.nn.functional.dropout(torch.ones_like(w), p=dropout, training=True)
        num = _AGGREGATE(v, w * keep, edge_index(pairs, N), pairs)
        den = _AGGREGATE(ones, w, edge_index(pairs, N), pairs)
    else:
        o = _AGGREGATE(torch.cat([v, ones], dim=-1), w, edge_index(pairs, N), pairs)
        num, den = o[..., :-1], o[..., -1:]
    return num / den.masked_fill(den == 0, 1.0)  # a row without pairs: zeros, as PyG's
