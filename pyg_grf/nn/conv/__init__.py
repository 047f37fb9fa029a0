r"""PyG-shaped layers that host this package's attentions."""
from pyg_grf.nn.conv.grf_gps_conv import GRFGPSConv

__all__ = ['GRFGPSConv']
