r"""Reference and baseline attentions for PyG mini-batches: unmasked linear attention per graph,
the exact power-series-masked linear attention (the dense :math:`O(N^2)` counterpart of
:class:`~pyg_grf.nn.GRFAttention`), and dense softmax attention per graph."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_adj, to_dense_batch

from pyg_grf._validation import batch_or_zeros, check_sorted_batch
from pyg_grf.features.blocks import block_layout
from pyg_grf.features.grf import normalized_adjacency, self_convolution
from pyg_grf.memory import check_walk_memory
from pyg_grf.nn.attention.base import QKVAttention, reset_hop_coefficients, samples_as_graphs
from pyg_grf.nn.feature_maps import qk_features
from pyg_grf.nn.functional import (
    block_masked_linear_attention,
    from_blocks,
    packed_linear_attention,
    to_blocks,
)


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
    ``f`` and the projections across). Dense: :math:`O(N^2)` memory over the whole batch (the
    kernel is block-diagonal, so graphs still do not mix). A reference and a small-graph baseline.

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
        ``[B, n, channels]``: ``B`` samples on the one graph ``edge_index`` of ``n`` nodes.
        The kernel is built per graph, as ``[B, H, n, n]`` dense blocks (one for a shared
        graph)."""
        if not isinstance(edge_index, Tensor):
            raise ValueError(f"PowerSeriesAttention needs the graph: edge_index= (got "
                             f"{type(edge_index).__name__})")
        if x.dim() == 3:
            B, n, _ = x.shape
            if edge_index.numel() > 0 and int(edge_index.max()) >= n:
                raise ValueError(f"x of shape {tuple(x.shape)} holds {B} samples of {n} nodes, "
                                 f"but 'edge_index' has node ids up to {int(edge_index.max())}")
            x, sample, _ = samples_as_graphs(x, batch)
            q, k, v = self.project(x)
            H, C = self.heads, self.head_channels
            phi_q, phi_k = qk_features(self.feature_map, q, k, sample)
            blocks = [t.view(B, n, H, -1).transpose(1, 2) for t in (phi_q, phi_k,
                                                                     self.drop_keys(v))]
            graph = torch.zeros(n, dtype=torch.long, device=x.device)
            out = self._attend(blocks, edge_index, graph, n, edge_weight)    # [B, H, n, C]
            return self.finish(out.transpose(1, 2).reshape(B * n, H, C)).view(B, n, -1)
        if x.dim() != 2:
            raise ValueError(f"{self.__class__.__name__} expects x of shape [N, {self.channels}] "
                             f"or [B, n, {self.channels}], got {tuple(x.shape)}")
        N = x.size(0)
        if N == 0:  # an empty batch
            self.project(x)
            return self.empty_output(x)
        if edge_index.numel() > 0 and int(edge_index.max()) >= N:
            raise ValueError(f"'edge_index' has node ids up to {int(edge_index.max())} but 'x' "
                             f"has {N} rows")
        batch = batch_or_zeros(batch, N, x.device)
        lay = block_layout(batch, N)
        q, k, v = self.project(x)
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)  # keys per graph
        blocks = [to_blocks(t, lay) for t in (phi_q, phi_k, self.drop_keys(v))]
        return self.finish(from_blocks(self._attend(blocks, edge_index, batch, N, edge_weight),
                                       lay))

    def coefficients(self) -> Tensor:
        r"""The hop coefficients of the kernel (its numerator), as
        :meth:`GRFAttention.coefficients() <pyg_grf.nn.GRFAttention.coefficients>`."""
        return self.f.abs() if self.f_mode == 'abs' else self.f

    def _attend(self, blocks, edge_index: Tensor, batch: Tensor, num_nodes: int,
                edge_weight: Optional[Tensor]) -> Tensor:
        # masked linear attention on [B, H, n, .] blocks; f_mode='signed': the normaliser from
        # the kernel of |f|, which bounds the signed kernel entrywise
        dtype = blocks[0].dtype
        M = self._blocks(edge_index, batch, num_nodes, edge_weight, dtype, self.coefficients())
        if self.f_mode != 'signed':
            return block_masked_linear_attention(*blocks, M, eps=self.eps)
        num = block_masked_linear_attention(*blocks, M, return_sums=True)
        den = block_masked_linear_attention(*blocks, self._blocks(
            edge_index, batch, num_nodes, edge_weight, dtype, self.f.abs()), return_sums=True)
        return num[..., :-1] / (den[..., -1:] + self.eps)

    def _blocks(self, edge_index: Tensor, batch: Tensor, num_nodes: int,
                edge_weight: Optional[Tensor], dtype: torch.dtype, coef: Tensor) -> Tensor:
        # sum_k alpha_k W^k per graph by Horner's rule on the padded [B, n, n] blocks of W
        alpha = torch.stack([self_convolution(f) for f in coef]).to(dtype)  # [H, 2L + 1]
        # W, the identity, and per head the running product, its update and their gradients
        # on the padded blocks: about (2 + 4 H) B n^2 values, estimated before allocating
        sizes = torch.bincount(batch) if num_nodes > 0 else batch.new_zeros(1)
        B, n = sizes.numel(), int(sizes.max())
        check_walk_memory((2 + 4 * alpha.size(0)) * B * n * n * alpha.element_size(),
                          batch.device, None,
                          f"PowerSeriesAttention's exact kernel on {B} graph(s) of up to {n} "
                          f"nodes (dense [B, H, n, n] blocks)",
                          "Use attn_type='grf' (the O(N) random-feature estimate of this "
                          "kernel) for graphs this large.", error=MemoryError)
        w = normalized_adjacency(edge_index, num_nodes, edge_weight, self.normalization)
        W = to_dense_adj(edge_index, batch, edge_attr=w.to(dtype)).unsqueeze(1)  # [B, 1, n, n]
        eye = torch.eye(W.size(-1), dtype=dtype, device=W.device)
        K = alpha.size(-1)
        out = alpha[:, K - 1, None, None] * eye                                 # [H, n, n]
        for i in range(K - 2, -1, -1):  # loop over series terms
            out = out @ W + alpha[:, i, None, None] * eye
        return out.expand(W.size(0), -1, -1, -1) if out.dim() == 3 else out

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
