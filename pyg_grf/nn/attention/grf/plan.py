r"""The per-batch plan of the GRF layers (:class:`GRFPlan`): built once by a pure function of
the loads and the layers' configurations, then only read; like PyG's ``GCNConv(cached=True)``
it owns its tensors, so later edits of the ``Data`` change nothing in it.

A plan travels the way PyG moves data: :func:`pyg_grf.loader.prepare_payload` and
:class:`pyg_grf.loader.DataLoader` leave it on the batch as an ordinary field (``grf_plan``),
which ``Data.to()`` moves with the tensors (it calls :meth:`GRFPlan.to`). It remembers the
tensors it was built from (:meth:`GRFPlan.matches`), so a copy of the ``Data`` whose walks were
redrawn or edited, or a subgraph of it, never reads it: the layer builds a new plan instead.

Which computation a layer runs is one short rule (:func:`build_part`): the mask on its support
(:mod:`.pairs`, the engine) when its structures and one layer fit the memory budget
(:func:`pyg_grf.memory.memory_budget`) and it needs no more multiply-adds than the low-rank
path (:func:`multiply_adds`, counted from the mask's cells and the walks' pairs; no fitted
constants; a sample of rows settles a clear case before the join, :func:`sampled_cells`), else
the low-rank path (:mod:`.sparse`, two products with :math:`\widehat\Phi`, never forms the
mask); ``'sparse_softmax'`` runs on the support of :math:`\widehat\Phi` (:mod:`.sparse`).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import batch_or_zeros
from pyg_grf.features.blocks import num_join_terms
from pyg_grf.features.join import JoinMemoryError, compiled_join_available
from pyg_grf.features.loads import GRFLoads
from pyg_grf.masks.packing import PackingLayout, packing_layout
from pyg_grf.memory import memory_budget
from pyg_grf.nn.attention.base import pin, unchanged
from pyg_grf.nn.attention.grf import pairs, sparse

#: Peak bytes per join term of the torch join (GPU or no numba): its per-term keys, partners
#: and values (77 measured on an H200, ``experiments/results/gpu_backends.md``).
TORCH_JOIN_BYTES = 80


class BackendMemoryError(MemoryError):
    r"""Raised before a GRF plan or layer allocates more than the memory available (or
    ``$PYG_GRF_MEMORY_LIMIT``)."""


class LayerSpec(NamedTuple):
    r"""What a GRF layer's plan part depends on (:meth:`GRFAttention.spec
    <pyg_grf.nn.GRFAttention.spec>`)."""
    mode: str                       # 'symmetric' | 'asymmetric' | 'sparse_softmax'
    backend: str                    # as configured: 'auto', 'pairs' or 'sparse'
    heads: int
    m: int                          # feature size per head
    d: int                          # value size per head
    draws: Optional[Tuple[int, ...]]  # walk draw per head (None: all heads share the walks)
    dtype: torch.dtype
    max_length: int                 # the largest hop with a coefficient

    @property
    def key(self) -> str:
        r"""The configuration as one string (a constant for ``torch.compile``)."""
        return (f'{self.mode}|{self.backend}|{self.heads}|{self.m}|{self.d}|{self.draws}|'
                f'{self.dtype}|{self.max_length}')


class PlanPart(NamedTuple):
    r"""The structures one layer configuration runs on."""
    backend: str     # 'pairs' or 'sparse'
    groups: int      # heads folded into the nodes (walks per head), else 1
    structures: Any  # the backend module's build()

    def to(self, device) -> 'PlanPart':
        return self._replace(structures=self.structures.to(device))


def _fields(prefix: str) -> List[str]:
    # every field a plan reads besides the node count: the loads of both sides, the batch
    return [f'{p}_{s}' for p in (prefix, f'{prefix}_key')
            for s in ('index', 'length', 'load', 'draw')] + ['batch']


def same_as(t: Any, ref: Optional[Tensor], checks: list, flat_draw: bool = False) -> bool:
    r"""Whether the data's field ``t`` can hold the values a plan copied (``ref``); the value
    comparison is appended to ``checks`` (read once for all fields: one device sync)."""
    if ref is None:
        if flat_draw and isinstance(t, Tensor):  # one draw: ids all 0, or none stored
            checks.append(~t.any())
            return True
        return t is None
    if not isinstance(t, Tensor) or t.shape != ref.shape:
        return False
    checks.append((t == ref.to(t.device)).all())
    return True


class GRFPlan:
    r"""The plan of one batch for the GRF layers of a model: its validated loads and, for
    every layer configuration it was built for (:class:`LayerSpec`), the structures that
    configuration runs (:class:`PlanPart`, shared by the layers that need the same). A layer
    handed a plan without its configuration builds that part for the call and keeps nothing.
    It moves with :meth:`to` and pickles compactly, so :class:`pyg_grf.loader.DataLoader`
    builds it in its worker processes::

        plan = GRFPlan.build(batch, layers)   # once per batch (or once for a fixed graph)
        out = layer(x, batch.batch, grf=plan)

    Attributes:
        loads (GRFLoads): the batch's loads.
        parts (Mapping[LayerSpec, PlanPart]): read-only.
        layout (PackingLayout): the graphs of the batch in padded blocks (for the global
            term, :func:`~pyg_grf.nn.functional.packed_linear_attention`).
        prefix (str): the ``attr_prefix`` of the loads it was built from.
    """

    __slots__ = ('loads', 'parts', 'layout', 'prefix', '_source', '_by_key')

    def __init__(self, loads: GRFLoads, parts: Mapping[LayerSpec, PlanPart],
                 layout: Optional[PackingLayout] = None, prefix: str = 'grf',
                 source: Optional[Tuple[Tuple[str, Any, int], ...]] = None):
        if not isinstance(loads, GRFLoads):
            raise TypeError(f"'loads' must be a GRFLoads, got {type(loads).__name__}")
        object.__setattr__(self, 'loads', loads)
        object.__setattr__(self, 'parts', MappingProxyType(dict(parts)))
        # the same parts under string keys, which torch.compile reads as constants
        object.__setattr__(self, '_by_key', {s.key: p for s, p in self.parts.items()})
        if layout is None:
            batch = batch_or_zeros(loads.batch, loads.num_nodes, loads.device)
            with torch.inference_mode(False):
                layout = packing_layout(batch, loads.num_graphs)
        object.__setattr__(self, 'layout', layout)
        object.__setattr__(self, 'prefix', prefix)
        object.__setattr__(self, '_source', source)

    def __setattr__(self, name, value):
        raise AttributeError("a GRFPlan is immutable: build a new one for new data")

    def __reduce__(self):
        # the source tensors are the data's own: pickled with the batch, they stay one object
        return (GRFPlan, (self.loads, dict(self.parts), self.layout, self.prefix, self._source))

    @classmethod
    def build(cls, data: Any, layers: Iterable[Any] = ()) -> 'GRFPlan':
        r"""The plan of ``data`` for ``layers``.

        Args:
            data (Data, Batch or GRFLoads): the batch (with the attributes of
                :class:`~pyg_grf.transforms.AddGraphRandomFeatures` under the layers'
                ``attr_prefix``, else ``'grf'``, and ``{prefix}_key_*`` for independent
                key-side loads) or its loads.
            layers (iterable of GRFAttention): the layers that will read the plan; their
                configurations decide which structures are built (:func:`build_part`).
                Empty: the loads only (every layer builds its part per call).
        """
        layers = list(layers)
        prefixes = {layer.attr_prefix for layer in layers}
        if len(prefixes) > 1:
            raise ValueError(f"one plan serves layers of one attr_prefix, got "
                             f"{sorted(prefixes)}: build one plan per prefix")
        prefix = prefixes.pop() if prefixes else 'grf'
        source = None
        if isinstance(data, GRFLoads):
            loads = data
        else:
            key = f'{prefix}_key'
            has_key = all(getattr(data, f'{key}_{s}', None) is not None
                          for s in ('index', 'length', 'load'))
            loads = GRFLoads.from_data(data, prefix, key if has_key else None)
            source = pin(data, _fields(prefix))
        specs = dict.fromkeys(layer.spec(loads.num_draws) for layer in layers)
        built: Dict[Tuple, PlanPart] = {}
        return cls(loads, {spec: build_part(loads, spec, built) for spec in specs},
                   prefix=prefix, source=source)

    def matches(self, data: Any) -> bool:
        r"""Whether this plan was built from the walks, batch vector and node count that
        ``data`` holds now: the same tensors, unchanged (:math:`O(1)`, no device work), or
        else (after a move or a pickle) tensors equal to the plan's copies (compared once on
        the data's device, then remembered)."""
        now = pin(data, _fields(self.prefix))
        if unchanged(now, self._source):
            return True
        fields = dict((n, t) for n, t, _ in now)
        sides = ((self.prefix, self.loads), (f'{self.prefix}_key', self.loads.key))
        checks: list = []
        for p, loads in sides:
            if loads is None:
                if fields[f'{p}_index'] is not None and p != self.prefix:
                    return False
                continue
            if not (same_as(fields[f'{p}_index'], loads.index, checks)
                    and same_as(fields[f'{p}_length'], loads.hop, checks)
                    and same_as(fields[f'{p}_load'], loads.load, checks)
                    and same_as(fields[f'{p}_draw'], loads.draw, checks, flat_draw=True)):
                return False
        if fields['num_nodes'] != self.loads.num_nodes or not same_as(fields['batch'],
                                                                    self.loads.batch, checks):
            return False
        if checks and not bool(torch.stack(checks).all()):
            return False
        object.__setattr__(self, '_source', now)
        return True

    def covers(self, layers: Iterable[Any]) -> bool:
        r"""Whether the plan holds the part of every layer of ``layers`` (their prefix too)."""
        return all(layer.attr_prefix == self.prefix
                   and layer.spec(self.loads.num_draws) in self.parts for layer in layers)

    def part(self, spec: LayerSpec) -> PlanPart:
        r"""The part of ``spec``: the plan's own, else built for this call (not kept)."""
        part = self._by_key.get(spec.key)
        return part if part is not None else build_part(self.loads, spec)

    @property
    def device(self) -> torch.device:
        return self.loads.device

    def to(self, device: Any = None, *args, non_blocking: bool = False,
           **kwargs) -> 'GRFPlan':
        r"""The same plan on ``device`` (``self`` if already there); ``Data.to()`` calls it
        for a plan that the data carries."""
        device = torch.device(device)
        if device == self.device:
            return self
        return GRFPlan(self.loads.to(device), {s: p.to(device) for s, p in self.parts.items()},
                       self.layout._replace(pos=self.layout.pos.to(device)), self.prefix)

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


def build_part(loads: GRFLoads, spec: LayerSpec,
               built: Optional[Dict[Tuple, PlanPart]] = None) -> PlanPart:
    r"""The :class:`PlanPart` of ``spec`` on ``loads``: folds the walk draws per head and
    builds the structures of the one rule (module docstring): ``'pairs'`` when its join and
    one layer fit the memory budget and (``backend='auto'``) it is not the costlier of the two
    by :func:`multiply_adds`, else (``backend='auto'``) ``'sparse'``, else
    :class:`BackendMemoryError`. ``built`` shares the structures between specs that need the
    same. Built outside inference mode, so that a plan made under ``torch.inference_mode()``
    still serves training."""
    with torch.inference_mode(False):
        # entries beyond the layer's coefficients would silently vanish from the mask
        loads.check_coefficients(spec.max_length, f'GRFAttention(max_length={spec.max_length})')
        run, heads, groups = loads, spec.heads, 1
        if spec.draws is not None:
            run = loads.fold(spec.draws)
            groups = len(spec.draws)
            heads = 1 if groups > 1 else heads
        # structures are shared by every spec that needs the same; the choice between them
        # depends on the widths too (multiply_adds), so it is kept per (backend, m, d)
        key = (spec.mode, spec.draws, spec.dtype, heads)
        choice = key + (spec.backend, spec.m, spec.d)
        if built is not None and choice in built:
            return built[choice]

        def shared(kind: str, make: Callable[[], Any]) -> Any:
            if built is None:
                return make()
            if (kind,) + key not in built:
                built[(kind,) + key] = make()
            return built[(kind,) + key]

        stats_dtype = torch.float64 if spec.dtype == torch.float64 else torch.float32
        itemsize = torch.finfo(spec.dtype).bits // 8
        budget, source = memory_budget(loads.device)
        why = None
        part = None

        def walk_pairs() -> Tuple[int, int]:  # counted once per plan and structures
            return shared('walk pairs', lambda: _walk_pairs(run, spec.mode))

        if spec.mode != 'sparse_softmax' and spec.backend != 'sparse' and not (
                spec.backend == 'auto' and spec.mode == 'symmetric'
                and _clearly_low_rank(run, spec, heads, itemsize, budget, walk_pairs())):
            part, why = shared('pairs', lambda: _try_pairs(run, spec, heads, groups, stats_dtype,
                                                           itemsize, budget))
            if part is None and spec.backend == 'pairs':
                raise BackendMemoryError(_too_big('pairs', run, why, budget, source))
            if part is not None and spec.backend == 'auto':
                part = _cheaper(part, run, spec, heads, itemsize, budget, walk_pairs)
        if part is None:
            low = shared('sparse', lambda: sparse.build(run, spec.mode, groups))
            need = sparse.memory(run.num_nodes, low.query.index.size(1), heads, spec.m, spec.d,
                                 itemsize)
            if budget is not None and need > budget:
                raise BackendMemoryError(_too_big(spec.backend, run, why or (
                    f"the low-rank path needs {need / 2 ** 30:.2f} GiB"), budget, source))
            part = PlanPart('sparse', groups, low)
        if built is not None:
            built[choice] = part
        return part


def multiply_adds(backend: str, num_nodes: int, cells: int, heads: int, m: int, d: int,
                  stats: int = 0) -> int:
    r"""Multiply-adds of one layer's forward (dominant terms, per the modules' docstrings)
    with ``heads`` heads of ``m`` features and ``d`` values. ``'pairs'``: ``cells`` mask
    cells, each a score (``m``) and a weighted sum of ``[v, 1]`` (``d + 1``), plus the mask
    values per head from ``stats`` statistics entries. ``'sparse'``: ``cells`` pairs of
    :math:`\widehat\Phi` on both sides together (one side for the asymmetric mask), each a row
    of ``m (d + 1)`` in the CSR products, plus the outer products and the contraction with
    :math:`\phi(\mathbf{q})` (``2 N m (d + 1)``). The backward of either is about twice its
    forward, so the forward's counts order the two."""
    if backend == 'pairs':
        return heads * (cells * (m + d + 1) + stats)
    return heads * (cells + 2 * num_nodes) * m * (d + 1)


def _walk_pairs(run: GRFLoads, mode: str) -> Tuple[int, int]:
    # the query side's distinct walk pairs, and those of both sides the low-rank path reads
    P = run.num_pairs()
    return P, P + (0 if mode != 'symmetric' else P if run.key is None else run.key.num_pairs())


def _cheaper(part: PlanPart, run: GRFLoads, spec: LayerSpec, heads: int, itemsize: int,
             budget: Optional[float],
             walk_pairs: Callable[[], Tuple[int, int]]) -> Optional[PlanPart]:
    # 'auto': the engine's part, or None when the low-rank path needs fewer multiply-adds (a
    # mask whose support is much larger than the walks', as on one big graph with overlapping
    # walks) and fits the budget
    N, m, d, st = run.num_nodes, spec.m, spec.d, part.structures
    engine = multiply_adds('pairs', N, st.nnz, heads, m, d, st.stats.numel())
    if engine <= multiply_adds('sparse', N, 0, heads, m, d):  # below the low-rank floor
        return part
    P, sides = walk_pairs()
    if multiply_adds('sparse', N, sides, heads, m, d) >= engine or (
            budget is not None and sparse.memory(N, P, heads, m, d, itemsize) > budget):
        return part
    return None


#: The most walk-pair products :func:`_clearly_low_rank` joins to estimate the mask's cells.
ESTIMATE_TERMS = 1 << 18


def _clearly_low_rank(run: GRFLoads, spec: LayerSpec, heads: int, itemsize: int,
                      budget: Optional[float], walk_pairs: Tuple[int, int]) -> bool:
    r"""Whether the symmetric mask's cells, estimated from a sample of rows
    (:func:`sampled_cells`), make the engine costlier than the low-rank path beyond doubt, so
    that ``'auto'`` skips the join (on one big graph with overlapping walks it takes longer
    than the low-rank plan itself). A row's join products and its graph's size bound its
    cells from above: when the engine's count at that bound is below the low-rank path's, or
    the join has at most :data:`ESTIMATE_TERMS` products, the exact rule runs. Else the
    engine's count at :math:`N(\bar c - 4\,\mathrm{SE})` cells (a lower confidence bound; the
    statistics' term left out) must exceed the low-rank path's; a close call runs the exact
    rule."""
    N, m, d = run.num_nodes, spec.m, spec.d
    other = run if run.key is None else run.key
    P, sides = walk_pairs
    low_rank = multiply_adds('sparse', N, sides, heads, m, d)
    if budget is not None and sparse.memory(N, P, heads, m, d, itemsize) > budget:
        return False
    # a row's cells are at most its join products and at most its graph's nodes
    q, k = run.index.long(), other.index.long()
    per_row = torch.zeros(N, dtype=torch.long, device=q.device).index_add_(
        0, q[0], torch.bincount(k[1], minlength=N).index_select(0, q[1]))
    total = int(per_row.sum())
    if run.batch is not None:
        sizes = torch.bincount(run.batch.long())
        per_row = torch.minimum(per_row, sizes.index_select(0, run.batch.long()))
    if total <= ESTIMATE_TERMS or multiply_adds('pairs', N, int(per_row.sum()), heads, m,
                                                 d) <= low_rank:
        return False
    mean, se = sampled_cells(run, max(64, N * ESTIMATE_TERMS // total))
    return multiply_adds('pairs', N, int(max(0.0, mean - 4 * se) * N), heads, m, d) > low_rank


def sampled_cells(run: GRFLoads, rows: int) -> Tuple[float, float]:
    r"""The mean cells per row of the symmetric mask's support and its standard error, from
    ``rows`` rows drawn without replacement (a fixed seed, so that every build of a plan makes
    the same choice) whose cells, the distinct :math:`j` that share a visited node with
    :math:`i`, are counted exactly (finite-population correction included)."""
    N = run.num_nodes
    other = run if run.key is None else run.key
    q, k = run.index.long(), other.index.long()
    if rows >= N:
        sample = torch.arange(N, device=q.device)
    else:
        sample = torch.randperm(N, generator=torch.Generator().manual_seed(0))[:rows]
        sample = sample.to(q.device)
    picked = torch.zeros(N, dtype=torch.bool, device=q.device)
    picked[sample] = True
    e = picked.index_select(0, q[0]).nonzero().squeeze(1)
    visit = q[1].index_select(0, e)
    seen = torch.zeros(N, dtype=torch.bool, device=q.device)
    seen[visit] = True
    near = seen.index_select(0, k[1]).nonzero().squeeze(1)  # the key entries joined
    near = near.index_select(0, torch.argsort(k[1].index_select(0, near)))
    cnt = torch.bincount(k[1].index_select(0, near), minlength=N)
    n_e = cnt.index_select(0, visit)
    start = (torch.cumsum(cnt, 0) - cnt).index_select(0, visit).repeat_interleave(n_e)
    offset = torch.arange(start.numel(), device=q.device) - (
        torch.cumsum(n_e, 0) - n_e).repeat_interleave(n_e)
    j = k[0].index_select(0, near.index_select(0, start + offset))
    cell = q[0].index_select(0, e).repeat_interleave(n_e) * N + j
    c = torch.bincount(torch.unique(cell) // N, minlength=N).index_select(0, sample).double()
    n = sample.numel()
    se = float(c.std()) / n ** 0.5 * max(0.0, 1 - n / N) ** 0.5 if n > 1 else 0.0
    return float(c.mean()), se


def _try_pairs(run: GRFLoads, spec: LayerSpec, heads: int, groups: int,
               dtype: torch.dtype, itemsize: int,
               budget: Optional[float]) -> Tuple[Optional[PlanPart], Optional[str]]:
    # the engine's structures, or (None, why) when the join or one layer exceeds the budget
    symmetric = spec.mode == 'symmetric'
    K = run.max_hop + 1 if run.key is None else max(run.max_hop, run.key.max_hop) + 1
    num_coef = K * (K + 1) // 2 if symmetric else K
    max_cells = None
    if budget is not None and symmetric:
        if compiled_join_available(run.device):  # the compiled join stops at its bound
            max_cells = int(budget // (4 * num_coef + 72))
        else:
            terms = num_join_terms(run)
            if terms * TORCH_JOIN_BYTES > budget:
                return None, (f"the join of {terms} terms needs "
                              f"{terms * TORCH_JOIN_BYTES / 2 ** 30:.2f} GiB")
    try:
        st = pairs.build(run, spec.mode, dtype, groups, max_cells, heads)
    except JoinMemoryError as e:
        return None, str(e)
    need = pairs.memory(st.nnz, num_coef, heads, itemsize, symmetric)
    if budget is not None and need > budget:
        return None, f"{st.nnz} mask cells need {need / 2 ** 30:.2f} GiB for one layer"
    return PlanPart('pairs', groups, st), None


def _too_big(backend: str, loads: GRFLoads, why: Optional[str], budget: float,
             source: str) -> str:
    hint = ("Use backend='auto' (falls back to the low-rank path)." if backend == 'pairs' else
            "Use fewer walks or a shorter max_length, or train on parts of the graph "
            "(pyg_grf.loader.NodePartLoader).")
    return (f"GRFAttention(backend={backend!r}) on {loads.num_nodes} nodes ({loads.nnz} walk "
            f"entries) does not fit {source} ({budget / 2 ** 30:.2f} GiB): {why}. {hint} To "
            f"try anyway, set $PYG_GRF_MEMORY_LIMIT=off (or a size such as 64G).")
