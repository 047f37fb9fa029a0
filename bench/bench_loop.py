r"""Whole training loops (DataLoader included) of 2-layer GPS models: GRF-GPS with its per-batch
work in the step against the same work done in the DataLoader worker
(:class:`pyg_grf.loader.DataLoader`), side by side with PyG's ``GPSConv`` (a script, not a
test).

``bench/bench_model.py`` times single steps on one fixed batch. Here every column trains for
whole epochs over the same list of graphs, each through a DataLoader with ``--workers`` worker
processes (one by default: the training step on one core, the loader on the other, as on a
2-core machine), and the figure is wall-clock ms per batch over an epoch: collation, waiting
for the loader, forward, backward and the ``Adam`` step. The models, graphs and walk loads are
``bench_model.py``'s (2 GPS blocks with a ``GINEConv`` local branch, 64 channels, 4 heads;
``AddGraphRandomFeatures(num_walks=16, p_halt=0.2, max_length=4)``). Columns:

* ``GINE x2``, ``GPS multihead``, ``GPS performer 4x16``: PyG's loader;
* ``GRF-GPS, prep in step``: PyG's loader; the step builds the batch's plan,
  ``model_payload(model, batch)`` (one :class:`~pyg_grf.nn.attention.grf.GRFPlan` for both GRF
  layers: the setting of ``bench_model.py``);
* ``GRF-GPS, prep in worker``: ``pyg_grf.loader.DataLoader(..., model=model)``: the worker
  builds the same plan as it collates the batch; the step's ``model_payload`` finds it there;
* the same two with ``global_beta=0.1``, and ``GRF-GPS linear`` (unmasked control).

Columns run round-robin, one epoch each per round, after one warm-up epoch (persistent workers,
so worker start-up is not timed). Ratios are medians of per-round ratios.

Usage::

    OMP_NUM_THREADS=1 python bench/bench_loop.py                 # experiments/results/bench_loop.*
    OMP_NUM_THREADS=1 python bench/bench_loop.py --quick         # smoke run, temp dir
"""
from __future__ import annotations

import os

os.environ.setdefault('OMP_NUM_THREADS', '1')

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / 'bench')):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_model import (  # noqa: E402
    GRF,
    GRF_BETA,
    GRF_COLUMNS,
    LIN,
    MHA,
    P16,
    TRANSFORM,
    Net,
    graph,
    molecule_like,
    quartiles,
)
from torch_geometric.loader import DataLoader as PyGDataLoader  # noqa: E402

from pyg_grf.loader import DataLoader  # noqa: E402
from pyg_grf.nn.attention.base import model_payload  # noqa: E402

IN_STEP, IN_WORKER = 'GRF-GPS, prep in step', 'GRF-GPS, prep in worker'
BETA_IN_STEP, BETA_IN_WORKER = ('GRF-GPS beta=0.1, prep in step',
                                'GRF-GPS beta=0.1, prep in worker')
COLUMNS = ('GINE x2', MHA, P16, IN_STEP, IN_WORKER, BETA_IN_STEP, BETA_IN_WORKER, LIN)
BLOCK = {IN_STEP: GRF, IN_WORKER: GRF, BETA_IN_STEP: GRF_BETA, BETA_IN_WORKER: GRF_BETA}
TARGETS = [(IN_WORKER, MHA, 0.8), (IN_WORKER, P16, 1.0), (BETA_IN_WORKER, MHA, 0.8),
           (BETA_IN_WORKER, P16, 1.0), (IN_STEP, MHA, 0.8), (IN_STEP, P16, 1.0)]


def make_graphs(num: int, lo: int, hi: int, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        out.append(graph(molecule_like(n, gen), n, gen))
    return out


def make_epoch(column: str, graphs: list, batch_size: int, workers: int):
    r"""One epoch of training of ``column`` over ``graphs``: a function returning the number of
    batches."""
    torch.manual_seed(0)
    model = Net(BLOCK.get(column, column), node_level=False).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    common = dict(batch_size=batch_size, shuffle=True, num_workers=workers,
                  persistent_workers=workers > 0,
                  generator=torch.Generator().manual_seed(0))
    if column in (IN_WORKER, BETA_IN_WORKER):
        loader = DataLoader(graphs, model=model, **common)
    else:
        loader = PyGDataLoader(graphs, **common)
    grf_model = BLOCK.get(column, column) in GRF_COLUMNS

    def epoch() -> int:
        n = 0
        for b in loader:
            opt.zero_grad(set_to_none=True)
            # the plan of the batch: the one the loader's worker left on it, if there
            grf = model_payload(model, b)['grf'] if grf_model else None
            out = model(b.x, b.edge_index, b.edge_attr, b.batch, grf=grf)
            F.binary_cross_entropy_with_logits(out, b.y).backward()
            opt.step()
            n += 1
        return n
    return epoch


def run(workloads: list, rounds: int, workers: int) -> dict:
    R = {}
    for name, desc, graphs, batch_size in workloads:
        print(f'{name}: {len(graphs)} graphs, batch {batch_size}', flush=True)
        epochs = {c: make_epoch(c, graphs, batch_size, workers) for c in COLUMNS}
        for fn in epochs.values():  # warm-up: workers started, allocator warm
            fn()
        times = {c: [] for c in COLUMNS}
        load = [os.getloadavg()[0]]
        for r in range(rounds):
            for c, fn in epochs.items():
                t = time.perf_counter()
                n = fn()
                times[c].append((time.perf_counter() - t) / n)
            print(f'  round {r + 1}: ' + ', '.join(f'{c} {times[c][-1] * 1e3:.0f}'
                                                   for c in COLUMNS), flush=True)
        load.append(os.getloadavg()[0])
        R[name] = {'desc': desc, 'graphs': len(graphs), 'batch_size': batch_size,
                   'times': times, 'loadavg': load}
    return R


def ratio(times: dict, col: str, base: str) -> tuple:
    return quartiles([a / b for a, b in zip(times[col], times[base])])


def to_markdown(R: dict) -> str:
    lines = ['# Whole training loops: the GRF payload prepared in the DataLoader worker', '',
             f"Wall-clock ms per batch over whole epochs (DataLoader with {R['workers']} "
             f"worker(s), forward, backward, `Adam`), median of {R['rounds']} round-robin rounds "
             f"after one warm-up epoch; training on {R['threads']} thread; {R['machine']}. "
             f"Command: `{R['command']}`. Models and loads as in `bench_model.md`. "
             f"{R['load_note']}", '']
    for name, w in R['workloads'].items():
        lines += [f"## {name}: {w['desc']}", '',
                  f"{w['graphs']} graphs, batches of {w['batch_size']}; load average "
                  f"{w['loadavg'][0]:.1f} at the start, {w['loadavg'][1]:.1f} at the end.", '',
                  '| column | ms / batch | / GPS multihead | / GPS performer 4x16 |',
                  '|---|---|---|---|']
        for c in COLUMNS:
            med = quartiles(w['times'][c])[0]
            lines.append(f"| {c} | {med * 1e3:.1f} | {ratio(w['times'], c, MHA)[0]:.2f} | "
                         f"{ratio(w['times'], c, P16)[0]:.2f} |")
        lines += ['', '| column | against | ratio (quartiles) | target | met |',
                  '|---|---|---|---|---|']
        for col, base, bound in TARGETS:
            r = ratio(w['times'], col, base)
            lines.append(f'| {col} | {base} | {r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f}) | <= {bound} '
                         f"| {'yes' if r[0] <= bound else 'no'} |")
        lines.append('')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--batches', type=int, default=8, help='batches per epoch')
    p.add_argument('--workers', type=int, default=1)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--quick', action='store_true', help='smoke run: tiny epochs, temp dir')
    p.add_argument('--load-note', default='')
    p.add_argument('--out', default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    nb = 2 if args.quick else args.batches
    workloads = [('lrgb', '64 molecule-like graphs of 120-180 nodes per batch (LRGB-sized)',
                  make_graphs(64 * nb, 120, 180, 0), 64),
                 ('tu', '128 molecule-like graphs of 20-40 nodes per batch (TU-sized)',
                  make_graphs(128 * nb, 20, 40, 1), 128)]
    if args.quick:
        workloads = [(n, d, g[:8 * nb], 8) for n, d, g, _ in workloads]
    rounds = 1 if args.quick else args.rounds
    R = {'command': f'OMP_NUM_THREADS={os.environ.get("OMP_NUM_THREADS")} python '
                    f'bench/bench_loop.py {shlex.join(argv or sys.argv[1:])}'.rstrip(),
         'workers': args.workers, 'rounds': rounds, 'threads': args.threads,
         'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores, '
                    f'torch {torch.__version__}', 'load_note': args.load_note,
         'transform': repr(TRANSFORM)}
    R['workloads'] = run(workloads, rounds, args.workers)
    out = Path(args.out) if args.out else (
        Path(tempfile.gettempdir()) / 'bench_loop_quick' if args.quick
        else ROOT / 'experiments' / 'results' / 'bench_loop')
    out.with_suffix('.json').write_text(json.dumps(R, indent=1))
    out.with_suffix('.md').write_text(to_markdown(R))
    print(to_markdown(R))


if __name__ == '__main__':
    main()
