r"""Checkpoint paths and run folders of the ``pyg-grf`` CLI: the newest / best checkpoint of a
run, the refusal of remote or chained checkpoint paths before any I/O
(:func:`check_local_ckpt_path`), ``--ckpt_path last|best`` resolution, and resuming into the
run's own log version without losing its earlier metrics (:func:`reuse_log_version`)."""
from __future__ import annotations

import glob
import math
import os
import os.path as osp
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from pyg_grf.lightning.files import (
    atomic_write,
    check_run_folder,
    read_text_nofollow,
    version_number,
)


def _log_root(trainer: pl.Trainer) -> str:
    logger = trainer.logger
    if logger is not None and getattr(logger, 'save_dir', None) is not None:
        name = getattr(logger, 'name', None) or ''
        return osp.join(logger.save_dir, name)
    return osp.join(trainer.default_root_dir, 'lightning_logs')


def find_last_checkpoint(trainer: pl.Trainer) -> Optional[str]:
    r"""The ``last.ckpt`` of the newest run (highest ``version_<N>``) under the trainer's log
    folder, or of the checkpoint callback's fixed ``dirpath``; :obj:`None` if there is none."""
    ckpt = trainer.checkpoint_callback
    if ckpt is not None and ckpt.dirpath is not None:
        path = osp.join(ckpt.dirpath, 'last.ckpt')
        return path if osp.isfile(path) else None
    found = glob.glob(osp.join(_log_root(trainer), 'version_*', 'checkpoints', 'last.ckpt'))
    return max(found, key=lambda p: version_number(osp.dirname(osp.dirname(p))), default=None)


def best_checkpoint_of(last: str) -> Optional[str]:
    r"""The best checkpoint recorded in the checkpoint :obj:`last` by a monitored
    :class:`ModelCheckpoint` (read with ``weights_only=True``), or :obj:`None`."""
    state = torch.load(last, map_location='cpu', weights_only=True)
    callbacks = state.get('callbacks') if isinstance(state, dict) else None
    for value in callbacks.values() if isinstance(callbacks, dict) else ():
        path = value.get('best_model_path') if isinstance(value, dict) else None
        if path and isinstance(path, str) and value.get('monitor') and osp.isfile(path):
            return path
    return None


class CommandLineError(ValueError, SystemExit):
    r"""A bad input of the ``pyg-grf`` command found before it runs (a checkpoint file, a run
    folder, a config): the command has printed ``error: <message>`` (one line, as the parser
    does for a wrong key) and exits with status 2. Python callers of
    :func:`~pyg_grf.lightning.cli.main` can catch it as the :class:`ValueError` it also is."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


class CheckpointError(ValueError):
    r"""A ``--ckpt_path`` file that is not a Lightning checkpoint of the expected form."""


class CheckpointNotFoundError(FileNotFoundError):
    r"""``--ckpt_path best`` without a best checkpoint to test."""


#: Entries of a Lightning checkpoint that ``pyg-grf`` reads, with their types; those of the
#: second dict only when resuming ``fit``.
_CKPT_ENTRIES = {'pytorch-lightning_version': str, 'state_dict': dict}
_CKPT_FIT_ENTRIES = {'epoch': int, 'global_step': int, 'optimizer_states': list,
                     'lr_schedulers': list, 'loops': dict}
_CKPT_OPTIONAL = {'hyper_parameters': dict, 'callbacks': dict, 'datamodule_hyper_parameters': dict}


def check_checkpoint_file(path: str, resume: bool = False) -> None:
    r"""Refuses a local ``--ckpt_path`` file that Lightning would fail on deep inside (a
    ``KeyError`` or ``TypeError`` far from the cause) with a :class:`CheckpointError` that says
    what was expected and what came: it must load with ``torch.load(weights_only=True)`` and
    hold the entries above, each of its type (those to resume ``fit`` if :obj:`resume`)."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever a crafted file makes the unpickler say
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''
        raise CheckpointError(f"--ckpt_path '{path}' is not a checkpoint torch.load can read "
                              f"with weights_only=True ({type(exc).__name__}"
                              f"{': ' + detail if detail else ''}); expected a file saved by "
                              f"`pyg-grf fit` (a Lightning checkpoint)") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"--ckpt_path '{path}' must hold a Lightning checkpoint (a dict), "
                              f"got {type(ckpt).__name__}")
    needed = dict(_CKPT_ENTRIES, **(_CKPT_FIT_ENTRIES if resume else {}))
    missing = [key for key in needed if key not in ckpt]
    if missing:
        what = (' to resume `fit` from (saved with save_weights_only?)'
                if resume and set(missing) <= set(_CKPT_FIT_ENTRIES) else '')
        raise CheckpointError(f"--ckpt_path '{path}' is not a Lightning checkpoint{what}: it "
                              f"lacks {missing} (it has {sorted(map(str, ckpt))[:8]}); expected "
                              f"a file saved by `pyg-grf fit`")
    for key, kind in {**needed, **_CKPT_OPTIONAL}.items():
        value = ckpt.get(key)
        if key in ckpt and not (isinstance(value, kind) and not isinstance(value, bool)):
            raise CheckpointError(f"--ckpt_path '{path}': '{key}' must be a {kind.__name__}, "
                                  f"got {type(value).__name__} {value!r:.60}")
    bad = [k for k in ckpt['state_dict'] if not isinstance(k, str)]
    if bad:
        raise CheckpointError(f"--ckpt_path '{path}': the state_dict keys must be parameter "
                              f"names (str), got {bad[:3]!r:.60}")


def check_local_ckpt_path(ckpt_path: Any) -> None:
    r"""Refuses (:class:`ValueError`) a ``--ckpt_path`` that fsspec, through which Lightning
    reads checkpoints, would not read as a local file: a URL (``scheme://`` anywhere), a
    chained URL (``::`` anywhere), a ``data:`` URL, or Lightning's model ``registry``. Lightning
    reads a download without ``weights_only``, so it could run code. Local paths and the
    keywords ``last``, ``best`` and ``hpc`` pass."""
    if ckpt_path is None:
        return
    if not isinstance(ckpt_path, (str, os.PathLike)):
        raise ValueError(f"--ckpt_path must be the path of a local checkpoint file, got "
                         f"{type(ckpt_path).__name__} {ckpt_path!r}")
    text = os.fsdecode(os.fspath(ckpt_path))
    stripped = text.strip().lower()
    if _is_remote(stripped) or stripped == 'registry' or stripped.startswith('registry:'):
        raise ValueError(f"--ckpt_path {text!r}: remote checkpoints are refused (a URL, a "
                         f"chained fsspec URL with '::', a 'data:' URL or Lightning's model "
                         f"registry: Lightning unpickles downloads without weights_only, which "
                         f"can run code); download the file, check it, and pass the local path "
                         f"(a local file whose name holds '::' or '://' must be renamed)")


def _is_remote(text: str) -> bool:
    # what fsspec would not read as a local path: a URL, a chained URL, a data: URL
    text = text.strip()
    return '://' in text or '::' in text or text.lower().startswith('data:')


#: Keys of a logger's or a callback's ``init_args`` that name a folder or file it writes.
PATH_KEYS = ('save_dir', 'dirpath', 'root_dir', 'log_dir', 'default_root_dir', 'dir', 'filepath')


def check_local_dirs(config: Any) -> None:
    r"""Refuses a remote folder wherever a config names one: ``trainer.default_root_dir``,
    ``checkpoint.dirpath`` and the :data:`PATH_KEYS` of the loggers and callbacks. Lightning
    reads and writes through fsspec: a URL (``memory://``, ``s3://``, a chained
    ``simplecache::...``) would have ``--ckpt_path last`` / ``best`` list and fetch files from
    elsewhere, or the run written outside its folder.

    Raises:
        ValueError: naming the option and its value.
    """
    if hasattr(config, 'as_dict'):
        config = config.as_dict()

    def get(obj: Any, *keys: str) -> Any:
        for key in keys:
            if obj is None:
                return None
            obj = obj.get(key) if hasattr(obj, 'get') else getattr(obj, key, None)
        return obj

    def check(option: str, value: Any) -> None:
        if isinstance(value, (str, os.PathLike)) and _is_remote(os.fsdecode(os.fspath(value))):
            raise ValueError(f"--{option} {value!r}: run folders must be local (a URL "
                             f"or chained fsspec URL would have checkpoints listed and read "
                             f"from elsewhere, and the run written outside its folder)")

    for keys in (('trainer', 'default_root_dir'), ('checkpoint', 'dirpath')):
        check('.'.join(keys), get(config, *keys))
    for section in ('logger', 'callbacks'):
        specs = get(config, 'trainer', section)
        specs = specs if isinstance(specs, (list, tuple)) else [specs]
        for i, spec in enumerate(specs):
            if not isinstance(spec, dict):
                continue  # True / False / None, or an object built in Python
            args = spec.get('init_args', spec)
            where = f"trainer.{section}{f'[{i}]' if len(specs) > 1 else ''}.init_args"
            for key in PATH_KEYS:
                check(f'{where}.{key}', args.get(key) if isinstance(args, dict) else None)


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
            raise CheckpointNotFoundError(
                f"--ckpt_path best: no best checkpoint found (looked in '{where}'). 'best' needs "
                f"a finished `pyg-grf fit` with the same config and `checkpoint.monitor` set "
                f"(e.g. monitor: val/acc, mode: max); or pass a checkpoint file.")
        return best
    return ckpt_path


def reuse_log_version(trainer: pl.Trainer, ckpt_path: Optional[str]) -> None:
    r"""When resuming from ``<log root>/version_<N>/checkpoints/*.ckpt``, makes the loggers write
    to ``version_<N>`` again, so the checkpoints (and the best-model tracking restored from the
    checkpoint) stay in one folder instead of restarting in a new version. The rows of
    ``metrics.csv`` up to the checkpoint are kept (:func:`_keep_csv_rows`).

    Raises:
        RunFolderError: the version folder holds a symbolic link, or is reached through one.
    """
    if not ckpt_path or ckpt_path in ('last', 'best', 'hpc') or not osp.isfile(ckpt_path):
        return
    ckpt_dir = osp.dirname(osp.abspath(ckpt_path))
    run_dir, log_root = osp.dirname(ckpt_dir), _log_root(trainer)
    version = version_number(run_dir)
    if osp.basename(ckpt_dir) != 'checkpoints' or version < 0 \
            or osp.realpath(osp.dirname(run_dir)) != osp.realpath(log_root):
        return
    check_run_folder(run_dir, osp.dirname(log_root), names=None)
    text = read_text_nofollow(osp.join(run_dir, 'metrics.csv'))
    if text is not None:  # the resumed CSVLogger deletes it on opening: keep a copy
        with atomic_write(osp.join(run_dir, METRICS_BACKUP), encoding='utf-8',
                          errors='surrogateescape', newline='') as f:
            f.write(text)
    try:  # the epoch the checkpoint was saved at: rows logged after it are redone
        ckpt = torch.load(ckpt_path, map_location='cpu', weights_only=True)
        # (saved before the first step, AtomicModelCheckpoint's: every epoch is redone)
        saved_epoch = int(ckpt.get('epoch', -1)) if ckpt.get('global_step', 1) else -1
        del ckpt
    except Exception:  # noqa: BLE001 - Lightning reports a bad checkpoint itself
        saved_epoch = None
    for logger in trainer.loggers:
        if hasattr(logger, '_version') and getattr(logger, '_version', None) is None:
            logger._version = version
            if hasattr(logger, '_experiment'):
                logger._experiment = None
            _keep_csv_rows(logger, saved_epoch)


#: The copy of ``metrics.csv`` that a resume keeps until the rows are written back.
METRICS_BACKUP = '.metrics_before_resume.csv'


def _keep_csv_rows(logger: Any, saved_epoch: Optional[int]) -> None:
    r"""A resumed CSVLogger deletes its ``metrics.csv`` when it opens the version folder again:
    write back the rows of the epochs up to the checkpoint from the copy
    :data:`METRICS_BACKUP` (later ones are logged again by the resumed run), byte for byte.
    Damaged rows are skipped and reported in one warning; without a usable header nothing is
    written back and the copy is kept."""
    import csv
    experiment = getattr(logger, 'experiment', None)
    path = getattr(experiment, 'metrics_file_path', None)
    if path is None:
        return
    # opening the experiment above deleted metrics.csv: the copy taken by reuse_log_version
    old = osp.join(osp.dirname(path), METRICS_BACKUP)
    text = read_text_nofollow(old)
    if text is None:
        return
    lines = text.split('\n')
    try:
        fields = next(csv.reader(lines[:1])) if lines and lines[0].strip() else []
    except csv.Error:
        fields = []
    if not fields or len(set(fields)) != len(fields) or 'epoch' not in fields:
        rank_zero_warn(f"'{old}': its header is not a CSVLogger's (got {lines[0][:80]!r}); "
                       f"the resumed run starts a new metrics.csv and this copy of the old one "
                       f"is kept")
        return
    at = fields.index('epoch')
    kept, damaged = [lines[0]], []
    for lineno, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        try:
            row = next(csv.reader([line]))
            epoch = float(row[at]) if row[at].strip() else None
            ok = len(row) == len(fields) and (epoch is None or math.isfinite(epoch))
        except (csv.Error, ValueError, IndexError):
            ok, epoch = False, None
        if not ok:
            damaged.append(lineno)
        elif saved_epoch is None or epoch is None or epoch <= saved_epoch:
            kept.append(line)
    with atomic_write(path, encoding='utf-8', errors='surrogateescape', newline='') as f:
        f.write('\n'.join(kept) + '\n')
    experiment.metrics_keys = sorted(fields)
    if damaged:
        rank_zero_warn(f"'{path}': skipped {len(damaged)} damaged row(s) of the run being "
                       f"resumed (line(s) {', '.join(map(str, damaged[:10]))}"
                       f"{', ...' if len(damaged) > 10 else ''}: not {len(fields)} "
                       f"comma-separated fields with a numeric epoch); the other rows are kept")
    os.remove(old)

