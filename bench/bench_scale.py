r"""GRF attention at scale against PyG's ``PerformerAttention`` on kNN graphs.

One attention layer (4 heads x 16 channels, 64 in / out), forward and backward, one thread, on
k-nearest-neighbour graphs (k = 8, symmetrised) of random points in the unit square, from 4k to
1M nodes. Each (method, size) runs in a fresh process, so that its peak RSS is its own, and the
methods take turns over ``--rounds`` rounds (grf, performer, linear, grf, ...), so that a drift
of the machine between processes reaches every method alike:

* ``grf``: :class:`~pyg_grf.nn.GRFAttention` (``backend='auto'``), called as documented,
  ``attn(x, batch, **attn.payload(data))``, walks of ``AddGraphRandomFeatures()`` (16 walks,
  ``p_halt=0.5``, ``max_length=4``, drawn before the timing); the plan is built once per graph
  (its time is reported apart, and inside the first call);
* ``performer``: PyG's ``PerformerAttention(64, heads=4, head_channels=16)`` on ``x[None]``;
* ``linear``: unmasked linear attention (``pyg_grf`` registry ``'linear'``), the same width.

Reported per row: the plan time (GRF), the first call (plan + forward + backward), the median
of the later forward + backward calls, the peak RSS above the process's RSS before the first
call (``VmHWM`` after ``clear_refs``), each the median over the rounds, and the ratios to
Performer as the median (and range) over the rounds of the ratio within a round.

    OMP_NUM_THREADS=1 python bench/bench_scale.py --sizes 4096,65536,262144,1048576 \
        --out experiments/results/bench_scale.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grf import _proc_status as _status  # noqa: E402  (VmRSS, VmHWM in MiB)
from bench_grf import _reset_peak  # noqa: E402

METHODS = ('grf', 'performer', 'linear')


def knn_data(N: int, k: int = 8, seed: int = 0):
    import numpy as np
    import torch
    from scipy.spatial import cKDTree
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected
    pts = np.random.default_rng(seed).random((N, 2))
    _, nb = cKDTree(pts).query(pts, k=k + 1)
    src = np.repeat(np.arange(N), k)
    ei = torch.from_numpy(np.stack([src, nb[:, 1:].reshape(-1)])).long()
    return Data(edge_index=to_undirected(ei, num_nodes=N), num_nodes=N)


def worker(method: str, N: int, repeats: int, data_file: str) -> dict:
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.load(data_file, weights_only=False)
    x = torch.randn(N, 64, requires_grad=True)
    if method == 'performer':
        from torch_geometric.nn.attention import PerformerAttention
        attn = PerformerAttention(64, heads=4, head_channels=16)

        def call(payload):
            return attn(x.unsqueeze(0))[0]
        plan = dict  # no payload
    else:
        from pyg_grf.nn.attention import attention_resolver
        attn = attention_resolver('grf' if method == 'grf' else 'linear', 64, heads=4)

        def call(payload):
            return attn(x, None, **payload)

        def plan():
            return attn.payload(data)
    rss0 = _status()['VmRSS']
    _reset_peak()
    t0 = time.perf_counter()
    payload = plan()
    t1 = time.perf_counter()
    call(payload).sum().backward()
    t2 = time.perf_counter()
    peak = _status()['VmHWM'] - rss0
    times = []
    for _ in range(repeats):
        x.grad = None
        t = time.perf_counter()
        call(payload).sum().backward()
        times.append(time.perf_counter() - t)
    times.sort()
    res = {'method': method, 'N': N, 'plan_s': t1 - t0, 'first_s': t2 - t0,
           'step_s': times[len(times) // 2], 'peak_mib': peak, 'rss0_mib': rss0}
    if method == 'grf':
        grf = payload['grf']
        res['backend'] = sorted({p.backend for p in grf.parts.values()})
        res['plan_mib'] = sum(grf.nbytes().values()) / 2 ** 20
    return res


def run(sizes, methods, repeats: int, timeout: float, rounds: int = 1) -> list:
    import tempfile

    import torch

    from pyg_grf.transforms import AddGraphRandomFeatures
    rows = []
    for N in sizes:
        t = time.perf_counter()
        data = AddGraphRandomFeatures(seed=0)(knn_data(N))
        prep = time.perf_counter() - t
        with tempfile.NamedTemporaryFile(suffix='.pt', delete=False) as fh:
            path = fh.name
        torch.save(data, path)
        print(f'# N={N}: kNN graph + walks {prep:.1f} s, {data.grf_index.size(1)} walk entries',
              file=sys.stderr, flush=True)
        try:
            for rnd, method in ((r, m) for r in range(rounds) for m in methods):
                cmd = [sys.executable, __file__, '--worker', method, str(N), str(repeats), path]
                env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
                           PYTHONWARNINGS='ignore')
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                       env=env, cwd=ROOT)
                    out = p.stdout.strip().splitlines()
                    res = json.loads(out[-1]) if p.returncode == 0 and out else {
                        'method': method, 'N': N,
                        'status': f'failed ({p.returncode}): {p.stderr.strip()[-300:]}'}
                except subprocess.TimeoutExpired:
                    res = {'method': method, 'N': N, 'status': f'timeout (> {timeout:.0f} s)'}
                res['round'] = rnd
                print(json.dumps(res), file=sys.stderr, flush=True)
                rows.append(res)
        finally:
            os.unlink(path)
    return rows


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def to_markdown(rows, argv) -> str:
    sizes = sorted({r['N'] for r in rows})
    lines = ['# GRF attention at scale vs PyG PerformerAttention (kNN graphs, k = 8)', '',
             f'`OMP_NUM_THREADS=1 python bench/bench_scale.py {" ".join(argv)}`', '',
             f'{time.strftime("%Y-%m-%d %H:%M")}; one thread; 4 heads x 16; forward + backward; '
             f'load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores. '
             f'Times and peaks: medians over the rounds; ratios: median [min - max] over the '
             f'rounds of the ratio within a round.', '',
             '| N | method | rounds | backend | plan s | first call s | fwd+bwd s | peak RSS MiB | '
             'plan MiB | time / Performer | peak / Performer |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for N in sizes:
        perf = {r.get('round', 0): r for r in rows
                if r['N'] == N and r['method'] == 'performer' and 'step_s' in r}
        for m in METHODS:
            mine = [r for r in rows if r['N'] == N and r['method'] == m]
            ok = [r for r in mine if 'status' not in r]
            if not ok:
                if mine:
                    lines.append(f'| {N} | {m} | | | {mine[-1]["status"]} | | | | | | |')
                continue
            med = {k: _median([r[k] for r in ok]) for k in ('plan_s', 'first_s', 'step_s',
                                                             'peak_mib')}
            ratios = {}
            for key in ('step_s', 'peak_mib'):
                within = sorted(r[key] / perf[r.get('round', 0)][key] for r in ok
                                if r.get('round', 0) in perf)
                ratios[key] = (f'{_median(within):.2f}x [{within[0]:.2f} - {within[-1]:.2f}]'
                               if len(within) > 1 else
                               f'{within[0]:.2f}x' if within else '')
            lines.append(f'| {N} | {m} | {len(ok)} | {",".join(ok[0].get("backend", []))} | '
                         f'{med["plan_s"]:.2f} | {med["first_s"]:.2f} | {med["step_s"]:.3f} | '
                         f'{med["peak_mib"]:.0f} | {ok[0].get("plan_mib", 0):.0f} | '
                         f'{ratios["step_s"]} | {ratios["peak_mib"]} |')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--worker']:
        method, N, repeats, path = argv[1], int(argv[2]), int(argv[3]), argv[4]
        print(json.dumps(worker(method, N, repeats, path)))
        return
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--sizes', default='4096,65536,262144,1048576')
    ap.add_argument('--methods', default=','.join(METHODS))
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--timeout', type=float, default=1800)
    ap.add_argument('--rounds', type=int, default=3,
                    help='turns of every method per size (fresh processes, interleaved)')
    ap.add_argument('--out', default=None, help='markdown file (also <out>.json)')
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(',')]
    rows = run(sizes, args.methods.split(','), args.repeats, args.timeout, args.rounds)
    md = to_markdown(rows, argv)
    print(md)
    if args.out:
        Path(args.out).write_text(md)
        Path(args.out).with_suffix('.json').write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
    main()
