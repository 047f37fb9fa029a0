r"""Transforms that store random-walk graph features on PyG ``Data`` objects, and
:class:`Standardize` for regression data."""
from pyg_grf.transforms.graph_bridge import AddGraphBridgeTokens
from pyg_grf.transforms.grf import AddGraphRandomFeatures
from pyg_grf.transforms.rwgnk import AddRWGNKFeatures
from pyg_grf.transforms.standardize import Standardize
from pyg_grf.transforms.subgraph import (
    RestrictGraphRandomFeatures,
    grf_prefixes,
    subgraph_grf,
)

__all__ = [
    'AddGraphRandomFeatures', 'AddRWGNKFeatures', 'AddGraphBridgeTokens',
    'RestrictGraphRandomFeatures', 'Standardize', 'subgraph_grf', 'grf_prefixes',
]
