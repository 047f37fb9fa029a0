r"""The ``pyg-grf`` command line: :class:`~lightning.pytorch.cli.LightningCLI` with the
subcommands ``fit``, ``validate``, ``test``, ``predict`` and a ``cv`` subcommand for k-fold
cross-validation.

.. code-block:: bash

    pyg-grf fit --config experiments/configs/motifs_grf.yaml    # test_after_fit: true inside
    pyg-grf test --config experiments/configs/motifs_grf.yaml --ckpt_path PATH/last.ckpt
    pyg-grf cv --config experiments/configs/mutag_grf_cv.yaml [--folds 0,1,2] [--out DIR]
    pyg-grf plot runs/motifs_grf    # learning curves PNG of the newest run (fit writes it too)

Configs name the task and the data module by ``class_path`` (e.g.
:class:`~pyg_grf.lightning.tasks.GraphLevelTask` and
:class:`~pyg_grf.lightning.datamodules.SyntheticDataModule`), and the model inside the task by
``class_path`` too, so every key is checked against the signatures before anything runs: a wrong
key or a value of the wrong type stops with an error that names it.

A config may name only the classes of the allow-lists in :mod:`pyg_grf.lightning.specs`
(``MODEL_CLASS_PATHS``, ``CONFIG_CLASS_PATHS``, and those registered with
``register_model_class`` / ``register_config_class``, or named in
``$PYG_GRF_TRUSTED_CLASSES``): building any class a config names would let a config run code
(``torch_geometric.nn.Sequential`` evaluates strings). jsonargparse imports no other dotted name
from a config or the command line (:func:`config_import_policy`), and the parsed config is
checked again before anything is built (:func:`~pyg_grf.lightning.specs.check_config_class_paths`).
``--ckpt_path`` takes local files (and ``last``, ``best``, ``hpc``) only
(:func:`check_local_ckpt_path`).

Defaults: seed 0, the logger Lightning picks (TensorBoard if installed, else CSV), a
:class:`~pyg_grf.lightning.callbacks.AtomicModelCheckpoint` that rewrites ``last.ckpt`` after every
epoch, atomically (configure it under
``checkpoint:``, e.g. ``monitor: val/acc``, ``mode: max`` to also keep the best), the progress
bar, gradient clipping at norm 2.0 (SAMSA paper, App. B), ``test_after_fit: false`` (set it to
test the best checkpoint right after ``fit``, in the same process) and ``plot: true`` (write
``learning_curves.png`` into the run's log folder at the end of ``fit``, see
:mod:`pyg_grf.lightning.plot`).

The command keeps its output to what concerns the run: Lightning's tips and notices about other
packages (the litlogger tip, the tensorboardX notice, the stepping-batches notice), a
deprecation warning that Lightning triggers inside torch and torch's "sparse CSR is in beta"
notice are dropped (:func:`quiet_logs`), and
``cv`` prints each repeated Lightning message (device lines, model summary) once.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import os.path as osp
import logging
import re
import sys
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from pyg_grf.lightning.callbacks import (AtomicModelCheckpoint, EpochMetricsLog,
                                        LearningCurvePlot, MallocTrim)
from pyg_grf.lightning.checkpoints import (  # noqa: F401 (public names of this module)
    best_checkpoint_of, check_local_ckpt_path, check_local_dirs, find_last_checkpoint,
    resolve_ckpt_path,
    reuse_log_version)
from pyg_grf.lightning.specs import allowed_config_class_paths, check_config_class_paths

# Imported so that short class names (``class_path: GraphLevelTask``) resolve too.
from pyg_grf.lightning import datamodules as _datamodules  # noqa: F401
from pyg_grf.lightning import tasks as _tasks  # noqa: F401
from pyg_grf.utils import malloc_tuned, tune_malloc

TRAINER_DEFAULTS: Dict[str, Any] = {
    'gradient_clip_val': 2.0,
    'gradient_clip_algorithm': 'norm',
}


CV_EPILOG = ('Two more subcommands: `pyg-grf cv --config CONFIG [--folds 0,1] [--out DIR]` fits '
             'and tests every fold of a TUDataModule config and writes a mean ± std table '
             '(`pyg-grf cv --help`); `pyg-grf plot RUN_DIR` writes the learning curves of a run '
             '(or the per-fold results of a cv run) as a PNG (`pyg-grf plot --help`).')

#: Lightning log messages that ``pyg-grf`` drops (regular expressions): tips about other
#: packages, and a notice about how the learning-rate schedule learns its length.
FOREIGN_MESSAGES = (
    r'^💡 Tip: .*litlogger',
    r'^Loading `train_dataloader` to estimate number of stepping batches',
)
#: Warnings that ``pyg-grf`` drops (regular expressions on the message): the notice that
#: Lightning falls back to its CSV logger without tensorboard, a deprecation inside Lightning's
#: use of torch's pytree utilities, and torch's notice that sparse CSR support is in beta (the
#: GKAT and GRF sparse products use it on purpose).
FOREIGN_WARNINGS = (
    r'Starting from v1\.9\.0, `tensorboardX` has been removed',
    r'`isinstance\(treespec, LeafSpec\)` is deprecated',
    r'Sparse CSR tensor support is in beta state',
)


class _DropMessages(logging.Filter):
    r"""Drops log records below WARNING that match a pattern, and (``once=True``) any record
    below WARNING whose text was already let through."""

    def __init__(self, patterns: Sequence[str], once: bool = False):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]
        self.once = once
        self.seen: set = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        message = record.getMessage()
        if any(p.search(message) for p in self.patterns):
            return False
        if self.once:
            if message in self.seen:
                return False
            self.seen.add(message)
        return True


def _lightning_handlers() -> List[logging.Handler]:
    names = [name for name in list(logging.root.manager.loggerDict)
             if name.split('.')[0] in ('lightning', 'lightning_fabric', 'pytorch_lightning')]
    handlers = []
    for name in names:
        for handler in getattr(logging.getLogger(name), 'handlers', []):
            if handler not in handlers:
                handlers.append(handler)
    return handlers


@contextlib.contextmanager
def quiet_logs(once: bool = False) -> Iterator[None]:
    r"""Inside the block, Lightning's log messages in :data:`FOREIGN_MESSAGES` and the
    warnings in :data:`FOREIGN_WARNINGS` are dropped; with :obj:`once`, every other Lightning
    message below WARNING is printed only the first time (for ``cv``: one model summary, one
    set of device lines). Used by the ``pyg-grf`` command only; importing this module changes
    nothing."""
    handlers = _lightning_handlers()
    drop = _DropMessages(FOREIGN_MESSAGES, once=once)
    for handler in handlers:
        handler.addFilter(drop)
    try:
        with warnings.catch_warnings():
            for pattern in FOREIGN_WARNINGS:
                warnings.filterwarnings('ignore', message=pattern)
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


# What configs may name ------------------------------------------------------------------------

#: Extra classes the ``pyg-grf`` command may build from a config: comma-separated dotted names,
#: each trusting itself and everything under it (``mypackage`` trusts all of ``mypackage``).
TRUSTED_CLASSES_ENV = 'PYG_GRF_TRUSTED_CLASSES'

_JSONARGPARSE_HINT = ('Add the import path to import_path_allowlist in set_parsing_settings to '
                      'allow it.')
_REGISTER_HINT = ('pyg-grf builds only the classes of the allow-lists in pyg_grf.lightning.specs '
                  '(MODEL_CLASS_PATHS, CONFIG_CLASS_PATHS); register a class of your own with '
                  'register_model_class / register_config_class before the CLI parses, or name '
                  f'it (or its package) in ${TRUSTED_CLASSES_ENV}.')


def trusted_classes_from_env() -> Tuple[str, ...]:
    r"""The dotted names in ``$PYG_GRF_TRUSTED_CLASSES`` (comma-separated)."""
    raw = os.environ.get(TRUSTED_CLASSES_ENV, '')
    entries = tuple(entry.strip() for entry in raw.split(',') if entry.strip())
    bad = [entry for entry in entries if not all(part.isidentifier()
                                                 for part in entry.split('.'))]
    if bad:
        raise ValueError(f"${TRUSTED_CLASSES_ENV} must hold comma-separated dotted names such as "
                         f"'mypackage.MyDataModule', got {', '.join(map(repr, bad))}")
    return entries


@contextlib.contextmanager
def config_import_policy(allowed: Iterable[str]) -> Iterator[None]:
    r"""Inside the block, jsonargparse imports a dotted name that a config or the command line
    gives (a ``class_path``, a function for a ``Callable`` argument) only if it is in
    :obj:`allowed` or under an entry of it; anything else is refused *before* it is imported,
    with a parser error that names it. jsonargparse's own denials (``os``, ``subprocess``, ...)
    stay. Uses jsonargparse's import path policy (4.5x); with older versions this does nothing,
    and :func:`~pyg_grf.lightning.specs.check_config_class_paths` (run on the parsed config
    before anything is built) is the only check."""
    try:
        from jsonargparse import _common
        settings = _common.parsing_settings
        saved = (settings['import_path_verdicts'], settings['import_paths_enforced'])
    except (ImportError, AttributeError, KeyError):  # pragma: no cover - older jsonargparse
        yield
        return
    verdicts = {entry: False for entry, allow in saved[0].items() if not allow}
    verdicts['*'] = False  # everything not allowed below
    for entry in allowed:
        verdicts.setdefault(entry, True)
    settings['import_path_verdicts'] = verdicts
    settings['import_paths_enforced'] = True
    try:
        yield
    finally:
        settings['import_path_verdicts'], settings['import_paths_enforced'] = saved


class _GRFArgumentParser(LightningArgumentParser):
    r"""The parser of ``pyg-grf``: jsonargparse's hint on refused imports names our
    allow-lists and how to extend them."""

    def error(self, message: str, *args: Any, **kwargs: Any):
        message = re.sub(r"Importing '([\w.]+)' is not allowed, denied by the '\*' entry of "
                         r"the import path denylist\.",
                         r"Refusing to import '\1': it is not in pyg-grf's allow-lists.", message)
        return super().error(message.replace(_JSONARGPARSE_HINT, _REGISTER_HINT), *args, **kwargs)


class GRFLightningCLI(LightningCLI):
    r""":class:`LightningCLI` with this package's defaults (see the module docstring).

    Only the classes of the allow-lists in :mod:`pyg_grf.lightning.specs` (and those in
    ``$PYG_GRF_TRUSTED_CLASSES``) are imported and built from the config and the command line;
    anything else stops the command before it is built, with a parser error or an
    :class:`~pyg_grf.lightning.specs.UntrustedClassError` that names it."""

    def __init__(self, args: Optional[Sequence[str]] = None, run: bool = True, **kwargs: Any):
        trainer_defaults = dict(TRAINER_DEFAULTS)
        trainer_defaults.update(kwargs.pop('trainer_defaults', None) or {})
        kwargs.setdefault('seed_everything_default', 0)
        kwargs.setdefault('save_config_kwargs', {'overwrite': True})
        kwargs.setdefault('parser_kwargs', {'epilog': CV_EPILOG})
        if 'parser_class' in inspect.signature(LightningCLI.__init__).parameters:
            kwargs.setdefault('parser_class', _GRFArgumentParser)
        self.trusted_classes = trusted_classes_from_env()
        with config_import_policy([*allowed_config_class_paths(), *self.trusted_classes]):
            super().__init__(pl.LightningModule, pl.LightningDataModule, subclass_mode_model=True,
                             subclass_mode_data=True, trainer_defaults=trainer_defaults,
                             args=None if args is None else list(args), run=run, **kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get('subcommand')
        if subcommand:  # refused before anything reads it (Lightning's CLI does next)
            check_local_ckpt_path(self.config[subcommand].get('ckpt_path'))
            check_local_dirs(self.config[subcommand])

    def before_instantiate_classes(self) -> None:
        # The parsed config (with what LightningCLI took from --ckpt_path's hyperparameters):
        # every class it names must be allowed before anything is built.
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_config_class_paths(config.as_dict(), '', self.trusted_classes)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(AtomicModelCheckpoint, 'checkpoint')
        parser.set_defaults({'checkpoint.save_last': True})
        parser.add_argument('--test_after_fit', type=bool, default=False,
                            help='after `fit`, run `test` with the best checkpoint (when '
                            'checkpoint.monitor is set) or the last weights')
        parser.add_argument('--plot', type=bool, default=True,
                            help='at the end of `fit`, write learning_curves.png (loss and the '
                            'monitored metric, train and val) into the log folder (needs '
                            'matplotlib)')

    def _instantiate_trainer(self, config: Dict[str, Any], callbacks: List[Callback]):
        # Per-epoch metrics that stay consistent with the checkpoint a run resumes from, and
        # their plot at the end of `fit`.
        extra: List[Callback] = [EpochMetricsLog()]
        if self._get(self.config, 'plot', True):
            extra.append(LearningCurvePlot())
        if malloc_tuned():  # keep the resident memory of the tuned allocator bounded
            extra.append(MallocTrim())
        return super()._instantiate_trainer(config, list(callbacks) + extra)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> Dict[str, Any]:
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        ckpt_path = kwargs.get('ckpt_path')
        if ckpt_path is not None:
            kwargs['ckpt_path'] = resolve_ckpt_path(self.trainer, ckpt_path, subcommand)
            if 'weights_only' in kwargs and kwargs['weights_only'] is None:
                kwargs['weights_only'] = True  # tensors and plain data only: no code
            if subcommand == 'fit':
                reuse_log_version(self.trainer, kwargs['ckpt_path'])
        return kwargs

    def after_fit(self) -> None:
        if not self.config[self.subcommand].get('test_after_fit'):
            return
        ckpt = self.trainer.checkpoint_callback
        best = (ckpt is not None and ckpt.monitor and ckpt.best_model_path
                and not self.trainer.fast_dev_run)
        self.trainer.test(self.model, datamodule=self.datamodule,
                          ckpt_path='best' if best else None)


# Resuming and testing from saved runs ------------------------------------------------------


def _fmt(values: List[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return 'n/a'
    mean = sum(values) / len(values)
    std = (sum((v - mean) * (v - mean) for v in values) / len(values))**0.5  # inf, no raise
    return f'{mean:.4f} ± {std:.4f}'


def cv_table(results: List[Dict[str, Any]], title: str = '') -> str:
    r"""A markdown table: one row per fold, then the mean ± std (population std) of every
    metric over the folds."""
    keys = sorted({k for r in results for k in r if k != 'fold'})
    head = '| fold | ' + ' | '.join(keys) + ' |'
    rule = '|---|' + '---|' * len(keys)
    rows = [f"| {r['fold']} | " + ' | '.join(
        f'{r[k]:.4f}' if isinstance(r.get(k), float) else str(r.get(k, '')) for k in keys) + ' |'
        for r in results]
    summary = '| mean ± std | ' + ' | '.join(
        _fmt([r[k] for r in results if isinstance(r.get(k), float)]) for k in keys) + ' |'
    lines = ([f'### {title}', ''] if title else []) + [head, rule, *rows, summary]
    return '\n'.join(lines) + '\n'


def run_cv(argv: Sequence[str]) -> List[Dict[str, Any]]:
    r"""``pyg-grf cv``: fit and test a fresh model on every fold of a
    :class:`~pyg_grf.lightning.datamodules.TUDataModule` config, then write ``cv_results.md``
    and ``cv_results.json`` (per-fold test metrics and mean ± std) to the run directory and print
    the table. Other arguments (``--config``, ``--trainer.max_epochs=...``) go to the
    :class:`LightningCLI` of every fold."""
    parser = argparse.ArgumentParser(
        prog='pyg-grf cv', description='k-fold cross-validation: fit + test every fold with a '
        'fresh model; prints and saves a mean ± std table. Other options are passed to '
        '`pyg-grf fit` for every fold.')
    parser.add_argument('--folds', default=None,
                        help='comma-separated folds to run (default: all)')
    parser.add_argument('--out', default=None,
                        help='run directory (default: <trainer.default_root_dir or .>/cv/'
                        '<config name>)')
    parser.add_argument('--plot', default='true', choices=('true', 'false'),
                        help='write cv_results.png (per-fold results) and every fold\'s '
                        'learning_curves.png (default: true; needs matplotlib)')
    opts, rest = parser.parse_known_args(list(argv))
    rest = [*rest, f'--plot={opts.plot}']
    with warnings.catch_warnings():
        # The folds' CLIs get their arguments from here, not from sys.argv.
        warnings.filterwarnings('ignore', message="LightningCLI's args parameter")
        return _run_folds(opts, rest)


def _run_folds(opts: argparse.Namespace, rest: List[str]) -> List[Dict[str, Any]]:
    # Instantiate once without running to read the fold count and the run directory.
    probe = GRFLightningCLI(args=rest, run=False)
    num_folds = getattr(probe.datamodule, 'num_folds', None)
    if num_folds is None or not hasattr(probe.datamodule, 'fold'):
        raise ValueError(f"`pyg-grf cv` needs a data module with 'fold' and 'num_folds' (e.g. "
                         f"TUDataModule), got {type(probe.datamodule).__name__}")
    folds = (list(range(num_folds)) if opts.folds is None else
             [int(f) for f in opts.folds.split(',') if f.strip()])
    bad = [f for f in folds if not 0 <= f < num_folds]
    if bad:
        raise ValueError(f"--folds must lie in [0, {num_folds}), got {bad}")
    out = opts.out
    if out is None:
        config_name = 'run'
        for i, arg in enumerate(rest):
            if arg.startswith('--config'):
                path = arg.split('=', 1)[1] if '=' in arg else rest[i + 1]
                config_name = osp.splitext(osp.basename(path))[0]
        out = osp.join(probe.trainer.default_root_dir, 'cv', config_name)
    del probe
    os.makedirs(out, exist_ok=True)

    results: List[Dict[str, Any]] = []
    for fold in folds:
        cli = GRFLightningCLI(args=[*rest, f'--data.init_args.fold={fold}',
                                    f'--trainer.default_root_dir={osp.join(out, f"fold{fold}")}'],
                              run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        ckpt = cli.trainer.checkpoint_callback
        ckpt_path = 'best' if ckpt is not None and ckpt.monitor and ckpt.best_model_path else None
        metrics = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path,
                                   verbose=False)[0]
        row: Dict[str, Any] = {'fold': fold}
        row.update({k: float(v) for k, v in metrics.items()})
        if ckpt is not None and ckpt.monitor and ckpt.best_model_score is not None:
            row[f'best {ckpt.monitor}'] = float(ckpt.best_model_score)
        results.append(row)
        print(f'fold {fold} ({len(results)}/{len(folds)}): ' + ', '.join(
            f'{k} {v:.4f}' for k, v in row.items() if k != 'fold'), flush=True)
        # Rewrite after every fold, so a stopped run keeps what it has.
        table = cv_table(results, title=f'{len(results)}/{len(folds)} folds')
        with open(osp.join(out, 'cv_results.md'), 'w') as f:
            f.write(table)
        with open(osp.join(out, 'cv_results.json'), 'w') as f:
            json.dump({'folds': results}, f, indent=2)
    print(table)
    print(f'written to {osp.join(out, "cv_results.md")}')
    if opts.plot == 'true':
        from pyg_grf.lightning.plot import has_matplotlib, plot_cv_results
        if has_matplotlib():
            print(f'per-fold results plotted in {plot_cv_results(out)[0]}')
    return results


def run_plot(argv: Sequence[str]) -> Dict[str, Any]:
    r"""``pyg-grf plot RUN_DIR``: the learning curves of the newest run under ``RUN_DIR`` (loss
    and the monitored metric, train and val) or, for a ``pyg-grf cv`` run folder, the per-fold
    results, as a PNG (:func:`pyg_grf.lightning.plot.plot_run`). Errors (no run there, no
    matplotlib) exit with status 2 and one line that says what was expected."""
    from pyg_grf.lightning.plot import plot_run
    parser = argparse.ArgumentParser(
        prog='pyg-grf plot', description='Plot a run as a PNG: the learning curves (loss and '
        'the monitored metric, train and val, per epoch) of the newest run under RUN_DIR, or '
        'the per-fold results of a `pyg-grf cv` run folder.')
    parser.add_argument('run_dir', metavar='RUN_DIR',
                        help="a run's default_root_dir (e.g. runs/motifs_grf), one of its "
                        "version_<N> log folders, or a cv run folder (with cv_results.json)")
    parser.add_argument('--out', default=None, help='the PNG file (default: learning_curves.png '
                        'in the log folder, cv_results.png in a cv folder)')
    parser.add_argument('--monitor', default=None, help='the metric to plot beside the loss, '
                        'e.g. val/acc (default: checkpoint.monitor of the run\'s config)')
    opts = parser.parse_args(list(argv))
    try:
        result = plot_run(opts.run_dir, opts.out, opts.monitor)
    except (FileNotFoundError, ValueError, ImportError, OverflowError) as exc:
        parser.error(str(exc))
    panels = ', '.join(result['data'])
    print(f"{result['path']} ({'per-fold results' if result['kind'] == 'cv' else 'panels'}: "
          f"{panels})")
    return result


def main(args: Optional[Sequence[str]] = None):
    r"""Entry point of the ``pyg-grf`` console script. Keeps freed tensor memory in the process
    (:func:`pyg_grf.utils.tune_malloc`; ``PYG_GRF_MALLOC=default`` turns that off) and the log
    free of other packages' tips and notices (:func:`quiet_logs`)."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] == 'plot':
        return run_plot(argv[1:])
    tune_malloc()
    with quiet_logs(once=bool(argv) and argv[0] == 'cv'):
        if argv and argv[0] == 'cv':
            return run_cv(argv[1:])
        return GRFLightningCLI(args=args)  # None: LightningCLI reads sys.argv itself


def console_main() -> int:
    r"""The ``pyg-grf`` console script: runs :func:`main` and exits with status 0 on success
    (``main`` returns the CLI object or the CV results, which the console-script wrapper would
    print and turn into exit status 1)."""
    main()
    return 0


if __name__ == '__main__':  # pragma: no cover
    sys.exit(console_main())
