r"""Metrics of the training system.

:func:`multilabel_average_precision` is the LRGB / OGB-style macro average precision used for
Peptides-func (Dwivedi et al., 2022): the mean over labels of the average precision of each label
column, where ``NaN`` targets are ignored and columns without both a positive and a negative are
left out. On complete targets it equals
``sklearn.metrics.average_precision_score(y, p, average='macro')``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat


def multilabel_average_precision(preds: Tensor, target: Tensor) -> Tensor:
    r"""Macro average precision over label columns, LRGB style.

    For a column with scores :math:`s` and binary targets :math:`y` (``NaN`` = unlabeled,
    ignored),

    .. math::
        \mathrm{AP} = \frac{1}{P}\sum_{i: y_i = 1} \mathrm{Prec}(s_i), \qquad
        \mathrm{Prec}(t) = \frac{|\{j: y_j = 1, s_j \ge t\}|}{|\{j: s_j \ge t\}|},

    which is scikit-learn's step-wise AP (tied scores form one threshold). All columns are done at
    once with one sort, :math:`O(NL\log N)`.

    Args:
        preds (Tensor): ``[N, L]`` scores (logits or probabilities; only the order matters).
        target (Tensor): ``[N, L]`` targets in ``{0, 1}``, ``NaN`` for missing labels.

    Returns:
        A scalar: the mean AP over the columns that have a positive and a negative (``NaN`` if
        there are none).
    """
    if preds.shape != target.shape or preds.dim() != 2:
        raise ValueError(f"expected preds and target of the same shape [N, L], got "
                         f"{tuple(preds.shape)} and {tuple(target.shape)}")
    preds = preds.double().t()  # [L, N]
    target = target.double().t()
    valid = ~torch.isnan(target)
    pos = (target == 1) & valid
    # Sort each column by decreasing score.
    order = torch.argsort(preds, dim=1, descending=True)
    s = preds.gather(1, order)
    y = pos.gather(1, order).double()
    w = valid.gather(1, order).double()
    tps = y.cumsum(1)
    seen = w.cumsum(1)
    # Precision is taken at the end of each group of tied scores: the last position with a
    # score >= s_i, found by a binary search in the ascending -s.
    neg_s = -s.contiguous()
    end = torch.searchsorted(neg_s, neg_s, right=True) - 1
    precision = tps.gather(1, end) / seen.gather(1, end).clamp_min(1.)
    num_pos = y.sum(1)
    num_neg = w.sum(1) - num_pos
    ap = (y * precision).sum(1) / num_pos.clamp_min(1.)
    keep = (num_pos > 0) & (num_neg > 0)
    if not bool(keep.any()):
        return torch.tensor(float('nan'), dtype=torch.float32)
    return ap[keep].mean().float()


class MultilabelAveragePrecision(Metric):
    r"""Accumulating :class:`~torchmetrics.Metric` for :func:`multilabel_average_precision`
    (scores and targets are gathered across processes in DDP before the AP is computed)."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, num_labels: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.add_state('preds', default=[], dist_reduce_fx='cat')
        self.add_state('target', default=[], dist_reduce_fx='cat')

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.dim() != 2 or preds.size(1) != self.num_labels or preds.shape != target.shape:
            raise ValueError(f"expected preds and target of shape [N, {self.num_labels}], got "
                             f"{tuple(preds.shape)} and {tuple(target.shape)}")
        self.preds.append(preds.detach())
        self.target.append(target.detach())

    def compute(self) -> Tensor:
        return multilabel_average_precision(dim_zero_cat(self.preds), dim_zero_cat(self.target))
