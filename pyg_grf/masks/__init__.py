r"""Mask operators: every mask with a fast mask-times-matrix product (FTFI paper, Lemma 2.1)."""
from pyg_grf.masks.base import DenseMask, LowRankMask, MaskOperator
from pyg_grf.masks.causal import CausalMask
from pyg_grf.masks.diffusion import DiffusionKernelMask
from pyg_grf.masks.grf import GRFMask
from pyg_grf.masks.grid import GridRPE, GridRPEMask
from pyg_grf.masks.packing import PackingMask
from pyg_grf.masks.rwgnk import RWGNKMask
from pyg_grf.masks.sum import SumMask
from pyg_grf.masks.toeplitz import ToeplitzMask
from pyg_grf.masks.tree import TreeMask

__all__ = [
    'MaskOperator', 'DenseMask', 'LowRankMask', 'PackingMask', 'GRFMask', 'RWGNKMask',
    'CausalMask', 'ToeplitzMask', 'GridRPEMask', 'GridRPE', 'TreeMask', 'DiffusionKernelMask',
    'SumMask',
]
