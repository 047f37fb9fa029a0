r"""RWGNK mask :math:`M = \Psi\Psi^\top` of GKAT (FTFI paper, Sec. 4.2, Eq. 5)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from pyg_grf._validation import check_index_range
from pyg_grf.masks.base import MaskOperator
from pyg_grf.ops import SparsePattern, spmm


class RWGNKMask(MaskOperator):
    r"""The RWGNK kernel matrix as a mask,
    :math:`M = \mathcal{K}^{\lambda,\alpha}_p = \Psi\Psi^\top` (FTFI paper, Sec. 4.2), with
    :math:`\Psi` the sparse matrix of RWGNK features (rows :math:`\Psi(h)`, see
    :func:`pyg_grf.features.rwgnk_features`).

    :math:`MX = \Psi(\Psi^\top X)` costs two sparse products, :math:`O(\mathrm{nnz}(\Psi)\,C)`;
    :math:`M` is never formed. Both products go through :func:`pyg_grf.ops.spmm`, so the result
    is differentiable in :math:`X` and in the values of :math:`\Psi`.

    Args:
        psi (Tensor): sparse ``[N, S]`` (COO or CSR) feature matrix :math:`\Psi`.
    """

    def __init__(self, psi: Tensor):
        if not isinstance(psi, Tensor) or not psi.is_sparse and psi.layout != torch.sparse_csr:
            raise ValueError(f"'psi' must be a sparse COO or CSR tensor, got "
                             f"{getattr(psi, 'layout', type(psi).__name__)}")
        if psi.dim() != 2:
            raise ValueError(f"'psi' must have shape [N, S], got {tuple(psi.shape)}")
        if psi.layout == torch.sparse_csr:
            psi = psi.to_sparse_coo()
        psi = psi.coalesce()
        self._init(psi.indices(), psi.values(), tuple(psi.shape))

    def _init(self, index: Tensor, value: Tensor, size) -> None:
        self.index = index
        self.value = value
        self.size = (int(size[0]), int(size[1]))
        self.num_nodes = self.size[0]
        self.pattern = SparsePattern(index, self.size)

    @classmethod
    def from_index(cls, index: Tensor, value: Tensor, num_nodes: int,
                   num_cols: Optional[int] = None) -> 'RWGNKMask':
        r"""Builds the mask from the ``rwgnk_index`` ``[2, nnz]`` and ``rwgnk_value`` ``[nnz]``
        stored by :class:`~pyg_grf.transforms.AddRWGNKFeatures` (duplicates are summed).

        Args:
            index (Tensor): ``[2, nnz]`` (start node, visited node).
            value (Tensor): ``[nnz]`` feature values (may carry gradients).
            num_nodes (int): :math:`N`.
            num_cols (int, optional): columns of :math:`\Psi` (default: ``num_nodes``).
        """
        if index.dim() != 2 or index.size(0) != 2:
            raise ValueError(f"'index' must have shape [2, nnz], got {tuple(index.shape)}")
        if value.dim() != 1 or value.numel() != index.size(1):
            raise ValueError(f"'value' must have shape [{index.size(1)}] to match 'index', got "
                             f"{tuple(value.shape)}")
        num_cols = num_nodes if num_cols is None else num_cols
        if num_cols == num_nodes:  # one cached check of the whole tensor
            check_index_range(index, num_nodes, "'index'", 'num_nodes')
        else:
            check_index_range(index[0], num_nodes, "'index' (row)", 'num_nodes')
            check_index_range(index[1], num_cols, "'index' (column)", 'num_cols')
        self = cls.__new__(cls)
        self._init(index.long(), value, (num_nodes, num_cols))
        return self

    def _matmul(self, x: Tensor) -> Tensor:
        value = self.value.to(x.dtype)
        return spmm(self.pattern, value, spmm(self.pattern, value, x, transpose=True))

    def psi_dense(self) -> Tensor:
        r"""The dense ``[N, S]`` feature matrix :math:`\Psi` (tests and references only)."""
        return self.pattern.to_dense(self.value)

    def to_dense(self) -> Tensor:
        psi = self.psi_dense()
        return psi @ psi.t()

    def __repr__(self) -> str:
        return f'RWGNKMask(num_nodes={self.num_nodes}, nnz={self.index.size(1)})'
