r"""Transforms that store random-walk graph features on PyG ``Data`` objects."""
from pyg_grf.transforms.grf import AddGraphRandomFeatures
from pyg_grf.transforms.graph_bridge import AddGraphBridgeTokens
from pyg_grf.transforms.rwgnk import AddRWGNKFeatures

__all__ = [
    'AddGraphRandomFeatures',
    'AddRWGNKFeatures',
    'AddGraphBridgeTokens',
]
