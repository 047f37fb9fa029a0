r"""A GPS-style graph transformer whose global attention is any of this package's attentions.

Data flows one way: node (and edge) encoders, an optional positional encoding, then
:obj:`num_layers` pre-norm blocks (or, with ``block='gps'``, :class:`~pyg_grf.nn.GRFGPSConv`
layers, PyG :class:`~torch_geometric.nn.conv.GPSConv`'s post-norm layout)

.. math::
    \mathbf{h} &= \mathrm{Norm}_1(\mathbf{x}) \\
    \mathbf{x} &\leftarrow \mathbf{x} + \mathrm{Attn}(\mathbf{h}; M)
                 + \mathrm{MPNN}(\mathbf{h}, \mathcal{E}) \\
    \mathbf{x} &\leftarrow \mathbf{x} + \mathrm{FFN}(\mathrm{Norm}_2(\mathbf{x}))

(the attention and the optional local message passing run side by side, as in GPS), a final norm,
pooling (graph-level) or none (node-level), and an MLP head.

The attention kinds live in one explicit registry, :data:`ATTENTIONS`: a name maps to a small
adapter class that builds the layer and knows which fields of the PyG batch it needs. The
attention never crosses graphs of a batch: GRF/RWGNK masks are block-diagonal by construction,
linear/performer attention uses a :class:`~pyg_grf.masks.PackingMask`, softmax attention pads per
graph with :func:`~torch_geometric.utils.to_dense_batch`.
"""
from __future__ import annotations

import copy
import inspect
import re
from typing import Any, Callable, Dict, Optional, Tuple, Type, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Dropout, Linear, Sequential

from torch_geometric.nn import (
    MLP,
    GATConv,
    GINConv,
    GINEConv,
    global_add_pool,
    global_max_pool,
    global_mean_pool,
)
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.resolver import activation_resolver

from pyg_grf._validation import batch_or_zeros
from pyg_grf.features.loads import GRFLoads



# Attention adapters ########################################################################


class AttentionAdapter(torch.nn.Module):
    r"""Base of the attention adapters of :class:`GraphTransformer`.

    An adapter builds one attention layer (:meth:`build`, which imports the layer's module, so
    a kind whose module is missing fails only when it is used) and calls it with what it needs
    from the batch. Subclasses set :attr:`requires` (names of
    :class:`~torch_geometric.data.Data` attributes; missing ones raise a clear error before the
    first layer runs) and :attr:`hint` (how to add them), and implement :meth:`build` and
    :meth:`forward`.

    Args:
        channels (int): hidden size (input = output).
        heads (int): number of heads.
        dropout (float): attention dropout.
        **kwargs: options of the wrapped layer.
    """

    #: Batch attributes this attention reads.
    requires: Tuple[str, ...] = ()
    #: Batch attributes this attention reads when they are there.
    optional: Tuple[str, ...] = ()
    #: How to provide them (shown in the error when they are missing).
    hint: str = ''

    def __init__(self, channels: int, heads: int = 1, dropout: float = 0., **kwargs: Any):
        super().__init__()
        self.channels = channels
        self.heads = heads
        self.attn = self.build(channels, heads, dropout, **kwargs)

    def build(self, channels: int, heads: int, dropout: float, **kwargs: Any) -> torch.nn.Module:
        raise NotImplementedError

    def reset_parameters(self):
        if hasattr(self.attn, 'reset_parameters'):
            self.attn.reset_parameters()

    def forward(self, x: Tensor, batch: Tensor, num_graphs: int,
                fields: Dict[str, Any]) -> Tensor:
        r"""Args:
            x (Tensor): ``[N, channels]`` normalised node states.
            batch (Tensor): ``[N]`` graph id of every node.
            num_graphs (int): number of graphs in the batch.
            fields (dict): the attributes named in :attr:`requires`, plus a per-forward cache
                shared by all layers (keys starting with ``'_'``).
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return repr(self.attn)


class LinearAdapter(AttentionAdapter):
    r"""Unmasked linear attention inside each graph (packing mask),
    :class:`pyg_grf.nn.attention.reference.LinearAttention`."""

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.reference import LinearAttention
        return LinearAttention(channels, heads=heads, dropout=dropout, **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        return self.attn(x, batch)


class PerformerAdapter(LinearAdapter):
    r"""Performer: linear attention with FAVOR+ positive random features
    (:class:`pyg_grf.nn.feature_maps.FAVORPlus`) inside each graph. ``num_features`` sets the
    number of random features."""

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.reference import LinearAttention
        return LinearAttention(channels, heads=heads, dropout=dropout, **_performer(**kwargs))


def _performer(num_features: Optional[int] = None, **kwargs: Any) -> Dict[str, Any]:
    # LinearAttention arguments of attention='performer': FAVOR+ with num_features.
    fm_kwargs = dict(kwargs.pop('feature_map_kwargs', None) or {})
    if num_features is not None:
        fm_kwargs['num_features'] = num_features
    return dict(feature_map='favor+', feature_map_kwargs=fm_kwargs, **kwargs)


class SoftmaxAdapter(AttentionAdapter):
    r"""Exact softmax attention inside each graph (padded per graph, key padding mask),
    :class:`pyg_grf.nn.attention.reference.SoftmaxAttention`, :math:`O(\sum_g N_g^2)`."""

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.reference import SoftmaxAttention
        return SoftmaxAttention(channels, heads=heads, dropout=dropout, **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        return self.attn(x, batch)


class PowerSeriesAdapter(AttentionAdapter):
    r"""Linear attention masked by the exact dense kernel :math:`\sum_k \alpha_k W^k` with
    learnable coefficients (GRF paper, Eq. 4),
    :class:`pyg_grf.nn.attention.reference.PowerSeriesAttention`: the :math:`O(N^2)` reference
    that ``'grf'`` estimates at linear cost (block-diagonal over the graphs of a batch)."""

    requires = ('edge_index',)

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.reference import PowerSeriesAttention
        return PowerSeriesAttention(channels, heads=heads, dropout=dropout, **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        return self.attn(x, fields['edge_index'], batch)


class GridRPEAdapter(AttentionAdapter):
    r"""Linear attention masked by a learnable grid relative-position mask
    :math:`M_{ij} = |f_h|(\lVert \mathbf{c}_i - \mathbf{c}_j \rVert_1)`
    (:class:`~pyg_grf.masks.grid.GridRPE` in :class:`~pyg_grf.nn.attention.masked.
    MaskedLinearAttention`; FTFI paper, Sec. 3.2): the "Toeplitz-masked linear" variant of the
    GRF paper's Table 1. Every graph of the batch must be the same grid, its nodes in row-major
    order (e.g. :class:`~pyg_grf.datasets.DigitsGridDataset`): ``attention_kwargs`` needs
    ``grid_shape`` (and takes ``f_init``, ``method`` and the layer's options). The samples share
    the one mask: one mask product for the whole batch."""

    def build(self, channels, heads, dropout, grid_shape=None, f_init=0.5, method='auto',
              **kwargs):
        from pyg_grf.masks.grid import GridRPE
        from pyg_grf.nn.attention.masked import MaskedLinearAttention
        if grid_shape is None:
            raise ValueError("attention='grid_rpe' needs the grid's shape: attention_kwargs="
                             "{'grid_shape': [height, width]}")
        rpe = GridRPE(grid_shape, heads, f_init, method)
        self.grid_nodes = 1
        for size in rpe.shape:
            self.grid_nodes *= size
        return MaskedLinearAttention(channels, heads=heads, dropout=dropout, mask_module=rpe,
                                     **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        n = self.grid_nodes
        if x.size(0) != num_graphs * n or (num_graphs > 1 and bool(
                (batch != torch.arange(num_graphs, device=x.device).repeat_interleave(n)).any())):
            raise ValueError(f"attention='grid_rpe' needs every graph of the batch to be the grid "
                             f"of {n} nodes (grid_shape); got {x.size(0)} nodes in {num_graphs} "
                             f"graphs")
        return self.attn(x.view(num_graphs, n, -1)).view(x.size(0), -1)


class GRFAdapter(AttentionAdapter):
    r"""Linear attention masked by graph random features,
    :class:`pyg_grf.nn.attention.grf.GRFAttention` (GRF paper, Algorithm 1). Needs the
    :class:`~pyg_grf.transforms.AddGraphRandomFeatures` transform (as ``pre_transform``). The
    loads are validated and their per-batch structures (sparsity patterns, mask statistics,
    block layout) built once per batch, as one :class:`~pyg_grf.features.GRFLoads` shared by all
    layers."""

    requires = ('grf_index', 'grf_length', 'grf_load')
    optional = ('grf_key_index', 'grf_key_length', 'grf_key_load', 'grf_draw', 'grf_key_draw')
    hint = ("add the transform pyg_grf.transforms.AddGraphRandomFeatures (best as the dataset's "
            "pre_transform, so the walks are sampled once and cached); a second one with "
            "attr_prefix='grf_key' gives independent key-side walks (unbiased diagonal)")

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.grf import GRFAttention
        return GRFAttention(channels, heads=heads, dropout=dropout, **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        if '_grf' not in fields:  # validated and precomputed once per batch, for all layers
            fields['_grf'] = self._loads(x.size(0), batch, fields)
        return self.attn(x, grf=fields['_grf'], batch=batch)

    def _loads(self, num_nodes: int, batch: Tensor, fields: Dict[str, Any]) -> GRFLoads:
        return _grf_loads(self, num_nodes, batch, fields)


def _grf_loads(owner: torch.nn.Module, num_nodes: int, batch: Tensor,
               fields: Dict[str, Any]) -> GRFLoads:
    r"""The batch's :class:`~pyg_grf.features.GRFLoads` (with the key-side loads when the fields
    have them), cached on :obj:`owner` while the tensors are unchanged."""
    # Full-graph training sees the same tensors at every step: keep their GRFLoads (and all
    # it has built) while the tensors are unchanged (same storage, same version).
    requires, optional = GRFAdapter.requires, GRFAdapter.optional
    names = requires + tuple(f for f in optional if f in fields)
    if fields.get('_one_graph', False):
        batch = None  # one graph: GRFLoads without a batch vector means the same
    tensors = [fields[n] for n in names] + ([] if batch is None else [batch])
    stamp = None
    if not any(t.is_inference() for t in tensors):  # inference tensors have no version
        stamp = tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in tensors)
        stamp += (num_nodes,)
    cached = getattr(owner, '_last_loads', None)
    if stamp is not None and cached is not None and cached[0] == stamp:
        return cached[1]
    key = None
    if all(f'grf_key_{s}' in fields for s in ('index', 'length', 'load')):
        key = GRFLoads(*(fields[f'grf_key_{s}'] for s in ('index', 'length', 'load')), num_nodes,
                       batch=batch, draw=fields.get('grf_key_draw'))
    grf = GRFLoads(fields['grf_index'], fields['grf_length'], fields['grf_load'],
                   num_nodes, batch=batch, key=key, draw=fields.get('grf_draw'))
    owner._last_loads = None if stamp is None else (stamp, grf)
    return grf


class GKATAdapter(AttentionAdapter):
    r"""GKAT attention masked by RWGNK features, :class:`pyg_grf.nn.attention.gkat.GKATAttention`
    (FTFI paper, Sec. 4.2). Needs :class:`~pyg_grf.transforms.AddRWGNKFeatures`."""

    requires = ('rwgnk_index', 'rwgnk_value')
    optional = ('rwgnk_kernel_index', 'rwgnk_kernel_value')
    hint = "add the transform pyg_grf.transforms.AddRWGNKFeatures (best as pre_transform)"

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.gkat import GKATAttention
        return GKATAttention(channels, heads=heads, dropout=dropout, **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        kernel = None
        if 'rwgnk_kernel_index' in fields and 'rwgnk_kernel_value' in fields:
            kernel = (fields['rwgnk_kernel_index'], fields['rwgnk_kernel_value'])
        return self.attn(x, fields['rwgnk_index'], fields['rwgnk_value'], batch, kernel=kernel)


class SAMSAAdapter(AttentionAdapter):
    r"""SAMSA sampling attention, :class:`pyg_grf.nn.attention.samsa.SAMSAAttention` (SAMSA
    paper, Sec. 4.2-4.4), per graph of the batch."""

    def build(self, channels, heads, dropout, **kwargs):
        from pyg_grf.nn.attention.samsa import SAMSAAttention
        return SAMSAAttention(channels, heads=heads, dropout=dropout, **kwargs)

    def forward(self, x, batch, num_graphs, fields):
        return self.attn(x, batch)


#: The attention kinds of :class:`GraphTransformer`: name -> adapter class. Explicit; to add a
#: kind, pass a custom :class:`AttentionAdapter` subclass as ``attention``.
ATTENTIONS: Dict[str, Type[AttentionAdapter]] = {
    'grf': GRFAdapter,
    'linear': LinearAdapter,
    'softmax': SoftmaxAdapter,
    'power_series': PowerSeriesAdapter,
    'grid_rpe': GridRPEAdapter,
    'performer': PerformerAdapter,
    'gkat': GKATAdapter,
    'samsa': SAMSAAdapter,
}

LOCAL_MPS = ('gine', 'gin', 'gat')
#: Layouts of the layers of :class:`GraphTransformer`.
BLOCKS = ('pre_norm', 'gps')
#: ``block='gps'``: attention name of :class:`GraphTransformer` -> ``attn_type`` of
#: :class:`~pyg_grf.nn.GRFGPSConv`. ``'performer'`` is the same FAVOR+ linear attention as in
#: ``block='pre_norm'`` (``attn_type='linear'`` with ``feature_map='favor+'``; PyG's
#: :class:`~torch_geometric.nn.attention.PerformerAttention` lets the padding of smaller graphs
#: into its normaliser), ``'softmax'`` is exact softmax attention per graph, which is
#: ``'multihead'`` (:class:`torch.nn.MultiheadAttention` with a key padding mask) there.
GPS_ATTENTIONS = {
    'grf': 'grf',
    'gkat': 'gkat',
    'linear': 'linear',
    'performer': 'linear',
    'softmax': 'multihead',
}
#: ``block='gps'``: the norms (``'layer_norm'`` is per node, as in ``block='pre_norm'``).
GPS_NORMS = ('layer_norm', 'batch_norm', None)
PES = ('rwpe', 'lappe', 'graph_bridge')
POOLINGS: Dict[str, Callable] = {
    'mean': global_mean_pool,
    'add': global_add_pool,
    'max': global_max_pool,
}
GRAPH_BRIDGE_OK = ('linear', 'softmax', 'performer', 'samsa')
NODE_ENCODERS = ('linear', 'atom', 'embedding', None)
EDGE_ENCODERS = ('linear', 'bond', 'embedding', None)


def _norm(norm: Optional[str], channels: int) -> torch.nn.Module:
    # Per-node norms (PyG's 'layer_norm' normalises over the whole graph by default).
    if norm is None:
        return torch.nn.Identity()
    if norm == 'layer_norm':
        return torch.nn.LayerNorm(channels)
    if norm == 'batch_norm':
        return torch.nn.BatchNorm1d(channels)
    if norm == 'rms_norm':
        return torch.nn.RMSNorm(channels)
    raise ValueError(f"norm must be one of 'layer_norm', 'batch_norm', 'rms_norm' or None, "
                     f"got '{norm}'")


def _two_layer_mlp(in_channels: int, hidden: int, out_channels: int, act: str,
                   dropout: float = 0.) -> MLP:
    # Linear -> act -> dropout -> Linear.
    return MLP([in_channels, hidden, out_channels], act=act, dropout=float(dropout), norm=None)


# State-dict keys of the two-layer MLPs (head, GIN/GINE inner MLP) before they were PyG MLPs:
# a torch.nn.Sequential whose linear layers were entries 0 and 3.
_OLD_MLP_KEYS = (re.compile(r'^(head|blocks\.\d+\.local_mp\.nn)\.([03])\.(weight|bias)$'),
                 {'0': 'lins.0', '3': 'lins.1'})


def _upgrade_mlp_keys(module, state_dict, prefix, *args) -> None:
    r"""Load-state-dict pre-hook of :class:`GraphTransformer`: renames the keys of checkpoints
    written before the two-layer MLPs were :class:`torch_geometric.nn.MLP`."""
    pattern, index = _OLD_MLP_KEYS
    if not isinstance(module.head, MLP):
        return
    for key in [k for k in state_dict if k.startswith(prefix)]:
        match = pattern.match(key[len(prefix):])
        if match is not None:
            name, i, param = match.groups()
            state_dict[f'{prefix}{name}.{index[i]}.{param}'] = state_dict.pop(key)


def _takes_edge_attr(conv: torch.nn.Module) -> bool:
    # Whether a message passing layer's forward has an `edge_attr` argument.
    try:
        return 'edge_attr' in inspect.signature(conv.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - forward without a signature
        return False


def _check_conv(conv: MessagePassing, C: int, edge_encoder: Optional[str]) -> None:
    # A user's local_mp instance: its sizes must fit the hidden size (where it states them).
    name = type(conv).__name__
    in_channels = getattr(conv, 'in_channels', None)
    sizes = in_channels if isinstance(in_channels, (tuple, list)) else (in_channels, )
    if any(isinstance(c, int) and c not in (-1, C) for c in sizes):
        raise ValueError(f"local_mp {conv!r} takes in_channels={in_channels}, expected "
                         f"hidden_channels={C} (it runs on the hidden node states)")
    out_channels = getattr(conv, 'out_channels', None)
    if isinstance(out_channels, int):
        heads = getattr(conv, 'heads', 1) if getattr(conv, 'concat', False) else 1
        if out_channels * heads != C:
            got = f'out_channels={out_channels}' + (f' x heads={heads}' if heads != 1 else '')
            raise ValueError(f"local_mp {conv!r} gives {got} = {out_channels * heads} "
                             f"features, expected hidden_channels={C} (its output is added to "
                             f"the residual stream)")
    edge_dim = getattr(conv, 'edge_dim', None)
    if (edge_encoder is not None and isinstance(edge_dim, int) and edge_dim != C
            and _takes_edge_attr(conv)):
        raise ValueError(f"local_mp {conv!r} has edge_dim={edge_dim}, expected "
                         f"hidden_channels={C} (edge features are encoded to hidden_channels) "
                         f"or None")
    if isinstance(conv, GINEConv) and edge_encoder is None:
        raise ValueError(f"local_mp {name} needs edge features: set edge_encoder ('linear' "
                         f"with edge_dim, 'bond' or 'embedding')")


def _check_local_mp(local_mp: Any) -> None:
    # local_mp is a name, a MessagePassing instance or None.
    if local_mp is None or isinstance(local_mp, MessagePassing):
        return
    if isinstance(local_mp, str):
        if local_mp not in LOCAL_MPS:
            raise ValueError(f"local_mp must be one of {LOCAL_MPS}, a MessagePassing instance "
                             f"or None, got '{local_mp}'")
        return
    if isinstance(local_mp, type) and issubclass(local_mp, MessagePassing):
        hint = f"pass an instance, e.g. {local_mp.__name__}(hidden_channels, ...)"
    elif isinstance(local_mp, dict):
        hint = ("a dict is a config spec: LightningCLI builds it from class_path/init_args; "
                "in Python pass the layer itself")
    else:
        hint = "other modules do not take (x, edge_index)"
    raise TypeError(f"local_mp must be one of {LOCAL_MPS}, a "
                    f"torch_geometric.nn.conv.MessagePassing instance or None, got "
                    f"{type(local_mp).__name__} ({hint})")


def _check_block(block: str, attention, norm: Optional[str], ffn_ratio: float) -> None:
    # block='gps' builds GRFGPSConv layers: the attentions, norms and MLP width they have.
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
    if block == 'pre_norm':
        return
    if not isinstance(attention, str) or attention not in GPS_ATTENTIONS:
        raise ValueError(f"block='gps' builds every layer as a GRFGPSConv, whose attention is one "
                         f"of {tuple(GPS_ATTENTIONS)}, got attention={attention!r} (use "
                         f"block='pre_norm' for it)")
    if norm not in GPS_NORMS:
        raise ValueError(f"block='gps' supports norm in {GPS_NORMS}, got {norm!r} (use "
                         f"block='pre_norm' for it)")
    if ffn_ratio != 2:
        raise ValueError(f"block='gps' uses GPSConv's MLP of width 2 * hidden_channels, so "
                         f"ffn_ratio must be 2, got {ffn_ratio}")


def _check_options(in_channels, attention, local_mp, pe, node_encoder, edge_encoder, edge_dim,
                   pooling) -> None:
    # The string options of GraphTransformer, checked up front with the allowed values.
    if isinstance(attention, str) and attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {sorted(ATTENTIONS)} (or None, or an "
                         f"AttentionAdapter subclass), got '{attention}'")
    _check_local_mp(local_mp)
    if pe is not None and pe not in PES:
        raise ValueError(f"pe must be one of {PES} or None, got '{pe}'")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {sorted(POOLINGS)} or None, "
                         f"got '{pooling}'")
    if node_encoder not in NODE_ENCODERS:
        raise ValueError(f"node_encoder must be one of {NODE_ENCODERS}, got '{node_encoder}'")
    if edge_encoder not in EDGE_ENCODERS:
        raise ValueError(f"edge_encoder must be one of {EDGE_ENCODERS}, got '{edge_encoder}'")
    if pe == 'graph_bridge' and (local_mp is not None or attention not in GRAPH_BRIDGE_OK):
        raise ValueError(f"pe='graph_bridge' turns nodes and edges into tokens, so it needs an "
                         f"attention over plain tokens {GRAPH_BRIDGE_OK} and local_mp=None, "
                         f"got attention={attention!r}, local_mp={local_mp!r}")
    if attention is None and local_mp is None:
        raise ValueError("attention and local_mp cannot both be None (the model would ignore "
                         "the graph)")
    if isinstance(local_mp, str) and local_mp == 'gine' and edge_encoder is None:
        raise ValueError("local_mp='gine' needs edge features: set edge_encoder ('linear' "
                         "with edge_dim, 'bond' or 'embedding')")
    if edge_encoder in ('linear', 'embedding') and edge_dim is None:
        raise ValueError(f"edge_encoder='{edge_encoder}' needs edge_dim")
    if node_encoder in ('linear', 'embedding') and in_channels is None:
        raise ValueError(f"node_encoder='{node_encoder}' needs in_channels")


def _encoder(kind: Optional[str], in_channels: Optional[int],
             C: int) -> Optional[torch.nn.Module]:
    # A node or edge encoder: 'linear', 'embedding', the OGB one ('atom' / 'bond') or None.
    if kind == 'linear':
        return Linear(in_channels, C)
    if kind == 'embedding':
        return torch.nn.Embedding(in_channels, C)
    if kind in ('atom', 'bond'):
        from ogb.graphproppred import mol_encoder
        return (mol_encoder.AtomEncoder if kind == 'atom' else mol_encoder.BondEncoder)(C)
    return None


def _attention_class(attention) -> Optional[Type[AttentionAdapter]]:
    if attention is None:
        return None
    if isinstance(attention, str):
        return ATTENTIONS[attention]
    if isinstance(attention, type) and issubclass(attention, AttentionAdapter):
        return attention
    raise ValueError(f"attention must be a name, an AttentionAdapter subclass or None, "
                     f"got {attention!r}")


def _embed(encoder: torch.nn.Module, kind: Optional[str], x: Tensor) -> Tensor:
    # Categorical features of an 'embedding' encoder: one column of ids, or one-hot rows.
    if kind == 'embedding':
        return encoder(x.view(-1).long() if x.dim() == 1 or x.size(-1) == 1 else x.argmax(-1))
    return encoder(x.long())  # atom / bond


class GraphTransformerBlock(torch.nn.Module):
    r"""One pre-norm block of :class:`GraphTransformer`: attention and (optionally) local
    message passing side by side on the normalised input, residual, then a residual FFN."""

    def __init__(self, channels: int, attention: Optional[AttentionAdapter],
                 local_mp: Optional[torch.nn.Module], local_mp_kind: Optional[str] = None,
                 ffn_ratio: float = 2., dropout: float = 0., act: str = 'gelu',
                 norm: Optional[str] = 'layer_norm'):
        super().__init__()
        self.channels = channels
        self.attn = attention
        self.local_mp = local_mp
        self.local_mp_kind = local_mp_kind
        self.local_mp_edge_attr = local_mp is not None and _takes_edge_attr(local_mp)
        self.dropout = dropout
        self.norm1 = _norm(norm, channels)
        self.norm2 = _norm(norm, channels)
        hidden = int(ffn_ratio * channels)
        self.ffn = Sequential(Linear(channels, hidden), activation_resolver(act), Dropout(dropout),
                              Linear(hidden, channels), Dropout(dropout))

    def reset_parameters(self):
        for module in (self.attn, self.local_mp, self.norm1, self.norm2, *self.ffn):
            if module is not None and hasattr(module, 'reset_parameters'):
                module.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Optional[Tensor], batch: Tensor,
                num_graphs: int, fields: Dict[str, Any]) -> Tensor:
        h = self.norm1(x)
        out = x
        # Global attention (never across graphs).
        if self.attn is not None:
            a = self.attn(h, batch, num_graphs, fields)
            out = out + F.dropout(a, p=self.dropout, training=self.training)
        # Local message passing beside it (GPS).
        if self.local_mp is not None:
            if self.local_mp_edge_attr and edge_attr is not None:
                m = self.local_mp(h, edge_index, edge_attr=edge_attr)
            else:
                m = self.local_mp(h, edge_index)
            if m.shape != h.shape:
                raise ValueError(f"local_mp {self.local_mp!r} returned shape {tuple(m.shape)}, "
                                 f"expected {tuple(h.shape)} ([N, hidden_channels])")
            out = out + F.dropout(m, p=self.dropout, training=self.training)
        # Feed-forward.
        return out + self.ffn(self.norm2(out))

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.channels}, attn={self.attn}, '
                f'local_mp={self.local_mp_kind})')


class GraphTransformer(torch.nn.Module):
    r"""A graph transformer with the topology-aware linear-cost attention of the `"Linear
    Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Sec. 4), in GPS-style blocks as in
    :class:`torch_geometric.nn.conv.GPSConv`, pre-norm by default
    (``block='pre_norm'``):

    .. math::
        \mathbf{x}^{(l+1)} = \mathbf{y} + \mathrm{FFN}(\mathrm{Norm}(\mathbf{y})), \quad
        \mathbf{y} = \mathbf{x}^{(l)} + \mathrm{Attn}_M(\mathrm{Norm}(\mathbf{x}^{(l)}))
        + \mathrm{MPNN}(\mathrm{Norm}(\mathbf{x}^{(l)}))

    or built from :class:`~pyg_grf.nn.GRFGPSConv` layers (``block='gps'``, the post-norm
    layout of :class:`~torch_geometric.nn.conv.GPSConv`, no final norm):

    .. math::
        \mathbf{h} = \mathrm{Norm}(\mathbf{x}^{(l)} + \mathrm{MPNN}(\mathbf{x}^{(l)}))
        + \mathrm{Norm}(\mathbf{x}^{(l)} + \mathrm{Attn}_M(\mathbf{x}^{(l)})), \quad
        \mathbf{x}^{(l+1)} = \mathrm{Norm}(\mathbf{h} + \mathrm{MLP}(\mathbf{h}))

    Args:
        in_channels (int): node feature size (for ``node_encoder='linear'``; the number of
            categories for ``'embedding'``; ignored for ``'atom'``).
        hidden_channels (int): hidden size.
        out_channels (int): output size (classes, labels or targets).
        num_layers (int): number of blocks.
        heads (int, optional): attention heads (default: :obj:`1`).
        attention (str or type, optional): one of :data:`ATTENTIONS` (``'grf'``, ``'linear'``,
            ``'softmax'``, ``'power_series'``, ``'grid_rpe'``, ``'performer'``, ``'gkat'``,
            ``'samsa'``), an
            :class:`AttentionAdapter` subclass, or :obj:`None` for no attention (a pure MPNN when
            ``local_mp`` is set) (default: :obj:`'grf'`).
        attention_kwargs (dict, optional): options of the attention layer, e.g.
            ``{'feature_map': 'relu', 'max_length': 4}`` (default: :obj:`None`).
        local_mp (str or MessagePassing, optional): local message passing beside the
            attention: ``'gine'`` (needs edge features), ``'gin'``, ``'gat'``, a
            :class:`~torch_geometric.nn.conv.MessagePassing` instance mapping
            ``hidden_channels`` to ``hidden_channels`` features (as ``conv`` of
            :class:`~torch_geometric.nn.conv.GPSConv`; every layer gets its own deep copy,
            reset by ``reset_parameters()``, and the encoded ``edge_attr`` when its ``forward``
            takes one; in a config, a ``class_path``/``init_args`` block) or :obj:`None`
            (default: :obj:`None`).
        pe (str, optional): positional encoding added to the node embedding: ``'rwpe'`` (reads
            ``data.random_walk_pe`` from :class:`~torch_geometric.transforms.AddRandomWalkPE`),
            ``'lappe'`` (``data.laplacian_eigenvector_pe`` from
            :class:`~torch_geometric.transforms.AddLaplacianEigenvectorPE`, random sign flips
            in training), ``'graph_bridge'`` (:class:`pyg_grf.nn.encoders.GraphBridge`, SAMSA
            paper Sec. 4.3: nodes *and* edges become tokens, with Gaussian-noise PEs; needs an
            attention over plain tokens and ``local_mp=None``) or :obj:`None`
            (default: :obj:`None`).
        pe_dim (int, optional): size of the stored PE (walk length / number of eigenvectors;
            the width of each noise set for Graph-Bridge) (default: :obj:`16`).
        node_encoder (str, optional): ``'linear'`` (dense features), ``'atom'`` (OGB
            :class:`AtomEncoder`, categorical ``x [N, 9]``), ``'embedding'`` (one categorical
            column) or :obj:`None` (graphs without features: one learned vector)
            (default: :obj:`'linear'`).
        edge_encoder (str, optional): ``'linear'``, ``'bond'`` (OGB :class:`BondEncoder`),
            ``'embedding'`` or :obj:`None` (default: :obj:`None`).
        edge_dim (int, optional): edge feature size for ``edge_encoder='linear'`` (categories
            for ``'embedding'``) (default: :obj:`None`).
        pooling (str, optional): ``'mean'``, ``'add'``, ``'max'``, or :obj:`None` for node-level
            outputs (default: :obj:`'mean'`).
        dropout (float, optional): dropout of the residual branches and the head
            (default: :obj:`0.`).
        attn_dropout (float, optional): dropout on the attention coefficients (the contract of
            every attention layer: whole key columns in the linear paths, see
            :func:`~pyg_grf.nn.attention.base.key_dropout`) (default: :obj:`0.`).
        ffn_ratio (float, optional): FFN hidden size / ``hidden_channels`` (default: :obj:`2.`).
        act (str, optional): activation (default: :obj:`'gelu'`).
        norm (str, optional): ``'layer_norm'``, ``'batch_norm'``, ``'rms_norm'`` or :obj:`None`
            (default: :obj:`'layer_norm'`).
        head_layers (int, optional): layers of the output MLP, ``1`` = linear
            (default: :obj:`2`).
        block (str, optional): ``'pre_norm'`` (the pre-norm blocks above) or ``'gps'`` (every
            layer a :class:`~pyg_grf.nn.GRFGPSConv` with this model's attention,
            ``attention_kwargs`` plus ``attn_dropout``, ``local_mp``, ``dropout``, ``act`` and
            ``norm``; ``attention`` in :data:`GPS_ATTENTIONS` (``'softmax'`` is
            ``attn_type='multihead'``, ``'performer'`` the same FAVOR+ linear attention as
            here), ``norm`` in :data:`GPS_NORMS` (``'layer_norm'`` per node), ``ffn_ratio=2``)
            (default: :obj:`'pre_norm'`).

    Shapes:
        - **input:** a :class:`~torch_geometric.data.Data` or
          :class:`~torch_geometric.data.Batch` with ``x`` :math:`(|\mathcal{V}|, F_{in})`,
          ``edge_index`` :math:`(2, |\mathcal{E}|)`, optional ``edge_attr``, ``batch`` and the
          fields the attention needs (e.g. ``grf_index``, ``grf_length``, ``grf_load``).
        - **output:** :math:`(B, F_{out})` with pooling, :math:`(|\mathcal{V}|, F_{out})`
          without.
    """

    def __init__(
        self,
        in_channels: Optional[int],
        hidden_channels: int,
        out_channels: int,
        num_layers: int,
        heads: int = 1,
        attention: Optional[str] = 'grf',
        attention_kwargs: Optional[Dict[str, Any]] = None,
        local_mp: Union[str, MessagePassing, None] = None,
        pe: Optional[str] = None,
        pe_dim: int = 16,
        node_encoder: Optional[str] = 'linear',
        edge_encoder: Optional[str] = None,
        edge_dim: Optional[int] = None,
        pooling: Optional[str] = 'mean',
        dropout: float = 0.,
        attn_dropout: float = 0.,
        ffn_ratio: float = 2.,
        act: str = 'gelu',
        norm: Optional[str] = 'layer_norm',
        head_layers: int = 2,
        block: str = 'pre_norm',
    ):
        super().__init__()
        self.in_channels = in_channels
        self.hidden_channels = hidden_channels
        self.out_channels = out_channels
        self.num_layers = num_layers
        self.heads = heads
        self.attention = attention
        self.attention_kwargs = dict(attention_kwargs or {})
        # A MessagePassing instance is a template (each layer gets a reset deep copy): kept as a
        # plain attribute, not a submodule, so its parameters are not the model's.
        object.__setattr__(self, 'local_mp', local_mp)
        self.pe = pe
        self.pe_dim = pe_dim
        self.node_encoder_kind = node_encoder
        self.edge_encoder_kind = edge_encoder
        self.edge_dim = edge_dim
        self.pooling = pooling
        self.dropout = dropout
        self.attn_dropout = attn_dropout
        self.ffn_ratio = ffn_ratio
        self.act = act
        self.norm = norm
        self.head_layers = head_layers
        self.block = block

        C = hidden_channels
        _check_options(in_channels, attention, local_mp, pe, node_encoder, edge_encoder, edge_dim,
                       pooling)
        _check_block(block, attention, norm, ffn_ratio)
        if isinstance(local_mp, MessagePassing):
            _check_conv(local_mp, C, edge_encoder)
        self.node_emb = None
        self.node_encoder = _encoder(node_encoder, in_channels, C)
        if self.node_encoder is None:  # graphs without features: one learned vector
            self.node_emb = torch.nn.Parameter(torch.empty(1, C))
        # Edge encoder (only read by the local message passing and Graph-Bridge).
        self.edge_encoder = _encoder(edge_encoder, edge_dim, C)
        self.pe_encoder = self._make_pe_encoder(pe, pe_dim, C, edge_encoder)
        self.attention_cls = _attention_class(attention)
        self.blocks = torch.nn.ModuleList([self._make_block() for _ in range(num_layers)])
        if 'layer_index' not in self.attention_kwargs:  # walk draws per layer (num_draws > 1)
            from pyg_grf.nn.attention.grf import GRFAttention
            for i, block in enumerate(self.blocks):
                for module in block.modules():
                    if isinstance(module, GRFAttention):
                        module.layer_index = i
        # Post-norm GPS layers end with a norm already.
        self.final_norm = _norm(norm, C) if block == 'pre_norm' else torch.nn.Identity()

        # Head.
        if head_layers == 1:
            self.head = Linear(C, out_channels)
        elif head_layers == 2:
            self.head = _two_layer_mlp(C, C, out_channels, act, dropout)
        else:
            raise ValueError(f"head_layers must be 1 or 2, got {head_layers}")

        self._register_load_state_dict_pre_hook(_upgrade_mlp_keys, with_module=True)
        self.reset_parameters()

    def _make_block(self) -> torch.nn.Module:
        C, heads = self.hidden_channels, self.heads
        if self.block == 'gps':
            return self._make_gps_layer()
        attn = None
        if self.attention_cls is not None:
            try:
                attn = self.attention_cls(C, heads=heads, dropout=self.attn_dropout,
                                          **self.attention_kwargs)
            except TypeError as exc:  # e.g. a misspelt attention_kwargs key
                raise TypeError(f"attention={self.attention!r} with attention_kwargs="
                                f"{self.attention_kwargs}: {exc}") from exc
        return GraphTransformerBlock(C, attn, self._make_local_mp(self.local_mp, C, heads),
                                     self._local_mp_kind, ffn_ratio=self.ffn_ratio,
                                     dropout=self.dropout, act=self.act, norm=self.norm)

    def _make_gps_layer(self) -> 'GRFGPSConv':
        # block='gps': one GRFGPSConv (PyG GPSConv's post-norm layout) with the model's
        # attention, attention_kwargs (+ attn_dropout), local_mp, dropout, act and norm.
        from pyg_grf.nn.conv.grf_gps_conv import GRFGPSConv
        C = self.hidden_channels
        if 'dropout' in self.attention_kwargs:
            raise TypeError(f"attention={self.attention!r} with attention_kwargs="
                            f"{self.attention_kwargs}: set the attention dropout with "
                            f"attn_dropout, not attention_kwargs['dropout']")
        attn_type = GPS_ATTENTIONS[self.attention]
        attn_kwargs = dict(self.attention_kwargs, dropout=self.attn_dropout)
        if self.attention == 'performer':
            attn_kwargs = _performer(**attn_kwargs)
        norm_kwargs = {'mode': 'node'} if self.norm == 'layer_norm' else None
        try:
            return GRFGPSConv(C, self._make_local_mp(self.local_mp, C, self.heads),
                              heads=self.heads, dropout=self.dropout, act=self.act,
                              norm=self.norm, norm_kwargs=norm_kwargs, attn_type=attn_type,
                              attn_kwargs=attn_kwargs)
        except TypeError as exc:  # e.g. a misspelt attention_kwargs key
            raise TypeError(f"attention={self.attention!r} (GRFGPSConv attn_type="
                            f"{attn_type!r}) with attention_kwargs={self.attention_kwargs}: "
                            f"{exc}") from exc

    @property
    def _local_mp_kind(self) -> Optional[str]:
        # The name of the local message passing: its kind, or the class of an instance.
        if isinstance(self.local_mp, MessagePassing):
            return type(self.local_mp).__name__
        return self.local_mp

    @staticmethod
    def _make_pe_encoder(pe: Optional[str], pe_dim: int, C: int,
                         edge_encoder: Optional[str]) -> Optional[torch.nn.Module]:
        if pe in ('rwpe', 'lappe'):
            return Linear(pe_dim, C)
        if pe == 'graph_bridge':
            from pyg_grf.nn.encoders.graph_bridge import GraphBridge
            return GraphBridge(C, C, edge_channels=C if edge_encoder else None,
                               pe_channels=pe_dim)
        return None

    def _make_local_mp(self, kind: Union[str, MessagePassing, None], C: int, heads: int):
        if kind is None:
            return None
        if isinstance(kind, MessagePassing):  # a layer's own copy, not shared with the others
            conv = copy.deepcopy(kind)
            conv.reset_parameters()
            return conv
        if kind == 'gine':
            return GINEConv(_two_layer_mlp(C, C, C, self.act), edge_dim=C)
        if kind == 'gin':
            return GINConv(_two_layer_mlp(C, C, C, self.act))
        if C % heads != 0:
            raise ValueError(f"local_mp='gat' needs hidden_channels ({C}) divisible by heads "
                             f"({heads})")
        return GATConv(C, C // heads, heads=heads,
                       edge_dim=C if self.edge_encoder_kind is not None else None)

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        for module in (self.node_encoder, self.edge_encoder, self.pe_encoder, self.final_norm):
            if module is not None and hasattr(module, 'reset_parameters'):
                module.reset_parameters()
        if self.node_emb is not None:
            torch.nn.init.normal_(self.node_emb, std=1.0)
        for block in self.blocks:
            block.reset_parameters()
        self.head.reset_parameters()

    @property
    def _uses_edge_attr(self) -> bool:
        return self.edge_encoder is not None and (self.local_mp is not None
                                                  or self.pe == 'graph_bridge')

    @property
    def requires(self) -> Tuple[str, ...]:
        r"""The batch attributes this model reads besides ``x``, ``edge_index``, ``batch``."""
        req = list(self.attention_cls.requires if self.attention_cls is not None else ())
        if self.pe == 'rwpe':
            req.append('random_walk_pe')
        elif self.pe == 'lappe':
            req.append('laplacian_eigenvector_pe')
        if self._uses_edge_attr:
            req.append('edge_attr')
        return tuple(dict.fromkeys(req))

    def _check(self, data) -> None:
        missing = [name for name in self.requires if getattr(data, name, None) is None]
        if missing:
            hint = getattr(self.attention_cls, 'hint', '')
            hints = {
                'random_walk_pe': f'add torch_geometric.transforms.AddRandomWalkPE('
                f'walk_length={self.pe_dim}, attr_name="random_walk_pe")',
                'laplacian_eigenvector_pe': f'add torch_geometric.transforms.'
                f'AddLaplacianEigenvectorPE(k={self.pe_dim}, attr_name="laplacian_eigenvector_pe")',
                'edge_attr': 'use a dataset with edge features or set edge_encoder=None',
            }
            extra = '; '.join(hints.get(name, hint) for name in missing if hints.get(name, hint))
            raise ValueError(f"{self.__class__.__name__}(attention={self.attention!r}, "
                             f"pe={self.pe!r}) needs the batch attributes {missing}, which the "
                             f"input lacks" + (f": {extra}" if extra else ''))

    def encode(self, data) -> Tensor:
        r"""Node embeddings before the blocks, ``[N, hidden_channels]``."""
        x = data.x
        if self.node_encoder is None:
            N = data.num_nodes
            h = self.node_emb.expand(N, -1)
        else:
            if x is None:
                raise ValueError(f"node_encoder='{self.node_encoder_kind}' needs data.x; for "
                                 f"graphs without node features use node_encoder=None")
            if self.node_encoder_kind == 'linear':
                if x.dim() == 1:
                    x = x.unsqueeze(-1)
                if x.size(-1) != self.in_channels:
                    raise ValueError(f"expected data.x with {self.in_channels} features "
                                     f"(in_channels), got shape {tuple(x.shape)}")
                h = self.node_encoder(x.to(self.node_encoder.weight.dtype))
            else:  # embedding, atom
                h = _embed(self.node_encoder, self.node_encoder_kind, x)

        if self.pe in ('rwpe', 'lappe'):
            pe = data.random_walk_pe if self.pe == 'rwpe' else data.laplacian_eigenvector_pe
            if pe.size(-1) != self.pe_dim:
                raise ValueError(f"expected a positional encoding of size pe_dim={self.pe_dim}, "
                                 f"got shape {tuple(pe.shape)}")
            if self.pe == 'lappe' and self.training:
                # Eigenvectors are defined up to sign: flip at random in training.
                sign = torch.randint(0, 2, (1, pe.size(-1)), device=pe.device) * 2 - 1
                pe = pe * sign
            h = h + self.pe_encoder(pe.to(self.pe_encoder.weight.dtype))
        return h

    def forward(self, data) -> Tensor:
        r"""Runs the model on a :class:`~torch_geometric.data.Data` or
        :class:`~torch_geometric.data.Batch` (never modified)."""
        self._check(data)
        edge_index = data.edge_index
        N = data.num_nodes
        batch = batch_or_zeros(getattr(data, 'batch', None), N, edge_index.device)
        num_graphs = int(getattr(data, 'num_graphs', 1) or 1)

        # Encoders.
        x = self.encode(data)
        edge_attr = None
        if self._uses_edge_attr:
            edge_attr = data.edge_attr
            if self.edge_encoder_kind == 'linear':
                if edge_attr.dim() == 1:
                    edge_attr = edge_attr.unsqueeze(-1)
                edge_attr = self.edge_encoder(edge_attr.to(self.edge_encoder.weight.dtype))
            else:  # embedding, bond
                edge_attr = _embed(self.edge_encoder, self.edge_encoder_kind, edge_attr)

        # Graph-Bridge: nodes and edges become tokens (SAMSA paper, Sec. 4.3).
        token_type = None
        if self.pe == 'graph_bridge':
            # noise precomputed by AddGraphBridgeTokens(pe_dim=...) when present, else fresh
            x, batch, token_type = self.pe_encoder(x, edge_index, edge_attr, batch,
                                                   token_type=getattr(data, 'token_type', None),
                                                   noise=getattr(data, 'bridge_noise', None))

        # Fields the attention reads, plus a per-forward cache shared by the layers.
        fields: Dict[str, Any] = {}
        if self.attention_cls is not None:
            fields = {name: data[name] for name in self.attention_cls.requires}
            # a plain Data (one graph, no batch vector): the zeros above are made anew at every
            # call, so they must not defeat the reuse of the GRF payload between steps
            fields['_one_graph'] = getattr(data, 'batch', None) is None
            for name in self.attention_cls.optional:
                if getattr(data, name, None) is not None:
                    fields[name] = data[name]

        # Blocks.
        if self.block == 'gps':
            x = self._gps_layers(x, edge_index, edge_attr, batch, fields)
        else:
            for block in self.blocks:
                x = block(x, edge_index, edge_attr, batch, num_graphs, fields)
        x = self.final_norm(x)

        # Readout.
        if self.pooling is None and token_type is not None:
            x = x[token_type == 0]  # node tokens, in node order
        if self.pooling is not None:
            x = POOLINGS[self.pooling](x, batch, size=num_graphs)
        return self.head(x)

    def _gps_layers(self, x: Tensor, edge_index: Tensor, edge_attr: Optional[Tensor],
                    batch: Tensor, fields: Dict[str, Any]) -> Tensor:
        # block='gps': the GRFGPSConv layers, with what their attention and conv read.
        grf = rwgnk = None
        if self.attention == 'grf':  # validated and precomputed once, for all layers
            grf = _grf_loads(self, x.size(0), batch, fields)
        elif self.attention == 'gkat':
            names = GKATAdapter.requires
            if all(name in fields for name in GKATAdapter.optional):
                names = names + GKATAdapter.optional
            rwgnk = tuple(fields[name] for name in names)
        kwargs = {}  # edge features go to the local conv when it takes them
        conv = self.blocks[0].conv if len(self.blocks) > 0 else None
        if edge_attr is not None and conv is not None and _takes_edge_attr(conv):
            kwargs['edge_attr'] = edge_attr
        for layer in self.blocks:
            x = layer(x, edge_index, batch, grf=grf, rwgnk=rwgnk, **kwargs)
        return x

    def __repr__(self) -> str:
        block = f', block={self.block!r}' if self.block != 'pre_norm' else ''
        return (f'{self.__class__.__name__}({self.in_channels}, {self.hidden_channels}, '
                f'{self.out_channels}, num_layers={self.num_layers}, heads={self.heads}, '
                f'attention={self.attention!r}, local_mp={self.local_mp!r}, pe={self.pe!r}, '
                f'pooling={self.pooling!r}{block})')
