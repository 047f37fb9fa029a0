r"""Sparse products with a fixed pattern and learnable values, on every hot path.

:func:`spmm` runs torch's native CSR ``@`` (faster than torch-sparse and than a scatter) and is
differentiable in both the dense operand and the values, which torch's CSR ``@`` is not:

.. math::
    Y = \Phi X, \qquad
    \frac{\partial L}{\partial X} = \Phi^\top \frac{\partial L}{\partial Y}, \qquad
    \frac{\partial L}{\partial \Phi_{rc}} = \Big\langle \frac{\partial L}{\partial Y_{r}}, X_{c}
    \Big\rangle,

the value gradient being a sampled product over the nonzeros (SDDMM),
:math:`O(\mathrm{nnz}\cdot C)`.
"""
from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import check_index_range, check_shape, is_sorted


def without_csr_warning(fn, *args, **kwargs):
    r"""``fn(*args, **kwargs)`` without torch's "sparse CSR support is in beta" warning: the
    package uses CSR on purpose, the warning is not passed on to the user's program."""
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='Sparse CSR tensor support is in beta')
        return fn(*args, **kwargs)


def csr_tensor(crow: Tensor, col: Tensor, values: Tensor, size: Tuple[int, int]) -> Tensor:
    r"""A CSR tensor over existing indices (no checks, no copies)."""
    return without_csr_warning(torch.sparse_compressed_tensor, crow, col, values, size,
                               layout=torch.sparse_csr, check_invariants=False)


def csr_mm(a: Tensor, x: Tensor, out: Optional[Tensor] = None) -> Tensor:
    r""":math:`A X` for a CSR matrix ``a`` and a dense ``x``, written straight into a fresh
    result (``addmm`` with ``beta=0`` into itself): torch's ``a @ x`` (and ``mm(out=)``)
    zero-fills a temporary, multiplies into it and copies it into the result, two extra passes
    over an output that is often larger than the cache (a PubMed-sized ``[157736, 72]``
    product: 4x the time on the CPU; on CUDA a fill and a copy kernel per product). With
    ``beta=0`` neither MKL nor cuSPARSE reads the result (a NaN-filled one on both:
    ``tests/test_ops.py``, the ``cuda`` case run on an H200), so it starts empty. ``out``: a
    contiguous ``[a.size(0), x.size(1)]`` tensor (e.g. rows of a larger result) to write into
    instead."""
    out = x.new_empty(a.size(0), x.size(1)) if out is None else out
    return torch.addmm(out, a, x, beta=0.0, out=out)


class SparsePattern:
    r"""A fixed sparsity pattern of an :math:`R \times S` matrix with CSR views prepared for
    :math:`A X` and :math:`A^\top X`; built once (e.g. per batch), its values change freely.

    Args:
        index (Tensor): ``[2, nnz]`` (row, col) coordinates; duplicates are summed.
        size (tuple): ``(R, S)``.
    """

    def __init__(self, index: Tensor, size: Tuple[int, int], _trusted: bool = False):
        check_shape(index, 'index', 2, 'nnz')
        R, S = int(size[0]), int(size[1])
        index = index.long()
        if not _trusted:
            check_index_range(index[0], R, "the row indices of 'index'", 'size[0]')
            check_index_range(index[1], S, "the column indices of 'index'", 'size[1]')
        self.size = (R, S)
        self.nnz = index.size(1)
        key = index[0] * S + index[1]
        if _trusted or is_sorted(key):
            self.perm = None  # already in row-major order: no sort
            row, col = index[0], index[1]
        else:
            self.perm = torch.argsort(key, stable=True)
            row, col = index[0, self.perm], index[1, self.perm]
        # contiguous: torch's COO -> CSR conversion misreads a strided row vector
        self.row, self.col = row.contiguous(), col.contiguous()
        self.crow = torch.ops.aten._convert_indices_from_coo_to_csr(self.row, R)
        self._t = None
        self._repeats = {}
        self._csr = {}  # CSR indices as handed to torch, per orientation (see _csr_indices)
        self._block_of: Optional[Tuple['SparsePattern', int]] = None  # set by repeat()

    def repeat(self, heads: int) -> 'SparsePattern':
        r"""The pattern of the block-diagonal ``[heads * R, heads * S]`` matrix with this pattern
        in every diagonal block (cached): one CSR product serves all heads, the values of head
        ``h`` at ``[h * nnz, (h + 1) * nnz)`` and the operand head-major."""
        if heads == 1:
            return self
        if heads not in self._repeats:
            with torch.inference_mode(False):  # cached: must serve training later too
                R, S = self.size
                off = torch.arange(heads, device=self.row.device).view(-1, 1)
                index = torch.stack([(self.row.view(1, -1) + off * R).view(-1),
                                     (self.col.view(1, -1) + off * S).view(-1)])
                rep = SparsePattern(index, (heads * R, heads * S), _trusted=True)
                rep._block_of = (self, heads)
                self._repeats[heads] = rep
        return self._repeats[heads]

    def prepare(self) -> 'SparsePattern':
        r"""Builds the CSR views of the pattern and of its transpose ahead of use (e.g. in a
        DataLoader worker)."""
        self._csr_indices(False)
        self._csr_indices(True)
        return self

    def __getstate__(self):
        # the per-head repeats and the int32 CSR indices are rebuilt on first use: what crosses
        # a process boundary is nnz-sized, not heads * nnz
        state = self.__dict__.copy()
        state['_repeats'] = {}
        state['_csr'] = {}
        return state

    def _csr_indices(self, transpose: bool = False) -> Tuple[Tensor, Tensor]:
        # (crow, col) of the CSR view (of the transpose): int32 where the sizes allow, cached.
        # torch's CPU CSR kernels (MKL) work on 32-bit indices and convert int64 ones at every
        # call (a copy of nnz indices per product: ~40 % of a product on LRGB-sized batches).
        if transpose not in self._csr:
            crow, col = self._transpose()[1:] if transpose else (self.crow, self.col)
            if self.nnz < 2 ** 31 - 1 and max(self.size) < 2 ** 31 - 1:
                with torch.inference_mode(False):
                    crow, col = crow.to(torch.int32), col.to(torch.int32)
            self._csr[transpose] = (crow, col)
        return self._csr[transpose]

    def repeat_values(self, values: Tensor) -> Tensor:
        r"""Per-head values ``[heads, nnz]`` (in the order of the index this pattern was built
        from) as the ``[heads * nnz]`` values of :meth:`repeat` (row-major, head-major)."""
        if self.perm is not None:  # the repeated pattern is in row-major order
            values = values[:, self.perm]
        return values.reshape(-1)

    def _transpose(self):
        # (perm, crow, col) of the column-major order, cached (outside inference mode: what is
        # cached must serve training too)
        if self._t is None:
            with torch.inference_mode(False):
                self._t = self._build_transpose()
        return self._t

    def _build_transpose(self):
        if self._block_of is None:
            R, S = self.size
            perm_t = torch.argsort(self.col * R + self.row, stable=True)
            crow_t = torch.ops.aten._convert_indices_from_coo_to_csr(self.col[perm_t], S)
            return perm_t, crow_t, self.row[perm_t]
        # the transpose of a block-diagonal repeat is the repeat of the block's transpose: one
        # sort of nnz keys instead of heads * nnz (the order the stable sort would give)
        base, heads = self._block_of
        perm_t, crow_t, col_t = base._transpose()
        nnz, R = base.nnz, base.size[0]
        off = torch.arange(heads, device=perm_t.device).view(-1, 1)
        perm = (perm_t.view(1, -1) + off * nnz).reshape(-1)
        crow = torch.cat([(crow_t[:-1].view(1, -1) + off * nnz).reshape(-1),
                          crow_t.new_full((1, ), heads * nnz)])
        return perm, crow, (col_t.view(1, -1) + off * R).reshape(-1)

    def _sorted(self, values: Tensor) -> Tensor:
        return values if self.perm is None else values.index_select(0, self.perm)

    def to_csr(self, values: Tensor, transpose: bool = False) -> Tensor:
        values = self._sorted(values)
        crow, col = self._csr_indices(transpose)
        if transpose:
            perm_t = self._transpose()[0]
            return csr_tensor(crow, col, values.index_select(0, perm_t),
                              (self.size[1], self.size[0]))
        return csr_tensor(crow, col, values, self.size)

    def to_dense(self, values: Tensor) -> Tensor:
        out = values.new_zeros(self.size)
        return out.index_put((self.row, self.col), self._sorted(values), accumulate=True)


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, x: Tensor, pattern: SparsePattern, transpose: bool):
        ctx.pattern, ctx.transpose = pattern, transpose
        ctx.save_for_backward(values, x)
        if pattern.nnz == 0:
            R = pattern.size[1] if transpose else pattern.size[0]
            return x.new_zeros((R, x.size(1)))
        dt = compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            return csr_mm(pattern.to_csr(values.to(dt), transpose), x.to(dt)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        values, x = ctx.saved_tensors
        pattern, transpose = ctx.pattern, ctx.transpose
        grad_values = grad_x = None
        if pattern.nnz == 0:
            if ctx.needs_input_grad[0]:
                grad_values = torch.zeros_like(values)
            if ctx.needs_input_grad[1]:
                grad_x = torch.zeros_like(x)
            return grad_values, grad_x, None, None
        dt = compute_dtype(x)
        grad_out = grad_out.to(dt).contiguous()
        with torch.autocast(x.device.type, enabled=False):
            if ctx.needs_input_grad[1]:
                grad_x = csr_mm(pattern.to_csr(values.to(dt), not transpose), grad_out).to(x.dtype)
            if ctx.needs_input_grad[0]:
                # Y = A X: dL/dA_rc = <dY_r, X_c>;  Y = A^T X: dL/dA_rc = <X_r, dY_c>.
                a, b = (x, grad_out) if transpose else (grad_out, x)
                grad_values = _sddmm(pattern, a.to(dt), b.to(dt)).to(values.dtype)
        return grad_values, grad_x, None, None


def compute_dtype(x: Tensor) -> torch.dtype:
    r"""The dtype the sparse kernels run ``x`` in, whatever autocast says: float32 for half
    precision on the CPU (torch's CPU CSR kernels have none), else ``x``'s."""
    if x.dtype in (torch.float16, torch.bfloat16) and x.device.type == 'cpu':
        return torch.float32
    return x.dtype


def sampled_dot(crow: Tensor, col: Tensor, a: Tensor, b: Tensor, out: Tensor) -> Tensor:
    r""":math:`\langle a_r, b_c \rangle` for the nonzeros :math:`(r, c)` of the CSR indices
    ``(crow, col)``, without an ``[nnz, C]`` temporary, written into ``out`` (``[nnz]``, finite:
    ``sampled_addmm`` multiplies its input by ``beta = 0``, which keeps a NaN) and returned.
    Written into the holder itself: without ``out`` torch copies the whole input (indices and
    values, ~half the kernel's time on an LRGB-sized batch) before overwriting it."""
    holder = csr_tensor(crow, col, out, (a.size(0), b.size(0)))
    torch.sparse.sampled_addmm(holder, a, b.t(), beta=0.0, out=holder)
    return out


def _sddmm(pattern: SparsePattern, a: Tensor, b: Tensor) -> Tensor:
    # <a_r, b_c> at the nonzeros only, in the order of the pattern's input index
    dtype = a.dtype
    if dtype in (torch.float16, torch.bfloat16):  # torch's sampled_addmm has no half kernels
        a, b = a.float(), b.float()
    g = sampled_dot(*pattern._csr_indices(), a.contiguous(), b, a.new_zeros(pattern.nnz))
    if pattern.perm is not None:
        g = torch.empty_like(g).index_copy_(0, pattern.perm, g)
    return g.to(dtype)


class _SDDMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, pattern: SparsePattern):
        ctx.pattern = pattern
        ctx.save_for_backward(a, b)
        if pattern.nnz == 0:
            return a.new_zeros(0)
        dt = compute_dtype(a)
        with torch.autocast(a.device.type, enabled=False):
            return _sddmm(pattern, a.to(dt), b.to(dt)).to(a.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        pattern = ctx.pattern
        if pattern.nnz == 0:
            return torch.zeros_like(a), torch.zeros_like(b), None
        grad_a = grad_b = None
        dt = compute_dtype(a)
        with torch.autocast(a.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                grad_a = csr_mm(pattern.to_csr(grad.to(dt)), b.to(dt)).to(a.dtype)
            if ctx.needs_input_grad[1]:
                grad_b = csr_mm(pattern.to_csr(grad.to(dt), True), a.to(dt)).to(b.dtype)
        return grad_a, grad_b, None


def sddmm(pattern: SparsePattern, a: Tensor, b: Tensor) -> Tensor:
    r"""Sampled dense-dense product: :math:`\langle a_r, b_c \rangle` for every nonzero
    :math:`(r, c)` of ``pattern`` (``[nnz]``, in the order of the index the pattern was built
    from), differentiable in ``a`` (``[R, C]``) and ``b`` (``[S, C]``). Costs
    :math:`O(\mathrm{nnz}\cdot C)`; the gradients are two CSR products."""
    if a.dim() != 2 or b.dim() != 2 or a.size(1) != b.size(1):
        raise ValueError(f"'a' and 'b' must be [R, C] and [S, C], got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if a.size(0) != pattern.size[0] or b.size(0) != pattern.size[1]:
        raise ValueError(f"the pattern is {pattern.size} but 'a' has {a.size(0)} rows and 'b' "
                         f"{b.size(0)}")
    return _SDDMM.apply(a, b.contiguous(), pattern)


def spmm(pattern: SparsePattern, values: Tensor, x: Tensor, transpose: bool = False) -> Tensor:
    r""":math:`A X` (or :math:`A^\top X` with ``transpose``) for the ``[R, S]`` sparse matrix
    :math:`A` of ``pattern`` and ``values`` (``[nnz]``, in the order of the index the pattern was
    built from) and ``x`` ``[S, C]`` (``[R, C]`` if ``transpose``) or 1-D; differentiable in
    ``values`` and ``x``."""
    if values.dim() != 1 or values.numel() != pattern.nnz:
        raise ValueError(f"'values' must have shape [{pattern.nnz}], got {tuple(values.shape)}")
    expect = pattern.size[0] if transpose else pattern.size[1]
    if x.size(0) != expect:
        raise ValueError(f"dense operand must have {expect} rows, got {x.size(0)}")
    squeeze = x.dim() == 1
    if squeeze:
        x = x.unsqueeze(-1)
    out = _SpMM.apply(values, x.contiguous(), pattern, transpose)
    return out.squeeze(-1) if squeeze else out


def head_major(x: Tensor) -> Tensor:
    r"""``[N, H, C]`` to the head-major ``[H * N, C]`` operand of a repeated pattern."""
    N, H, C = x.shape
    return x.transpose(0, 1).reshape(H * N, C)


def from_head_major(y: Tensor, heads: int) -> Tensor:
    r"""Inverse of :func:`head_major`: ``[H * N, C]`` to ``[N, H, C]``."""
    return y.view(heads, -1, y.size(-1)).transpose(0, 1)


def head_spmm(pattern: SparsePattern, values: Tensor, x: Tensor,
              transpose: bool = False) -> Tensor:
    r"""Per-head sparse products :math:`A^{(h)} X^{(h)}` (or :math:`A^{(h)\top} X^{(h)}`) of
    ``[R, S]`` matrices that share ``pattern``, as one block-diagonal CSR product over all heads
    (:meth:`SparsePattern.repeat`): ``values`` ``[H, nnz]`` (in the order of the index the
    pattern was built from), ``x`` ``[S, H, C]`` (``[R, H, C]`` if ``transpose``), result
    ``[R, H, C]`` (``[S, H, C]``); differentiable in ``values`` and ``x``."""
    H = values.size(0)
    if x.dim() != 3 or x.size(1) != H:
        raise ValueError(f"'x' must have shape [rows, {H}, C] for {H} heads of values, got "
                         f"{tuple(x.shape)}")
    y = spmm(pattern.repeat(H), pattern.repeat_values(values), head_major(x), transpose)
    return from_head_major(y, H)
