r"""Pure functions of the attention layers.

:func:`masked_linear_attention` is the one primitive behind every masked linear-cost attention in
this package (FTFI paper, Sec. 2, Algorithm 1; GRF paper, Eq. 6-7): for a mask :math:`M` with a
fast product :math:`MX`,

.. math::
    \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \sum_j M_{ij}\,\phi(\mathbf{k}_j)\mathbf{v}_j^\top}
                        {\phi(\mathbf{q}_i)^\top \sum_j M_{ij}\,\phi(\mathbf{k}_j)}.

With :math:`X_j = [\phi(\mathbf{k}_j)\otimes\mathbf{v}_j,\ \phi(\mathbf{k}_j)]` both sums are the
rows of :math:`MX`, so the cost is one mask product on an :math:`N \times (md + m)` matrix.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from pyg_grf.masks.base import MaskOperator


def masked_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor,
                            mask: Optional[MaskOperator] = None, eps: float = 1e-6) -> Tensor:
    r"""Masked low-rank (linear) attention.

    Args:
        phi_q (Tensor): ``[N, H, m]`` query features :math:`\phi(\mathbf{q}_i)`.
        phi_k (Tensor): ``[N, H, m]`` key features :math:`\phi(\mathbf{k}_j)`.
        v (Tensor): ``[N, H, d]`` values.
        mask (MaskOperator, optional): the mask :math:`M` (shared or one per head). :obj:`None`
            means all pairs attend (:math:`M = \mathbf{1}\mathbf{1}^\top`, plain linear attention
            over all ``N`` rows; use :class:`~pyg_grf.masks.PackingMask` for per-graph attention
            in a PyG batch).
        eps (float): added to the normaliser, which must then be positive (default: ``1e-6``).

    Returns:
        Tensor ``[N, H, d]``.
    """
    if phi_q.dim() != 3 or phi_k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"expected phi_q, phi_k [N, H, m] and v [N, H, d], got "
                         f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)}, {tuple(v.shape)}")
    if phi_q.shape != phi_k.shape:
        raise ValueError(f"phi_q and phi_k must have the same shape, got {tuple(phi_q.shape)} "
                         f"and {tuple(phi_k.shape)}")
    if v.shape[:2] != phi_k.shape[:2]:
        raise ValueError(f"v must be [N, H, d] with the N and H of phi_k {tuple(phi_k.shape[:2])}, "
                         f"got {tuple(v.shape)}")
    N, H, m = phi_k.shape
    d = v.size(-1)
    # X_j = [phi(k_j) (x) v_j, phi(k_j)]  -> [N, H, m*d + m]
    kv = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).reshape(N, H, m * d)
    x = torch.cat([kv, phi_k], dim=-1)
    # Masked sums: rows of M X.
    if mask is None:
        mx = x.sum(0, keepdim=True).expand(N, -1, -1)
    else:
        if mask.num_nodes != N:
            raise ValueError(f"the mask covers {mask.num_nodes} nodes but the inputs have {N} rows")
        mx = mask.matmul(x)
    mkv, mk = mx.split([m * d, m], dim=-1)
    num = torch.einsum('nhm,nhmd->nhd', phi_q, mkv.reshape(N, H, m, d))
    den = torch.einsum('nhm,nhm->nh', phi_q, mk)
    return num / (den.unsqueeze(-1) + eps)


def dense_masked_linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor,
                                  mask: Optional[Tensor] = None, eps: float = 1e-6) -> Tensor:
    r"""The same computation with the :math:`N \times N` attention matrix formed explicitly,
    :math:`O(N^2)`: :math:`A_{ij} = \phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j) M_{ij}`, rows
    normalised. Reference for tests and small-graph baselines.

    Args:
        mask (Tensor, optional): ``[N, N]`` or ``[H, N, N]`` dense mask.
    """
    a = torch.einsum('ihm,jhm->hij', phi_q, phi_k)
    if mask is not None:
        a = a * (mask if mask.dim() == 3 else mask.unsqueeze(0)).to(a.dtype)
    out = torch.einsum('hij,jhd->ihd', a, v)
    return out / (a.sum(-1).t().unsqueeze(-1) + eps)
