r"""The join behind the symmetric GRF mask statistics, compiled (optional ``numba``).

The symmetric mask is :math:`M = \widehat\Phi_Q\widehat\Phi_K^\top` with
:math:`\widehat\Phi = \sum_l f_l \Phi_l` (GRF paper, Sec. 3, Eq. 7 and Sec. 4), so its
f-independent statistics are, for every cell :math:`(i, j)` and hop pair :math:`(l, l')`,

.. math::
    S_{ij}^{l l'} = \sum_v (\Phi_{Q, l})_{iv} (\Phi_{K, l'})_{jv},

and a layer's mask values are :math:`M_{ij} = \sum_{l, l'} f_l f_{l'} S_{ij}^{l l'}`, with
:math:`(l, l')` and :math:`(l', l)` summed under one id
(:func:`~pyg_grf.features.blocks.symmetric_ids`). :func:`~pyg_grf.features.blocks.self_join_terms`
sums them by vectorised torch passes over all pairs of entries that share a visited node; here
the same sums run as one row-by-row sparse product (Gustavson's algorithm), compiled by
``numba``: no intermediate arrays of the pairs' size, the cells sorted row-major (the same sums
in another order, equal up to rounding).

Used on CPU tensors when ``numba`` is installed unless ``PYG_GRF_NUMBA=0``; otherwise the torch
join runs. The first call compiles the kernels (seconds) and says so in one log line (logger
``pyg_grf.features.join``, INFO); numba caches the compiled code in a user folder
(:func:`numba_cache_dir`: ``$NUMBA_CACHE_DIR``, else ``~/.cache/pyg_grf/numba``), never in the
installed package, and compiles in every process where that folder is not writable. A numba
that cannot compile here warns once and leaves the torch join; running out of memory in the
join is a :class:`JoinMemoryError`, which leaves the compiled join on.
"""
from __future__ import annotations

import logging
import os
import tempfile
import warnings
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

# whether the kernels ran once (then any later error is a real one), or why they cannot run;
# 'uncached': why the compiled code is not kept on disk (None: it is)
_state = {'ran': False, 'broken': None, 'uncached': None}

try:  # optional: the compiled join
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None


def numba_cache_dir() -> str:
    r"""The folder of the compiled join's numba cache: ``$NUMBA_CACHE_DIR`` when set, else
    ``$XDG_CACHE_HOME/pyg_grf/numba`` (``~/.cache/pyg_grf/numba``); never the installed
    package, which may be read-only or shared."""
    if numba is not None and numba.config.CACHE_DIR:  # numba reads $NUMBA_CACHE_DIR
        return numba.config.CACHE_DIR
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'pyg_grf', 'numba')


def _jit(f):
    if numba is None:  # pragma: no cover - never called: compiled_join_available is False
        return f
    folder = numba_cache_dir()
    try:  # writable? (else numba would fall back to the package's __pycache__)
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        _state['uncached'] = f"'{folder}': {exc}"
        return numba.njit(nogil=True)(f)
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, folder  # read when decorating
    try:  # compiles on first call, then cached on disk
        return numba.njit(cache=True, nogil=True)(f)
    except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available"
        _state['uncached'] = str(exc)
        return numba.njit(nogil=True)(f)
    finally:
        numba.config.CACHE_DIR = saved


def compiled_join_available(device: Optional[torch.device] = None) -> bool:
    r"""Whether :func:`compiled_join` runs for tensors on ``device``: ``numba`` is importable,
    ``device`` is the CPU, ``$PYG_GRF_NUMBA`` is not ``0`` and the kernels did not fail to
    compile in this process (:class:`CompiledJoinError`)."""
    return (numba is not None and _state['broken'] is None
            and os.environ.get('PYG_GRF_NUMBA', '1') != '0'
            and (device is None or torch.device(device).type == 'cpu'))


def warm_compiled_join() -> None:
    r"""Loads the compiled join's kernels (float32 loads) into this process, from numba's disk
    cache or by compiling them, if :func:`compiled_join_available` and not done yet. Processes
    forked from this one then start with them: a DataLoader worker, made anew every epoch,
    would otherwise load them again before its first plan (about 0.5 s each time)."""
    if compiled_join_available() and not _state['ran']:
        entries = torch.tensor([[0, 1], [1, 0]])
        try:
            compiled_join(entries, torch.zeros(2, dtype=torch.long), torch.ones(2), None, None,
                          None, 1, 2)
        except CompiledJoinError:  # warned once; the torch join runs instead
            pass


@_jit
def _counting_sort(key, N):
    # stable order of the entries by key (a CSR pointer and the permutation)
    ptr = np.zeros(N + 1, dtype=np.int64)
    for e in range(key.shape[0]):
        ptr[key[e] + 1] += 1
    for r in range(N):
        ptr[r + 1] += ptr[r]
    fill = ptr[:N].copy()
    order = np.empty(key.shape[0], dtype=np.int64)
    for e in range(key.shape[0]):
        order[fill[key[e]]] = e
        fill[key[e]] += 1
    return ptr, order


@_jit
def _join(row, col, hop, load, krow, kcol, khop, kload, N, ids, num_coef, upper, max_cells,
          exact):
    # query entries by start node; key entries by visited node, each group by start node
    # (a stable sort by visited node of the key entries already ordered by start node)
    q_ptr, q_order = _counting_sort(row, N)
    by_row = q_order if upper else _counting_sort(krow, N)[1]  # upper: keys are the queries
    kcol_r = kcol[by_row]
    k_ptr, k_order = _counting_sort(kcol_r, N)
    k_order = by_row[k_order]
    return _gustavson(q_ptr, col[q_order], hop[q_order], load[q_order], k_ptr, krow[k_order],
                      khop[k_order], kload[k_order], ids, num_coef, upper, max_cells, exact)


@_jit
def _first_partner(k_ptr, k_row, v, i, upper):
    # the first key entry of visited node v to pair with row i: all of them, or with the upper
    # triangle only (partners sorted by row) those of rows >= i, by bisection
    lo, hi = k_ptr[v], k_ptr[v + 1]
    if upper:
        while lo < hi:
            mid = (lo + hi) // 2
            if k_row[mid] < i:
                lo = mid + 1
            else:
                hi = mid
    return lo


#: Inputs of more entries than this get a symbolic pass that sizes the join's output exactly
#: (below it, one pass from a first guess of 4 cells per entry is faster).
EXACT_ABOVE = 2 ** 20


@_jit
def _gustavson(q_ptr, q_col, q_hop, q_load, k_ptr, k_row, k_hop, k_load, ids, num_coef,
               upper, max_cells, exact):
    N = q_ptr.shape[0] - 1
    width = 1  # the most pairs of one row: a bound on its distinct columns
    for i in range(N):
        w = 0
        for e in range(q_ptr[i], q_ptr[i + 1]):
            w += k_ptr[q_col[e] + 1] - k_ptr[q_col[e]]
        width = max(width, min(w, N))
    slot = np.full(N, -1, dtype=np.int64)  # column -> its place in the row being built
    cols = np.empty(width, dtype=np.int64)  # the row's columns
    out_ptr = np.zeros(N + 1, dtype=np.int64)
    if exact:
        # a symbolic pass first (big inputs): the distinct columns of every row, so that the
        # output is allocated once at its exact size, not at a first guess of 4 cells per
        # entry grown by copying (the statistics are most of the plan's bytes)
        for i in range(N):
            cnt = 0
            for e in range(q_ptr[i], q_ptr[i + 1]):
                v = q_col[e]
                for t in range(_first_partner(k_ptr, k_row, v, i, upper), k_ptr[v + 1]):
                    j = k_row[t]
                    if slot[j] < 0:
                        slot[j] = cnt
                        cols[cnt] = j
                        cnt += 1
            for a in range(cnt):
                slot[cols[a]] = -1
            out_ptr[i + 1] = out_ptr[i] + cnt
            if out_ptr[i + 1] > max_cells:
                return out_ptr, np.empty(0, dtype=np.int64), np.empty((0, num_coef),
                                                                       dtype=q_load.dtype), False
        cap = max(out_ptr[N], 1)
    else:  # small inputs: one pass, from a first guess
        cap = min(max(16, 4 * q_col.shape[0]), max_cells)
    acc = np.zeros((width, num_coef), dtype=q_load.dtype)  # the row's statistics, by place
    out_col = np.empty(cap, dtype=np.int64)
    stats = np.empty((cap, num_coef), dtype=q_load.dtype)
    for i in range(N):  # numeric pass
        cnt = 0
        for e in range(q_ptr[i], q_ptr[i + 1]):
            v, wq = q_col[e], q_load[e]
            idrow = ids[q_hop[e]]
            for t in range(_first_partner(k_ptr, k_row, v, i, upper), k_ptr[v + 1]):
                j = k_row[t]
                s = slot[j]
                if s < 0:
                    s = cnt
                    slot[j] = s
                    cols[s] = j
                    cnt += 1
                acc[s, idrow[k_hop[t]]] += wq * k_load[t]
        start = out_ptr[i]
        if start + cnt > cap:  # grow the output (first guess only), up to max_cells
            if start + cnt > max_cells:
                return out_ptr, out_col[:0], stats[:0], False
            while start + cnt > cap:
                cap *= 2
            cap = min(cap, max_cells)
            grown = np.empty(cap, dtype=np.int64)
            grown[:start] = out_col[:start]
            out_col = grown
            grown_stats = np.empty((cap, num_coef), dtype=q_load.dtype)
            grown_stats[:start] = stats[:start]
            stats = grown_stats
        if cnt > 32:  # the row's columns in order (in place)
            cols[:cnt].sort()
        else:  # short rows, the common case: insertion sort
            for a in range(1, cnt):
                j = cols[a]
                b = a - 1
                while b >= 0 and cols[b] > j:
                    cols[b + 1] = cols[b]
                    b -= 1
                cols[b + 1] = j
        for a in range(cnt):
            j = cols[a]
            s = slot[j]
            out_col[start + a] = j
            for c in range(num_coef):
                stats[start + a, c] = acc[s, c]
                acc[s, c] = 0
            slot[j] = -1
        out_ptr[i + 1] = start + cnt
    P = out_ptr[N]
    if P == cap:  # exact (symbolic pass): no copy
        return out_ptr, out_col, stats, True
    return out_ptr, out_col[:P].copy(), stats[:P].copy(), True


@_jit
def _mirror(out_ptr, out_col):
    # all cells of a symmetric mask from its upper triangle (j >= i), row-major: row r holds
    # the mirrors (r, i) of the upper cells (i, r), i < r, then its own upper cells; src is
    # the upper cell each reads, mirror the position of its mirror cell (its transpose)
    N = out_ptr.shape[0] - 1
    lower = np.zeros(N + 1, dtype=np.int64)
    for a in range(out_ptr[N]):
        lower[out_col[a] + 1] += 1
    for i in range(N):  # minus the diagonal, counted above as its own mirror
        if out_ptr[i + 1] > out_ptr[i] and out_col[out_ptr[i]] == i:
            lower[i + 1] -= 1
    ptr = np.zeros(N + 1, dtype=np.int64)
    for r in range(N):
        ptr[r + 1] = ptr[r] + lower[r + 1] + out_ptr[r + 1] - out_ptr[r]
    P = ptr[N]
    # int32: 4 bytes per cell and array (compiled_join checks that the cells fit)
    row, col, src = (np.empty(P, dtype=np.int32), np.empty(P, dtype=np.int32),
                     np.empty(P, dtype=np.int32))
    lower_at = np.empty(out_ptr[N], dtype=np.int64)  # where an upper cell's mirror went
    fill = ptr[:N].copy()
    for i in range(N):  # rows in order: each row's mirrors arrive sorted by i
        for a in range(out_ptr[i], out_ptr[i + 1]):
            j = out_col[a]
            if j > i:
                f = fill[j]
                row[f], col[f], src[f] = j, i, a
                lower_at[a] = f
                fill[j] = f + 1
    mirror = np.empty(P, dtype=np.int32)
    for r in range(N):
        f = fill[r]
        for a in range(out_ptr[r], out_ptr[r + 1]):
            row[f], col[f], src[f] = r, out_col[a], a
            if out_col[a] == r:
                mirror[f] = f
            else:
                mirror[f] = lower_at[a]
                mirror[lower_at[a]] = f
            f += 1
    return row, col, src, mirror


def _check_entries(prefix: str, index: Tensor, hop: Tensor, load: Tensor, K: int,
                   num_nodes: int) -> None:
    r"""Raises a :class:`ValueError` for entries the kernels would read out of bounds: ids
    outside ``[0, num_nodes)``, hop counts outside ``[0, K)``, lengths that differ."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"compiled_join: 'num_nodes' must be a non-negative int, got "
                         f"{num_nodes!r}")
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"compiled_join: 'K' must be a positive int, got {K!r}")
    if index.dim() != 2 or index.size(0) != 2:
        raise ValueError(f"compiled_join: '{prefix}index' must be [2, nnz], got "
                         f"{list(index.shape)}")
    n = index.size(1)
    if hop.shape != (n, ) or load.shape != (n, ):
        raise ValueError(f"compiled_join: '{prefix}hop' and '{prefix}load' need one value per "
                         f"entry ([{n}]), got {list(hop.shape)} and {list(load.shape)}")
    if n == 0:
        return
    lo, hi = int(index.min()), int(index.max())
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"compiled_join: '{prefix}index' must hold node ids in "
                         f"[0, {num_nodes}), got ids in [{lo}, {hi}]")
    lo, hi = int(hop.min()), int(hop.max())
    if lo < 0 or hi >= K:
        raise ValueError(f"compiled_join: '{prefix}hop' must hold hop counts in [0, {K}) "
                         f"(K={K}), got [{lo}, {hi}]")


def _cached_on_disk() -> bool:
    r"""Whether numba's on-disk cache holds compiled code of every kernel for this numba and
    this source (numba's own index of the cache; after an upgrade it is stale)."""
    try:
        return all(kernel._cache._cache_file._load_index()
                   for kernel in (_counting_sort, _join, _gustavson, _mirror))
    except Exception:  # noqa: BLE001 - no cache (NullCache), another numba, a damaged index
        return False


def _say_if_compiling() -> None:
    # one line, once per process, before the pause of the first compilation
    if _state.get('said') or _cached_on_disk():
        return
    _state['said'] = True
    if _state.get('uncached'):
        where = (f"not cached: no writable cache folder ({_state['uncached']}); set "
                 f"NUMBA_CACHE_DIR to one")
    else:
        try:
            where = f"cached in '{_join._cache._cache_path}' for later runs"
        except AttributeError:  # pragma: no cover - another numba
            where = 'cached on disk for later runs'
    log.info(f"Compiling the GRF join with numba (first use: 3-10 s, up to a minute on a busy "
             f"machine; {where})")


class Join(NamedTuple):
    r"""The output of :func:`compiled_join`: the cells ``(row, col)`` (global node ids,
    row-major), their statistics ``stats`` ``[P', num_coef]``, the statistics row ``src``
    ``[P]`` of every cell (:obj:`None`: one row per cell) and, for a symmetric pattern,
    ``mirror`` ``[P]``, the position of the cell ``(col, row)`` (the transpose's order)."""
    row: Tensor
    col: Tensor
    stats: Tensor
    src: Optional[Tensor] = None
    mirror: Optional[Tensor] = None


class JoinMemoryError(MemoryError):
    r"""Raised by :func:`compiled_join` when the statistics would take more cells than its
    ``max_cells`` (known only as the join runs), or when an allocation in the kernels fails."""


class CompiledJoinError(RuntimeError):
    r"""Raised by :func:`compiled_join` when its kernels cannot compile or run in this process
    (e.g. a numba built for another numpy); it warns once, and :func:`compiled_join_available`
    is :obj:`False` from then on."""


def compiled_join(index: Tensor, hop: Tensor, load: Tensor, key_index: Optional[Tensor],
                  key_hop: Optional[Tensor], key_load: Optional[Tensor], K: int,
                  num_nodes: int, max_cells: Optional[int] = None) -> Join:
    r"""The symmetric statistics :math:`S_{ij}` (module docstring) of query entries
    (``index`` ``[2, nnz]`` of (start node, visited node), ``hop``, ``load``) against key
    entries (``key_*``; :obj:`None` for :math:`\widehat\Phi\widehat\Phi^\top`, whose
    statistics are symmetric, :math:`S_{ij} = S_{ji}` under the merged ids: only the upper
    triangle :math:`j \ge i` is summed, half the pairs, and mirrored).

    Returns a :class:`Join`: the statistics ``[P', K (K + 1) / 2]`` are in the dtype of
    ``load`` (float32 or float64), with the coefficient ids of
    :func:`~pyg_grf.features.blocks.symmetric_ids`; ``src`` and ``mirror`` are set for the
    self join only. Raises :class:`JoinMemoryError` if :math:`P'` exceeds ``max_cells``
    (default: no limit)."""
    from pyg_grf.features.blocks import symmetric_ids
    self_join = key_index is None
    # the kernels index arrays by these ids unchecked: an id out of range is a segfault
    _check_entries('', index, hop, load, K, num_nodes)
    if not self_join:
        _check_entries('key_', key_index, key_hop, key_load, K, num_nodes)
    np_ = lambda t: t.long().contiguous().numpy()  # noqa: E731
    query = (np_(index[0]), np_(index[1]), np_(hop), load.contiguous().numpy())
    keys = query if self_join else (np_(key_index[0]), np_(key_index[1]), np_(key_hop),
                                    key_load.to(load.dtype).contiguous().numpy())
    if not _state['ran']:
        _say_if_compiling()
    try:
        out_ptr, col, stats, ok = _join(
            *query, *keys, num_nodes, symmetric_ids(K).numpy(),
            K * (K + 1) // 2, self_join, 2 ** 62 if max_cells is None else max(int(max_cells), 0),
            index.size(1) > EXACT_ABOVE)
        if ok and self_join:
            if 2 * out_ptr[-1] >= 2 ** 31 or num_nodes >= 2 ** 31:  # int32 ids of the cells
                raise MemoryError(f"{2 * out_ptr[-1]} cells exceed the int32 ids of the join")
            row, col_all, src, mirror = _mirror(out_ptr, col)
    except MemoryError as e:  # an allocation in the kernels: not the environment's fault
        raise JoinMemoryError(f"the compiled GRF join ran out of memory ({e}) on {index.size(1)} "
                              f"entries of {num_nodes} nodes; use another backend ('sparse' "
                              f"never forms the mask) or smaller batches") from e
    except Exception as e:
        if _state['ran']:  # compiled and ran before: a real error, not the environment
            raise
        _state['broken'] = f'{type(e).__name__}: {e}'
        warnings.warn(f"the compiled GRF join (numba) cannot run here ({_state['broken']}); "
                      "the torch join is used instead (PYG_GRF_NUMBA=0 skips the attempt)",
                      RuntimeWarning)
        raise CompiledJoinError(_state['broken']) from e
    _state['ran'] = True
    if not ok:
        # peak bytes per stored cell: its statistics (float64 at most) and column, and about
        # two cells of the full pattern (row, column, statistics row and mirror each)
        per_cell = 8 * (K * (K + 1) // 2) + 8 + 2 * 32
        raise JoinMemoryError(f"the GRF mask statistics need more than max_cells={max_cells} "
                              f"cells ({per_cell} bytes each); use another backend ('sparse' "
                              "never forms the mask)")
    if self_join:
        return Join(*(torch.from_numpy(a) for a in (row, col_all, stats, src, mirror)))
    out_ptr = torch.from_numpy(out_ptr)
    row = torch.repeat_interleave(torch.arange(num_nodes), out_ptr.diff(),
                                  output_size=int(out_ptr[-1]))
    return Join(row, torch.from_numpy(col), torch.from_numpy(stats))
