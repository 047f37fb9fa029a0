r"""Callbacks that make ``pyg-grf fit`` resumable without lost or repeated work, and that plot
its learning curves."""
from __future__ import annotations

import json
import os
import os.path as osp
import uuid
from typing import Any, Dict, List
from weakref import proxy

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from pyg_grf._validation import check_int
from pyg_grf.lightning.files import atomic_write
from pyg_grf.lightning.signals import StopSignal


class AtomicModelCheckpoint(ModelCheckpoint):
    r""":class:`~lightning.pytorch.callbacks.ModelCheckpoint` that

    * writes every file to a temporary name and renames it into place (atomic on POSIX file
      systems): a process killed while saving leaves the previous file intact;
    * with ``save_last=True``, refreshes ``last.ckpt`` at the end of *every* training epoch
      (Lightning only does when a top-k checkpoint was saved in that step: with a monitored
      metric that stops improving, ``last.ckpt`` would go stale and a resumed run repeat epochs),
      and writes it once before the first step of a fresh run, so that a run stopped in its
      first epoch resumes too (from the start);
    * when stopped by a signal (:class:`~pyg_grf.lightning.signals.StopSignal`), says which
      ``last.ckpt`` ``--ckpt_path last`` resumes from.
    """

    def on_train_start(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule') -> None:
        super().on_train_start(trainer, pl_module)
        # Lightning skips step 0 (_should_skip_saving_checkpoint); a resumed run has its file
        if self.save_last and not self.save_weights_only and trainer.ckpt_path is None \
                and trainer.global_step == 0 and not trainer.fast_dev_run \
                and not trainer.sanity_checking:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule') -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer) \
                and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_exception(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule',
                     exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        if isinstance(exception, StopSignal) and self.last_model_path \
                and osp.isfile(self.last_model_path):
            rank_zero_info(f"Stopped by {exception.signal_name} at step {trainer.global_step}: "
                           f"`--ckpt_path last` resumes from '{self.last_model_path}' (the end "
                           f"of the last finished epoch; the epoch in progress runs again)")

    def _save_checkpoint(self, trainer: 'pl.Trainer', filepath: str) -> None:
        tmp = trainer.strategy.broadcast(f'{filepath}.{uuid.uuid4().hex[:8]}.part')
        try:
            trainer.save_checkpoint(tmp, self.save_weights_only)
            trainer.strategy.barrier('atomic_checkpoint')
            if trainer.is_global_zero:
                os.replace(tmp, filepath)
        except BaseException:  # stopped (a signal) or failed: the previous file stays, no litter
            if trainer.is_global_zero and osp.lexists(tmp):
                os.remove(tmp)
            raise
        trainer.strategy.barrier('atomic_checkpoint_done')
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))


def _to_float(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


class EpochMetricsLog(Callback):
    r"""Writes ``<trainer.log_dir>/epoch_metrics.jsonl``: one line per finished training epoch
    with ``epoch``, ``step`` and every metric in ``trainer.callback_metrics`` at the end of the
    epoch (validation included). The rows are stored in the checkpoint and the file is rewritten
    atomically from them, so after a resume it holds exactly the epochs of the checkpoint plus
    those run since (a killed, unsaved epoch is run again, never listed twice).

    Args:
        filename (str, optional): the file name in the log folder (default: as above).
    """

    def __init__(self, filename: str = 'epoch_metrics.jsonl'):
        self.filename = filename
        self.rows: List[Dict[str, Any]] = []

    def _write(self, trainer: 'pl.Trainer') -> None:
        if not trainer.is_global_zero:
            return
        path = osp.join(trainer.log_dir or trainer.default_root_dir, self.filename)
        os.makedirs(osp.dirname(path), exist_ok=True)
        with atomic_write(path) as f:  # never through a link planted at `path`
            for row in self.rows:
                f.write(json.dumps(row, sort_keys=True) + '\n')

    def on_train_start(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule') -> None:
        # After a resume: drop the rows of epochs the checkpoint does not hold.
        self._write(trainer)

    def on_train_epoch_end(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule') -> None:
        if trainer.sanity_checking:
            return
        row = {'epoch': int(trainer.current_epoch), 'step': int(trainer.global_step)}
        row.update({k: _to_float(v) for k, v in sorted(trainer.callback_metrics.items())})
        self.rows = [r for r in self.rows if r['epoch'] < row['epoch']] + [row]
        self._write(trainer)

    def state_dict(self) -> Dict[str, Any]:
        return {'rows': json.dumps(self.rows)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.rows = json.loads(state_dict.get('rows', '[]'))


class LearningCurvePlot(Callback):
    r"""Writes ``<trainer.log_dir>/learning_curves.png`` at the end of ``fit``
    (:func:`pyg_grf.lightning.plot.plot_learning_curves`, monitoring the checkpoint callback's
    ``monitor``). Does nothing in a ``fast_dev_run``; says in one line why there is no plot
    (e.g. matplotlib is not installed).

    Args:
        filename (str, optional): the file name in the log folder (default: as above).
    """

    def __init__(self, filename: str = 'learning_curves.png'):
        self.filename = filename

    def on_fit_end(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule') -> None:
        if not trainer.is_global_zero or trainer.fast_dev_run:
            return
        from pyg_grf.lightning.plot import plot_learning_curves
        run_dir = trainer.log_dir or trainer.default_root_dir
        monitor = getattr(trainer.checkpoint_callback, 'monitor', None)
        try:
            path, _ = plot_learning_curves(run_dir, osp.join(run_dir, self.filename), monitor)
        except (FileNotFoundError, ValueError, ImportError) as exc:  # e.g. no finished epoch
            rank_zero_info(f"No learning-curve plot: {exc}")
            return
        rank_zero_info(f"Learning curves: {path}")


class MallocTrim(Callback):
    r"""Returns the process's free heap memory to the system every ``every_n_steps`` training
    steps and after every validation (:func:`pyg_grf.utils.trim_malloc`), so that the resident
    memory of a run with :func:`~pyg_grf.utils.tune_malloc`'s settings stays bounded when the
    batches change shape at every step. ``pyg-grf`` adds it whenever it tunes the allocator.

    Args:
        every_n_steps (int, optional): training steps between trims (default: :obj:`50`).
    """

    def __init__(self, every_n_steps: int = 50):
        check_int('every_n_steps', every_n_steps, 1)
        self.every_n_steps = every_n_steps
        self.trims = 0

    def _trim(self) -> None:
        from pyg_grf.utils import trim_malloc
        if trim_malloc():
            self.trims += 1

    def on_train_batch_end(self, trainer: 'pl.Trainer', pl_module: 'pl.LightningModule',
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % self.every_n_steps == 0:
            self._trim()

    def on_validation_epoch_end(self, trainer: 'pl.Trainer',
                                pl_module: 'pl.LightningModule') -> None:
        self._trim()


__all__ = ['AtomicModelCheckpoint', 'EpochMetricsLog', 'LearningCurvePlot', 'MallocTrim']
