r"""The pure cost rule of GKAT's ``backend='auto'``: every backend that can compute the layer's
mask is costed from sizes alone (nothing is allocated or built), and the cheapest whose memory
estimate fits the budget of :func:`pyg_grf.memory.memory_budget` is chosen.

The costs are operation counts of a forward and backward pass, weighted by throughputs measured
on one CPU thread (``bench/bench_gkat.py``): a multiply-add of a per-head CSR or sampled product
costs :data:`SPARSE` units, one element of an elementwise pass over a per-head operand
:data:`ELEMENT`, a dense batched multiply-add :data:`DENSE`.

* ``'sparse'``: four products with :math:`\Psi` or :math:`\Psi^\top` per head (two forward,
  two backward) of width :math:`m (C + 1)`, and about ten elementwise passes over the
  ``[N, m (C + 1)]`` operand of each head;
* ``'pairs'``: three products per head over the :math:`P` pairs of widths :math:`m` (linear
  mode's sampled product) and :math:`C + 1` (the aggregation with the normaliser column), and
  about seven elementwise passes over the ``[H, P]`` coefficients;
* ``'dense'``: the padded ``[B, H, n, n]`` blocks.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from pyg_grf.memory import memory_budget

#: units of one multiply-add of a CSR / sampled product, of one element of an elementwise pass,
#: and of one multiply-add of a dense batched product
SPARSE, ELEMENT, DENSE = 1.0, 2.6, 0.1
#: elementwise passes per element: 'sparse' over N m (C + 1) per head, 'pairs' over P per head
SPARSE_PASSES, PAIR_PASSES = 10, 7

BACKENDS = {'linear': ('sparse', 'pairs', 'dense'), 'softmax': ('pairs', 'dense'),
            'dense': ('dense', )}


def costs(mode: str, num_nodes: int, psi_nnz: int, pairs: int, num_graphs: int,
          max_graph_nodes: int, heads: int, head_channels: int, feature_dim: int,
          exact: bool = True, pairs_built: bool = True, kernel_products: int = 0,
          itemsize: int = 4) -> Dict[str, Dict[str, float]]:
    r"""``{backend: {'cost': units, 'bytes': peak estimate}}`` for every backend that computes
    the mask of ``mode`` (``'sparse'`` only for the exact :math:`\Psi\Psi^\top`:
    ``exact``). ``pairs`` is the kernel's nonzeros (or the bound ``kernel_products`` when the
    pairs are not built yet: ``pairs_built=False``, which adds the cost of building them)."""
    N, H, C, m = num_nodes, heads, head_channels, feature_dim
    out: Dict[str, Dict[str, float]] = {}
    for backend in BACKENDS[mode]:
        if backend == 'sparse':
            if not exact:
                continue
            width = H * m * (C + 1)  # X_j = phi(k_j) (x) [v_j, 1], all heads
            out[backend] = dict(
                cost=4 * SPARSE * psi_nnz * width + SPARSE_PASSES * ELEMENT * N * width,
                # kept Psi Psi^T X of every head, four per-head temporaries, the head-major
                # operands
                bytes=(N * width * (1 + 4 / H) + 6 * N * H * (m + C + 1)) * itemsize)
        elif backend == 'pairs':
            P = pairs if pairs_built else kernel_products
            width = (m + C + 1) if mode == 'linear' else (C + 1)
            cost = 3 * SPARSE * P * H * width + PAIR_PASSES * ELEMENT * P * H
            # [H, P] coefficients and their gradients; no per-head copy of the pattern
            peak = 6 * P * H * itemsize + 4 * N * H * (C + 1) * itemsize
            if not pairs_built:  # Psi Psi^T once, in this call, and the pattern of the pairs
                cost += 4 * SPARSE * kernel_products
                peak = max(peak, 48 * kernel_products)
            out[backend] = dict(cost=cost, bytes=peak)
        else:  # dense per graph, padded to the largest
            cells = num_graphs * max_graph_nodes ** 2
            width = (m + C + 2) if mode == 'linear' else (C + 4)
            out[backend] = dict(cost=3 * DENSE * cells * H * width + 10 * cells * H,
                                bytes=(6 + 4 * H) * cells * itemsize)
    return out


def choose_backend(mode: str, budget: Optional[float] = None, **sizes: Any) -> str:
    r"""The backend ``'auto'`` runs for these sizes (the keyword arguments of :func:`costs`):
    the cheapest whose memory estimate fits ``budget`` bytes (:obj:`None`: no limit), else the
    one that needs least memory (whose own check then says what would fit). Pure: the same
    arguments, the same answer."""
    table = costs(mode, **sizes)
    fits = [b for b in table if budget is None or table[b]['bytes'] <= budget]
    if fits:
        return min(fits, key=lambda b: (table[b]['cost'], b))
    return min(table, key=lambda b: (table[b]['bytes'], b))


def plan_sizes(layer: Any, plan: Any, itemsize: int = 4) -> Dict[str, Any]:
    r"""The sizes of :func:`costs` for ``layer`` on ``plan`` (read from the plan's attributes,
    never built)."""
    pairs = plan.pairs if plan.pairs is not None and \
        plan.pairs.threshold == layer.threshold else None
    return dict(num_nodes=plan.num_nodes, psi_nnz=plan.psi_nnz,
                pairs=0 if pairs is None else pairs.index.size(1),
                pairs_built=pairs is not None, kernel_products=plan.kernel_products,
                num_graphs=plan.num_graphs, max_graph_nodes=plan.max_graph_nodes,
                heads=layer.heads, head_channels=layer.head_channels,
                feature_dim=layer.feature_dim, exact=plan.exact and layer.threshold == 0,
                itemsize=itemsize)


def needs_pairs(layer: Any, plan: Any) -> bool:
    r"""Whether ``layer`` may run on the kernel pairs of ``plan`` (so a plan built for it
    holds them): its backend is ``'pairs'``, or ``'auto'`` chooses ``'pairs'`` with the pairs'
    cost bounded by :func:`kernel_products`."""
    if getattr(layer, 'backend', None) == 'pairs':
        return True
    if getattr(layer, 'backend', None) != 'auto':
        return False
    sizes = plan_sizes(layer, plan)
    # costed as if built (the bound of their number), since the plan would build them once
    sizes.update(pairs=plan.kernel_products, pairs_built=True)
    budget, _ = memory_budget(plan.psi_value.device)
    return choose_backend(layer.mode, budget, **sizes) == 'pairs'
