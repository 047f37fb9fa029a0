r"""Graph random features (GRFs): sparse Monte Carlo estimates of :math:`\Phi = \sum_k f_k W^k`
whose Gram matrix estimates the power-series graph node kernel :math:`M_\alpha = \sum_k \alpha_k
W^k` (GRF paper, Sec. 3.1-3.4, Eq. 4, Remark 3.1, Eq. 9-10, Algorithm 1; asymmetric variant
App. D; ad-hoc variant Eq. 21; bounds Thm 3.1 and Lemma 3.2). The walks give the loads, once;
any (learnable) :math:`f` is applied after:

.. math::
    \widehat\phi(v_i)_q = \sum_{l=0}^{L} f_l\,\mathrm{load}(i, q, l), \qquad
    \mathrm{load}(i, q, l) = \frac{1}{n}\sum_{k=1}^{n}
        \mathbb{1}[\omega_k^{(i)}\text{ is at } q \text{ after } l \text{ hops}]
        \prod_{t=0}^{l-1}\frac{W_{u_t u_{t+1}}}{p(u_t \to u_{t+1})},

with :math:`p(u \to u') = (1 - p_{halt})/d_u` (:math:`1/d_u` for fixed-length walks).

**Directed graphs.** The estimator is unbiased for :math:`F = \sum_l f_l W^l` with any
:math:`W`, but :math:`\mathbb{E}[\widehat\Phi\widehat\Phi'^\top] = \sum_k (f * f)_k W^k`
needs :math:`W^\top = W`: for a non-symmetric :math:`W` the product estimates :math:`F F^\top`
and :func:`grf_loads` warns (:class:`DirectedGraphWarning`).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from pyg_grf.walks import RandomWalks, check_edge_index, sample_walks

NORMALIZATIONS = ('sym', 'rw', None)


class DirectedGraphWarning(UserWarning):
    r"""Warned when GRFs are computed on a non-symmetric :math:`W` (module docstring)."""


def warn_if_directed(edge_index: Tensor, num_nodes: int,
                     edge_weight: Optional[Tensor] = None) -> None:
    r"""Warns (:class:`DirectedGraphWarning`) if an edge :math:`(u, v)` has no reverse
    :math:`(v, u)` of the same total weight, counting the sinks (nodes with in-edges but no
    out-edges, where walks end)."""
    if edge_index.numel() == 0:
        return
    src, dst = edge_index[0].long(), edge_index[1].long()
    w = torch.ones(src.numel(), dtype=torch.float64, device=src.device) if edge_weight is None \
        else edge_weight.detach().to(torch.float64)
    N = num_nodes
    fwd, inv_f = torch.unique(src * N + dst, return_inverse=True)
    w_f = torch.zeros(fwd.numel(), dtype=torch.float64, device=src.device).index_add_(0, inv_f, w)
    rev = (fwd % N) * N + fwd // N
    pos = torch.searchsorted(fwd, rev).clamp_max_(fwd.numel() - 1)
    ok = (fwd[pos] == rev) & torch.isclose(w_f[pos], w_f, rtol=1e-6, atol=0.0)
    asym = int((~ok).sum())
    if asym == 0:
        return
    out_deg = torch.bincount(src, minlength=N)
    sinks = int(((out_deg == 0) & (torch.bincount(dst, minlength=N) > 0)).sum())
    warnings.warn(
        f"The graph is not symmetric ({asym} of {edge_index.size(1)} edges have no reverse edge "
        f"of the same weight; {sinks} sink node(s) without out-edges, where walks end). GRFs "
        f"still estimate F = sum_l f_l W^l, but Phi Phi^T then estimates F F^T, not the "
        f"power-series kernel sum_k (f*f)_k W^k. Symmetrise the graph (e.g. "
        f"torch_geometric.utils.to_undirected) if you want that kernel.",
        DirectedGraphWarning, stacklevel=3)


def normalized_adjacency(edge_index: Tensor, num_nodes: int, edge_weight: Optional[Tensor] = None,
                         normalization: Optional[str] = 'sym') -> Tensor:
    r"""The weights :math:`W_{uv}` (``[E]``) of the edges of ``edge_index`` from the finite
    ``edge_weight`` :math:`a_{uv}` (default 1; positive for ``'sym'`` and ``'rw'``):

    * ``'sym'`` (default): :math:`W_{uv} = a_{uv} / \sqrt{d^{out}_u d^{in}_v}` (GRF paper,
      Sec. 3.1), i.e. :math:`D_{out}^{-1/2} A D_{in}^{-1/2}` with the weighted out- and
      in-degrees: both the degree for an undirected graph, as in the paper; an edge into a sink
      of a directed graph keeps its weight;
    * ``'rw'``: :math:`W_{uv} = a_{uv} / d_u` (row-stochastic);
    * :obj:`None`: :math:`W_{uv} = a_{uv}`.

    Multi-edges add up (:math:`W` is their sum), self-loops count once in the degree.
    """
    check_edge_index(edge_index, num_nodes)
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"'normalization' must be one of {NORMALIZATIONS}, got {normalization!r}")
    E = edge_index.size(1)
    if edge_weight is None:
        edge_weight = torch.ones(E, device=edge_index.device)
    else:
        if edge_weight.dim() != 1 or edge_weight.numel() != E:
            raise ValueError(f"'edge_weight' must have shape [{E}] (one per edge), got "
                             f"{tuple(edge_weight.shape)}")
        if not bool(torch.isfinite(edge_weight).all()):
            raise ValueError("'edge_weight' must be finite, got NaN or infinite values")
        if normalization is not None and bool((edge_weight <= 0).any()):
            raise ValueError(f"normalization={normalization!r} needs positive edge weights, got "
                             f"min {float(edge_weight.min())} (use normalization=None)")
    if normalization is None:
        return edge_weight
    src, dst = edge_index[0].long(), edge_index[1].long()
    deg = edge_weight.new_zeros(num_nodes).index_add_(0, src, edge_weight)
    if normalization == 'sym':
        deg_in = edge_weight.new_zeros(num_nodes).index_add_(0, dst, edge_weight)
        inv = deg.pow(-0.5).masked_fill_(deg == 0, 0.0)
        inv_in = deg_in.pow(-0.5).masked_fill_(deg_in == 0, 0.0)
        return inv[src] * edge_weight * inv_in[dst]
    inv = deg.reciprocal().masked_fill_(deg == 0, 0.0)
    return inv[src] * edge_weight


def grf_loads(edge_index: Tensor, num_nodes: int, num_walks: int, p_halt: Optional[float],
              max_length: int, *, edge_weight: Optional[Tensor] = None,
              normalization: Optional[str] = 'sym', walker: str = 'iid',
              importance: bool = True, fixed_length: bool = False,
              generator: Optional[torch.Generator] = None,
              walks: Optional[RandomWalks] = None,
              dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Importance-weighted loads of the GRF estimator per (start node, visited node, hop count),
    duplicates summed (GRF paper, Eq. 10; module docstring); hop count 0 is the start node
    itself, with load 1.

    Args:
        num_walks (int): walks per node :math:`n`.
        p_halt (float): halting probability in :math:`(0, 1)` (ignored if ``fixed_length``).
        max_length (int): hops after which walks are truncated (:math:`f_l = 0` for
            :math:`l >` ``max_length``).
        edge_weight (Tensor, optional): raw edge weights, normalised by ``normalization``.
        normalization (str, optional): see :func:`normalized_adjacency` (default: ``'sym'``).
        walker (str): ``'iid'``, ``'antithetic'`` or ``'repelling'`` (see
            :func:`~pyg_grf.walks.sample_walks`).
        importance (bool): importance weights as above. :obj:`False` gives the ad-hoc variant of
            Eq. 21 (every visit counts 1; not an estimate of a function of :math:`W`; for
            ablations) (default: :obj:`True`).
        fixed_length (bool): walks that never halt (default: :obj:`False`).
        walks (RandomWalks, optional): use these walks instead of sampling.
        dtype (torch.dtype): dtype of the loads (default: ``torch.float32``).

    Returns:
        ``(index [2, nnz], length [nnz], load [nnz])``, sorted by (start, visited, length).

    Warns:
        DirectedGraphWarning: if the weighted graph is not symmetric (module docstring).
    """
    if importance:  # validates the weights before anything is sampled
        w = normalized_adjacency(edge_index, num_nodes, edge_weight, normalization).to(dtype)
        if max_length > 0:
            warn_if_directed(edge_index, num_nodes, edge_weight)
    if walks is None:
        walks = sample_walks(edge_index, num_nodes, num_walks, p_halt, max_length, walker=walker,
                             fixed_length=fixed_length, generator=generator)
    else:  # fixed_length comes from the caller: it must match how the walks were drawn
        check_edge_index(edge_index, num_nodes)
    if importance:
        deg = torch.bincount(edge_index[0].long(), minlength=num_nodes).to(dtype)
        cont = 1.0 if fixed_length else 1.0 - float(p_halt)
        load = _importance_loads(walks, w, deg, cont, num_nodes)
    else:
        load = (walks.node >= 0).to(dtype)
    return _coalesce_loads(walks, load, num_nodes, dtype)


def _importance_loads(walks: RandomWalks, w: Tensor, deg: Tensor, cont: float,
                      num_nodes: int) -> Tensor:
    r"""``[R]`` importance weight of every hop record of :obj:`walks`: the running product
    along its walk of :math:`W_e / p(\mathrm{hop}) = W_e d_u / (1 - p_{halt})` (``cont`` is
    :math:`1 - p_{halt}`, or 1 for fixed-length walks); 0 past a node without out-edges."""
    ptr = walks.step_ptr.tolist()
    valid = walks.edge >= 0
    # Padded lookups: index E (resp. N) stands for 'no edge' (resp. 'no node') with weight 0.
    w = torch.cat([w, w.new_zeros(1)])
    deg = torch.cat([deg, deg.new_zeros(1)])
    e = torch.where(valid, walks.edge, w.numel() - 1)
    prev = torch.empty_like(walks.node)
    # predecessor node of every record: the start node for step 1, else record j of step t-1
    A1 = ptr[1] - ptr[0] if len(ptr) > 1 else 0
    if A1 > 0:
        prev[:A1] = walks.start[walks.order[:A1]]
    for t in range(2, len(ptr)):  # one slice per step
        A = ptr[t] - ptr[t - 1]
        prev[ptr[t - 1]:ptr[t]] = walks.node[ptr[t - 2]:ptr[t - 2] + A]
    prev = torch.where(prev >= 0, prev, num_nodes)
    hop_w = w[e] * deg[prev] / cont
    # Running product along each walk: record j of step t continues record j of step t-1.
    load = torch.empty_like(hop_w)
    if A1 > 0:
        load[:A1] = hop_w[:A1]
    for t in range(2, len(ptr)):
        A = ptr[t] - ptr[t - 1]
        load[ptr[t - 1]:ptr[t]] = load[ptr[t - 2]:ptr[t - 2] + A] * hop_w[ptr[t - 1]:ptr[t]]
    return load


def _coalesce_loads(walks: RandomWalks, load: Tensor, num_nodes: int,
                    dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The entries ``(index, hop, load / n)`` of the hop records with their loads, plus the
    start nodes at hop 0 with load 1, duplicates summed, sorted by (start, visited, hop)."""
    n, L = walks.num_walks, walks.max_length
    starts = walks.start
    keep = walks.node >= 0
    src = torch.cat([starts, starts[walks.record_walker()[keep]]])
    dst = torch.cat([starts, walks.node[keep]])
    hop = torch.cat([torch.zeros_like(starts), walks.record_step()[keep]])
    val = torch.cat([torch.ones(starts.numel(), dtype=dtype, device=starts.device), load[keep]])

    key = (src * num_nodes + dst) * (L + 1) + hop
    uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
    out = torch.zeros(uniq.numel(), dtype=dtype, device=starts.device).index_add_(0, inv, val) / n
    hop = uniq % (L + 1)
    pair = uniq // (L + 1)
    index = torch.stack([pair // num_nodes, pair % num_nodes])
    return index, hop, out


def hop_values(f: Tensor, hop: Tensor, load: Tensor) -> Tensor:
    r""":math:`f_{l_e}\,\mathrm{load}_e` for hop counts ``hop`` that all index into ``f``
    (``[L + 1]`` or ``[H, L + 1]``): ``[nnz]`` or ``[H, nnz]``. A gather by ``index_select``:
    its backward sums into the few coefficients by ``index_add`` (advanced indexing's backward
    runs a sort of all ``nnz`` hop counts on CUDA: 145 ms of a 177 ms layer at 262k nodes)."""
    return f.index_select(-1, hop) * load.to(f.dtype if f.is_floating_point() else load.dtype)


def graph_random_features(edge_index: Tensor, num_nodes: int, f: Union[Tensor, Sequence[float]],
                          num_walks: int, p_halt: Optional[float], max_length: int, *,
                          edge_weight: Optional[Tensor] = None,
                          normalization: Optional[str] = 'sym', walker: str = 'iid',
                          importance: bool = True, fixed_length: bool = False,
                          generator: Optional[torch.Generator] = None) -> Tensor:
    r"""Graph random features :math:`\widehat\Phi` as a coalesced sparse COO ``[N, N]`` tensor, row
    :math:`i` being :math:`\widehat\phi(v_i)` (GRF paper, Eq. 10; Algorithm 1).

    With ``f = deconvolve(alpha)``, :math:`\mathbb{E}[\widehat\Phi\widehat\Phi'^\top] = \sum_k
    (f * f)_k W^k` for independent :math:`\widehat\Phi, \widehat\Phi'` (and off the diagonal for
    :math:`\widehat\Phi' = \widehat\Phi`), which equals :math:`\sum_k \alpha_k W^k` up to
    ``max_length`` (see :func:`deconvolve`).

    Args:
        f (Tensor or list): ``[L' + 1]`` coefficients :math:`f_0, f_1, \dots`; hops beyond
            ``len(f) - 1`` or ``max_length`` contribute nothing.
        Other arguments: as in :func:`grf_loads`.
    """
    f = torch.as_tensor(f, dtype=torch.float32) if not isinstance(f, Tensor) else f
    if f.dim() != 1 or f.numel() == 0:
        raise ValueError(f"'f' must have shape [L + 1] (non-empty, 1-D: use GRFMask for heads), "
                         f"got {tuple(f.shape)}")
    dtype = f.dtype if f.is_floating_point() else torch.float32
    index, length, load = grf_loads(edge_index, num_nodes, num_walks, p_halt, max_length,
                                    edge_weight=edge_weight, normalization=normalization,
                                    walker=walker, importance=importance,
                                    fixed_length=fixed_length, generator=generator, dtype=dtype)
    K = f.numel()  # entries with a hop count beyond f get 0
    vals = hop_values(f.to(dtype), length.clamp_max(K - 1), load) * (length < K)
    return torch.sparse_coo_tensor(index, vals, (num_nodes, num_nodes),
                                   check_invariants=False).coalesce()


def deconvolve(alpha: Union[Tensor, Sequence[float]]) -> Tensor:
    r"""The ``[K]`` sequence :math:`f` with :math:`\sum_{p=0}^{k} f_p f_{k-p} = \alpha_k` for the
    ``[K]`` power-series coefficients ``alpha`` (:math:`\alpha_0 > 0`; differentiable) (GRF
    paper, Remark 3.1): :math:`f_0 = \sqrt{\alpha_0}`, :math:`f_k = (\alpha_k - \sum_{p=1}^{k-1}
    f_p f_{k-p}) / (2 f_0)`. Truncated after ``K`` terms, :math:`(f * f)_k = \alpha_k` for
    :math:`k < K` plus a tail at :math:`K \le k \le 2K - 2`."""
    alpha = torch.as_tensor(alpha, dtype=torch.get_default_dtype()) \
        if not isinstance(alpha, Tensor) else alpha
    if alpha.dim() != 1 or alpha.numel() == 0:
        raise ValueError(f"'alpha' must be a non-empty 1-D sequence, got shape "
                         f"{tuple(alpha.shape)}")
    if not bool(alpha[0] > 0):
        raise ValueError(f"'alpha[0]' must be positive (f_0 = sqrt(alpha_0)), got "
                         f"{float(alpha[0])}")
    f = [alpha[0].sqrt()]
    for k in range(1, alpha.numel()):  # loop over series terms (short), not over graph elements
        conv = sum((f[p] * f[k - p] for p in range(1, k)), alpha.new_zeros(()))
        f.append((alpha[k] - conv) / (2 * f[0]))
    return torch.stack(f)


def self_convolution(f: Tensor) -> Tensor:
    r""":math:`(f * f)_k = \sum_p f_p f_{k-p}` for :math:`k = 0..2(K-1)` (``[2K - 1]``): the
    coefficients of the kernel :math:`\mathbb{E}[\widehat\Phi\widehat\Phi^\top]` estimates."""
    K = f.numel()
    out = f.new_zeros(2 * K - 1)
    idx = (torch.arange(K, device=f.device).view(-1, 1) + torch.arange(K, device=f.device)).view(-1)
    return out.index_add(0, idx, (f.view(-1, 1) * f.view(1, -1)).view(-1))


def grf_constant(f: Union[Tensor, Sequence[float]], max_weighted_degree: float,
                 p_halt: float) -> float:
    r"""The constant :math:`c = \sum_k |f_k| \left(\max_{ij} |W_{ij}| d_i / (1 - p_{halt})\right)^k`
    of Thm 3.1 (GRF paper), finite for a finite ``f``."""
    f = torch.as_tensor(f, dtype=torch.float64).abs()
    r = float(max_weighted_degree) / (1.0 - float(p_halt))
    return float((f * r ** torch.arange(f.numel(), dtype=torch.float64)).sum())


def grf_tail_bound(t: float, num_walks: int, c: float) -> float:
    r"""Thm 3.1 (GRF paper, Eq. 11): an upper bound on
    :math:`\Pr(|\widehat\phi(v_i)^\top\widehat\phi(v_j) - M_{\alpha,ij}| > t)` with ``num_walks``
    walkers per node: :math:`2\exp(-t^2 n^3 / (2 (2n - 1)^2 c^4))`."""
    n = float(num_walks)
    return min(1.0, 2.0 * math.exp(-t * t * n ** 3 / (2.0 * (2.0 * n - 1.0) ** 2 * c ** 4)))


def required_walks(t: float, delta: float, c: float) -> int:
    r"""The smallest :math:`n` for which Thm 3.1 guarantees
    :math:`|\widehat\phi(v_i)^\top\widehat\phi(v_j) - M_{\alpha,ij}| \le t` (``t > 0``) with
    probability at least :math:`1 - \delta` (``delta`` in :math:`(0, 1)`), ``c`` the constant of
    Thm 3.1 (:func:`grf_constant`) (GRF paper, Thm 3.1 and Corollary 3.3)."""
    if not t > 0:
        raise ValueError(f"'t' must be positive, got {t}")
    if not 0 < delta < 1:
        raise ValueError(f"'delta' must lie in (0, 1), got {delta}")
    if not c > 0:
        raise ValueError(f"'c' must be positive, got {c}")
    # n^3 / (2n - 1)^2 is increasing for n >= 1: double then bisect.
    need = 2.0 * c ** 4 * math.log(2.0 / delta) / (t * t)
    g = lambda n: n ** 3 / (2 * n - 1) ** 2  # noqa: E731
    hi = 1
    while g(hi) < need:
        hi *= 2
    lo = max(1, hi // 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if g(mid) >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo


def sparsity_bound(num_walks: int, p_halt: float, delta: float) -> int:
    r"""Lemma 3.2 (GRF paper): with probability at least :math:`1 - \delta`, a GRF built from
    ``num_walks`` halting walks has at most
    :math:`n \lceil \log(1 - (1 - \delta)^{1/n}) / \log(1 - p_{halt}) \rceil` nonzero entries
    (independent of :math:`N`)."""
    if not 0 < delta < 1:
        raise ValueError(f"'delta' must lie in (0, 1), got {delta}")
    if not 0 < p_halt < 1:
        raise ValueError(f"'p_halt' must lie in (0, 1), got {p_halt}")
    n = int(num_walks)
    b = math.log(1.0 - (1.0 - delta) ** (1.0 / n)) / math.log(1.0 - p_halt)
    return n * int(math.ceil(b))
