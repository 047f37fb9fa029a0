r"""What the GRF backends share: CSR views, coefficient products, dtype and device moves."""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor


def csr(crow: Tensor, col: Tensor, values: Tensor, size: int) -> Tensor:
    r"""A square ``[size, size]`` CSR tensor over existing indices (no checks, no copies);
    torch's "sparse CSR support is in beta" warning is not passed on to the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='Sparse CSR tensor support is in beta')
        return torch.sparse_csr_tensor(crow, col, values, size=(size, size),
                                       check_invariants=False)


def half_to_float(x: Tensor) -> torch.dtype:
    r"""The dtype the sparse kernels run in: float32 for half precision (torch's sparse CSR
    kernels have no half-precision CPU version), else ``x``'s."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def coefficient_pairs(f: Tensor, num_coef: int, symmetric: bool) -> Tensor:
    r"""``[h, C]`` coefficients of the statistics: :math:`f_l f_{l'}` for :math:`l \le l'` in
    ``torch.triu_indices(K, K)`` order (symmetric mask), else :math:`f_l` (asymmetric)."""
    if not symmetric:
        return f[:, :num_coef]
    K = int(round(((8 * num_coef + 1) ** 0.5 - 1) / 2))
    if f.size(1) < K:  # statistics of longer walks than f covers: their coefficients are 0
        f = torch.cat([f, f.new_zeros(f.size(0), K - f.size(1))], dim=1)
    iu = torch.triu_indices(K, K, device=f.device)
    return f[:, iu[0]] * f[:, iu[1]]


def move(structures: Any, device: Any) -> Any:
    r"""A NamedTuple of plan structures with every tensor moved to ``device``."""
    return type(structures)(*(t.to(device) if isinstance(t, Tensor) else t
                              for t in structures))
