r"""Mask-times-matrix timings of the FTFI mask operators against a dense product.

For every family (causal, Toeplitz, 2-D grid RPE, tree exp(a * dist + b), diffusion kernel on 2-D
grid graphs) and N = 2^12 ... 2^20 this times ``mask.matmul(X)`` for X of shape [N, 16] (median of
a few repeats; building the mask is timed separately and not included), next to a dense
``M @ X`` for N <= 2^14, and fits the log-log slope of time against N per family (1 = linear).

    python bench/bench_masks.py            # full run, writes experiments/results/bench_masks.*
    python bench/bench_masks.py --quick    # N up to 2^16, prints only (unless --out is given)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyg_grf.masks import CausalMask, DiffusionKernelMask, GridRPEMask, ToeplitzMask, TreeMask  # noqa: E402

C = 16


def grid_edges(side: int) -> torch.Tensor:
    idx = torch.arange(side * side).view(side, side)
    e = torch.cat([torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)]),
                   torch.stack([idx[:-1].reshape(-1), idx[1:].reshape(-1)])], dim=1)
    return torch.cat([e, e.flip(0)], dim=1)


def random_tree(n: int, gen: torch.Generator) -> torch.Tensor:
    # Random recursive tree: node i > 0 attaches to a uniform node in [0, i). Depth O(log n).
    child = torch.arange(1, n)
    parent = (torch.rand(n - 1, generator=gen, dtype=torch.float64) * child).long()
    return torch.stack([parent, child])


def build(family: str, N: int, gen: torch.Generator):
    r"""Returns (mask, actual N)."""
    if family == 'causal':
        return CausalMask(N), N
    if family == 'toeplitz':
        return ToeplitzMask(torch.randn(2 * N - 1, generator=gen)), N
    if family == 'grid2d':
        side = int(round(math.sqrt(N)))
        return GridRPEMask((side, side), torch.randn(2 * side - 1, generator=gen)), side * side
    if family == 'tree':
        return TreeMask(random_tree(N, gen), N, a=-0.5, b=0.1), N
    if family == 'diffusion':
        side = int(round(math.sqrt(N)))
        return DiffusionKernelMask(grid_edges(side), side * side, 1.0), side * side
    raise ValueError(family)


def timeit(fn, repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def slope(ns, ts) -> float:
    if len(ns) < 2:
        return float('nan')
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='N up to 2^16 (smoke run)')
    parser.add_argument('--max-log2', type=int, default=None)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--families', default='causal,toeplitz,grid2d,tree,diffusion')
    parser.add_argument('--append', action='store_true',
                        help='add this run to existing OUT.json / OUT.md instead of replacing them')
    parser.add_argument('--out', default=None,
                        help='output stem (default: experiments/results/bench_masks for a '
                             'full run)')
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    max_log2 = args.max_log2 or (16 if args.quick else 20)
    out = args.out or (None if args.quick else str(ROOT / 'experiments/results/bench_masks'))
    gen = torch.Generator().manual_seed(0)
    families = args.families.split(',')
    sizes = [2**k for k in range(12, max_log2 + 1)]
    rows = []

    for N in sizes:
        x = torch.randn(N, C, generator=gen)
        if N <= 2**14:
            dense = torch.randn(N, N, generator=gen)
            t = timeit(lambda: dense @ x, args.repeats)
            rows.append(dict(family='dense', N=N, matmul_s=t, build_s=None))
            print(f'dense      N={N:8d}  matmul {t * 1e3:9.3f} ms', flush=True)
            del dense
        for fam in families:
            t0 = time.perf_counter()
            mask, n = build(fam, N, gen)
            tb = time.perf_counter() - t0
            xn = x[:n] if n <= N else torch.randn(n, C, generator=gen)
            reps = args.repeats if N <= 2**16 else max(3, args.repeats // 2)
            t = timeit(lambda m=mask: m.matmul(xn), reps)
            extra = {}
            if fam == 'tree':
                extra['levels'] = len(mask.level_sizes)
            if fam == 'diffusion':
                extra['taylor_m_s'] = list(mask.taylor_parameters())
            rows.append(dict(family=fam, N=n, matmul_s=t, build_s=tb, **extra))
            print(f'{fam:10s} N={n:8d}  matmul {t * 1e3:9.3f} ms  build {tb * 1e3:9.1f} ms '
                  f'{extra if extra else ""}', flush=True)
            del mask

    fams = ['dense'] + families
    slopes = {}
    for fam in fams:
        r = [row for row in rows if row['family'] == fam]
        slopes[fam] = slope([row['N'] for row in r], [row['matmul_s'] for row in r])

    # Markdown table: one row per log2 N, one column per family (ms).
    lines = ['| log2 N | ' + ' | '.join(fams) + ' |', '|---' * (len(fams) + 1) + '|']
    for N in sizes:
        cells = []
        for fam in fams:
            r = [row for row in rows if row['family'] == fam and
                 abs(math.log2(row['N']) - math.log2(N)) < 0.5]
            cells.append(f"{r[0]['matmul_s'] * 1e3:.3f}" if r else '—')
        lines.append(f'| {int(math.log2(N))} | ' + ' | '.join(cells) + ' |')
    lines.append('| slope | ' + ' | '.join(f'{slopes[f]:.2f}' for f in fams) + ' |')
    load = os.getloadavg() if hasattr(os, 'getloadavg') else None
    header = (f'Mask-times-matrix time in ms (X: [N, {C}] float32, median of repeats, mask '
              f'construction excluded), torch {torch.__version__}, {args.threads} threads, '
              f'{platform.machine()}, load average at the end {load}. Grid and diffusion use '
              f'N = side^2 (side = round(sqrt(N)); the nearest square for odd log2 N); tree = '
              f'random recursive tree, exp(-0.5 dist + 0.1); diffusion = exp(-T), T = Laplacian of '
              f'the side x side 4-neighbour grid; dense = random [N, N] @ X. Slope = least-squares '
              f'slope of log time vs log N.')
    table = header + '\n\n' + '\n'.join(lines) + '\n'
    print()
    print(table)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        meta = dict(torch=torch.__version__, threads=args.threads, columns=C,
                    machine=platform.machine(), loadavg=load, quick=args.quick)
        run = dict(meta=meta, rows=rows, slopes=slopes)
        runs, md = [run], '# Mask operator benchmark\n\n' + table
        if args.append and os.path.exists(out + '.json'):
            with open(out + '.json') as fh:
                old = json.load(fh)
            runs = old.get('runs', [old]) + [run]
            with open(out + '.md') as fh:
                md = fh.read().rstrip('\n') + '\n\n' + table
        with open(out + '.json', 'w') as fh:
            json.dump(dict(runs=runs), fh, indent=1)
        with open(out + '.md', 'w') as fh:
            fh.write(md)
        print(f'wrote {out}.json and {out}.md')


if __name__ == '__main__':
    main()
