r"""GRF masks: :math:`M = \widehat\Phi_Q \widehat\Phi_K^\top` with sparse graph random features,
applied as two sparse products and never formed (GRF paper, Eq. 6-8, Corollary 3.3)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from pyg_grf.features.loads import GRFLoads
from pyg_grf.masks.base import MaskOperator
from pyg_grf.ops import SparsePattern, spmm


class _Features:
    """One sparse feature matrix [N, N] with values [nnz] or [H, nnz] on a shared pattern."""

    def __init__(self, pattern: SparsePattern, values: Tensor):
        self.pattern, self.values = pattern, values

    @property
    def num_heads(self):
        return self.values.size(0) if self.values.dim() == 2 else None

    def mm(self, x: Tensor, transpose: bool) -> Tensor:
        # x: [N, C], values [nnz] (a shared mask: MaskOperator.matmul folds the heads into C)
        return spmm(self.pattern, self.values, x, transpose)

    def mm_heads(self, x: Tensor, transpose: bool) -> Tensor:
        # x: [H * N, C] head-major; one block-diagonal product for all heads.
        H = self.values.size(0)
        return spmm(self.pattern.repeat(H), self.pattern.repeat_values(self.values), x, transpose)

    def to_dense(self) -> Tensor:
        if self.values.dim() == 1:
            return self.pattern.to_dense(self.values)
        return torch.stack([self.pattern.to_dense(v) for v in self.values])


def _from_sparse(phi: Union[Tensor, Sequence[Tensor]]) -> _Features:
    if isinstance(phi, Tensor):
        phis = [phi]
        single = True
    else:
        phis = list(phi)
        single = False
        if len(phis) == 0:
            raise ValueError("'phi' must be a sparse tensor or a non-empty list of them")
    for p in phis:
        if not isinstance(p, Tensor) or p.dim() != 2 or p.size(0) != p.size(1):
            raise ValueError(f"every GRF matrix must be a square [N, N] tensor, got "
                             f"{tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__}")
        if p.shape != phis[0].shape:
            raise ValueError(f"all heads' GRF matrices must have the same shape, got "
                             f"{tuple(phis[0].shape)} and {tuple(p.shape)}")
    N = phis[0].size(0)
    coo = [(p if p.layout == torch.sparse_coo else p.to_sparse_coo()).coalesce() for p in phis]
    if single:
        return _Features(SparsePattern(coo[0].indices(), (N, N)), coo[0].values())
    # Per-head matrices: union pattern, values [H, nnz] (zeros where a head has no entry).
    index = torch.cat([c.indices() for c in coo], 1)
    key = index[0] * N + index[1]
    uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
    vals = torch.zeros(len(coo), uniq.numel(), dtype=coo[0].values().dtype, device=index.device)
    off = 0
    for h, c in enumerate(coo):  # loop over heads
        vals[h].index_add_(0, inv[off:off + c._nnz()], c.values())
        off += c._nnz()
    pattern = SparsePattern(torch.stack([uniq // N, uniq % N]), (N, N))
    return _Features(pattern, vals)


class GRFMask(MaskOperator):
    r"""Topological mask from graph random features (GRF paper, Sec. 3.3, Eq. 7-8).

    .. math::
        M = \widehat\Phi_Q \widehat\Phi_K^\top, \qquad MX = \widehat\Phi_Q(\widehat\Phi_K^\top X)

    in :math:`O(\mathrm{nnz}\cdot C)`, never forming the :math:`N \times N` matrix. Because walks
    never leave a connected component, the mask is block-diagonal over the graphs of a PyG batch.

    * symmetric (default): :math:`\widehat\Phi_K = \widehat\Phi_Q = \widehat\Phi`; off the
      diagonal :math:`\mathbb{E}[M] = \sum_k (f * f)_k W^k`; on the diagonal the same walks meet
      themselves, which adds the estimator's variance (pass ``key_phi`` from independent walks
      for an unbiased diagonal);
    * ``key_phi``: a second, independent :math:`\widehat\Phi_K` (same :math:`f`);
    * ``asymmetric=True`` (App. D): key features one-hot, :math:`M = \widehat\Phi` with
      :math:`f = \alpha`; one sparse product.

    Args:
        phi (Tensor or list of Tensor): sparse ``[N, N]`` GRFs (COO or CSR), or one per head.
        key_phi (Tensor or list, optional): independent key-side GRFs.
        asymmetric (bool): use :math:`M = \widehat\Phi` (default: :obj:`False`).
    """

    def __init__(self, phi: Union[Tensor, Sequence[Tensor]],
                 key_phi: Optional[Union[Tensor, Sequence[Tensor]]] = None,
                 asymmetric: bool = False):
        self._init(_from_sparse(phi), None if key_phi is None else _from_sparse(key_phi),
                   asymmetric)

    def _init(self, q: _Features, k: Optional[_Features], asymmetric: bool):
        if asymmetric and k is not None:
            raise ValueError("'asymmetric=True' uses one-hot key features: do not pass 'key_phi'")
        if k is not None:
            if k.pattern.size != q.pattern.size:
                raise ValueError(f"'key_phi' must have the shape of 'phi' {q.pattern.size}, got "
                                 f"{k.pattern.size}")
            if k.num_heads != q.num_heads:
                raise ValueError(f"'key_phi' has {k.num_heads} heads but 'phi' has {q.num_heads}")
        self.query, self.key, self.asymmetric = q, k, asymmetric
        self.num_nodes = q.pattern.size[0]
        self.num_heads = q.num_heads

    @classmethod
    def from_loads(cls, grf_index: Union[Tensor, GRFLoads], grf_length: Optional[Tensor] = None,
                   grf_load: Optional[Tensor] = None, f: Optional[Tensor] = None,
                   num_nodes: Optional[int] = None, asymmetric: bool = False) -> 'GRFMask':
        r"""Builds the mask from the loads stored by
        :class:`~pyg_grf.transforms.AddGraphRandomFeatures` (a
        :class:`~pyg_grf.features.GRFLoads`, with its key side if any, or the three tensors and
        ``num_nodes``) and a (learnable) ``f`` of shape ``[L + 1]`` or ``[H, L + 1]``; the
        values :math:`\sum_l f_l\,\mathrm{load}(i, q, l)` are differentiable in ``f``."""
        if f is None:
            raise ValueError("'f' (the coefficients, [L + 1] or [H, L + 1]) is required")
        grf = grf_index
        if not isinstance(grf, GRFLoads):
            if num_nodes is None:
                raise ValueError("'num_nodes' is required with the three-tensor form")
            grf = GRFLoads(grf_index, grf_length, grf_load, num_nodes)
        q = _loads_features(grf, f)
        k = None if grf.key is None else _loads_features(grf.key, f)
        self = cls.__new__(cls)
        self._init(q, k, asymmetric)
        return self

    @property
    def pattern(self) -> SparsePattern:
        return self.query.pattern

    def _matmul(self, x: Tensor) -> Tensor:
        k = None if self.asymmetric else (self.key if self.key is not None else self.query)
        if self.num_heads is None:
            y = x if k is None else k.mm(x, transpose=True)
            return self.query.mm(y, transpose=False)
        # Per-head values: all heads in one block-diagonal product on the head-major input.
        N, H, C = x.shape
        y = x.transpose(0, 1).reshape(H * N, C)
        if k is not None:
            y = k.mm_heads(y, transpose=True)
        return self.query.mm_heads(y, transpose=False).view(H, N, C).transpose(0, 1)

    def to_dense(self) -> Tensor:
        q = self.query.to_dense()
        if self.asymmetric:
            return q
        k = q if self.key is None else self.key.to_dense()
        return q @ k.transpose(-1, -2)

    def __repr__(self) -> str:
        heads = '' if self.num_heads is None else f', heads={self.num_heads}'
        kind = 'asymmetric' if self.asymmetric else (
            'independent_keys' if self.key is not None else 'symmetric')
        return (f'GRFMask(num_nodes={self.num_nodes}, nnz={self.pattern.nnz}{heads}, '
                f'mode={kind})')


def _loads_features(loads: GRFLoads, f: Tensor) -> _Features:
    index, inv = loads.pairs()
    N = loads.num_nodes
    return _Features(SparsePattern(index, (N, N), _trusted=True),
                     loads.pair_values(f, inv, index.size(1)))
