r"""Attention layers, all called as ``attn(x, batch, **attn.payload(data))``
(:class:`~pyg_grf.nn.attention.base.GraphAttention`), and the one registry of their names
(:mod:`pyg_grf.nn.attention.registry`)."""
from pyg_grf.nn.attention.base import GraphAttention
from pyg_grf.nn.attention.gkat import GKATAttention
from pyg_grf.nn.attention.grf import GRFAttention
from pyg_grf.nn.attention.grid import GridRPEAttention
from pyg_grf.nn.attention.masked import MaskedLinearAttention
from pyg_grf.nn.attention.padded import PaddedMultiheadAttention, PaddedPerformerAttention
from pyg_grf.nn.attention.reference import LinearAttention, PowerSeriesAttention, SoftmaxAttention
from pyg_grf.nn.attention.registry import ATTENTIONS, attention_class, attention_resolver
from pyg_grf.nn.attention.samsa import SAMSAAttention

__all__ = [
    'GraphAttention', 'GKATAttention', 'GRFAttention', 'GridRPEAttention', 'LinearAttention',
    'MaskedLinearAttention', 'PaddedMultiheadAttention', 'PaddedPerformerAttention',
    'PowerSeriesAttention', 'SoftmaxAttention', 'SAMSAAttention', 'ATTENTIONS', 'attention_class',
    'attention_resolver',
]
