r"""The one registry of attention types: a name means one layer everywhere
(the ``attn_type`` of :class:`~pyg_grf.nn.GRFGPSConv` and of
:class:`~pyg_grf.nn.GraphTransformer`), and every layer is called as
``attn(x, batch, **attn.payload(data))``
(:class:`~pyg_grf.nn.attention.base.GraphAttention`).

==================  =============================================================  ==========
name                layer                                                          cost
==================  =============================================================  ==========
``'grf'``           :class:`~pyg_grf.nn.GRFAttention` (needs ``grf=``)             O(N)
``'gkat'``          :class:`~pyg_grf.nn.GKATAttention` (needs ``rwgnk=``)          O(N)
``'linear'``        :class:`~pyg_grf.nn.LinearAttention`, unmasked per graph       O(N)
``'favor'``         the same with FAVOR+ features (``num_features=``)              O(N)
``'softmax'``       :class:`~pyg_grf.nn.SoftmaxAttention` (SDPA, padded per graph) O(sum n^2)
``'multihead'``     :class:`torch.nn.MultiheadAttention`, padded as PyG's GPSConv  O(sum n^2)
``'performer'``     PyG's ``PerformerAttention``, padded as PyG's GPSConv          O(N)
``'power_series'``  :class:`~pyg_grf.nn.PowerSeriesAttention` (exact GRF mask)     O(L E m d)
``'grid_rpe'``      :class:`~pyg_grf.nn.GridRPEAttention`                          O(N log N)
``'samsa'``         :class:`~pyg_grf.nn.SAMSAAttention`                            O(N k)
==================  =============================================================  ==========
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Union

import torch

#: Attention type name -> ``'module:Class'`` of its layer (imported when first used).
ATTENTIONS: Dict[str, str] = {
    'grf': 'pyg_grf.nn.attention.grf:GRFAttention',
    'gkat': 'pyg_grf.nn.attention.gkat:GKATAttention',
    'linear': 'pyg_grf.nn.attention.reference:LinearAttention',
    'favor': 'pyg_grf.nn.attention.reference:LinearAttention',
    'softmax': 'pyg_grf.nn.attention.reference:SoftmaxAttention',
    'multihead': 'pyg_grf.nn.attention.padded:PaddedMultiheadAttention',
    'performer': 'pyg_grf.nn.attention.padded:PaddedPerformerAttention',
    'power_series': 'pyg_grf.nn.attention.reference:PowerSeriesAttention',
    'grid_rpe': 'pyg_grf.nn.attention.grid:GridRPEAttention',
    'samsa': 'pyg_grf.nn.attention.samsa:SAMSAAttention',
}


def attention_class(name: str) -> type:
    r"""The layer class of the attention type ``name``."""
    if name not in ATTENTIONS:
        raise ValueError(f"unknown attention type {name!r}: expected one of "
                         f"{sorted(ATTENTIONS)}, or an attention module")
    module, cls = ATTENTIONS[name].split(':')
    return getattr(importlib.import_module(module), cls)


def attention_resolver(attn: Union[str, torch.nn.Module], channels: int, heads: int = 1,
                       **kwargs: Any) -> torch.nn.Module:
    r"""Builds the attention layer of type ``attn`` (a name of :data:`ATTENTIONS`) as
    ``Layer(channels, heads=heads, **kwargs)``; a module is returned as it is (then
    ``kwargs`` must be empty). Argument errors name the type and the arguments."""
    if isinstance(attn, torch.nn.Module):
        if kwargs:
            raise TypeError(f"attention arguments {sorted(kwargs)} given with an attention "
                            f"module ({attn.__class__.__name__}): set them on the module")
        return attn
    if not isinstance(attn, str):
        raise TypeError(f"the attention must be a name of {sorted(ATTENTIONS)} or a "
                        f"torch.nn.Module, got {type(attn).__name__}")
    cls = attention_class(attn)
    if attn == 'favor':  # LinearAttention with FAVOR+ features, num_features of them
        fm_kwargs = dict(kwargs.pop('feature_map_kwargs', None) or {})
        num_features = kwargs.pop('num_features', None)
        if num_features is not None:
            fm_kwargs['num_features'] = num_features
        kwargs = dict(kwargs, feature_map='favor+', feature_map_kwargs=fm_kwargs)
    try:
        return cls(channels, heads=heads, **kwargs)
    except TypeError as exc:  # e.g. a misspelt argument
        raise TypeError(f"attention {attn!r} ({cls.__name__}) with arguments {kwargs}: "
                        f"{exc}") from exc
