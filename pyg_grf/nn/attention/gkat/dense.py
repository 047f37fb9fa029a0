r"""GKAT backend ``'dense'``: the mask :math:`\mathcal{K} = \Psi\Psi^\top` formed per graph as
dense blocks, padded to the largest graph of the batch, ``[B, H, n, n]`` (GKAT-0 of the FTFI
paper, Sec. 5.3, the brute-force reference; :math:`O(\sum_g n_g^2)`, never over the whole
batch). Both modes: the softmax over the support (weighted by :math:`\mathcal{K}`) and the
linear kernel :math:`\mathcal{K}_{ij}\phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)`."""
from __future__ import annotations

import math

import torch
from torch import Tensor


def _blocks(plan, index: Tensor, value: Tensor, dtype) -> Tensor:
    # the entries (index [2, nnz] global, value [nnz]) per graph, [B, n, n] (local indices)
    index, ptr = index.long(), plan.ptr.long()
    graph = torch.bucketize(index[0], ptr[1:], right=True)
    local = index - ptr[graph]
    n = plan.max_graph_nodes
    out = torch.zeros(plan.num_graphs, n, n, dtype=dtype, device=index.device)
    return out.index_put_((graph, local[0], local[1]), value.to(dtype), accumulate=True)


def to_blocks(plan, t: Tensor) -> tuple:
    r"""``[N, ...]`` rows to ``[B, n, ...]`` padded blocks, with the graph and position of every
    row."""
    B, n = plan.num_graphs, plan.max_graph_nodes
    ptr = plan.ptr.long()
    graph = torch.repeat_interleave(torch.arange(B, device=t.device), ptr.diff(),
                                    output_size=t.size(0))
    pos = torch.arange(t.size(0), device=t.device) - ptr[graph]
    out = t.new_zeros((B, n) + t.shape[1:])
    out[graph, pos] = t
    return out, graph, pos


def kernel(plan, dtype, threshold: float) -> tuple:
    r"""``(K [B, n, n], support [B, n, n])`` per graph: :math:`\Psi\Psi^\top`, or the kernel
    pairs stored by the transform when the plan has them (they are the mask then)."""
    if plan.stored_pairs is None:
        psi = _blocks(plan, plan.psi_index, plan.psi_value, dtype)
        K = psi @ psi.transpose(1, 2)
    else:
        K = _blocks(plan, *plan.stored_pairs, dtype)
    ptr = plan.ptr.long()
    real = torch.arange(K.size(-1), device=K.device).view(1, -1) < ptr.diff().view(-1, 1)
    support = (K.abs() > threshold) & real.unsqueeze(-1) & real.unsqueeze(-2)
    return K, support


def softmax_forward(plan, logits: Tensor, v: Tensor, threshold: float, kernel_weighting: bool,
                    dropout: float, training: bool) -> Tensor:
    r"""``logits`` ``[B, H, n, n]`` (per graph), ``v`` ``[N, H, C]``: ``[N, H, C]`` outputs."""
    K, support = kernel(plan, logits.dtype, threshold)
    K, support = K.unsqueeze(1), support.unsqueeze(1)
    if kernel_weighting:
        logits = logits + torch.log(torch.where(support, K, torch.ones_like(K)))
    logits = logits.masked_fill(~support, float('-inf'))
    alpha = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # padded rows: no support
    alpha = torch.nn.functional.dropout(alpha, p=dropout, training=training)
    vb, graph, pos = to_blocks(plan, v)                    # [B, n, H, C]
    out = torch.einsum('bhij,bjhc->bihc', alpha, vb)
    return out[graph, pos]


def linear_forward(plan, phi_q: Tensor, phi_k: Tensor, v: Tensor, threshold: float,
                   eps: float) -> Tensor:
    K, support = kernel(plan, v.dtype, threshold)
    M = (K * support).unsqueeze(1)                              # [B, 1, n, n]
    qb, graph, pos = to_blocks(plan, phi_q)
    kb = to_blocks(plan, phi_k)[0]
    vb = to_blocks(plan, v)[0]
    a = M * torch.einsum('bihm,bjhm->bhij', qb, kb)
    num = torch.einsum('bhij,bjhc->bihc', a, vb)
    den = a.sum(-1).transpose(1, 2).unsqueeze(-1)               # [B, n, H, 1]
    return (num / (den + eps))[graph, pos]


def logits(layer, q, k, v: Tensor, plan) -> Tensor:
    r"""Per-graph logits ``[B, H, n, n]`` of the layer's score (``q``, ``k``, ``v``
    ``[N, H, C]``; ``q``, ``k`` only for ``score='dot'``)."""
    if layer.score == 'gat':
        a_src = (v * layer.att_src).sum(-1)               # [N, H]
        a_dst = (v * layer.att_dst).sum(-1)
        s, d = to_blocks(plan, a_src)[0], to_blocks(plan, a_dst)[0]  # [B, n, H]
        e = d.permute(0, 2, 1).unsqueeze(-1) + s.permute(0, 2, 1).unsqueeze(-2)
        return torch.nn.functional.leaky_relu(e, layer.negative_slope)
    C = v.size(-1)
    q, k = to_blocks(plan, q)[0], to_blocks(plan, k)[0]
    return torch.einsum('bihc,bjhc->bhij', q, k) / math.sqrt(C)
