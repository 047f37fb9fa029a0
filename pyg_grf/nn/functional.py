r"""Pure functions of the attention layers: :func:`masked_linear_attention`, the one primitive
behind every masked linear-cost attention (FTFI paper, Sec. 2, Algorithm 1; GRF paper, Eq. 6-7),
and its packed, low-rank and pair-softmax variants."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing

from pyg_grf.masks.base import MaskOperator
from pyg_grf.masks.packing import PackingLayout, packing_layout
from pyg_grf.ops import SparsePattern, head_major, head_spmm, sddmm, spmm


def masked_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor,
                            mask: Optional[MaskOperator] = None, eps: float = 1e-6) -> Tensor:
    r"""Masked low-rank (linear) attention: for a mask :math:`M` with a fast product :math:`MX`,

    .. math::
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \sum_j M_{ij}\,\phi(\mathbf{k}_j)
        \mathbf{v}_j^\top}{\phi(\mathbf{q}_i)^\top \sum_j M_{ij}\,\phi(\mathbf{k}_j)}.

    With :math:`X_j = [\phi(\mathbf{k}_j)\otimes\mathbf{v}_j,\ \phi(\mathbf{k}_j)]` both sums
    are the rows of :math:`MX`: one mask product on an :math:`N \times (md + m)` matrix.

    Args:
        phi_q, phi_k (Tensor): ``[N, H, m]`` query and key features, or ``[B, N, H, m]``:
            ``B`` samples on the same ``N`` nodes, all masked by the one ``mask`` in one
            product (the samples ride along in the columns).
        v (Tensor): ``[N, H, d]`` (``[B, N, H, d]``) values.
        mask (MaskOperator, optional): the mask :math:`M` (shared or one per head). :obj:`None`
            means all pairs attend (use :class:`~pyg_grf.masks.PackingMask` for per-graph
            attention in a PyG batch).
        eps (float): added to the normaliser, which must then be positive (default: ``1e-6``).

    Returns:
        Tensor ``[N, H, d]`` (``[B, N, H, d]``).
    """
    shared = phi_q.dim() == 4
    if phi_q.shape != phi_k.shape:
        raise ValueError(f"phi_q and phi_k must have the same shape, got "
                         f"{tuple(phi_q.shape)} and {tuple(phi_k.shape)}")
    if phi_q.dim() not in (3, 4) or v.dim() != phi_q.dim() or v.shape[:-1] != phi_k.shape[:-1]:
        raise ValueError(f"expected phi_q, phi_k [N, H, m] and v [N, H, d] (or [B, N, H, .] "
                         f"for samples on one shared mask) with the same (B,) N, H, got "
                         f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)}, {tuple(v.shape)}")
    if not shared:  # one sample: the same computation with B = 1
        phi_q, phi_k, v = phi_q.unsqueeze(0), phi_k.unsqueeze(0), v.unsqueeze(0)
    B, N, H, m = phi_k.shape
    d = v.size(-1)
    # X_j = [phi(k_j) (x) v_j, phi(k_j)] per sample, the samples side by side in the columns
    kv = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).reshape(B, N, H, m * d)
    x = torch.cat([kv, phi_k], dim=-1).permute(1, 2, 0, 3)              # [N, H, B, md + m]
    # Masked sums: rows of M X, one product for every sample (and every head of a shared mask).
    if mask is None:
        mx = x.sum(0, keepdim=True).expand(N, -1, -1, -1)
    else:
        if mask.num_nodes != N:
            raise ValueError(f"the mask covers {mask.num_nodes} nodes but the inputs have {N} rows")
        w = m * d + m  # explicit sizes: N may be 0
        if mask.num_heads is None:
            mx = mask.matmul(x.reshape(N, H * B * w)).view(N, H, B, w)
        else:
            mx = mask.matmul(x.reshape(N, H, B * w)).view(N, H, B, w)
    mkv, mk = mx.permute(2, 0, 1, 3).split([m * d, m], dim=-1)       # [B, N, H, .]
    num = torch.einsum('bnhm,bnhmd->bnhd', phi_q, mkv.reshape(B, N, H, m, d))
    den = torch.einsum('bnhm,bnhm->bnh', phi_q, mk)
    out = num / (den.unsqueeze(-1) + eps)
    return out if shared else out.squeeze(0)


def normalize_sums(o: Tensor, eps: float = 1e-6, dtype: Optional[torch.dtype] = None) -> Tensor:
    r"""Output of linear attention from its sums ``[..., d + 1]`` (numerator, then the
    normaliser): ``o[..., :d] / (o[..., d] + eps)``, in ``dtype`` if given (the sums of half
    operands are float32: a half normaliser's gradient overflows where a row's features
    vanish)."""
    num, den = o.split([o.size(-1) - 1, 1], dim=-1)
    out = num / (den + eps)
    return out if dtype is None or out.dtype == dtype else out.to(dtype)


def packed_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor,
                            batch: Optional[Tensor] = None, eps: float = 1e-6,
                            return_sums: bool = False,
                            layout: Optional[PackingLayout] = None) -> Tensor:
    r"""Unmasked linear attention inside each graph of a batch (the packing mask
    :math:`M_{ij} = 1` iff :math:`g(i) = g(j)`), by batched dense products on padded per-graph
    blocks:

    .. math::
        \mathbf{S}_g = \sum_{j \in g} \phi(\mathbf{k}_j)\,[\mathbf{v}_j, 1]^\top, \qquad
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \mathbf{S}_{g(i)}[:, :d]}
                            {\phi(\mathbf{q}_i)^\top \mathbf{S}_{g(i)}[:, d] + \epsilon}.

    The result of :func:`masked_linear_attention` with a :class:`~pyg_grf.masks.PackingMask`
    without its ``[N, H, m d]`` outer products: :math:`O(N H m d)` time in two batched products
    per bucket of :func:`~pyg_grf.masks.packing.packing_layout`, :math:`O(N H (m + d))` memory.

    Args:
        phi_q, phi_k (Tensor): ``[N, H, m]`` query and key features.
        v (Tensor): ``[N, H, d]`` values.
        batch (Tensor, optional): ``[N]`` graph ids, sorted or not; :obj:`None`: one graph.
        eps (float): added to the normaliser (default: ``1e-6``).
        return_sums (bool): return the sums ``[N, H, d + 1]`` (numerator, then the normaliser;
            see :func:`normalize_sums`) instead of the output.
        layout (PackingLayout, optional): the layout of ``batch``, if already known.
    """
    if phi_q.dim() != 3 or phi_k.shape != phi_q.shape or v.dim() != 3 or \
            v.shape[:2] != phi_q.shape[:2]:
        raise ValueError(f"expected phi_q, phi_k [N, H, m] (the same shape) and v [N, H, d] with "
                         f"their N and H, got {tuple(phi_q.shape)}, {tuple(phi_k.shape)}, "
                         f"{tuple(v.shape)}")
    N, H, _ = phi_q.shape
    if layout is None:
        if batch is None:
            layout = PackingLayout(torch.arange(N, device=phi_q.device),
                                   ((0, 1, N),) if N > 0 else (), N)
        else:
            if batch.shape != (N,):
                raise ValueError(f"'batch' must have shape [{N}] (one graph id per row of "
                                 f"phi_q), got {tuple(batch.shape)}")
            layout = packing_layout(batch)
    elif layout.pos.shape != (N,):
        raise ValueError(f"the layout places {layout.pos.numel()} nodes but the inputs have {N} "
                         f"rows")
    v1 = torch.cat([v, v.new_ones(N, H, 1)], dim=-1)

    def pad(t: Tensor) -> Tensor:  # [N, H, C] -> [R, H, C], zero rows in the padding
        return t.new_zeros(layout.num_rows, H, t.size(-1)).index_copy(0, layout.pos, t)

    Q, K, V = pad(phi_q), pad(phi_k), pad(v1)
    outs = []
    for off, B, n in layout.buckets:  # a few size buckets, never one step per graph
        # rows [off, off + B n) of the buffer -> [B, H, n, C] blocks
        q, k, v1 = (t[off:off + B * n].view(B, n, H, -1).transpose(1, 2) for t in (Q, K, V))
        S = k.transpose(-1, -2) @ v1                                    # [B, H, m, d + 1]
        outs.append((q @ S).transpose(1, 2).reshape(B * n, H, -1))
    if not outs:  # no rows
        o = V.new_zeros(0, H, V.size(-1))
    else:  # back to the nodes (index_select: its backward is an index_add)
        o = (outs[0] if len(outs) == 1 else torch.cat(outs)).index_select(0, layout.pos)
    return o if return_sums else normalize_sums(o, eps)


class PairAggregation(MessagePassing):
    r"""Aggregation :math:`\mathbf{o}_i = \sum_j w_{ij}^{(h)} \mathbf{v}_j^{(h)}` over the pairs
    of a row-major :class:`~pyg_grf.ops.SparsePattern`, per head, as PyG message passing
    (``edge_index`` = the pairs, as :class:`GATConv`'s over the edges): ``message`` is the
    plain gather, ``message_and_aggregate`` the fused CSR product of all heads
    (:func:`~pyg_grf.ops.head_spmm`) that runs whenever ``edge_index`` is the pairs'
    :class:`~torch_geometric.EdgeIndex`. ``v`` ``[N, H, D]``, ``w`` head-major ``[H, P]``."""
    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(self):
        super().__init__(aggr='sum', node_dim=0)

    def forward(self, v: Tensor, w: Tensor, pattern: SparsePattern) -> Tensor:
        # source = key j, target = query i, sorted by target as PyG's fused path expects
        edge_index = EdgeIndex(torch.stack([pattern.col, pattern.row]),
                               sparse_size=pattern.size, sort_order='col')
        return self.propagate(edge_index, v=v, w=w, pattern=pattern)

    def message(self, v_j: Tensor, w: Tensor) -> Tensor:  # [P, H, D]
        return v_j * w.t().unsqueeze(-1)

    def message_and_aggregate(self, edge_index, v: Tensor, w: Tensor,
                              pattern: SparsePattern) -> Tensor:
        return head_spmm(pattern, w, v)


_AGGREGATE = PairAggregation()


def pair_scores(pattern: SparsePattern, q: Tensor, k: Tensor) -> Tensor:
    r"""Head-major scores ``[H, P]`` :math:`\mathbf{q}_i^\top\mathbf{k}_j / \sqrt{C}` of the
    pairs of ``pattern`` for ``q``, ``k`` ``[N, H, C]``: one sampled product for all heads."""
    N, H, C = q.shape
    return sddmm(pattern.repeat(H), head_major(q), head_major(k)).view(H, -1) * C ** -0.5


def pair_softmax_attention(pattern: SparsePattern, logits: Tensor, v: Tensor,
                           weight: Optional[Tensor] = None, dropout: float = 0.0,
                           training: bool = False) -> Tensor:
    r"""Softmax attention on the pairs of a row-major ``pattern`` (``[N, N]``, built from
    sorted pairs), weighted: :math:`a_{ij} = w_{ij} e^{s_{ij}} / \sum_{j'} w_{ij'} e^{s_{ij'}}`
    (GRF paper, App. D; GKAT, FTFI paper App. A.5.2, with :math:`w = \mathcal{K}`);
    :math:`O(P\cdot C)`, every head in one product (:class:`PairAggregation`).

    The normaliser rides in the product: with :math:`u_{ij} = w_{ij} \exp(s_{ij} - \mu_i)`
    and any row constant :math:`\mu_i` (the row maximum, for range, taken without gradient:
    the softmax does not depend on it), :math:`\mathbf{o}_i = \sum_j u_{ij}\mathbf{v}_j /
    \sum_j u_{ij}`, so one product with :math:`[\mathbf{v}_j, 1]` gives numerator and
    normaliser. A row whose weights all vanish gives zeros, as PyG's softmax does.

    Args:
        logits (Tensor): head-major ``[H, P]`` scores :math:`s_{ij}` (overwritten).
        v (Tensor): ``[N, H, C]`` values.
        weight (Tensor, optional): ``[H, P]`` or ``[P]`` (shared) weights :math:`w_{ij}`, of
            any sign; :obj:`None`: plain softmax.
        dropout (float): dropout on the coefficients (the numerator's, as GAT does).
    """
    if pattern.perm is not None:
        raise ValueError("pair_softmax_attention needs a row-major pattern (built from pairs "
                         "sorted by row, then column)")
    N, H, C = v.shape
    dst = pattern.row
    # in place on the fresh [H, P] logits (no operator here saves its input for the backward)
    with torch.no_grad():  # mu_i = max_j: no overflow in exp
        top = logits.new_full((H, N), float('-inf')).scatter_reduce_(
            1, dst.view(1, -1).expand(H, -1), logits, 'amax', include_self=True)
    w = logits.sub_(top.index_select(1, dst)).exp_()                  # [H, P]
    if weight is not None:
        w = w * weight.to(w.dtype)
    ones = v.new_ones(N, H, 1)
    if dropout > 0 and training:  # drop coefficients of the numerator only
        keep = torch.nn.functional.dropout(torch.ones_like(w), p=dropout, training=True)
        num, den = _AGGREGATE(v, w * keep, pattern), _AGGREGATE(ones, w, pattern)
    else:
        o = _AGGREGATE(torch.cat([v, ones], dim=-1), w, pattern)
        num, den = o[..., :-1], o[..., -1:]
    return num / den.masked_fill(den == 0, 1.0)


def low_rank_masked_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor,
                                     pattern: SparsePattern, values: Tensor,
                                     key_pattern: Optional[SparsePattern] = None,
                                     key_values: Optional[Tensor] = None) -> Tensor:
    r"""The sums ``[N, H, d + 1]`` (numerator, then the normaliser: :func:`normalize_sums`) of
    :func:`masked_linear_attention` for a per-head GRF mask
    :math:`M = \widehat\Phi_Q\widehat\Phi_K^\top` (or :math:`M = \widehat\Phi_Q` when no key
    side is given) without forming :math:`M`: two (one) block-diagonal CSR products over the
    head-major ``[H N, m (d + 1)]`` tensor :math:`\phi(\mathbf{k}_j) \otimes [\mathbf{v}_j, 1]`.

    Args:
        pattern, values: :math:`\widehat\Phi_Q` (``[N, N]`` pattern, ``[H, nnz]`` values).
        key_pattern, key_values: :math:`\widehat\Phi_K` (omit both for the asymmetric mask).
    """
    N, H, m = phi_q.shape
    d = v.size(-1)
    v1 = torch.cat([v, v.new_ones(N, H, 1)], dim=-1).transpose(0, 1)  # [H, N, d + 1]
    x = (phi_k.transpose(0, 1).unsqueeze(-1) * v1.unsqueeze(-2)).reshape(H * N, m * (d + 1))
    if key_pattern is not None:
        x = spmm(key_pattern.repeat(H), key_pattern.repeat_values(key_values), x, transpose=True)
    y = spmm(pattern.repeat(H), pattern.repeat_values(values), x).view(H, N, m, d + 1)
    # contracted with phi(q_i) by a product and a sum: batched [1, m] x [m, d + 1] matrix
    # products, and their outer-product gradient, run 1.5-2x slower on the CPU
    return (phi_q.transpose(0, 1).unsqueeze(-1) * y).sum(-2).transpose(0, 1)
