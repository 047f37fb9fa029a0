r"""GKAT against PyG's GATConv per layer, forward and backward, full graph, one thread, side by
side in one process (issue 31; FTFI paper, Table 3): 8 heads x 8 channels, the paper's
GAT-shaped layer (``project=False``): ``'linear'`` mode with each backend (``'sparse'``,
``'pairs'``) and ``'auto'``, and ``'softmax'`` mode (one message passing over the kernel pairs),
on CiteSeer and PubMed (Planetoid raw files from ``$PYG_GRF_MIRROR``; PyG's ``Planetoid`` on a
copy of them) and ``molecules`` (``gpu_check.py``'s batch of 128 molecule-like graphs of 120-180
nodes, one block-diagonal graph). RWGNK settings of ``citation_gkat.yaml`` (16 walks, length 2,
lambda 0.8).

The machine is shared, so the layers are timed in interleaved rounds (every layer once per round,
in a fresh order each round) and each figure is the median over rounds of the layer's time
divided by GATConv's time *in the same round*. Prints the table and writes
``experiments/results/bench_gkat.md``::

    OMP_NUM_THREADS=1 PYG_GRF_MIRROR=/work/shared/datasets PYG_GRF_DATA=$(mktemp -d) \
        python bench/bench_gkat.py
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import random
import shutil
import statistics
import sys
import tempfile
import time

import torch
from torch_geometric.datasets import Planetoid
from torch_geometric.nn import GATConv

from pyg_grf.nn import GKATAttention
from pyg_grf.transforms import AddRWGNKFeatures

RWGNK = dict(num_walks=16, lam=0.8, alpha=1.0, max_length=2, seed=0)
#: (mode, backend, cut): the softmax mode runs on the kernel pairs whatever the backend says;
#: ``cut``: the kernel cut at ``--threshold`` (the shipped recipes'), else the exact kernel
CASES = [('linear', 'sparse', False), ('linear', 'pairs', False), ('linear', 'auto', False),
         ('linear', 'auto', True), ('softmax', 'auto', True)]


def ran_on(layer: GKATAttention, plan) -> str:
    r"""What ``layer`` runs on ``plan`` (an :class:`~pyg_grf.nn.attention.gkat.RWGNKPlan`
    built for it): the GRF engine's backend of the linear mode, or the kernel pairs."""
    if layer.mode == 'softmax':
        return 'kernel pairs'
    return ','.join(sorted({p.backend for p in plan.grf.parts.values()}))


def load(name: str, root: str):
    r"""The dataset's graph (or the molecule batch) with RWGNK features."""
    if name == 'molecules':
        sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
        from gpu_check import molecule_batch
        return molecule_batch(128, 120, 180, 0, torch.device('cpu'), rwgnk=RWGNK)
    return AddRWGNKFeatures(**RWGNK)(planetoid(name, root))


def planetoid(name: str, root: str):
    raw = osp.join(os.environ.get('PYG_GRF_MIRROR', '/work/shared/datasets'), 'Planetoid', name,
                   'raw')
    shutil.copytree(raw, osp.join(root, name, 'raw'), dirs_exist_ok=True)
    return Planetoid(root, name)[0]


def once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(name, root, rounds, threshold, seed=0):
    data = load(name, root)
    f = data.num_features
    x = data.x.clone().requires_grad_()

    def fwd_bwd(call):
        return lambda: call(x).square().sum().backward()
    torch.manual_seed(0)
    gat = GATConv(f, 8, heads=8)
    calls = {'GATConv 8x8': fwd_bwd(lambda x: gat(x, data.edge_index))}
    # the projections alone: GATConv's one `lin` (F -> 64) and GKAT's stacked q, k, v of
    # 'linear' mode (F -> 192), to separate projection from attention in the ratios
    lin64, lin192 = (torch.nn.Linear(f, w, bias=False) for w in (64, 192))
    calls['Linear F->64 (GATConv lin)'] = fwd_bwd(lin64)
    calls['Linear F->192 (q, k, v)'] = fwd_bwd(lin192)
    chosen = {}
    for mode, backend, cut in CASES:
        label = f'GKAT {mode}' + (f' {backend}' if mode == 'linear' else '') \
            + (f', kernel cut at {threshold}' if cut and mode == 'linear' else '')
        layer = GKATAttention(f, heads=8, head_channels=8, mode=mode, backend=backend,
                              threshold=threshold if cut else 0.0,
                              project=False)  # not cut: the exact kernel (paper, Sec. 4.2)
        payload = layer.payload(data)  # full graph: the plan is built once, before the steps
        chosen[label] = ran_on(layer, payload['rwgnk'])
        calls[label] = fwd_bwd(lambda x, l=layer, p=payload: l(x, None, **p))
    for fn in calls.values():  # warm-up
        fn()
    times = {k: [] for k in calls}
    ratios = {k: [] for k in calls}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        t = {k: once(calls[k]) for k in order}
        for k in calls:
            times[k].append(t[k])
            ratios[k].append(t[k] / t['GATConv 8x8'])
    rows = {k: (statistics.median(times[k]), statistics.median(ratios[k]), min(ratios[k]),
                max(ratios[k])) for k in calls}
    return data, rows, chosen


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--datasets', nargs='+', default=['CiteSeer', 'PubMed'],
                   help="Planetoid names, or 'molecules'")
    p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--threshold', type=float, default=0.05)
    p.add_argument('--tune-malloc', action='store_true',
                   help='pyg_grf.utils.tune_malloc() first, as the pyg-grf command does')
    p.add_argument('--out', default=osp.join(osp.dirname(osp.abspath(__file__)), '..',
                                             'experiments', 'results', 'bench_gkat.md'))
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.tune_malloc:
        from pyg_grf.utils import tune_malloc
        tune_malloc()
    load_before = os.getloadavg()
    lines = ['| dataset | layer | ms (median) | ratio vs GATConv (median, min-max) | runs |',
             '|---|---|---|---|---|']
    with tempfile.TemporaryDirectory() as root:
        for name in args.datasets:
            data, rows, chosen = run(name, root, args.rounds, args.threshold)
            print(f'{name}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, '
                  f'Psi nnz {data.rwgnk_index.size(1)}', flush=True)
            for layer, (t, r, lo, hi) in rows.items():
                runs = chosen.get(layer, '')
                print(f'  {layer:27s} {1e3 * t:8.1f} ms  {r:5.2f}x ({lo:.2f}-{hi:.2f})  {runs}',
                      flush=True)
                lines.append(f'| {name} | {layer} | {1e3 * t:.1f} | {r:.2f} ({lo:.2f}-{hi:.2f})'
                             f' | {runs} |')
    load_after = os.getloadavg()
    if args.out:
        head = [
            '# GKAT vs GATConv per layer (forward + backward, one thread, CPU)', '',
            'Written by `bench/bench_gkat.py`; what the figures mean, the paper\'s Table 3 and '
            'the targets: [bench_gkat_notes.md](bench_gkat_notes.md).', '',
            'Command: `OMP_NUM_THREADS=1 PYG_GRF_MIRROR=/work/shared/datasets '
            'PYG_GRF_DATA=$(mktemp -d) python bench/bench_gkat.py '
            + ' '.join(sys.argv[1:]) + '`', '',
            f'torch {torch.__version__}, {os.cpu_count()} CPUs, one thread; load average '
            f'{load_before[0]:.2f} before and {load_after[0]:.2f} after the run (the machine is '
            'shared: absolute times are not comparable across runs, ratios are taken within '
            'each round). RWGNK ' + str(RWGNK) + f'; threshold {args.threshold} (softmax and the '
            f'cut linear row), 0 (the other linear rows: the exact kernel); 8 heads x 8, '
            f'project=False; {args.rounds} interleaved rounds in shuffled order; "runs": the '
            'backend the layer ran; allocator: '
            + ('tuned (`tune_malloc`, as `pyg-grf` runs)' if args.tune_malloc else
               "glibc's default") + '.', '']
        with open(args.out, 'w') as fh:
            fh.write('\n'.join(head + lines) + '\n')


if __name__ == '__main__':
    main()
