r"""Attention layers."""
from pyg_grf.nn.attention.gkat import GKATAttention
from pyg_grf.nn.attention.grf import GRFAttention
from pyg_grf.nn.attention.masked import MaskedLinearAttention
from pyg_grf.nn.attention.samsa import SAMSAAttention
from pyg_grf.nn.attention.reference import LinearAttention, PowerSeriesAttention, SoftmaxAttention

__all__ = [
    'GKATAttention',
    'GRFAttention',
    'LinearAttention',
    'MaskedLinearAttention',
    'PowerSeriesAttention',
    'SoftmaxAttention',
    'SAMSAAttention',
]
