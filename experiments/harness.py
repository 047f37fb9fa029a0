r"""The one small harness the experiments share on top of the product's training stack.

A *run* is what a user gets from ``pyg-grf fit`` then ``pyg-grf test --ckpt_path best``: the
config of ``experiments/configs/`` with command-line overrides, built, fitted and tested by
:class:`pyg_grf.lightning.cli.GRFLightningCLI` (:func:`fit_and_test`). An *experiment* is a grid
of variants (each a list of overrides of one config) times seeds, whose rows are appended to a
JSONL file as they finish, so a stopped experiment resumes where it was (:func:`run_grid`), and
summarised as mean ± std per variant with the paired difference to a control variant, e.g.
the same model with unmasked linear attention (:func:`summary_table`).

    from harness import fit_and_test, run_grid, summary_table
    rows = run_grid({'grf': [], 'linear': ['--model.init_args.model.init_args.attn_type=linear']},
                    seeds=[0, 1, 2], out='experiments/results/my_runs',
                    run=lambda variant, overrides, seed, root: fit_and_test(CONFIG, overrides,
                                                                              seed, root))
    print(summary_table(rows, 'test/acc', control='linear'))
"""
from __future__ import annotations

import argparse
import json
import math
import os
import os.path as osp
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

Overrides = Sequence[str]

#: Overrides appended to every run of :func:`fit_and_test` (``--set`` of
#: :func:`experiment_main`), e.g. ``['--trainer.gradient_clip_val=0']`` for an ablation.
EXTRA_OVERRIDES: List[str] = []


def fit_and_test(config: str, overrides: Overrides, seed: int, root: str,
                 epochs: Optional[int] = None, callbacks: Sequence[Any] = ()) -> Dict[str, Any]:
    r"""Fits ``config`` (with ``overrides``) under ``root`` with ``seed_everything=seed``, then
    tests the checkpoint of the best validation epoch; returns the test metrics, the best
    validation score, the parameter count and the fit time in seconds. ``callbacks`` (e.g. a
    timer of the training steps) join the trainer's own."""
    from pyg_grf.lightning.cli import GRFLightningCLI
    args = ['--config', config, f'--seed_everything={seed}',
            f'--trainer.default_root_dir={root}', '--trainer.enable_checkpointing=true',
            *([f'--trainer.max_epochs={epochs}'] if epochs is not None else []), *overrides,
            *EXTRA_OVERRIDES]
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message="LightningCLI's args parameter")
        cli = GRFLightningCLI(args=args, run=False)
    cli.trainer.callbacks.extend(callbacks)
    params = sum(p.numel() for p in cli.model.parameters())
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    fit_s = time.perf_counter() - start
    ckpt = cli.trainer.checkpoint_callback
    epochs_run = cli.trainer.current_epoch
    metrics = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path='best',
                               verbose=False)[0]
    return {'seed': seed, 'epochs': epochs, 'params': params, 'fit_s': round(fit_s, 1),
            **({'extra_overrides': list(EXTRA_OVERRIDES)} if EXTRA_OVERRIDES else {}),
            'epochs_run': epochs_run, 'best_val': float(ckpt.best_model_score),
            **{k: float(v) for k, v in metrics.items()}}


def provenance() -> Dict[str, Any]:
    r"""Where a result comes from: the commit of the checkout (``+dirty`` with uncommitted
    changes; ``$PYG_GRF_COMMIT`` where set, as ``.ci/run`` does for its tree copy without
    ``.git``), the machine (CPU model, cores, platform), torch's version and its CPU capability
    (the vector ISA its kernels dispatch to: results can differ across it)."""
    import platform

    import torch
    commit = os.environ.get('PYG_GRF_COMMIT') or _git_commit()
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f
                        if line.startswith('model name')), cpu)
    except OSError:
        pass
    return {'commit': commit,
            'machine': f'{cpu}, {os.cpu_count()} cores, {platform.platform(terse=True)}',
            'torch': torch.__version__,
            'cpu_capability': torch.backends.cpu.get_cpu_capability()}


def _git_commit() -> Optional[str]:
    import subprocess
    git = ['git', '-C', osp.dirname(osp.dirname(osp.abspath(__file__)))]
    try:
        commit = subprocess.run([*git, 'rev-parse', '--short', 'HEAD'], capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run([*git, 'status', '--porcelain', '--untracked-files=no'],
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return (commit + ('+dirty' if dirty else '')) or None


def read_rows(path: str) -> List[Dict[str, Any]]:
    r"""The rows of a JSONL results file (none if it does not exist)."""
    if not osp.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def full_graph_epoch(model, opt, data, eval_data=None) -> tuple:
    r"""One full-graph training epoch of a node classifier (``model(data)`` the logits, cross
    entropy on ``data.train_mask``, one optimiser step), then its validation and test accuracy
    in eval mode on ``eval_data`` (default: ``data``), as floats."""
    import torch
    import torch.nn.functional as F
    model.train()
    opt.zero_grad()
    out = model(data)
    F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
    opt.step()
    model.eval()
    data = data if eval_data is None else eval_data
    with torch.no_grad():
        pred = model(data).argmax(-1)
    return tuple((pred[m] == data.y[m]).float().mean().item()
                 for m in (data.val_mask, data.test_mask))


def run_grid(variants: Dict[str, Any], seeds: Iterable[int], out: str,
             run: Callable[[str, Any, int, str], Dict[str, Any]],
             key: Optional[Dict[str, Any]] = None, log: Callable[[str], None] = print
             ) -> List[Dict[str, Any]]:
    r"""Runs every ``(variant, seed)`` not yet in ``out/runs.jsonl`` (rows matching ``key`` on
    their keys count as done), seed by seed, as ``run(variant, variants[variant], seed,
    root)`` with a fresh temporary ``root``; appends each row (with ``variant`` and ``key``)
    as it finishes. Returns all rows of the file that match ``key``."""
    os.makedirs(out, exist_ok=True)
    path = osp.join(out, 'runs.jsonl')
    key = dict(key or {})
    rows = [r for r in read_rows(path) if all(r.get(k) == v for k, v in key.items())]
    done = {(r['variant'], r['seed']) for r in rows}
    for seed in seeds:
        for variant, spec in variants.items():
            if (variant, seed) in done:
                continue
            with tempfile.TemporaryDirectory() as root:
                row = {**run(variant, spec, seed, root), **key, 'variant': variant,
                       'seed': seed, **provenance()}
            rows.append(row)
            with open(path, 'a') as f:
                f.write(json.dumps(row) + '\n')
            metric = next((k for k in row if k.startswith('test/') and k != 'test/loss'), None)
            log(f"{variant} seed {seed}: {metric} {row.get(metric)} ({row.get('fit_s')} s)")
    return rows


def coordinate_search(space: Dict[str, Sequence[Any]], score: Callable[[Dict[str, Any]], float],
                      log: Callable[[str], None] = print):
    r"""Selects one value per key of :obj:`space` one key at a time, in its order, starting from
    the first value of each: every candidate (the current choice with one key changed) is
    scored by ``score(candidate)`` (higher is better, e.g. a mean validation accuracy over
    selection seeds; each distinct candidate once) and the best value is kept (ties: the
    earlier value). Returns the choice and every scored candidate with its ``score``."""
    current = {k: values[0] for k, values in space.items()}
    tried: Dict[str, float] = {}
    for key, values in space.items():
        scores = []
        for value in values:
            candidate = dict(current, **{key: value})
            ident = json.dumps(candidate, sort_keys=True)
            if ident not in tried:
                tried[ident] = score(candidate)
                log(f'search {ident}: {tried[ident]:.4f}')
            scores.append(tried[ident])
        current[key] = values[max(range(len(values)), key=lambda i: (scores[i], -i))]
    return current, [dict(json.loads(k), score=v) for k, v in tried.items()]


def select_on_validation(space: Dict[str, Sequence[Any]],
                         run: Callable[[Dict[str, Any], Sequence[int], Dict[str, Any]],
                                       List[Dict[str, Any]]],
                         seeds: Sequence[int] = (100, 101), log: Callable[[str], None] = print
                         ) -> Dict[str, Any]:
    r""":func:`coordinate_search` scored by the mean best validation score over the selection
    :obj:`seeds` (disjoint from the reported ones): ``run(candidate, seeds, key)`` fits them
    (e.g. through :func:`run_grid` with ``key``, so a stopped search resumes) and returns the
    rows. Returns the chosen candidate."""
    def score(candidate):
        rows = run(candidate, seeds, {'candidate': json.dumps(candidate, sort_keys=True)})
        return statistics.mean(r['best_val'] for r in rows)
    chosen, tried = coordinate_search(space, score, log)
    log(f'selected {chosen} from {len(tried)} candidates')
    return chosen


def experiment_main(doc: str, out: str, run: Callable[[argparse.Namespace], Any],
                    write_table: Callable[[], str], add_arguments: Callable = lambda p: None,
                    argv: Optional[Sequence[str]] = None) -> None:
    r"""The command line every experiment shares: its own options (``add_arguments``), then
    ``--threads`` (torch threads per run, default 1), ``--out`` (the runs' folder),
    ``--set KEY=VALUE`` (a config override added to every run, repeatable; needs another
    ``--out``, as the committed table does not show it) and ``--table-only``; runs
    ``run(args)`` (with ``$PYG_GRF_MIRROR`` defaulting to ``../shared/datasets`` beside the
    checkout) and rebuilds the table when ``--out`` is the committed folder."""
    import torch
    p = argparse.ArgumentParser(description=doc.split('\n')[0])
    add_arguments(p)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out', default=out, help='folder of runs.jsonl (default: the committed '
                                             'one, whose table is rebuilt)')
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='config override for every run (e.g. trainer.gradient_clip_val=0)')
    p.add_argument('--table-only', action='store_true')
    args = p.parse_args(argv)
    if args.set and args.out == out:
        p.error('--set changes every run: give another --out than the committed folder')
    if any('=' not in s for s in args.set):
        p.error(f'--set expects KEY=VALUE, got {args.set}')
    EXTRA_OVERRIDES[:] = ['--' + s.lstrip('-') for s in args.set]
    if not args.table_only:
        torch.set_num_threads(args.threads)
        repo = osp.dirname(osp.dirname(osp.abspath(__file__)))
        os.environ.setdefault('PYG_GRF_MIRROR', osp.join(osp.dirname(repo), 'shared',
                                                         'datasets'))
        run(args)
    if args.out == out:
        print(write_table())


def write_markdown(path: str, lines: Sequence[str], notes: Optional[str] = None,
                   commands: Sequence[str] = ()) -> str:
    r"""Writes a results table: :obj:`lines`, then the hand-written notes file :obj:`notes`
    (kept by reruns) if it exists, then the :obj:`commands` that produce the runs."""
    lines = list(lines)
    if notes is not None and osp.exists(notes):
        with open(notes) as f:
            lines += [f.read().rstrip(), '']
    if commands:
        lines += ['Commands:', '', '```', *commands, '```', '']
    text = '\n'.join(lines)
    with open(path, 'w') as f:
        f.write(text)
    return text


def mean_std(xs: Sequence[float]):
    r"""Mean and sample standard deviation (nan for one value)."""
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else float('nan')
    return mean, std


def paired(rows: Sequence[Dict[str, Any]], variant: str, control: str, metric: str,
           scale: float = 100.0, lower_is_better: bool = False) -> Optional[Dict[str, float]]:
    r"""The paired difference ``variant - control`` of ``metric`` over the seeds both ran:
    mean, standard error, seeds and seeds better (a lower value where
    :obj:`lower_is_better`, e.g. an error) (:obj:`None` with fewer than two)."""
    by = {(r['variant'], r['seed']): r[metric] for r in rows if metric in r}
    diff = [scale * (by[(variant, s)] - by[(control, s)]) for (v, s) in by
            if v == variant and (control, s) in by]
    if len(diff) < 2:
        return None
    m, sd = mean_std(diff)
    return {'mean': m, 'se': sd / math.sqrt(len(diff)), 'seeds': len(diff),
            'better': sum(d < 0 if lower_is_better else d > 0 for d in diff)}


def summary_table(rows: Sequence[Dict[str, Any]], metric: str, control: Optional[str] = None,
                  order: Optional[Sequence[str]] = None, scale: float = 100.0,
                  labels: Optional[Dict[str, str]] = None,
                  lower_is_better: bool = False) -> str:
    r"""A markdown table, one line per variant: seeds, ``metric`` (times ``scale``) mean ± std,
    the paired difference to ``control`` (mean ± standard error, seeds better), the worst seed,
    the mean best validation score, parameters and fit seconds per run. ``labels`` names the
    ``metric``, ``control`` and ``val`` columns (default: the keys themselves);
    ``lower_is_better`` for errors (then a seed is better with a lower value, and the worst
    seed is the highest)."""
    variants = list(order) if order is not None else list(dict.fromkeys(r['variant']
                                                                          for r in rows))
    name = {'metric': metric, 'control': control, 'val': 'val', **(labels or {})}
    lines = [f"| variant | seeds | {name['metric']} (mean ± std) | paired vs {name['control']} "
             f"(mean ± SE) | {'max' if lower_is_better else 'min'} seed | {name['val']} | "
             f"params | s / run |",
             '|---|---|---|---|---|---|---|---|']
    for v in variants:
        runs = [r for r in rows if r['variant'] == v and metric in r]
        if not runs:
            continue
        vals = [scale * r[metric] for r in runs]
        mean, std = mean_std(vals)
        p = (paired(rows, v, control, metric, scale, lower_is_better)
             if control and v != control else None)
        diff = (f"{p['mean']:+.1f} ± {p['se']:.1f} ({p['better']}/{p['seeds']} seeds better)"
                if p else '')
        val = scale * sum(r['best_val'] for r in runs) / len(runs)
        fit = sum(r['fit_s'] for r in runs) / len(runs)
        worst = max(vals) if lower_is_better else min(vals)
        lines.append(f"| {v} | {len(runs)} | {mean:.1f} ± {std:.1f} | {diff} | {worst:.1f} "
                     f"| {val:.1f} | {runs[0]['params']} | {fit:.0f} |")
    return '\n'.join(lines) + '\n'
