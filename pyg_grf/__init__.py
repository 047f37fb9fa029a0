r"""pyg_grf: topology-aware linear-cost graph transformers for PyTorch Geometric.

Subpackages: :mod:`pyg_grf.walks`, :mod:`pyg_grf.features`, :mod:`pyg_grf.masks`,
:mod:`pyg_grf.nn`, :mod:`pyg_grf.transforms`, :mod:`pyg_grf.datasets`, :mod:`pyg_grf.lightning`.
"""
__version__ = '0.1.0'
