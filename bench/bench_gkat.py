r"""GKAT against PyG's GATConv per layer, forward and backward, full graph, one thread, side by
side in one process (issue 31; FTFI paper, Table 3): 8 heads x 8 channels, the paper's
GAT-shaped layer (``project=False``), every backend of each mode and ``'auto'``, on CiteSeer and
PubMed (Planetoid raw files from ``$PYG_GRF_MIRROR``; PyG's ``Planetoid`` on a copy of them).
RWGNK settings of ``citation_gkat.yaml`` (16 walks, length 2, lambda 0.8). Prints the table and
writes ``experiments/results/bench_gkat.md``::

    OMP_NUM_THREADS=1 PYG_GRF_MIRROR=/work/shared/datasets python bench/bench_gkat.py
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
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
CASES = [('linear', 'sparse'), ('linear', 'pairs'), ('linear', 'auto'), ('softmax', 'pairs'),
         ('softmax', 'auto')]


def planetoid(name: str, root: str):
    raw = osp.join(os.environ.get('PYG_GRF_MIRROR', '/work/shared/datasets'), 'Planetoid', name,
                   'raw')
    shutil.copytree(raw, osp.join(root, name, 'raw'), dirs_exist_ok=True)
    return Planetoid(root, name)[0]


def timed(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run(name, root, repeats, threshold):
    data = AddRWGNKFeatures(**RWGNK)(planetoid(name, root))
    f = data.num_features
    x = data.x.clone().requires_grad_()

    def fwd_bwd(call):
        return lambda: call(x).square().sum().backward()
    torch.manual_seed(0)
    gat = GATConv(f, 8, heads=8)
    rows = {'GATConv 8x8': timed(fwd_bwd(lambda x: gat(x, data.edge_index)), repeats)}
    chosen = {}
    for mode, backend in CASES:
        layer = GKATAttention(f, heads=8, head_channels=8, mode=mode, backend=backend,
                              threshold=threshold if mode == 'softmax' else 0.0,
                              project=False)  # 'linear': the exact kernel (paper, Sec. 4.2)
        payload = layer.payload(data)  # full graph: the plan is built once, before the steps
        chosen[(mode, backend)] = layer.backend_for(payload['rwgnk'])
        rows[f'GKAT {mode} {backend}'] = timed(
            fwd_bwd(lambda x, l=layer, p=payload: l(x, None, **p)), repeats)
    return data, rows, chosen


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--datasets', nargs='+', default=['CiteSeer', 'PubMed'])
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--threshold', type=float, default=0.05)
    args = p.parse_args()
    torch.set_num_threads(1)
    lines = ['# GKAT vs GATConv per layer (forward + backward, one thread, CPU)', '',
             'Command: `OMP_NUM_THREADS=1 PYG_GRF_MIRROR=/work/shared/datasets python '
             'bench/bench_gkat.py ' + ' '.join(sys.argv[1:]) + '`', '',
             f'RWGNK {RWGNK}; threshold {args.threshold} (softmax), 0 (linear); 8 heads x 8, project=False; '
             'median of the repeats; ratio = time / GATConv time.', '',
             '| dataset | layer | ms | ratio vs GATConv | auto chose |', '|---|---|---|---|---|']
    with tempfile.TemporaryDirectory() as root:
        for name in args.datasets:
            data, rows, chosen = run(name, root, args.repeats, args.threshold)
            base = rows['GATConv 8x8']
            print(f'{name}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, '
                  f'Psi nnz {data.rwgnk_index.size(1)}')
            for layer, t in rows.items():
                key = tuple(layer.split()[1:]) if layer.startswith('GKAT') else None
                auto = chosen.get(key, '') if key and key[1] == 'auto' else ''
                print(f'  {layer:22s} {1e3 * t:8.1f} ms  {t / base:5.2f}x  {auto}')
                lines.append(f'| {name} | {layer} | {1e3 * t:.1f} | {t / base:.2f} | {auto} |')
    out = osp.join(osp.dirname(osp.abspath(__file__)), '..', 'experiments', 'results',
                   'bench_gkat.md')
    with open(out, 'w') as fh:
        fh.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
