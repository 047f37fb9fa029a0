r"""What ``backend='auto'`` picks for a GRF layer: a pure function of sizes.

:func:`plan_sizes` measures a batch once; :func:`backend_costs` turns the sizes and a layer's
shape into seconds per backend and :func:`backend_memory` into bytes; :func:`choose_backend`
returns the cheapest backend whose memory fits (:func:`pyg_grf.memory.memory_budget`). Nothing
here runs a join or reads a cache: the same sizes give the same answer whatever ran before.

Seconds of one layer, forward and backward, with :math:`H` heads (1 when the heads are folded
into the nodes), feature size :math:`m`, value size :math:`d`, :math:`P_\Phi` the pairs of
:math:`\widehat\Phi`, :math:`P_M` the mask's cells (estimated :math:`T / 7` from the join's
terms :math:`T`) and :math:`B n_{max}^2` the padded cells of :math:`B` graphs:

* ``'sparse'``: :math:`c_1 P_\Phi H m (d + 1)` per CSR product (2 symmetric, 1 asymmetric)
  plus :math:`c_8 P_\Phi H` per product plus :math:`c_2 N H m (d + 1)` for the outer products;
* ``'pairs'``: :math:`c_3 P H \max(m + d + 1, 40) + c_9 H` with :math:`P = P_M` (symmetric)
  or :math:`P_\Phi`, plus, once per plan, the join :math:`c_6 T` (symmetric);
* ``'dense'``: :math:`c_4 B n_{max}^2 H (m + d + 1)(1 + n_{max} / 256)` (times 1.6 for the
  softmax mode) plus :math:`c_5 B`, plus :math:`3 c_7 B n_{max}^3 H` for the batched products
  :math:`\widehat\Phi_Q\widehat\Phi_K^\top` (symmetric).

The constants are fitted on one CPU core (``bench/bench_batch.py --calibrate``); only their
ratios matter. On CUDA two of those ratios differ, measured on an H200 (``bench/gpu_check.py``,
section ``backends``, kNN graphs of 262k and 1M nodes): the torch join costs
:math:`c_{10} T` (in the CPU's units: the join took 0.95-1.11x one 'pairs' layer there, not the
sort's 12x), and in the symmetric mode ``'sparse'`` costs 0.19 times its CPU estimate
relative to ``'pairs'`` (it took 2.2-2.4x a 'pairs' layer, against the CPU's 12x). ``'dense'``
and the other modes keep their CPU ratios (not measured on a GPU). The memory estimates get the
same measurement: on CUDA a 'pairs' plan needs at least 80 bytes per join term (the torch
join's peak was 77), and a 'sparse' layer 1.45 times its CPU estimate (cuSPARSE's buffers:
1.40-1.41x measured). The ``'sparse_softmax'`` mode has two backends: the support of
:math:`\widehat\Phi` (``'sparse'``, which ``'pairs'`` names too) and ``'dense'``.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import torch

from pyg_grf.features.blocks import block_layout, num_join_terms
from pyg_grf.features.join import compiled_join_available
from pyg_grf.features.loads import GRFLoads
from pyg_grf.memory import memory_budget
from pyg_grf.nn.attention.grf import dense, pairs, sparse


class BackendMemoryError(MemoryError):
    r"""Raised before a GRF plan or layer allocates more than the memory available (or
    ``$PYG_GRF_MEMORY_LIMIT``); the message names the backend that fits, if any."""


class PlanSizes(NamedTuple):
    r"""The sizes of a batch that the choice of a backend reads (:func:`plan_sizes`)."""
    num_nodes: int
    num_entries: int
    num_pairs: int        # distinct (start, visited) pairs of Phi
    join_terms: int       # T: query/key entry pairs sharing a visited node (0: asymmetric)
    block_cells: int      # B n_max^2
    max_nodes: int        # n_max
    num_coef: int         # statistics per mask cell
    compiled_join: bool   # whether the join runs compiled (numba, CPU)
    num_graphs: int = 1
    device_type: str = 'cpu'  # where the plan is built and the layers run

    @property
    def mask_cells(self) -> int:
        r""":math:`P_M` estimated for the costs (:math:`T / 7`, at least the pairs of
        :math:`\widehat\Phi`)."""
        if not self.join_terms:
            return self.num_pairs
        return max(min(self.join_terms // 7, self.block_cells), self.num_pairs)


def plan_sizes(loads: GRFLoads, mode: str) -> PlanSizes:
    r"""The :class:`PlanSizes` of ``loads`` for ``mode`` (:math:`O(\mathrm{nnz})`, one host
    read)."""
    N = loads.num_nodes
    P = loads.pairs()[0].size(1)
    lay = block_layout(loads.batch, N, loads.device)
    symmetric = mode == 'symmetric'
    K = loads.max_hop + 1 if loads.key is None else max(loads.max_hop, loads.key.max_hop) + 1
    return PlanSizes(N, loads.nnz, P, num_join_terms(loads) if symmetric else 0,
                     lay.num_cells, lay.n, K * (K + 1) // 2 if symmetric else K,
                     compiled_join_available(loads.device), lay.num_graphs,
                     loads.device.type)


def backend_costs(sizes: PlanSizes, mode: str, heads: int, m: int, d: int,
                  num_layers: int = 1) -> Dict[str, float]:
    r"""Estimated seconds per backend of building a plan's structures once and running
    ``num_layers`` layers of this shape on it, forward and backward (module docstring)."""
    s = sizes
    width = heads * m * (d + 1)
    pair_width = max(m + d + 1, _PAIR_MIN_WIDTH)
    dense_cost = s.block_cells * heads * (m + d + 1) * _C_CELL * (1 + s.max_nodes / 256)
    if mode == 'sparse_softmax':
        support = s.num_pairs * heads * pair_width * _C_PAIR * 1.5
        return {'sparse': num_layers * support,
                'dense': num_layers * (1.6 * dense_cost + s.num_graphs * _C_GRAPH)}
    symmetric = mode == 'symmetric'
    costs = {'sparse': num_layers * ((2 if symmetric else 1) * s.num_pairs
                                     * (width * _C_SPMM + heads * _C_SPMM_NNZ)
                                     + s.num_nodes * width * _C_OUTER)}
    if not symmetric:
        costs['pairs'] = num_layers * heads * (s.num_pairs * pair_width * _C_PAIR
                                               + _C_PAIR_CALL)
        costs['dense'] = num_layers * (dense_cost + s.num_graphs * _C_GRAPH)
        return costs
    big = s.block_cells > max(8 * s.join_terms, 1 << 24)  # one big graph: a sorted join
    cuda = s.device_type == 'cuda'
    if s.compiled_join:
        c_join = _C_JOIN_COMPILED_BIG if big else _C_JOIN_COMPILED
    elif cuda:
        c_join = _C_JOIN_CUDA
    else:
        c_join = _C_JOIN_SORT if big else _C_JOIN
    if cuda:
        costs['sparse'] *= _CUDA_SPARSE
    costs['pairs'] = (s.join_terms * c_join
                      + num_layers * heads * (s.mask_cells * pair_width * _C_PAIR
                                              + _C_PAIR_CALL))
    costs['dense'] = num_layers * (dense_cost + s.num_graphs * _C_GRAPH + 3 * s.block_cells
                                   * s.max_nodes * heads * _C_BMM)
    return costs


def backend_memory(sizes: PlanSizes, backend: str, mode: str, heads: int, m: int, d: int,
                   itemsize: int = 4) -> int:
    r"""Estimated peak bytes of ``backend``'s plan structures and one layer's forward and
    backward (each backend module's ``memory``)."""
    s = sizes
    if backend == 'dense':
        return dense.memory(s.block_cells, heads, itemsize)
    cuda = s.device_type == 'cuda'
    if backend == 'pairs' and mode != 'sparse_softmax':
        symmetric = mode == 'symmetric'
        cells = s.join_terms // 4 + s.num_nodes if symmetric else s.num_pairs
        need = pairs.memory(cells, s.num_coef, heads, itemsize, symmetric)
        if cuda and symmetric:  # the torch join's keys and partners: 77 B per term on an H200
            need = max(need, _CUDA_JOIN_BYTES * s.join_terms)
        return need
    if mode == 'sparse_softmax':
        return s.num_pairs * (48 + 8 * heads * itemsize)
    need = sparse.memory(s.num_nodes, s.num_pairs, heads, m, d, itemsize)
    return int(need * _CUDA_SPARSE_MEMORY) if cuda else need  # cuSPARSE's buffers


def choose_backend(sizes: PlanSizes, mode: str, heads: int, m: int, d: int,
                   num_layers: int = 1, itemsize: int = 4,
                   device: Optional[torch.device] = None) -> str:
    r"""The backend ``'auto'`` runs: the cheapest by :func:`backend_costs` whose
    :func:`backend_memory` fits the memory budget of ``device``; raises
    :class:`BackendMemoryError` if none fits."""
    costs = backend_costs(sizes, mode, heads, m, d, num_layers)
    budget, source = memory_budget(device)
    need = {b: backend_memory(sizes, b, mode, heads, m, d, itemsize) for b in costs}
    fits = [b for b in costs if budget is None or need[b] <= budget]
    if not fits:
        raise BackendMemoryError(_too_big('auto', sizes, need, budget, source))
    return min(fits, key=costs.get)


def check_backend(sizes: PlanSizes, backend: str, mode: str, heads: int, m: int, d: int,
                  itemsize: int = 4, device: Optional[torch.device] = None) -> None:
    r"""Raises :class:`BackendMemoryError` before an explicit ``backend`` allocates more than
    the memory budget of ``device``."""
    budget, source = memory_budget(device)
    if budget is None:
        return
    need = backend_memory(sizes, backend, mode, heads, m, d, itemsize)
    if need <= budget:
        return
    others = {b: backend_memory(sizes, b, mode, heads, m, d, itemsize)
              for b in backend_costs(sizes, mode, heads, m, d)}
    raise BackendMemoryError(_too_big(backend, sizes, others, budget, source))


def max_join_cells(device: Optional[torch.device], num_coef: int) -> Optional[int]:
    r"""The most mask cells the compiled join may store within the memory budget (it stops
    there instead of running out of memory)."""
    budget, _ = memory_budget(device)
    return None if budget is None else int(budget // (4 * num_coef + 72))


def _too_big(backend: str, s: PlanSizes, need: Dict[str, int], budget: float,
             source: str) -> str:
    gib = 2 ** 30
    est = ', '.join(f'{b!r} {v / gib:.2f} GiB' for b, v in need.items())
    fits = [b for b in need if need[b] <= budget]
    hint = (f"Use backend={min(fits, key=need.get)!r}." if fits and backend != 'auto' else
            "Use fewer walks or a shorter max_length, or train on parts of the graph "
            "(pyg_grf.loader.NodePartLoader).")
    return (f"GRFAttention(backend={backend!r}) on {s.num_nodes} nodes ({s.num_entries} walk "
            f"entries, largest graph {s.max_nodes}) needs more than {source} "
            f"({budget / gib:.2f} GiB): estimated {est}. {hint} To try anyway, set "
            f"$PYG_GRF_MEMORY_LIMIT=off (or a size such as 64G).")


# Cost constants: seconds on one core (bench/bench_batch.py --calibrate --threads 1).
_C_SPMM = 2.4e-9
_C_SPMM_NNZ = 8.0e-8  # per nonzero and head of a CSR product, whatever its width (tiny widths)
_C_OUTER = 9.8e-9
_C_PAIR = 1.5e-9
_C_PAIR_CALL = 1.2e-4  # per head and layer: the six sparse kernel calls of the pair kernel
_PAIR_MIN_WIDTH = 40
_C_CELL = 1.24e-9  # per cell, head and channel of the padded blocks
_C_GRAPH = 5.0e-5  # per graph of the dense blocks
_C_JOIN = 7.0e-8
_C_JOIN_SORT = 4.0e-7  # 262k grid: 10.7 s for 29M terms, default allocator
_C_JOIN_COMPILED = 1.0e-8  # LRGB-sized batch 24 ms for 2.49M terms
_C_JOIN_COMPILED_BIG = 3.6e-8  # 64k grid 1.14 s for 31.6M terms
_C_BMM = 5.0e-11  # per multiply-add of the batched Phi Phi^T products
# CUDA, in the CPU's units (H200, kNN 262k / 1M: join 20 / 62 ms, a 'pairs' layer 18 / 65 ms,
# a 'sparse' layer 39 / 156 ms, T = 45M / 182M)
_C_JOIN_CUDA = 3.5e-8
_CUDA_SPARSE = 0.19
# and their peaks: the 'pairs' plan 3.3 / 12.9 GiB, a 'sparse' layer 1.41x / 1.40x its estimate
_CUDA_JOIN_BYTES = 80
_CUDA_SPARSE_MEMORY = 1.45
