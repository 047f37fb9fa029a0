r"""Benchmark of GRF-masked linear attention on 2-D grid graphs (a script, not a test).

What it measures, on 4-neighbour grids (no self-loops) of N = 64^2 ... 1024^2 nodes:

1. forward+backward time (median of ``--repeats`` runs after one warm-up) and peak memory of one
   attention layer: ``GRFAttention`` (symmetric and asymmetric), unmasked linear attention
   (``LinearAttention``), PyG ``GATConv`` and dense softmax attention
   (``F.scaled_dot_product_attention`` over all N nodes, only where N is small); the GRF loads are
   a ``pre_transform`` (``AddGraphRandomFeatures``), timed separately;
2. throughput of the walk sampler ``sample_walks`` (iid / antithetic / repelling);
3. a ``torch.profiler`` breakdown of ``GRFAttention`` forward+backward.

Every (method, N) runs in a fresh child process (forked from a ``multiprocessing`` forkserver that
imported torch, PyG and pyg_grf once), so that memory numbers do not mix:

* ``fwd+bwd peak``: the process's peak RSS while running the timed forward+backward passes minus
  its RSS just before them (the peak is reset through ``/proc/self/clear_refs``): the working
  memory of the layer, excluding inputs, features and parameters;
* ``process peak``: the child's peak RSS over its lifetime minus its RSS at start (after the
  imports): includes graph, features, inputs and parameters.

Usage::

    python bench/bench_grf.py                 # full run (writes experiments/results/bench_grf.*)
    python bench/bench_grf.py --quick         # N <= 16k, 1 repeat (< 1 min on a quiet machine)
    python bench/bench_grf.py --sizes 4096,65536 --repeats 5 --threads 2
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METHODS = ('grf_sym', 'grf_asym', 'linear', 'gat', 'softmax')
RUN_ORDER = ('gat', 'linear', 'grf_asym', 'grf_sym', 'softmax')
LABELS = {
    'grf_sym': 'GRF (symmetric)',
    'grf_asym': 'GRF (asymmetric)',
    'linear': 'unmasked linear',
    'gat': 'GATConv',
    'softmax': 'dense softmax (SDPA)',
}
# glibc malloc serves every tensor above 32 MiB by a fresh mmap and unmaps it on free, so each
# large temporary pays first-touch page faults (expensive in VMs). With --malloc-tuned the workers
# keep freed memory in the heap instead (same peak RSS, which is then not returned to the OS).
MALLOC_TUNED_ENV = {'MALLOC_MMAP_MAX_': '0', 'MALLOC_TRIM_THRESHOLD_': str(2 ** 40)}
FULL_SIZES = (4096, 16384, 65536, 262144, 1048576)
QUICK_SIZES = (4096, 16384)
WALKERS = ('iid', 'antithetic', 'repelling')


# ----------------------------------------------------------------------------------------------
# helpers shared by the driver and the workers
# ----------------------------------------------------------------------------------------------

def grid_edge_index(side: int):
    r"""4-neighbour ``side x side`` grid, both directions, no self-loops, sorted by (src, dst)
    (row-major node ids). Vectorised."""
    import torch
    idx = torch.arange(side * side).view(side, side)
    right = torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)])
    down = torch.stack([idx[:-1, :].reshape(-1), idx[1:, :].reshape(-1)])
    e = torch.cat([right, down], dim=1)
    e = torch.cat([e, e.flip(0)], dim=1)
    N = side * side
    return e[:, torch.argsort(e[0] * N + e[1])].contiguous()


def _proc_status():
    out = {}
    with open('/proc/self/status') as fh:
        for line in fh:
            if line.startswith(('VmRSS', 'VmHWM')):
                k, v = line.split(':')
                out[k] = int(v.split()[0]) / 1024.0  # MiB
    return out


def _reset_peak() -> bool:
    try:
        with open('/proc/self/clear_refs', 'w') as fh:
            fh.write('5')
        return True
    except OSError:
        return False


def _side(N: int) -> int:
    s = int(round(math.sqrt(N)))
    if s * s != N:
        raise SystemExit(f'--sizes: {N} is not a perfect square (grids are side x side)')
    return s


# ----------------------------------------------------------------------------------------------
# workers (run in subprocesses)
# ----------------------------------------------------------------------------------------------

def _setup_torch(threads: int):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    import torch_geometric  # noqa: F401  (same imports in every worker, incl. the baseline)

    import pyg_grf  # noqa: F401
    return torch


def _features(spec, torch, edge_index, N):
    r"""GRF loads for this N: from the run's cache if an earlier worker computed them, else
    computed here (and timed) with ``AddGraphRandomFeatures``."""
    from torch_geometric.data import Data

    from pyg_grf.transforms import AddGraphRandomFeatures
    path = Path(spec['cache_dir']) / f'grf_{N}.pt'
    if path.exists():
        d = torch.load(path, weights_only=True)  # tensors and a float only
        return d['index'], d['length'], d['load'], d['time_s']
    tr = AddGraphRandomFeatures(num_walks=spec['num_walks'], p_halt=spec['p_halt'],
                                max_length=spec['max_length'], seed=0)
    t0 = time.perf_counter()
    data = tr(Data(edge_index=edge_index, num_nodes=N))
    t_feat = time.perf_counter() - t0
    torch.save({'index': data.grf_index, 'length': data.grf_length, 'load': data.grf_load,
                'time_s': t_feat}, path)
    return data.grf_index, data.grf_length, data.grf_load, t_feat


def _build(spec, torch):
    r"""Module and a closure running its forward on the inputs; plus extra info."""
    from torch import nn
    N, C, H = spec['N'], spec['channels'], spec['heads']
    method = spec['method']
    edge_index = grid_edge_index(_side(N))
    x = torch.randn(N, C, requires_grad=True)
    info = {}
    if method in ('grf_sym', 'grf_asym'):
        from torch_geometric.data import Data

        from pyg_grf.nn import GRFAttention
        from pyg_grf.nn.attention.grf import GRFPlan
        index, length, load, t_feat = _features(spec, torch, edge_index, N)
        info['feature_time_s'] = t_feat
        info['grf_entries'] = int(index.size(1))
        info['grf_pairs'] = int(torch.unique(index[0] * N + index[1]).numel())
        mod = GRFAttention(C, heads=H, max_length=spec['max_length'], feature_map='relu',
                           mode='symmetric' if method == 'grf_sym' else 'asymmetric')
        data = Data(grf_index=index, grf_length=length, grf_load=load, num_nodes=N)
        # the layer's plan (GRFPlan: validated loads and the backend's structures) built in
        # every call, as the three-tensor call did: the cost of one layer on a new graph
        # (GRFPlan.build, which mod.payload(data) runs for new data: for the same tensors it
        # would hand back the plan the layer kept from its last call)
        run = lambda: mod(x, grf=GRFPlan.build(data, [mod]))  # noqa: E731
    elif method == 'linear':
        from pyg_grf.nn.attention.reference import LinearAttention
        mod = LinearAttention(C, heads=H, feature_map='relu')
        run = lambda: mod(x)  # noqa: E731
    elif method == 'gat':
        from torch_geometric.nn import GATConv
        mod = GATConv(C, C // H, heads=H)  # concat: H * C/H = C outputs
        run = lambda: mod(x, edge_index)  # noqa: E731
    elif method == 'softmax':
        import torch.nn.functional as F

        from pyg_grf.nn.attention.base import QKVAttention

        class DenseSoftmax(QKVAttention):
            # Full softmax attention over all N nodes (one graph), no mask: SDPA picks its
            # memory-efficient CPU kernel; O(N^2) time.
            def forward(self, x):
                q, k, v = self.project(x)  # [N, H, d]
                q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, H, N, d]
                out = F.scaled_dot_product_attention(q, k, v)
                return self.finish(out.squeeze(0).transpose(0, 1))

        mod = DenseSoftmax(C, H)
        run = lambda: mod(x)  # noqa: E731
    else:
        raise ValueError(method)
    assert isinstance(mod, nn.Module)
    return mod, x, run, info


def worker_bench(spec) -> dict:
    torch = _setup_torch(spec['threads'])
    mod, x, run, info = _build(spec, torch)
    params = [p for p in mod.parameters() if p.requires_grad]

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = run()
        loss = out.square().mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0, time.process_time() - c0

    gc.collect()
    st = _proc_status()
    setup_hwm, rss0 = st['VmHWM'], st['VmRSS']
    peak_ok = _reset_peak()
    fwd, tot, cpu = [], [], []
    for i in range(spec['warmup'] + spec['repeats']):
        f, t, c = step()
        if i >= spec['warmup']:
            fwd.append(f)
            tot.append(t)
            cpu.append(c)
    st = _proc_status()
    res = dict(info)
    res.update(
        fwd_s=statistics.median(fwd), fwd_bwd_s=statistics.median(tot), fwd_bwd_all_s=tot,
        fwd_bwd_cpu_s=statistics.median(cpu),
        fwdbwd_peak_mib=(st['VmHWM'] - rss0) if peak_ok else None,
        rss_before_mib=rss0, peak_total_mib=max(setup_hwm, st['VmHWM']))
    return res


def worker_baseline(spec) -> dict:
    _setup_torch(spec['threads'])
    gc.collect()
    return {'rss_mib': _proc_status()['VmRSS']}


def worker_sampler(spec) -> dict:
    torch = _setup_torch(spec['threads'])
    from pyg_grf.walks import sample_walks
    N = spec['N']
    edge_index = grid_edge_index(_side(N))
    rows = []
    for p_halt in spec['sampler_p_halt']:
        for walker in WALKERS:
            gen = torch.Generator().manual_seed(0)
            kw = dict(walker=walker, generator=gen)
            args = (edge_index, N, spec['sampler_walks'], p_halt, spec['sampler_max_length'])
            sample_walks(*args, **kw)  # warm-up
            ts, hops, moves = [], [], []
            for _ in range(spec['repeats']):
                t0 = time.perf_counter()
                w = sample_walks(*args, **kw)
                ts.append(time.perf_counter() - t0)
                hops.append(int((w.node >= 0).sum()))  # hops actually taken
                moves.append(int(w.step_ptr[-1]))      # walker-step records processed
            t = statistics.median(ts)
            h = statistics.median(hops)
            rows.append(dict(N=N, walker=walker, p_halt=p_halt, num_walks=spec['sampler_walks'],
                             max_length=spec['sampler_max_length'], time_s=t, hops=h,
                             walkers=N * spec['sampler_walks'],
                             steps_per_s=h / t, walks_per_s=N * spec['sampler_walks'] / t,
                             all_s=ts))
    return {'rows': rows}


def worker_profile(spec) -> dict:
    torch = _setup_torch(spec['threads'])
    from torch.profiler import ProfilerActivity, profile
    mod, x, run, info = _build(spec, torch)
    params = [p for p in mod.parameters() if p.requires_grad]

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        run().square().mean().backward()

    step()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
    ka = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in ka)

    def rows(key, k):
        out = []
        for e in sorted(ka, key=lambda e: getattr(e, key), reverse=True)[:k]:
            out.append(dict(name=e.key, calls=e.count, self_ms=e.self_cpu_time_total / 1e3,
                            total_ms=e.cpu_time_total / 1e3,
                            self_pct=100.0 * e.self_cpu_time_total / max(total_self, 1)))
        return out

    return dict(info, wall_s=wall, self_total_ms=total_self / 1e3,
                top_self=rows('self_cpu_time_total', 10),
                top_total=rows('cpu_time_total', 12))


WORKERS = {'bench': worker_bench, 'baseline': worker_baseline, 'sampler': worker_sampler,
           'profile': worker_profile}


PRELOAD = ['torch', 'torch_geometric', 'torch_geometric.nn', 'pyg_grf.walks', 'pyg_grf.features',
           'pyg_grf.transforms', 'pyg_grf.nn']
_CTX = None


def _context(spec: dict):
    r"""A ``forkserver`` that imports torch, PyG and pyg_grf once (a few seconds per process
    otherwise); every (method, N) still runs in a fresh child process forked from it. The
    environment (threads, malloc settings) is fixed when the server starts."""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp
        os.environ['OMP_NUM_THREADS'] = os.environ['MKL_NUM_THREADS'] = str(spec['threads'])
        if spec.get('malloc_tuned'):
            os.environ.update(MALLOC_TUNED_ENV)
        _CTX = mp.get_context('forkserver')
        _CTX.set_forkserver_preload(PRELOAD)
    return _CTX


def _child(spec: dict, conn) -> None:
    r"""Runs one worker in a fresh process; its RSS at start (the preloaded imports) is the
    baseline of its memory numbers."""
    import traceback
    import warnings
    warnings.filterwarnings('ignore')
    try:
        rss0 = _proc_status()['VmRSS']
        _reset_peak()
        res = WORKERS[spec['kind']](spec)
        res['rss_start_mib'] = rss0
        conn.send(('ok', res))
    except BaseException as exc:  # report, do not hang the driver
        conn.send(('error', f'{type(exc).__name__}: {exc}'[:300] + ' | ' +
                   traceback.format_exc().strip().splitlines()[-2][:200]))
    finally:
        conn.close()


def spawn(spec: dict, timeout: float) -> dict:
    ctx = _context(spec)
    recv, send = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    proc = ctx.Process(target=_child, args=(spec, send), daemon=True)
    proc.start()
    send.close()
    msg = None
    if recv.poll(timeout):
        try:
            msg = recv.recv()
        except EOFError:  # the child died before sending (e.g. killed for memory)
            msg = None
    proc.join(5 if msg is not None else 0.1)
    if proc.is_alive():
        proc.kill()
        proc.join()
        if msg is None:
            return {'status': f'timeout (> {timeout:.0f} s)'}
    wall = time.perf_counter() - t0
    if msg is not None and msg[0] == 'ok':
        res = msg[1]
        res['status'] = 'ok'
        res['process_wall_s'] = wall
        return res
    if msg is not None:
        return {'status': f'failed: {msg[1]}'}
    if proc.exitcode in (-9, 137):
        return {'status': 'killed (SIGKILL; out of memory?)'}
    return {'status': f'failed (exit code {proc.exitcode})'}


def machine_info(threads: int) -> dict:
    import torch
    import torch_geometric
    info = {
        'nproc': os.cpu_count(),
        'nproc_affinity': (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
                           else None),
        'torch': torch.__version__,
        'torch_geometric': torch_geometric.__version__,
        'python': platform.python_version(),
        'threads': threads,
        'platform': platform.platform(),
    }
    try:
        info['git_commit'] = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=str(ROOT),
                                            capture_output=True, text=True).stdout.strip() or None
    except OSError:
        pass
    try:
        info['nproc_cmd'] = subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    try:
        with open('/proc/cpuinfo') as fh:
            info['cpu'] = next((line.split(':', 1)[1].strip() for line in fh
                                if line.startswith('model name')),
                               platform.processor())
        with open('/proc/meminfo') as fh:
            mem = {l.split(':')[0]: int(l.split()[1]) for l in fh}
        info['mem_total_gib'] = round(mem['MemTotal'] / 2**20, 1)
    except (OSError, KeyError, StopIteration):
        pass
    return info


def _mem_available_mib() -> float:
    try:
        with open('/proc/meminfo') as fh:
            for line in fh:
                if line.startswith('MemAvailable'):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float('inf')


def _loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def loglog_slope(points):
    r"""Least-squares slope of log t against log N."""
    if len(points) < 2:
        return None
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else None


def _fmt_n(N: int) -> str:
    if N >= 2 ** 20 and N % 2 ** 20 == 0:
        return f'{N >> 20}M'
    return f'{N // 1000}k' if N >= 1000 else str(N)


def _fmt_ms(s):
    if s is None:
        return '—'
    ms = s * 1e3
    return f'{ms:,.0f}' if ms >= 100 else f'{ms:.1f}'


def _fmt_mib(m):
    return '—' if m is None else f'{m:,.0f}'


def run_benchmark(args) -> dict:
    sizes = [int(s) for s in args.sizes.split(',')] if args.sizes else \
        list(QUICK_SIZES if args.quick else FULL_SIZES)
    for N in sizes:
        _side(N)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    methods = args.methods.split(',') if args.methods else list(METHODS)
    if args.sampler_only:
        methods = []
    cache = tempfile.TemporaryDirectory(prefix='bench_grf_')
    common = dict(threads=args.threads, channels=args.channels, heads=args.heads,
                  num_walks=args.num_walks, p_halt=args.p_halt, max_length=args.max_length,
                  cache_dir=cache.name, warmup=1, repeats=repeats,
                  malloc_tuned=bool(args.malloc_tuned))
    started = time.time()
    meta = machine_info(args.threads)
    meta['loadavg_start'] = _loadavg()
    meta['command'] = 'python bench/bench_grf.py ' + ' '.join(sys.argv[1:])

    base = spawn(dict(common, kind='baseline'), args.timeout)
    base_rss = base.get('rss_mib', 0.0)
    _log(f'baseline process RSS: {base_rss:.0f} MiB')
    sampler = [] if args.no_sampler else _run_sampler(args, common, sizes, started)
    profile = None
    if not args.no_profile and not args.sampler_only:
        pN = args.profile_n or (16384 if args.quick else 65536)
        _log(f'[{time.time() - started:6.1f}s] profile GRF (symmetric) N={pN} ...')
        profile = spawn(dict(common, kind='profile', method='grf_sym', N=pN), args.timeout)
        profile['N'] = pN
    results = _run_sweep(args, common, sizes, methods, repeats, started)

    features = _feature_rows(results, sizes)
    ratios = _ratio_rows(results, sizes)
    slopes, slopes_cpu = _slopes(results, sizes, methods)
    targets = _targets(slopes, slopes_cpu, ratios, sampler)
    meta['loadavg_end'] = _loadavg()
    meta['elapsed_s'] = time.time() - started
    meta['baseline_rss_mib'] = base_rss
    cache.cleanup()
    return dict(meta=meta, config=dict(common, sizes=sizes, methods=methods,
                                       softmax_max=args.softmax_max,
                                       sampler_walks=args.sampler_walks,
                                       sampler_p_halt=[0.25, 0.5], sampler_max_length=10),
                results=results, features=features, ratios=ratios, slopes=slopes,
                slopes_cpu=slopes_cpu,
                sampler=sampler, profile=profile, targets=targets)


def _log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def _run_sampler(args, common: dict, sizes, started: float) -> list:
    sampler = []
    for N in sizes:
        _log(f'[{time.time() - started:6.1f}s] sampler N={N} ...')
        res = spawn(dict(common, kind='sampler', N=N, sampler_walks=args.sampler_walks,
                         sampler_p_halt=[0.25, 0.5], sampler_max_length=10),
                    args.timeout)
        if res['status'] == 'ok':
            sampler.extend(res['rows'])
        else:
            sampler.append(dict(N=N, status=res['status']))
    return sampler


def _run_sweep(args, common: dict, sizes, methods, repeats: int, started: float) -> list:
    sweep_start = time.time()
    results = []
    prev = {}  # method -> (N, fwd_bwd_s, peak_mib)
    # Cheap methods first at every N, so that a --budget cuts the expensive ones (the ratios
    # need the baselines at every size where GRF ran).
    run_order = sorted(methods, key=RUN_ORDER.index)
    for N in sizes:
        for method in run_order:
            row = dict(method=method, N=N, side=_side(N))
            reps, skip = _plan_repeats(args, method, N, prev, repeats, sweep_start)
            if skip is not None:
                row['status'] = skip
                results.append(row)
                continue
            _log(f'[{time.time() - started:6.1f}s] {LABELS[method]:22s} N={N:>8d} '
                 f'(repeats {reps}) ...')
            row['repeats'] = reps
            res = spawn(dict(common, kind='bench', method=method, N=N, repeats=reps),
                        args.timeout)
            row.update(res)
            if res['status'] == 'ok':
                row['process_peak_mib'] = res['peak_total_mib'] - res['rss_start_mib']
                prev[method] = (N, res['fwd_bwd_s'], res['fwdbwd_peak_mib'])
                _log(f'           fwd+bwd {res["fwd_bwd_s"] * 1e3:9.1f} ms  '
                     f'peak {res["fwdbwd_peak_mib"] or 0:8.0f} MiB')
            else:
                _log(f'           {res["status"]}')
            results.append(row)
    return results


def _plan_repeats(args, method: str, N: int, prev: dict, repeats: int, sweep_start: float):
    r"""``(repeats, None)`` for a config to run, or ``(0, reason)`` for one to skip: what would
    predictably not fit, extrapolated from the previous size (linear in N; quadratic for dense
    softmax)."""
    if method == 'softmax' and N > args.softmax_max:
        return 0, f'skipped: O(N^2) time, N > {args.softmax_max}'
    if method not in prev:
        return repeats, None
    N0, t0, m0 = prev[method]
    r = N / N0
    t_iter = t0 * r ** (2.0 if method == 'softmax' else 1.0)
    m_pred = (m0 or 0.0) * r
    avail = _mem_available_mib()
    if m_pred > args.mem_fraction * avail:
        return 0, (f'skipped: predicted fwd+bwd peak {m_pred / 1024:.1f} GiB > '
                   f'{args.mem_fraction:.0%} of available '
                   f'{avail / 1024:.1f} GiB')
    allowed = args.timeout
    if args.budget:
        allowed = min(allowed, args.budget - (time.time() - sweep_start))
    fit = int(allowed / t_iter) - 1 if t_iter > 0 else repeats  # minus the warm-up
    if fit < 1:
        return 0, (f'skipped: predicted {t_iter:.0f} s per forward+backward; '
                   f'warm-up + 1 repeat would exceed '
                   f'{"the remaining --budget" if allowed < args.timeout else "--timeout"}'
                   f' ({max(allowed, 0):.0f} s)')
    return min(repeats, fit), None


def _get(results, method, N, key='fwd_bwd_s'):
    for r in results:
        if r['method'] == method and r['N'] == N and r.get('status') == 'ok':
            return r.get(key)
    return None


def _feature_rows(results, sizes) -> list:
    features = []
    for N in sizes:
        for m in ('grf_sym', 'grf_asym'):
            t = _get(results, m, N, 'feature_time_s')
            if t is not None:
                features.append(dict(N=N, time_s=t, entries=_get(results, m, N, 'grf_entries'),
                                     pairs=_get(results, m, N, 'grf_pairs')))
                break
    return features


def _ratio_rows(results, sizes) -> list:
    ratios = []
    div = lambda a, b: (a / b) if (a is not None and b) else None  # noqa: E731
    for N in sizes:
        row = dict(N=N)
        for key, suffix in (('fwd_bwd_s', ''), ('fwd_bwd_cpu_s', '_cpu')):
            g, ga, lin, gat = (_get(results, m, N, key)
                               for m in ('grf_sym', 'grf_asym', 'linear', 'gat'))
            row.update({f'grf_over_linear{suffix}': div(g, lin),
                        f'grf_over_gat{suffix}': div(g, gat),
                        f'asym_over_linear{suffix}': div(ga, lin),
                        f'asym_over_gat{suffix}': div(ga, gat)})
        ratios.append(row)
    return ratios


SLOPE_RANGE = (16384, 262144)


def _slopes(results, sizes, methods):
    lo, hi = SLOPE_RANGE
    slopes, slopes_cpu = {}, {}
    for key, dst in (('fwd_bwd_s', slopes), ('fwd_bwd_cpu_s', slopes_cpu)):
        for m in methods:
            pts = [(N, _get(results, m, N, key)) for N in sizes
                   if lo <= N <= hi and _get(results, m, N, key) is not None]
            if len(pts) < 2:  # e.g. --quick: use what there is, and say so
                pts = [(N, _get(results, m, N, key)) for N in sizes
                       if _get(results, m, N, key) is not None]
            dst[m] = dict(slope=loglog_slope(pts), from_N=pts[0][0] if pts else None,
                          to_N=pts[-1][0] if pts else None, points=len(pts))
    return slopes, slopes_cpu


def _targets(slopes, slopes_cpu, ratios, sampler) -> dict:
    lo, hi = SLOPE_RANGE
    targets = {}
    s = slopes.get('grf_sym', {})
    if s.get('slope') is not None:
        targets['slope'] = dict(target='<= 1.15 (16k to 262k)', value=s['slope'],
                                value_cpu=slopes_cpu['grf_sym']['slope'],
                                range=f"{_fmt_n(s['from_N'])} to {_fmt_n(s['to_N'])}",
                                met=s['slope'] <= 1.15,
                                full_range=(s['from_N'] == lo and s['to_N'] == hi))
    r65 = next((r['grf_over_linear'] for r in ratios if r['N'] == 65536), None)
    r65c = next((r['grf_over_linear_cpu'] for r in ratios if r['N'] == 65536), None)
    targets['grf_over_linear_65k'] = dict(target='<= 4', value=r65, value_cpu=r65c,
                                          met=None if r65 is None else r65 <= 4)
    ok_rows = [r for r in sampler if 'steps_per_s' in r]
    if ok_rows:
        big = max(r['N'] for r in ok_rows)
        at_big = [r for r in ok_rows if r['N'] == big]
        targets['sampler'] = dict(
            target='>= 20M walker-steps/s', N=big,
            min=min(r['steps_per_s'] for r in at_big), max=max(r['steps_per_s'] for r in at_big),
            configs_met=sum(r['steps_per_s'] >= 20e6 for r in at_big), configs=len(at_big),
            best_any_N=max(r['steps_per_s'] for r in ok_rows))
    return targets


def to_markdown(R: dict) -> str:
    L = _md_header(R['meta'], R['config'])
    L += _md_method_tables(R)
    L += _md_ratios(R)
    L += _md_features(R['features'])
    L += _md_sampler(R)
    L += _md_targets(R['targets'])
    if R.get('notes'):
        L.append('\n## Notes\n')
        L.append(R['notes'].rstrip())
    L += _md_profile(R.get('profile'))
    return '\n'.join(L) + '\n'


def _f2(v) -> str:
    return '—' if v is None else f'{v:.2f}'


def _md_header(meta: dict, cfg: dict) -> list:
    L = []
    L.append('# GRF attention benchmark (2-D grids)\n')
    L.append(f"Command: `{meta['command']}`  ")
    L.append(f"Machine: `nproc` = {meta.get('nproc_cmd', meta['nproc'])}, "
             f"CPU {meta.get('cpu', '?')}, "
             f"{meta.get('mem_total_gib', '?')} GiB RAM; torch {meta['torch']}, "
             f"torch_geometric {meta['torch_geometric']}, Python {meta['python']}; "
             f"pyg_grf at commit {meta.get('git_commit')} (plus any uncommitted changes); "
             f"`torch.get_num_threads()` = {meta['threads']} in every worker.  ")
    if cfg.get('malloc_tuned'):
        tuned = ' '.join(f'{k}={v}' for k, v in MALLOC_TUNED_ENV.items())
        L.append(f"Workers ran with glibc malloc tuned: `{tuned}` "
                 f"(`--malloc-tuned`).  ")
    L.append(f"Load average at start {meta['loadavg_start']}, at end {meta['loadavg_end']} "
             f"(a load above {meta['nproc']} means other processes shared the cores and the "
             f"times are inflated and noisy); elapsed {meta['elapsed_s']:.0f} s.\n")
    L.append(f"Setup: one attention layer, channels = {cfg['channels']}, heads = {cfg['heads']} "
             f"(d = m = {cfg['channels'] // cfg['heads']}, ReLU feature map for the linear "
             f"attentions), input x [N, {cfg['channels']}] with requires_grad (a layer inside a "
             f"stack), loss = mean(out^2). GRF loads from `AddGraphRandomFeatures(num_walks="
             f"{cfg['num_walks']}, p_halt={cfg['p_halt']}, max_length={cfg['max_length']})` "
             f"computed once per N (pre_transform), its time reported separately. Times: median of "
             f"{cfg['repeats']} forward+backward passes after 1 warm-up. GATConv(C, C/H, heads=H) "
             f"(adds self-loops, as by default). Dense softmax: "
             f"`F.scaled_dot_product_attention` over all N nodes, no mask, run for N <= "
             f"{cfg['softmax_max']} only (O(N^2) time).\n")
    return L


def _met(met: int, total: int) -> str:
    return 'met' if met == total else 'partly met' if met else 'NOT met'


def _md_method_tables(R: dict) -> list:
    meta, cfg = R['meta'], R['config']
    sizes, methods = cfg['sizes'], cfg['methods']

    def cell(m, N, key, fmt):
        for r in R['results']:
            if r['method'] == m and r['N'] == N:
                if r.get('status') == 'ok':
                    return fmt(r.get(key))
                return 'skip' if str(r.get('status', '')).startswith('skipped') else 'fail'
        return ''

    tables = [
        ('## Forward+backward time (ms, median)\n', 'fwd_bwd_s', _fmt_ms),
        ('\n## Forward-only time (ms, median; same runs)\n', 'fwd_s', _fmt_ms),
        ('\n## Process CPU time of forward+backward (ms, median; user+system over all '
         'threads of the worker; less sensitive to other processes on the cores than wall '
         'time, but includes OpenMP spin-waiting)\n', 'fwd_bwd_cpu_s', _fmt_ms),
        ('\n## Peak memory of forward+backward (MiB above the RSS before the timed passes)\n',
         'fwdbwd_peak_mib', _fmt_mib),
        (f"\n## Process peak RSS (MiB above the worker's RSS at start, i.e. after importing "
         f"torch/PyG/pyg_grf, {meta['baseline_rss_mib']:.0f} MiB; includes graph, features, "
         f"inputs, parameters)\n", 'process_peak_mib', _fmt_mib),
    ]
    hdr = '| N (grid) | ' + ' | '.join(LABELS[m] for m in methods) + ' |'
    sep = '|---|' + '---:|' * len(methods)
    L = []
    for title, key, fmt in tables:
        L.append(title)
        L += [hdr, sep]
        for N in sizes:
            L.append(f'| {_fmt_n(N)} ({_side(N)}²) | ' +
                     ' | '.join(cell(m, N, key, fmt) for m in methods) + ' |')
    skips = [r for r in R['results'] if r.get('status') != 'ok']
    if skips:
        L.append('\nNot run / failed:\n')
        for r in skips:
            L.append(f"* {LABELS[r['method']]}, N = {_fmt_n(r['N'])}: {r['status']}")
    fewer = [r for r in R['results'] if r.get('status') == 'ok'
             and r.get('repeats', cfg['repeats']) < cfg['repeats']]
    if fewer:
        L.append('\nRun with fewer repeats (to stay within --timeout / --budget):\n')
        for r in fewer:
            L.append(f"* {LABELS[r['method']]}, N = {_fmt_n(r['N'])}: {r['repeats']} repeat(s)")
    return L


def _md_ratios(R: dict) -> list:
    L = ['\n## Ratios of forward+backward time (same run; wall time, CPU time in brackets)\n',
         '| N | GRF sym / linear | GRF sym / GAT | GRF asym / linear | GRF asym / GAT |',
         '|---|---:|---:|---:|---:|']
    for r in R['ratios']:
        L.append(f"| {_fmt_n(r['N'])} | " + ' | '.join(
            f"{_f2(r[k])} ({_f2(r[k + '_cpu'])})"
            for k in ('grf_over_linear', 'grf_over_gat', 'asym_over_linear', 'asym_over_gat'))
            + ' |')
    L.append('\nLog-log slope of forward+backward time vs N (least squares; wall time, CPU time '
             'in brackets):\n')
    for m, s in R['slopes'].items():
        c = R['slopes_cpu'][m]
        if s['slope'] is not None:
            L.append(f"* {LABELS[m]}: {s['slope']:.3f} ({_f2(c['slope'])}) over "
                     f"{_fmt_n(s['from_N'])} to {_fmt_n(s['to_N'])}, {s['points']} sizes")
    return L


def _md_features(features: list) -> list:
    if not features:
        return []
    L = ['\n## GRF pre-transform (`AddGraphRandomFeatures`, once per N)\n',
         '| N | time (s) | stored entries (per node) | distinct (start, visited) pairs '
         '(per node) |',
         '|---|---:|---:|---:|']
    for f in features:
        L.append(f"| {_fmt_n(f['N'])} | {f['time_s']:.2f} | {f['entries']:,} "
                 f"({f['entries'] / f['N']:.2f}) | {f['pairs']:,} ({f['pairs'] / f['N']:.2f}) |")
    return L


def _md_sampler(R: dict) -> list:
    meta, cfg = R['meta'], R['config']
    if not R['sampler']:
        return []
    L = [f"\n## Walk sampler `sample_walks` (n = {cfg['sampler_walks']} walks per node, "
         f"max_length = {cfg['sampler_max_length']})\n",
         'walker-steps/s = hops actually taken (records with node >= 0) / wall time of '
         'one `sample_walks` call (median), including its setup (halting draws, sort, '
         'CSR). walks/s = walkers (N * n) / the same time.\n']
    if meta.get('sampler_command'):
        L.append(f"Sampler rows from a later run: `{meta['sampler_command']}` at commit "
                 f"{meta.get('sampler_commit')}.\n")
    L.append('| N | walker | p_halt | hops | time (ms) | walker-steps/s (M) | walks/s (M) |')
    L.append('|---|---|---:|---:|---:|---:|---:|')
    for r in R['sampler']:
        if 'steps_per_s' not in r:
            L.append(f"| {_fmt_n(r['N'])} | {r.get('status')} | | | | | |")
            continue
        L.append(f"| {_fmt_n(r['N'])} | {r['walker']} | {r['p_halt']} | {r['hops']:,} | "
                 f"{r['time_s'] * 1e3:.1f} | {r['steps_per_s'] / 1e6:.1f} | "
                 f"{r['walks_per_s'] / 1e6:.1f} |")
    return L


def _md_targets(T: dict) -> list:
    L = ['\n## Targets\n']
    if 'slope' in T:
        t = T['slope']
        vc = '—' if t['value_cpu'] is None else f"{t['value_cpu']:.3f}"
        L.append(f"* time grows no faster than N^1.15 from 16k to 262k: slope {t['value']:.3f} "
                 f"(CPU time: {vc}) over {t['range']}"
                 f"{'' if t['full_range'] else ' (not the full target range)'} "
                 f"-> **{'met' if t['met'] else 'NOT met'}**")
    t = T['grf_over_linear_65k']
    L.append('* GRF / unmasked-linear time <= 4 at 65k: ' +
             ('not measured' if t['value'] is None else
              f"{t['value']:.2f} (CPU time: "
              f"{'—' if t['value_cpu'] is None else format(t['value_cpu'], '.2f')}) -> "
              f"**{'met' if t['met'] else 'NOT met'}**"))
    if 'sampler' in T:
        t = T['sampler']
        L.append(f"* sampler >= 20M walker-steps/s: at N = {_fmt_n(t['N'])} "
                 f"{t['min'] / 1e6:.1f}M to {t['max'] / 1e6:.1f}M; {t['configs_met']}/"
                 f"{t['configs']} configurations meet it (best at any N "
                 f"{t['best_any_N'] / 1e6:.1f}M) -> **"
                 f"{_met(t['configs_met'], t['configs'])}**")
    return L


def _md_profile(P: Optional[dict]) -> list:
    if not P:
        return []
    L = [f"\n## Profile: GRFAttention (symmetric) forward+backward, N = {_fmt_n(P['N'])}\n"]
    if P.get('status') != 'ok':
        L.append(f"profile failed: {P.get('status')}")
        return L
    L.append(f"One profiled forward+backward after a warm-up: wall {P['wall_s'] * 1e3:,.0f} ms "
             f"(under the profiler), total self CPU {P['self_total_ms']:,.0f} ms.\n")
    L.append('Top 10 ops by self CPU time:\n')
    L.append('| op | calls | self (ms) | self % | total incl. children (ms) |')
    L.append('|---|---:|---:|---:|---:|')
    for e in P['top_self']:
        L.append(f"| `{e['name']}` | {e['calls']} | {e['self_ms']:,.1f} | "
                 f"{e['self_pct']:.1f} | {e['total_ms']:,.1f} |")
    L.append('\nTop ops by total CPU time (including children; shows which autograd '
             'nodes the self time belongs to):\n')
    L.append('| op | calls | total (ms) |')
    L.append('|---|---:|---:|')
    for e in P['top_total']:
        L.append(f"| `{e['name']}` | {e['calls']} | {e['total_ms']:,.1f} |")
    return L


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--quick', action='store_true', help='N <= 16k, 1 repeat')
    ap.add_argument('--sizes', type=str, default=None,
                    help='comma-separated node counts, perfect squares (default: '
                         '4096,16384,65536,262144,1048576; 1M is skipped if predicted not to fit)')
    ap.add_argument('--repeats', type=int, default=None, help='timed repeats (default 3; quick 1)')
    ap.add_argument('--threads', type=int, default=2, help='torch threads per worker (default 2)')
    ap.add_argument('--methods', type=str, default=None, help=f"subset of {','.join(METHODS)}")
    ap.add_argument('--channels', type=int, default=64)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--num-walks', type=int, default=16,
                    help='walks per node of AddGraphRandomFeatures (default 16, its default)')
    ap.add_argument('--p-halt', type=float, default=0.5)
    ap.add_argument('--max-length', type=int, default=4)
    ap.add_argument('--sampler-walks', type=int, default=4)
    ap.add_argument('--softmax-max', type=int, default=16384,
                    help='largest N for dense softmax (default 16384)')
    ap.add_argument('--timeout', type=float, default=420.0,
                    help='seconds per worker; configs predicted to exceed it are skipped')
    ap.add_argument('--budget', type=float, default=0.0,
                    help='total seconds for the attention sweep (0: none); configs predicted to '
                         'overrun it run fewer repeats or are skipped (noted in the output)')
    ap.add_argument('--mem-fraction', type=float, default=0.7,
                    help='skip a config whose predicted fwd+bwd peak exceeds this fraction of '
                         'MemAvailable (default 0.7)')
    ap.add_argument('--profile-n', type=int, default=None,
                    help='N for the profile (default 65536; quick: 16384)')
    ap.add_argument('--no-sampler', action='store_true')
    ap.add_argument('--sampler-only', action='store_true',
                    help='only the walk sampler; with --merge-sampler-into, its rows replace '
                         'the sampler rows of a saved JSON, re-rendered')
    ap.add_argument('--merge-sampler-into', type=str, default=None,
                    help='a bench_grf JSON whose sampler rows this run replaces')
    ap.add_argument('--no-profile', action='store_true')
    ap.add_argument('--malloc-tuned', action='store_true',
                    help='run workers with '
                    + ' '.join(f'{k}={v}' for k, v in MALLOC_TUNED_ENV.items())
                         + ' (freed memory stays in the heap: no page faults on large temporaries)')
    ap.add_argument('--notes-file', type=str, default=None,
                    help='markdown file whose text is added to the report as "Notes"')
    ap.add_argument('--from-json', type=str, default=None,
                    help='do not run: re-render the markdown from a saved JSON (with --notes-file)')
    ap.add_argument('--out-dir', type=str, default=str(ROOT / 'experiments' / 'results'))
    ap.add_argument('--name', type=str, default='bench_grf', help='output file stem')
    args = ap.parse_args(argv)
    if args.methods and not set(args.methods.split(',')) <= set(METHODS):
        ap.error(f"--methods: choose from {','.join(METHODS)}")
    if args.heads < 1 or args.channels % args.heads:
        ap.error('--channels must be divisible by --heads')

    if args.from_json:
        R = json.loads(Path(args.from_json).read_text())
    else:
        R = run_benchmark(args)
        if args.merge_sampler_into:
            base = json.loads(Path(args.merge_sampler_into).read_text())
            base['sampler'] = R['sampler']
            if 'sampler' in R.get('targets', {}):
                base.setdefault('targets', {})['sampler'] = R['targets']['sampler']
            base['meta']['sampler_command'] = R['meta']['command']
            base['meta']['sampler_commit'] = R['meta'].get('git_commit')
            R = base
    if args.notes_file:
        R['notes'] = Path(args.notes_file).read_text()
    md = to_markdown(R)
    print(md)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f'{args.name}.json').write_text(json.dumps(R, indent=1))
    (out / f'{args.name}.md').write_text(md)
    print(f'wrote {out / (args.name + ".json")} and {out / (args.name + ".md")}', file=sys.stderr)


if __name__ == '__main__':
    main()
