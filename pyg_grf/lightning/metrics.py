r"""Metrics of the training system.

:class:`MultilabelAveragePrecision` is the LRGB / OGB-style macro average precision used for
Peptides-func (Dwivedi et al., 2022): torchmetrics'
:class:`~torchmetrics.classification.MultilabelAveragePrecision` computes the average precision of
every label column, and this thin wrapper adds what the LRGB / OGB evaluators do on top:

* ``NaN`` targets (unlabeled entries) are ignored, column by column;
* the macro mean runs over the columns that have both a positive and a negative (torchmetrics
  counts a column without positives as AP 0 and one without negatives as AP 1).

On complete targets where every column has both classes it equals torchmetrics'
``MultilabelAveragePrecision(average='macro')`` and
``sklearn.metrics.average_precision_score(y, p, average='macro')``.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torchmetrics.classification import MultilabelAveragePrecision as _TorchmetricsMultilabelAP
from torchmetrics.functional.classification import (
    multilabel_average_precision as _tm_multilabel_average_precision,
)
from torchmetrics.utilities import dim_zero_cat

#: The target value that marks an unlabeled entry for torchmetrics (``NaN`` targets become it).
IGNORE_INDEX = -1


def _check_shapes(preds: Tensor, target: Tensor, num_labels: Any = 'L') -> None:
    if preds.dim() != 2 or preds.shape != target.shape or (
            num_labels != 'L' and preds.size(1) != num_labels):
        raise ValueError(f"expected preds and target of the same shape [N, {num_labels}], got "
                         f"{tuple(preds.shape)} and {tuple(target.shape)}")


def _to_torchmetrics(preds: Tensor, target: Tensor):
    r"""Scores in float64 (torchmetrics maps logits through a sigmoid, which in float32 turns
    every logit above ~17 into a tie at 1.0) and integer targets with ``NaN`` ->
    :data:`IGNORE_INDEX`."""
    missing = torch.isnan(target) if target.is_floating_point() else torch.zeros_like(
        target, dtype=torch.bool)
    bad = ~(missing | (target == 0) | (target == 1))
    if bool(bad.any()):
        raise ValueError(f"expected targets in {{0, 1}} (NaN for missing labels), got the value "
                         f"{target[bad][0].item()}")
    target = torch.where(missing, torch.full_like(target, IGNORE_INDEX), target)
    return preds.double(), target.long()


def _informative_mean(ap: Tensor, target: Tensor) -> Tensor:
    r"""The mean of the per-label APs ``ap [L]`` over the columns of ``target [N, L]`` (integer,
    :data:`IGNORE_INDEX` for missing) that have a positive and a negative; ``NaN`` if none."""
    keep = (target == 1).any(0) & (target == 0).any(0)
    if not bool(keep.any()):
        return torch.tensor(float('nan'), dtype=torch.float32)
    return ap[keep].mean().float()


def multilabel_average_precision(preds: Tensor, target: Tensor) -> Tensor:
    r"""Macro average precision over label columns, LRGB / OGB style (functional form of
    :class:`MultilabelAveragePrecision`).

    For a column with scores :math:`s` and binary targets :math:`y` (``NaN`` = unlabeled,
    ignored),

    .. math::
        \mathrm{AP} = \frac{1}{P}\sum_{i: y_i = 1} \mathrm{Prec}(s_i), \qquad
        \mathrm{Prec}(t) = \frac{|\{j: y_j = 1, s_j \ge t\}|}{|\{j: s_j \ge t\}|}

    (scikit-learn's step-wise AP; tied scores form one threshold), computed by
    :func:`torchmetrics.functional.classification.multilabel_average_precision`.

    Args:
        preds (Tensor): ``[N, L]`` scores (logits or probabilities; only the order matters).
        target (Tensor): ``[N, L]`` targets in ``{0, 1}``, ``NaN`` for missing labels.

    Returns:
        A scalar: the mean AP over the columns that have a positive and a negative (``NaN`` if
        there are none).
    """
    _check_shapes(preds, target)
    preds, target = _to_torchmetrics(preds, target)
    with warnings.catch_warnings():  # columns without positives are left out below
        warnings.filterwarnings('ignore', message='No positive samples')
        # (torchmetrics refuses a single label unless its checks are off; ours ran above)
        ap = _tm_multilabel_average_precision(preds, target, num_labels=preds.size(1),
                                              average=None, ignore_index=IGNORE_INDEX,
                                              validate_args=preds.size(1) > 1)
    return _informative_mean(ap.reshape(-1), target)


class MultilabelAveragePrecision(_TorchmetricsMultilabelAP):
    r"""torchmetrics' :class:`~torchmetrics.classification.MultilabelAveragePrecision` (exact,
    no thresholds) with LRGB / OGB conventions: ``NaN`` targets are ignored and the macro mean
    runs over the columns that have a positive and a negative (see the module docstring). Scores
    and targets are gathered across processes in DDP before the AP is computed.

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
        _check_shapes(preds, target, self.num_labels)
        super().update(*_to_torchmetrics(preds.detach(), target.detach()))

    def compute(self) -> Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='No positive samples')
            ap = super().compute()
        return _informative_mean(ap.reshape(-1), dim_zero_cat(self.target))
