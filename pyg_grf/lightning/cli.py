r"""The ``pyg-grf`` command line: :class:`~lightning.pytorch.cli.LightningCLI` with the
subcommands ``fit``, ``validate``, ``test``, ``predict``, ``cv`` (k-fold cross-validation) and
``plot`` (:mod:`pyg_grf.lightning.plot`).

.. code-block:: bash

    pyg-grf fit --config experiments/configs/motifs_grf.yaml
    pyg-grf test --config experiments/configs/motifs_grf.yaml --ckpt_path PATH/last.ckpt
    pyg-grf cv --config experiments/configs/mutag_grf_cv.yaml [--folds 0,1,2] [--out DIR]
    pyg-grf plot runs/motifs_grf

A config may name only the classes of the allow-lists in :mod:`pyg_grf.lightning.specs` (or
those named in ``$PYG_GRF_TRUSTED_CLASSES``): jsonargparse imports no other dotted name
(:func:`config_import_policy`) and the parsed config is checked again before anything is built.
``--ckpt_path`` takes local files (and ``last``, ``best``, ``hpc``) only.

Defaults: seed 0, an :class:`~pyg_grf.lightning.callbacks.AtomicModelCheckpoint` that rewrites
``last.ckpt`` after every epoch (configure it under ``checkpoint:``), gradient clipping at norm
2.0 (SAMSA paper, App. B), ``trainer.deterministic: warn`` (the same seed gives the same
numbers on one machine), ``test_after_fit: false`` and ``plot: true``. Other packages' tips
and notices are dropped from the output (:func:`quiet_logs`). SIGTERM or Ctrl-C stops the
command within a second, and a stopped ``fit`` resumes with ``--ckpt_path last``
(:mod:`pyg_grf.lightning.signals`).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import math
import os
import os.path as osp
import re
import sys
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

# Imported so that short class names (``class_path: GraphLevelTask``) resolve too.
from pyg_grf.lightning import datamodules as _datamodules  # noqa: F401
from pyg_grf.lightning import tasks as _tasks  # noqa: F401
from pyg_grf.lightning.callbacks import (
    AtomicModelCheckpoint,
    EpochMetricsLog,
    LearningCurvePlot,
    MallocTrim,
)
from pyg_grf.lightning.checkpoints import (
    CheckpointError,
    CheckpointNotFoundError,
    CommandLineError,
    check_checkpoint_file,
    check_local_ckpt_path,
    check_local_dirs,
    resolve_ckpt_path,
    reuse_log_version,
)
from pyg_grf.lightning.files import RunFolderError, atomic_write, check_run_folder
from pyg_grf.lightning.plot import mean_std
from pyg_grf.lightning.signals import StopSignal, exit_by_signal, stop_on_signals
from pyg_grf.lightning.specs import (
    allowed_config_class_paths,
    check_config_class_paths,
    is_dotted_name,
)
from pyg_grf.utils import malloc_tuned, tune_malloc

#: ``deterministic='warn'``: torch's deterministic algorithms (fixed reduction order where torch
#: offers one; an op without one warns instead of failing, as some CUDA scatters do), so that the
#: same seed gives the same numbers run after run on one machine (docs/reliability.md says what
#: still varies across machines).
TRAINER_DEFAULTS: Dict[str, Any] = {'gradient_clip_val': 2.0, 'gradient_clip_algorithm': 'norm',
                                    'deterministic': 'warn'}
#: The subcommands that :func:`main` runs itself, beside Lightning's four.
SUBCOMMANDS = {
    'cv': 'k-fold cross-validation: fit + test every fold of a TUDataModule config with a fresh '
          'model; prints and saves a mean ± std table.',
    'plot': 'Plot a run as a PNG: the learning curves (loss and the monitored metric, train and '
            'val, per epoch) of the newest run under RUN_DIR, or the per-fold results of a '
            '`pyg-grf cv` run folder.',
}
CV_EPILOG = ('`pyg-grf cv` and `pyg-grf plot` are run by pyg-grf itself, with options of their '
             'own: `pyg-grf cv --help`, `pyg-grf plot --help`.')

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
        if any(p.search(message) for p in self.patterns) or message in self.seen:
            return False
        if self.once:
            self.seen.add(message)
        return True


def _lightning_handlers() -> List[logging.Handler]:
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.split('.')[0] in ('lightning', 'lightning_fabric', 'pytorch_lightning')]
    return list(dict.fromkeys(handler for logger in loggers for handler in logger.handlers))


@contextlib.contextmanager
def quiet_logs(once: bool = False) -> Iterator[None]:
    r"""Inside the block, Lightning's log messages in :data:`FOREIGN_MESSAGES` and the
    warnings in :data:`FOREIGN_WARNINGS` are dropped; with :obj:`once`, every other Lightning
    message below WARNING is printed only the first time (for ``cv``: one model summary, one
    set of device lines)."""
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


@contextlib.contextmanager
def package_log_lines() -> Iterator[None]:
    r"""Inside the block, this package's INFO log lines (e.g. that the GRF join is being
    compiled) are printed to stderr, unless the program has configured logging itself."""
    logger = logging.getLogger('pyg_grf')
    if logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter('%(message)s'))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


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
    bad = [entry for entry in entries if not is_dotted_name(entry)]
    if bad:
        raise ValueError(f"${TRUSTED_CLASSES_ENV} must hold comma-separated dotted names such as "
                         f"'mypackage.MyDataModule', got {', '.join(map(repr, bad))}")
    return entries


@contextlib.contextmanager
def config_import_policy(allowed: Iterable[str]) -> Iterator[None]:
    r"""Inside the block, jsonargparse imports a dotted name that a config or the command line
    gives (a ``class_path``, a ``Callable``) only if it is in :obj:`allowed` or under an entry
    of it; anything else is refused *before* it is imported. Uses jsonargparse's import path
    policy (4.5x); with older versions only
    :func:`~pyg_grf.lightning.specs.check_config_class_paths` checks."""
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


#: The most nodes a YAML document may expand to through its aliases (``*name``); a config of
#: this package has a few hundred. Documents without aliases are not limited.
MAX_YAML_NODES = 100_000


class ConfigTooLargeError(ValueError):
    r"""A YAML config (or command-line value) whose aliases expand it beyond
    :data:`MAX_YAML_NODES` nodes."""


def _expanded_yaml_nodes(text: str, limit: int) -> Tuple[int, int]:
    r"""``(nodes, expanded)``: the nodes of the YAML document :obj:`text` as written, and as
    expanded through its aliases (counted once per node, each shared node by its size, so the
    count is linear in the file; stops above :obj:`limit`)."""
    import yaml
    from jsonargparse._loaders_dumpers import get_yaml_default_loader
    loader = get_yaml_default_loader()(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    sizes: Dict[int, int] = {}
    stack = [(root, False)] if root is not None else []
    while stack:  # post-order, iteratively (nesting can be deep)
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), limit + 1)
    return len(sizes), sizes.get(id(root), 0)


@contextlib.contextmanager
def bounded_yaml_loader(max_nodes: int = MAX_YAML_NODES) -> Iterator[None]:
    r"""Inside the block, jsonargparse's YAML loader refuses a document whose aliases expand it
    beyond :obj:`max_nodes` nodes (:class:`ConfigTooLargeError`) before jsonargparse walks it:
    ten nested aliases of ten items each expand a 2 KB file to 10^10 leaves (hours)."""
    from jsonargparse import _loaders_dumpers as loaders
    mode = 'yaml'
    saved = (loaders.loaders[mode], loaders.loader_exceptions.get(mode, ()), loaders.yaml_load)

    def check(stream):
        if isinstance(stream, str) and ('*' in stream or '<<' in stream):  # aliases only
            import yaml
            try:
                nodes, expanded = _expanded_yaml_nodes(stream, max_nodes)
            except yaml.YAMLError:
                nodes = expanded = 0  # not YAML: the loader itself says so
            if expanded > max_nodes and expanded > nodes:
                raise ConfigTooLargeError(
                    f"a YAML document of {len(stream)} characters whose aliases (*name) expand "
                    f"it to more than {max_nodes} nodes (it has {nodes} as written) is "
                    f"refused; write the values out or use fewer nested aliases")
        return stream

    # config files and values go through `loaders[mode]`; the value of a typed argument (e.g.
    # `--trainer.max_epochs=[&a ...]`) through the module's `yaml_load` (jsonargparse then puts
    # the whole expanded value into its error message: minutes for 10^8 leaves)
    loaders.loaders[mode] = lambda stream: saved[0](check(stream))
    loaders.loader_exceptions[mode] = (*saved[1], ConfigTooLargeError)
    loaders.yaml_load = lambda stream: saved[2](check(stream))
    try:
        yield
    finally:
        loaders.loaders[mode] = saved[0]
        loaders.loader_exceptions[mode] = saved[1]
        loaders.yaml_load = saved[2]


def _headline(message: str) -> str:
    r"""The line of a jsonargparse error that says what is wrong: for a value that matches no
    type of a union (``Does not validate against any of the Union subtypes``) the innermost
    ``Parser key "...": <what>``, else the first line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return message
    keys = [i for i, line in enumerate(lines) if line.startswith('Parser key')]
    if len(keys) > 1 or (keys and 'Union subtypes' in message):
        i = keys[-1]
        what = lines[i + 1] if i + 1 < len(lines) and lines[i].endswith(':') else ''
        return f'{lines[i]} {what}'.strip()
    return lines[0] if len(lines[0]) > 12 or len(lines) == 1 else f'{lines[0]} {lines[1]}'


class _GRFArgumentParser(LightningArgumentParser):
    r"""The parser of ``pyg-grf``: jsonargparse's hint on refused imports names our
    allow-lists and how to extend them."""

    def error(self, message: str, ex: Optional[Exception] = None):
        message = re.sub(r"Importing '([\w.]+)' is not allowed, denied by the '\*' entry of "
                         r"the import path denylist\.",
                         r"Refusing to import '\1': it is not in pyg-grf's allow-lists.", message)
        message = message.replace(_JSONARGPARSE_HINT, _REGISTER_HINT)
        try:
            from jsonargparse._common import debug_mode_active
            debug = debug_mode_active()
        except ImportError:  # pragma: no cover - other jsonargparse versions
            debug = False
        if not self.exit_on_error or debug or callable(getattr(self, '_error_handler', None)):
            return super().error(message, ex)
        # The line that matters first, then the details; no usage (70 lines for `fit`).
        self._logger.error(message)
        parser = getattr(ex, 'subcommand_parser', None) or self
        headline = _headline(message)
        details = message.strip() if message.strip() != headline else ''
        sys.stderr.write(f'error: {headline}\n')
        if details:
            sys.stderr.write('details: ' + details.replace('\n', '\n  ') + '\n')
        sys.stderr.write(f"tip: for the accepted options run: "
                         f"{parser.prog.replace(' [options]', '')} --help\n")
        self.exit(2)


#: Subcommands that only evaluate: they log no files (:meth:`GRFLightningCLI._instantiate_trainer`).
EVALUATE_ONLY = ('validate', 'test', 'predict')
#: Lightning's notice that a restored ModelCheckpoint's folder differs from this run's.
DIRPATH_CHANGED = r'The dirpath has changed from'


class GRFLightningCLI(LightningCLI):
    r""":class:`LightningCLI` with this package's defaults and allow-lists (see the module
    docstring): a class outside them stops the command before it is built, with a parser error
    or an :class:`~pyg_grf.lightning.specs.UntrustedClassError` that names it."""

    def __init__(self, args: Optional[Sequence[str]] = None, run: bool = True, **kwargs: Any):
        trainer_defaults = {**TRAINER_DEFAULTS, **(kwargs.pop('trainer_defaults', None) or {})}
        kwargs.setdefault('seed_everything_default', 0)
        kwargs.setdefault('save_config_kwargs', {'overwrite': True})
        kwargs.setdefault('parser_kwargs', {'epilog': CV_EPILOG, 'prog': 'pyg-grf'})
        if 'parser_class' in inspect.signature(LightningCLI.__init__).parameters:
            kwargs.setdefault('parser_class', _GRFArgumentParser)
        self.trusted_classes = trusted_classes_from_env()
        with config_import_policy([*allowed_config_class_paths(), *self.trusted_classes]), \
                bounded_yaml_loader():
            super().__init__(pl.LightningModule, pl.LightningDataModule, subclass_mode_model=True,
                             subclass_mode_data=True, trainer_defaults=trainer_defaults,
                             args=None if args is None else list(args), run=run, **kwargs)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        for name, text in SUBCOMMANDS.items():  # listed in `pyg-grf --help`
            parser._subcommands_action.add_subcommand(
                name, self.init_parser(description=text, prog=f'pyg-grf {name}'), help=text)

    def _input_error(self, exc: Exception) -> CommandLineError:
        # one line, status 2, like the parser's errors
        sys.stderr.write(f'error: {exc}\n')
        return CommandLineError(str(exc))

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get('subcommand')
        if subcommand in ('cv', 'plot'):
            raise self._input_error(ValueError(
                f"`{subcommand}` runs through pyg_grf.lightning.cli.main (the pyg-grf command), "
                f"not GRFLightningCLI"))
        config = self.config[subcommand] if subcommand else self.config
        # refused before anything reads them (Lightning's CLI reads --ckpt_path's
        # hyperparameters next)
        try:
            check_local_dirs(config)
            if subcommand:
                ckpt_path = config.get('ckpt_path')
                check_local_ckpt_path(ckpt_path)
                if isinstance(ckpt_path, (str, os.PathLike)) and osp.isfile(ckpt_path):
                    check_checkpoint_file(os.fspath(ckpt_path), resume=subcommand == 'fit')
        except ValueError as exc:
            raise self._input_error(exc) from None

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
        if self.subcommand in EVALUATE_ONLY:
            # validate / test / predict print their metrics and write nothing: no new empty
            # version_<N> log folder (with a copy of the config) per evaluation
            config = dict(config, logger=False)
            self.save_config_callback = None
        return super()._instantiate_trainer(config, list(callbacks) + extra)

    def _run_subcommand(self, subcommand: str) -> None:
        with warnings.catch_warnings():
            if subcommand in EVALUATE_ONLY:  # it saves no checkpoint: the notice is noise
                warnings.filterwarnings('ignore', message=DIRPATH_CHANGED)
            super()._run_subcommand(subcommand)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> Dict[str, Any]:
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        ckpt_path = kwargs.get('ckpt_path')
        try:
            if ckpt_path is not None:
                kwargs['ckpt_path'] = resolve_ckpt_path(self.trainer, ckpt_path, subcommand)
                if 'weights_only' in kwargs and kwargs['weights_only'] is None:
                    kwargs['weights_only'] = True  # tensors and plain data only: no code
                resolved = kwargs['ckpt_path']
                if resolved != ckpt_path and resolved not in ('last', 'best', 'hpc'):
                    check_checkpoint_file(resolved, resume=subcommand == 'fit')
                if subcommand == 'fit':
                    reuse_log_version(self.trainer, kwargs['ckpt_path'])
            if subcommand == 'fit':
                self._check_run_folders()
        except (CheckpointError, RunFolderError) as exc:
            raise self._input_error(exc) from None
        return kwargs

    def _check_run_folders(self) -> None:
        # Lightning writes metrics.csv, hparams.yaml and config.yaml following links: the log
        # folder must hold none and lie below the logger's save_dir through real folders (a
        # fresh version_<N> holds nothing). Checkpoints are renamed into place (no link is
        # followed), so their folder is checked as a path only.
        trainer = self.trainer
        for logger in trainer.loggers:
            save_dir, log_dir = getattr(logger, 'save_dir', None), getattr(logger, 'log_dir', None)
            if isinstance(save_dir, str) and isinstance(log_dir, str):
                check_run_folder(log_dir, save_dir, names=None)
                check_run_folder(osp.join(log_dir, 'checkpoints'), save_dir)
        if not trainer.loggers:  # the config is saved into default_root_dir itself
            check_run_folder(trainer.default_root_dir, names=('config.yaml', ))

    def after_fit(self) -> None:
        if self.config[self.subcommand].get('test_after_fit'):
            self.test_best()

    def test_best(self, **kwargs: Any) -> List[Dict[str, float]]:
        r"""``trainer.test`` with the best checkpoint when ``checkpoint.monitor`` is set, else
        with the last weights."""
        ckpt = self.trainer.checkpoint_callback
        best = (ckpt is not None and ckpt.monitor and ckpt.best_model_path
                and not self.trainer.fast_dev_run)
        return self.trainer.test(self.model, datamodule=self.datamodule,
                                 ckpt_path='best' if best else None, **kwargs)


def _fmt(values: List[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return '{:.4f} ± {:.4f}'.format(*mean_std(values)) if values else 'n/a'


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
    parser = argparse.ArgumentParser(prog='pyg-grf cv', description=SUBCOMMANDS['cv'] + (
        ' Other options are passed to `pyg-grf fit` for every fold.'))
    parser.add_argument('--folds', default=None,
                        help='comma-separated folds to run (default: all)')
    parser.add_argument('--out', default=None,
                        help='run directory (default: <trainer.default_root_dir or .>/cv/'
                        '<config name>)')
    parser.add_argument('--plot', default='true', choices=('true', 'false'),
                        help='write cv_results.png (per-fold results) and every fold\'s '
                        'learning_curves.png (default: true; needs matplotlib)')
    opts, rest = parser.parse_known_args(list(argv))
    if opts.out is not None:
        try:
            check_local_dirs({'trainer': {'default_root_dir': opts.out}})
        except ValueError as exc:
            parser.error(str(exc).replace('--trainer.default_root_dir', '--out'))
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
        configs = probe.config.get('config') or []
        name = osp.splitext(osp.basename(str(configs[-1])))[0] if configs else 'run'
        out = osp.join(probe.trainer.default_root_dir, 'cv', name)
    del probe
    os.makedirs(out, exist_ok=True)

    results: List[Dict[str, Any]] = []
    for fold in folds:
        cli = GRFLightningCLI(args=[*rest, f'--data.init_args.fold={fold}',
                                    f'--trainer.default_root_dir={osp.join(out, f"fold{fold}")}'],
                              run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        metrics = cli.test_best(verbose=False)[0]
        row: Dict[str, Any] = {'fold': fold, **{k: float(v) for k, v in metrics.items()}}
        ckpt = cli.trainer.checkpoint_callback
        if ckpt is not None and ckpt.monitor and ckpt.best_model_score is not None:
            row[f'best {ckpt.monitor}'] = float(ckpt.best_model_score)
        results.append(row)
        print(f'fold {fold} ({len(results)}/{len(folds)}): ' + ', '.join(
            f'{k} {v:.4f}' for k, v in row.items() if k != 'fold'), flush=True)
        # Rewrite after every fold, so a stopped run keeps what it has.
        table = cv_table(results, title=f'{len(results)}/{len(folds)} folds')
        with atomic_write(osp.join(out, 'cv_results.md')) as f:
            f.write(table)
        with atomic_write(osp.join(out, 'cv_results.json')) as f:
            json.dump({'folds': results}, f, indent=2)
    print(table)
    print(f'written to {osp.join(out, "cv_results.md")}')
    if opts.plot == 'true':
        from pyg_grf.lightning.plot import plot_cv_results
        with contextlib.suppress(ImportError):  # no matplotlib: the table only
            print(f'per-fold results plotted in {plot_cv_results(out)[0]}')
    return results


def run_plot(argv: Sequence[str]) -> Dict[str, Any]:
    r"""``pyg-grf plot RUN_DIR``: the learning curves of the newest run under ``RUN_DIR`` (loss
    and the monitored metric, train and val) or, for a ``pyg-grf cv`` run folder, the per-fold
    results, as a PNG (:func:`pyg_grf.lightning.plot.plot_run`). Errors (no run there, no
    matplotlib) exit with status 2 and one line that says what was expected."""
    from pyg_grf.lightning.plot import plot_run
    parser = argparse.ArgumentParser(prog='pyg-grf plot', description=SUBCOMMANDS['plot'])
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
    with quiet_logs(once=bool(argv) and argv[0] == 'cv'), package_log_lines():
        if argv and argv[0] == 'cv':
            return run_cv(argv[1:])
        return GRFLightningCLI(args=args)  # None: LightningCLI reads sys.argv itself


def console_main() -> int:
    r"""The ``pyg-grf`` console script: runs :func:`main` and exits with status 0 on success
    (``main`` returns the CLI object or the CV results, which the console-script wrapper would
    print and turn into exit status 1). SIGTERM and SIGINT (Ctrl-C) stop it within a second
    (:mod:`pyg_grf.lightning.signals`); a stopped ``fit`` resumes with ``--ckpt_path last``."""
    try:
        with stop_on_signals():
            main()
    except CheckpointNotFoundError as exc:  # `--ckpt_path best` without one: a bad input
        sys.stderr.write(f'error: {exc}\n')
        return 2
    except StopSignal as exc:  # handled: end as the signal would have, without waiting
        sys.stderr.write(f'pyg-grf: {exc}\n')
        exit_by_signal(exc.signum)
    return 0


if __name__ == '__main__':  # pragma: no cover
    sys.exit(console_main())
