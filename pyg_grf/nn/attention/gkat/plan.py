r"""The per-batch plan of GKAT: :class:`RWGNKPlan`, built once per batch by a pure function of
the data and the layers that will read it (FTFI paper, Sec. 4.2: the RWGNK features
:math:`\Psi`, Eq. 5, and the kernel :math:`\mathcal{K} = \Psi\Psi^\top` on its nonzeros)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import check_index_range, check_shape
from pyg_grf.features.loads import GRFLoads, narrow_index
from pyg_grf.features.rwgnk import rwgnk_kernel
from pyg_grf.nn.attention.base import pin, unchanged
from pyg_grf.nn.attention.grf.plan import GRFPlan, LayerSpec, build_part, same_as
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
    ``Data`` do not change it. It is immutable, moves with :meth:`to` and pickles compactly, so
    DataLoader workers can build it, and it is used only while it :meth:`matches` the data. The
    linear layers run on the GRF engine: :math:`\Psi` as walk loads of hop 0 (the exact kernel,
    :math:`\mathcal{K} = \Psi\Psi^\top`), or the kernel pairs themselves as hop-0 loads of an
    asymmetric mask (a cut kernel), in :attr:`grf`. A layer given a plan without the structure
    it needs builds that structure for the call only.
    """
    num_nodes: int
    psi_index: Tensor            # [2, nnz] (start node, visited node), row-major
    psi_value: Tensor            # [nnz]
    ptr: Tensor                  # [B + 1] graph boundaries (nodes of a graph are contiguous)
    pairs: Optional[KernelPairs] = None
    stored_pairs: Optional[Tuple[Tensor, Tensor]] = None  # AddRWGNKFeatures' pairs, as given
    grf: Optional[GRFPlan] = None  # the linear layers' plan on the GRF engine
    grf_threshold: float = 0.0     # the kernel threshold that plan was built for
    source: Optional[tuple] = None  # (names, pin(), copies): the data it was built from

    @classmethod
    def build(cls, data: Any, layers: Iterable[Any] = (), prefix: str = 'rwgnk') -> 'RWGNKPlan':
        r"""The plan of ``data`` (a ``Data`` or ``Batch`` with ``{prefix}_index`` and
        ``{prefix}_value`` from :class:`~pyg_grf.transforms.AddRWGNKFeatures`, and
        ``{prefix}_kernel_index`` / ``_value`` when the transform stored the kernel pairs) for
        the GKAT ``layers`` that will read it: the kernel pairs of the softmax layers, the GRF
        engine's structures of the linear ones."""
        missing = [f'{prefix}_{s}' for s in ('index', 'value')
                   if getattr(data, f'{prefix}_{s}', None) is None]
        if missing:
            raise ValueError(f"the data has no RWGNK features {missing}: add the transform "
                             f"pyg_grf.transforms.AddRWGNKFeatures (best as pre_transform)")
        names = [f'{prefix}_{s}' for s in ('index', 'value', 'kernel_index', 'kernel_value')]
        pinned = pin(data, names + ['ptr'])
        fields = [t for _, t, _ in pinned[:-1]]
        plan = cls.from_tensors(*fields[:2], data.num_nodes, *fields[2:4], ptr=fields[4],
                                layers=layers)
        reference = tuple(None if t is None else t.detach().clone() for t in fields)
        return replace(plan, source=(names + ['ptr'], pinned, reference))

    @classmethod
    def from_tensors(cls, index: Tensor, value: Tensor, num_nodes: Optional[int] = None,
                     kernel_index: Optional[Tensor] = None,
                     kernel_value: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                     layers: Iterable[Any] = ()) -> 'RWGNKPlan':
        r"""The plan of :math:`\Psi` given as tensors (``num_nodes``: :math:`N`, by default one
        more than the largest index: every node visits itself, :math:`\Psi_{ii} > 0`)."""
        check_shape(index, 'rwgnk_index', 2, 'nnz')
        check_shape(value, 'rwgnk_value', index.size(1))
        if (kernel_index is None) != (kernel_value is None):
            raise ValueError("the kernel pairs need both 'rwgnk_kernel_index' and "
                             "'rwgnk_kernel_value'")
        if kernel_index is not None:
            check_shape(kernel_index, 'rwgnk_kernel_index', 2, 'P')
            check_shape(kernel_value, 'rwgnk_kernel_value', kernel_index.size(1))
        if num_nodes is None:
            num_nodes = int(index.max()) + 1 if index.numel() > 0 else 0
        N = int(num_nodes)
        check_index_range(index, N, "'rwgnk_index'", 'num_nodes')
        if kernel_index is not None:
            check_index_range(kernel_index, N, "'rwgnk_kernel_index'", 'num_nodes')
        with torch.inference_mode(False):  # a plan built for evaluation still serves training
            index, value, _ = _row_major(index, value, N)
            if ptr is None:
                ptr = torch.tensor([0, N], device=index.device)
            stored = None if kernel_index is None else (
                narrow_index(kernel_index, N, copy=True), _values(kernel_value))
            plan = cls(N, narrow_index(index, N, copy=True), _values(value),
                       narrow_index(ptr, N + 1, copy=True), None, stored)
            layers = list(layers)
            soft = [layer for layer in layers if layer.mode == 'softmax']
            if soft:
                plan = replace(plan, pairs=plan.kernel_pairs(soft[0].threshold))
            linear = [layer for layer in layers if layer.mode == 'linear']
            if linear:  # one GRF plan for the linear layers (the first one's threshold)
                t = linear[0].threshold
                loads = plan.grf_loads(t)
                specs = dict.fromkeys(layer.spec(plan.exact and layer.threshold == 0)
                                      for layer in linear if layer.threshold == t)
                built = {}
                plan = replace(plan, grf=GRFPlan(loads, {s: build_part(loads, s, built)
                                                         for s in specs}), grf_threshold=t)
        return plan

    def grf_loads(self, threshold: float) -> GRFLoads:
        r"""The mask as GRF walk loads of hop 0: :math:`\Psi` (its symmetric mask is the exact
        kernel) or, for a cut kernel, the kernel pairs (its asymmetric mask is the kernel)."""
        batch = torch.repeat_interleave(torch.arange(self.num_graphs, device=self.ptr.device),
                                        self.ptr.diff().long(), output_size=self.num_nodes)
        if self.exact and threshold == 0:
            index, value = self.psi_index, self.psi_value
        else:
            kp = self.kernel_pairs(threshold)
            index, value = kp.index, kp.value
        return GRFLoads(index, torch.zeros(value.numel(), dtype=torch.uint8,
                                           device=value.device), value, self.num_nodes,
                        batch=batch if self.num_graphs > 1 else None, max_length=0)

    def linear_part(self, spec: LayerSpec, threshold: float):
        r"""The GRF engine's part of a linear layer of configuration ``spec``: this plan's
        when it holds it, else built for this call (not kept)."""
        if self.grf is not None and self.grf_threshold == threshold and spec in self.grf.parts:
            return self.grf.parts[spec]
        return build_part(self.grf_loads(threshold), spec)

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

    def matches(self, data: Any) -> bool:
        r"""Whether this plan was built from the RWGNK features, kernel pairs and graph
        boundaries ``data`` holds now: the same tensors, unchanged, or (after a move or a
        pickle) equal ones, compared once."""
        if self.source is None:
            return False
        names, pinned, reference = self.source
        now = pin(data, names)
        if unchanged(now, pinned):
            return True
        checks: list = []
        if data.num_nodes != self.num_nodes or not all(
                same_as(a, ref, checks) for (_, a, _), ref in zip(now, reference)) or (
                checks and not bool(torch.stack(checks).all())):
            return False
        object.__setattr__(self, 'source', (names, now, reference))
        return True

    def covers(self, layers: Iterable[Any]) -> bool:
        r"""Whether the plan holds what every layer of ``layers`` reads."""
        for layer in layers:
            if layer.mode == 'softmax' and (self.pairs is None
                                            or self.pairs.threshold != layer.threshold):
                return False
            if layer.mode == 'linear' and (
                    self.grf is None or self.grf_threshold != layer.threshold
                    or layer.spec(self.exact and layer.threshold == 0) not in self.grf.parts):
                return False
        return True

    @property
    def psi_nnz(self) -> int:
        return self.psi_index.size(1)

    @property
    def num_graphs(self) -> int:
        return self.ptr.numel() - 1

    @property
    def exact(self) -> bool:
        r"""Whether the mask is all of :math:`\Psi\Psi^\top` (no stored pairs, which may have
        been cut at a threshold): only then can it run as :math:`\Psi\Psi^\top` (and the
        low-rank fallback)."""
        return self.stored_pairs is None

    @property
    def device(self) -> torch.device:
        return self.psi_index.device

    def to(self, device: Any = None, *args, non_blocking: bool = False,
           **kwargs) -> 'RWGNKPlan':
        r"""The plan on ``device``; ``Data.to()`` calls it for a plan the data carries."""
        device = torch.device(device)
        if device == self.device:
            return self
        move = (lambda t: None if t is None else t.to(device))  # noqa: E731
        source = None if self.source is None else (  # compared by value after the move
            self.source[0], None, tuple(move(t) for t in self.source[2]))
        return RWGNKPlan(self.num_nodes, move(self.psi_index), move(self.psi_value),
                         move(self.ptr), None if self.pairs is None else self.pairs.to(device),
                         None if self.stored_pairs is None else tuple(
                             move(t) for t in self.stored_pairs),
                         None if self.grf is None else self.grf.to(device), self.grf_threshold,
                         source)

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

    def __repr__(self) -> str:
        pairs = '' if self.pairs is None else (f', pairs={self.pairs.index.size(1)}'
                                               f'@{self.pairs.threshold:g}')
        stored = '' if self.stored_pairs is None else \
            f', stored_pairs={self.stored_pairs[0].size(1)}'
        return (f'RWGNKPlan(num_nodes={self.num_nodes}, graphs={self.num_graphs}, '
                f'psi_nnz={self.psi_nnz}{pairs}{stored})')
