r"""The per-batch plan of the GRF layers (:class:`GRFPlan`): built once by a pure function of
the loads and the layers' configurations, then only read; like PyG's ``GCNConv(cached=True)``
it owns its tensors, so later edits of the ``Data`` change nothing in it."""
from __future__ import annotations

from collections import Counter
from types import MappingProxyType
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import batch_or_zeros
from pyg_grf.features.loads import GRFLoads
from pyg_grf.masks.packing import PackingLayout, packing_layout
from pyg_grf.nn.attention.grf import choose, dense, pairs, sparse

#: The module of every backend: ``build``, ``memory``, ``linear_sums`` (and ``softmax``).
BACKEND_MODULES = {'sparse': sparse, 'pairs': pairs, 'dense': dense}


class LayerSpec(NamedTuple):
    r"""What a GRF layer's plan part depends on (:meth:`GRFAttention.spec
    <pyg_grf.nn.GRFAttention.spec>`)."""
    mode: str                       # 'symmetric' | 'asymmetric' | 'sparse_softmax'
    backend: str                    # as configured: 'auto' or a backend name
    heads: int
    m: int                          # feature size per head
    d: int                          # value size per head
    draws: Optional[Tuple[int, ...]]  # walk draw per head (None: all heads share the walks)
    dtype: torch.dtype
    max_length: int                 # the largest hop with a coefficient


class PlanPart(NamedTuple):
    r"""The structures one layer configuration runs on."""
    backend: str     # 'auto' resolved
    groups: int      # heads folded into the nodes (walks per head), else 1
    structures: Any  # the backend module's build()

    def to(self, device) -> 'PlanPart':
        return self._replace(structures=self.structures.to(device))


class GRFPlan:
    r"""The plan of one batch for the GRF layers of a model: its validated loads and, for
    every layer configuration it was built for (:class:`LayerSpec`), the structures of the
    backend that configuration runs (:class:`PlanPart`, shared by the layers that need the
    same). A layer handed a plan without its configuration builds that part for the call and
    keeps nothing. It moves with :meth:`to` and pickles compactly, so
    :class:`pyg_grf.loader.DataLoader` builds it in its worker processes::

        plan = GRFPlan.build(batch, layers)   # once per batch
        out = layer(x, batch.batch, grf=plan)

    Attributes:
        loads (GRFLoads): the batch's loads.
        parts (Mapping[LayerSpec, PlanPart]): read-only.
        layout (PackingLayout): the graphs of the batch in padded blocks (for the global
            term, :func:`~pyg_grf.nn.functional.packed_linear_attention`).
    """

    __slots__ = ('loads', 'parts', 'layout')

    def __init__(self, loads: GRFLoads, parts: Mapping[LayerSpec, PlanPart],
                 layout: Optional[PackingLayout] = None):
        if not isinstance(loads, GRFLoads):
            raise TypeError(f"'loads' must be a GRFLoads, got {type(loads).__name__}")
        object.__setattr__(self, 'loads', loads)
        object.__setattr__(self, 'parts', MappingProxyType(dict(parts)))
        if layout is None:
            batch = batch_or_zeros(loads.batch, loads.num_nodes, loads.device)
            with torch.inference_mode(False):
                layout = packing_layout(batch, loads.num_graphs)
        object.__setattr__(self, 'layout', layout)

    def __setattr__(self, name, value):
        raise AttributeError("a GRFPlan is immutable: build a new one for new data")

    def __reduce__(self):
        return (GRFPlan, (self.loads, dict(self.parts), self.layout))

    @classmethod
    def build(cls, data: Any, layers: Iterable[Any] = ()) -> 'GRFPlan':
        r"""The plan of ``data`` for ``layers``.

        Args:
            data (Data, Batch or GRFLoads): the batch (with the attributes of
                :class:`~pyg_grf.transforms.AddGraphRandomFeatures` under the layers'
                ``attr_prefix``, else ``'grf'``, and ``{prefix}_key_*`` for independent
                key-side loads) or its loads.
            layers (iterable of GRFAttention): the layers that will read the plan; their
                configurations decide which structures are built (``'auto'`` is resolved here,
                :func:`~pyg_grf.nn.attention.grf.choose.choose_backend`, counting the layers
                that share a part). Empty: the loads only (every layer builds its part per
                call).
        """
        layers = list(layers)
        if isinstance(data, GRFLoads):
            loads = data
        else:
            prefixes = {layer.attr_prefix for layer in layers}
            if len(prefixes) > 1:
                raise ValueError(f"one plan serves layers of one attr_prefix, got "
                                 f"{sorted(prefixes)}: build one plan per prefix")
            prefix = prefixes.pop() if prefixes else 'grf'
            key = f'{prefix}_key'
            has_key = all(getattr(data, f'{key}_{s}', None) is not None
                          for s in ('index', 'length', 'load'))
            loads = GRFLoads.from_data(data, prefix, key if has_key else None)
        # how many layers share each part (the join is paid once)
        shared = Counter(layer.spec(loads.num_draws) for layer in layers)
        built: Dict[Tuple, PlanPart] = {}
        return cls(loads, {spec: build_part(loads, spec, n, built) for spec, n in shared.items()})

    def part(self, spec: LayerSpec) -> PlanPart:
        r"""The part of ``spec``: the plan's own, else built for this call (not kept)."""
        part = self.parts.get(spec)
        return part if part is not None else build_part(self.loads, spec)

    @property
    def device(self) -> torch.device:
        return self.loads.device

    def to(self, device: Any) -> 'GRFPlan':
        r"""The same plan on ``device`` (``self`` if already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        return GRFPlan(self.loads.to(device), {s: p.to(device) for s, p in self.parts.items()},
                       self.layout._replace(pos=self.layout.pos.to(device)))

    @property
    def num_nodes(self) -> int:
        return self.loads.num_nodes

    @property
    def batch(self) -> Optional[Tensor]:
        return self.loads.batch

    def nbytes(self) -> Dict[str, int]:
        r"""Bytes held per backend part (``'loads'``: the entries)."""
        out = {'loads': self.loads.nbytes()}
        for spec, part in self.parts.items():
            name = f'{part.backend}:{spec.mode}'
            out[name] = max(out.get(name, 0), part.structures.nbytes())
        return out

    def __repr__(self) -> str:
        parts = ', '.join(sorted({f'{p.backend}:{s.mode}' for s, p in self.parts.items()}))
        return f'GRFPlan({self.loads!r}, parts=[{parts}])'


def build_part(loads: GRFLoads, spec: LayerSpec, num_layers: int = 1,
               built: Optional[Dict[Tuple, PlanPart]] = None) -> PlanPart:
    r"""The :class:`PlanPart` of ``spec`` on ``loads``: folds the walk draws per head,
    resolves ``'auto'`` (:func:`~pyg_grf.nn.attention.grf.choose.choose_backend`) or checks the
    explicit backend's memory, and builds the backend's structures. ``built`` shares the
    structures between specs that need the same (same mode, draws, backend and dtype). Built
    outside inference mode, so that a plan made under ``torch.inference_mode()`` (e.g.
    ``trainer.validate`` before ``fit``) still serves training."""
    with torch.inference_mode(False):
        return _build_part(loads, spec, num_layers, built)


def _build_part(loads: GRFLoads, spec: LayerSpec, num_layers: int,
                built: Optional[Dict[Tuple, PlanPart]]) -> PlanPart:
    # entries beyond the layer's coefficients would silently vanish from the mask
    loads.check_coefficients(spec.max_length, f'GRFAttention(max_length={spec.max_length})')
    run, heads, groups = loads, spec.heads, 1
    if spec.draws is not None:
        run = loads.fold(spec.draws)
        groups = len(spec.draws)
        heads = 1 if groups > 1 else heads
    sizes = choose.plan_sizes(run, spec.mode)
    itemsize = torch.finfo(spec.dtype).bits // 8
    if spec.backend == 'auto':
        backend = choose.choose_backend(sizes, spec.mode, heads, spec.m, spec.d, num_layers,
                                        itemsize, loads.device)
    else:
        backend = spec.backend
        choose.check_backend(sizes, backend, spec.mode, heads, spec.m, spec.d, itemsize,
                             loads.device)
    if spec.mode == 'sparse_softmax' and backend == 'pairs':
        backend = 'sparse'  # the same computation: the support of Phi
    key = (spec.mode, backend, spec.draws, spec.dtype)
    if built is not None and key in built:
        return built[key]
    max_cells = choose.max_join_cells(loads.device, sizes.num_coef) if backend == 'pairs' else None
    stats_dtype = torch.float64 if spec.dtype == torch.float64 else torch.float32
    structures = BACKEND_MODULES[backend].build(run, spec.mode, stats_dtype, groups, max_cells)
    part = PlanPart(backend, groups, structures)
    if built is not None:
        built[key] = part
    return part
