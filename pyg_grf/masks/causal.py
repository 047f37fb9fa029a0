r"""Causal (lower-triangular) mask (FTFI paper, Sec. 3.1: the prefix-sum mask of causal linear
attention, the simplest mask with a fast product)."""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator


class CausalMask(MaskOperator):
    r"""Lower-triangular all-ones mask, :math:`M_{ij} = 1` if :math:`j \le i` else :math:`0`.

    :math:`(MX)_i = \sum_{j \le i} X_j` is a prefix sum along the node dimension, :math:`O(NC)`
    time and memory (FTFI paper, Sec. 3.1, Lemma 2.1 with :math:`T_M(N) = O(N)`).
    The order is the node order of the input; in a PyG batch this mixes graphs, so use it on one
    sequence (or combine it with a per-graph ordering yourself).

    Args:
        num_nodes (int): :math:`N`.
    """

    def __init__(self, num_nodes: int):
        if int(num_nodes) != num_nodes or num_nodes < 0:
            raise ValueError(f"'num_nodes' must be a non-negative integer, got {num_nodes!r}")
        self.num_nodes = int(num_nodes)

    def _matmul(self, x: Tensor) -> Tensor:
        return torch.cumsum(x, dim=0)

    def to_dense(self) -> Tensor:
        return torch.ones(self.num_nodes, self.num_nodes).tril_()
