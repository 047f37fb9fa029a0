r"""Neural-network modules: attention layers, encoders, models."""
from pyg_grf.nn.attention.base import model_payload, prepare_payload
from pyg_grf.nn.attention.gkat import GKATAttention
from pyg_grf.nn.attention.grf import GRFAttention
from pyg_grf.nn.attention.grid import GridRPEAttention
from pyg_grf.nn.attention.masked import MaskedLinearAttention
from pyg_grf.nn.attention.reference import LinearAttention, PowerSeriesAttention, SoftmaxAttention
from pyg_grf.nn.attention.samsa import SAMSAAttention
from pyg_grf.nn.conv.grf_gps_conv import GRFGPSConv
from pyg_grf.nn.encoders.graph_bridge import GraphBridge
from pyg_grf.nn.feature_maps import ELUFeatureMap, FAVORPlus, ReLUFeatureMap, feature_map_resolver
from pyg_grf.nn.models.graph_transformer import GraphTransformer
from pyg_grf.nn.models.node import GRFNodeModel

__all__ = [
    'GRFAttention', 'GridRPEAttention', 'MaskedLinearAttention', 'LinearAttention',
    'PowerSeriesAttention', 'SoftmaxAttention', 'ReLUFeatureMap', 'ELUFeatureMap', 'FAVORPlus',
    'feature_map_resolver', 'GKATAttention', 'SAMSAAttention', 'GraphBridge', 'GraphTransformer',
    'GRFGPSConv', 'GRFNodeModel', 'model_payload', 'prepare_payload',
]
