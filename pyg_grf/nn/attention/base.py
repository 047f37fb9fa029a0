r"""Shared scaffolding of the multi-head attention layers: projections and head reshapes."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from pyg_grf.nn.feature_maps import FeatureMap, feature_map_resolver, qk_features


def reset_hop_coefficients(f: Tensor, f_init: float) -> None:
    r"""Sets the per-head hop coefficients ``f`` (``[H, L + 1]``) to :math:`f_l =
    \mathrm{f\_init}^l` in place: :math:`f_0 = 1`, longer walks start with less weight."""
    with torch.no_grad():
        f.copy_(f_init ** torch.arange(f.size(-1), dtype=torch.float).expand_as(f))


class QKVAttention(nn.Module):
    r"""Base of the attention layers: ``to_q``, ``to_k``, ``to_v`` project ``[N, channels]`` to
    ``heads`` heads of ``head_channels``; ``to_out`` projects back; dropout on the mixed values.

    Subclasses implement the mixing of ``q, k, v`` (``[N, H, C]`` each).
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 feature_map: Any = None, feature_map_kwargs: Optional[Dict[str, Any]] = None,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if channels < 1 or heads < 1:
            raise ValueError(f"'channels' and 'heads' must be positive, got {channels} and {heads}")
        if head_channels is None:
            if channels % heads != 0:
                raise ValueError(f"'channels' ({channels}) must be divisible by 'heads' ({heads}) "
                                 f"unless 'head_channels' is given")
            head_channels = channels // heads
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"'dropout' must lie in [0, 1), got {dropout}")
        self.channels = channels
        self.heads = heads
        self.head_channels = head_channels
        self.dropout = dropout
        self.bias = bias
        inner = heads * head_channels
        self.to_q = nn.Linear(channels, inner, bias=bias)
        self.to_k = nn.Linear(channels, inner, bias=bias)
        self.to_v = nn.Linear(channels, inner, bias=bias)
        self.to_out = nn.Linear(inner, channels, bias=bias)
        self.feature_map_name = feature_map
        self.feature_map_kwargs = feature_map_kwargs or {}
        self.feature_map: Optional[FeatureMap] = None
        if feature_map is not None:
            self.feature_map = feature_map_resolver(feature_map, head_channels,
                                                    **self.feature_map_kwargs)

    def reset_parameters(self):
        for lin in (self.to_q, self.to_k, self.to_v, self.to_out):
            lin.reset_parameters()
        if self.feature_map is not None:
            self.feature_map.redraw()

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        if x.dim() != 2 or x.size(-1) != self.channels:
            raise ValueError(f"{self.__class__.__name__} expects node features of shape "
                             f"[N, {self.channels}], got {tuple(x.shape)}")
        N, H, C = x.size(0), self.heads, self.head_channels
        return (self.to_q(x).view(N, H, C), self.to_k(x).view(N, H, C),
                self.to_v(x).view(N, H, C))

    def features(self, q: Tensor, k: Tensor,
                 batch: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        # keys are stabilised per graph of the batch (never across graphs)
        return qk_features(self.feature_map, q, k, batch)

    def finish(self, out: Tensor) -> Tensor:
        out = nn.functional.dropout(out.reshape(out.size(0), self.heads * self.head_channels),
                                    p=self.dropout,
                                    training=self.training)
        return self.to_out(out)

    def _extra_repr(self) -> str:
        return ''

    def __repr__(self) -> str:
        fm = '' if self.feature_map is None else f', feature_map={self.feature_map!r}'
        fm = fm.replace("feature_map=relu", "feature_map='relu'").replace(
            "feature_map=elu", "feature_map='elu'")
        return (f'{self.__class__.__name__}({self.channels}, heads={self.heads}{fm}'
                f'{self._extra_repr()})')
