r"""Reference and baseline attentions for PyG mini-batches: unmasked linear attention per graph,
the exact power-series-masked linear attention (the exact counterpart of
:class:`~pyg_grf.nn.GRFAttention`'s random-feature mask), and dense softmax attention per graph."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from pyg_grf._validation import batch_or_zeros, check_sorted_batch
from pyg_grf.features.grf import normalized_adjacency, self_convolution
from pyg_grf.memory import check_walk_memory
from pyg_grf.nn.attention.base import QKVAttention, reset_hop_coefficients, samples_as_graphs
from pyg_grf.nn.feature_maps import qk_features
from pyg_grf.nn.functional import packed_linear_attention
from pyg_grf.ops import SparsePattern, spmm


class LinearAttention(QKVAttention):
    r"""Unmasked linear attention inside each graph of a batch (the packing mask of the `"From
    block-Toeplitz matrices to differential equations on graphs: towards a general theory for
    scalable masked Transformers" <https://arxiv.org/abs/2107.07999>`_ paper, Sec. 3.1), per head:

    .. math::
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \mathbf{S}_{g(i)}}
            {\phi(\mathbf{q}_i)^\top \mathbf{z}_{g(i)} + \epsilon}, \qquad
        \mathbf{S}_g = \sum_{j \in g} \phi(\mathbf{k}_j)\mathbf{v}_j^\top, \quad
        \mathbf{z}_g = \sum_{j \in g} \phi(\mathbf{k}_j),

    with :math:`g(i)` the graph of node :math:`i`, in :math:`O(N)`
    (:func:`~pyg_grf.nn.functional.packed_linear_attention`). Arguments: as
    :class:`~pyg_grf.nn.GRFAttention` (``channels, heads, head_channels, feature_map,
    feature_map_kwargs, dropout, bias, eps``).
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 feature_map: Any = 'relu', feature_map_kwargs: Optional[Dict[str, Any]] = None,
                 dropout: float = 0.0, bias: bool = True, eps: float = 1e-6):
        super().__init__(channels, heads, head_channels, feature_map, feature_map_kwargs,
                         dropout, bias)
        self.eps = eps
        self.reset_parameters()

    def attend(self, x: Tensor, batch: Optional[Tensor]) -> Tensor:
        if batch is not None:  # one graph id per node, before any work
            batch_or_zeros(batch, x.size(0), x.device)
        q, k, v = self.project(x)
        # feature maps, keys stabilised per graph (FAVOR+)
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)
        # per-graph sums S_g, z_g and their products with phi(q_i), batched over the graphs
        out = packed_linear_attention(phi_q, phi_k, self.drop_keys(v), batch, eps=self.eps)
        return self.finish(out)


class PowerSeriesAttention(QKVAttention):
    r"""Linear attention masked by the *exact* kernel :math:`M^{(h)} = \sum_{k=0}^{2L}(f^{(h)} *
    f^{(h)})_k W^k` from the `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Eq. 4, Remark 3.1), the expectation (off the
    diagonal) of :class:`~pyg_grf.nn.GRFAttention`'s symmetric mask, with the same parameters (copy
    ``f`` and the projections across). A reference and an exact-mask baseline.

    The mask is never formed. A power series of :math:`W` has a fast mask-times-matrix product
    (``W`` sparse), and masked linear attention needs no more (GKAT paper, Sec. 3, the
    :math:`M \odot (\phi(Q)\phi(K)^\top)` product written as :math:`\sum_r
    \mathrm{diag}(\phi(Q)_{:r})\, M\, \mathrm{diag}(\phi(K)_{:r})`): per head,

    .. math::
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \mathbf{S}_i}
            {\phi(\mathbf{q}_i)^\top \mathbf{z}_i + \epsilon}, \qquad
        [\mathbf{S}\;\mathbf{z}] = \sum_{k=0}^{2L} \alpha_k W^k\,
            \big(\phi(\mathbf{k}_j) \otimes [\mathbf{v}_j\; 1]\big)_j,

    evaluated by Horner's rule with :math:`2L` sparse products of the ``[N, m (d + 1)]`` key-value
    outer products: :math:`O(L\,|E|\,m d)` time and :math:`O(L\,N m d)` memory for the backward,
    linear in the graph (a PubMed-sized graph fits; graphs of a batch never mix since
    :math:`W` is block-diagonal).

    Args:
        normalization (str, optional): of :math:`W` (default: ``'sym'``).
        f_mode (str, optional): ``'abs'``, ``'signed'`` or ``'free'``, as
            :class:`~pyg_grf.nn.GRFAttention` (default: ``'abs'``).
        Others: as :class:`~pyg_grf.nn.GRFAttention`.
    """

    def __init__(self, channels: int, heads: int = 1, max_length: int = 4,
                 head_channels: Optional[int] = None, feature_map: Any = 'relu',
                 feature_map_kwargs: Optional[Dict[str, Any]] = None, f_init: float = 0.5,
                 normalization: Optional[str] = 'sym', dropout: float = 0.0, bias: bool = True,
                 eps: float = 1e-6, f_mode: str = 'abs'):
        super().__init__(channels, heads, head_channels, feature_map, feature_map_kwargs,
                         dropout, bias)
        if f_mode not in ('abs', 'signed', 'free'):
            raise ValueError(f"'f_mode' must be one of ('abs', 'signed', 'free'), got "
                             f"{f_mode!r}")
        self.max_length, self.f_mode, self.f_init = max_length, f_mode, f_init
        self.normalization, self.eps = normalization, eps
        self.f = nn.Parameter(torch.empty(heads, max_length + 1))
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        reset_hop_coefficients(self.f, self.f_init)

    requires = ('edge_index',)
    payload_keys = ('edge_index',)

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""``{'edge_index': data.edge_index}`` (a block passes its own ``edge_index``)."""
        return {'edge_index': data.edge_index}

    def forward(self, x: Tensor, batch: Optional[Tensor] = None, *,
                edge_index: Optional[Tensor] = None, edge_weight: Optional[Tensor] = None
                ) -> Tensor:
        r"""``x`` ``[N, channels]`` with the graphs of a PyG batch (``batch``), or
        ``[B, n, channels]``: ``B`` samples on the one graph ``edge_index`` of ``n`` nodes."""
        if not isinstance(edge_index, Tensor):
            raise ValueError(f"PowerSeriesAttention needs the graph: edge_index= (got "
                             f"{type(edge_index).__name__})")
        if x.dim() not in (2, 3):
            raise ValueError(f"{self.__class__.__name__} expects x of shape [N, {self.channels}] "
                             f"or [B, n, {self.channels}], got {tuple(x.shape)}")
        B, n = (x.size(0), x.size(1)) if x.dim() == 3 else (1, x.size(0))
        if edge_index.numel() > 0 and int(edge_index.max()) >= n:
            if x.dim() == 3:
                raise ValueError(f"x of shape {tuple(x.shape)} holds {B} samples of {n} nodes, "
                                 f"but 'edge_index' has node ids up to {int(edge_index.max())}")
            raise ValueError(f"'edge_index' has node ids up to {int(edge_index.max())} but 'x' "
                             f"has {n} rows")
        shape = x.shape
        x, batch, _ = samples_as_graphs(x, batch)
        if x.size(0) == 0:  # an empty batch
            self.project(x)
            return self.empty_output(x)
        if batch is not None:
            batch_or_zeros(batch, x.size(0), x.device)
        q, k, v = self.project(x)
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)  # keys per graph / sample
        # [B n, H, .] -> [n, B, H, .]: the B samples of a shared graph side by side per node
        phi_q, phi_k, v = (t.view(B, n, *t.shape[1:]).transpose(0, 1)
                           for t in (phi_q, phi_k, self.drop_keys(v)))
        w = normalized_adjacency(edge_index, n, edge_weight, self.normalization)
        pattern = SparsePattern(edge_index, (n, n))
        coef = self.coefficients()
        ones = v.new_ones(v.shape[:-1] + (1,))
        if self.f_mode != 'signed':
            sums = self._series(phi_q, phi_k, torch.cat([v, ones], -1), pattern, w, coef)
            num, den = sums[..., :-1], sums[..., -1:]
        else:  # the normaliser from the kernel of |f|, which bounds the signed one entrywise
            num = self._series(phi_q, phi_k, v, pattern, w, coef)
            den = self._series(phi_q, phi_k, ones, pattern, w, self.f.abs())
        out = (num / (den + self.eps)).transpose(0, 1).reshape(B * n, *num.shape[2:])
        out = self.finish(out)
        return out.view(*shape[:-1], -1)

    def coefficients(self) -> Tensor:
        r"""The hop coefficients of the kernel (its numerator), as
        :meth:`GRFAttention.coefficients() <pyg_grf.nn.GRFAttention.coefficients>`."""
        return self.f.abs() if self.f_mode == 'abs' else self.f

    def _series(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, pattern: SparsePattern,
                w: Tensor, coef: Tensor) -> Tensor:
        # phi_q(i)^T sum_k alpha_k [W^k (phi_k (x) v)]_i for phi [n, B, H, m], v [n, B, H, d]:
        # Horner's rule over the [n, B H m d] outer products, one sparse product per term
        n, B, H, m = phi_k.shape
        alpha = torch.stack([self_convolution(f) for f in coef]).to(v.dtype)   # [H, 2L + 1]
        check_walk_memory(
            (alpha.size(1) + 2) * n * B * H * m * v.size(-1) * v.element_size(), v.device, None,
            lambda: f"PowerSeriesAttention's exact kernel on {n} nodes ({B} x {H} x {m} x "
                    f"{v.size(-1)} key-value products per node, one set per series term)",
            "Use attn_type='grf' (the O(N) random-feature estimate of this kernel), fewer "
            "heads or a smaller max_length.", error=MemoryError)
        U = phi_k.unsqueeze(-1) * v.unsqueeze(-2)                     # [n, B, H, m, d]
        a = alpha.t().reshape(-1, 1, H, 1, 1)                         # [2L + 1, 1, H, 1, 1]
        w = w.to(U.dtype)
        S = a[-1] * U
        for i in range(alpha.size(1) - 2, -1, -1):  # loop over series terms, not nodes
            S = spmm(pattern, w, S.reshape(n, -1)).view_as(U) + a[i] * U
        return torch.einsum('nbhm,nbhmd->nbhd', phi_q, S)

    def _extra_repr(self) -> str:
        mode = '' if self.f_mode == 'abs' else f', f_mode={self.f_mode!r}'
        return f', max_length={self.max_length}{mode}'


class SoftmaxAttention(QKVAttention):
    r"""Dense softmax attention inside each graph of a batch, :math:`O(\sum_g N_g^2)`, through
    :func:`torch.nn.functional.scaled_dot_product_attention` on the padded batch.

    Args: ``channels, heads, head_channels, dropout, bias``.
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(channels, heads, head_channels, None, None, dropout, bias)
        self.reset_parameters()

    def attend(self, x: Tensor, batch: Optional[Tensor]) -> Tensor:
        check_sorted_batch(batch)
        batch = batch_or_zeros(batch, x.size(0), x.device)
        q, k, v = self.project(x)
        N, H, C = q.shape
        qkv, valid = to_dense_batch(torch.cat([q, k, v], -1).view(N, H * 3 * C), batch)
        B, Nmax = valid.shape
        qd, kd, vd = qkv.view(B, Nmax, H, 3 * C).transpose(1, 2).split(C, -1)  # [B, H, Nmax, C]
        attn_mask = valid.view(B, 1, 1, Nmax)
        out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2)[valid]  # [N, H, C]
        return self.finish(out)
