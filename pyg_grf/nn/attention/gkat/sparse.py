r"""GKAT backend ``'sparse'`` (``mode='linear'`` only): low-rank masked linear attention with the
mask :math:`\mathcal{K} = \Psi\Psi^\top` applied as two sparse products, never formed (FTFI
paper, Sec. 4.2 and Algorithm 1):

.. math::
    \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top [\Psi(\Psi^\top \mathbf{X})]_i}
                        {\phi(\mathbf{q}_i)^\top [\Psi(\Psi^\top \mathbf{Z})]_i},
    \quad \mathbf{X}_j = \phi(\mathbf{k}_j) \otimes \mathbf{v}_j,
    \quad \mathbf{Z}_j = \phi(\mathbf{k}_j),

:math:`O(\mathrm{nnz}(\Psi)\, H m C)`. Structures: the plan's pattern of :math:`\Psi` (its CSR
and transposed CSR views), nothing else."""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_grf.ops import spmm


def forward(plan, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float) -> Tensor:
    r"""``[N, H, C]`` outputs from ``phi_q``, ``phi_k`` ``[N, H, m]`` and ``v`` ``[N, H, C]``."""
    N, H, m = phi_k.shape
    C = v.size(-1)
    # X_j = [phi(k_j) (x) v_j, phi(k_j)] per head: [N, H * m * (C + 1)]
    v1 = torch.cat([v, v.new_ones(N, H, 1)], dim=-1)
    x = (phi_k.unsqueeze(-1) * v1.unsqueeze(-2)).reshape(N, -1)
    value = plan.psi_value.to(x.dtype)
    s = spmm(plan.psi, value, spmm(plan.psi, value, x, transpose=True))  # K X
    s = s.view(N, H, m, C + 1)
    o = (phi_q.unsqueeze(-1) * s).sum(-2)  # [N, H, C + 1]
    return o[..., :C] / (o[..., C:] + eps)

