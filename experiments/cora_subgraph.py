r"""Cora with precomputed GRFs: full-graph training vs training through a subgraph loader.

One small GRF model (input MLP, one or more :class:`~pyg_grf.nn.GRFAttention` layers, a linear
head) trained three ways on the public Planetoid split (140 / 500 / 1000 nodes):

* ``full``: one step per epoch on the whole graph, with one :class:`~pyg_grf.features.GRFLoads`
  built once and reused for every step;
* ``restrict``: :class:`~torch_geometric.loader.RandomNodeLoader` (``--parts`` random node
  parts, reshuffled every epoch), one step per part, with the full graph's walks (drawn once)
  restricted to each part by :class:`~pyg_grf.transforms.RestrictGraphRandomFeatures`;
* ``recompute``: the same loader, with fresh walks drawn on every part by
  :class:`~pyg_grf.transforms.AddGraphRandomFeatures` (walks cut at the part's boundary).

Evaluation is always on the full graph with the full graph's walks (model selection on the
validation accuracy, test accuracy at the selected epoch). Writes one JSON per (mode, seed)
under ``experiments/results/runs/cora_subgraph/`` (git-ignored) and rebuilds the table
``experiments/results/cora_subgraph.md``::

    OMP_NUM_THREADS=1 taskset -c 1 python experiments/cora_subgraph.py --modes full restrict \
        recompute --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import os.path as osp
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from pyg_grf.features import GRFLoads  # noqa: E402
from pyg_grf.nn import GRFAttention  # noqa: E402
from pyg_grf.transforms import (  # noqa: E402
    AddGraphRandomFeatures,
    RestrictGraphRandomFeatures,
)

RUNS = osp.join(REPO, 'experiments', 'results', 'runs', 'cora_subgraph')
TABLE = osp.join(REPO, 'experiments', 'results', 'cora_subgraph.md')
MODES = ('full', 'restrict', 'recompute')


def load(name: str = 'Cora'):
    mirror = osp.join(osp.dirname(REPO), 'shared', 'datasets')
    if 'PYG_GRF_MIRROR' not in os.environ and osp.isdir(mirror):
        os.environ['PYG_GRF_MIRROR'] = mirror
    os.environ.setdefault('PYG_GRF_DATA', tempfile.mkdtemp(prefix='pyg_grf_data_'))
    from torch_geometric.transforms import NormalizeFeatures

    from pyg_grf.datasets.planetoid import load_planetoid
    return load_planetoid(name, transform=NormalizeFeatures())[0]


class GRFNodeModel(nn.Module):
    r"""Input MLP, :obj:`num_layers` residual GRF attention layers, linear head."""
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 heads: int = 4, max_length: int = 3, num_layers: int = 1,
                 dropout: float = 0.5, backend: str = 'auto'):
        super().__init__()
        self.dropout = dropout
        self.lin_in = nn.Linear(in_channels, hidden_channels)
        self.attns = nn.ModuleList(GRFAttention(hidden_channels, heads=heads,
                                                max_length=max_length, backend=backend)
                                   for _ in range(num_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_channels) for _ in range(num_layers))
        self.lin_out = nn.Linear(hidden_channels, out_channels)

    def forward(self, x, grf: GRFLoads):
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.lin_in(x))
        for attn, norm in zip(self.attns, self.norms):
            h = F.dropout(x, self.dropout, self.training)
            x = norm(x + attn(h, grf=grf))
        return self.lin_out(F.dropout(x, self.dropout, self.training))


def grf_transform(args, seed):
    return AddGraphRandomFeatures(num_walks=args.num_walks, p_halt=args.p_halt,
                                  max_length=args.max_length, seed=seed)


def run(args, mode: str, seed: int, data) -> dict:
    from torch_geometric.loader import RandomNodeLoader

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    full = grf_transform(args, seed)(data)
    full.n_id = torch.arange(full.num_nodes)
    prep_s = time.perf_counter() - t0
    full_grf = GRFLoads.from_data(full)  # one payload for all full-graph steps and evaluations

    model = GRFNodeModel(data.num_features, args.hidden, int(data.y.max()) + 1,
                         heads=args.heads, max_length=args.max_length,
                         num_layers=args.layers, dropout=args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    restrict = RestrictGraphRandomFeatures(full)
    fresh = AddGraphRandomFeatures(num_walks=args.num_walks, p_halt=args.p_halt,
                                   max_length=args.max_length)  # global RNG: new walks each time

    def batches():
        if mode == 'full':
            yield full, full_grf
            return
        # RandomNodeLoader slices every node attribute, 'n_id' included; the loads are
        # replaced per part (restricted, or drawn afresh on the part).
        base = full if mode == 'restrict' else data.clone()
        if mode == 'recompute':
            base.n_id = torch.arange(base.num_nodes)
        for part in RandomNodeLoader(base, num_parts=args.parts, shuffle=True):
            part = restrict(part) if mode == 'restrict' else fresh(part)
            yield part, GRFLoads.from_data(part)

    best = dict(val=-1., test=0., epoch=-1)
    epoch_times = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        for part, grf in batches():
            if int(part.train_mask.sum()) == 0:
                continue
            opt.zero_grad()
            out = model(part.x, grf)
            loss = F.cross_entropy(out[part.train_mask], part.y[part.train_mask])
            loss.backward()
            opt.step()
        epoch_times.append(time.perf_counter() - t0)
        model.eval()
        with torch.no_grad():
            pred = model(full.x, full_grf).argmax(-1)
        acc = {s: float((pred[full[f'{s}_mask']] == full.y[full[f'{s}_mask']]).float().mean())
               for s in ('val', 'test')}
        if acc['val'] > best['val']:
            best = dict(val=acc['val'], test=acc['test'], epoch=epoch)
    return dict(mode=mode, seed=seed, parts=args.parts if mode != 'full' else 1,
                val=best['val'], test=best['test'], best_epoch=best['epoch'],
                epochs=args.epochs, s_per_epoch=statistics.median(epoch_times),
                grf_prep_s=prep_s, threads=torch.get_num_threads(),
                settings={k: v for k, v in vars(args).items() if k not in ('modes', 'seeds')})


def table() -> str:
    rows = {}
    for path in sorted(glob.glob(osp.join(RUNS, '*.json'))):
        with open(path) as fh:
            r = json.load(fh)
        rows.setdefault((r['mode'], r['parts'], r['epochs']), []).append(r)
    lines = ['| mode | parts (steps / epoch) | epochs | test accuracy (%) | per seed '
             '| val accuracy (%) | best epochs | s / epoch |',
             '|---|---|---|---|---|---|---|---|']
    for (mode, parts, epochs), rs in sorted(rows.items(), key=lambda kv: (
            MODES.index(kv[0][0]), kv[0][1], kv[0][2])):
        rs = sorted(rs, key=lambda r: r['seed'])
        t = [100 * r['test'] for r in rs]
        v = [100 * r['val'] for r in rs]
        sd = statistics.stdev(t) if len(t) > 1 else 0.
        lines.append(f"| {mode} | {parts} | {epochs} | {statistics.mean(t):.1f} ± {sd:.1f} | "
                     f"{' / '.join(f'{x:.1f}' for x in t)} | {statistics.mean(v):.1f} | "
                     f"{' / '.join(str(r['best_epoch']) for r in rs)} | "
                     f"{statistics.median(r['s_per_epoch'] for r in rs):.3f} |")
    return '\n'.join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--parts', type=int, default=4)
    p.add_argument('--epochs', type=int, default=100)
    p.add_argument('--hidden', type=int, default=64)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--layers', type=int, default=2)
    p.add_argument('--dropout', type=float, default=0.6)
    p.add_argument('--lr', type=float, default=0.005)
    p.add_argument('--weight_decay', type=float, default=5e-4)
    p.add_argument('--num_walks', type=int, default=32)
    p.add_argument('--p_halt', type=float, default=0.3)
    p.add_argument('--max_length', type=int, default=3)
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = load('Cora')
    os.makedirs(RUNS, exist_ok=True)
    for mode in args.modes:
        for seed in args.seeds:
            r = run(args, mode, seed, data)
            print(json.dumps({k: v for k, v in r.items() if k != 'settings'}), flush=True)
            name = f'{mode}_p{r["parts"]}_e{args.epochs}_s{seed}.json'
            with open(osp.join(RUNS, name), 'w') as fh:
                json.dump(r, fh, indent=1)
    print(table())


if __name__ == '__main__':
    main()
