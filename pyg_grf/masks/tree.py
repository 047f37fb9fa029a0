r"""Shortest-path masks on forests by dynamic programming over tree levels (FTFI paper, Sec. 3.3,
Lemma 3.5 and App. A.8 for :math:`f = \exp(a\,\cdot + b)`; Sec. 6, Lemma 6.2 and App. A.11.2 for
an arbitrary :math:`f` of the hop distance)."""
from __future__ import annotations

import itertools
from typing import List, Optional, Tuple, Union

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import connected_components
from torch import Tensor

from pyg_grf._validation import is_sorted
from pyg_grf.masks.base import MaskOperator, format_param, head_param
from pyg_grf.walks import check_edge_index


def _shift(z: Tensor) -> Tensor:
    r"""Moves the distance axis (dim 1) one step out: ``out[:, k] = z[:, k - 1]``,
    ``out[:, 0] = 0`` (the last entry drops off)."""
    return torch.cat([torch.zeros_like(z[:, :1]), z[:, :-1]], dim=1)


class TreeMask(MaskOperator):
    r"""Mask of a forest given by a function of the tree distance between nodes (FTFI paper,
    Sec. 3.3 and Sec. 6). Two kinds:

    * exponential of an affine map of the *weighted* distance (Lemma 3.5, App. A.8),

      .. math::
          M_{ij} = \exp\big(a \cdot \mathrm{dist}(i, j) + b\big),

      computed in :math:`O(NC)` by two passes. Rooting every tree, the upward pass (leaves to
      roots) gathers the subtree sums
      :math:`s_i = e^b x_i + \sum_{c \in \mathrm{ch}(i)} e^{a w_{ic}} s_c`; the downward pass
      (roots to leaves) sets :math:`y_r = s_r` at a root and
      :math:`y_i = o_i + s_i` for a node :math:`i` with parent :math:`p`, where
      :math:`o_i = e^{a w_{ip}}(o_p + e^b x_p + \sum_{j \in \mathrm{sib}(i)} e^{a w_{jp}} s_j)`
      sums over the nodes outside the subtree of :math:`i` (all reached through :math:`p`;
      :math:`o_r = 0`). This equals the lemma's :math:`e^{a w_{ip}} y_p + (1 - e^{2 a w_{ip}}) s_i`
      but never subtracts, so it stays accurate for :math:`a > 0`;

    * an arbitrary function of the *hop* distance (Lemma 6.2, App. A.11.2),
      :math:`M_{ij} = f[\mathrm{dist}(i, j)]`, in :math:`O(NC \cdot \mathrm{diam})` time and memory:
      the upward pass builds per node the table :math:`g_i[k]` of the sums of :math:`x` over the
      descendants :math:`k` hops below :math:`i`,
      :math:`g_i = e_0 x_i + \sum_{c} \mathrm{shift}(g_c)`; the downward pass builds the table
      :math:`h_i[k]` of the sums over *all* nodes :math:`k` hops away,
      :math:`h_i = g_i + \mathrm{shift}(h_p - \mathrm{shift}(g_i))`, and
      :math:`y_i = \sum_k f[k]\, h_i[k]`.

    :math:`M_{ij} = 0` for nodes in different trees: a PyG batch of trees gives the
    block-diagonal mask directly.

    Every tree is rooted at its smallest node id. The constructor finds the parents and levels
    once (breadth-first, one vectorised step per level); :meth:`matmul` runs one vectorised
    step per tree level, so its Python overhead grows with the largest tree height. The result
    is differentiable in ``a``, ``b``, ``f`` (and ``edge_weight``).

    Args:
        edge_index (Tensor): ``[2, E]`` edges of a forest, in one or both directions; duplicates
            are merged. Self-loops and cycles raise a :class:`ValueError`.
        num_nodes (int): :math:`N`.
        edge_weight (Tensor, optional): ``[E]`` edge lengths for the weighted distance
            (default: :obj:`None`, all ones). The two directions of an edge must agree. Only for
            the exponential mask.
        a (float or Tensor, optional): slope :math:`a` of the exponential mask, a scalar or ``[H]``
            for one mask per head (default: :obj:`None`).
        b (float or Tensor): offset :math:`b`, a scalar or ``[H]`` (default: :obj:`0.0`).
        f (Tensor, optional): ``[K]`` or ``[H, K]`` weights of the hop distances, ``f[..., k]``
            for distance :math:`k`; :math:`K` must be at least the largest tree diameter plus one
            (default: :obj:`None`). Exactly one of ``a`` and ``f`` must be given.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, edge_weight: Optional[Tensor] = None,
                 *, a: Optional[Union[float, Tensor]] = None, b: Union[float, Tensor] = 0.0,
                 f: Optional[Tensor] = None):
        if (a is None) == (f is None):
            raise ValueError("TreeMask needs exactly one of 'a' (exp(a * dist + b) mask) and 'f' "
                             f"(f[dist] mask), got a={'None' if a is None else 'given'} and "
                             f"f={'None' if f is None else 'given'}")
        if f is not None and edge_weight is not None:
            raise ValueError("'f' indexes unweighted hop distances; 'edge_weight' is only used "
                             "with 'a' (exp(a * dist + b)), got both 'f' and 'edge_weight'")
        self.num_nodes = N = int(num_nodes)
        device = edge_index.device
        # dtype of to_dense(): that of the tensor arguments (default dtype if none).
        self._dense_dtype = torch.get_default_dtype()
        for t in (edge_weight, a, b, f):
            if isinstance(t, Tensor) and t.is_floating_point():
                self._dense_dtype = torch.promote_types(self._dense_dtype, t.dtype)
        self._build_forest(edge_index, N, edge_weight)

        self.a = self.b = self.f = None
        heads = set()
        if a is not None:
            self.a = head_param(a, 'a', device)
            self.b = head_param(b, 'b', device)
            for p in (self.a, self.b):
                if p.dim() == 1:
                    heads.add(p.numel())
            if len(heads) > 1:
                raise ValueError(f"per-head 'a' and 'b' must have the same length, got "
                                 f"{tuple(self.a.shape)} and {tuple(self.b.shape)}")
        else:
            if not isinstance(f, Tensor) or f.dim() not in (1, 2):
                got = tuple(f.shape) if isinstance(f, Tensor) else type(f)
                raise ValueError(f"'f' must have shape [K] or [H, K], got {got}")
            self.diameter = self._diameter()
            if f.size(-1) < self.diameter + 1:
                raise ValueError(f"'f' is too short: the forest has diameter {self.diameter}, so "
                                 f"'f' needs at least {self.diameter + 1} entries, got "
                                 f"{f.size(-1)}")
            if not f.is_floating_point():
                f = f.float()
            self.f = f
            if f.dim() == 2:
                heads.add(f.size(0))
        self.num_heads = heads.pop() if heads else None

    # ----------------------------------------------------------------------------------------
    # Construction: validation, rooting, levels.
    def _build_forest(self, edge_index: Tensor, N: int, edge_weight: Optional[Tensor]):
        device = edge_index.device
        uu, vv, w = _forest_edges(edge_index, N, edge_weight)
        M = uu.numel()
        # Components (scipy, linear time) and the forest condition |E| = N - #components.
        adj = sp.coo_matrix((np.ones(M), (uu.cpu().numpy(), vv.cpu().numpy())), shape=(N, N))
        num_comp, labels = connected_components(adj, directed=False)
        if M != N - num_comp:
            raise ValueError(f"TreeMask needs a forest (no cycles), but the graph has {M} "
                             f"undirected edges on {N} nodes in {num_comp} connected components "
                             f"(a forest has exactly {N - num_comp})")
        labels = torch.from_numpy(labels).long().to(device)
        self.num_trees = num_comp
        roots = torch.full((num_comp, ), N, dtype=torch.long, device=device).scatter_reduce(
            0, labels, torch.arange(N, device=device), 'amin')
        parent, parent_edge, levels = _bfs_levels(uu, vv, roots, N)
        self._set_levels(levels, parent, parent_edge)
        self.parent, self.parent_edge, self.roots = parent, parent_edge, roots
        self.edge_length = w  # [M] or None (unit lengths)

    def _set_levels(self, levels: List[Tensor], parent: Tensor, parent_edge: Tensor):
        # Node order by level; per level the parent's position inside the previous level.
        N, device = parent.numel(), parent.device
        self.perm = torch.cat(levels)  # new position -> node id
        self.inv_perm = torch.empty_like(self.perm)
        self.inv_perm[self.perm] = torch.arange(N, device=device)
        self.level_sizes = [lv.numel() for lv in levels]
        self.level_offsets = offsets = [0, *itertools.accumulate(self.level_sizes)]
        self.parent_local: List[Optional[Tensor]] = [None]
        self.parent_edge_level: List[Optional[Tensor]] = [None]
        # Per level: position of every node among its siblings, counted from the first and from
        # the last sibling, and the largest sibling group (for the sibling scans of the exact
        # downward pass). Breadth-first order keeps the children of a parent contiguous.
        self.sibling_pos: List[Optional[Tuple[Tensor, Tensor, int, Tensor, int]]] = [None]
        for lv, off in zip(levels[1:], offsets[:-2]):
            pl = self.inv_perm[parent[lv]] - off
            self.parent_local.append(pl)
            self.parent_edge_level.append(parent_edge[lv])
            if not is_sorted(pl):  # pragma: no cover
                raise RuntimeError('TreeMask: children of a parent are not contiguous')
            first = torch.searchsorted(pl, pl, right=False)
            last = torch.searchsorted(pl, pl, right=True) - 1
            idx = torch.arange(pl.numel(), device=device)
            pos, rpos = idx - first, last - idx
            group_id = torch.unique_consecutive(pl, return_inverse=True)[1]
            self.sibling_pos.append((pos, rpos, int((last - first).max()) + 1, group_id,
                                     int(group_id[-1]) + 1 if pl.numel() else 0))

    def _diameter(self) -> int:
        # Height of every node (upward, per level), then the longest path whose top node is p:
        # the two largest (height(c) + 1) over the children c of p.
        N = self.num_nodes
        if N == 0:
            return 0
        height = torch.zeros(N, dtype=torch.long, device=self.perm.device)
        off = self.level_offsets
        for lvl in range(len(self.level_sizes) - 1, 0, -1):
            nodes = self.perm[off[lvl]:off[lvl + 1]]
            height.scatter_reduce_(0, self.parent[nodes], height[nodes] + 1, 'amax')
        child = (self.parent >= 0).nonzero().view(-1)
        if child.numel() == 0:
            return 0
        p, val = self.parent[child], height[child] + 1
        best1 = torch.zeros(N, dtype=torch.long, device=p.device).scatter_reduce(0, p, val, 'amax')
        # Drop one child attaining the maximum (the smallest id), then take the max again.
        is_max = val == best1[p]
        pick = torch.full((N, ), N, dtype=torch.long, device=p.device).scatter_reduce(
            0, p[is_max], child[is_max], 'amin')
        rest = pick[p] != child
        best2 = torch.zeros(N, dtype=torch.long, device=p.device).scatter_reduce(
            0, p[rest], val[rest], 'amax')
        return int((best1 + best2).max())

    # ----------------------------------------------------------------------------------------
    # Products.
    def _levels(self, x: Tensor) -> List[Tensor]:
        return list(torch.split(x[self.perm], self.level_sizes, dim=0))

    def _edge_len(self, lvl: int, dtype) -> Tensor:
        e = self.parent_edge_level[lvl]
        if self.edge_length is None:
            return torch.ones(e.numel(), dtype=dtype, device=e.device)
        return self.edge_length[e].to(dtype)

    def _head_view(self, p: Tensor, dtype) -> Tensor:
        # scalar -> [1, 1]; [H] -> [1, H, 1]  (broadcast against [n, C] or [n, H, C])
        p = p.to(dtype)
        return p.view(1, 1) if p.dim() == 0 else p.view(1, -1, 1)

    def _matmul(self, x: Tensor) -> Tensor:
        if self.num_nodes == 0:
            return x
        if self.f is not None:
            return self._matmul_hops(x)
        return self._matmul_exp(x)

    def _matmul_exp(self, x: Tensor) -> Tensor:
        a = self._head_view(self.a, x.dtype)  # a per-head mask always gets [N, H, C]
        eb = self._head_view(self.b, x.dtype).exp()
        xs = self._levels(x)
        extra = (1, ) * (x.dim() - 1)
        # c_l = exp(a * w(i, parent(i))) for the nodes of level l: [n_l, 1] or [n_l, H, 1].
        coef = [None] + [torch.exp(a * self._edge_len(l, x.dtype).view((-1, ) + extra))
                         for l in range(1, len(xs))]
        # Upward pass: subtree sums s_i.
        own = [eb * xl for xl in xs]
        s = list(own)
        for lvl in range(len(xs) - 1, 0, -1):
            s[lvl - 1] = s[lvl - 1].index_add(0, self.parent_local[lvl], coef[lvl] * s[lvl])
        if self.a.device.type == 'cpu' and bool((self.a.detach() <= 0).all()):
            # Decaying mask (no device sync on the CPU): the lemma's update
            # y_i = c y_p + (1 - c^2) s_i adds two non-negative multiples (c <= 1) and is
            # accurate; it is cheaper than the sibling scans below.
            y = [s[0]]
            for lvl in range(1, len(xs)):
                c = coef[lvl]
                y.append(c * y[lvl - 1][self.parent_local[lvl]] + (1 - c * c) * s[lvl])
            return torch.cat(y, dim=0)[self.inv_perm]
        # Downward pass: sums o_i over the nodes outside the subtree of i, reached through the
        # parent p: o_i = c_i (o_p + e^b x_p + sum over the siblings j of i of c_j s_j), and
        # y_i = o_i + s_i. The siblings' sum comes from scans, never from subtracting i's own
        # share from p's total (which cancels catastrophically when a > 0: relative error
        # ~ eps * exp(2 a depth) before).
        o_prev = torch.zeros_like(s[0])
        y = [s[0]]
        for lvl in range(1, len(xs)):
            c, pl = coef[lvl], self.parent_local[lvl]
            siblings = self._sibling_sums(c * s[lvl], lvl)
            o_prev = c * ((o_prev + own[lvl - 1])[pl] + siblings)
            y.append(o_prev + s[lvl])
        return torch.cat(y, dim=0)[self.inv_perm]

    def _sibling_sums(self, t: Tensor, lvl: int) -> Tensor:
        r"""For every node of level :obj:`lvl`, the sum of :obj:`t` over its siblings (same
        parent, itself excluded), without subtraction: exclusive prefix plus exclusive suffix
        sums inside each sibling group, by cumulative sums over a ``[groups, largest group]``
        layout (or segmented Hillis-Steele scans when that layout would be much larger than
        the level)."""
        pos, rpos, group, group_id, num_groups = self.sibling_pos[lvl]
        if group <= 1:
            return torch.zeros_like(t)
        n = t.size(0)
        if num_groups * group <= 2 * n:
            padded = t.new_zeros((num_groups, group + 1) + tuple(t.shape[1:]))
            padded[group_id, pos + 1] = t  # column 0 stays zero: exclusive sums
            before = padded.cumsum(1)[group_id, pos]
            padded.zero_()
            padded[group_id, group - 1 - rpos] = t
            after = padded.flip(1).cumsum(1)[group_id, rpos]
            return before + after
        shape = (-1, ) + (1, ) * (t.dim() - 1)
        idx = torch.arange(n, device=t.device)

        def scan(z: Tensor, p: Tensor, step: int) -> Tensor:
            # Inclusive segmented scan: z_j += z_{j - step * d} while inside the group.
            d = 1
            while d < group:
                keep = (p >= d).to(z.dtype).view(shape)
                z = z + z.index_select(0, (idx - step * d).clamp_(0, n - 1)) * keep
                d *= 2
            keep = (p >= 1).to(z.dtype).view(shape)  # exclusive: the neighbour's inclusive sum
            return z.index_select(0, (idx - step).clamp_(0, n - 1)) * keep

        return scan(t, pos, 1) + scan(t, rpos, -1)

    def _matmul_hops(self, x: Tensor) -> Tensor:
        D1 = self.diameter + 1
        f = self.f[..., :D1].to(x.dtype)
        shape = x.shape
        xs = self._levels(x.reshape(shape[0], -1))  # [n_l, C'] with C' = C or H*C
        # Upward pass: g_i[k] = sum of x over the descendants k hops below i.
        g = [torch.cat([xl.unsqueeze(1), xl.new_zeros(xl.size(0), D1 - 1, xl.size(1))], dim=1)
             for xl in xs]
        for lvl in range(len(xs) - 1, 0, -1):
            g[lvl - 1] = g[lvl - 1].index_add(0, self.parent_local[lvl], _shift(g[lvl]))
        # Downward pass: h_i[k] = sum of x over all nodes k hops from i; y_i = sum_k f[k] h_i[k].
        h_prev = g[0]
        out = [self._contract(h_prev, f, shape)]
        for lvl in range(1, len(xs)):
            h = g[lvl] + _shift(h_prev[self.parent_local[lvl]] - _shift(g[lvl]))
            out.append(self._contract(h, f, shape))
            h_prev = h
        return torch.cat(out, dim=0)[self.inv_perm]

    @staticmethod
    def _contract(h: Tensor, f: Tensor, shape) -> Tensor:
        if f.dim() == 1:
            return torch.einsum('nkc,k->nc', h, f).reshape((-1, ) + tuple(shape[1:]))
        H, C = shape[1], shape[2]
        return torch.einsum('nkhc,hk->nhc', h.view(h.size(0), h.size(1), H, C), f)

    # ----------------------------------------------------------------------------------------
    def distances(self, weighted: bool = True) -> Tensor:
        r"""Dense ``[N, N]`` tree distances (:obj:`inf` between different trees), from the
        ancestor matrix :math:`A` (``A[i, k] = 1`` if :math:`k` is :math:`i` or an ancestor of
        :math:`i`): :math:`d(i, j) = \delta_i + \delta_j - 2 \sum_k A_{ik} A_{jk} \ell_k` with
        :math:`\ell_k` the length of the edge from :math:`k` to its parent and
        :math:`\delta = A\ell`. :math:`O(N^3)`; references and tests only."""
        N = self.num_nodes
        dev = self.perm.device
        dtype = torch.float64
        anc = torch.zeros(N, N, dtype=dtype, device=dev)
        anc[self.roots, self.roots] = 1
        off = self.level_offsets
        for lvl in range(1, len(self.level_sizes)):
            nodes = self.perm[off[lvl]:off[lvl + 1]]
            anc[nodes] = anc[self.parent[nodes]]
            anc[nodes, nodes] = 1
        ell = torch.zeros(N, dtype=dtype, device=dev)
        child = self.parent >= 0
        if weighted and self.edge_length is not None:
            ell[child] = self.edge_length.detach()[self.parent_edge[child]].to(dtype)
        else:
            ell[child] = 1
        delta = anc @ ell
        dist = delta.view(-1, 1) + delta.view(1, -1) - 2 * (anc * ell) @ anc.t()
        same = (anc @ anc.t()) > 0
        return dist.masked_fill(~same, float('inf'))

    def to_dense(self) -> Tensor:
        dist = self.distances(weighted=self.f is None)  # hop distances index f
        same = torch.isfinite(dist)
        dist = torch.where(same, dist, torch.zeros_like(dist))
        if self.f is not None:
            return self.f[..., dist.round().long()] * same.to(self.f.dtype)
        a = self.a.double().view(-1, 1, 1) if self.a.dim() == 1 else self.a.double()
        b = self.b.double().view(-1, 1, 1) if self.b.dim() == 1 else self.b.double()
        return (torch.exp(a * dist + b) * same.double()).to(self._dense_dtype)

    def __repr__(self) -> str:
        heads = '' if self.num_heads is None else f', heads={self.num_heads}'
        if self.f is not None:
            kind = f'f=[{self.f.size(-1)}]'
        else:
            kind = f'a={format_param(self.a)}, b={format_param(self.b)}'
        weighted = ', weighted=True' if self.edge_length is not None else ''
        return (f'TreeMask(num_nodes={self.num_nodes}, num_trees={self.num_trees}, {kind}'
                f'{weighted}{heads})')


def _forest_edges(edge_index: Tensor, N: int, edge_weight: Optional[Tensor]
                  ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    r"""Validated, undirected, deduplicated edges ``(u, v)`` with ``u < v`` (sorted by
    ``u * N + v``) and their weights (:obj:`None` without ``edge_weight``); both directions of
    an edge must carry the same weight, and there must be no self-loop."""
    check_edge_index(edge_index, N)
    ei = edge_index.long()
    E = ei.size(1)
    if edge_weight is not None:
        if edge_weight.dim() != 1 or edge_weight.numel() != E:
            raise ValueError(f"'edge_weight' must have shape [{E}] (one per edge), got "
                             f"{tuple(edge_weight.shape)}")
        if not edge_weight.is_floating_point():
            edge_weight = edge_weight.float()
    loops = ei[0] == ei[1]
    if bool(loops.any()):
        v = int(ei[0, loops][0])
        raise ValueError(f"TreeMask needs a forest, but 'edge_index' has a self-loop at node {v}")
    u, v = torch.minimum(ei[0], ei[1]), torch.maximum(ei[0], ei[1])
    key, inv = torch.unique(u * N + v, return_inverse=True)
    M = key.numel()
    uu, vv = key // N, key % N
    if edge_weight is None:
        return uu, vv, None
    w = edge_weight.new_zeros(M).scatter_reduce(0, inv, edge_weight, 'amax', include_self=False)
    w_min = edge_weight.detach().new_zeros(M).scatter_reduce(
        0, inv, edge_weight.detach(), 'amin', include_self=False)
    bad = w.detach() != w_min
    if bool(bad.any()):
        k = int(bad.nonzero()[0])
        raise ValueError(f"edge ({int(uu[k])}, {int(vv[k])}) appears with different "
                         f"weights {float(w_min[k])} and {float(w[k])}")
    return uu, vv, w


def _bfs_levels(uu: Tensor, vv: Tensor, roots: Tensor, N: int
                ) -> Tuple[Tensor, Tensor, List[Tensor]]:
    r"""Breadth-first search of the forest with edges ``(uu, vv)`` from all ``roots`` at once,
    one level per iteration: ``(parent [N], parent_edge [N], levels)`` (``-1`` at the roots;
    ``levels[d]`` the nodes at depth ``d``, children of a parent contiguous)."""
    device, M = uu.device, uu.numel()
    # Symmetric CSR of the forest.
    src, dst = torch.cat([uu, vv]), torch.cat([vv, uu])
    order = torch.argsort(src, stable=True)
    col, eid = dst[order], torch.cat([torch.arange(M, device=device)] * 2)[order]
    deg = torch.bincount(src, minlength=N)
    rowptr = torch.cat([deg.new_zeros(1), deg.cumsum(0)])
    parent = torch.full((N, ), -1, dtype=torch.long, device=device)
    parent_edge = torch.full((N, ), -1, dtype=torch.long, device=device)
    levels: List[Tensor] = [roots]
    frontier = roots
    while True:
        cnt = deg[frontier]
        total = int(cnt.sum())
        if total == 0:
            break
        start = torch.repeat_interleave(rowptr[frontier] - (cnt.cumsum(0) - cnt), cnt)
        pos = start + torch.arange(total, device=device)
        s = torch.repeat_interleave(frontier, cnt)
        nbr = col[pos]
        child = nbr != parent[s]
        nxt = nbr[child]
        if nxt.numel() == 0:
            break
        parent[nxt] = s[child]
        parent_edge[nxt] = eid[pos[child]]
        levels.append(nxt)
        frontier = nxt
    return parent, parent_edge, levels
