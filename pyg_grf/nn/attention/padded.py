r"""PyG's and torch's dense attentions with the package's call shape ``forward(x, batch=None)``:
padded per graph with :func:`~torch_geometric.utils.to_dense_batch`, exactly as
:class:`torch_geometric.nn.conv.GPSConv` runs them, so that :class:`~pyg_grf.nn.GRFGPSConv` and
:class:`~pyg_grf.nn.GraphTransformer` drive them like every other attention. The parameters (and
state-dict keys) are those of the wrapped classes."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.nn.attention import PerformerAttention
from torch_geometric.utils import to_dense_batch

from pyg_grf._validation import check_sorted_batch
from pyg_grf.nn.attention.base import GraphAttention, samples_as_graphs


class _PaddedAttention(GraphAttention):
    # forward(x, batch) of a dense attention over the graphs padded to the largest one
    def reset_parameters(self):
        self._reset_parameters()

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        x, batch, samples = samples_as_graphs(x, batch)  # [B, n, C]: B graphs
        if samples is not None:
            return self.forward(x, batch).view(samples, -1, x.size(-1))
        if x.size(0) == 0:  # an empty batch: nothing to pad
            return x * 0
        check_sorted_batch(batch)
        h, mask = to_dense_batch(x, batch)
        return self.dense(h, mask)[mask]


class PaddedMultiheadAttention(_PaddedAttention, torch.nn.MultiheadAttention):
    r""":class:`torch.nn.MultiheadAttention` (exact softmax attention, :math:`O(\sum_g N_g^2)`)
    inside each graph of a batch: the padding is masked out of the keys
    (``key_padding_mask``), as in PyG's ``GPSConv(attn_type='multihead')``. Constructor: that
    of :class:`torch.nn.MultiheadAttention` (``batch_first`` is always :obj:`True`)."""

    def __init__(self, channels: int, heads: int = 1, **kwargs):
        kwargs.pop('batch_first', None)
        super().__init__(channels, heads, batch_first=True, **kwargs)

    def dense(self, h: Tensor, mask: Tensor) -> Tensor:
        return torch.nn.MultiheadAttention.forward(self, h, h, h, key_padding_mask=~mask,
                                                   need_weights=False)[0]


class PaddedPerformerAttention(_PaddedAttention, PerformerAttention):
    r"""PyG's :class:`~torch_geometric.nn.attention.PerformerAttention` inside each graph of a
    batch, padded as in PyG's ``GPSConv(attn_type='performer')``. As there, the padded values
    are masked but the padded keys enter the normaliser, so a graph's output depends on the
    size of the largest graph of its batch; ``'favor'`` (FAVOR+ strictly per graph) does not.
    Constructor: that of ``PerformerAttention``."""

    def dense(self, h: Tensor, mask: Tensor) -> Tensor:
        return PerformerAttention.forward(self, h, mask=mask)
