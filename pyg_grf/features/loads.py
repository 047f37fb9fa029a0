r"""The typed GRF payload of a graph or a mini-batch, and everything computed from it once per
batch.

:class:`GRFLoads` holds the importance-weighted loads that
:class:`~pyg_grf.transforms.AddGraphRandomFeatures` stores on a ``Data`` object (GRF paper,
Eq. 10): entry :math:`e` is a (start node :math:`i`, visited node :math:`q`, hop count :math:`l`)
with :math:`\mathrm{load}(i, q, l)`, and a layer with coefficients :math:`f` turns them into

.. math::
    \widehat\Phi_{iq} = \sum_l f_l\,\mathrm{load}(i, q, l).

Everything that depends on the loads but not on :math:`f` is computed on first use and cached on
the object, so that all layers of a model share it (build one ``GRFLoads`` per batch and pass it
to every layer):

* :meth:`pairs`: the distinct :math:`(i, q)` pairs and the pair id of every entry, and the sparse
  pattern of :math:`\widehat\Phi` (sparse backend);
* :meth:`layout`: the dense-block layout of the batch (graph sizes, padded positions);
* :meth:`block_terms`: the mask entries as f-independent terms (dense-block backend). For the
  symmetric mask :math:`M = \widehat\Phi_Q\widehat\Phi_K^\top`,

  .. math::
      M_{ij} = \sum_{l, l'} f_l f_{l'}\, S_{ij}^{l l'}, \qquad
      S_{ij}^{l l'} = \sum_q \mathrm{load}_Q(i, q, l)\,\mathrm{load}_K(j, q, l'),

  so each term is one product of a query-side and a key-side entry that share their visited node
  :math:`q` (a join on :math:`q`, computed once), and the mask of a layer is a scatter of
  :math:`(f \otimes f)_{l l'}` times the term values into the graphs' dense blocks. As
  :math:`f_l f_{l'}` is symmetric in :math:`(l, l')`, the statistics of :math:`(l, l')` and
  :math:`(l', l)` are stored summed: :math:`K(K + 1)/2` per cell for :math:`K = L + 1` hop
  counts (15 for :math:`L = 4`), not :math:`K^2`. For the asymmetric mask
  :math:`M = \widehat\Phi` the terms are the entries themselves.

*Worker-side preparation.* :meth:`GRFAttention.prepare <pyg_grf.nn.GRFAttention.prepare>` (or
:func:`pyg_grf.loader.prepare_payload` for a whole model) builds these structures ahead of
the training step, e.g. in the workers of :class:`pyg_grf.loader.DataLoader`; the object then
travels to the main process with its caches (:meth:`__getstate__`).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import is_sorted
from pyg_grf.features.grf import hop_values
from pyg_grf.ops import SparsePattern
from pyg_grf.features.blocks import BlockLayout, BlockStructures
from pyg_grf.features.kept import KEPT_ATTR, PREPARED_ATTR  # noqa: F401  (re-exported)
from pyg_grf.features.kept import KeptPayloads as _Kept
from pyg_grf.features.kept import all_equal as _all_equal
from pyg_grf.features.kept import snapshot as _snapshot


def _check_tensor(name: str, t: Any, dim: int) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"'{name}' must be a tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"'{name}' must be {dim}-D, got shape {tuple(t.shape)}")
    return t


class GRFLoads(BlockStructures):
    r"""Graph random feature loads of a graph or a PyG mini-batch, with the per-batch
    precomputation shared by all GRF layers of a model (module docstring).

    Build it with :meth:`from_data` from the attributes that
    :class:`~pyg_grf.transforms.AddGraphRandomFeatures` stores, and pass it to every layer as
    ``grf=``. The inputs are validated once here (index range, hop counts, finite loads), not in
    every layer.

    *Snapshot semantics.* The tensors are copied when the object is built (``nnz``-sized, cheap
    next to one layer), so later in-place edits of the data's tensors, through ``.data`` or not,
    never reach it or anything it has cached. Everything cached (pairs, layouts, mask
    statistics) is keyed on the version counters of the object's own tensors: an in-place edit
    of ``grf.load`` (or ``index``, ``hop``, ``batch``, ``draw``) drops the caches instead of
    serving stale structures. Cached structures are always built outside inference mode, so a
    payload first used under ``torch.inference_mode()`` (e.g. ``trainer.validate`` before
    ``fit``) still trains.

    Args:
        index (Tensor): ``[2, nnz]`` (start node, visited node) of every entry.
        hop (Tensor): ``[nnz]`` hop count :math:`l \ge 0` of every entry.
        load (Tensor): ``[nnz]`` load of every entry.
        num_nodes (int): :math:`N`.
        batch (Tensor, optional): ``[N]`` graph id of every node, sorted (a PyG batch). :obj:`None`
            for a single graph.
        max_length (int, optional): the transform's :math:`L` (hop counts must not exceed it).
            Defaults to the largest hop count present.
        key (GRFLoads, optional): loads of independent key-side walks on the same nodes
            (unbiased diagonal, GRF paper Sec. 3.3): the symmetric mask becomes
            :math:`\widehat\Phi_Q\widehat\Phi_K^\top`.
        draw (Tensor, optional): ``[nnz]`` id of the independent walk draw of every entry
            (``AddGraphRandomFeatures(num_draws=D)``); the layers give each head its own draw
            (:meth:`fold`). :obj:`None`: one draw.
    """

    def __init__(self, index: Tensor, hop: Tensor, load: Tensor, num_nodes: int,
                 batch: Optional[Tensor] = None, max_length: Optional[int] = None,
                 key: Optional['GRFLoads'] = None, draw: Optional[Tensor] = None):
        _check_tensor('grf_index', index, 2)
        if index.size(0) != 2:
            raise ValueError(f"'grf_index' must have shape [2, nnz], got {tuple(index.shape)}")
        _check_tensor('grf_length', hop, 1)
        _check_tensor('grf_load', load, 1)
        nnz = index.size(1)
        if hop.numel() != nnz or load.numel() != nnz:
            raise ValueError(f"'grf_length' and 'grf_load' must have shape [{nnz}] (one per entry "
                             f"of 'grf_index'), got {tuple(hop.shape)} and {tuple(load.shape)}")
        if index.is_floating_point() or hop.is_floating_point():
            raise TypeError(f"'grf_index' and 'grf_length' must be integer tensors, got "
                            f"{index.dtype} and {hop.dtype}")
        if not load.is_floating_point():
            raise TypeError(f"'grf_load' must be a floating-point tensor, got {load.dtype}")
        num_nodes = int(num_nodes)
        self.max_hop = _check_entries(index, hop, load, num_nodes)
        if max_length is not None:
            if self.max_hop > max_length:
                raise ValueError(f"the loads have hop counts up to {self.max_hop} but "
                                 f"'max_length' is {max_length}")
        if batch is not None:
            _check_tensor('batch', batch, 1)
            if batch.numel() != num_nodes:
                raise ValueError(f"'batch' must have one entry per node ({num_nodes}), got "
                                 f"{batch.numel()}")
        if key is not None:
            if not isinstance(key, GRFLoads):
                raise TypeError(f"'key' must be a GRFLoads, got {type(key).__name__}")
            if key.num_nodes != num_nodes:
                raise ValueError(f"'key' covers {key.num_nodes} nodes but the query side covers "
                                 f"{num_nodes}")
        self.num_draws = 1
        if draw is not None:
            _check_tensor('grf_draw', draw, 1)
            if draw.numel() != nnz or draw.is_floating_point():
                raise ValueError(f"'grf_draw' must be an integer tensor of shape [{nnz}] (one "
                                 f"draw id per entry), got {draw.dtype} {tuple(draw.shape)}")
            if nnz > 0:
                dlo, dhi = torch.aminmax(draw)
                if int(dlo) < 0:
                    raise ValueError(f"'grf_draw' (draw ids) must be >= 0, got {int(dlo)}")
                self.num_draws = int(dhi) + 1
        if key is not None and key.num_draws != self.num_draws:
            raise ValueError(f"the key-side loads hold {key.num_draws} walk draws but the query "
                             f"side holds {self.num_draws}: use the same num_draws for both")
        # snapshot: later edits of the caller's tensors never reach this object (normal tensors
        # even under inference mode, so that the payload can serve training later)
        with torch.inference_mode(False):
            self.index, self.hop, self.load = index.clone(), hop.clone(), load.clone()
            self.draw = None if draw is None else draw.clone()
            if batch is not None:
                batch = batch.clone()
        # Set on the loads that fold() returns: the group (head) of every entry, one
        # coefficient row per group (num_groups of them, each spanning group_graphs graphs).
        self.group: Optional[Tensor] = None
        self.num_groups = 1
        self.group_graphs = 1
        self.num_nodes = num_nodes
        self.batch = batch
        self.max_length = max_length
        self.key = key
        self._cache: Dict[Any, Any] = {}

    # Construction ##################################################################################

    @classmethod
    def from_data(cls, data: Any, prefix: str = 'grf', key_prefix: Optional[str] = None,
                  max_length: Optional[int] = None) -> 'GRFLoads':
        r"""The loads stored on a ``Data`` object or a PyG ``Batch`` under
        ``{prefix}_index``, ``{prefix}_length`` and ``{prefix}_load``.

        Args:
            data (Data or Batch): the graph or mini-batch.
            prefix (str): attribute prefix used by the transform (default: ``'grf'``).
            key_prefix (str, optional): prefix of independent key-side loads (e.g.
                ``'grf_key'``, from a second transform with ``attr_prefix='grf_key'``).
            max_length (int, optional): the transform's :math:`L`, checked against the data.

        The loads are kept on ``data`` (a plain attribute, not a data field: never collated or
        saved with the data's tensors) and returned again, with every structure they have
        cached, by later calls for the same ``data`` while it holds exactly the tensors they
        were built from (an :math:`O(\mathrm{nnz})` comparison, :meth:`matches`). So
        full-graph training with a plain ``Data`` builds them once, whether the model is a
        :class:`~pyg_grf.nn.GraphTransformer` or a loop of your own calling
        ``conv.payload(data)``; an edited graph gets fresh loads.
        """
        missing = [f'{prefix}_{s}' for s in ('index', 'length', 'load')
                   if getattr(data, f'{prefix}_{s}', None) is None]
        if missing:
            raise ValueError(f"the data has no GRF loads {missing}: add the transform "
                             f"AddGraphRandomFeatures(attr_prefix={prefix!r}) (best as the "
                             f"dataset's pre_transform)")
        for attr in (PREPARED_ATTR, KEPT_ATTR):
            prepared = data.__dict__.get(attr, {}).get((prefix, key_prefix))
            if prepared is not None and prepared.matches(data, prefix, key_prefix):
                if max_length is not None and prepared.max_hop > max_length:
                    raise ValueError(f"the loads have hop counts up to {prepared.max_hop} but "
                                     f"'max_length' is {max_length}")
                return prepared  # built (with its caches) by pyg_grf.loader or an earlier call
        batch = getattr(data, 'batch', None)
        key = None
        if key_prefix is not None:
            key = cls.from_data(data, key_prefix, max_length=max_length)
        loads = cls(data[f'{prefix}_index'], data[f'{prefix}_length'], data[f'{prefix}_load'],
                    data.num_nodes, batch=batch, max_length=max_length, key=key,
                    draw=getattr(data, f'{prefix}_draw', None))
        if max_length is None and hasattr(data, '__dict__'):
            # kept on the data object: the next call for the same, unchanged data (one full
            # graph seen at every step, or the layers of one batch) reuses it with its caches
            # (the pair join, patterns, layout), after the exact check above
            kept = _Kept(data.__dict__.get(KEPT_ATTR, {}))
            kept[(prefix, key_prefix)] = loads
            data.__dict__[KEPT_ATTR] = kept
        return loads

    def refresh(self) -> bool:
        r"""Drops every cached structure if the entries (or the batch vector) changed since they
        were built, also by writes that bypass the version counters the caches otherwise check
        (``grf.load.data.mul_(...)``): an exact :math:`O(\mathrm{nnz})` comparison with a copy
        taken at the first call (of the key-side loads too). Every GRF layer calls it once per
        forward, so an edited payload never serves stale structures. Returns whether the
        caches were dropped."""
        tensors = (self.index, self.hop, self.load, self.batch, self.draw)
        snap = self.__dict__.get('_snap')
        changed = False
        if snap is None or not _all_equal(snap, tensors):
            if snap is not None:  # edited after it was built: checked again before any use
                self._check_edited()
                self._cache = {}
                changed = True
            self._snap = _snapshot(tensors)
        if self.key is not None and self.key.refresh():
            self._cache = {}  # the symmetric mask's statistics join both sides
            changed = True
        return changed

    def _check_edited(self):
        # the checks of the constructor, for entries edited in place after it (an out-of-range
        # id would otherwise reach the unchecked CSR kernels)
        try:
            max_hop = _check_entries(self.index, self.hop, self.load, self.num_nodes)
            if self.batch is not None and self.batch.numel() != self.num_nodes:
                raise ValueError(f"'batch' must have one entry per node ({self.num_nodes}), got "
                                 f"{self.batch.numel()}")
            if self.draw is not None and self.draw.numel() > 0 and int(self.draw.min()) < 0:
                raise ValueError(f"'grf_draw' (draw ids) must be >= 0, got "
                                 f"{int(self.draw.min())}")
        except ValueError as e:
            raise ValueError(f"the GRF loads were edited in place after they were built and are "
                             f"no longer valid: {e}") from None
        self.max_hop = max_hop
        if self.draw is not None and self.draw.numel() > 0:
            self.num_draws = int(self.draw.max()) + 1

    def matches(self, data: Any, prefix: str = 'grf', key_prefix: Optional[str] = None) -> bool:
        r"""Whether these loads hold exactly the entries (and batch vector) that ``data`` stores
        under ``prefix`` (an exact comparison, :math:`O(\mathrm{nnz})`): a payload prepared
        ahead of the step is only used for the data it was built from."""
        def same(a: Optional[Tensor], b: Any) -> bool:
            if a is None or b is None:
                return a is None and b is None
            return (isinstance(b, Tensor) and a.shape == b.shape and a.device == b.device
                    and torch.equal(a, b))
        if self.num_nodes != data.num_nodes or self.group is not None:
            return False
        batch = getattr(data, 'batch', None)
        if not (same(self.index, getattr(data, f'{prefix}_index', None))
                and same(self.hop, getattr(data, f'{prefix}_length', None))
                and same(self.load, getattr(data, f'{prefix}_load', None))
                and same(self.draw, getattr(data, f'{prefix}_draw', None))
                and same(self.batch, batch)):
            return False
        if (self.key is None) != (key_prefix is None):
            return False
        return self.key is None or self.key.matches(data, key_prefix)

    @property
    def nnz(self) -> int:
        return self.index.size(1)

    @property
    def device(self) -> torch.device:
        return self.index.device

    def __repr__(self) -> str:
        key = '' if self.key is None else ', key=True'
        draws = '' if self.num_draws == 1 else f', num_draws={self.num_draws}'
        groups = '' if self.num_groups == 1 else f', num_groups={self.num_groups}'
        return (f'GRFLoads(num_nodes={self.num_nodes}, nnz={self.nnz}, max_hop={self.max_hop}'
                f'{draws}{groups}{key})')

    # Walk draws and shared graphs ##################################################################

    def fold(self, draws: Sequence[int], batch: Optional[Tensor] = None) -> 'GRFLoads':
        r"""The loads of the walk draws ``draws`` (one per head, e.g.
        :meth:`GRFAttention.draws() <pyg_grf.nn.GRFAttention.draws>`) as one graph of
        :math:`G N` nodes, :math:`G` = ``len(draws)``: copy :math:`g` holds the entries of draw
        ``draws[g]`` on nodes :math:`g N + i`. A layer runs its :math:`G` heads as one head on
        the folded nodes, with one coefficient row per copy (:attr:`group`), so that per-head
        walks cost one pass of every backend instead of a loop over heads. With :math:`G = 1`
        it is the plain selection of one draw. Cached per ``(draws, batch)``.

        Args:
            draws (sequence of int): a draw id in ``[0, num_draws)`` per head.
            batch (Tensor, optional): overrides the stored batch vector.
        """
        draws = tuple(int(d) for d in draws)
        if not draws or any(not 0 <= d < self.num_draws for d in draws):
            raise ValueError(f"'draws' must be a non-empty sequence of draw ids in [0, "
                             f"{self.num_draws}), got {draws}")
        if self.group is not None:
            raise ValueError("these loads are already folded")
        key = ('fold', draws, self._batch_key(batch))
        if batch is None:
            batch = self.batch
        return self._cached(key, lambda: self._build_fold(draws, batch))

    def _build_fold(self, draws: Tuple[int, ...], batch: Optional[Tensor]) -> 'GRFLoads':
        G, N, dev = len(draws), self.num_nodes, self.device
        draw = self.draw.long() if self.draw is not None else torch.zeros(
            self.nnz, dtype=torch.long, device=dev)
        e, g = (draw.unsqueeze(1) == torch.tensor(draws, device=dev)).nonzero(as_tuple=True)
        order = torch.argsort(g, stable=True)  # group-major: each copy stays sorted
        e, g = e[order], g[order]
        if G * N >= 2 ** 31 and self.index.dtype == torch.int32:
            index = self.index.long()[:, e] + g * N
        else:
            index = self.index[:, e] + (g * N).to(self.index.dtype)
        graphs = 1
        copies = torch.arange(G, device=dev).repeat_interleave(N)
        if batch is not None and N > 0:
            graphs = int(batch.max()) + 1
            fbatch = copies * graphs + batch.long().repeat(G)
        else:
            fbatch = copies
        key = None if self.key is None else self.key._build_fold(draws, batch)
        out = GRFLoads(index, self.hop[e], self.load[e], G * N, batch=fbatch,
                       max_length=self.max_length, key=key)
        if G > 1:
            out.group, out.num_groups, out.group_graphs = g, G, graphs
        return out

    def cell_group(self, cell: Tensor, layout: 'BlockLayout') -> Tensor:
        r"""The group (head copy, see :meth:`fold`) of flat cells of the dense-block layout."""
        return (cell // (layout.n * layout.n)) // self.group_graphs

    def repeat(self, copies: int) -> 'GRFLoads':
        r"""The loads of ``copies`` disjoint copies of this graph, as a batch (copy :math:`b`
        on nodes :math:`b N + i`, ``batch`` set): one shared graph for a batch of samples, e.g.
        the patch grid of a batch of images (GRF paper, Sec. 4). Cached per ``copies``, so a
        model that keeps one ``GRFLoads`` for its grid builds every per-batch structure once."""
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"'copies' must be a positive integer, got {copies!r}")
        if copies == 1 and self.batch is None:
            return self
        if self.batch is not None and self.num_nodes > 0 and int(self.batch.max()) > 0:
            raise ValueError("repeat() needs the loads of one graph, got a batch")
        return self._cached(('repeat', copies), lambda: self._build_repeat(copies))

    def _build_repeat(self, copies: int) -> 'GRFLoads':
        N, nnz, dev = self.num_nodes, self.nnz, self.device
        offset = torch.arange(copies, device=dev).repeat_interleave(nnz) * N
        index = self.index.long().repeat(1, copies) + offset
        if copies * N < 2 ** 31:
            index = index.to(self.index.dtype)
        key = None if self.key is None else self.key._build_repeat(copies)
        draw = None if self.draw is None else self.draw.repeat(copies)
        batch = torch.arange(copies, device=dev).repeat_interleave(N)
        return GRFLoads(index, self.hop.repeat(copies), self.load.repeat(copies), copies * N,
                        batch=batch, max_length=self.max_length, key=key, draw=draw)

    def _batch_key(self, batch: Optional[Tensor]) -> Any:
        # cache key of the batch vector a structure is built for: the loads' own one by name
        # (so that caches survive pickling, e.g. from a DataLoader worker), another one by
        # storage
        if batch is None or batch is self.batch:
            return 'own'
        return ('ext', batch.data_ptr(), batch.numel())

    def _versions(self) -> Tuple[int, ...]:
        return tuple(-1 if t is None else t._version for t in (
            self.index, self.hop, self.load, self.batch, self.draw))

    def __getstate__(self) -> Dict[str, Any]:
        # Pickling (e.g. from a DataLoader worker) keeps the cached structures when they are
        # current; entries keyed by another tensor's storage address ('ext') cannot be matched
        # in another process and are dropped.
        state = self.__dict__.copy()
        cache = self._cache
        if cache.get('_versions') != self._versions():
            cache = {}
        state['_cache'] = {k: v for k, v in cache.items()
                           if k not in ('_versions', '_check') and not _external(k)}
        return state

    def __setstate__(self, state: Dict[str, Any]):
        self.__dict__.update(state)
        # freshly built tensors: what was cached for them (checked current when pickled) holds
        self._cache = dict(state['_cache'])
        self._cache['_versions'] = self._versions()

    def _cached(self, name: Any, fn):
        versions = self._versions()
        if self._cache.get('_versions') != versions:  # an in-place edit: nothing cached holds
            self._cache = {'_versions': versions}
        if name not in self._cache:
            with torch.inference_mode(False):  # cached tensors must serve training too
                self._cache[name] = fn()
        return self._cache[name]

    # Sparse backend ################################################################################

    def pairs(self) -> Tuple[Tensor, SparsePattern]:
        r"""The pair id of every entry (``[nnz]``) and the :class:`~pyg_grf.ops.SparsePattern`
        of the distinct (start, visited) pairs, sorted row-major."""
        return self._cached('pairs', self._build_pairs)

    def _build_pairs(self):
        N = self.num_nodes
        key = self.index[0].long() * N + self.index[1].long()
        if not is_sorted(key):
            uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
        else:  # the transform's order: consecutive duplicates only, no sort needed
            new = torch.ones_like(key, dtype=torch.bool)
            if key.numel() > 1:
                new[1:] = key[1:] != key[:-1]
            inv = torch.cumsum(new, 0) - 1
            uniq = key[new]
        return inv, SparsePattern(torch.stack([uniq // N, uniq % N]), (N, N))

    def values(self, f: Tensor) -> Tensor:
        r"""Values of :math:`\widehat\Phi` on :meth:`pairs` for coefficients ``f`` (``[L + 1]``
        or ``[H, L + 1]``): ``[P]`` or ``[H, P]``, differentiable in ``f``."""
        inv, pattern = self.pairs()
        v = self.entry_values(f)
        if v.dim() == 1:
            return v.new_zeros(pattern.nnz).index_add(0, inv, v)
        return v.new_zeros(v.size(0), pattern.nnz).index_add(1, inv, v)

    def entry_values(self, f: Tensor) -> Tensor:
        r""":math:`f_{l_e}\,\mathrm{load}_e` per entry (``[nnz]`` or ``[H, nnz]``). On folded
        loads (:meth:`fold`) ``f`` is ``[G, L + 1]``, one row per group, and the result
        ``[1, nnz]`` (entry :math:`e` takes the row of its group)."""
        if f.dim() not in (1, 2):
            raise ValueError(f"'f' must have shape [L + 1] or [H, L + 1], got {tuple(f.shape)}")
        self.check_coefficients(f.size(-1) - 1)
        hop = self._cached('hop_long', lambda: self.hop.long())
        if self.group is None:
            return hop_values(f, hop, self.load)
        if f.dim() != 2 or f.size(0) != self.num_groups:
            raise ValueError(f"folded loads need one coefficient row per group: 'f' of shape "
                             f"[{self.num_groups}, L + 1], got {tuple(f.shape)}")
        flat = self.group * f.size(1) + hop
        return hop_values(f.reshape(-1), flat, self.load).unsqueeze(0)

    def check_coefficients(self, max_length: int, who: str = 'f'):
        r"""Raises if the loads have hop counts beyond ``max_length`` (their entries would get
        no coefficient and silently vanish from the mask)."""
        if self.max_hop > max_length:
            raise ValueError(f"the GRF loads have hop counts up to {self.max_hop} but {who} has "
                             f"coefficients only up to hop {max_length}: use max_length >= "
                             f"{self.max_hop} (the transform's max_length)")

    def _count(self, name: Any) -> int:
        # a use counter kept with the caches (reset with them after an in-place edit)
        self._cached('_check', lambda: None)
        self._cache[name] = self._cache.get(name, 0) + 1
        return self._cache[name]


def _check_entries(index: Tensor, hop: Tensor, load: Tensor, num_nodes: int) -> int:
    # node ids in [0, N), hop counts >= 0, finite loads; returns the largest hop count. One host
    # sync per batch (PyG's pattern), not one per layer.
    if index.size(1) == 0:
        return 0
    lo, hi = torch.aminmax(index)
    lo, hi = int(lo), int(hi)
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"'grf_index' must hold node ids in [0, {num_nodes}), got ids in "
                         f"[{lo}, {hi}]")
    hlo, hhi = torch.aminmax(hop)
    if int(hlo) < 0:
        raise ValueError(f"'grf_length' (hop counts) must be >= 0, got {int(hlo)}")
    if not bool(torch.isfinite(load).all()):
        raise ValueError("'grf_load' holds non-finite values (the loads overflowed: use "
                         "normalization='sym' or 'rw', or shorter walks)")
    return int(hhi)


def _external(key: Any) -> bool:
    # a cache key that names another tensor by its storage address (GRFLoads._batch_key)
    return isinstance(key, tuple) and any(isinstance(k, tuple) and k[:1] == ('ext',)
                                          for k in key)
