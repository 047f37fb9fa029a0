r"""The options of :class:`~pyg_grf.nn.GraphTransformer`: allowed values, their checks (each error
says what was expected and what came), the encoders, the renames of old argument names and old
attention names, and the upgrade of old checkpoints' keys."""
from __future__ import annotations

import argparse
import re
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch.nn import Linear
from torch_geometric.nn import (MLP, GINEConv, global_add_pool, global_max_pool,
                                global_mean_pool)
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


class AttentionAdapter(GraphAttention):
    r"""Deprecated: the old way to add an attention kind to :class:`GraphTransformer` (a module
    with ``build(channels, heads, dropout, **kwargs)`` and ``forward(x, batch, num_graphs,
    fields)``). Pass a :class:`~pyg_grf.nn.attention.base.GraphAttention` subclass instead
    (``forward(x, batch=None, *, <payload>)`` and :meth:`payload`). Still works for one release:
    its payload is ``num_graphs`` and ``fields`` (the attributes in :attr:`requires` and
    :attr:`optional`)."""

    payload_keys = ('num_graphs', 'fields')

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

    def payload(self, data: Any) -> Dict[str, Any]:
        fields = {name: data[name] for name in self.payload_fields(data)}
        return {'num_graphs': int(getattr(data, 'num_graphs', 1) or 1), 'fields': fields}

    def __repr__(self) -> str:
        return repr(self.attn)


#: The default of the deprecated argument names of :class:`GraphTransformer`, meaning "not
#: given". It is :data:`argparse.SUPPRESS`, so that jsonargparse (LightningCLI) leaves these
#: arguments out of parsed and saved configs, and so out of checkpoints' hyperparameters, unless
#: a config names them.
NOT_GIVEN = argparse.SUPPRESS
#: Old argument names of :class:`GraphTransformer` -> the names of PyG's
#: :class:`~torch_geometric.nn.conv.GPSConv` (and :class:`~pyg_grf.nn.GRFGPSConv`) it takes now.
RENAMED_ARGS = {'attention': 'attn_type', 'attention_kwargs': 'attn_kwargs', 'local_mp': 'conv'}
#: The defaults of the new names: a new name left at its default gives way to its old name.
_NEW_DEFAULTS = {'attn_type': 'grf', 'attn_kwargs': None, 'conv': None}


def is_given(value: Any) -> bool:
    r"""Whether a deprecated argument was given (its default is :data:`NOT_GIVEN`)."""
    return not (isinstance(value, str) and value == NOT_GIVEN)


def _same(a: Any, b: Any, name: str) -> bool:
    if name == 'attn_kwargs':  # None and {} are the same options
        return dict(a or {}) == dict(b or {})
    if isinstance(a, torch.nn.Module) or isinstance(b, torch.nn.Module):
        return a is b
    return type(a) is type(b) and a == b


def rename_arguments(new: Dict[str, Any], old: Dict[str, Any], owner: str = 'GraphTransformer',
                     stacklevel: int = 3) -> Dict[str, Any]:
    r"""The arguments :obj:`new` (``attn_type``, ``attn_kwargs``, ``conv``) with the deprecated
    ones of :obj:`old` (``attention``, ``attention_kwargs``, ``local_mp``, :data:`NOT_GIVEN`
    where not given) moved to their new names, with one :class:`FutureWarning` naming the new
    names. An old name whose new name is given too with another value raises a
    :class:`TypeError` (a new name at its default, as a parsed config holds it, counts as not
    given)."""
    new = dict(new)
    used = [name for name, value in old.items() if is_given(value)]
    for name in used:
        target, value = RENAMED_ARGS[name], old[name]
        if not (_same(new[target], _NEW_DEFAULTS[target], target)
                or _same(new[target], value, target)):
            raise TypeError(f"{owner} got both {target}={new[target]!r} and {name}={value!r} "
                            f"(the deprecated name of {target}): expected only {target}")
        new[target] = value
    if used:
        uses = ', '.join(f'{RENAMED_ARGS[name]}= instead of {name}=' for name in used)
        what = f"argument {used[0]} is" if len(used) == 1 else \
            f"arguments {', '.join(used)} are"
        warnings.warn(f"{owner}'s {what} renamed as in PyG's GPSConv (the old names work until "
                      f"the next release): use {uses}", FutureWarning, stacklevel=stacklevel)
    return new


def resolve_attention(attention: Any, block: str) -> Any:
    r"""The registry name of an old :class:`GraphTransformer` attention name (with a
    :class:`FutureWarning`): ``'performer'`` was FAVOR+ linear attention per graph (now
    ``'favor'``; ``'performer'`` is PyG's ``PerformerAttention`` everywhere), and with
    ``block='gps'`` ``'softmax'`` was :class:`torch.nn.MultiheadAttention` (now
    ``'multihead'``; ``'softmax'`` is :class:`~pyg_grf.nn.SoftmaxAttention` everywhere)."""
    if attention == 'performer':
        warnings.warn("GraphTransformer(attn_type='performer') is FAVOR+ linear attention per "
                      "graph, now named 'favor' (in the next release 'performer' will mean "
                      "PyG's PerformerAttention, as in GRFGPSConv): use attn_type='favor'",
                      FutureWarning, stacklevel=3)
        return 'favor'
    if attention == 'softmax' and block == 'gps':
        warnings.warn("GraphTransformer(block='gps', attn_type='softmax') builds "
                      "torch.nn.MultiheadAttention, now named 'multihead' (in the next release "
                      "'softmax' will mean SoftmaxAttention in every layout): use "
                      "attn_type='multihead'", FutureWarning, stacklevel=3)
        return 'multihead'
    if isinstance(attention, type) and issubclass(attention, AttentionAdapter):
        warnings.warn("custom AttentionAdapter subclasses are deprecated: pass a "
                      "pyg_grf.nn.attention.GraphAttention subclass (forward(x, batch, *, "
                      "<payload>) and payload(data))", FutureWarning, stacklevel=3)
    return attention


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
    r"""Categorical features through an ``'embedding'`` (one column of ids, or one-hot rows)
    or an OGB encoder."""
    if kind == 'embedding':
        return module(x.view(-1).long() if x.dim() == 1 or x.size(-1) == 1 else x.argmax(-1))
    return module(x.long())  # atom / bond


def two_layer_mlp(in_channels: int, hidden: int, out_channels: int, act: str,
                  dropout: float = 0.) -> MLP:
    r"""Linear -> act -> dropout -> Linear, as PyG's :class:`~torch_geometric.nn.MLP`."""
    return MLP([in_channels, hidden, out_channels], act=act, dropout=float(dropout), norm=None)


# Checkpoints of older layouts: regex on the key (after the model's prefix) -> replacement.
_RENAMES: Tuple[Tuple[re.Pattern, str], ...] = (
    # pre-norm blocks before they were GRFGPSConv layers
    (re.compile(r'^blocks\.(\d+)\.local_mp\.'), r'blocks.\1.conv.'),
    (re.compile(r'^blocks\.(\d+)\.ffn\.'), r'blocks.\1.mlp.'),
    # two-layer MLPs before they were PyG MLPs (entries 0 and 3 of a Sequential)
    (re.compile(r'^(head|blocks\.\d+\.conv\.nn)\.0\.(weight|bias)$'), r'\1.lins.0.\2'),
    (re.compile(r'^(head|blocks\.\d+\.conv\.nn)\.3\.(weight|bias)$'), r'\1.lins.1.\2'),
)
_ADAPTER_KEY = re.compile(r'^blocks\.(\d+)\.attn\.attn\.')
_NORM_KEY = re.compile(r'^(blocks\.\d+\.norm[123]|final_norm)\.'
                       r'(weight|bias|running_mean|running_var|num_batches_tracked)$')


def upgrade_state_dict(module: torch.nn.Module, state_dict: Dict[str, Any], prefix: str,
                       *args: Any) -> None:
    r"""Load-state-dict pre-hook of :class:`GraphTransformer`: renames the keys of checkpoints
    written by older layouts (pre-norm blocks with an attention adapter, ``local_mp`` (now
    ``conv``) and ``ffn``; ``torch.nn.BatchNorm1d`` norms; ``Sequential`` MLPs) to the current
    ones."""
    adapters = {str(i) for i, b in enumerate(module.blocks)
                if isinstance(getattr(b, 'attn', None), AttentionAdapter)}
    keys = [k[len(prefix):] for k in state_dict if k.startswith(prefix)]
    if (any(k.startswith('blocks.') for k in keys) and len(module.final_norm.state_dict()) > 0
            and not any(k.startswith('final_norm.') for k in keys)):
        # written by the releases whose pre-norm models lost their final norm to a shadowed
        # variable (2026-11-25, commits 9360f7e..the GRFGPSConv rebuild): keep their function
        warnings.warn("this checkpoint has no final norm (written by a pyg_grf version whose "
                      "pre-norm GraphTransformer skipped it by mistake): loading it without "
                      "one, as it was trained", UserWarning, stacklevel=2)
        module.final_norm = torch.nn.Identity()
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = key[len(prefix):]
        for pattern, repl in _RENAMES:
            new = pattern.sub(repl, new)
        match = _ADAPTER_KEY.match(new)
        if match and match.group(1) not in adapters:
            new = _ADAPTER_KEY.sub(r'blocks.\1.attn.', new)
        match = _NORM_KEY.match(new)
        if match and hasattr(_submodule(module, match.group(1)), 'module'):  # PyG BatchNorm
            new = f'{match.group(1)}.module.{match.group(2)}'
        if new != key[len(prefix):]:
            state_dict[prefix + new] = state_dict.pop(key)


def _submodule(module: torch.nn.Module, path: str) -> Optional[torch.nn.Module]:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None
