r"""Benchmark: SAMSA sampling attention vs. full softmax attention (both through
``torch.nn.functional.scaled_dot_product_attention``), forward + backward, one graph of
``n`` tokens, fixed ``k`` (SAMSA paper, paper 004, Sec. 4.5: O(n k d) vs O(n^2 d)).

    python bench/bench_samsa.py            # n = 1k .. 64k
    python bench/bench_samsa.py --quick    # n = 1k .. 8k, one repetition

Writes ``experiments/results/bench_samsa.{json,md}`` (``--out`` to change) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn import Linear

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pyg_grf.nn.attention.samsa import SAMSAAttention  # noqa: E402


class FullAttention(torch.nn.Module):
    r"""Full multi-head softmax attention with the same projections as SAMSA."""
    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = Linear(channels, channels)
        self.to_kv = Linear(channels, 2 * channels)
        self.to_out = Linear(channels, channels)

    def forward(self, x):
        N, C = x.shape
        H, D = self.heads, C // self.heads
        q = self.to_q(x).view(N, H, D).transpose(0, 1)
        k, v = self.to_kv(x).view(N, H, 2 * D).transpose(0, 1).split(D, dim=-1)
        out = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
        return self.to_out(out[0].transpose(0, 1).reshape(N, C))


def time_fwd_bwd(module, n, channels, reps, min_time=3.0, max_reps=20):
    r"""Minimum over at least :obj:`reps` timed forward+backward runs (after a warm-up), with
    more runs (up to :obj:`max_reps`) until :obj:`min_time` seconds were spent: the minimum is the
    most robust statistic on a machine shared with other jobs."""
    x = torch.randn(n, channels, requires_grad=True)
    times, spent, i = [], 0.0, 0
    while i <= reps or (spent < min_time and i <= max_reps):
        module.zero_grad(set_to_none=True)
        x.grad = None
        t0 = time.perf_counter()
        module(x).square().mean().backward()
        dt = time.perf_counter() - t0
        if i > 0:  # the first run is a warm-up
            times.append(dt)
            spent += dt
        i += 1
    return min(times)


def slope(ns, ts):
    if len(ns) < 2:
        return float('nan')
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='n up to 8k, one repetition')
    parser.add_argument('--channels', type=int, default=64)
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--num-samples', type=int, default=128)
    parser.add_argument('--mode', default='hard', choices=['hard', 'soft'])
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--reps', type=int, default=5,
                        help='at least this many timed runs (more while under 3 s); min is kept')
    parser.add_argument('--full-budget', type=float, default=30.0,
                        help='skip full attention when its predicted time (s) exceeds this')
    parser.add_argument('--full-max-n', type=int, default=32768,
                        help='never run full attention above this n (memory)')
    parser.add_argument('--out', default=str(REPO / 'experiments' / 'results' / 'bench_samsa'))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ns = [1024 * 2**i for i in range(4 if args.quick else 7)]
    reps = 1 if args.quick else args.reps

    samsa = SAMSAAttention(args.channels, heads=args.heads, num_samples=args.num_samples,
                           mode=args.mode).train()
    full = FullAttention(args.channels, args.heads).train()

    load_before = os.getloadavg()[0] if hasattr(os, 'getloadavg') else None
    rows, last_full = [], None
    for n in ns:
        t_samsa = time_fwd_bwd(samsa, n, args.channels, reps)
        t_full = None
        predicted = None if last_full is None else last_full[1] * (n / last_full[0])**2
        if n <= args.full_max_n and (predicted is None or predicted <= args.full_budget):
            t_full = time_fwd_bwd(full, n, args.channels, reps)
            last_full = (n, t_full)
        ratio = None if t_full is None else t_full / t_samsa
        rows.append(dict(n=n, samsa_s=t_samsa, full_s=t_full, speedup=ratio))
        print(f'n={n:6d}  samsa {t_samsa * 1e3:9.1f} ms  full '
              f'{"-" if t_full is None else f"{t_full * 1e3:9.1f} ms"}', flush=True)

    s_ns = [r['n'] for r in rows]
    s_samsa = slope(s_ns, [r['samsa_s'] for r in rows])
    f_rows = [r for r in rows if r['full_s'] is not None]
    s_full = slope([r['n'] for r in f_rows], [r['full_s'] for r in f_rows])
    # slope on the large-n half, where fixed overheads no longer dominate
    big = [r for r in rows if r['n'] >= 4096]
    s_samsa_big = slope([r['n'] for r in big], [r['samsa_s'] for r in big])
    f_big = [r for r in f_rows if r['n'] >= 4096]
    s_full_big = slope([r['n'] for r in f_big], [r['full_s'] for r in f_big])

    settings = dict(channels=args.channels, heads=args.heads, num_samples=args.num_samples,
                    num_support=samsa.num_support, mode=args.mode, threads=args.threads,
                    reps=reps, pass_='forward+backward (train mode)', dtype='float32',
                    torch=torch.__version__, cpu=platform.processor() or platform.machine(),
                    cpu_count=os.cpu_count(), loadavg_1min_at_start=load_before)
    result = dict(settings=settings, rows=rows, loglog_slope=dict(
        samsa=s_samsa, full=s_full, samsa_n_ge_4096=s_samsa_big, full_n_ge_4096=s_full_big))

    cmd = ''.join(' ' + a for a in (sys.argv[1:] if argv is None else argv) if a)

    def fmt(t):
        return '-' if t is None else f'{t * 1e3:.1f}'

    lines = [
        '# SAMSA vs full attention: forward + backward time (CPU)',
        '',
        f'One graph of n tokens, channels={args.channels}, heads={args.heads}, '
        f'k={args.num_samples} ({samsa.num_support} support tokens), mode={args.mode!r}, '
        f'torch.set_num_threads({args.threads}), min of >= {reps} runs after a warm-up, '
        f'torch {torch.__version__}, on {os.cpu_count()} CPU cores '
        f'(1-min load average {load_before:.1f} at start'
        + (': other jobs shared the cores, expect noise' if load_before > os.cpu_count() else '')
        + '). '
        f'Both use `scaled_dot_product_attention`; full attention is skipped where its '
        f'predicted time exceeds {args.full_budget:.0f} s or n > {args.full_max_n}. '
        f'Generated by `python bench/bench_samsa.py{cmd}`.',
        '',
        '| n | SAMSA (ms) | full SDPA (ms) | full / SAMSA |',
        '|---:|---:|---:|---:|',
    ]
    for r in rows:
        ratio = '-' if r['speedup'] is None else f"{r['speedup']:.2f}x"
        lines.append(f"| {r['n']} | {fmt(r['samsa_s'])} | {fmt(r['full_s'])} | {ratio} |")
    lines += [
        '',
        f'Fitted log-log slope (time ~ n^s): SAMSA s = {s_samsa:.2f} '
        f'(n >= 4096: {s_samsa_big:.2f}); full s = {s_full:.2f} '
        f'(n >= 4096: {s_full_big:.2f}).',
        '',
    ]
    md = '\n'.join(lines)
    print()
    print(md)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix('.json').write_text(json.dumps(result, indent=2))
    out.with_suffix('.md').write_text(md)
    print(f'wrote {out.with_suffix(".json")} and {out.with_suffix(".md")}')
    return result


if __name__ == '__main__':
    main()
