r"""GKAT backend ``'pairs'``: attention over the support of the kernel, the pairs
:math:`(i, j)` with :math:`|\mathcal{K}_{ij}| > t` (:class:`~.plan.KernelPairs`), written as PyG
message passing over those pairs (``edge_index`` = the support, as :class:`GATConv`'s over the
edges):

* ``mode='softmax'`` (FTFI paper, App. A.5.2: GAT with the adjacency replaced by the RWGNK
  kernel): :math:`\alpha_{ij} = \mathrm{softmax}_j(e_{ij} + \log\mathcal{K}_{ij})` with PyG's
  :func:`~torch_geometric.utils.softmax`, then :math:`\sum_j \alpha_{ij}\mathbf{v}_j`;
* ``mode='linear'`` (Sec. 4.2 on the kernel's nonzeros):
  :math:`a_{ij} = \mathcal{K}_{ij}\,\phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)` (one sampled
  product), then :math:`\sum_j a_{ij}[\mathbf{v}_j, 1]` for numerator and normaliser.

The aggregation is :meth:`KernelSupportAttention.message_and_aggregate`: one block-diagonal CSR
product over all heads (:func:`pyg_grf.ops.head_spmm`) instead of PyG's gather-scatter of
``[P, H, C]`` messages, which the hand-written product beats by 7.6x on PubMed's 527k pairs, 8
heads x 8, forward and backward, one thread (57 ms against 435 ms; ``bench/bench_gkat.py``).
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.utils import softmax

from pyg_grf.ops import head_major, head_spmm, sddmm


class KernelSupportAttention(MessagePassing):
    r"""Aggregation :math:`\mathbf{o}_i = \sum_j \alpha_{ij}^{(h)} \mathbf{v}_j^{(h)}` over the
    kernel pairs, per head (PyG message passing: ``message`` is the plain gather, and
    ``message_and_aggregate`` the fused CSR product that runs whenever ``edge_index`` is the
    pairs' :class:`~torch_geometric.EdgeIndex`)."""
    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(self):
        super().__init__(aggr='sum', node_dim=0)

    def forward(self, v: Tensor, alpha: Tensor, edge_index, pairs) -> Tensor:
        return self.propagate(edge_index, v=v, alpha=alpha, pairs=pairs)

    def message(self, v_j: Tensor, alpha: Tensor) -> Tensor:  # [P, H, C]
        return v_j * alpha.unsqueeze(-1)

    def message_and_aggregate(self, edge_index, v: Tensor, alpha: Tensor, pairs) -> Tensor:
        return head_spmm(pairs.pattern, alpha.t(), v)


_AGGREGATE = KernelSupportAttention()


def edge_index(pairs, num_nodes: int) -> EdgeIndex:
    r"""The pairs as PyG's ``edge_index`` (source = key :math:`j`, target = query :math:`i`),
    sorted by target, as PyG's fused path expects."""
    index = pairs.index.long()
    return EdgeIndex(torch.stack([index[1], index[0]]), sparse_size=(num_nodes, num_nodes),
                     sort_order='col')


def softmax_forward(pairs, logits: Tensor, v: Tensor, kernel_weighting: bool,
                    dropout: float, training: bool) -> Tensor:
    r"""``mode='softmax'``: ``logits`` ``[P, H]`` of the pairs, ``v`` ``[N, H, C]``."""
    N = v.size(0)
    dst = pairs.pattern.row
    if kernel_weighting:  # exp(e_ij + log K_ij) = K_ij exp(e_ij)
        logits = logits + torch.log(pairs.value.to(logits.dtype)).unsqueeze(-1)
    alpha = softmax(logits, dst, num_nodes=N)
    alpha = torch.nn.functional.dropout(alpha, p=dropout, training=training)
    return _AGGREGATE(v, alpha, edge_index(pairs, N), pairs)


def linear_forward(pairs, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float) -> Tensor:
    r"""``mode='linear'`` on the pairs: ``[N, H, C]`` outputs."""
    N, H, _ = phi_q.shape
    pat = pairs.pattern.repeat(H)
    a = sddmm(pat, head_major(phi_q), head_major(phi_k))  # phi(q_i)^T phi(k_j), [H * P]
    a = a * pairs.pattern.repeat_values(pairs.value.to(a.dtype).expand(H, -1))
    v1 = torch.cat([v, v.new_ones(N, H, 1)], dim=-1)
    o = _AGGREGATE(v1, a.view(H, -1).t(), edge_index(pairs, N), pairs)
    return o[..., :-1] / (o[..., -1:] + eps)

