r"""The GPS layer of PyG with topology-aware linear-cost attention: the one block of the package
(:class:`~pyg_grf.nn.GraphTransformer` is a stack of them)."""
from __future__ import annotations

import inspect
from typing import Any, Dict, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Dropout, Linear, Sequential
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import reset
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver
from torch_geometric.typing import Adj

from pyg_grf.nn.attention.base import GraphAttention
from pyg_grf.nn.attention.registry import ATTENTIONS, attention_resolver

#: The layouts of :class:`GRFGPSConv`.
LAYOUTS = ('post_norm', 'pre_norm')


def norm_resolver(norm: Union[str, torch.nn.Module, None], channels: int,
                  **kwargs: Any) -> Optional[torch.nn.Module]:
    r"""PyG's :func:`~torch_geometric.nn.resolver.normalization_resolver`, plus ``'rms_norm'``
    (:class:`torch.nn.RMSNorm`, per node), which PyG does not have."""
    if norm == 'rms_norm':
        return torch.nn.RMSNorm(channels, **kwargs)
    if norm is None:
        return None
    try:
        return normalization_resolver(norm, channels, **kwargs)
    except ValueError as exc:
        raise ValueError(f"norm must be a PyG normalization ('batch_norm', 'layer_norm', "
                         f"'graph_norm', ...), 'rms_norm' or None, got {norm!r}") from exc


class GRFGPSConv(torch.nn.Module):
    r"""The GPS layer of *Recipe for a General, Powerful, Scalable Graph Transformer* (Rampášek et
    al., 2022, `arXiv:2205.12454 <https://arxiv.org/abs/2205.12454>`_), shaped and computed exactly
    like :class:`torch_geometric.nn.conv.GPSConv`, whose global attention can be that of the
    `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Reid et al., 2024), GKAT (the `"From
    block-Toeplitz matrices to differential equations on graphs: towards a general theory for
    scalable masked Transformers" <https://arxiv.org/abs/2107.07999>`_ paper), or any other of
    the registry (:mod:`pyg_grf.nn.attention.registry`). With ``layout='post_norm'`` (PyG's):

    .. math::
        \mathbf{h}_{\mathrm{local}} &= \mathrm{Norm}_1(\mathbf{x} + \mathrm{MPNN}(\mathbf{x},
            \mathcal{E})) \\
        \mathbf{h}_{\mathrm{global}} &= \mathrm{Norm}_2(\mathbf{x} + \mathrm{Attn}_M(\mathbf{x}))
            \\
        \mathbf{x}' &= \mathrm{Norm}_3(\mathbf{h} + \mathrm{MLP}(\mathbf{h})), \quad
        \mathbf{h} = \mathbf{h}_{\mathrm{local}} + \mathbf{h}_{\mathrm{global}}

    and with ``layout='pre_norm'`` (the transformer's pre-norm block, attention and MPNN side
    by side on the normalised input):

    .. math::
        \mathbf{y} = \mathbf{x} + \mathrm{Attn}_M(\mathrm{Norm}_1(\mathbf{x}))
        + \mathrm{MPNN}(\mathrm{Norm}_1(\mathbf{x})), \quad
        \mathbf{x}' = \mathbf{y} + \mathrm{MLP}(\mathrm{Norm}_2(\mathbf{y}))

    with dropout on both residual branches and inside the MLP. Attention never crosses the
    graphs of a mini-batch.

    Args:
        channels, conv, heads, dropout, act, act_kwargs, norm, norm_kwargs: as in
            :class:`~torch_geometric.nn.conv.GPSConv` (``conv=None``: attention only; ``norm``
            may also be ``'rms_norm'``).
        attn_type (str or torch.nn.Module, optional): a name of
            :data:`~pyg_grf.nn.attention.registry.ATTENTIONS` (``'multihead'`` and
            ``'performer'`` are padded per graph exactly as in
            :class:`~torch_geometric.nn.conv.GPSConv`), an attention module called as
            ``attn(x, batch, **payload)``, or :obj:`None` for none (default: :obj:`"grf"`).
        attn_kwargs (dict, optional): arguments of the attention layer, e.g.
            ``{'max_length': 4}`` for ``'grf'`` (default: :obj:`None`).
        layout (str, optional): ``'post_norm'`` (PyG's GPS layer) or ``'pre_norm'``
            (default: ``'post_norm'``).
        mlp_channels (int, optional): hidden width of the MLP (default: ``2 * channels``, as
            in :class:`~torch_geometric.nn.conv.GPSConv`).
    """

    def __init__(self, channels: int, conv: Optional[MessagePassing], heads: int = 1,
                 dropout: float = 0.0, act: str = 'relu',
                 act_kwargs: Optional[Dict[str, Any]] = None, norm: Optional[str] = 'batch_norm',
                 norm_kwargs: Optional[Dict[str, Any]] = None,
                 attn_type: Union[str, torch.nn.Module, None] = 'grf',
                 attn_kwargs: Optional[Dict[str, Any]] = None, layout: str = 'post_norm',
                 mlp_channels: Optional[int] = None):
        super().__init__()
        if isinstance(attn_type, str) and attn_type not in ATTENTIONS:
            raise ValueError(f"'attn_type' must be one of {sorted(ATTENTIONS)}, an attention "
                             f"module or None, got {attn_type!r}")
        if conv is not None and not isinstance(conv, torch.nn.Module):
            raise TypeError(f"'conv' must be a MessagePassing module or None, got "
                            f"{type(conv).__name__}")
        if conv is None and attn_type is None:
            raise ValueError("GRFGPSConv needs a 'conv', an 'attn_type' or both")
        if layout not in LAYOUTS:
            raise ValueError(f"'layout' must be one of {LAYOUTS}, got {layout!r}")
        self.channels, self.conv, self.heads, self.dropout = channels, conv, heads, dropout
        self.attn_type = attn_type if isinstance(attn_type, str) or attn_type is None else \
            attn_type.__class__.__name__
        self.attn_kwargs = dict(attn_kwargs or {})
        self.layout = layout
        self.attn = None if attn_type is None else attention_resolver(
            attn_type, channels, heads, **self.attn_kwargs)
        self.conv_edge_attr = conv is not None and takes(conv, 'edge_attr')
        if mlp_channels is not None and (isinstance(mlp_channels, bool) or not isinstance(
                mlp_channels, int) or mlp_channels < 1):
            raise ValueError(f"'mlp_channels' must be a positive integer (the MLP's hidden "
                             f"width) or None (2 * channels), got {mlp_channels!r}")
        hidden = 2 * channels if mlp_channels is None else mlp_channels
        self.mlp = Sequential(
            Linear(channels, hidden),
            activation_resolver(act, **(act_kwargs or {})),
            Dropout(dropout),
            Linear(hidden, channels),
            Dropout(dropout),
        )
        norm_kwargs = norm_kwargs or {}
        self.norm1 = norm_resolver(norm, channels, **norm_kwargs)
        self.norm2 = norm_resolver(norm, channels, **norm_kwargs)
        self.norm3 = norm_resolver(norm, channels, **norm_kwargs) if layout == 'post_norm' \
            else None
        self.norm_with_batch = self.norm1 is not None and takes(self.norm1, 'batch')
        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        for module in (self.conv, self.attn, self.norm1, self.norm2, self.norm3):
            if hasattr(module, 'reset_parameters'):
                module.reset_parameters()
        reset(self.mlp)

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""The attention's payload for ``data``, as in
        ``conv(x, edge_index, batch, **conv.payload(data))``: its
        :meth:`~pyg_grf.nn.attention.base.GraphAttention.payload` without the block's own
        ``edge_index`` (``{'grf': plan}`` for ``'grf'``). For several GRF blocks build one
        payload per batch, ``model_payload(convs, batch)``
        (:func:`~pyg_grf.nn.attention.base.model_payload`), so that the plan holds every
        layer's structures."""
        if not isinstance(self.attn, GraphAttention):
            return {}
        return {k: v for k, v in self.attn.payload(data).items() if k != 'edge_index'}

    def _norm(self, norm, h: Tensor, batch: Optional[Tensor]) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def forward(self, x: Tensor, edge_index: Adj, batch: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        r"""The call shape of PyG's :class:`~torch_geometric.nn.conv.GPSConv`; ``**kwargs``
        holds the attention's payload (:meth:`payload`), then further arguments of ``conv``
        (e.g. ``edge_attr``)."""
        if batch is not None and not isinstance(batch, Tensor):
            raise TypeError(f"'batch' must be a tensor of graph ids, got {type(batch).__name__}")
        payload = self._payload(edge_index, kwargs)
        if self.layout == 'pre_norm':  # attention and MPNN side by side on Norm_1(x)
            h = self._norm(self.norm1, x, batch)
            out = x
            if self.attn is not None:
                out = out + F.dropout(self.attn(h, batch, **payload), p=self.dropout,
                                      training=self.training)
            if self.conv is not None:
                out = out + F.dropout(self._local(h, edge_index, kwargs), p=self.dropout,
                                      training=self.training)
            return out + self.mlp(self._norm(self.norm2, out, batch))
        hs = []
        if self.conv is not None:  # local message passing
            h = F.dropout(self._local(x, edge_index, kwargs), p=self.dropout,
                          training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        if self.attn is not None:  # global attention, never across graphs
            h = F.dropout(self.attn(x, batch, **payload), p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm2, h + x, batch))
        out = sum(hs)
        out = out + self.mlp(out)
        return self._norm(self.norm3, out, batch)

    def _local(self, x: Tensor, edge_index: Adj, kwargs: Dict[str, Any]) -> Tensor:
        h = self.conv(x, edge_index, **kwargs)
        if h.shape != x.shape:  # it is added to x
            raise ValueError(f"'conv' {self.conv!r} returned shape {tuple(h.shape)}, "
                             f"expected {tuple(x.shape)} ([N, channels])")
        return h

    def _payload(self, edge_index: Adj, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        # the attention's keyword payload, taken out of kwargs (the rest goes to the conv)
        keys = self.attn.payload_keys if isinstance(self.attn, GraphAttention) else ()
        for key in ('grf', 'rwgnk'):  # payloads of other types: one loop for every attn_type
            if key not in keys:
                kwargs.pop(key, None)
        payload = {}
        for key in keys:
            if key == 'edge_index':  # the attention reads the block's graph
                payload[key] = kwargs.pop(key, edge_index)
            elif kwargs.get(key) is None:
                raise ValueError(
                    f"attn_type={self.attn_type!r} needs the batch's plan as {key}=...: call "
                    f"conv(x, edge_index, batch, **conv.payload(data), edge_attr=...) (the "
                    f"plan that pyg_grf.loader.DataLoader(model=...) or prepare_payload(model, "
                    f"data) left on the data as data.{key}_plan, else built once per batch). "
                    f"The plan is built from the data's {', '.join(self.attn.requires)}; "
                    f"without them: {self.attn.hint}")
            else:
                payload[key] = kwargs.pop(key)
        return payload

    def __repr__(self) -> str:
        layout = '' if self.layout == 'post_norm' else f', layout={self.layout!r}'
        return (f'{self.__class__.__name__}({self.channels}, conv={self.conv}, '
                f'heads={self.heads}, attn_type={self.attn_type!r}{layout})')


def takes(module: torch.nn.Module, name: str) -> bool:
    r"""Whether ``module.forward`` has an argument ``name``."""
    try:
        return name in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - forward without a signature
        return False
