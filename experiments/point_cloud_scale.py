r"""The GRF scale experiment on generated point-cloud dynamics (GRF paper, Sec. 4 "PCTs" and
App. C.3, at the scale this hardware allows).

Data: :class:`~pyg_grf.datasets.MassSpringDataset` (an elastic sheet simulated as a mass-spring
system; kNN graph over the current particle positions; target: every particle's displacement over
the next frame), clouds of 8,192, 32,768 and 131,072 particles. Train clouds (seed 0), one
validation cloud (seed 1, for tuning only) and test clouds (seed 2); inputs and targets are
standardised with the training clouds' statistics, so the test MSE is in units of the target's
variance per component (predicting zero scores about 1).

Models (same width, depth and head count; parameter counts matched to within 10% by the width of
the feed-forward layers): a pre-norm transformer ``x + mixer(LN(x))``, ``x + FFN(LN(x))`` whose
mixer is

* ``grf``: :class:`~pyg_grf.nn.GRFAttention` (linear attention, ReLU features, GRF mask of frozen
  walks on the kNN graph, drawn once per cloud by
  :class:`~pyg_grf.transforms.AddGraphRandomFeatures`; as in App. C.3: fixed-length walks,
  repelling walkers, asymmetric GRFs by default);
* ``performer``: PyG's :class:`~torch_geometric.nn.attention.PerformerAttention` over the whole
  cloud (unmasked linear attention, FAVOR+ features);
* ``linear``: :class:`~pyg_grf.nn.LinearAttention`, the same layer as ``grf`` without the mask
  (unmasked, ReLU features): differs from ``grf`` only by the mask;
* ``gat``: PyG's :class:`~torch_geometric.nn.GATConv` on the kNN graph;
* ``mlp``: no mixer (no attention, no message passing).

Every model trains full-graph (one whole cloud per step, cycling over the training clouds) with
Adam under the same budget: at most ``budget`` CPU seconds (single thread, process time, so that
other jobs on the machine do not shorten it) and ``max_steps`` steps per size, the
learning rate following a cosine from ``lr`` to 0 over the budget (by elapsed time or steps,
whichever is further). Reported per size and model: test MSE (mean over test clouds, then mean ±
std over seeds), the median CPU seconds per training step (forward, backward, optimiser step on
one whole cloud), steps done, the parameter count; dense
softmax attention is reported by the bytes its ``[H, N, N]`` attention matrices would take (never
allocated). One JSON per (size, model, seed) goes to ``experiments/results/runs/point_cloud_scale/``
(git-ignored, and a finished run is skipped when rerun); the table goes to
``experiments/results/point_cloud_scale.md``::

    OMP_NUM_THREADS=1 nice -n 5 python experiments/point_cloud_scale.py \
        --config experiments/configs/scripts/point_cloud_scale.yaml
"""
from __future__ import annotations

import argparse
import json
import math
import os
import os.path as osp
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from pyg_grf.datasets import MassSpringDataset  # noqa: E402
from pyg_grf.features import GRFLoads  # noqa: E402
from pyg_grf.nn import GRFAttention, LinearAttention  # noqa: E402
from pyg_grf.transforms import AddGraphRandomFeatures  # noqa: E402

RUNS = osp.join(REPO, 'experiments', 'results', 'runs', 'point_cloud_scale')
TABLE = osp.join(REPO, 'experiments', 'results', 'point_cloud_scale.md')
MODELS = ('grf', 'performer', 'linear', 'gat', 'mlp')
HEADER = '''# GRF scale experiment: mass-spring point clouds

Written by `experiments/point_cloud_scale.py` (settings: `experiments/configs/scripts/point_cloud_scale.yaml`;
notes and analysis: `point_cloud_scale_notes.md`). Data: `MassSpringDataset` (elastic sheet,
kNN graph over the current positions, target = displacement over the next frame); 4 training
clouds, 1 validation cloud, 2 test clouds per size. Test MSE on standardised targets (predicting
zero scores about 1), mean over the test clouds (± std over seeds where several, seed count in
brackets). s / step: median CPU seconds of one full-graph training step (forward, backward, Adam)
on one thread. Every model: width 32, 4 heads, 2 blocks, parameters matched to within 10%, the
same CPU-time budget per size. Slope: least-squares slope of log(s / step) against log(N).

    OMP_NUM_THREADS=1 nice -n 5 python experiments/point_cloud_scale.py \\
        --config experiments/configs/scripts/point_cloud_scale.yaml
'''


class Mixer(nn.Module):
    r"""The token mixer of one block: one of :data:`MODELS` (``'mlp'``: none)."""
    def __init__(self, kind: str, channels: int, heads: int, args):
        super().__init__()
        self.kind = kind
        if kind == 'grf':
            self.attn = GRFAttention(channels, heads=heads, max_length=args.max_length,
                                     mode=args.grf_mode, f_init=args.f_init,
                                     backend=args.backend)
        elif kind == 'performer':
            from torch_geometric.nn.attention import PerformerAttention
            self.attn = PerformerAttention(channels, heads, head_channels=channels // heads)
        elif kind == 'linear':
            self.attn = LinearAttention(channels, heads=heads)
        elif kind == 'gat':
            from torch_geometric.nn import GATConv
            self.attn = GATConv(channels, channels // heads, heads=heads)
        elif kind == 'mlp':
            self.attn = None
        else:
            raise ValueError(f"unknown model {kind!r}; expected one of {MODELS}")

    def forward(self, x, edge_index, grf):
        if self.kind == 'grf':
            return self.attn(x, grf=grf)
        if self.kind == 'performer':
            return self.attn(x.unsqueeze(0)).squeeze(0)  # one cloud = one sequence
        if self.kind == 'linear':
            return self.attn(x)
        return self.attn(x, edge_index)  # gat


class PointCloudModel(nn.Module):
    r"""Linear encoder, ``layers`` pre-norm blocks (mixer and FFN, both residual), linear head."""
    def __init__(self, kind, in_channels, out_channels, hidden, heads, layers, ffn_hidden, args):
        super().__init__()
        self.kind = kind
        self.enc = nn.Linear(in_channels, hidden)
        self.mixers = nn.ModuleList()
        self.norms1 = nn.ModuleList()
        if kind != 'mlp':
            self.mixers.extend(Mixer(kind, hidden, heads, args) for _ in range(layers))
            self.norms1.extend(nn.LayerNorm(hidden) for _ in range(layers))
        self.norms2 = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.ffns = nn.ModuleList(nn.Sequential(nn.Linear(hidden, ffn_hidden), nn.GELU(),
                                                nn.Linear(ffn_hidden, hidden))
                                  for _ in range(layers))
        self.head = nn.Linear(hidden, out_channels)

    def forward(self, x, edge_index, grf=None):
        x = self.enc(x)
        for i, (norm2, ffn) in enumerate(zip(self.norms2, self.ffns)):
            if self.mixers:
                x = x + self.mixers[i](self.norms1[i](x), edge_index, grf)
            x = x + ffn(norm2(x))
        return self.head(x)


def num_params(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build(kind, args, in_channels=15, out_channels=3):
    r"""The model with its FFN width chosen so that its parameter count is closest to the GRF
    model's (which has ``ffn_mult * hidden``)."""
    def make(k, ffn):
        return PointCloudModel(k, in_channels, out_channels, args.hidden, args.heads,
                               args.layers, ffn, args)
    target = num_params(make('grf', args.ffn_mult * args.hidden))
    per_unit = args.layers * (2 * args.hidden + 1)  # parameters per FFN hidden unit
    base = num_params(make(kind, 1)) - per_unit
    ffn = max(1, round((target - base) / per_unit))
    model = make(kind, ffn)
    n = num_params(model)
    if abs(n - target) > 0.1 * target:
        raise RuntimeError(f"cannot match parameters: {kind} has {n}, grf {target}")
    return model, ffn, n, target


def load_clouds(size, args):
    r"""Train / validation / test clouds with GRF loads; standardisation statistics."""
    kw = dict(num_points=size, graph_k=args.graph_k)
    t0 = time.perf_counter()
    sets = {'train': MassSpringDataset(num_clouds=args.train_clouds, seed=0, **kw),
            'val': MassSpringDataset(num_clouds=args.val_clouds, seed=1, **kw),
            'test': MassSpringDataset(num_clouds=args.test_clouds, seed=2, **kw)}
    gen_s = time.perf_counter() - t0
    sets = {k: [ds[i] for i in range(len(ds))] for k, ds in sets.items()}
    xs = torch.cat([d.x for d in sets['train']])
    ys = torch.cat([d.y for d in sets['train']])
    x_mean, x_std = xs.mean(0), xs.std(0).clamp_min(1e-6)
    y_std = ys.std(0)
    transform = AddGraphRandomFeatures(num_walks=args.num_walks, p_halt=args.p_halt,
                                       max_length=args.max_length, walker=args.walker,
                                       fixed_length=args.fixed_length, seed=args.walk_seed)
    t0 = time.perf_counter()
    out = {}
    for split, clouds in sets.items():
        out[split] = []
        for d in clouds:
            d = transform(d)
            d.x = (d.x - x_mean) / x_std
            d.y = d.y / y_std
            out[split].append((d, GRFLoads.from_data(d)))
    grf_s = (time.perf_counter() - t0) / sum(len(v) for v in sets.values())
    nnz = statistics.mean(d.grf_index.size(1) / d.num_nodes for d, _ in out['train'])
    info = dict(gen_s=gen_s, grf_s_per_cloud=grf_s, grf_nnz_per_node=nnz,
                edges_per_node=out['train'][0][0].num_edges / size)
    return out, info


@torch.no_grad()
def evaluate(model, clouds):
    model.eval()
    mses = [float(F.mse_loss(model(d.x, d.edge_index, grf), d.y)) for d, grf in clouds]
    model.train()
    return statistics.mean(mses), mses


def train(kind, seed, size, clouds, args):
    torch.manual_seed(seed)
    model, ffn, n_params, target = build(kind, args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    budget = (float(args.budget[str(size)]) if isinstance(args.budget, dict)
              else float(args.budget))
    # CPU time of this (single-threaded) process: the budget and the step times do not depend on
    # what else runs on the machine; wall-clock times are recorded too
    times, walls, losses = [], [], []
    start = time.process_time()
    step = 0
    while step < args.max_steps:
        elapsed = time.process_time() - start
        frac = max(elapsed / budget, step / args.max_steps)
        if frac >= 1.0:
            break
        for g in opt.param_groups:  # cosine to zero over the budget
            g['lr'] = args.lr * 0.5 * (1 + math.cos(math.pi * frac))
        d, grf = clouds['train'][step % len(clouds['train'])]
        t0, w0 = time.process_time(), time.perf_counter()
        opt.zero_grad()
        loss = F.mse_loss(model(d.x, d.edge_index, grf), d.y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.process_time() - t0)
        walls.append(time.perf_counter() - w0)
        losses.append(float(loss.detach()))
        step += 1
    train_s = time.process_time() - start
    val, _ = evaluate(model, clouds['val'])
    test, test_all = evaluate(model, clouds['test'])
    skip = 2 if len(times) > 4 else 0  # warm-up steps
    return dict(model=kind, seed=seed, size=size, params=n_params, grf_params=target,
                ffn_hidden=ffn, steps=step, train_s=train_s,
                s_per_step=statistics.median(times[skip:]),
                wall_s_per_step=statistics.median(walls[skip:]), val_mse=val, test_mse=test,
                test_mse_per_cloud=test_all, final_train_loss=statistics.mean(losses[-5:]),
                threads=torch.get_num_threads())


def dense_bytes(size, args):
    r"""Bytes of the float32 ``[H, N, N]`` attention matrices that a dense softmax layer keeps
    for the backward pass, over all layers."""
    return 4 * args.heads * size * size * args.layers


def mem_total():
    with open('/proc/meminfo') as fh:
        for line in fh:
            if line.startswith('MemTotal'):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


def table(args) -> str:
    import glob
    runs = []
    for path in sorted(glob.glob(osp.join(RUNS, '*.json'))):
        with open(path) as fh:
            runs.append(json.load(fh))
    sizes = sorted({r['size'] for r in runs if r.get('model')})
    infos = {r['size']: r for r in runs if r.get('kind') == 'data'}
    lines = ['| model | ' + ' | '.join(f'N = {s:,}: test MSE | s / step | steps' for s in sizes)
             + ' | s/step slope in N (log-log) | params |',
             '|---|' + '---|---|---|' * len(sizes) + '---|---|']
    for kind in MODELS:
        cells, pts, params = [], [], set()
        for s in sizes:
            rs = [r for r in runs if r.get('model') == kind and r['size'] == s]
            if not rs:
                cells.append('— | — | —')
                continue
            mse = [r['test_mse'] for r in rs]
            sd = f' ± {statistics.stdev(mse):.3f}' if len(mse) > 1 else ''
            sps = statistics.mean(r['s_per_step'] for r in rs)
            cells.append(f"{statistics.mean(mse):.3f}{sd} ({len(rs)}) | {sps:.3f} | "
                         f"{round(statistics.mean(r['steps'] for r in rs))}")
            pts.append((s, sps))
            params.update(r['params'] for r in rs)
        slope = '—'
        if len(pts) >= 2:
            lx = [math.log(s) for s, _ in pts]
            ly = [math.log(t) for _, t in pts]
            mx, my = statistics.mean(lx), statistics.mean(ly)
            slope = f"{sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx):.2f}"
        lines.append(f'| {kind} | ' + ' | '.join(cells) + f' | {slope} | '
                     f"{'/'.join(str(p) for p in sorted(params))} |")
    ram = mem_total()
    dense = ['| dense softmax | ' + ' | '.join(
        (f"OOM: {dense_bytes(s, args) / 2 ** 30:.0f} GiB of attention matrices "
         f"> {ram / 2 ** 30:.0f} GiB RAM | — | —") if dense_bytes(s, args) > ram else
        (f"not run: {dense_bytes(s, args) / 2 ** 30:.1f} GiB of attention matrices, "
         f"O(N²) | — | —") for s in sizes) + ' | 2 (O(N²)) | — |']
    lines += dense
    if isinstance(args.budget, dict):
        lines += ['', 'Budget per model (CPU s): ' + ', '.join(
            f'N = {int(k):,}: {v}' for k, v in sorted(args.budget.items(), key=lambda kv: int(kv[0])))
            + f'; at most {args.max_steps} steps.']
    data = ['', '| N | kNN edges / node | GRF entries / node | walks s / cloud | data s |',
            '|---|---|---|---|---|']
    for s in sizes:
        if s in infos:
            i = infos[s]
            data.append(f"| {s:,} | {i['edges_per_node']:.1f} | {i['grf_nnz_per_node']:.1f} | "
                        f"{i['grf_s_per_cloud']:.2f} | {i['gen_s']:.1f} |")
    return '\n'.join(lines + data)


def load_config(path):
    import yaml
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--config', default=None, help='YAML file with defaults for these options')
    p.add_argument('--sizes', type=int, nargs='+', default=[8192, 32768, 131072])
    p.add_argument('--models', nargs='+', default=list(MODELS), choices=MODELS)
    p.add_argument('--seeds', type=int, nargs='+', default=[0])
    p.add_argument('--budget', type=float, default=120.0,
                   help='seconds of training per model and size (the config may give a dict '
                        'size -> seconds)')
    p.add_argument('--max_steps', type=int, default=2000)
    p.add_argument('--lr', type=float, default=3e-3)
    p.add_argument('--hidden', type=int, default=32)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--layers', type=int, default=2)
    p.add_argument('--ffn_mult', type=int, default=2)
    p.add_argument('--graph_k', type=int, default=6)
    p.add_argument('--train_clouds', type=int, default=4)
    p.add_argument('--val_clouds', type=int, default=1)
    p.add_argument('--test_clouds', type=int, default=2)
    p.add_argument('--num_walks', type=int, default=16)
    p.add_argument('--p_halt', type=float, default=0.5)
    p.add_argument('--max_length', type=int, default=3)
    p.add_argument('--fixed_length', type=int, default=1)
    p.add_argument('--walker', default='repelling')
    p.add_argument('--walk_seed', type=int, default=0)
    p.add_argument('--grf_mode', default='asymmetric')
    p.add_argument('--f_init', type=float, default=0.5)
    p.add_argument('--backend', default='auto')
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--tag', default='', help='tuning runs: JSON in a subfolder of that name, no table')
    p.add_argument('--rerun', action='store_true', help='rerun finished runs')
    p.add_argument('--table_only', action='store_true')
    args, _ = p.parse_known_args(argv)
    if args.config:
        cfg = load_config(args.config)
        unknown = set(cfg) - set(vars(args))
        if unknown:
            raise ValueError(f"unknown keys in {args.config}: {sorted(unknown)}")
        p.set_defaults(**cfg)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = osp.join(RUNS, args.tag) if args.tag else RUNS  # tuning runs in their own folder
    os.makedirs(runs, exist_ok=True)
    if not args.table_only:
        for size in args.sizes:
            todo = [(k, s) for k in args.models for s in args.seeds
                    if args.rerun or not osp.exists(osp.join(runs, f'{size}_{k}_{s}.json'))]
            if not todo:
                continue
            clouds, info = load_clouds(size, args)
            with open(osp.join(runs, f'{size}_data.json'), 'w') as fh:
                json.dump(dict(kind='data', size=size, **info), fh)
            print(f'N={size}: {info}', flush=True)
            for kind, seed in todo:
                res = train(kind, seed, size, clouds, args)
                res['config'] = {k: v for k, v in vars(args).items() if k != 'budget'}
                res['budget'] = args.budget
                with open(osp.join(runs, f'{size}_{kind}_{seed}.json'), 'w') as fh:
                    json.dump(res, fh)
                print(json.dumps({k: v for k, v in res.items() if k != 'config'}), flush=True)
            del clouds
    if not args.tag:
        text = HEADER + '\n' + table(args) + '\n'
        with open(TABLE, 'w') as fh:
            fh.write(text)
        print(text)


if __name__ == '__main__':
    main()
