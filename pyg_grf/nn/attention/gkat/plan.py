r"""The per-batch plan of GKAT: :class:`RWGNKPlan`, built once per batch by a pure function of
the data and the layers that will read it (FTFI paper, Sec. 4.2: the RWGNK features
:math:`\Psi`, Eq. 5, and the kernel :math:`\mathcal{K} = \Psi\Psi^\top` on its nonzeros)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Iterable, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import check_index_range
from pyg_grf.features.loads import narrow_index
from pyg_grf.features.rwgnk import kernel_products, rwgnk_kernel
from pyg_grf.nn.attention.gkat.choose import needs_pairs
from pyg_grf.ops import SparsePattern


def _values(value: Tensor) -> Tensor:
    # float32 unless the features are float64 (a float64 reference keeps its precision)
    return value.detach().to(torch.float64 if value.dtype == torch.float64 else torch.float32,
                             copy=True)


def _row_major(index: Tensor, value: Tensor, N: int) -> Tuple[Tensor, Tensor, SparsePattern]:
    # the entries in row-major order and their pattern (built without a sort); contiguous
    # rows: torch's COO-to-CSR conversion misreads strided index rows
    index = index.long().contiguous()
    pattern = SparsePattern(index, (N, N))
    if pattern.perm is not None:
        index, value = index[:, pattern.perm], value[pattern.perm]
        pattern = SparsePattern(index, (N, N), _trusted=True)
    return index, value, pattern


@dataclass(frozen=True, eq=False)
class KernelPairs:
    r"""The support of the mask: the pairs :math:`(i, j)` with :math:`|\mathcal{K}_{ij}| >`
    ``threshold`` in row-major order, their kernel values, and their prepared
    :class:`~pyg_grf.ops.SparsePattern` (CSR views, forward and transposed)."""
    index: Tensor      # [2, P] int32 where it fits
    value: Tensor      # [P]
    threshold: float
    pattern: SparsePattern

    @classmethod
    def make(cls, index: Tensor, value: Tensor, num_nodes: int,
             threshold: float) -> 'KernelPairs':
        if threshold > 0:
            keep = value.abs() > threshold
            index, value = index[:, keep], value[keep]
        index, value, pattern = _row_major(index, value, num_nodes)
        pattern.prepare()  # shared by all heads
        return cls(narrow_index(index, num_nodes, copy=True), _values(value), float(threshold),
                   pattern)

    def to(self, device) -> 'KernelPairs':
        return _unpickle_pairs(self.index.to(device), self.value.to(device), self.threshold,
                               self.pattern.size)

    def __reduce__(self):  # the pattern is rebuilt from the index: nothing heads-sized pickled
        return (_unpickle_pairs, (self.index, self.value, self.threshold, self.pattern.size))


def _unpickle_pairs(index, value, threshold, size):
    return KernelPairs(index, value, threshold, SparsePattern(index, size, _trusted=True))


@dataclass(frozen=True, eq=False)
class RWGNKPlan:
    r"""What every GKAT layer of a batch reads, built once per batch by a pure function of the
    data and the layers: the RWGNK features :math:`\Psi` (FTFI paper, Sec. 4.2, Eq. 5) as a
    prepared sparse pattern with its values, the graph boundaries, and, when a layer's backend
    needs them, the kernel pairs :math:`\{(i, j): |\mathcal{K}_{ij}| > t\}` of
    :math:`\mathcal{K} = \Psi\Psi^\top` (:class:`KernelPairs`).

    Like PyG's ``GCNConv(cached=True)``, the plan owns copies of its tensors (int32 indices where
    the sizes allow, float32 values unless the features are float64), so later edits of the
    ``Data`` do not change it. It is immutable, moves with :meth:`to` and pickles compactly (no
    per-head structures), so DataLoader workers can build it. A layer given a plan without the
    structure its backend needs builds that structure for the call only.
    """
    num_nodes: int
    psi_index: Tensor            # [2, nnz] (start node, visited node), row-major
    psi_value: Tensor            # [nnz]
    psi: SparsePattern           # the prepared pattern of Psi (CSR and its transpose)
    ptr: Tensor                  # [B + 1] graph boundaries (nodes of a graph are contiguous)
    kernel_products: int         # sum_i c_i^2: products of Psi Psi^T, bounds the pairs
    pairs: Optional[KernelPairs] = None
    stored_pairs: Optional[Tuple[Tensor, Tensor]] = None  # AddRWGNKFeatures' pairs, as given


    @classmethod
    def build(cls, data: Any, layers: Iterable[Any] = (), prefix: str = 'rwgnk') -> 'RWGNKPlan':
        r"""The plan of ``data`` (a ``Data`` or ``Batch`` with ``{prefix}_index`` and
        ``{prefix}_value`` from :class:`~pyg_grf.transforms.AddRWGNKFeatures`, and
        ``{prefix}_kernel_index`` / ``_value`` when the transform stored the kernel pairs) for
        the GKAT ``layers`` that will read it: the kernel pairs are built when one of them may
        run on them (its backend, or ``'auto'`` and the cost rule of :mod:`.choose`)."""
        missing = [f'{prefix}_{s}' for s in ('index', 'value')
                   if getattr(data, f'{prefix}_{s}', None) is None]
        if missing:
            raise ValueError(f"the data has no RWGNK features {missing}: add the transform "
                             f"pyg_grf.transforms.AddRWGNKFeatures (best as pre_transform)")
        stored = (getattr(data, f'{prefix}_kernel_index', None),
                  getattr(data, f'{prefix}_kernel_value', None))
        ptr = getattr(data, 'ptr', None)
        return cls.from_tensors(data[f'{prefix}_index'], data[f'{prefix}_value'],
                                data.num_nodes, *stored, ptr=ptr, layers=layers)

    @classmethod
    def from_tensors(cls, index: Tensor, value: Tensor, num_nodes: Optional[int] = None,
                     kernel_index: Optional[Tensor] = None,
                     kernel_value: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                     layers: Iterable[Any] = ()) -> 'RWGNKPlan':
        r"""The plan of :math:`\Psi` given as tensors (``num_nodes``: :math:`N`, by default one
        more than the largest index: every node visits itself, :math:`\Psi_{ii} > 0`)."""
        if not isinstance(index, Tensor) or index.dim() != 2 or index.size(0) != 2:
            raise ValueError(f"'rwgnk_index' must have shape [2, nnz], got {_shape(index)}")
        if not isinstance(value, Tensor) or value.shape != (index.size(1), ):
            raise ValueError(f"'rwgnk_value' must have shape [{index.size(1)}] to match "
                             f"'rwgnk_index', got {_shape(value)}")
        if (kernel_index is None) != (kernel_value is None):
            raise ValueError("the kernel pairs need both 'rwgnk_kernel_index' and "
                             "'rwgnk_kernel_value'")
        if kernel_index is not None and (
                kernel_index.dim() != 2 or kernel_index.size(0) != 2
                or kernel_value.shape != (kernel_index.size(1), )):
            raise ValueError(f"the kernel pairs must be (index [2, P], value [P]), got shapes "
                             f"{_shape(kernel_index)} and {_shape(kernel_value)}")
        if num_nodes is None:
            num_nodes = int(index.max()) + 1 if index.numel() > 0 else 0
        N = int(num_nodes)
        check_index_range(index, N, "'rwgnk_index'", 'num_nodes')
        if kernel_index is not None:
            check_index_range(kernel_index, N, "'rwgnk_kernel_index'", 'num_nodes')
        index, value, psi = _row_major(index, value, N)
        psi._transpose()  # the CSR view of Psi^T, prepared once
        if ptr is None:
            ptr = torch.tensor([0, N], device=index.device)
        stored = None if kernel_index is None else (narrow_index(kernel_index, N, copy=True),
                                                    _values(kernel_value))
        plan = cls(N, narrow_index(index, N, copy=True), _values(value), psi,
                   narrow_index(ptr, N + 1, copy=True), kernel_products(index, N), None, stored)
        # the kernel pairs, when one of the layers may run on them
        users = [layer for layer in layers if needs_pairs(layer, plan)]
        if not users:
            return plan
        return replace(plan, pairs=plan.kernel_pairs(users[0].threshold))

    def kernel_pairs(self, threshold: float) -> KernelPairs:
        r"""The kernel pairs above ``threshold``: this plan's when it holds them for that
        threshold, else built now (the stored pairs when the data had them, else
        :func:`rwgnk_kernel`); not kept."""
        if self.pairs is not None and self.pairs.threshold == threshold:
            return self.pairs
        if self.stored_pairs is not None:
            return KernelPairs.make(*self.stored_pairs, self.num_nodes, threshold)
        index, value = rwgnk_kernel(self.psi_index, self.psi_value, self.num_nodes, threshold)
        return KernelPairs.make(index, value, self.num_nodes, threshold)

    @property
    def psi_nnz(self) -> int:
        return self.psi_index.size(1)

    @property
    def num_graphs(self) -> int:
        return self.ptr.numel() - 1

    @cached_property
    def max_graph_nodes(self) -> int:  # one host read per plan, kept by to()
        return int(self.ptr.diff().max()) if self.num_graphs > 0 else 0

    @property
    def exact(self) -> bool:
        r"""Whether the mask is all of :math:`\Psi\Psi^\top` (no stored pairs, which may have
        been cut at a threshold): only then can the low-rank ``'sparse'`` backend run."""
        return self.stored_pairs is None

    @property
    def device(self) -> torch.device:
        return self.psi_index.device

    def to(self, device) -> 'RWGNKPlan':
        r"""The plan on ``device``."""
        stored = None if self.stored_pairs is None else tuple(t.to(device)
                                                             for t in self.stored_pairs)
        plan = _unpickle_plan(self.num_nodes, self.psi_index.to(device),
                              self.psi_value.to(device), self.ptr.to(device),
                              self.kernel_products,
                              None if self.pairs is None else self.pairs.to(device), stored)
        plan.__dict__['max_graph_nodes'] = self.max_graph_nodes  # read where ptr is
        return plan

    def repeat(self, copies: int, layers: Iterable[Any] = ()) -> 'RWGNKPlan':
        r"""The plan of ``copies`` disjoint copies of this graph (copy ``c`` on nodes
        ``c * N + i``), e.g. for ``x`` of shape ``[B, n, C]`` on one shared graph."""
        N = self.num_nodes
        if self.num_graphs != 1:
            raise ValueError(f"x of shape [B, n, C] needs the plan of one graph, got a plan of "
                             f"{self.num_graphs} graphs")

        def rep(index: Tensor) -> Tensor:
            off = torch.arange(copies, device=index.device).repeat_interleave(index.size(1))
            return index.long().repeat(1, copies) + off * N
        stored = None if self.stored_pairs is None else (
            rep(self.stored_pairs[0]), self.stored_pairs[1].repeat(copies))
        ptr = torch.arange(copies + 1, device=self.ptr.device) * N
        return RWGNKPlan.from_tensors(rep(self.psi_index), self.psi_value.repeat(copies),
                                      copies * N, *(stored or (None, None)), ptr=ptr,
                                      layers=layers)

    def __reduce__(self):  # patterns are rebuilt from the indices: compact pickles
        return (_unpickle_plan, (self.num_nodes, self.psi_index, self.psi_value, self.ptr,
                                 self.kernel_products, self.pairs, self.stored_pairs))

    def __repr__(self) -> str:
        pairs = '' if self.pairs is None else (f', pairs={self.pairs.index.size(1)}'
                                               f'@{self.pairs.threshold:g}')
        stored = '' if self.stored_pairs is None else \
            f', stored_pairs={self.stored_pairs[0].size(1)}'
        return (f'RWGNKPlan(num_nodes={self.num_nodes}, graphs={self.num_graphs}, '
                f'psi_nnz={self.psi_nnz}{pairs}{stored})')


def _unpickle_plan(num_nodes, index, value, ptr, products, pairs, stored):
    psi = SparsePattern(index, (num_nodes, num_nodes), _trusted=True)
    psi._transpose()
    return RWGNKPlan(num_nodes, index, value, psi, ptr, products, pairs, stored)


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__
