r"""GKAT backend ``'sparse'`` (``mode='linear'`` only): low-rank masked linear attention with the
mask :math:`\mathcal{K} = \Psi\Psi^\top` applied as two sparse products, never formed (FTFI
paper, Sec. 4.2 and Algorithm 1):

.. math::
    \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top [\Psi(\Psi^\top \mathbf{X})]_i}
                        {\phi(\mathbf{q}_i)^\top [\Psi(\Psi^\top \mathbf{Z})]_i},
    \quad \mathbf{X}_j = \phi(\mathbf{k}_j) \otimes \mathbf{v}_j,
    \quad \mathbf{Z}_j = \phi(\mathbf{k}_j),

:math:`O(\mathrm{nnz}(\Psi)\, H m (C + 1))`, on the plan's pattern of :math:`\Psi` (its CSR and
transposed CSR views). The heads run one after another, each on its own ``[N, m (C + 1)]``
operand (it stays in cache), in one autograd function whose backward is the same two products
(:math:`\mathcal{K}` is symmetric)."""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_grf.nn.attention.gkat.pairs import head_major
from pyg_grf.ops import compute_dtype


def _kernel(A: Tensor, At: Tensor, x: Tensor, buffer: Tensor) -> Tensor:
    # K x = Psi (Psi^T x), written into zeroed outputs with addmm(out=) (torch's `A @ x` on a
    # CSR matrix computes into a temporary and copies it; beta=0 still multiplies the output,
    # which may hold NaN). ``buffer`` ([N, width]) holds Psi^T x.
    out = torch.zeros_like(x)
    if A.values().numel() == 0:  # an empty Psi: K = 0
        return out
    torch.addmm(buffer.zero_(), At, x, beta=0.0, out=buffer)
    return torch.addmm(out, A, buffer, beta=0.0, out=out)


class _LowRankMasked(torch.autograd.Function):
    r"""``o[h] = phi_q[h]^T [K (phi_k[h] (x) u[h])]`` per head, for head-major ``phi_q``,
    ``phi_k`` ``[H, N, m]`` and ``u`` ``[H, N, D]``: ``[H, N, D]``."""

    @staticmethod
    def forward(ctx, phi_q: Tensor, phi_k: Tensor, u: Tensor, A: Tensor, At: Tensor) -> Tensor:
        H, N, m = phi_k.shape
        D = u.size(-1)
        out = u.new_empty(H, N, D)
        buffer = u.new_empty(N, m * D)
        kept = []
        for h in range(H):  # one head at a time: its [N, m D] operand stays in cache
            x = (phi_k[h].unsqueeze(-1) * u[h].unsqueeze(-2)).view(N, m * D)
            s = _kernel(A, At, x, buffer).view(N, m, D)
            torch.sum(phi_q[h].unsqueeze(-1) * s, dim=1, out=out[h])
            kept.append(s if ctx.needs_input_grad[0] else None)
        ctx.kept, ctx.A, ctx.At = kept, A, At
        ctx.save_for_backward(phi_q, phi_k, u)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        phi_q, phi_k, u = ctx.saved_tensors
        A, At, kept = ctx.A, ctx.At, ctx.kept
        H, N, m = phi_k.shape
        D = u.size(-1)
        need_q, need_k, need_u = ctx.needs_input_grad[:3]
        g_q = torch.empty_like(phi_q) if need_q else None
        g_k = torch.empty_like(phi_k) if need_k else None
        g_u = torch.empty_like(u) if need_u else None
        buffer = u.new_empty(N, m * D)
        for h in range(H):
            g = grad[h].unsqueeze(-2)                                # [N, 1, D]
            # contractions over D as batched [m, D] x [D, 1] products (faster than a product
            # and a sum)
            if need_q:
                torch.bmm(kept[h], grad[h].unsqueeze(-1), out=g_q[h].unsqueeze(-1))
            if need_k or need_u:
                # d/dx of phi_q^T (K x) is K^T (phi_q (x) g), and K^T = K
                gx = _kernel(A, At, (phi_q[h].unsqueeze(-1) * g).view(N, m * D), buffer)
                gx = gx.view(N, m, D)
                if need_k:
                    torch.bmm(gx, u[h].unsqueeze(-1), out=g_k[h].unsqueeze(-1))
                if need_u:
                    torch.sum(gx * phi_k[h].unsqueeze(-1), dim=1, out=g_u[h])
        return g_q, g_k, g_u, None, None


def forward(plan, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float) -> Tensor:
    r"""``[N, H, C]`` outputs from ``phi_q``, ``phi_k`` ``[N, H, m]`` and ``v`` ``[N, H, C]``."""
    N, H, _ = phi_k.shape
    dtype = v.dtype
    dt = compute_dtype(v)
    with torch.autocast(v.device.type, enabled=False):
        # head-major operands [H, N, .]: every head's slice contiguous
        u = head_major(torch.cat([v.to(dt), v.new_ones(N, H, 1, dtype=dt)], dim=-1))
        value = plan.psi_value.to(dt)
        A, At = plan.psi.to_csr(value), plan.psi.to_csr(value, transpose=True)
        o = _LowRankMasked.apply(head_major(phi_q.to(dt)), head_major(phi_k.to(dt)),
                                 u, A, At).transpose(0, 1)     # [N, H, C + 1]
    o = o.to(dtype)
    return o[..., :-1] / (o[..., -1:] + eps)
