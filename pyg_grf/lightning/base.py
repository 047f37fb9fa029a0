r"""The base of the tasks: :class:`Task`, a thin :class:`~lightning.pytorch.LightningModule`
around a plain :class:`torch.nn.Module` model. Gradient clipping is a
:class:`~lightning.pytorch.Trainer` option (``gradient_clip_val``)."""
from __future__ import annotations

import inspect
from typing import Any, Dict, Optional

import lightning.pytorch as pl
import torch
from torch import Tensor

from pyg_grf.lightning.rng import rng_states, set_rng_states
from pyg_grf.lightning.schedule import schedule_steps, warmup_cosine_schedule
from pyg_grf.lightning.specs import build_model, check_hparams_class_paths

try:  # set while LightningCLI instantiates the module
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
except ImportError:  # pragma: no cover - older Lightning
    _given_hyperparameters = None

SPLITS = ('train', 'val', 'test')

#: The task's optimisers by name: ``'adamw'`` decays weights apart from the gradient step
#: (Loshchilov & Hutter, 2019), ``'adam'`` adds ``weight_decay * w`` to the gradient (an L2
#: penalty: the GAT and GKAT papers' recipes). Both skip biases, norms and the parameters a
#: module lists in ``no_weight_decay()``.
OPTIMIZERS = {'adamw': torch.optim.AdamW, 'adam': torch.optim.Adam}


class Task(pl.LightningModule):
    r"""The optimiser and its schedule, checkpoint loading that builds only allow-listed
    classes, resumable random state and the step methods of the tasks.

    A task supplies :meth:`shared_step` (the loss on one batch of a split, with the split's
    metric updated and logged) and one metric object per split in :obj:`self.metrics` (keys
    ``'{split}_metric'``), named by :obj:`self.metric_name`. The hyperparameters are the
    arguments of the concrete task's constructor.

    Args:
        model (torch.nn.Module): the model; a dict of
            :class:`~pyg_grf.nn.models.graph_transformer.GraphTransformer` arguments or a
            ``{'class_path': ..., 'init_args': ...}`` spec works too and is saved as a
            hyperparameter (:func:`~pyg_grf.lightning.specs.build_model`).
        lr (float, optional): peak learning rate (default: :obj:`1e-3`).
        weight_decay (float, optional): weight decay on matrices (default: :obj:`0.01`).
        warmup_epochs (float, optional): linear warm-up length in epochs (default: :obj:`0.`).
        max_epochs (int, optional): horizon of the cosine decay in epochs; after it the
            learning rate stays at ``min_lr_ratio * lr`` (default: the trainer's
            ``max_epochs``).
        min_lr_ratio (float, optional): final learning rate / ``lr`` (default: :obj:`0.`).
        betas (tuple, optional): Adam(W) betas (default: :obj:`(0.9, 0.999)`).
        optimizer (str, optional): ``'adamw'`` or ``'adam'`` (:data:`OPTIMIZERS`); with
            ``min_lr_ratio=1`` and no warm-up the learning rate is constant
            (default: :obj:`'adamw'`).
    """

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, weight_decay: float = 0.01,
                 warmup_epochs: float = 0., max_epochs: Optional[int] = None,
                 min_lr_ratio: float = 0., betas: tuple = (0.9, 0.999), optimizer: str = 'adamw'):
        super().__init__()
        # (the schedule's steps are known only once a trainer is attached)
        if warmup_epochs < 0 or not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"expected warmup_epochs >= 0 and 0 <= min_lr_ratio <= 1, got "
                             f"{warmup_epochs} and {min_lr_ratio}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {tuple(OPTIMIZERS)}, got '{optimizer}'")
        # The hyperparameters are the arguments of the concrete task's constructor (the caller,
        # and its callers up a user's subclasses): a subclass may fix some of ours. One that
        # passes **kwargs on takes all of ours, so they count too (from this frame up).
        frame = inspect.currentframe()
        caller = frame.f_back
        if caller.f_code.co_name == '__init__' and caller.f_locals.get('self') is self \
                and not caller.f_code.co_flags & inspect.CO_VARKEYWORDS:
            frame = caller
        # A module passed as an object is saved in the state dict, not as a hyperparameter;
        # under LightningCLI the hyperparameters are the parsed config, model spec included.
        from_cli = _given_hyperparameters is not None and _given_hyperparameters.get() is not None
        ignore = ['model'] if isinstance(model, torch.nn.Module) and not from_cli else None
        self.save_hyperparameters(ignore=ignore, frame=frame)
        del frame, caller
        self.model = build_model(model)
        self.optim = dict(optimizer=optimizer, lr=lr, weight_decay=weight_decay,
                          betas=tuple(betas), warmup_epochs=warmup_epochs,
                          max_epochs=max_epochs, min_lr_ratio=min_lr_ratio)

    def forward(self, data) -> Tensor:
        return self.model(data)

    # Steps -----------------------------------------------------------------------------------

    def shared_step(self, batch, split: str) -> Tensor:
        r"""The loss on one batch of :obj:`split` (``'train'``, ``'val'`` or ``'test'``), with
        the split's metric updated and the loss logged (:meth:`log_loss`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement shared_step(batch, "
                                  f"split)")

    def training_step(self, batch, batch_idx: int) -> Tensor:
        return self.shared_step(batch, 'train')

    def validation_step(self, batch, batch_idx: int) -> None:
        self.shared_step(batch, 'val')

    def test_step(self, batch, batch_idx: int) -> None:
        self.shared_step(batch, 'test')

    def log_loss(self, split: str, loss: Tensor, batch_size: int) -> None:
        r"""Logs ``'{split}/loss'``: per step and per epoch in training, per epoch (averaged
        over processes) in validation and test."""
        self.log(f'{split}/loss', loss, batch_size=batch_size, on_step=split == 'train',
                 on_epoch=True, prog_bar=split != 'test', sync_dist=split != 'train')

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
        o = self.optim
        optimizer = OPTIMIZERS[o['optimizer']](
            [{'params': decay, 'weight_decay': o['weight_decay']},
             {'params': no_decay, 'weight_decay': 0.}], lr=o['lr'], betas=o['betas'])
        warmup, total = schedule_steps(self.trainer.estimated_stepping_batches,
                                       self.trainer.max_epochs, o['warmup_epochs'],
                                       o['max_epochs'])
        scheduler = warmup_cosine_schedule(optimizer, warmup, total, o['min_lr_ratio'])
        return {'optimizer': optimizer,
                'lr_scheduler': {'scheduler': scheduler, 'interval': 'step'}}

    # Loading ---------------------------------------------------------------------------------

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None,
                             strict=None, weights_only=True, **kwargs):
        r"""Lightning's :meth:`~lightning.pytorch.LightningModule.load_from_checkpoint`, after
        checking the checkpoint's hyperparameters: every ``class_path`` in them must name a
        class from :data:`~pyg_grf.lightning.specs.MODEL_CLASS_PATHS`, otherwise
        :class:`~pyg_grf.lightning.specs.UntrustedClassError` is raised before anything is
        imported or built. The checkpoint is read with ``torch.load(weights_only=True)``. Pass
        ``model=...`` to use a model built yourself."""
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
        checkpoint['pyg_grf_rng_states'] = rng_states()

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        legacy = any(isinstance(state, dict) and 'lr_lambdas' in state
                     for state in checkpoint.get('lr_schedulers', []))
        if legacy and self._trainer is not None and self.trainer.state.fn == 'fit':
            raise ValueError(
                "Cannot resume training from this checkpoint: it holds the state of the "
                "LambdaLR schedule of pyg_grf 0.1 (expected the SequentialLR state of "
                "pyg_grf.lightning.schedule.warmup_cosine_schedule). Its weights still load "
                "(load_from_checkpoint, or `pyg-grf test --ckpt_path ...`); start a new `fit` "
                "to train further.")
        if 'pyg_grf_rng_states' in checkpoint:
            set_rng_states(checkpoint['pyg_grf_rng_states'])


__all__ = ['SPLITS', 'Task']
