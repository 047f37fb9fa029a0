r"""Graph diffusion (heat) kernel masks :math:`\exp(-\lambda T)` applied through the action of the
matrix exponential on the sparse operator :math:`T` (FTFI paper, Sec. 4.1, Theorem 4.1 and
App. A.9)."""
from __future__ import annotations

import math
import warnings
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator, format_param, head_param
from pyg_grf.walks import check_edge_index

# Al-Mohy & Higham (2011), Table 3.1 (as used by scipy.sparse.linalg.expm_multiply): the largest
# ||A|| for which m Taylor terms of exp(A) are accurate to double precision (backward error).
_THETA = {
    1: 2.29e-16, 2: 2.58e-8, 3: 1.39e-5, 4: 3.40e-4, 5: 2.40e-3, 6: 9.07e-3, 7: 2.38e-2,
    8: 5.00e-2, 9: 8.96e-2, 10: 1.44e-1, 11: 2.14e-1, 12: 3.00e-1, 13: 4.00e-1, 14: 5.14e-1,
    15: 6.41e-1, 16: 7.81e-1, 17: 9.31e-1, 18: 1.09, 19: 1.26, 20: 1.44, 21: 1.62, 22: 1.82,
    23: 2.01, 24: 2.22, 25: 2.43, 26: 2.64, 27: 2.86, 28: 3.08, 29: 3.31, 30: 3.54, 35: 4.7,
    40: 6.0, 45: 7.2, 50: 8.5, 55: 9.9,
}

OPERATORS = ('laplacian', 'normalized_laplacian', 'adjacency')


def taylor_parameters(norm: float) -> Tuple[int, int]:
    r"""Number of Taylor terms :math:`m` and of steps :math:`s` for :math:`\exp(B)`,
    :math:`\lVert B \rVert \le` ``norm``: the pair with :math:`\lVert B \rVert / s \le
    \theta_m` that minimises the number of products :math:`m s` (Al-Mohy & Higham, 2011)."""
    if not math.isfinite(norm):
        raise ValueError(f"the operator norm must be finite, got {norm}")
    if norm == 0:
        return 0, 1
    best = None
    for m, theta in _THETA.items():
        s = max(1, int(math.ceil(norm / theta)))
        if best is None or m * s < best[0] * best[1]:
            best = (m, s)
    return best


class DiffusionKernelMask(MaskOperator):
    r"""Graph diffusion kernel mask (FTFI paper, Sec. 4.1, Theorem 4.1),

    .. math::
        M = \exp(-\lambda T), \qquad
        T \in \{\, L = D - A,\ \ L D^{+},\ \ -A \,\},

    for ``operator`` ``'laplacian'``, ``'normalized_laplacian'`` (the random-walk normalised
    Laplacian :math:`L D^{+} = I - A D^{-1}` on nodes with edges) or ``'adjacency'``.
    Here :math:`A_{ij}` is the (summed) weight of the edges :math:`i \to j`, :math:`D` the
    diagonal of the row sums of :math:`A`, and :math:`D^{+}` its pseudo-inverse: for an isolated
    node :math:`D^{-1}` is taken as :math:`0`, so the node's row and column of :math:`T` vanish
    and :math:`M_{jj} = 1` for every operator.

    :math:`M` is never formed: :meth:`matmul` computes :math:`\exp(-\lambda T) X` by a scaled,
    truncated Taylor series (Al-Mohy & Higham, 2011), with the shift
    :math:`\mu = \mathrm{tr}(T)/N`, :math:`e^{-\lambda T} = (e^{-\lambda\mu/s}
    e^{-\lambda (T - \mu I)/s})^s`, :math:`s` steps and :math:`m` terms from the bound
    :math:`|\lambda| \lVert T - \mu I \rVert_\infty` (:func:`taylor_parameters`), and an early
    stop once two successive terms are negligible: :math:`O(m s\, (|E| + N) C)`. :math:`M` is
    block-diagonal over the graphs of a PyG batch and differentiable in ``lam``.

    Args:
        edge_index (Tensor): ``[2, E]`` edges (both directions for an undirected graph).
        num_nodes (int): :math:`N`.
        lam (float or Tensor): :math:`\lambda`, a scalar or ``[H]`` (one mask per head;
            :obj:`num_heads` is then ``H``). It must be finite; negative values are allowed.
        operator (str): ``'laplacian'``, ``'normalized_laplacian'`` or ``'adjacency'``
            (default: ``'laplacian'``).
        edge_weight (Tensor, optional): ``[E]`` edge weights (default: :obj:`None`, all ones).
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, lam: Union[float, Tensor],
                 operator: str = 'laplacian', edge_weight: Optional[Tensor] = None):
        if operator not in OPERATORS:
            raise ValueError(f"unknown operator {operator!r}: expected one of {OPERATORS}")
        N = self.num_nodes = int(num_nodes)
        check_edge_index(edge_index, N)
        device = edge_index.device
        ei = edge_index.long()
        E = ei.size(1)
        if edge_weight is None:
            edge_weight = torch.ones(E, device=device)
        elif edge_weight.dim() != 1 or edge_weight.numel() != E:
            raise ValueError(f"'edge_weight' must have shape [{E}] (one per edge), got "
                             f"{tuple(edge_weight.shape)}")
        edge_weight = edge_weight.detach()
        # to_dense() comes in the dtype of the tensor arguments (float32 by default); the operator
        # itself is assembled in float64 and cast per product.
        self.dtype = edge_weight.dtype if edge_weight.is_floating_point() else torch.float32
        edge_weight = edge_weight.double()

        if isinstance(lam, Tensor) and lam.is_floating_point():
            self.dtype = torch.promote_types(self.dtype, lam.dtype)
        lam = self.lam = head_param(lam, 'lam', device)
        if not bool(torch.isfinite(lam.detach()).all()):
            raise ValueError(f"'lam' must be finite, got {lam.detach().tolist()}")
        self.num_heads = lam.numel() if lam.dim() == 1 else None
        self.operator = operator

        # T as coalesced COO: off-diagonal part from A, diagonal from D (and self-loops).
        ar = torch.arange(N, device=device)
        deg = edge_weight.new_zeros(N).index_add_(0, ei[0], edge_weight)
        idx = torch.cat([ei, torch.stack([ar, ar])], dim=1)
        if operator == 'laplacian':
            val = torch.cat([-edge_weight, deg])
        elif operator == 'normalized_laplacian':
            dinv = torch.where(deg != 0, 1.0 / deg, torch.zeros_like(deg))
            val = torch.cat([-edge_weight * dinv[ei[1]], deg * dinv])
        else:
            idx, val = ei, -edge_weight
        t = torch.sparse_coo_tensor(idx, val, (N, N), check_invariants=False).coalesce()
        row, col = t.indices()
        val = t.values()
        self._row, self._col, self._val = row, col, val
        on_diag = row == col
        self.diagonal = val.new_zeros(N).index_add_(0, row[on_diag], val[on_diag])
        off_abs = val.new_zeros(N).index_add_(0, row[~on_diag], val[~on_diag].abs())
        self.shift = float(self.diagonal.sum() / N) if N > 0 else 0.0
        # ||T - mu I||_inf, exact for the sparse operator.
        self.norm = float(((self.diagonal - self.shift).abs() + off_abs).max()) if N > 0 else 0.0
        self._crow = torch.ops.aten._convert_indices_from_coo_to_csr(row, N)
        self._csr: Dict[torch.dtype, Tensor] = {}

    def operator_matrix(self, dtype: torch.dtype = torch.float32) -> Tensor:
        r"""The sparse CSR ``[N, N]`` operator :math:`T` (cached per dtype)."""
        if dtype not in self._csr:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                self._csr[dtype] = torch.sparse_csr_tensor(
                    self._crow, self._col, self._val.to(dtype), size=(self.num_nodes, ) * 2,
                    check_invariants=False)
        return self._csr[dtype]

    def taylor_parameters(self) -> Tuple[int, int]:
        r"""``(m, s)``: Taylor terms per step and number of steps used by :meth:`matmul`."""
        lam = float(self.lam.detach().abs().max()) if self.lam.numel() > 0 else 0.0
        return taylor_parameters(lam * self.norm)

    def _matmul(self, x: Tensor) -> Tensor:
        shared = x.dim() == 2
        if shared:
            x = x.unsqueeze(1)  # [N, 1, C]
        N, G, C = x.shape
        T = self.operator_matrix(x.dtype)
        lam = self.lam.to(x.dtype)
        lam = lam.view(1, -1, 1) if lam.dim() == 1 else lam.view(1, 1, 1)
        m, s = self.taylor_parameters()
        tol = 2.0**-53 if x.dtype == torch.float64 else 2.0**-24
        mu = self.shift

        def apply_b(y: Tensor) -> Tensor:  # (-lam / s) (T - mu I) y
            ty = (T @ y.reshape(N, G * C)).view(N, G, C) - mu * y
            return (-lam / s) * ty

        eta = torch.exp(-lam * mu / s)
        f = x
        for _ in range(s):
            term = f
            c1 = float(term.detach().abs().amax()) if term.numel() else 0.0
            for j in range(1, m + 1):
                term = apply_b(term) / j
                f = f + term
                c2 = float(term.detach().abs().amax()) if term.numel() else 0.0
                if c1 + c2 <= tol * float(f.detach().abs().amax()):
                    break
                c1 = c2
            f = eta * f
        return f.squeeze(1) if shared else f

    def to_dense(self) -> Tensor:
        T = torch.zeros(self.num_nodes, self.num_nodes, dtype=self._val.dtype,
                        device=self._val.device)
        T[self._row, self._col] = self._val
        lam = self.lam.double()
        lam = lam.view(-1, 1, 1) if lam.dim() == 1 else lam  # one [N, N] matrix per head
        return torch.linalg.matrix_exp(-lam * T).to(self.dtype)

    def __repr__(self) -> str:
        lam = format_param(self.lam)
        heads = '' if self.num_heads is None else f', heads={self.num_heads}'
        return (f"DiffusionKernelMask(num_nodes={self.num_nodes}, lam={lam}, "
                f"operator='{self.operator}'{heads})")
