r"""Multi-head linear attention with any :class:`~pyg_grf.masks.MaskOperator` (FTFI paper, Sec. 2,
Lemma 2.1 and Algorithm 1): the layer form of
:func:`~pyg_grf.nn.functional.masked_linear_attention`."""
from __future__ import annotations

from typing import Any, Dict, Optional

from torch import Tensor, nn

from pyg_grf._validation import batch_or_zeros
from pyg_grf.masks.base import MaskOperator
from pyg_grf.masks.packing import PackingMask
from pyg_grf.nn.attention.base import QKVAttention, samples_as_graphs
from pyg_grf.nn.feature_maps import qk_features
from pyg_grf.nn.functional import masked_linear_attention


class MaskedLinearAttention(QKVAttention):
    r"""Multi-head linear attention masked by any mask with a fast product :math:`MX` (causal,
    Toeplitz / grid RPE, tree, diffusion-kernel, GRF, RWGNK, packing, low-rank, dense), from the
    `"From block-Toeplitz matrices to differential equations on graphs: towards a general theory
    for scalable masked Transformers" <https://arxiv.org/abs/2107.07999>`_ paper (Sec. 2, Lemma
    2.1, Algorithm 1):

    .. math::
        \mathbf{x}'_i = \mathbf{W}_o\,\Big\Vert_{h=1}^{H}
        \frac{\phi(\mathbf{q}^{(h)}_i)^\top \sum_j M^{(h)}_{ij}\,\phi(\mathbf{k}^{(h)}_j)
              \mathbf{v}^{(h)\top}_j}
             {\phi(\mathbf{q}^{(h)}_i)^\top \sum_j M^{(h)}_{ij}\,\phi(\mathbf{k}^{(h)}_j)}

    at the cost of one product :math:`MX` on an :math:`N \times H(md + m)` matrix (FTFI paper,
    Algorithm 1). A shared mask (``mask.num_heads is None``) applies to every head; a per-head
    mask needs ``num_heads == heads``.

    The mask comes with every call (``forward(x, mask=...)``), or from a *mask module*: an
    :class:`torch.nn.Module` that returns a :class:`~pyg_grf.masks.MaskOperator` from the
    keyword arguments of :meth:`forward`, whose parameters (e.g. Toeplitz weights, tree decay
    ``a``) are trained with the layer (example: ``docs/masks.md``). With neither, every graph
    of the batch attends to itself only (:class:`~pyg_grf.masks.PackingMask`).

    Args:
        channels, heads, head_channels, dropout, bias: the contract of
            :class:`~pyg_grf.nn.attention.base.QKVAttention`.
        feature_map (str or FeatureMap, optional): :math:`\phi`: ``'relu'``, ``'elu'`` or
            ``'favor+'`` (default: ``'relu'``). The mask should be non-negative when
            :math:`\phi` is, so that the normaliser stays positive.
        feature_map_kwargs (dict, optional): arguments of the feature map.
        mask_module (torch.nn.Module, optional): builds the mask from the keyword arguments of
            :meth:`forward` (default: :obj:`None`).
        eps (float, optional): added to the normaliser (default: :obj:`1e-6`).
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 feature_map: Any = 'relu', feature_map_kwargs: Optional[Dict[str, Any]] = None,
                 mask_module: Optional[nn.Module] = None, dropout: float = 0.0,
                 bias: bool = True, eps: float = 1e-6):
        super().__init__(channels, heads, head_channels, feature_map, feature_map_kwargs,
                         dropout, bias)
        if mask_module is not None and not isinstance(mask_module, nn.Module):
            raise TypeError(f"'mask_module' must be a torch.nn.Module that returns a "
                            f"MaskOperator, got {type(mask_module).__name__}")
        self.mask_module = mask_module
        self.eps = eps
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        if hasattr(getattr(self, 'mask_module', None), 'reset_parameters'):
            self.mask_module.reset_parameters()

    def forward(self, x: Tensor, batch: Optional[Tensor] = None, *,
                mask: Optional[MaskOperator] = None, **mask_kwargs: Any) -> Tensor:
        r"""``x``: ``[N, channels]``, or ``[B, n, channels]``: ``B`` samples all masked by the
        one mask over ``n`` nodes, in one mask product. ``batch`` is used only without any
        mask (per-graph unmasked attention). ``mask`` overrides the mask module, which gets
        ``**mask_kwargs``."""
        x, batch, samples = samples_as_graphs(x, batch)  # samples on one shared mask
        N = x.size(0) if x.dim() == 2 else -1
        if samples is not None:
            N = N // samples
        if mask is None and self.mask_module is not None:
            mask = self.mask_module(**mask_kwargs)
            if not isinstance(mask, MaskOperator):
                raise TypeError(f"the mask module {self.mask_module.__class__.__name__} must "
                                f"return a MaskOperator, got {type(mask).__name__}")
        elif mask_kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(mask_kwargs)}: they are "
                            f"passed to the mask module, and this layer has none")
        if mask is None and samples is None:
            mask = PackingMask(batch_or_zeros(batch, max(N, 0), x.device))
        elif mask is not None and not isinstance(mask, MaskOperator):
            raise TypeError(f"'mask' must be a pyg_grf.masks.MaskOperator, got "
                            f"{type(mask).__name__}")
        q, k, v = self.project(x)
        if mask is not None and mask.num_nodes != N:
            raise ValueError(f"the mask covers {mask.num_nodes} nodes but 'x' has {N} rows"
                             + ('' if samples is None else f' per sample ({samples} samples)'))
        if mask is not None and mask.num_heads is not None and mask.num_heads != self.heads:
            raise ValueError(f"the mask has {mask.num_heads} heads but the layer has "
                             f"{self.heads}")
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)  # keys per graph (sample)
        if samples is None:
            out = masked_linear_attention(phi_q, phi_k, self.drop_keys(v), mask, eps=self.eps)
            return self.finish(out)
        H = self.heads
        out = masked_linear_attention(*(t.view(samples, N, H, -1) for t in (
            phi_q, phi_k, self.drop_keys(v))), mask, eps=self.eps)
        return self.finish(out.reshape(samples * N, H, -1)).view(samples, N, -1)

    def _extra_repr(self) -> str:
        if self.mask_module is None:
            return ''
        return f', mask_module={self.mask_module.__class__.__name__}'
