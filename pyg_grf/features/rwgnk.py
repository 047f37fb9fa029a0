r"""Random Walks Graph-Nodes Kernel (RWGNK) frequency vectors (FTFI paper, Sec. 4.2, Eq. 5).

For a random walk :math:`\omega(h)` out of node :math:`h`, the (row) frequency vector is

.. math::
    f^{\omega(h), \lambda}_h(i) = \sum_{e \in \mathcal{L}_{\omega(h)}(i)} \lambda^e,

where :math:`\mathcal{L}_{\omega(h)}(i)` is the set of lengths :math:`e` (in hops; :math:`e = 0` is
the empty prefix, i.e. :math:`h` itself) of the prefixes of :math:`\omega(h)` that end at
:math:`i`. The RWGNK feature of :math:`h` is the renormalised expected frequency vector

.. math::
    \Psi(h) = \frac{\mathbb{E}[f^{\omega(h),\lambda}_h]}
                  {\|\mathbb{E}[f^{\omega(h),\lambda}_h]\|_2^{\alpha}},
    \qquad K^{\lambda,\alpha}_p(k, l) = \Psi(k)\Psi(l)^\top,

with the expectation replaced by a Monte Carlo mean over ``num_walks`` walks;
:math:`\mathcal{K} = \Psi\Psi^\top` is the mask of GKAT.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import check_index_range, check_int, check_shape
from pyg_grf.features.exact import power_series_kernel
from pyg_grf.features.grf import graph_random_features
from pyg_grf.memory import check_walk_memory
from pyg_grf.ops import without_csr_warning


def check_rwgnk_args(lam, alpha) -> None:
    r"""Raises a :class:`ValueError` unless the RWGNK discount ``lam`` lies in (0, 1] and the
    normalisation exponent ``alpha`` is >= 0 (what was expected, what came)."""
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or math.isnan(float(lam)) \
            or not (0.0 < float(lam) <= 1.0):
        raise ValueError(f"'lam' (the discount lambda) must lie in (0, 1], got {lam!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or math.isnan(float(alpha)) \
            or float(alpha) < 0.0:
        raise ValueError(f"'alpha' (the normalisation exponent) must be >= 0, got {alpha!r}")


def _resolve_fixed_length(p_halt: Optional[float], fixed_length: Optional[bool]) -> bool:
    if fixed_length is None:
        return p_halt is None
    return bool(fixed_length)


def rwgnk_features(edge_index: Tensor, num_nodes: int, num_walks: int, *, lam: float,
                   alpha: float = 1.0, p_halt: Optional[float] = None, max_length: int = 3,
                   fixed_length: Optional[bool] = None, walker: str = 'iid',
                   generator: Optional[torch.Generator] = None,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    r"""Monte Carlo RWGNK features :math:`\Psi` (FTFI paper, Sec. 4.2, Eq. 5) as a coalesced
    sparse COO ``[N, N]`` matrix whose row :math:`h` is :math:`\Psi(h)`: the prefix of length
    :math:`e` of one of the ``num_walks`` walks out of :math:`h` that ends at :math:`i` adds
    :math:`\lambda^e / n` to :math:`\Psi_{hi}`, then every row is divided by its 2-norm to the
    power :math:`\alpha` (:math:`\alpha = 0`: the unbiased estimate of
    :math:`\mathbb{E}[f^{\omega(h),\lambda}_h]`, :func:`rwgnk_expected_features`;
    :math:`\alpha = 1`: unit rows, so :math:`K_{kl} \in [0, 1]`).

    Args:
        num_walks (int): walks per node :math:`n`.
        lam (float): discount :math:`\lambda \in (0, 1]`.
        alpha (float): normalisation exponent :math:`\alpha \ge 0` (default: ``1.0``).
        p_halt (float, optional): halting probability :math:`p \in (0, 1)`; :obj:`None` for walks
            of fixed length (default: :obj:`None`).
        max_length (int): maximum walk length in hops, :math:`\tau` in the paper (default: ``3``).
        fixed_length (bool, optional): walks never halt and take ``max_length`` hops (unless they
            reach a node without out-edges). Default: ``p_halt is None``.
        walker (str): ``'iid'``, ``'antithetic'`` or ``'repelling'`` (default: ``'iid'``).
        dtype (torch.dtype): dtype of the values (default: ``torch.float32``).
    """
    check_rwgnk_args(lam, alpha)
    # the GRF estimator with every visit counting 1 (no importance weights) and f_e = lam^e
    f = float(lam) ** torch.arange(max_length + 1, dtype=torch.float64)
    psi = graph_random_features(edge_index, num_nodes, f.to(dtype), num_walks, p_halt,
                                max_length, walker=walker, importance=False,
                                fixed_length=_resolve_fixed_length(p_halt, fixed_length),
                                generator=generator)
    return normalize_rows(psi, alpha)


def normalize_rows(psi: Tensor, alpha: float) -> Tensor:
    r"""Divides every row of the sparse matrix ``psi`` by its 2-norm to the power ``alpha``
    (rows of norm zero are left as they are)."""
    if float(alpha) == 0.0:
        return psi
    psi = psi.coalesce()
    index, value = psi.indices(), psi.values()
    sq = value.new_zeros(psi.size(0)).index_add_(0, index[0], value * value)
    scale = sq.pow(-0.5 * float(alpha))
    scale = torch.where(sq > 0, scale, torch.ones_like(scale))
    return torch.sparse_coo_tensor(index, value * scale[index[0]], psi.shape,
                                   is_coalesced=True, check_invariants=False)


def rwgnk_expected_features(edge_index: Tensor, num_nodes: int, *, lam: float,
                            max_length: int, p_halt: Optional[float] = None,
                            fixed_length: Optional[bool] = None,
                            dtype: torch.dtype = torch.float64) -> Tensor:
    r"""The exact expected frequency vectors :math:`\mathbb{E}[f^{\omega(h),\lambda}_h]` (rows,
    un-normalised; dense ``[N, N]``, :math:`O(N^3 L)`, a reference for small graphs) from powers
    of the transition matrix :math:`P = D^{-1}A`:

    .. math::
        \mathbb{E}[f_h]_i = \sum_{e=0}^{L} \lambda^e s^e (P^e)_{hi},

    with survival :math:`s = 1 - p_{halt}` (:math:`s = 1` for walks of fixed length) and
    :math:`L` = ``max_length``; rows of :math:`P` at nodes without out-edges are zero, multi-edges
    count with their multiplicity. Arguments as in :func:`rwgnk_features`.
    """
    check_rwgnk_args(lam, 0.0)
    fixed = _resolve_fixed_length(p_halt, fixed_length)
    if not fixed and (p_halt is None or not 0.0 < float(p_halt) < 1.0):
        raise ValueError(f"'p_halt' must lie in the open interval (0, 1), got {p_halt!r}")
    check_int('max_length', max_length, 0)
    survival = 1.0 if fixed else 1.0 - float(p_halt)
    # the power series of P = D^{-1} A (W of normalization='rw') with alpha_e = (lam s)^e
    alpha = (float(lam) * survival) ** torch.arange(max_length + 1, dtype=torch.float64)
    return power_series_kernel(edge_index, num_nodes, alpha.to(edge_index.device, dtype),
                               normalization='rw')


#: bytes of one product :math:`\Psi_{ai}\Psi_{bi}` while :func:`rwgnk_kernel` coalesces them
KERNEL_BYTES_PER_PRODUCT = 48


def kernel_products(index: Tensor, num_nodes: int) -> int:
    r"""The number of products :math:`\Psi_{ai}\Psi_{bi}` of :math:`\Psi\Psi^\top`,
    :math:`\sum_i c_i^2` with :math:`c_i` the rows of :math:`\Psi` that visit :math:`i`: an upper
    bound of the kernel's nonzeros, without forming it."""
    count = torch.bincount(index[1].long(), minlength=num_nodes)
    return int((count.double() ** 2).sum())


def rwgnk_kernel(rwgnk_index: Tensor, rwgnk_value: Tensor, num_nodes: int,
                 threshold: float = 0.0) -> Tuple[Tensor, Tensor]:
    r"""``(kernel_index [2, P], kernel_value [P])``, sorted by :math:`(i, j)`: the pairs with
    :math:`|\mathcal{K}_{ij}| >` ``threshold`` of the RWGNK kernel
    :math:`\mathcal{K} = \Psi\Psi^\top` (FTFI paper, Eq. 5) for :math:`\Psi` given by
    ``rwgnk_index`` ``[2, nnz]`` and ``rwgnk_value`` ``[nnz]``, as a sparse product, its
    memory checked first (:data:`KERNEL_BYTES_PER_PRODUCT` per product of
    :func:`kernel_products`)."""
    check_shape(rwgnk_index, 'rwgnk_index', 2, 'nnz')
    check_index_range(rwgnk_index, num_nodes, "'rwgnk_index'", 'num_nodes')
    products = kernel_products(rwgnk_index, num_nodes)
    check_walk_memory(KERNEL_BYTES_PER_PRODUCT * products, rwgnk_value.device, None,
                      f"the GKAT kernel Psi Psi^T of {num_nodes} nodes ({products} products)",
                      "Use GKATAttention(mode='linear', backend='sparse') (never forms the "
                      "kernel) or a threshold.", error=MemoryError)
    # sparse products have no half-precision kernels: at least float32, returned in the dtype
    work = torch.promote_types(rwgnk_value.dtype, torch.float32)
    psi = torch.sparse_coo_tensor(rwgnk_index.long(), rwgnk_value.detach().to(work),
                                  (num_nodes, num_nodes), check_invariants=False).coalesce()
    kernel = without_csr_warning(torch.sparse.mm, psi, psi.t()).coalesce()  # through CSR
    index, value = kernel.indices(), kernel.values().to(rwgnk_value.dtype)
    keep = value.abs() > threshold
    if not bool(keep.all()):
        index, value = index[:, keep], value[keep]
    return index, value
