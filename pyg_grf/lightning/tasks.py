r"""LightningModules for graph- and node-level targets: :class:`GraphLevelTask` (mini-batches
of graphs) and :class:`NodeLevelTask` (one graph with ``train_mask`` / ``val_mask`` /
``test_mask``, e.g. Planetoid), which add the loss and one torchmetrics object per split to
:class:`~pyg_grf.lightning.base.Task`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import AUROC, Accuracy, F1Score, MeanAbsoluteError, MeanSquaredError, Metric

from pyg_grf.lightning.base import SPLITS, Task
from pyg_grf.lightning.metrics import MultilabelAveragePrecision

TASKS = ('binary', 'multiclass', 'multilabel', 'regression')
LOSSES = ('cross_entropy', 'bce', 'l1', 'mse', 'smooth_l1')
_DEFAULT_LOSS = {'binary': 'bce', 'multiclass': 'cross_entropy', 'multilabel': 'bce',
                 'regression': 'l1'}
#: Metrics per task (the first is the default): accuracy, ROC-AUC (binary; the heterophilous
#: benchmarks of Platonov et al., 2023), LRGB macro average precision, mean absolute or squared
#: error, macro F1 (LRGB PascalVOC-SP / COCO-SP).
METRICS = {'binary': ('acc', 'auroc'), 'multiclass': ('acc', 'macro_f1'), 'multilabel': ('ap',),
           'regression': ('mae', 'mse')}


class _TargetTask(Task):
    r"""Shared parts of :class:`GraphLevelTask` and :class:`NodeLevelTask`: the task kind, its
    loss and metric, and :meth:`shared_step`; the two differ in which outputs and targets a batch
    gives (:meth:`select`)."""

    def __init__(self, model: torch.nn.Module, task: str = 'multiclass',
                 num_classes: Optional[int] = None, num_labels: Optional[int] = None,
                 loss: Optional[str] = None, metric: Optional[str] = None, **kwargs):
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got '{task}'")
        if metric is not None and metric not in METRICS[task]:
            raise ValueError(f"metric for task='{task}' must be one of {METRICS[task]}, got "
                             f"'{metric}'")
        if task == 'multiclass' and num_classes is None:
            raise ValueError("task='multiclass' needs num_classes")
        if task == 'multilabel' and num_labels is None:
            raise ValueError("task='multilabel' needs num_labels")
        loss = loss or _DEFAULT_LOSS[task]  # saved as a hyperparameter resolved
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got '{loss}'")
        super().__init__(model, **kwargs)
        self.task = task
        self.num_classes = num_classes
        self.num_labels = num_labels
        self.loss_name = loss
        self.metric_name = metric or METRICS[task][0]
        # (ModuleDict keys must not shadow nn.Module attributes such as `train`.)
        self.metrics = torch.nn.ModuleDict({f'{split}_metric': self._make_metric()
                                            for split in SPLITS})

    def _make_metric(self) -> Metric:
        if self.task == 'binary' and self.metric_name == 'auroc':
            return AUROC(task='binary')
        if self.task == 'binary':
            return Accuracy(task='binary')
        if self.task == 'multiclass' and self.metric_name == 'macro_f1':
            return F1Score(task='multiclass', num_classes=self.num_classes, average='macro')
        if self.task == 'multiclass':
            return Accuracy(task='multiclass', num_classes=self.num_classes)
        if self.task == 'multilabel':
            return MultilabelAveragePrecision(self.num_labels)
        if self.metric_name == 'mse':
            return MeanSquaredError()
        return MeanAbsoluteError()

    # Loss and metric on (prediction, target) pairs ---------------------------------------

    def _prepare(self, out: Tensor, y: Tensor):
        r"""Returns ``(out, y)`` reshaped for the loss and the metric."""
        if self.task == 'multiclass':
            if out.dim() != 2 or out.size(-1) != self.num_classes:
                raise ValueError(f"task='multiclass' expects model outputs [B, num_classes="
                                 f"{self.num_classes}], got {tuple(out.shape)}")
            return out, y.view(-1).long()
        if self.task == 'binary':
            if out.dim() == 2 and out.size(-1) == 2:
                # two class logits (how Platonov et al. and Luo et al. train binary node tasks):
                # their softmax is the sigmoid of the difference, so BCE on it is their
                # cross-entropy and the scores are the softmax's second column
                out = out[:, 1:] - out[:, :1]
            if out.dim() == 2 and out.size(-1) != 1:
                raise ValueError(f"task='binary' expects one logit per example (out_channels=1)"
                                 f" or two class logits (out_channels=2), got outputs "
                                 f"{tuple(out.shape)}")
            return out.view(-1), y.view(-1).float()
        # multilabel and regression: one output per target entry
        y = y.view(out.size(0), -1).float()
        if out.shape != y.shape:
            raise ValueError(f"task='{self.task}' expects outputs of the targets' shape "
                             f"{tuple(y.shape)}, got {tuple(out.shape)}")
        return out, y

    def _loss(self, out: Tensor, y: Tensor) -> Tensor:
        if self.loss_name == 'cross_entropy':
            return F.cross_entropy(out, y)
        if self.loss_name == 'bce':
            valid = ~torch.isnan(y)  # unlabeled entries (multilabel) do not count
            return F.binary_cross_entropy_with_logits(out[valid], y[valid])
        fn = {'l1': F.l1_loss, 'mse': F.mse_loss, 'smooth_l1': F.smooth_l1_loss}[self.loss_name]
        return fn(out, y)

    def _update_metric(self, split: str, out: Tensor, y: Tensor) -> None:
        metric = self.metrics[f'{split}_metric']
        if self.task == 'binary':
            metric.update(torch.sigmoid(out), y.long())
        else:
            metric.update(out, y)

    # Steps ---------------------------------------------------------------------------------

    def select(self, batch, split: str) -> Tuple[Tensor, Tensor, int]:
        r"""``(out, y, batch_size)``: the model's outputs on :obj:`batch` that count in
        :obj:`split`, their targets, and the number of examples."""
        raise NotImplementedError

    def shared_step(self, batch, split: str) -> Tensor:
        out, y, batch_size = self.select(batch, split)
        out, y = self._prepare(out, y)
        loss = self._loss(out, y)
        self._update_metric(split, out, y)
        self.log_loss(split, loss, batch_size)
        self.log(f'{split}/{self.metric_name}', self.metrics[f'{split}_metric'],
                 batch_size=batch_size, on_step=False, on_epoch=True, prog_bar=split != 'train')
        return loss


class GraphLevelTask(_TargetTask):
    r"""Graph classification / regression on mini-batches of graphs.

    Args:
        model (torch.nn.Module): the model, mapping a batch to ``[B, out]``; from Python, a
            dict or spec as in :class:`~pyg_grf.lightning.base.Task` (the annotation is the
            module alone so that configs are checked key by key against its signature).
        task (str, optional): ``'binary'`` (one logit, or two class logits whose softmax is
            the sigmoid of their difference; accuracy), ``'multiclass'`` (logits,
            accuracy), ``'multilabel'`` (one logit per label, LRGB macro AP, ``NaN`` targets
            ignored) or ``'regression'`` (MAE) (default: :obj:`'multiclass'`).
        num_classes (int, optional): classes for ``'multiclass'``.
        num_labels (int, optional): labels for ``'multilabel'``.
        loss (str, optional): ``'cross_entropy'``, ``'bce'``, ``'l1'``, ``'mse'`` or
            ``'smooth_l1'`` (default: by task: cross-entropy, BCE, BCE, L1).
        metric (str, optional): the metric, one of :data:`METRICS` for the task: ``'acc'``
            (binary, multiclass), ``'auroc'`` (binary: ROC-AUC of the sigmoid scores),
            ``'macro_f1'`` (multiclass; LRGB PascalVOC-SP / COCO-SP),
            ``'ap'`` (multilabel), ``'mae'`` or ``'mse'`` (regression) (default: the first for
            the task).
        **kwargs: the optimiser and its schedule (``lr``, ``weight_decay``, ...), as in
            :class:`~pyg_grf.lightning.base.Task`.

    Node-level targets on mini-batches of graphs (LRGB PascalVOC-SP / COCO-SP: ``y [N]``, one
    class per node) work the same way with a model that does not pool
    (``GraphTransformer(pooling=None)``): every node is one example.

    Logs ``{train,val,test}/loss`` and ``{train,val,test}/{acc,auroc,ap,mae,mse,macro_f1}``.
    """

    def select(self, batch, split: str) -> Tuple[Tensor, Tensor, int]:
        return self(batch), batch.y, batch.num_graphs


class NodeLevelTask(_TargetTask):
    r"""Node classification / regression on whole graphs with ``train_mask``, ``val_mask`` and
    ``test_mask`` (e.g. Planetoid). Arguments as in :class:`GraphLevelTask`; the model maps a
    graph to ``[N, out]`` (:class:`GraphTransformer` with ``pooling=None``)."""

    def select(self, batch, split: str) -> Tuple[Tensor, Tensor, int]:
        mask = getattr(batch, f'{split}_mask', None)
        if mask is None:
            raise ValueError(f"NodeLevelTask needs data.{split}_mask (a boolean node mask)")
        return self(batch)[mask], batch.y[mask], int(mask.sum())


__all__ = ['GraphLevelTask', 'NodeLevelTask', 'TASKS', 'LOSSES', 'METRICS', 'SPLITS']
