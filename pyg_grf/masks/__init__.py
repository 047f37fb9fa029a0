r"""Mask operators: every mask with a fast mask-times-matrix product (FTFI paper, Lemma 2.1)."""
from pyg_grf.masks.base import DenseMask, LowRankMask, MaskOperator
from pyg_grf.masks.packing import PackingMask

__all__ = [
    'MaskOperator',
    'DenseMask',
    'LowRankMask',
    'PackingMask',
]
