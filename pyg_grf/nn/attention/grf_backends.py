r"""How a GRF layer computes its masked sums: the cost model that ``backend='auto'`` uses to pick
``'sparse'``, ``'pairs'`` or ``'dense'`` for a batch, and the memory estimates that refuse a backend
before it allocates more than the machine has (see ``docs/speed.md``). The backends themselves are
the kernels of :mod:`pyg_grf.ops` and :mod:`pyg_grf.nn.functional`, called by
:class:`~pyg_grf.nn.GRFAttention`; everything here depends only on the batch's loads and the
layer's sizes."""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

from pyg_grf.features.loads import GRFLoads

class BackendMemoryError(MemoryError):
    r"""Raised before a GRF backend allocates more than the memory available (or
    ``$PYG_GRF_MEMORY_LIMIT``); the message names the backend that fits."""


def backend_memory(grf: GRFLoads, backend: str, mode: str, heads: int, m: int, d: int,
                   batch: Optional[Tensor] = None, itemsize: int = 4) -> int:
    r"""Estimated peak bytes of one layer (forward and backward) of ``backend``, from sizes known
    before anything large is built: ``'dense'`` about six ``[B, H, n, n]`` tensors (the
    :math:`\widehat\Phi` blocks, the mask, the attention and their gradients); ``'pairs'``
    the join behind the symmetric mask (~48 bytes a term of :meth:`GRFLoads.num_join_terms`: the
    half join forms half of them, ~10 values each) plus six values per mask entry and head (at
    most the join's terms); ``'sparse'`` six values per
    nonzero of :math:`\widehat\Phi` and head, times the feature width."""
    if backend == 'dense':
        return 6 * grf.layout(batch).num_cells * heads * itemsize
    if backend == 'pairs':
        if mode == 'symmetric':
            T = grf.num_join_terms()
            return 48 * T + 6 * T * heads * itemsize
        return 6 * grf.nnz * heads * (m + d + 1) * itemsize
    return 6 * grf.nnz * heads * itemsize + 4 * grf.num_nodes * heads * m * (d + 1) * itemsize


def check_backend_memory(grf: GRFLoads, backend: str, mode: str, heads: int, m: int, d: int,
                         batch: Optional[Tensor] = None, itemsize: int = 4,
                         device=None) -> None:
    r"""Raises :class:`BackendMemoryError` when :func:`backend_memory` exceeds the memory
    available (respecting cgroup limits and ``RLIMIT_AS``) or ``$PYG_GRF_MEMORY_LIMIT``."""
    from pyg_grf.walks import check_walk_memory
    estimate = backend_memory(grf, backend, mode, heads, m, d, batch, itemsize)
    others = [b for b in ('sparse', 'pairs', 'dense') if b != backend]
    need = {b: backend_memory(grf, b, mode, heads, m, d, batch, itemsize) for b in others}
    fits = min(need, key=need.get)
    check_walk_memory(estimate, device or grf.device, None,
                      f"GRFAttention(backend={backend!r}) on {grf.num_nodes} nodes "
                      f"(largest graph {grf.layout(batch).n})",
                      f"Use backend={fits!r} (about {need[fits] / 2**30:.2f} GiB) or 'auto'.",
                      error=BackendMemoryError)


def choose_backend(grf: GRFLoads, mode: str, heads: int, m: int, d: int,
                   batch: Optional[Tensor] = None, dtype: Optional[torch.dtype] = None) -> str:
    r"""The backend :obj:`'auto'` picks: the cheapest by :func:`backend_costs`."""
    costs = backend_costs(grf, mode, heads, m, d, batch, dtype)
    return min(costs, key=costs.get)


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
      times more per term for one big graph, whose :math:`N^2` cells need a sort), amortised
      over the layer calls that have used these loads so far (at least two: a batch's layers
      share it), and zero once built (e.g. by :meth:`GRFAttention.prepare
      <pyg_grf.nn.GRFAttention.prepare>` in a DataLoader worker). So a batch seen once pays
      it in full, while one full graph whose loads serve every step (full-graph training)
      moves to the pair backend after a few steps and pays it once. It is only run when that
      share plus the pair cost of :math:`P_\Phi` pairs (a lower bound) is below the sparse and
      dense estimates and its memory (:func:`backend_memory`) stays under 2 GiB (:math:`T` is
      known beforehand; hub nodes make it large).

    Measured per layer on one core (LRGB-sized batch / TU-sized batch / 16k grid, symmetric):
    sparse 334-355 / 83-108 / 631-673 ms, pairs 51-57 / 17-26 / 111-114 ms, dense 122-160 /
    19-21 / (not run) ms. On the TU-sized batch pairs and dense are within the run-to-run noise;
    the dense constant is set so that the padded blocks win only where the mask fills them (small
    dense graphs), where the pair backend does the same work through slower sparse kernels.

    The constants were fitted with ``python bench/bench_batch.py --calibrate --threads 1`` on the
    2-core x86 CPU of our CI; only their ratios matter for the choice."""
    key = ('costs', mode, heads, m, d, grf._batch_key(batch))
    symmetric = mode == 'symmetric'

    def compute():
        N = grf.num_nodes
        P_phi = grf.pairs()[1].nnz
        costs = {}
        width = heads * m * (d + 1)
        if mode != 'sparse_softmax':
            costs['sparse'] = ((2 if symmetric else 1) * P_phi * width * _C_SPMM
                               + N * width * _C_OUTER)
        lay = grf.layout(batch)
        # per cell: a few elementwise passes plus the two block products; larger blocks fall
        # out of cache (fitted on the LRGB- and TU-sized batches: n = 180 and n = 40, then
        # raised to break the TU-sized tie towards pairs, which wastes nothing on padding)
        dense = (lay.num_cells * heads * (m + d + 1) / 33 * _C_CELL * (1 + lay.n / 256))
        if mode == 'sparse_softmax':
            dense *= 1.6
        if not symmetric:
            costs['pairs'] = P_phi * heads * (m + d + 1) * _C_PAIR
            costs['dense'] = dense
            return costs, None
        # dense blocks: the mask is Phi_Q Phi_K^T per graph, one batched product (B n^3 per head
        # and product, forward and two in the backward), no join
        costs['dense'] = dense + 3 * lay.num_cells * lay.n * heads * _C_BMM
        T = grf.num_join_terms()
        # batches coalesce the join by a mark array over their padded cells; one big graph
        # (N^2 cells) needs a sort of the terms, several times slower per term
        c_join = _C_JOIN if lay.num_cells <= max(8 * T, 1 << 24) else _C_JOIN_SORT
        fits = 48 * T < _JOIN_MEMORY  # the join's memory (backend_memory)
        # the mask has at least the pairs of Phi: a lower bound of the pair backend before the
        # join is run
        return costs, (T * c_join, P_phi * heads * (m + d + 1) * _C_PAIR, fits)
    costs, join = grf._cached(key, compute)
    costs = dict(costs)
    if join is None:
        return costs
    total, lower, fits = join
    uses = grf._count(('uses',) + key[1:])  # layer calls that costed these loads so far
    built = grf.has_terms(True, batch)
    share = 0.0 if built else total / max(2, uses)
    if built or (fits and lower + share < min(costs.values())):
        P = grf.block_terms(True, batch, dtype).cell.numel()  # runs the join if not built
        costs['pairs'] = P * heads * (m + d + 1) * _C_PAIR + share
    return costs


# Cost constants: seconds on one core (bench/bench_batch.py --calibrate --threads 1).
_C_SPMM = 2.4e-9
_C_OUTER = 9.8e-9
_C_PAIR = 1.8e-9
_C_CELL = 1.5e-8
_C_JOIN = 7.0e-8
_C_JOIN_SORT = 4.0e-7  # 262k grid: 10.7 s for 29M terms, default allocator
_C_BMM = 2.0e-10  # per multiply-add of the batched Phi Phi^T products
_JOIN_MEMORY = 2 ** 31  # bytes
