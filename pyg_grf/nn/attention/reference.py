r"""Reference and baseline attentions for PyG mini-batches: unmasked linear attention per graph,
the exact power-series-masked linear attention (the dense :math:`O(N^2)` counterpart of
:class:`~pyg_grf.nn.GRFAttention`), and dense softmax attention per graph."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from pyg_grf._validation import batch_or_zeros
from pyg_grf.nn.feature_maps import qk_features
from pyg_grf.features.exact import power_series_kernel
from pyg_grf.features.grf import self_convolution
from pyg_grf.masks.base import DenseMask
from pyg_grf.masks.packing import PackingMask
from pyg_grf.nn.attention.base import QKVAttention, reset_hop_coefficients
from pyg_grf.nn.functional import masked_linear_attention


class LinearAttention(QKVAttention):
    r"""Unmasked linear attention inside each graph of a batch (the packing mask of the `"From
    block-Toeplitz matrices to differential equations on graphs: towards a general theory for
    scalable masked Transformers" <https://arxiv.org/abs/2107.07999>`_ paper, Sec. 3.1):
    :math:`\mathbf{o}_i = \sum_{j \in g(i)} \phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j) \mathbf{v}_j
    / \sum_{j \in g(i)} \phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)`. :math:`O(N)`.

    Args: as :class:`~pyg_grf.nn.GRFAttention` (``channels, heads, head_channels, feature_map,
    feature_map_kwargs, dropout, bias, eps``).
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 feature_map: Any = 'relu', feature_map_kwargs: Optional[Dict[str, Any]] = None,
                 dropout: float = 0.0, bias: bool = True, eps: float = 1e-6):
        super().__init__(channels, heads, head_channels, feature_map, feature_map_kwargs,
                         dropout, bias)
        self.eps = eps
        self.reset_parameters()

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        q, k, v = self.project(x)
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)  # keys per graph
        out = masked_linear_attention(phi_q, phi_k, self.drop_keys(v),
                                      PackingMask(batch_or_zeros(batch, x.size(0), x.device)),
                                      eps=self.eps)
        return self.finish(out)


class PowerSeriesAttention(QKVAttention):
    r"""Linear attention masked by the *exact* kernel :math:`M^{(h)} = \sum_{k=0}^{2L}(f^{(h)} *
    f^{(h)})_k W^k` from the `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Eq. 4, Remark 3.1), the expectation (off the
    diagonal) of :class:`~pyg_grf.nn.GRFAttention`'s symmetric mask, with the same parameters (copy
    ``f`` and the projections across). Dense: :math:`O(N^2)` memory over the whole batch (the
    kernel is block-diagonal, so graphs still do not mix). A reference and a small-graph baseline.

    Args:
        normalization (str, optional): of :math:`W` (default: ``'sym'``).
        Others: as :class:`~pyg_grf.nn.GRFAttention`.
    """

    def __init__(self, channels: int, heads: int = 1, max_length: int = 4,
                 head_channels: Optional[int] = None, feature_map: Any = 'relu',
                 feature_map_kwargs: Optional[Dict[str, Any]] = None, f_init: float = 0.5,
                 normalization: Optional[str] = 'sym', dropout: float = 0.0, bias: bool = True,
                 eps: float = 1e-6):
        super().__init__(channels, heads, head_channels, feature_map, feature_map_kwargs,
                         dropout, bias)
        self.max_length = max_length
        self.f_init = f_init
        self.normalization = normalization
        self.eps = eps
        self.f = nn.Parameter(torch.empty(heads, max_length + 1))
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        reset_hop_coefficients(self.f, self.f_init)

    def dense_mask(self, edge_index: Tensor, num_nodes: int,
                   edge_weight: Optional[Tensor] = None) -> Tensor:
        alpha = torch.stack([self_convolution(f) for f in self.f])  # [H, 2L + 1], loop over heads
        return power_series_kernel(edge_index, num_nodes, alpha, edge_weight=edge_weight,
                                   normalization=self.normalization)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Optional[Tensor] = None,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        q, k, v = self.project(x)
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)  # keys per graph
        M = DenseMask(self.dense_mask(edge_index, x.size(0), edge_weight).to(x.dtype))
        return self.finish(masked_linear_attention(phi_q, phi_k, self.drop_keys(v), M,
                                                   eps=self.eps))

    def _extra_repr(self) -> str:
        return f', max_length={self.max_length}'


class SoftmaxAttention(QKVAttention):
    r"""Dense softmax attention inside each graph of a batch, :math:`O(\sum_g N_g^2)`, through
    :func:`torch.nn.functional.scaled_dot_product_attention` on the padded batch.

    Args: ``channels, heads, head_channels, dropout, bias``.
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(channels, heads, head_channels, None, None, dropout, bias)
        self.reset_parameters()

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        batch = batch_or_zeros(batch, x.size(0), x.device)
        q, k, v = self.project(x)
        N, H, C = q.shape
        # [B, Nmax, H, C] -> [B, H, Nmax, C]
        qd, valid = to_dense_batch(q.view(N, H * C), batch)
        kd, _ = to_dense_batch(k.view(N, H * C), batch)
        vd, _ = to_dense_batch(v.view(N, H * C), batch)
        B, Nmax = valid.shape
        qd, kd, vd = (t.view(B, Nmax, H, C).transpose(1, 2) for t in (qd, kd, vd))
        attn_mask = valid.view(B, 1, 1, Nmax)
        out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2)[valid]  # [N, H, C]
        return self.finish(out)
