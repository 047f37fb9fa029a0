r"""The options of :class:`~pyg_grf.nn.GraphTransformer`: allowed values, their checks (each error
says what was expected and what came) and the encoders."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor
from torch.nn import Linear
from torch_geometric.nn import MLP, GINEConv, global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.nn.conv import MessagePassing

from pyg_grf.nn.attention.base import GraphAttention
from pyg_grf.nn.attention.registry import ATTENTIONS
from pyg_grf.nn.conv.grf_gps_conv import takes

#: The names ``conv`` of :class:`GraphTransformer` takes (besides a MessagePassing instance).
CONVS = ('gine', 'gin', 'gat')
#: Layouts of the layers of :class:`GraphTransformer`: ``'pre_norm'`` or ``'gps'`` (PyG
#: GPSConv's post-norm layout).
BLOCKS = ('pre_norm', 'gps')
PES = ('rwpe', 'lappe', 'graph_bridge')
POOLINGS: Dict[str, Callable] = {
    'mean': global_mean_pool,
    'add': global_add_pool,
    'max': global_max_pool,
}
#: Attentions over plain tokens (no graph payload), for ``pe='graph_bridge'``.
GRAPH_BRIDGE_OK = ('linear', 'favor', 'softmax', 'multihead', 'performer', 'samsa')
NODE_ENCODERS = ('linear', 'atom', 'embedding', None)
EDGE_ENCODERS = ('linear', 'bond', 'embedding', None)


def check_conv(conv: MessagePassing, C: int, edge_encoder: Optional[str]) -> None:
    r"""A user's ``conv`` instance: its sizes must fit the hidden size (where it states
    them)."""
    name = type(conv).__name__
    in_channels = getattr(conv, 'in_channels', None)
    sizes = in_channels if isinstance(in_channels, (tuple, list)) else (in_channels, )
    if any(isinstance(c, int) and c not in (-1, C) for c in sizes):
        raise ValueError(f"conv {conv!r} takes in_channels={in_channels}, expected "
                         f"hidden_channels={C} (it runs on the hidden node states)")
    out_channels = getattr(conv, 'out_channels', None)
    if isinstance(out_channels, int):
        heads = getattr(conv, 'heads', 1) if getattr(conv, 'concat', False) else 1
        if out_channels * heads != C:
            got = f'out_channels={out_channels}' + (f' x heads={heads}' if heads != 1 else '')
            raise ValueError(f"conv {conv!r} gives {got} = {out_channels * heads} "
                             f"features, expected hidden_channels={C} (its output is added to "
                             f"the residual stream)")
    edge_dim = getattr(conv, 'edge_dim', None)
    if (edge_encoder is not None and isinstance(edge_dim, int) and edge_dim != C
            and takes(conv, 'edge_attr')):
        raise ValueError(f"conv {conv!r} has edge_dim={edge_dim}, expected "
                         f"hidden_channels={C} (edge features are encoded to hidden_channels) "
                         f"or None")
    if isinstance(conv, GINEConv) and edge_encoder is None:
        raise ValueError(f"conv {name} needs edge features: set edge_encoder ('linear' "
                         f"with edge_dim, 'bond' or 'embedding')")


def check_conv_kind(conv: Any) -> None:
    r"""``conv`` is a name, a MessagePassing instance or None."""
    if conv is None or isinstance(conv, MessagePassing):
        return
    if isinstance(conv, str):
        if conv not in CONVS:
            raise ValueError(f"conv must be one of {CONVS}, a MessagePassing instance or None, "
                             f"got '{conv}'")
        return
    if isinstance(conv, type) and issubclass(conv, MessagePassing):
        hint = f"pass an instance, e.g. {conv.__name__}(hidden_channels, ...)"
    elif isinstance(conv, dict):
        hint = ("a dict is a config spec: LightningCLI builds it from class_path/init_args; "
                "in Python pass the layer itself")
    else:
        hint = "other modules do not take (x, edge_index)"
    raise TypeError(f"conv must be one of {CONVS}, a torch_geometric.nn.conv.MessagePassing "
                    f"instance or None, got {type(conv).__name__} ({hint})")


def check_options(in_channels, attn_type, conv, pe, node_encoder, edge_encoder, edge_dim,
                  pooling, block) -> None:
    r"""The string options of :class:`GraphTransformer`, checked up front with the allowed
    values."""
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
    if isinstance(attn_type, str) and attn_type not in ATTENTIONS:
        hint = (" (a nested '=null' on the command line reaches the model as the string "
                "'None': write null in a YAML config, e.g. a second --config file)"
                if attn_type == 'None' else '')
        raise ValueError(f"attn_type must be one of {sorted(ATTENTIONS)} (or None, or a "
                         f"GraphAttention subclass), got '{attn_type}'{hint}")
    if not (attn_type is None or isinstance(attn_type, str) or (
            isinstance(attn_type, type) and issubclass(attn_type, GraphAttention))):
        raise ValueError(f"attn_type must be a name, a GraphAttention subclass or None, "
                         f"got {attn_type!r}")
    check_conv_kind(conv)
    if pe is not None and pe not in PES:
        raise ValueError(f"pe must be one of {PES} or None, got '{pe}'")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {sorted(POOLINGS)} or None, "
                         f"got '{pooling}'")
    if node_encoder not in NODE_ENCODERS:
        raise ValueError(f"node_encoder must be one of {NODE_ENCODERS}, got '{node_encoder}'")
    if edge_encoder not in EDGE_ENCODERS:
        raise ValueError(f"edge_encoder must be one of {EDGE_ENCODERS}, got '{edge_encoder}'")
    if pe == 'graph_bridge' and (conv is not None or attn_type not in GRAPH_BRIDGE_OK):
        raise ValueError(f"pe='graph_bridge' turns nodes and edges into tokens, so it needs an "
                         f"attention over plain tokens {GRAPH_BRIDGE_OK} and conv=None, "
                         f"got attn_type={attn_type!r}, conv={conv!r}")
    if attn_type is None and conv is None:
        raise ValueError("attn_type and conv cannot both be None (the model would ignore "
                         "the graph)")
    if isinstance(conv, str) and conv == 'gine' and edge_encoder is None:
        raise ValueError("conv='gine' needs edge features: set edge_encoder ('linear' "
                         "with edge_dim, 'bond' or 'embedding')")
    if edge_encoder in ('linear', 'embedding') and edge_dim is None:
        raise ValueError(f"edge_encoder='{edge_encoder}' needs edge_dim")
    if node_encoder in ('linear', 'embedding') and in_channels is None:
        raise ValueError(f"node_encoder='{node_encoder}' needs in_channels")


def encoder(kind: Optional[str], in_channels: Optional[int],
            C: int) -> Optional[torch.nn.Module]:
    r"""A node or edge encoder: ``'linear'``, ``'embedding'``, the OGB one (``'atom'`` /
    ``'bond'``) or :obj:`None`."""
    if kind == 'linear':
        return Linear(in_channels, C)
    if kind == 'embedding':
        return torch.nn.Embedding(in_channels, C)
    if kind in ('atom', 'bond'):
        from ogb.graphproppred import mol_encoder
        return (mol_encoder.AtomEncoder if kind == 'atom' else mol_encoder.BondEncoder)(C)
    return None


def embed(module: torch.nn.Module, kind: Optional[str], x: Tensor) -> Tensor:
    r"""Features through the encoder ``module`` of their ``kind``: ``'linear'`` (dense, a 1-D
    ``x`` is one column), ``'embedding'`` (one column of ids, or one-hot rows) or OGB's."""
    if kind == 'linear':
        x = x.unsqueeze(-1) if x.dim() == 1 else x
        return module(x.to(module.weight.dtype))
    if kind == 'embedding':
        return module(x.view(-1).long() if x.dim() == 1 or x.size(-1) == 1 else x.argmax(-1))
    return module(x.long())  # atom / bond


def two_layer_mlp(in_channels: int, hidden: int, out_channels: int, act: str,
                  dropout: float = 0.) -> MLP:
    r"""Linear -> act -> dropout -> Linear, as PyG's :class:`~torch_geometric.nn.MLP`."""
    return MLP([in_channels, hidden, out_channels], act=act, dropout=float(dropout), norm=None)
