r"""Feature maps :math:`\phi: \mathbb{R}^d \to \mathbb{R}^m` of linear attention,
:math:`\exp(\mathbf{q}^\top\mathbf{k}) \approx \phi(\mathbf{q})^\top\phi(\mathbf{k})` or a
kernel of its own (GRF paper, Sec. 2; Katharopoulos et al., 2020; Choromanski et al., 2021)."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FeatureMap(nn.Module):
    r"""Base class: maps ``[..., d]`` to ``[..., m]`` with non-negative entries,
    ``forward(x, is_query=False)`` (and ``batch=None``, the ``[N]`` graph ids of the rows, for
    maps that set :attr:`uses_batch`). The features of one row may depend on other rows of the
    *same graph* only through a factor that cancels in attention's normalisation.
    """

    #: Whether ``forward`` accepts ``batch`` (graph ids of the rows).
    uses_batch: bool = False

    def output_dim(self, dim: int) -> int:
        return dim

    def redraw(self) -> None:
        r"""Resamples random parameters (no-op for deterministic maps)."""


class ReLUFeatureMap(FeatureMap):
    r""":math:`\phi(\mathbf{x}) = \mathrm{ReLU}(\mathbf{x})` (the GRF paper's choice, Table 2)."""

    def forward(self, x: Tensor, is_query: bool = False, batch: Optional[Tensor] = None) -> Tensor:
        return F.relu(x)

    def __repr__(self) -> str:
        return 'relu'


class _ELUPlusOne(torch.autograd.Function):
    # y = ELU(x) + 1 with dy/dx = min(y, 1) (y = e^x <= 1 for x <= 0, else x + 1 > 1): the
    # backward is one product, from the output alone. torch's elu_backward takes a slow
    # path on a strided gradient (the head-major kernels return those), 18 against 3 ms on
    # [19717, 8, 8] on one CPU thread.
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = F.elu(x).add_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        y, = ctx.saved_tensors
        return y.clamp(max=1.0).mul_(grad)


class ELUFeatureMap(FeatureMap):
    r""":math:`\phi(\mathbf{x}) = \mathrm{ELU}(\mathbf{x}) + 1` (Katharopoulos et al., 2020)."""

    def forward(self, x: Tensor, is_query: bool = False, batch: Optional[Tensor] = None) -> Tensor:
        return _ELUPlusOne.apply(x)

    def __repr__(self) -> str:
        return 'elu'


class FAVORPlus(FeatureMap):
    r"""FAVOR+ positive random features (Choromanski et al., 2021), an unbiased estimate of the
    softmax kernel:

    .. math::
        \phi(\mathbf{x}) = \frac{1}{\sqrt{m}}\exp\!\Big(\mathbf{W}\mathbf{x}
            - \tfrac{\lVert\mathbf{x}\rVert^2}{2}\Big),\qquad
        \mathbb{E}[\phi(\mathbf{q})^\top\phi(\mathbf{k})] = \exp(\mathbf{q}^\top\mathbf{k}),

    with the rows of :math:`\mathbf{W} \in \mathbb{R}^{m\times d}` Gaussian, orthogonalised in
    blocks of :math:`d` (norms resampled from the chi distribution). Inputs are scaled by
    :math:`d^{-1/4}` so the kernel is that of scaled dot-product attention.

    Args:
        dim (int): input dimension :math:`d`.
        num_features (int, optional): :math:`m` (default: :math:`d`).
        orthogonal (bool): orthogonal random features (default: :obj:`True`).
        stabilize (bool): subtract a shift inside the exponential, a factor that cancels in
            attention's normalisation (default: :obj:`True`): for queries the row's maximum,
            for keys the maximum over the keys of the same graph (``batch``) and head, so that
            a graph's output does not depend on the graphs batched with it.
    """

    uses_batch = True

    def __init__(self, dim: int, num_features: Optional[int] = None, orthogonal: bool = True,
                 stabilize: bool = True):
        super().__init__()
        self.dim = dim
        self.num_features = num_features or dim
        self.orthogonal = orthogonal
        self.stabilize = stabilize
        self.register_buffer('projection', torch.empty(self.num_features, dim))
        self.redraw()

    def output_dim(self, dim: int) -> int:
        return self.num_features

    @torch.no_grad()
    def redraw(self, generator: Optional[torch.Generator] = None) -> None:
        m, d = self.num_features, self.dim
        dev = self.projection.device
        if not self.orthogonal:
            w = torch.randn(m, d, generator=generator, device=dev)
        else:
            # Haar-distributed orthogonal blocks: QR of Gaussian blocks with the signs of R's
            # diagonal folded into Q (without it the rows are not uniformly distributed and the
            # estimator's variance grows several-fold).
            nb = math.ceil(m / d)
            g = torch.randn(nb, d, d, generator=generator, device=dev)
            q, r = torch.linalg.qr(g)
            q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
            w = q.transpose(-1, -2).reshape(nb * d, d)[:m]
            norms = torch.randn(m, d, generator=generator, device=dev).norm(dim=1, keepdim=True)
            w = w * norms
        self.projection.copy_(w)

    def forward(self, x: Tensor, is_query: bool = False, batch: Optional[Tensor] = None) -> Tensor:
        x = x * self.dim ** -0.25
        w = self.projection.to(x.dtype)
        proj = x @ w.t()
        logits = proj - 0.5 * (x * x).sum(-1, keepdim=True)
        if self.stabilize:
            if is_query:
                # One factor per query row: cancels in that query's normalisation.
                shift = logits.amax(-1, keepdim=True)
            else:
                # One factor per graph (and head): the keys a query attends to share it.
                # Without 'batch' the rows are one graph.
                N = logits.size(0)
                row_max = logits.detach().amax(-1).reshape(
                    N, math.prod(logits.shape[1:-1]))  # [N, heads...]
                if N == 0:  # an empty batch: nothing to shift (no maximum to take)
                    graph_max = row_max
                elif batch is None:
                    graph_max = row_max.amax(0, keepdim=True).expand_as(row_max)
                else:
                    index = batch.view(-1, 1).expand_as(row_max)
                    graph_max = row_max.new_full(row_max.shape, float('-inf')).scatter_reduce(
                        0, index, row_max, 'amax', include_self=True)[batch]
                shift = graph_max.reshape(logits.shape[:-1]).unsqueeze(-1)
            logits = logits - shift.detach()
        return torch.exp(logits) / math.sqrt(self.num_features)

    def __repr__(self) -> str:
        return f'FAVORPlus({self.dim}, num_features={self.num_features})'


def apply_feature_map(feature_map: nn.Module, x: Tensor, is_query: bool = False,
                      batch: Optional[Tensor] = None) -> Tensor:
    r"""Calls :obj:`feature_map` on :obj:`x`, passing :obj:`batch` (the ``[N]`` graph ids of the
    rows) to maps that use it (:attr:`FeatureMap.uses_batch`, e.g. :class:`FAVORPlus`, which then
    stabilises keys per graph) and not to others."""
    if batch is not None and getattr(feature_map, 'uses_batch', False):
        return feature_map(x, is_query=is_query, batch=batch)
    return feature_map(x, is_query=is_query)


def qk_features(feature_map: nn.Module, q: Tensor, k: Tensor,
                batch: Optional[Tensor] = None):
    r"""``(phi(q), phi(k))`` with the keys stabilised per graph (see :func:`apply_feature_map`)."""
    return (feature_map(q, is_query=True),
            apply_feature_map(feature_map, k, is_query=False, batch=batch))


def feature_map_resolver(name: Any, dim: int, **kwargs) -> FeatureMap:
    r"""Resolves ``'relu'``, ``'elu'`` or ``'favor+'``/``'performer'`` (with ``**kwargs``), or
    passes a :class:`FeatureMap` instance through."""
    if isinstance(name, FeatureMap):
        return name
    key = str(name).lower()
    if key in ('favor+', 'performer'):
        return FAVORPlus(dim, **kwargs)
    if key not in ('relu', 'elu'):
        raise ValueError(f"unknown feature map {name!r}; expected one of "
                         f"['elu', 'favor+', 'performer', 'relu'] or a FeatureMap instance")
    return ReLUFeatureMap() if key == 'relu' else ELUFeatureMap()
