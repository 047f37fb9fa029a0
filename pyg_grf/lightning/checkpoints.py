r"""Checkpoint paths and run folders of the ``pyg-grf`` CLI: the newest / best checkpoint of a
run, the refusal of remote or chained checkpoint paths before any I/O
(:func:`check_local_ckpt_path`), ``--ckpt_path last|best`` resolution, and resuming into the
run's own log version without losing its earlier metrics (:func:`reuse_log_version`)."""
from __future__ import annotations

import glob
import os
import os.path as osp
import re
import shutil
from typing import Any, Optional

import lightning.pytorch as pl
import torch


def _log_root(trainer: pl.Trainer) -> str:
    logger = trainer.logger
    if logger is not None and getattr(logger, 'save_dir', None) is not None:
        name = getattr(logger, 'name', None) or ''
        return osp.join(logger.save_dir, name)
    return osp.join(trainer.default_root_dir, 'lightning_logs')


def _version_number(path: str) -> int:
    match = re.search(r'version_(\d+)', path)
    return int(match.group(1)) if match else -1


def find_last_checkpoint(trainer: pl.Trainer) -> Optional[str]:
    r"""The ``last.ckpt`` of the newest run (highest ``version_<N>``) under the trainer's log
    folder, or of the checkpoint callback's fixed ``dirpath``; :obj:`None` if there is none."""
    ckpt = trainer.checkpoint_callback
    if ckpt is not None and ckpt.dirpath is not None:
        path = osp.join(ckpt.dirpath, 'last.ckpt')
        return path if osp.isfile(path) else None
    found = glob.glob(osp.join(_log_root(trainer), 'version_*', 'checkpoints', 'last.ckpt'))
    return max(found, key=_version_number) if found else None


def best_checkpoint_of(last: str) -> Optional[str]:
    r"""The best checkpoint recorded in the checkpoint :obj:`last` by a monitored
    :class:`ModelCheckpoint` (read with ``weights_only=True``), or :obj:`None`."""
    state = torch.load(last, map_location='cpu', weights_only=True)
    for key, value in (state.get('callbacks') or {}).items():
        if not isinstance(value, dict):
            continue
        path = value.get('best_model_path')
        if value.get('monitor') and path and osp.isfile(path):
            return path
    return None


def check_local_ckpt_path(ckpt_path: Any) -> None:
    r"""Refuses a ``--ckpt_path`` that fsspec (through which Lightning reads checkpoints) would
    not read as a local file: a URL (``scheme://`` anywhere, leading spaces or not), a chained
    URL (``simplecache::http://...``: ``::`` anywhere), a ``data:`` URL, or Lightning's model
    ``registry`` (a download). Local paths and the keywords ``last``, ``best`` and ``hpc`` pass.

    Raises:
        ValueError: naming the path; a downloaded checkpoint is read by Lightning without
            ``weights_only`` and could run code: download it, check it, and pass the local
            file.
    """
    if ckpt_path is None:
        return
    if not isinstance(ckpt_path, (str, os.PathLike)):
        raise ValueError(f"--ckpt_path must be the path of a local checkpoint file, got "
                         f"{type(ckpt_path).__name__} {ckpt_path!r}")
    text = os.fspath(ckpt_path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    stripped = text.strip()
    remote = _is_remote(stripped) or stripped.lower() == 'registry' \
        or stripped.lower().startswith('registry:')
    if remote:
        raise ValueError(f"--ckpt_path {text!r}: remote checkpoints are refused (a URL, a "
                         f"chained fsspec URL with '::', a 'data:' URL or Lightning's model "
                         f"registry: Lightning unpickles downloads without weights_only, which "
                         f"can run code); download the file, check it, and pass the local path "
                         f"(a local file whose name holds '::' or '://' must be renamed)")


def _is_remote(text: str) -> bool:
    # what fsspec would not read as a local path: a URL, a chained URL, a data: URL
    text = text.strip()
    return '://' in text or '::' in text or text.lower().startswith('data:')


def check_local_dirs(config: Any) -> None:
    r"""Refuses a remote run folder (``trainer.default_root_dir``, ``checkpoint.dirpath``):
    ``--ckpt_path last`` / ``best`` look for checkpoints there, and Lightning reads through
    fsspec, so a URL there would list and fetch files from elsewhere.

    Raises:
        ValueError: naming the option and its value.
    """
    def get(obj: Any, *keys: str) -> Any:
        for key in keys:
            if obj is None:
                return None
            obj = obj.get(key) if hasattr(obj, 'get') else getattr(obj, key, None)
        return obj
    for keys in (('trainer', 'default_root_dir'), ('checkpoint', 'dirpath')):
        value = get(config, *keys)
        if isinstance(value, (str, os.PathLike)) and _is_remote(os.fsdecode(os.fspath(value))):
            raise ValueError(f"--{'.'.join(keys)} {value!r}: run folders must be local (a URL "
                             f"or chained fsspec URL would have checkpoints listed and read "
                             f"from elsewhere)")


def resolve_ckpt_path(trainer: pl.Trainer, ckpt_path: str, subcommand: str) -> Optional[str]:
    r"""Resolves ``ckpt_path='last'`` to the ``last.ckpt`` of the newest run and
    ``ckpt_path='best'`` (in a process that has not trained: ``pyg-grf test --ckpt_path best``)
    to the best checkpoint recorded in it. Other values are returned unchanged.

    Raises:
        FileNotFoundError: for ``'best'`` when no run with a monitored checkpoint is found.
        ValueError: for anything but a local path (:func:`check_local_ckpt_path`).
    """
    check_local_ckpt_path(ckpt_path)
    ckpt = trainer.checkpoint_callback
    if ckpt_path == 'last':
        last = find_last_checkpoint(trainer)
        return last if last is not None else ckpt_path  # Lightning warns and starts fresh
    if ckpt_path == 'best' and subcommand != 'fit':
        if ckpt is not None and ckpt.best_model_path:
            return ckpt_path  # trained in this process
        last = find_last_checkpoint(trainer)
        best = best_checkpoint_of(last) if last is not None else None
        if best is None:
            where = last or osp.join(_log_root(trainer), 'version_*', 'checkpoints', 'last.ckpt')
            raise FileNotFoundError(
                f"--ckpt_path best: no best checkpoint found (looked in '{where}'). 'best' needs "
                f"a finished `pyg-grf fit` with the same config and `checkpoint.monitor` set "
                f"(e.g. monitor: val/acc, mode: max); or pass a checkpoint file.")
        return best
    return ckpt_path


def reuse_log_version(trainer: pl.Trainer, ckpt_path: Optional[str]) -> None:
    r"""When resuming from ``<log root>/version_<N>/checkpoints/*.ckpt``, makes the loggers write
    to ``version_<N>`` again, so the checkpoints (and the best-model tracking restored from the
    checkpoint) stay in one folder instead of restarting in a new version."""
    if not ckpt_path or ckpt_path in ('last', 'best', 'hpc') or not osp.isfile(ckpt_path):
        return
    run_dir = osp.dirname(osp.dirname(osp.abspath(ckpt_path)))
    if osp.basename(osp.dirname(osp.abspath(ckpt_path))) != 'checkpoints':
        return
    if osp.realpath(osp.dirname(run_dir)) != osp.realpath(_log_root(trainer)):
        return
    version = _version_number(osp.basename(run_dir))
    if version < 0:
        return
    metrics = osp.join(run_dir, 'metrics.csv')
    if osp.isfile(metrics):  # the resumed CSVLogger deletes it on opening: keep a copy
        shutil.copyfile(metrics, osp.join(run_dir, '.metrics_before_resume.csv'))
    try:  # the epoch the checkpoint was saved at: rows logged after it are redone
        saved_epoch = int(torch.load(ckpt_path, map_location='cpu',
                                     weights_only=True).get('epoch', -1))
    except Exception:  # noqa: BLE001 - Lightning reports a bad checkpoint itself
        saved_epoch = None
    for logger in trainer.loggers:
        if hasattr(logger, '_version') and getattr(logger, '_version', None) is None:
            logger._version = version
            if hasattr(logger, '_experiment'):
                logger._experiment = None
            _keep_csv_rows(logger, saved_epoch)


def _keep_csv_rows(logger: Any, saved_epoch: Optional[int]) -> None:
    r"""A resumed CSVLogger deletes its ``metrics.csv`` when it opens the version folder again:
    reopen it here and write back the rows of the epochs up to the checkpoint (later ones are
    logged again by the resumed run), so the file keeps the whole run."""
    import csv
    experiment = getattr(logger, 'experiment', None)
    path = getattr(experiment, 'metrics_file_path', None)
    if path is None:
        return
    # opening the experiment above deleted metrics.csv: the copy taken by reuse_log_version
    old = osp.join(osp.dirname(path), '.metrics_before_resume.csv')
    if not osp.isfile(old):
        return
    with open(old, newline='') as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = [r for r in reader if saved_epoch is None or not r.get('epoch') or
                float(r['epoch']) <= saved_epoch]
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    experiment.metrics_keys = sorted(fields)
    os.remove(old)


# Cross-validation ---------------------------------------------------------------------------
