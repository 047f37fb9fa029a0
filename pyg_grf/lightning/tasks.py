r"""LightningModules: thin wrappers around a plain :class:`torch.nn.Module` model (e.g.
:class:`~pyg_grf.nn.models.graph_transformer.GraphTransformer`) that add the loss, one
torchmetrics object per split, AdamW with linear warm-up + cosine decay
(:func:`warmup_cosine_schedule`, torch's :class:`~torch.optim.lr_scheduler.SequentialLR`), and
resumable random state.

Graph-level tasks (:class:`GraphLevelTask`) take mini-batches of graphs; node-level tasks
(:class:`NodeLevelTask`) take one graph with ``train_mask`` / ``val_mask`` / ``test_mask``
(Planetoid). Gradient clipping is a :class:`~lightning.pytorch.Trainer` option
(``gradient_clip_val``).
"""
from __future__ import annotations

import random
from typing import Any, Dict, Optional, Union

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Accuracy, F1Score, MeanAbsoluteError, Metric

from pyg_grf.lightning.metrics import MultilabelAveragePrecision

TASKS = ('binary', 'multiclass', 'multilabel', 'regression')
LOSSES = ('cross_entropy', 'bce', 'l1', 'mse', 'smooth_l1')
_DEFAULT_LOSS = {
    'binary': 'bce',
    'multiclass': 'cross_entropy',
    'multilabel': 'bce',
    'regression': 'l1',
}
SPLITS = ('train', 'val', 'test')
#: Metrics per task (the first is the default): accuracy, LRGB macro average precision, mean
#: absolute error, macro F1 (LRGB PascalVOC-SP / COCO-SP).
METRICS = {
    'binary': ('acc',),
    'multiclass': ('acc', 'macro_f1'),
    'multilabel': ('ap',),
    'regression': ('mae',),
}


#: The classes a model spec (``class_path``) may name, in a config's model or a checkpoint's
#: hyperparameters, by their public dotted names: an explicit list, not whole packages (a
#: package-wide rule admitted e.g. ``torch_geometric.nn.Sequential``, which evaluates strings).
#: Their defining-module names (``torch_geometric.nn.conv.gat_conv.GATConv``) are accepted too.
#: Anything else is refused before it is imported; add your own with
#: :func:`register_model_class`.
MODEL_CLASS_PATHS = (
    # pyg_grf models, blocks and layers
    'pyg_grf.nn.GraphTransformer', 'pyg_grf.nn.models.samsa.SAMSAModel', 'pyg_grf.nn.GRFGPSConv',
    'pyg_grf.nn.GRFAttention', 'pyg_grf.nn.GKATAttention', 'pyg_grf.nn.SAMSAAttention',
    'pyg_grf.nn.MaskedLinearAttention', 'pyg_grf.nn.GraphBridge',
    'pyg_grf.nn.attention.reference.LinearAttention',
    'pyg_grf.nn.attention.reference.SoftmaxAttention',
    'pyg_grf.nn.attention.reference.PowerSeriesAttention',
    'pyg_grf.masks.grid.GridRPE',
    # the tasks themselves (a checkpoint's hyperparameters name their own class)
    'pyg_grf.lightning.tasks.GraphLevelTask', 'pyg_grf.lightning.tasks.NodeLevelTask',
    'pyg_grf.lightning.link.LinkLevelTask',
    # PyG message passing layers a user puts beside the attention (local_mp / conv)
    'torch_geometric.nn.GATConv', 'torch_geometric.nn.GATv2Conv', 'torch_geometric.nn.GINConv',
    'torch_geometric.nn.GINEConv', 'torch_geometric.nn.GCNConv', 'torch_geometric.nn.SAGEConv',
    'torch_geometric.nn.GraphConv', 'torch_geometric.nn.TransformerConv',
    'torch_geometric.nn.ResGatedGraphConv', 'torch_geometric.nn.GENConv',
    'torch_geometric.nn.MLP',
    # torch building blocks of those (nn in GINConv, ...)
    'torch.nn.Linear', 'torch.nn.Sequential', 'torch.nn.Identity', 'torch.nn.Dropout',
    'torch.nn.ReLU', 'torch.nn.GELU', 'torch.nn.ELU', 'torch.nn.LeakyReLU', 'torch.nn.SiLU',
    'torch.nn.Tanh', 'torch.nn.Sigmoid', 'torch.nn.LayerNorm', 'torch.nn.BatchNorm1d',
    # OGB's molecule encoders (Peptides configs)
    'ogb.graphproppred.mol_encoder.AtomEncoder', 'ogb.graphproppred.mol_encoder.BondEncoder',
)

_REGISTERED: Dict[str, type] = {}
_ALLOWED: Optional[Dict[str, str]] = None


def register_model_class(cls: type) -> type:
    r"""Allows a :class:`torch.nn.Module` subclass of your own in model specs (configs and
    checkpoint hyperparameters), under ``f'{cls.__module__}.{cls.__qualname__}'``. Usable as a
    class decorator. Register only code you trust: a checkpoint may name any registered class."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise TypeError(f"register_model_class needs a torch.nn.Module subclass, got {cls!r}")
    _REGISTERED[f'{cls.__module__}.{cls.__qualname__}'] = cls
    return cls


def allowed_class_paths() -> Dict[str, str]:
    r"""Every class path a model spec may name (:data:`MODEL_CLASS_PATHS`, their defining-module
    names, and :func:`register_model_class`'s), mapped to the canonical one."""
    global _ALLOWED
    if _ALLOWED is None:
        import importlib
        allowed = {}
        for path in MODEL_CLASS_PATHS:
            module, name = path.rsplit('.', 1)
            try:  # trusted packages only: importing them runs no foreign code
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):  # e.g. ogb not installed
                continue
            canonical = f'{cls.__module__}.{cls.__qualname__}'
            allowed[path] = allowed[canonical] = canonical
        _ALLOWED = allowed
    return {**_ALLOWED, **{path: path for path in _REGISTERED}}


class UntrustedClassError(ValueError):
    r"""Raised when a model spec (from a config or a checkpoint) names a class that is not in
    :data:`MODEL_CLASS_PATHS` (nor registered with :func:`register_model_class`) or something
    that is not a :class:`torch.nn.Module` subclass."""


def _check_class_path(class_path: Any, where: str = 'model') -> str:
    r"""Refuses a ``class_path`` that is not an allowed class *before* importing anything."""
    if not isinstance(class_path, str) or not all(
            part.isidentifier() for part in class_path.split('.')) or '.' not in class_path:
        raise UntrustedClassError(f"'{where}.class_path' must be a dotted name such as "
                                  f"'pyg_grf.nn.models.GraphTransformer' (got {class_path!r})")
    if class_path not in allowed_class_paths():
        raise UntrustedClassError(
            f"Refusing to build '{where}' from class_path {class_path!r}: only the "
            f"torch.nn.Module subclasses listed in pyg_grf.lightning.tasks.MODEL_CLASS_PATHS "
            f"(or registered with register_model_class) may be named in a config or checkpoint "
            f"(a checkpoint that names other code could run it). Register your class, or build "
            f"the model yourself and pass it: GraphLevelTask.load_from_checkpoint(path, "
            f"model=my_model).")
    return class_path


def _resolve_model_class(class_path: str, where: str = 'model') -> type:
    import importlib
    _check_class_path(class_path, where)
    if class_path in _REGISTERED:
        return _REGISTERED[class_path]
    module, name = class_path.rsplit('.', 1)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UntrustedClassError(f"'{where}.class_path' {class_path!r} does not name an "
                                  f"importable class ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise UntrustedClassError(f"'{where}.class_path' {class_path!r} is not a "
                                  f"torch.nn.Module subclass (got {cls!r})")
    return cls


def check_hparams_class_paths(hparams: Any, where: str = 'hparams') -> None:
    r"""Walks a (checkpoint's) hyperparameters and refuses every ``class_path`` /
    ``_class_path`` outside :data:`MODEL_CLASS_PATHS` (the task class itself may come from
    :obj:`pyg_grf` only)."""
    if isinstance(hparams, dict):
        for key, value in hparams.items():
            if key in ('class_path', '_class_path'):
                _check_class_path(value, where)
            else:
                check_hparams_class_paths(value, f'{where}.{key}')
    elif isinstance(hparams, (list, tuple)):
        for i, value in enumerate(hparams):
            check_hparams_class_paths(value, f'{where}[{i}]')


def _build_spec(spec: Dict[str, Any], where: str) -> torch.nn.Module:
    # A jsonargparse-style {'class_path', 'init_args'} spec whose init_args may hold nested
    # module specs (e.g. GraphTransformer's local_mp conv), built inside out, every class
    # checked against MODEL_CLASS_PATHS before anything is imported.
    check_hparams_class_paths(spec, where)
    cls = _resolve_model_class(spec['class_path'], where)
    init_args = spec.get('init_args', {}) or {}
    if not isinstance(init_args, dict):
        raise UntrustedClassError(f"'{where}.init_args' must be a dict (got "
                                  f"{type(init_args).__name__})")
    init_args = {key: _build_spec(value, f'{where}.init_args.{key}')
                 if isinstance(value, dict) and 'class_path' in value else value
                 for key, value in init_args.items()}
    return cls(**init_args)


def _build_model(model: Union[torch.nn.Module, Dict[str, Any]]) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    if isinstance(model, dict):
        model = dict(model)
        if 'class_path' in model:  # a jsonargparse-style spec
            return _build_spec(model, 'model')
        from pyg_grf.nn.models.graph_transformer import GraphTransformer
        return GraphTransformer(**model)
    raise TypeError(f"'model' must be a torch.nn.Module or a dict of GraphTransformer arguments, "
                    f"got {type(model).__name__}")


def _from_cli() -> bool:
    try:  # set while LightningCLI instantiates the module
        from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
    except ImportError:  # pragma: no cover
        return False
    return _given_hyperparameters.get() is not None


def _check_schedule(warmup_epochs: float, min_lr_ratio: float) -> None:
    if warmup_epochs < 0 or min_lr_ratio < 0 or min_lr_ratio > 1:
        raise ValueError(f"expected warmup_epochs >= 0 and 0 <= min_lr_ratio <= 1, got "
                         f"{warmup_epochs} and {min_lr_ratio}")


def _hparams_ignore(model: Any) -> Optional[list]:
    # A module passed as an object is saved in the state dict, not as a hyperparameter; under
    # LightningCLI the hyperparameters are the parsed config, model spec included, so that
    # `load_from_checkpoint` can rebuild the model.
    if isinstance(model, torch.nn.Module) and not _from_cli():
        return ['model']
    return None


def _rng_states() -> Dict[str, Any]:
    # Stored as tensors and plain Python objects so `torch.load(weights_only=True)` accepts them.
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        'torch': torch.get_rng_state(),
        'numpy': [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(gauss)],
        'python': random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: Dict[str, Any]) -> None:
    torch.set_rng_state(states['torch'])
    name, keys, pos, has_gauss, gauss = states['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    py = states['python']
    random.setstate((py[0], tuple(py[1]), py[2]))
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states['cuda'])


#: Length of the last phase of :func:`warmup_cosine_schedule` (holding the final learning rate):
#: longer than any run.
_HOLD_STEPS = 2**62


def warmup_cosine_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int,
                           total_steps: int, min_lr_ratio: float = 0.
                           ) -> torch.optim.lr_scheduler.SequentialLR:
    r"""Linear warm-up, cosine decay, then a constant learning rate, as torch's
    :class:`~torch.optim.lr_scheduler.SequentialLR` of
    :class:`~torch.optim.lr_scheduler.LinearLR`,
    :class:`~torch.optim.lr_scheduler.CosineAnnealingLR` and
    :class:`~torch.optim.lr_scheduler.ConstantLR`. With :math:`\eta` the optimizer's
    learning rate, :math:`w` = :obj:`warmup_steps`, :math:`T` = :obj:`total_steps` and
    :math:`r` = :obj:`min_lr_ratio`, the learning rate after :math:`s` scheduler steps is

    .. math::
        \eta_s = \begin{cases}
            \eta \, \frac{s + 1}{w + 1} & s < w \\
            \eta \left(r + (1 - r) \, \tfrac{1}{2}
                \left(1 + \cos \frac{\pi (s - w)}{T - w}\right)\right) & w \le s \le T \\
            r \, \eta & s > T.
        \end{cases}

    Args:
        optimizer (torch.optim.Optimizer): the optimizer; its groups share one ``lr``, the peak.
        warmup_steps (int): :math:`w`, ``0 <= w <= T`` (:obj:`0`: no warm-up).
        total_steps (int): :math:`T`, the end of the cosine decay, ``T >= 1``.
        min_lr_ratio (float, optional): :math:`r`, final learning rate / peak, in ``[0, 1]``
            (default: :obj:`0.`).
    """
    if not (total_steps >= 1 and 0 <= warmup_steps <= total_steps and 0 <= min_lr_ratio <= 1):
        raise ValueError(f"expected total_steps >= 1, 0 <= warmup_steps <= total_steps and "
                         f"0 <= min_lr_ratio <= 1, got total_steps={total_steps}, "
                         f"warmup_steps={warmup_steps}, min_lr_ratio={min_lr_ratio}")
    from torch.optim.lr_scheduler import (
        ConstantLR,
        CosineAnnealingLR,
        LinearLR,
        SequentialLR,
    )
    schedulers, milestones = [], []
    if warmup_steps > 0:
        schedulers.append(LinearLR(optimizer, start_factor=1. / (warmup_steps + 1),
                                   end_factor=1., total_iters=warmup_steps))
        milestones.append(warmup_steps)
    peaks = {group.get('initial_lr', group['lr']) for group in optimizer.param_groups}
    if len(peaks) != 1:  # CosineAnnealingLR has one eta_min for all groups
        raise ValueError(f"expected one learning rate for all parameter groups, got "
                         f"{sorted(peaks)}")
    peak = peaks.pop()
    schedulers.append(CosineAnnealingLR(optimizer, T_max=max(total_steps - warmup_steps, 1),
                                        eta_min=min_lr_ratio * peak))
    milestones.append(max(total_steps, warmup_steps + 1))
    schedulers.append(ConstantLR(optimizer, factor=min_lr_ratio, total_iters=_HOLD_STEPS))
    return SequentialLR(optimizer, schedulers, milestones)


class _Task(pl.LightningModule):
    r"""Shared parts of :class:`GraphLevelTask` and :class:`NodeLevelTask`."""

    def __init__(
        self,
        model: torch.nn.Module,
        task: str = 'multiclass',
        num_classes: Optional[int] = None,
        num_labels: Optional[int] = None,
        loss: Optional[str] = None,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_epochs: float = 0.,
        max_epochs: Optional[int] = None,
        min_lr_ratio: float = 0.,
        betas: tuple = (0.9, 0.999),
        metric: Optional[str] = None,
    ):
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got '{task}'")
        if metric is not None and metric not in METRICS[task]:
            raise ValueError(f"metric for task='{task}' must be one of {METRICS[task]}, got "
                             f"'{metric}'")
        if task == 'multiclass' and num_classes is None:
            raise ValueError("task='multiclass' needs num_classes")
        if task == 'multilabel' and num_labels is None:
            raise ValueError("task='multilabel' needs num_labels")
        loss = loss or _DEFAULT_LOSS[task]
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got '{loss}'")
        _check_schedule(warmup_epochs, min_lr_ratio)
        self.save_hyperparameters(ignore=_hparams_ignore(model))
        self.model = _build_model(model)
        self.task = task
        self.num_classes = num_classes
        self.num_labels = num_labels
        self.loss_name = loss
        self._set_optimisation(lr, weight_decay, warmup_epochs, max_epochs, min_lr_ratio, betas)
        # One metric object per split.
        self.metric_name = metric or METRICS[task][0]
        # (ModuleDict keys must not shadow nn.Module attributes such as `train`.)
        self.metrics = torch.nn.ModuleDict({f'{split}_metric': self._make_metric()
                                            for split in SPLITS})


    def _set_optimisation(self, lr: float, weight_decay: float, warmup_epochs: float,
                          max_epochs: Optional[int], min_lr_ratio: float, betas) -> None:
        # What configure_optimizers reads (shared with LinkLevelTask).
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_epochs = warmup_epochs
        self.max_epochs = max_epochs
        self.min_lr_ratio = min_lr_ratio
        self.betas = tuple(betas)

    def _make_metric(self) -> Metric:
        if self.task == 'binary':
            return Accuracy(task='binary')
        if self.task == 'multiclass' and self.metric_name == 'macro_f1':
            return F1Score(task='multiclass', num_classes=self.num_classes, average='macro')
        if self.task == 'multiclass':
            return Accuracy(task='multiclass', num_classes=self.num_classes)
        if self.task == 'multilabel':
            return MultilabelAveragePrecision(self.num_labels)
        return MeanAbsoluteError()

    def forward(self, data) -> Tensor:
        return self.model(data)

    # Loss and metric on (prediction, target) pairs ---------------------------------------

    def _prepare(self, out: Tensor, y: Tensor):
        r"""Returns ``(out, y)`` reshaped for the loss and the metric."""
        if self.task == 'multiclass':
            if out.dim() != 2 or out.size(-1) != self.num_classes:
                raise ValueError(f"task='multiclass' expects model outputs [B, num_classes="
                                 f"{self.num_classes}], got {tuple(out.shape)}")
            return out, y.view(-1).long()
        if self.task == 'binary':
            if out.dim() == 2 and out.size(-1) != 1:
                raise ValueError(f"task='binary' expects one logit per example (out_channels=1),"
                                 f" got outputs {tuple(out.shape)}")
            return out.view(-1), y.view(-1).float()
        if self.task == 'multilabel':
            y = y.view(out.size(0), -1).float()
            if out.shape != y.shape:
                raise ValueError(f"task='multilabel' expects outputs of the targets' shape "
                                 f"{tuple(y.shape)}, got {tuple(out.shape)}")
            return out, y
        y = y.view(out.size(0), -1).float()
        if out.shape != y.shape:
            raise ValueError(f"task='regression' expects outputs of the targets' shape "
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
        if self.task == 'multilabel':
            metric.update(out, y)
        elif self.task == 'binary':
            metric.update(torch.sigmoid(out), y.long())
        elif self.task == 'multiclass':
            metric.update(out, y)
        else:
            metric.update(out, y)

    def _log_step(self, split: str, loss: Tensor, batch_size: int) -> None:
        on_step = split == 'train'
        self.log(f'{split}/loss', loss, batch_size=batch_size, on_step=on_step, on_epoch=True,
                 prog_bar=split != 'test', sync_dist=split != 'train')
        self.log(f'{split}/{self.metric_name}', self.metrics[f'{split}_metric'],
                 batch_size=batch_size, on_step=False, on_epoch=True, prog_bar=split != 'train')

    # Optimisation --------------------------------------------------------------------------

    def configure_optimizers(self):
        decay, no_decay = [], []
        # Modules may exempt parameters through no_weight_decay() (e.g. GRFAttention's mask
        # coefficients f and beta: decaying them would shrink the mask, not regularise weights).
        exempt = set()
        for prefix, module in self.model.named_modules():
            if hasattr(module, 'no_weight_decay'):
                exempt |= {f'{prefix}.{n}' if prefix else n for n in module.no_weight_decay()}
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            # No weight decay on biases, norms and embeddings' scalar parameters.
            (no_decay if param.dim() <= 1 or name in exempt else decay).append(param)
        optimizer = torch.optim.AdamW(
            [{'params': decay, 'weight_decay': self.weight_decay},
             {'params': no_decay, 'weight_decay': 0.}], lr=self.lr, betas=self.betas)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        epochs = self.trainer.max_epochs if (self.trainer.max_epochs or -1) > 0 else None
        steps_per_epoch = total / epochs if epochs else total
        if self.max_epochs is not None:
            total = max(int(round(self.max_epochs * steps_per_epoch)), 1)
        warmup = min(int(round(self.warmup_epochs * steps_per_epoch)), total)
        scheduler = warmup_cosine_schedule(optimizer, warmup, total, self.min_lr_ratio)
        return {'optimizer': optimizer,
                'lr_scheduler': {'scheduler': scheduler, 'interval': 'step'}}

    # Loading ---------------------------------------------------------------------------------

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None,
                             strict=None, weights_only=True, **kwargs):
        r"""Lightning's :meth:`~lightning.pytorch.LightningModule.load_from_checkpoint`, after
        checking the checkpoint's hyperparameters: every ``class_path`` in them must name a
        class from :data:`MODEL_CLASS_PATHS`, otherwise :class:`UntrustedClassError` is
        raised before anything is imported or built. The checkpoint is read with
        ``torch.load(weights_only=True)``. Pass ``model=...`` to use a model built yourself."""
        from lightning.fabric.utilities.cloud_io import _load as pl_load
        if 'model' not in kwargs:
            if isinstance(checkpoint_path, (str, bytes)) or hasattr(checkpoint_path, '__fspath__'):
                ckpt = pl_load(checkpoint_path, map_location='cpu', weights_only=True)
            else:  # a file object: read it once, then rewind for Lightning
                pos = checkpoint_path.tell()
                ckpt = torch.load(checkpoint_path, map_location='cpu', weights_only=True)
                checkpoint_path.seek(pos)
            hparams = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_KEY, {}) if isinstance(ckpt, dict) \
                else {}
            check_hparams_class_paths(hparams, 'hparams')
            del ckpt
            if hparams_file is not None:
                import yaml
                with open(hparams_file) as f:
                    check_hparams_class_paths(yaml.safe_load(f), 'hparams_file')
        return super().load_from_checkpoint(checkpoint_path, map_location=map_location,
                                            hparams_file=hparams_file, strict=strict,
                                            weights_only=weights_only, **kwargs)

    # Resumable randomness (dropout, PE sign flips) -------------------------------------------

    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        checkpoint['pyg_grf_rng_states'] = _rng_states()

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        legacy = any(isinstance(state, dict) and 'lr_lambdas' in state
                     for state in checkpoint.get('lr_schedulers', []))
        if legacy and self._trainer is not None and self.trainer.state.fn == 'fit':
            raise ValueError(
                "Cannot resume training from this checkpoint: it holds the state of the "
                "LambdaLR schedule of pyg_grf 0.1 (expected the SequentialLR state of "
                "pyg_grf.lightning.tasks.warmup_cosine_schedule). Its weights still load "
                "(load_from_checkpoint, or `pyg-grf test --ckpt_path ...`); start a new `fit` "
                "to train further.")
        if 'pyg_grf_rng_states' in checkpoint:
            _set_rng_states(checkpoint['pyg_grf_rng_states'])


class GraphLevelTask(_Task):
    r"""Graph classification / regression on mini-batches of graphs.

    Args:
        model (torch.nn.Module): the model, mapping a batch to ``[B, out]``. From Python, a
            dict of :class:`~pyg_grf.nn.models.graph_transformer.GraphTransformer` arguments
            (or a ``{'class_path': ..., 'init_args': ...}`` spec) works too and is saved as a
            hyperparameter, so :meth:`load_from_checkpoint` needs no arguments. (The annotation
            is the module alone so that configs are checked key by key against the model's
            signature before anything runs.)
        task (str, optional): ``'binary'`` (one logit, accuracy), ``'multiclass'`` (logits,
            accuracy), ``'multilabel'`` (one logit per label, LRGB macro AP, ``NaN`` targets
            ignored) or ``'regression'`` (MAE) (default: :obj:`'multiclass'`).
        num_classes (int, optional): classes for ``'multiclass'``.
        num_labels (int, optional): labels for ``'multilabel'``.
        loss (str, optional): ``'cross_entropy'``, ``'bce'``, ``'l1'``, ``'mse'`` or
            ``'smooth_l1'`` (default: by task: cross-entropy, BCE, BCE, L1).
        lr (float, optional): peak learning rate of AdamW (default: :obj:`1e-3`).
        weight_decay (float, optional): AdamW weight decay on matrices (default: :obj:`0.01`).
        warmup_epochs (float, optional): linear warm-up length in epochs (default: :obj:`0.`).
        max_epochs (int, optional): horizon of the cosine decay in epochs; after it the
            learning rate stays at ``min_lr_ratio * lr`` (default: the trainer's
            ``max_epochs``).
        min_lr_ratio (float, optional): final learning rate / ``lr`` (default: :obj:`0.`).
        betas (tuple, optional): AdamW betas (default: :obj:`(0.9, 0.999)`).
        metric (str, optional): the metric, one of :data:`METRICS` for the task: ``'acc'``
            (binary, multiclass), ``'macro_f1'`` (multiclass; LRGB PascalVOC-SP / COCO-SP),
            ``'ap'`` (multilabel), ``'mae'`` (regression) (default: the first for the task).

    Node-level targets on mini-batches of graphs (LRGB PascalVOC-SP / COCO-SP: ``y [N]``, one
    class per node) work the same way with a model that does not pool
    (``GraphTransformer(pooling=None)``): every node is one example.

    Logs ``{train,val,test}/loss`` and ``{train,val,test}/{acc,ap,mae,macro_f1}``.
    """

    def _step(self, batch, split: str) -> Tensor:
        out, y = self._prepare(self(batch), batch.y)
        loss = self._loss(out, y)
        self._update_metric(split, out, y)
        self._log_step(split, loss, batch.num_graphs)
        return loss

    def training_step(self, batch, batch_idx: int) -> Tensor:
        return self._step(batch, 'train')

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, 'val')

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, 'test')

    def predict_step(self, batch, batch_idx: int) -> Tensor:
        return self(batch)


class NodeLevelTask(_Task):
    r"""Node classification / regression on whole graphs with ``train_mask``, ``val_mask`` and
    ``test_mask`` (e.g. Planetoid). Arguments as in :class:`GraphLevelTask`; the model maps a
    graph to ``[N, out]`` (:class:`GraphTransformer` with ``pooling=None``)."""

    def _step(self, batch, split: str) -> Tensor:
        mask = getattr(batch, f'{split}_mask', None)
        if mask is None:
            raise ValueError(f"NodeLevelTask needs data.{split}_mask (a boolean node mask)")
        out = self(batch)
        out, y = self._prepare(out[mask], batch.y[mask])
        loss = self._loss(out, y)
        self._update_metric(split, out, y)
        self._log_step(split, loss, int(mask.sum()))
        return loss

    def training_step(self, batch, batch_idx: int) -> Tensor:
        return self._step(batch, 'train')

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, 'val')

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, 'test')

    def predict_step(self, batch, batch_idx: int) -> Tensor:
        return self(batch)
