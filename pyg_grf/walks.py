r"""The random-walk engine shared by graph random features (GRF paper, Sec. 3.3, Algorithm 1) and
RWGNK features (FTFI paper, Sec. 4.2).

All walkers move in lockstep: one Python iteration per *step*, each a handful of vectorised tensor
operations over every walker at once, on a CSR view of the graph. There is no loop over nodes,
walkers or edges.

Conventions (PyG's): an edge ``(u, v)`` in ``edge_index`` lets a walker step from ``u`` to ``v``,
so a directed graph is walked along its edge directions and an undirected PyG graph (both
directions stored) is walked both ways. Every stored edge is one choice: a node's degree is its
number of out-edges, a multi-edge is chosen proportionally to its multiplicity and a self-loop is a
step that stays put. A node with no out-edges (isolated, or a sink of a directed graph) ends every
walk that reaches it.
"""
from __future__ import annotations

import itertools
import math
import os
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import check_int, is_sorted

# memory checks (re-exported: public names of this module)
from pyg_grf.memory import (  # noqa: F401
    CHECK_ABOVE,
    MEMORY_LIMIT_ENV,
    WalkMemoryError,
    check_walk_memory,
    estimate_walk_memory,
)

WALKERS = ('iid', 'antithetic', 'repelling')


class RandomWalks(NamedTuple):
    r"""A batch of ``W = S * n`` walks, walker ``w`` being walk ``w % n`` out of ``start[w]``.

    Hops are stored as a flat, step-major *hop list* (no padding): the hops taken at step ``t``
    (``t = 1..L``) are records ``step_ptr[t - 1]:step_ptr[t]``, made by walkers
    ``order[:step_ptr[t] - step_ptr[t - 1]]`` in that order. So the walkers that take hop ``t``
    are a prefix of those that took hop ``t - 1`` and record ``j`` of step ``t`` continues record
    ``j`` of step ``t - 1``: a per-walk running product (importance weights) is a slice per step.
    """
    start: Tensor     # [W] start node of every walker
    length: Tensor    # [W] number of hops taken
    order: Tensor     # [W] walkers sorted by decreasing number of *scheduled* hops
    step_ptr: Tensor  # [L + 1] offsets of each step's records (step_ptr[0] == 0)
    node: Tensor      # [R] node reached by each hop, -1 if the walker had already stopped
    edge: Tensor      # [R] id (column of edge_index) of the edge taken, -1 likewise
    num_walks: int    # walks per start node n
    max_length: int   # L

    @property
    def num_walkers(self) -> int:
        return self.start.numel()

    def record_walker(self) -> Tensor:
        r"""``[R]`` walker id of every hop record."""
        counts = self.step_ptr.diff()
        if counts.numel() == 0:
            return self.order[:0]
        local = torch.arange(int(self.step_ptr[-1]), device=self.order.device) - \
            self.step_ptr[:-1].repeat_interleave(counts)
        return self.order[local]

    def record_step(self) -> Tensor:
        r"""``[R]`` hop number (``1..L``) of every hop record."""
        steps = torch.arange(1, self.step_ptr.numel(), device=self.order.device)
        return steps.repeat_interleave(self.step_ptr.diff())


def check_edge_index(edge_index: Tensor, num_nodes: int) -> None:
    r"""Raises a :class:`ValueError` that says what was expected if ``edge_index`` is not a
    ``[2, E]`` integer tensor with entries in ``[0, num_nodes)``."""
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"'edge_index' must be a Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"'edge_index' must have shape [2, num_edges], got "
                         f"{tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise ValueError(f"'edge_index' must hold integers, got dtype {edge_index.dtype}")
    if num_nodes < 0:
        raise ValueError(f"'num_nodes' must be non-negative, got {num_nodes}")
    if edge_index.numel() > 0:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise ValueError(f"'edge_index' holds node ids in [{lo}, {hi}] but the graph has "
                             f"{num_nodes} nodes: it must hold node ids in [0, {num_nodes})")


def to_csr(edge_index: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""CSR view of ``edge_index``: ``(rowptr [N + 1], col [E], perm [E], deg [N])`` with ``perm``
    mapping CSR positions back to edge ids."""
    src = edge_index[0].long()
    if is_sorted(src):
        perm = torch.arange(src.numel(), device=src.device)  # already sorted (PyG's usual order)
    else:
        perm = torch.argsort(src, stable=True)
    col = edge_index[1].long()[perm]
    deg = torch.bincount(src, minlength=num_nodes)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=src.device)
    torch.cumsum(deg, 0, out=rowptr[1:])
    return rowptr, col, perm, deg


def check_walk_args(num_walks, p_halt, max_length, walker, fixed_length):
    r"""Raises a :class:`ValueError` naming the argument (what was expected, what came) unless
    the walk settings of :func:`sample_walks` (and of the transforms built on it) are valid."""
    check_int('num_walks', num_walks, 1)
    check_int('max_length', max_length, 0)
    if walker not in WALKERS:
        raise ValueError(f"'walker' must be one of {WALKERS}, got {walker!r}")
    if not fixed_length:
        if p_halt is None or not (0.0 < float(p_halt) < 1.0) or math.isnan(float(p_halt)):
            raise ValueError(f"'p_halt' must lie in the open interval (0, 1), got {p_halt!r} "
                             f"(use fixed_length=True for walks that never halt)")


def sample_walks(edge_index: Tensor, num_nodes: int, num_walks: int, p_halt: Optional[float],
                 max_length: int, *, walker: str = 'iid', fixed_length: bool = False,
                 start: Optional[Tensor] = None,
                 generator: Optional[torch.Generator] = None,
                 memory_limit: Optional[float] = None) -> RandomWalks:
    r"""Samples ``num_walks`` random walks out of every start node.

    A walker at node :math:`u` first halts with probability :math:`p_{halt}` (never, if
    ``fixed_length``), otherwise steps along one of the :math:`d_u` out-edges of :math:`u` chosen
    uniformly. Every walk is truncated after ``max_length`` hops.

    Walker schemes (each walker's marginal law is the same simple halting walk in all three, so
    every estimator built on them stays unbiased):

    * ``'iid'``: independent walkers.
    * ``'antithetic'``: antithetic termination (Reid et al., 2023). Walkers ``2j`` and ``2j + 1``
      of a start node draw their halting uniforms as :math:`u` and :math:`(u + 1/2) \bmod 1`, so
      for :math:`p_{halt} \le 1/2` the pair never halts at the same step; their lengths are
      negatively correlated.
    * ``'repelling'``: repelling walkers (Reid et al., 2024). Walkers out of the same start node
      that stand on the same node at the same step choose neighbours by stratified sampling: the
      :math:`r`-th of :math:`c` of them takes neighbour
      :math:`\lfloor d_u\,((U + r/c) \bmod 1)\rfloor` with one shared :math:`U \sim U[0, 1)`. Each
      choice is marginally uniform, and the :math:`c` walkers take :math:`c` distinct neighbours
      whenever :math:`c \le d_u`.

    Args:
        edge_index (Tensor): ``[2, E]`` edges (see module docstring for direction, multi-edges,
            self-loops and isolated nodes).
        num_walks (int): walks per start node :math:`n \ge 1`.
        p_halt (float): halting probability in :math:`(0, 1)`; ignored (may be :obj:`None`) if
            ``fixed_length``.
        max_length (int): maximum number of hops (``L``).
        walker (str): ``'iid'``, ``'antithetic'`` or ``'repelling'`` (default: ``'iid'``).
        fixed_length (bool): walks never halt and take exactly ``max_length`` hops unless they
            reach a node without out-edges (default: :obj:`False`).
        start (Tensor, optional): start nodes (default: all nodes ``0..N-1``).
        generator (torch.Generator, optional): random source, for reproducibility.
        memory_limit (float, optional): refuse (:class:`WalkMemoryError`, before allocating)
            when the estimated peak memory (:func:`estimate_walk_memory`) exceeds this many
            bytes; ``float('inf')`` never refuses (default: ``$PYG_GRF_MEMORY_LIMIT`` if set,
            else 90% of the memory available on the device).

    Returns:
        :class:`RandomWalks` with ``W = len(start) * num_walks`` walkers.
    """
    check_walk_args(num_walks, p_halt, max_length, walker, fixed_length)
    check_edge_index(edge_index, num_nodes)
    device = edge_index.device
    start = _start_nodes(start, num_nodes, device)
    n, L = num_walks, max_length
    S = start.numel()
    _check_sample_memory(S, n, L, p_halt, fixed_length, walker, edge_index.size(1), num_nodes,
                         device, memory_limit)
    walker_start = start.repeat_interleave(n)

    # 1) Halting: every walker's number of hops, before truncation at a node without out-edges.
    hops = _sample_hops(S, n, L, p_halt, walker, fixed_length, generator, device)
    # 2) Walkers by decreasing length: those still moving at step t are a prefix.
    order, counts = _walk_order(hops, L, fixed_length)
    # 3) CSR with a ghost node for the nodes without out-edges, then the walk itself.
    csr = _GhostCSR.build(edge_index, num_nodes)
    node, pos, step_ptr = _take_steps(csr, walker_start.index_select(0, order), order, counts,
                                      walker, n, num_nodes, generator)
    # 4) Trim the walks that entered the ghost node and map CSR positions to edge ids.
    if csr.has_sinks:
        node = node.masked_fill(node == num_nodes, -1)
        pos = csr.pos[pos]  # ghost edges map to -1
    perm = csr.perm
    edge = torch.where(pos >= 0, perm[pos.clamp_min(0)], pos) if not _is_identity(perm) else pos
    length = hops
    if csr.has_sinks:
        walker_of = RandomWalks(walker_start, hops, order, step_ptr, node, edge, n,
                                L).record_walker()
        length = torch.bincount(walker_of[node >= 0], minlength=S * n)
    return RandomWalks(start=walker_start, length=length, order=order, step_ptr=step_ptr,
                       node=node, edge=edge, num_walks=n, max_length=L)


def _start_nodes(start: Optional[Tensor], num_nodes: int, device: torch.device) -> Tensor:
    if start is None:
        return torch.arange(num_nodes, device=device)
    start = start.long().to(device)
    if start.numel() > 0 and (int(start.min()) < 0 or int(start.max()) >= num_nodes):
        raise ValueError(f"'start' nodes must lie in [0, {num_nodes}), got range "
                         f"[{int(start.min())}, {int(start.max())}]")
    return start


def _check_sample_memory(S: int, n: int, L: int, p_halt: Optional[float], fixed_length: bool,
                         walker: str, num_edges: int, num_nodes: int, device: torch.device,
                         memory_limit: Optional[float]) -> None:
    # The estimate of estimate_walk_memory, checked (check_walk_memory) when it could matter.
    estimate = estimate_walk_memory(S, n, L, p_halt, fixed_length, walker, num_edges, num_nodes)
    if estimate < CHECK_ABOVE and memory_limit is None and not os.environ.get(MEMORY_LIMIT_ENV):
        return
    per_walk = max(estimate_walk_memory(S, 1, L, p_halt, fixed_length, walker), 1)
    check_walk_memory(
        estimate, device, memory_limit,
        f"sample_walks with {S} start nodes x num_walks={n} = {S * n} walkers, "
        f"max_length={L}",
        f"Lower 'num_walks' (each walk per start node costs about "
        f"{per_walk / 2**20:.1f} MiB here) or 'max_length', or sample a subset of start "
        f"nodes at a time ('start').")


def _sample_hops(S: int, n: int, L: int, p_halt: Optional[float], walker: str,
                 fixed_length: bool, generator: Optional[torch.Generator],
                 device: torch.device) -> Tensor:
    r"""``[S * n]`` pre-sampled number of hops of every walker, truncated at ``L``, with
    :math:`P(\mathrm{len} \ge k) = (1 - p_{halt})^k` for every scheme."""
    W = S * n
    if fixed_length or L == 0:
        return torch.full((W,), L, dtype=torch.long, device=device)
    if walker == 'antithetic' and float(p_halt) <= 0.5:
        return _antithetic_hops_disjoint(S, n, L, float(p_halt), generator, device)
    if walker == 'antithetic':
        # Per step, walkers (2j, 2j+1) use uniforms u and (u + 1/2) mod 1 (p > 1/2: both may
        # halt at the same step).
        P = (n + 1) // 2
        u = torch.rand((S, P, L), generator=generator, device=device)
        u = torch.stack([u, torch.remainder(u + 0.5, 1.0)], dim=2).view(S, 2 * P, L)[:, :n]
        halted = (u < p_halt).view(W, L)
        return torch.where(halted.any(1), halted.float().argmax(1),
                           torch.full((W,), L, device=device)).long()
    u = torch.rand(W, generator=generator, device=device).clamp_min_(1e-12)
    return torch.floor(torch.log(u) / math.log1p(-float(p_halt))).long().clamp_max_(L)


def _antithetic_hops_disjoint(S: int, n: int, L: int, p: float,
                              generator: Optional[torch.Generator],
                              device: torch.device) -> Tensor:
    # Per step, walkers (2j, 2j+1) halt on u < p and on (u + 1/2) mod 1 < p: for p <= 1/2 the
    # two events are disjoint, so each step has three outcomes (first halts, second halts,
    # neither) with probabilities p, p, 1 - 2p, independently across steps. Sampled in closed
    # form per pair instead of per step: the first step T at which either halts is geometric
    # with 2p, a fair coin says which one, and the other one halts after a further geometric
    # number of steps with p. Same law as the per-step draws, O(1) per pair.
    P = (n + 1) // 2
    u = torch.rand((3, S, P), generator=generator, device=device).clamp_min_(1e-12)
    if p >= 0.5:
        first = torch.zeros((S, P), dtype=torch.long, device=device)
    else:
        first = torch.floor(torch.log(u[0]) / math.log1p(-2.0 * p)).long()
    other = first + 1 + torch.floor(torch.log(u[1]) / math.log1p(-p)).long()
    swap = u[2] < 0.5
    pair = torch.stack([torch.where(swap, other, first), torch.where(swap, first, other)],
                       dim=2)  # [S, P, 2]
    return pair.view(S, 2 * P)[:, :n].reshape(S * n).clamp_max_(L)


def _walk_order(hops: Tensor, L: int, fixed_length: bool) -> Tuple[Tensor, List[int]]:
    r"""Walkers by decreasing number of hops (``order``), so that the walkers still moving at
    step ``t`` are a prefix (no compaction), and ``counts[t]``: the walkers that take hop
    ``t + 1``. The sort is stable: start-node order, hence locality, is kept; the key
    ``L - hops`` is sorted as uint8 when it fits (radix sort on one byte)."""
    W = hops.numel()
    if L == 0 or fixed_length:
        order = torch.arange(W, device=hops.device)
    else:
        key = (L - hops).to(torch.uint8 if L < 256 else torch.int32)
        order = torch.sort(key, stable=True)[1]
    alive_count = torch.bincount(hops, minlength=L + 1).flip(0).cumsum(0).flip(0)  # [L + 1]
    alive_count = alive_count.tolist()  # alive_count[t]: walkers with hops >= t
    return order, (alive_count[1:] if L > 0 else [])


class _GhostCSR(NamedTuple):
    r"""CSR of a graph with a ghost node ``N``: every node without out-edges gets one edge to
    ``N``, and ``N`` loops on itself; walkers that enter ``N`` have ended. ``table`` packs the
    CSR offset, the degree and the degree - 1 of every node (one gather per step); ``pos`` maps
    extended CSR positions to real ones (``-1`` for ghost edges; :obj:`None` without sinks) and
    ``perm`` real CSR positions to edge ids."""
    table: Tensor
    col: Tensor
    pos: Optional[Tensor]
    perm: Tensor
    has_sinks: bool

    @classmethod
    def build(cls, edge_index: Tensor, num_nodes: int) -> '_GhostCSR':
        rowptr, col, perm, deg = to_csr(edge_index, num_nodes)
        device = col.device
        sinks = deg == 0
        has_sinks = bool(sinks.any())
        ext_pos = None
        if has_sinks:
            deg = torch.cat([torch.where(sinks, 1, deg), deg.new_ones(1)])
            rowptr = torch.zeros(num_nodes + 2, dtype=torch.long, device=device)
            torch.cumsum(deg, 0, out=rowptr[1:])
            ext_col = torch.full((int(rowptr[-1]),), num_nodes, dtype=torch.long, device=device)
            real = torch.repeat_interleave(~torch.cat([sinks, sinks.new_ones(1)]), deg)
            ext_col[real] = col
            ext_pos = torch.full_like(ext_col, -1)
            ext_pos[real] = torch.arange(col.numel(), device=device)
            col = ext_col
        table = torch.stack([rowptr[:-1], deg, deg - 1], dim=1)
        return cls(table, col, ext_pos, perm, has_sinks)


def _take_steps(csr: _GhostCSR, cur: Tensor, order: Tensor, counts: List[int], walker: str,
                n: int, num_nodes: int, generator: Optional[torch.Generator]
                ) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Moves the walkers (current nodes ``cur``, in ``order``) in lockstep, ``counts[t]`` of
    them at step ``t + 1``; returns the step-major hop records ``(node, pos, step_ptr)`` (node
    reached and extended CSR position of the edge taken), written in place: the step loop
    allocates nothing."""
    device = cur.device
    ptr = [0, *itertools.accumulate(counts)]
    node = torch.empty(ptr[-1], dtype=torch.long, device=device)
    pos = torch.empty(ptr[-1], dtype=torch.long, device=device)
    step_ptr = torch.tensor(ptr, dtype=torch.long, device=device)
    A0 = counts[0] if counts else 0
    rd_buf = torch.empty(A0, 3, dtype=torch.long, device=device)
    # Neighbour choice: floor(d * u) with u uniform in float64 (2^53 values), so every one of
    # the d neighbours has probability 1/d up to a relative error ~ d * 2^-53, the weight the
    # importance sampling assumes. (A float32 u has only 2^24 values: relative bias 4.6e-3 at
    # degree 1e5, 4.6e-2 at 1e6.)
    r_buf = torch.empty(A0, dtype=torch.float64, device=device)
    k_buf = torch.empty(A0, dtype=torch.long, device=device)
    for t, A in enumerate(counts):  # A: walkers that take hop t + 1
        if A == 0:
            break
        cur = cur[:A]
        rd = torch.index_select(csr.table, 0, cur, out=rd_buf[:A])
        base, d, d_last = rd[:, 0], rd[:, 1], rd[:, 2]
        if walker == 'repelling':
            r = _stratified_uniforms(order[:A] // n * (num_nodes + 1) + cur, generator)
        else:
            r = torch.rand(A, generator=generator, device=device, out=r_buf[:A])
        r.mul_(d)                            # uniform in [0, d), float64
        k = k_buf[:A].copy_(r)               # truncation to the neighbour's rank
        k.clamp_max_(d_last)                 # guards float rounding up to d
        p = pos[ptr[t]:ptr[t + 1]]
        torch.add(base, k, out=p)
        cur = torch.index_select(csr.col, 0, p, out=node[ptr[t]:ptr[t + 1]])
    return node, pos, step_ptr


def _is_identity(perm: Tensor) -> bool:
    return perm.numel() == 0 or bool((perm == torch.arange(perm.numel(), device=perm.device)).all())


def _stratified_uniforms(key: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    r"""For walkers grouped by ``key`` (same start node and same current node), returns
    :math:`(U_g + r/c_g) \bmod 1` for the :math:`r`-th of the :math:`c_g` walkers of group
    :math:`g`, with one :math:`U_g \sim U[0, 1)` per group: marginally uniform, and
    :math:`c_g \le d` walkers land in distinct cells of :math:`[0, 1)` split into :math:`d`.
    """
    key_sorted, order = torch.sort(key, stable=True)
    uniq, inv_sorted, counts = torch.unique_consecutive(key_sorted, return_inverse=True,
                                                        return_counts=True)
    first = torch.cumsum(counts, 0) - counts
    rank_sorted = torch.arange(key.numel(), device=key.device) - first[inv_sorted]
    # float64: an exact-enough neighbour index at any degree (see sample_walks)
    u = torch.rand(uniq.numel(), generator=generator, device=key.device, dtype=torch.float64)
    r_sorted = torch.remainder(u[inv_sorted] + rank_sorted.double() / counts[inv_sorted].double(),
                               1.0)
    r = torch.empty_like(r_sorted)
    r[order] = r_sorted
    return r
