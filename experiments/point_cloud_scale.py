r"""The GRF scale experiment on generated point-cloud dynamics (GRF paper, Sec. 4 "PCTs" and
App. C.3, at the scale this hardware allows), through the product's training stack: the config
``experiments/configs/paper/point_cloud.yaml`` (``GraphTransformer`` with node-level outputs,
trained by ``GraphLevelTask`` with an MSE loss on ``MassSpringDataModule``),
one run per (size, variant, seed) by :mod:`harness`.

Data: :class:`point_clouds.MassSpringDataset` clouds of 8,192, 32,768 and 131,072
particles (kNN graph over the current positions; target: every particle's displacement over the
next frame), 10 training, 2 validation and 4 test clouds, standardised with the training clouds'
statistics (``standardize=['x', 'y']``), so the test MSE is in units of the target's variance
(predicting zero scores about 1). GRF walks are drawn once per cloud by the ``pre_transform`` and
cached with the dataset.

Variants (width 32, 4 heads, 2 pre-norm blocks; the feed-forward width of each is chosen so that
its parameter count is closest to ``grf``'s):

* ``grf``: :class:`~pyg_grf.nn.GRFAttention` (ReLU features; fixed-length 3-hop repelling walks,
  asymmetric GRFs, App. C.3);
* ``linear``: :class:`~pyg_grf.nn.LinearAttention`, the same layer without the mask (what the
  mask adds);
* ``favor``: the same layer with Performer (FAVOR+) random features, 16 per head of 8
  channels, unmasked over the whole cloud. (PyG's ``PerformerAttention``, ReLU features, which
  the earlier hand-written loop ran, is ``attn_type='performer'``.)
* ``gat``: PyG's :class:`~torch_geometric.nn.GATConv` on the kNN graph, no attention.

Budget: the same CPU seconds of training per variant and size (one thread; process time, so
other jobs on the machine do not shorten it). A variant's step time is measured by a 1-epoch
calibration fit, and its run gets the epochs (10 steps each, at most ``--max-steps`` steps) that
fit the budget, with the task's cosine decay over them. The checkpoint of the best validation
MSE is tested. Reported per size: test MSE (mean ± std over seeds, paired difference to
``linear``), the median CPU seconds of one training step (forward, backward, Adam on one
cloud), the steps run and the parameters. Runs are appended to
``experiments/results/point_cloud_scale/runs.jsonl``; the table is
``experiments/results/point_cloud_scale.md``::

    python experiments/point_cloud_scale.py --sizes 8192 32768 131072 --seeds 2
"""
from __future__ import annotations

import json
import math
import os.path as osp
import statistics
import sys
import time
from typing import Dict, List

import yaml
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import point_clouds  # noqa: E402,F401  (registers the DataModule for the config)
from harness import (  # noqa: E402
    experiment_main,
    fit_and_test,
    read_rows,
    run_grid,
    summary_table,
    write_markdown,
)

HERE = osp.dirname(osp.abspath(__file__))
CONFIG = osp.join(HERE, 'configs', 'paper', 'point_cloud.yaml')
OUT = osp.join(HERE, 'results', 'point_cloud_scale')
TABLE = osp.join(HERE, 'results', 'point_cloud_scale.md')
NOTES = osp.join(HERE, 'results', 'point_cloud_scale_notes.md')
VARIANTS = ('grf', 'linear', 'favor', 'gat')
BUDGET = {8192: 60, 32768: 80, 131072: 80}  # CPU seconds of training per variant
M, D = '--model.init_args.model.init_args.', '--data.init_args.'
#: ``GraphTransformer`` arguments of each variant, over the config's (which is ``grf``).
VARIANT_ARGS = {'grf': {},
                'linear': {'attn_type': 'linear', 'attn_kwargs': {}},
                'favor': {'attn_type': 'favor', 'attn_kwargs': {'num_features': 16}},
                'gat': {'attn_type': None, 'attn_kwargs': {}, 'conv': 'gat'}}
#: ``gat``'s arguments as a second config file: jsonargparse reads a nested ``=null`` on the
#: command line as the string 'None'.
GAT_CONFIG = osp.join(HERE, 'configs', 'paper', 'point_cloud_gat.yaml')


class StepTimer(Callback):
    r"""CPU seconds (process time) of every training step: forward, backward, optimiser."""

    def __init__(self):
        self.times: List[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.process_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.process_time() - self._start)

    def median(self) -> float:
        times = self.times[2:] if len(self.times) > 4 else self.times  # the first steps warm up
        return statistics.median(times)


def _model_args() -> Dict:
    with open(CONFIG) as f:
        return yaml.safe_load(f)['model']['init_args']['model']['init_args']


def matched_ffn_ratio(variant: str) -> float:
    r"""The feed-forward ratio of ``variant`` whose parameter count is closest to ``grf``'s (at
    the config's ratio)."""
    from pyg_grf.nn import GraphTransformer
    base = _model_args()

    def params(kind, ratio):
        model = GraphTransformer(**dict(base, **VARIANT_ARGS[kind], ffn_ratio=ratio))
        return sum(p.numel() for p in model.parameters())
    target = params('grf', base['ffn_ratio'])
    C = base['hidden_channels']
    hidden = min(range(1, 8 * C), key=lambda h: abs(params(variant, (h + 0.5) / C) - target))
    return (hidden + 0.5) / C


def overrides(variant: str, size: int) -> List[str]:
    args = VARIANT_ARGS[variant]
    arch = (['--config', GAT_CONFIG] if variant == 'gat' else
            [f'{M}{k}={v if isinstance(v, str) else json.dumps(v)}' for k, v in args.items()])
    return [*arch, f'{M}ffn_ratio={matched_ffn_ratio(variant)}',
            D + 'dataset_kwargs=' + json.dumps({'num_points': size, 'graph_k': 6})]


def fit_one(variant: str, size: int, seed: int, root: str, budget: float, max_steps: int,
            extra=(), threads: int = 1):
    r"""One run: a 1-epoch calibration fit measures the step time, then the fit with the
    epochs that fit :obj:`budget` CPU seconds, tested at its best validation epoch."""
    import harness
    import torch
    torch.set_num_threads(threads)
    harness.EXTRA_OVERRIDES[:] = list(extra)
    args = overrides(variant, size)
    calib = StepTimer()
    fit_and_test(CONFIG, args, seed, root + '/calibration', epochs=1, callbacks=[calib])
    steps_per_epoch = len(calib.times)
    epochs = max(1, min(max_steps // steps_per_epoch,
                        int(budget / (steps_per_epoch * calib.median()))))
    timer = StepTimer()
    row = fit_and_test(CONFIG, args + [
        f'--trainer.check_val_every_n_epoch={max(1, epochs // 20)}'], seed, root,
        epochs=epochs, callbacks=[timer])
    return dict(row, s_per_step=timer.median(), steps=len(timer.times),
                train_cpu_s=round(sum(timer.times), 1), calib_s_per_step=calib.median())


def run(sizes, variants, seeds, out: str = OUT, max_steps: int = 2000, budget_scale=1.0):
    import multiprocessing

    import harness
    import torch
    rows = []
    for size in sizes:
        budget = BUDGET.get(size, 80) * budget_scale

        def fit(variant, _, seed, root):
            # every run in a fresh process: at 131k points one GRF fit peaks at 8.7 GB and the
            # process keeps ~5 GB of it afterwards (freed memory the allocator holds), so runs
            # in one process ran out of this machine's 24 GB by the ninth fit
            ctx = multiprocessing.get_context('spawn')
            with ctx.Pool(1) as pool:
                return pool.apply(fit_one, (variant, size, seed, root, budget, max_steps,
                                            list(harness.EXTRA_OVERRIDES),
                                            torch.get_num_threads()))
        rows += run_grid({v: None for v in variants}, seeds, out, fit,
                         key={'size': size, 'budget_s': budget, 'max_steps': max_steps})
    return rows


def _slope(points) -> str:
    if len(points) < 2:
        return '—'
    lx = [math.log(n) for n, _ in points]
    ly = [math.log(t) for _, t in points]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    cov = sum((a - mx) * (b - my) for a, b in zip(lx, ly))
    return f'{cov / sum((a - mx) ** 2 for a in lx):.2f}'


def write_table() -> str:
    rows = read_rows(osp.join(OUT, 'runs.jsonl'))
    lines = ['# GRF scale experiment: mass-spring point clouds (GRF paper, Sec. 4, App. C.3)', '',
             '`GraphTransformer` (width 32, 4 heads, 2 pre-norm blocks, node outputs) trained '
             'by `pyg_grf.lightning` (`experiments/configs/paper/point_cloud.yaml`) through '
             '`experiments/point_cloud_scale.py`, full-graph (one cloud per step), Adam lr 3e-3 '
             'with cosine decay, the same CPU-second budget per variant; features and targets '
             'standardised with the training clouds\' statistics. `test MSE x100`: test MSE '
             'of the checkpoint with the best validation MSE, times 100 (100 = predicting '
             'zero); paired difference to `linear` (the same model with unmasked linear '
             'attention; negative = lower error). One CPU thread per run.', '']
    sizes = sorted({r['size'] for r in rows})
    speed = ['| variant | ' + ' | '.join(f'N = {n:,}: s / step | steps' for n in sizes)
             + ' | slope of s / step in N (log-log) |',
             '|---|' + '---|---|' * len(sizes) + '---|']
    for v in VARIANTS:
        cells, points = [], []
        for n in sizes:
            rs = [r for r in rows if r['variant'] == v and r['size'] == n]
            if not rs:
                cells.append('— | —')
                continue
            t = statistics.mean(r['s_per_step'] for r in rs)
            cells.append(f"{t:.3f} | {round(statistics.mean(r['steps'] for r in rs))}")
            points.append((n, t))
        speed.append(f'| {v} | ' + ' | '.join(cells) + f' | {_slope(points)} |')
    for n in sizes:
        sub = [r for r in rows if r['size'] == n]
        lines += [f'## N = {n:,} ({sub[0]["budget_s"]:.0f} CPU s per variant, at most '
                  f'{sub[0]["max_steps"]} steps)', '',
                  summary_table(sub, 'test/mse', control='linear', order=VARIANTS,
                                labels={'metric': 'test MSE x100', 'val': 'val MSE x100'},
                                lower_is_better=True).rstrip(), '']
    lines += ['## CPU seconds per training step', '', *speed, '',
              'Dense softmax attention is not run: its float32 `[H, N, N]` matrices for 2 '
              'layers x 4 heads take 2 GiB at N = 8,192, 32 GiB at 32,768 and 512 GiB at '
              '131,072 (this machine has 24 GiB).', '']
    return write_markdown(TABLE, lines, NOTES, [
        'python experiments/point_cloud_scale.py --sizes 8192 32768 131072 --seeds 2'])


def main(argv=None):
    def add_arguments(p):
        p.add_argument('--sizes', type=int, nargs='+', default=sorted(BUDGET))
        p.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=VARIANTS)
        p.add_argument('--seeds', type=int, default=1)
        p.add_argument('--max-steps', type=int, default=2000)
        p.add_argument('--budget-scale', type=float, default=1.0,
                       help='multiplies every size\'s CPU-second budget')

    def go(args):
        for v in args.variants:
            print(f'{v}: ffn_ratio {matched_ffn_ratio(v):.4f}', flush=True)
        run(args.sizes, args.variants, range(args.seeds), args.out, args.max_steps,
            args.budget_scale)
    experiment_main(__doc__, OUT, go, write_table, add_arguments, argv)


if __name__ == '__main__':
    main()
