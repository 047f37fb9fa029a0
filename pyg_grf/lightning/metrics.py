r"""Metrics of the training system: :class:`MultilabelAveragePrecision`, the LRGB / OGB-style
macro average precision of Peptides-func (Dwivedi et al., 2022)."""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torchmetrics.classification import MultilabelAveragePrecision as _TorchmetricsMultilabelAP
from torchmetrics.utilities import dim_zero_cat

#: The target value that marks an unlabeled entry for torchmetrics (``NaN`` targets become it).
IGNORE_INDEX = -1


class MultilabelAveragePrecision(_TorchmetricsMultilabelAP):
    r"""torchmetrics' :class:`~torchmetrics.classification.MultilabelAveragePrecision` (exact,
    no thresholds) with the conventions of the LRGB / OGB evaluators: ``NaN`` targets
    (unlabeled entries) are ignored column by column, and the macro mean runs over the columns
    that have both a positive and a negative (torchmetrics counts a column without positives as
    AP 0 and one without negatives as AP 1). For a column with scores :math:`s` and binary
    targets :math:`y`,

    .. math::
        \mathrm{AP} = \frac{1}{P}\sum_{i: y_i = 1} \mathrm{Prec}(s_i), \qquad
        \mathrm{Prec}(t) = \frac{|\{j: y_j = 1, s_j \ge t\}|}{|\{j: s_j \ge t\}|}

    (scikit-learn's step-wise AP; tied scores form one threshold). On complete targets where
    every column has both classes it equals torchmetrics' ``average='macro'`` and
    ``sklearn.metrics.average_precision_score(y, p, average='macro')``. Scores and targets are
    gathered across processes in DDP before the AP is computed; with no informative column
    :meth:`compute` gives ``NaN``.

    Args:
        num_labels (int): number of label columns :math:`L`.
        **kwargs: of :class:`~torchmetrics.Metric` (e.g. ``sync_on_compute``).
    """

    def __init__(self, num_labels: int, **kwargs: Any):
        # (torchmetrics refuses a single label unless its checks are off; ours run in update)
        kwargs.setdefault('validate_args', num_labels > 1)
        super().__init__(num_labels=num_labels, thresholds=None, average=None,
                         ignore_index=IGNORE_INDEX, **kwargs)

    def update(self, preds: Tensor, target: Tensor) -> None:
        r"""Adds ``preds [N, L]`` (logits or probabilities; only the order matters) and
        ``target [N, L]`` (in ``{0, 1}``, ``NaN`` for missing labels)."""
        if preds.dim() != 2 or preds.shape != target.shape or preds.size(1) != self.num_labels:
            raise ValueError(f"expected preds and target of the same shape [N, "
                             f"{self.num_labels}], got {tuple(preds.shape)} and "
                             f"{tuple(target.shape)}")
        target = target.detach()
        missing = torch.isnan(target) if target.is_floating_point() else torch.zeros_like(
            target, dtype=torch.bool)
        bad = ~(missing | (target == 0) | (target == 1))
        if bool(bad.any()):
            raise ValueError(f"expected targets in {{0, 1}} (NaN for missing labels), got the "
                             f"value {target[bad][0].item()}")
        target = torch.where(missing, torch.full_like(target, IGNORE_INDEX), target)
        # Scores in float64: torchmetrics maps logits through a sigmoid, which in float32 turns
        # every logit above ~17 into a tie at 1.0.
        super().update(preds.detach().double(), target.long())

    def compute(self) -> Tensor:
        with warnings.catch_warnings():  # columns without positives are left out below
            warnings.filterwarnings('ignore', message='No positive samples')
            ap = super().compute().reshape(-1)
        target = dim_zero_cat(self.target)
        keep = (target == 1).any(0) & (target == 0).any(0)
        if not bool(keep.any()):
            return torch.tensor(float('nan'), dtype=torch.float32)
        return ap[keep].mean().float()
