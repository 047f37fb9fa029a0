r"""RWGNK mask :math:`M = \Psi\Psi^\top` of GKAT (FTFI paper, Sec. 4.2, Eq. 5)."""
from __future__ import annotations

import torch
from torch import Tensor

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
        self.index, self.value = psi.indices(), psi.values()
        self.size = (int(psi.size(0)), int(psi.size(1)))
        self.num_nodes = self.size[0]
        self.pattern = SparsePattern(self.index, self.size)

    def _matmul(self, x: Tensor) -> Tensor:
        value = self.value.to(x.dtype)
        return spmm(self.pattern, value, spmm(self.pattern, value, x, transpose=True))

    def to_dense(self) -> Tensor:
        psi = self.pattern.to_dense(self.value)
        return psi @ psi.t()

    def __repr__(self) -> str:
        return f'RWGNKMask(num_nodes={self.num_nodes}, nnz={self.index.size(1)})'
