r"""The GRF backends: how a :class:`~pyg_grf.nn.GRFAttention` layer computes its masked sums, in
one place (see ``docs/speed.md``).

Every backend is a :class:`GRFBackend` with one interface, *plan once per batch, apply per
layer*:

* :meth:`GRFBackend.plan` builds, on the batch's :class:`~pyg_grf.features.GRFLoads`, every
  structure the backend reads that does not depend on a layer's weights (pairs, mask statistics,
  sparse patterns and their transposes, block layout). They are cached on the loads, so the
  layers of a model share them, and they can be built ahead of the step (in a DataLoader
  worker: :mod:`pyg_grf.loader`);
* :meth:`GRFBackend.linear_sums` (linear modes) and :meth:`GRFBackend.softmax` (sparse softmax)
  apply one layer: its coefficients and features against those structures;
* :meth:`GRFBackend.memory` estimates the peak bytes of one layer from sizes known before
  anything large is built.

:data:`GRF_BACKENDS` maps the names ``'sparse'``, ``'pairs'``, ``'dense'`` to them;
:func:`choose_backend` is what ``backend='auto'`` picks (the cost model :func:`backend_costs`),
and :func:`check_backend_memory` refuses an explicit backend that cannot fit. The layer only
chooses and calls; the kernels are those of :mod:`pyg_grf.ops` and
:mod:`pyg_grf.nn.functional`."""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

from pyg_grf.features.blocks import BlockLayout, BlockTerms
from pyg_grf.features.join import JoinMemoryError, bytes_per_cell, compiled_join_available
from pyg_grf.features.loads import GRFLoads
from pyg_grf.memory import check_walk_memory
from pyg_grf.nn import functional as F

__all__ = ['GRFBackend', 'SparseBackend', 'PairsBackend', 'DenseBackend', 'GRF_BACKENDS',
           'BackendMemoryError', 'backend_memory', 'check_backend_memory', 'choose_backend',
           'backend_costs', 'join_bytes', 'mask_values', 'get_backend', 'remember_choice']


class BackendMemoryError(MemoryError):
    r"""Raised before a GRF backend allocates more than the memory available (or
    ``$PYG_GRF_MEMORY_LIMIT``); the message names the backend that fits."""


def backend_memory(grf: GRFLoads, backend: str, mode: str, heads: int, m: int, d: int,
                   batch: Optional[Tensor] = None, itemsize: int = 4) -> int:
    r"""Estimated peak bytes of one layer (forward and backward) of ``backend``
    (:meth:`GRFBackend.memory`)."""
    return get_backend(backend).memory(grf, mode, heads, m, d, batch, itemsize)


def check_backend_memory(grf: GRFLoads, backend: str, mode: str, heads: int, m: int, d: int,
                         batch: Optional[Tensor] = None, itemsize: int = 4,
                         device=None) -> None:
    r"""Raises :class:`BackendMemoryError` when :func:`backend_memory` exceeds the memory
    available (respecting cgroup limits and ``RLIMIT_AS``) or ``$PYG_GRF_MEMORY_LIMIT``."""
    estimate = backend_memory(grf, backend, mode, heads, m, d, batch, itemsize)

    def hint() -> str:  # evaluated only when the check fails
        need = {b: backend_memory(grf, b, mode, heads, m, d, batch, itemsize)
                for b in GRF_BACKENDS if b != backend}
        fits = min(need, key=need.get)
        return f"Use backend={fits!r} (about {need[fits] / 2**30:.2f} GiB) or 'auto'."
    check_walk_memory(estimate, device or grf.device, None,
                      lambda: f"GRFAttention(backend={backend!r}) on {grf.num_nodes} nodes "
                              f"(largest graph {grf.layout(batch).n})",
                      hint, error=BackendMemoryError)


def choose_backend(grf: GRFLoads, mode: str, heads: int, m: int, d: int,
                   batch: Optional[Tensor] = None, dtype: Optional[torch.dtype] = None) -> str:
    r"""The backend :obj:`'auto'` picks: the one planned for this layer shape by
    :meth:`GRFAttention.prepare <pyg_grf.nn.GRFAttention.prepare>` (e.g. in a DataLoader
    worker, :func:`remember_choice`), else the cheapest by :func:`backend_costs`."""
    grf._cached('_check', lambda: None)  # drops the caches after an in-place edit
    planned = grf._cache.get(_choice_key(grf, mode, heads, m, d, batch))
    if planned is not None:
        return planned
    costs = backend_costs(grf, mode, heads, m, d, batch, dtype)
    return min(costs, key=costs.get)


def remember_choice(grf: GRFLoads, backend: str, mode: str, heads: int, m: int, d: int,
                    batch: Optional[Tensor] = None) -> None:
    r"""Makes :func:`choose_backend` return ``backend`` for this layer shape on ``grf`` (the
    structures of that backend are planned): the forward then runs what was prepared for it,
    whatever the use counts of the cost model say. Dropped with the caches after an in-place
    edit of the loads."""
    grf._cache[_choice_key(grf, mode, heads, m, d, batch)] = backend


def _choice_key(grf: GRFLoads, mode, heads, m, d, batch):
    return ('planned', mode, heads, m, d, grf._batch_key(batch))


def backend_costs(grf: GRFLoads, mode: str, heads: int, m: int, d: int,
                  batch: Optional[Tensor] = None,
                  dtype: Optional[torch.dtype] = None) -> Dict[str, float]:
    r"""Estimated seconds (on one CPU core) of one layer, forward + backward, per backend, from
    the batch's sizes. With :math:`H` heads, feature size :math:`m`, value size :math:`d`,
    :math:`P_\Phi` the nonzeros of :math:`\widehat\Phi`, :math:`P_M` those of the symmetric
    mask, :math:`T` the size of the join that builds its statistics and :math:`B n_{max}^2` the
    padded block cells:

    * ``'sparse'`` (low rank, never forms the mask): :math:`c_1 P_\Phi H m (d + 1)` per CSR
      product (2 symmetric, 1 asymmetric) plus :math:`c_2 N H m (d + 1)` to form and contract
      the outer products;
    * ``'pairs'`` (the mask on its support): :math:`c_3 P H (m + d + 1)` with :math:`P = P_M`
      (symmetric) or :math:`P_\Phi`;
    * ``'dense'`` (padded blocks): :math:`c_4 B n_{max}^2 H (m + d + 1)(1 + n_{max} / 256)`
      (larger blocks fall out of cache), times 1.6 for the softmax mode;
    * ``'dense'``, symmetric: plus :math:`c_7 \cdot 3 B n_{max}^3 H` for the batched products
      :math:`\widehat\Phi_Q\widehat\Phi_K^\top` per graph (forward and backward);
    * the join (symmetric mask, pair backend), once per ``GRFLoads``: :math:`c_6 T` (several
      times more per term for one big graph, whose :math:`N^2` cells need a sort; about 7x
      less per term with the compiled join of :mod:`pyg_grf.features.join`), amortised
      over the layer calls that have used these loads so far (at least two: a batch's layers
      share it), and zero once built (e.g. by :meth:`GRFAttention.prepare
      <pyg_grf.nn.GRFAttention.prepare>` in a DataLoader worker). So a batch seen once pays
      it in full, while one full graph whose loads serve every step (full-graph training)
      moves to the pair backend after a few steps and pays it once. It is only run when that
      share plus the pair cost of :math:`P_\Phi` pairs (a lower bound) is below the sparse and
      dense estimates and its memory stays under 2 GiB: for the torch join, known from
      :math:`T` beforehand (:func:`join_bytes`; hub nodes make it large); the compiled join
      stops at the cells that fit, and pairs is then off for these loads.

    Measured per layer on one core (LRGB-sized batch / TU-sized batch / 16k grid, symmetric):
    sparse 334-355 / 83-108 / 631-673 ms, pairs 51-57 / 17-26 / 111-114 ms, dense 122-160 /
    19-21 / (not run) ms. On the TU-sized batch pairs and dense are within the run-to-run noise;
    the dense constant is set so that the padded blocks win only where the mask fills them (small
    dense graphs), where the pair backend does the same work through slower sparse kernels.

    At small widths the kernels cost per nonzero rather than per channel, and not even
    monotonically: on the motif batch of ``experiments/gkat_motifs.py`` (128 graphs of ~110
    nodes, 2 heads, 691k mask cells), per layer sparse / pairs / dense measured 50 / 82 / 86 ms
    at 2 channels per head, 34 / 127 / 67 ms at 4, 67 / 52 / 90 ms at 8 and 236 / 65 / 86 ms
    at 16. So the pair width counts as at least 40 channels, and each CSR product of
    ``'sparse'`` adds :math:`c_8 P_\Phi H`; with these, ``'auto'`` picks the fastest at
    every width above (while it once the join was cheap picked pairs at 4 channels per head,
    3.7x slower there).

    The constants were fitted with ``python bench/bench_batch.py --calibrate --threads 1`` on the
    2-core x86 CPU of our CI (the small-width terms by hand on the three batches above); only
    their ratios matter for the choice."""
    key = ('costs', mode, heads, m, d, grf._batch_key(batch))
    symmetric = mode == 'symmetric'

    def compute():
        N = grf.num_nodes
        P_phi = grf.pairs()[1].nnz
        costs = {}
        width = heads * m * (d + 1)
        if mode != 'sparse_softmax':
            costs['sparse'] = ((2 if symmetric else 1) * P_phi * (width * _C_SPMM
                                                               + heads * _C_SPMM_NNZ)
                               + N * width * _C_OUTER)
        lay = grf.layout(batch)
        # per cell: a few elementwise passes plus the two block products; larger blocks fall
        # out of cache (fitted on the LRGB- and TU-sized batches: n = 180 and n = 40, then
        # raised to break the TU-sized tie towards pairs, which wastes nothing on padding)
        dense = (lay.num_cells * heads * (m + d + 1) / 33 * _C_CELL * (1 + lay.n / 256))
        if mode == 'sparse_softmax':
            dense *= 1.6
        if not symmetric:
            costs['pairs'] = P_phi * heads * _pair_width(m, d) * _C_PAIR
            costs['dense'] = dense
            return costs, None
        # dense blocks: the mask is Phi_Q Phi_K^T per graph, one batched product (B n^3 per head
        # and product, forward and two in the backward), no join
        costs['dense'] = dense + 3 * lay.num_cells * lay.n * heads * _C_BMM
        T = grf.num_join_terms()
        # torch: batches coalesce the join by a mark array over their padded cells, one big
        # graph (N^2 cells) needs a sort of the terms; compiled: row by row, slower per term
        # on one big graph only through cache misses
        small = lay.num_cells <= max(8 * T, 1 << 24)
        if compiled_join_available(grf.device):
            c_join = _C_JOIN_COMPILED if small else _C_JOIN_COMPILED_BIG
        else:
            c_join = _C_JOIN if small else _C_JOIN_SORT
        # the torch join's memory is known from T; the compiled join bounds its cells as it
        # runs (tried once: beyond the bound, pairs is off for these loads, below)
        fits = compiled_join_available(grf.device) or join_bytes(grf) < _JOIN_MEMORY
        # the mask has at least the pairs of Phi: a lower bound of the pair backend before the
        # join is run
        return costs, (T * c_join, P_phi * heads * _pair_width(m, d) * _C_PAIR, fits)
    costs, join = grf._cached(key, compute)
    costs = dict(costs)
    if join is None:
        return costs
    total, lower, fits = join
    fits = fits and not grf._cache.get('join_too_big', False)
    uses = grf._count(('uses',) + key[1:])  # layer calls that costed these loads so far
    built = grf.has_terms(True, batch)
    share = 0.0 if built else total / max(2, uses)
    if built or (fits and lower + share < min(costs.values())):
        try:  # runs the join if not built
            terms = grf.block_terms(True, batch, dtype, max_cells=_join_cells(grf))
        except JoinMemoryError:
            grf._cache['join_too_big'] = True
            return costs
        costs['pairs'] = terms.cell.numel() * heads * _pair_width(m, d) * _C_PAIR + share
    return costs


def _pair_width(m: int, d: int) -> int:
    # below ~40 channels the sampled and sparse products do not get cheaper with the width
    # (index traffic, and slow kernel paths at some small widths): see backend_costs
    return max(m + d + 1, _PAIR_MIN_WIDTH)


def _num_coef(grf: GRFLoads) -> int:
    # statistics per cell of the symmetric mask: K (K + 1) / 2 hop pairs, K over both sides
    K = grf.max_hop + 1 if grf.key is None else max(grf.max_hop, grf.key.max_hop) + 1
    return K * (K + 1) // 2


def _join_cells(grf: GRFLoads) -> int:
    # the cells the compiled join may store within the join's memory bound
    return _JOIN_MEMORY // bytes_per_cell(_num_coef(grf))


def join_bytes(grf: GRFLoads) -> int:
    r"""Peak bytes of the join behind the symmetric mask statistics, bounded from its size
    :math:`T` (:meth:`~pyg_grf.features.GRFLoads.num_join_terms`): the torch join forms half
    the terms, ~10 values each (~48 bytes a term); the compiled one
    (:mod:`pyg_grf.features.join`) only its output, at most one upper-triangle cell per two
    terms (:func:`~pyg_grf.features.join.bytes_per_cell` each; the cells are in fact 7-8x
    fewer than the terms on batches and grids, so ``'auto'`` runs it under a bound on its
    cells instead of this estimate)."""
    T = grf.num_join_terms()
    if compiled_join_available(grf.device):
        return (T // 2 + grf.num_nodes) * bytes_per_cell(_num_coef(grf))
    return 48 * T


# Cost constants: seconds on one core (bench/bench_batch.py --calibrate --threads 1).
_C_SPMM = 2.4e-9
_C_SPMM_NNZ = 8.0e-8  # per nonzero and head of a CSR product, whatever its width (tiny widths)
_C_OUTER = 9.8e-9
_C_PAIR = 1.8e-9
_PAIR_MIN_WIDTH = 40
_C_CELL = 1.5e-8
_C_JOIN = 7.0e-8
_C_JOIN_SORT = 4.0e-7  # 262k grid: 10.7 s for 29M terms, default allocator
# compiled join (numba): LRGB-sized batch 24 ms for 2.49M terms; 64k grid 1.14 s for 31.6M
_C_JOIN_COMPILED = 1.0e-8
_C_JOIN_COMPILED_BIG = 3.6e-8
_C_BMM = 2.0e-10  # per multiply-add of the batched Phi Phi^T products
_JOIN_MEMORY = 2 ** 31  # bytes


# The backends #####################################################################################

def mask_values(grf: GRFLoads, terms: BlockTerms, f: Tensor, symmetric: bool,
                layout: BlockLayout) -> Tensor:
    r"""``[h, P]`` mask values on the cells of the f-independent statistics ``terms``
    (:meth:`GRFLoads.block_terms <pyg_grf.features.GRFLoads.block_terms>`) for coefficients ``f``
    ``[H, L + 1]``: :math:`M = \sum_{l \le l'} f_l f_{l'} S^{ll'}` (symmetric; the statistics of
    both orders are stored summed) or :math:`\widehat\Phi = \sum_l f_l S^l` (GRF paper, Eq. 7).
    On folded loads (walks per head) one row, each cell with its group's coefficients."""
    if symmetric:
        K = int(round(((8 * terms.num_coef + 1) ** 0.5 - 1) / 2))
        iu = torch.triu_indices(K, K, device=f.device)
        coef = f[:, iu[0]] * f[:, iu[1]]
    else:
        coef = f[:, :terms.num_coef]
    if grf.group is None:
        return terms.values(coef)
    return (terms.cell_stats() * coef[grf.cell_group(terms.cell, layout)]).sum(-1).unsqueeze(0)


class GRFBackend:
    r"""One way to compute the masked sums of a GRF layer (module docstring): :meth:`plan` once
    per batch, :meth:`linear_sums` / :meth:`softmax` per layer, :meth:`memory` before either.
    ``grf`` is the batch's :class:`~pyg_grf.features.GRFLoads` (its ``key`` the key-side loads of
    the symmetric mode, when independent); ``batch`` overrides the loads' own batch vector."""
    name: str = ''

    def memory(self, grf: GRFLoads, mode: str, heads: int, m: int, d: int,
               batch: Optional[Tensor] = None, itemsize: int = 4) -> int:
        raise NotImplementedError

    def plan(self, grf: GRFLoads, mode: str, heads: int, dtype: torch.dtype,
             batch: Optional[Tensor] = None) -> None:
        r"""Builds (and caches on ``grf``) every weight-independent structure that one layer of
        ``mode`` with ``heads`` heads reads, the mask statistics in ``dtype``."""
        for loads in (grf,) if grf.key is None else (grf, grf.key):
            loads._cached('hop_long', lambda: loads.hop.long())  # read by entry_values
        self._plan(grf, mode, heads, dtype, batch)

    def _plan(self, grf: GRFLoads, mode: str, heads: int, dtype: torch.dtype,
              batch: Optional[Tensor]) -> None:
        raise NotImplementedError

    def linear_sums(self, grf: GRFLoads, phi_q: Tensor, phi_k: Tensor, v: Tensor, f: Tensor,
                    symmetric: bool, batch: Optional[Tensor] = None) -> Tensor:
        r"""``[N, H, C + 1]``: the masked sums :math:`\sum_j M_{ij}\,\phi(k_j)^\top\phi(q_i)\,
        [v_j, 1]` (GRF paper, Algorithm 1), for the symmetric mask
        :math:`\widehat\Phi_Q\widehat\Phi_K^\top` or the asymmetric :math:`\widehat\Phi`."""
        raise NotImplementedError

    def softmax(self, grf: GRFLoads, q: Tensor, k: Tensor, v: Tensor, f: Tensor,
                dropout: float, training: bool, batch: Optional[Tensor] = None) -> Tensor:
        r"""``[N, H, C]``: softmax attention on the nonzeros of :math:`\widehat\Phi`, weighted by
        its entries (the ``'sparse_softmax'`` mode)."""
        # the sparse and pair backends coincide here: the pairs of Phi are the support
        _, pat = grf.pairs()
        return F.pair_weighted_softmax_attention(q, k, v, pat, grf.values(f), dropout, training)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}()'


class SparseBackend(GRFBackend):
    r"""Low rank, never forms the mask: CSR products with :math:`\widehat\Phi` (and its
    transpose) around the per-node outer products (GRF paper, Sec. 3.2, Eq. 9), :math:`O(N)`
    memory and time for a fixed walk budget."""
    name = 'sparse'

    def memory(self, grf, mode, heads, m, d, batch=None, itemsize=4):
        return (6 * grf.nnz * heads * itemsize
                + 4 * grf.num_nodes * heads * m * (d + 1) * itemsize)

    def _plan(self, grf, mode, heads, dtype, batch):
        # the low-rank products run on Phi's own pattern(s) and their transposes; the softmax
        # mode on the pattern repeated per head
        grf.pairs()[1].prepare(heads if mode == 'sparse_softmax' else 1)
        if mode == 'symmetric' and grf.key is not None:
            grf.key.pairs()[1].prepare(1)

    def linear_sums(self, grf, phi_q, phi_k, v, f, symmetric, batch=None):
        _, pat = grf.pairs()
        vals = grf.values(f)
        if not symmetric:
            return F.low_rank_masked_linear_attention(phi_q, phi_k, v, pat, vals,
                                                      return_sums=True)
        key = grf if grf.key is None else grf.key
        kvals = vals if grf.key is None else key.values(f)
        return F.low_rank_masked_linear_attention(phi_q, phi_k, v, pat, vals, key.pairs()[1],
                                                  kvals, return_sums=True)


class PairsBackend(GRFBackend):
    r"""The mask on its support: the pairs :math:`(i, j)` with :math:`M_{ij} \neq 0`, each a
    product of two feature vectors (an SDDMM and a sparse product). The symmetric mask's values
    are one small product of the pair statistics (a join of the walks on their visited nodes,
    built once per batch) with the layer's :math:`f_l f_{l'}`."""
    name = 'pairs'

    def memory(self, grf, mode, heads, m, d, batch=None, itemsize=4):
        if mode == 'symmetric':
            if grf.has_terms(True, batch):  # planned: the join is done, the mask is known
                return 6 * grf.term_cells(True, batch).numel() * heads * itemsize
            # the join (join_bytes), plus six values per mask entry and head (at most the
            # join's terms)
            T = grf.num_join_terms()
            return join_bytes(grf) + 6 * T * heads * itemsize
        return 6 * grf.nnz * heads * (m + d + 1) * itemsize

    def _plan(self, grf, mode, heads, dtype, batch):
        if mode == 'symmetric':
            grf.block_terms(True, batch, dtype)
            grf.mask_pattern(batch).prepare(heads)
        else:  # the pair products on Phi's pattern, repeated per head
            grf.pairs()[1].prepare(heads)

    def linear_sums(self, grf, phi_q, phi_k, v, f, symmetric, batch=None):
        if symmetric:
            lay = grf.layout(batch)
            terms = grf.block_terms(True, batch, f.dtype)
            return F.pair_masked_linear_attention(phi_q, phi_k, v, grf.mask_pattern(batch),
                                                  mask_values(grf, terms, f, True, lay),
                                                  return_sums=True)
        return F.pair_masked_linear_attention(phi_q, phi_k, v, grf.pairs()[1], grf.values(f),
                                              return_sums=True)


class DenseBackend(GRFBackend):
    r"""Padded ``[B, n, n]`` blocks per graph: :math:`\widehat\Phi` scattered into dense blocks,
    the symmetric mask as one batched product :math:`\widehat\Phi_Q\widehat\Phi_K^\top` (no join),
    then dense masked linear attention per graph. Best for small graphs that the mask fills."""
    name = 'dense'

    def memory(self, grf, mode, heads, m, d, batch=None, itemsize=4):
        # about six [B, H, n, n] tensors: the Phi blocks, the mask, the attention, their grads
        return 6 * grf.layout(batch).num_cells * heads * itemsize

    def _plan(self, grf, mode, heads, dtype, batch):
        if mode == 'sparse_softmax':
            grf.block_terms(False, batch, dtype)
            grf.block_support(batch)
            return
        grf.block_cells(batch)
        if mode == 'symmetric' and grf.key is not None:
            grf.key.block_cells(batch)

    def linear_sums(self, grf, phi_q, phi_k, v, f, symmetric, batch=None):
        lay = grf.layout(batch)
        M = grf.phi_blocks(f, batch)
        if symmetric:
            K = M if grf.key is None else grf.key.phi_blocks(f, batch)
            M = M @ K.transpose(-1, -2)
        o = F.block_masked_linear_attention(F.to_blocks(phi_q, lay), F.to_blocks(phi_k, lay),
                                            F.to_blocks(v, lay), M, return_sums=True)
        return F.from_blocks(o, lay)

    def softmax(self, grf, q, k, v, f, dropout, training, batch=None):
        lay = grf.layout(batch)
        terms = grf.block_terms(False, batch, f.dtype)
        W = F.blocks_from_values(mask_values(grf, terms, f, False, lay), terms.cell, lay)
        out = F.block_weighted_softmax_attention(
            F.to_blocks(q, lay), F.to_blocks(k, lay), F.to_blocks(v, lay), W,
            grf.block_support(batch), dropout, training)
        return F.from_blocks(out, lay)


GRF_BACKENDS: Dict[str, GRFBackend] = {b.name: b for b in
                                       (SparseBackend(), PairsBackend(), DenseBackend())}


def get_backend(name: str) -> GRFBackend:
    r"""The :class:`GRFBackend` called ``name`` (``'sparse'``, ``'pairs'`` or ``'dense'``)."""
    backend = GRF_BACKENDS.get(name) if isinstance(name, str) else None
    if backend is None:
        raise ValueError(f"a GRF backend must be one of {sorted(GRF_BACKENDS)}, got {name!r} "
                         f"('auto' is resolved by choose_backend)")
    return backend
