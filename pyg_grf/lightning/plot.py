r"""Plots of training runs as PNG files (matplotlib's Agg canvas; the global backend is left
alone): the learning curves of a ``pyg-grf fit`` run, from ``epoch_metrics.jsonl``
(:class:`~pyg_grf.lightning.callbacks.EpochMetricsLog`) or a CSVLogger's ``metrics.csv``, and the
per-fold results of a ``pyg-grf cv`` run, from ``cv_results.json``.
"""
from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import math
import os.path as osp
from typing import Any, Dict, Iterator, List, Optional, Tuple

from pyg_grf.lightning.files import atomic_write, check_run_folder, version_number

#: A series: ``(epoch, value)`` pairs in epoch order.
Series = List[Tuple[int, float]]
#: Panels of a learning-curve plot: panel name (``'loss'`` or the metric) -> split -> series.
Panels = Dict[str, Dict[str, Series]]

LEARNING_CURVES = 'learning_curves.png'
CV_PLOT = 'cv_results.png'
EPOCH_METRICS = 'epoch_metrics.jsonl'
SPLITS = ('train', 'val')


def _matplotlib_figure(width: float, height: float, ncols: int):
    r"""A figure with :obj:`ncols` axes on an Agg canvas, without pyplot."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("Plotting needs matplotlib, which is not installed: "
                          "pip install matplotlib (or pip install 'pyg_grf[full]')") from None
    fig = Figure(figsize=(width * ncols, height), layout='constrained')
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


@contextlib.contextmanager
def _drawing(source: str, values: List[float]) -> Iterator[None]:
    # matplotlib fails on values near the float range (ticks of a 1e308-wide axis): one line
    try:
        yield
    except (ValueError, OverflowError) as exc:
        largest = max((abs(v) for v in values), default=0.)
        raise ValueError(f"matplotlib could not draw the values of '{source}' ({exc}); the "
                         f"largest absolute value is {largest:.3g}") from None


def _save_png(fig: Any, out: str) -> None:
    # a new file beside `out`, renamed into place: a link planted at `out` is replaced
    with atomic_write(out, 'wb') as f:
        fig.savefig(f, format='png', dpi=100)


def mean_std(values: List[float]) -> Tuple[float, float]:
    r"""The mean and the population standard deviation of :obj:`values`."""
    mean = sum(values) / len(values)
    # (x * x, not x ** 2: a float power raises OverflowError where a product gives inf)
    return mean, (sum((v - mean) * (v - mean) for v in values) / len(values))**0.5


def _has_metrics(path: str) -> bool:
    return osp.isfile(osp.join(path, EPOCH_METRICS)) or osp.isfile(osp.join(path, 'metrics.csv'))


def _has_curves(path: str) -> bool:
    # training curves, not only the metrics of a `pyg-grf test` run (test/... columns)
    if osp.isfile(osp.join(path, EPOCH_METRICS)):
        return True
    try:
        with open(osp.join(path, 'metrics.csv'), newline='') as f:
            header = next(csv.reader(f), [])
    except OSError:
        return False
    return any(key.startswith(('train', 'val')) for key in header)


def find_run_dir(path: str) -> str:
    r"""The log folder of a run: :obj:`path` itself when it holds ``epoch_metrics.jsonl`` or
    ``metrics.csv``, else the newest ``version_<N>`` below it (``<path>/version_<N>`` or
    ``<path>/<logger name>/version_<N>``) that holds training curves (a test run's version has
    test metrics only), else the newest one; :class:`FileNotFoundError` if there is none."""
    if not osp.isdir(path):
        raise FileNotFoundError(f"expected a run folder (a trainer's default_root_dir or a "
                                f"'version_<N>' log folder), got '{path}', which does not exist")
    if _has_metrics(path):
        return path
    found = [d for pattern in ('version_*', osp.join('*', 'version_*'))
             for d in glob.glob(osp.join(path, pattern)) if _has_metrics(d)]
    if not found:
        raise FileNotFoundError(
            f"no training metrics under '{path}': expected '{EPOCH_METRICS}' (written by "
            f"`pyg-grf fit`) or a CSVLogger's 'metrics.csv' in it or in a 'version_<N>' folder "
            f"below it")
    curves = [d for d in found if _has_curves(d)]
    return max(curves or found, key=lambda d: (version_number(d), osp.getmtime(d)))


def _float(value: Any) -> Optional[float]:
    # None for anything that is not a number a plot can use: text, lists, NaN, and integers
    # too large for a float (JSON allows 400-digit ones)
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(value) else value


def _epoch(value: Any) -> Optional[int]:
    value = _float(value)
    return int(value) if value is not None and math.isfinite(value) and value >= 0 else None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding='utf-8', newline='') as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"'{path}' is not UTF-8 text (byte {exc.start}: "
                         f"{exc.object[exc.start:exc.start + 1]!r})") from None


def read_epoch_metrics(run_dir: str) -> List[Dict[str, Any]]:
    r"""One dict per finished epoch (``epoch`` plus the metrics logged at the end of it) from
    ``epoch_metrics.jsonl``, else from the per-epoch rows of ``metrics.csv`` (a CSVLogger writes
    a training epoch's and a validation's values on separate rows; they are merged)."""
    path = osp.join(run_dir, EPOCH_METRICS)
    if osp.isfile(path):
        out = []
        for lineno, line in enumerate(_read_text(path).split('\n'), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ValueError(f"'{path}' line {lineno} is not JSON (got "
                                 f"{line.strip()[:60]!r})") from None
            # rows without a finite epoch (null lines, a killed write) are not epochs
            if isinstance(row, dict) and _epoch(row.get('epoch')) is not None:
                out.append(dict(row, epoch=_epoch(row['epoch'])))
        return out
    rows: Dict[int, Dict[str, Any]] = {}
    path = osp.join(run_dir, 'metrics.csv')
    for row in csv.DictReader(io.StringIO(_read_text(path), newline='')):
        epoch = _epoch(row.get('epoch'))
        if epoch is None:
            continue
        merged = rows.setdefault(int(epoch), {'epoch': int(epoch)})
        for key, value in row.items():
            # Per-step training values are not epoch values; fields beyond the header (key
            # None) are no values at all.
            if isinstance(key, str) and key not in ('epoch', 'step') \
                    and not key.endswith('_step') and _float(value) is not None:
                merged[key] = _float(value)
    return [rows[e] for e in sorted(rows)]


def _monitor_of(run_dir: str) -> Optional[str]:
    r"""``checkpoint.monitor`` of the ``config.yaml`` that LightningCLI saved in the run."""
    path = osp.join(run_dir, 'config.yaml')
    if not osp.isfile(path):
        return None
    import yaml
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"'{path}' is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise ValueError(f"'{path}' must hold a mapping (a LightningCLI config), got "
                         f"{type(config).__name__}")
    checkpoint = config.get('checkpoint') or {}
    monitor = checkpoint.get('monitor') if isinstance(checkpoint, dict) else None
    if monitor is not None and not isinstance(monitor, str):
        raise ValueError(f"'{path}': checkpoint.monitor must be a metric name such as "
                         f"'val/acc', got {type(monitor).__name__} {monitor!r:.60}")
    return monitor


def learning_curve_panels(rows: List[Dict[str, Any]], monitor: Optional[str] = None) -> Panels:
    r"""The data of a learning-curve plot: a ``'loss'`` panel and one for the monitored metric,
    each with a ``'train'`` and a ``'val'`` series (only those that were logged).

    Args:
        rows (list): per-epoch metrics, as from :func:`read_epoch_metrics`.
        monitor (str, optional): the monitored metric, e.g. ``'val/acc'`` or ``'acc'``. When it
            is :obj:`None` or the loss, the metric is the logged ``val/<name>`` other than the
            loss (the first in sorted order if there are several).
    """
    keys = {key for row in rows for key in row}
    metrics = sorted(key.split('/', 1)[1] for key in keys
                     if key.startswith('val/') and key != 'val/loss')
    name = monitor.split('/', 1)[-1] if monitor else None
    if name in (None, 'loss'):
        name = metrics[0] if metrics else None

    def series(key: str) -> Series:
        return [(int(row['epoch']), float(row[key])) for row in rows
                if _float(row.get(key)) is not None]

    panels: Panels = {'loss': {}}
    for split in SPLITS:
        # Training loss: the epoch mean ('train/loss_epoch' when it is also logged per step).
        key = f'{split}/loss_epoch' if f'{split}/loss_epoch' in keys else f'{split}/loss'
        if key in keys:
            panels['loss'][split] = series(key)
    if name is not None:
        panels[name] = {split: series(f'{split}/{name}') for split in SPLITS
                        if f'{split}/{name}' in keys}
    return {panel: data for panel, data in panels.items() if data}


def plot_learning_curves(run_dir: str, out: Optional[str] = None,
                         monitor: Optional[str] = None) -> Tuple[str, Panels]:
    r"""Writes the learning curves of a run (loss and the monitored metric, train and val, per
    epoch) as a PNG with one panel each.

    Args:
        run_dir (str): the run's log folder, or a folder above it (see :func:`find_run_dir`).
        out (str, optional): the PNG file (default: ``<log folder>/learning_curves.png``).
        monitor (str, optional): the metric to plot (default: ``checkpoint.monitor`` of the
            run's ``config.yaml``, else the logged validation metric).

    Returns ``(path, panels)``: the file written and :func:`learning_curve_panels`.

    Raises:
        FileNotFoundError: no metrics under :obj:`run_dir`.
        ValueError: the run has no finished epoch.
        ImportError: matplotlib is not installed.
    """
    root, run_dir = run_dir, find_run_dir(run_dir)
    rows = read_epoch_metrics(run_dir)
    panels = learning_curve_panels(rows, monitor or _monitor_of(run_dir))
    if not panels:
        raise ValueError(f"no epoch-level loss or metric in '{run_dir}' (expected rows with "
                         f"'train/loss' or 'val/loss'; the run has {len(rows)} finished epochs)")
    if out is None:  # into the run folder the user named, reached through real folders
        out = osp.join(run_dir, LEARNING_CURVES)
        check_run_folder(run_dir, root)
    fig, axes = _matplotlib_figure(4.5, 3.4, len(panels))
    with _drawing(run_dir, [v for data in panels.values() for points in data.values()
                            for _, v in points]):
        for ax, (name, data) in zip(axes, panels.items()):
            for split, points in data.items():
                epochs, values = zip(*points) if points else ((), ())
                ax.plot(epochs, values, marker='o', markersize=3, label=split)
            ax.set_title(name)
            ax.set_xlabel('epoch')
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(osp.relpath(run_dir), fontsize=9)
        _save_png(fig, out)
    return out, panels


def read_cv_results(cv_dir: str) -> Dict[str, List[Tuple[int, float]]]:
    r"""Per-fold results of a ``pyg-grf cv`` run (``cv_results.json``): metric -> ``(fold,
    value)`` pairs."""
    path = osp.join(cv_dir, 'cv_results.json')
    if not osp.isfile(path):
        raise FileNotFoundError(f"expected '{path}' (written by `pyg-grf cv`)")
    try:
        with open(path) as f:
            content = json.load(f)
    except ValueError as exc:
        raise ValueError(f"'{path}' is not valid JSON ({exc})") from None
    folds = content.get('folds', []) if isinstance(content, dict) else None
    if not isinstance(folds, list):
        raise ValueError(f"'{path}' must hold {{'folds': [...]}} (written by `pyg-grf cv`), got "
                         f"{type(content).__name__}")
    folds = [row for row in folds if isinstance(row, dict) and _epoch(row.get('fold')) is not None]
    keys = sorted({k for row in folds for k in row if k != 'fold'})
    return {key: [(_epoch(row['fold']), float(row[key])) for row in folds
                  if _float(row.get(key)) is not None and math.isfinite(float(row[key]))]
            for key in keys}


def plot_cv_results(cv_dir: str, out: Optional[str] = None
                    ) -> Tuple[str, Dict[str, List[Tuple[int, float]]]]:
    r"""Writes the per-fold results of a ``pyg-grf cv`` run as a PNG: one panel per metric of
    ``cv_results.json``, a bar per fold and the mean ± std (population std, as in
    ``cv_results.md``) as a line and a band.

    Returns ``(path, results)``: the file written (default ``<cv_dir>/cv_results.png``) and
    :func:`read_cv_results`.
    """
    results = {k: v for k, v in read_cv_results(cv_dir).items() if v}
    if not results:
        raise ValueError(f"no finished fold in '{osp.join(cv_dir, 'cv_results.json')}'")
    out = out or osp.join(cv_dir, CV_PLOT)
    fig, axes = _matplotlib_figure(4., 3.2, len(results))
    with _drawing(cv_dir, [v for points in results.values() for _, v in points]):
        for ax, (name, points) in zip(axes, results.items()):
            folds, values = zip(*points)
            mean, std = mean_std(values)
            ax.bar([str(f) for f in folds], values, color='tab:blue', alpha=0.7)
            ax.axhline(mean, color='tab:red')
            ax.axhspan(mean - std, mean + std, color='tab:red', alpha=0.15)
            ax.set_title(f'{name}: {mean:.4f} ± {std:.4f}', fontsize=9)
            ax.set_xlabel('fold')
        _save_png(fig, out)
    return out, results


def plot_run(path: str, out: Optional[str] = None, monitor: Optional[str] = None
             ) -> Dict[str, Any]:
    r"""``pyg-grf plot PATH``: the per-fold results for a cv run folder (one with
    ``cv_results.json``), else the learning curves of the newest run under :obj:`path`; returns
    ``{'kind': 'cv' | 'fit', 'path': PNG file, 'data': what was plotted}``."""
    if osp.isfile(osp.join(path, 'cv_results.json')):
        png, data = plot_cv_results(path, out)
        return {'kind': 'cv', 'path': png, 'data': data}
    png, panels = plot_learning_curves(path, out, monitor)
    return {'kind': 'fit', 'path': png, 'data': panels}


__all__ = ['find_run_dir', 'read_epoch_metrics', 'learning_curve_panels',
           'plot_learning_curves', 'read_cv_results', 'plot_cv_results', 'plot_run', 'mean_std']
