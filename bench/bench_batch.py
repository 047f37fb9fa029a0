r"""GRF attention against the layers a PyG user already has, side by side in one process
(a script, not a test).

Forward + backward of one layer at 64 channels and 4 heads (16 channels per head), median of
``--repeats`` runs after a warm-up, on

* ``lrgb``: a batch of 64 tree-like graphs (random trees plus ring closures, like molecules) of
  120-180 nodes, about 9.5k nodes (LRGB-sized);
* ``tu``: a batch of 128 such graphs of 20-40 nodes (TU-sized);
* ``grid``: one 2-D grid of 4k, 16k and 65k nodes (and 262k with ``--big``, for the slope).

Baselines: PyG ``GINEConv`` and ``GATConv`` (local message passing), PyG ``PerformerAttention``
and ``torch.nn.MultiheadAttention`` padded per graph with ``to_dense_batch`` exactly as
``GPSConv`` runs them (``Performer 4x64`` is ``GPSConv``'s default ``head_channels=64``,
``Performer 4x16`` the same width as ours). GRF: ``GRFAttention`` in the three modes with every
backend (``sparse``, ``pairs``, ``auto``); the GRF loads are a ``pre_transform``
(``AddGraphRandomFeatures(num_walks=16, p_halt=0.5, max_length=4)``) and the per-batch
:class:`~pyg_grf.nn.attention.grf.GRFPlan` (validated loads, the backend's patterns and mask
statistics) is built once per batch and shared by all layers: its cost is reported separately
(``prep``: ``GRFPlan.build(batch, [layer])``), and ``2 layers`` adds it to two layer passes.

Usage::

    python bench/bench_batch.py                       # writes experiments/results/bench_batch.*
    python bench/bench_batch.py --quick               # fewer repeats, no 65k grid
    python bench/bench_batch.py --big                 # adds the 262k grid (slope 16k..262k)
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.nn import GATConv, GINEConv  # noqa: E402
from torch_geometric.nn.attention import PerformerAttention  # noqa: E402
from torch_geometric.utils import to_dense_batch, to_undirected  # noqa: E402

from pyg_grf.nn import GRFAttention  # noqa: E402
from pyg_grf.nn.attention.grf import GRFPlan  # noqa: E402
from pyg_grf.transforms import AddGraphRandomFeatures  # noqa: E402

C, H = 64, 4
MODES = ('symmetric', 'asymmetric', 'sparse_softmax')
BACKENDS = ('sparse', 'pairs', 'auto')
TRANSFORM = AddGraphRandomFeatures(num_walks=16, p_halt=0.5, max_length=4, seed=0)


# Workloads ########################################################################################


def molecule_like(n: int, gen: torch.Generator) -> torch.Tensor:
    r"""A random tree on ``n`` nodes plus ``n // 20`` ring closures, undirected."""
    parent = (torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long()
    ei = torch.stack([torch.arange(1, n), parent])
    a = torch.randint(0, n, (n // 20,), generator=gen)
    b = torch.randint(0, n, (n // 20,), generator=gen)
    ei = torch.cat([ei, torch.stack([a[a != b], b[a != b]])], 1)
    return to_undirected(ei, num_nodes=n)


def grid_edges(side: int) -> torch.Tensor:
    idx = torch.arange(side * side).view(side, side)
    right = torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)])
    down = torch.stack([idx[:-1].reshape(-1), idx[1:].reshape(-1)])
    return to_undirected(torch.cat([right, down], 1), num_nodes=side * side)


def make_batch(num_graphs: int, lo: int, hi: int, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        graphs.append(TRANSFORM(Data(edge_index=molecule_like(n, gen), num_nodes=n)))
    return Batch.from_data_list(graphs)


def make_grid(N: int) -> Batch:
    side = int(round(math.sqrt(N)))
    return Batch.from_data_list([TRANSFORM(Data(edge_index=grid_edges(side),
                                                num_nodes=side * side))])


# Timing ###########################################################################################


def timeit(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fwd_bwd(module, call, x):
    def run():
        module.zero_grad(set_to_none=True)
        x.grad = None
        call(module, x).sum().backward()
    return run


def baselines(b: Batch, x: torch.Tensor, repeats: int) -> dict:
    E = b.edge_index.size(1)
    out = {}
    gine = GINEConv(torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(),
                                        torch.nn.Linear(C, C)), edge_dim=C)
    ea = torch.randn(E, C)
    out['GINEConv'] = timeit(fwd_bwd(gine, lambda m, x: m(x, b.edge_index, ea), x), repeats)
    gat = GATConv(C, C // H, heads=H)
    out['GATConv'] = timeit(fwd_bwd(gat, lambda m, x: m(x, b.edge_index), x), repeats)

    def padded(m, x, multihead=False):
        h, mask = to_dense_batch(x, b.batch)
        if multihead:
            h, _ = m(h, h, h, key_padding_mask=~mask, need_weights=False)
        else:
            h = m(h, mask=mask)
        return h[mask]

    for hc in (64, 16):
        perf = PerformerAttention(C, H, head_channels=hc)
        out[f'Performer {H}x{hc}'] = timeit(fwd_bwd(perf, padded, x), repeats)
    if b.num_graphs > 1 or b.num_nodes <= 16384:
        mha = torch.nn.MultiheadAttention(C, H, batch_first=True)
        out['MultiheadAttention'] = timeit(
            fwd_bwd(mha, lambda m, x: padded(m, x, multihead=True), x), repeats)
    return out


def grf_rows(b: Batch, x: torch.Tensor, repeats: int, backends=BACKENDS, modes=MODES) -> dict:
    rows = {}
    for mode in modes:
        for backend in backends:
            if mode == 'sparse_softmax' and backend == 'pairs':
                continue  # the same computation as 'sparse' in this mode
            layer = GRFAttention(C, heads=H, max_length=4, mode=mode, backend=backend)
            plan = GRFPlan.build(b, [layer])  # the per-batch plan, as a model builds it
            run = fwd_bwd(layer, lambda m, x: m(x, grf=plan), x)
            rows[(mode, backend)] = {
                'layer': timeit(run, repeats),
                'prep': timeit(lambda layer=layer: GRFPlan.build(b, [layer]),
                               max(1, repeats // 2)),
                'chosen': [p.backend for p in plan.parts.values()][0],
            }
    return rows


def gkat_rows(b: Batch, x: torch.Tensor, repeats: int) -> dict:
    r"""GKAT 'linear' mode with its two backends on the exact kernel :math:`\Psi\Psi^\top`
    (``'sparse'``: two products with :math:`\Psi`; ``'pairs'``: the GRF engine on the kernel's
    support) and 'softmax' mode (one message passing over the kernel pairs); each layer's plan
    (``layer.payload``) built once, outside the timed calls."""
    from pyg_grf.nn import GKATAttention
    from pyg_grf.transforms import AddRWGNKFeatures
    t = AddRWGNKFeatures(num_walks=16, lam=0.8, alpha=1.0, max_length=4, seed=0)
    g = Batch.from_data_list([t(d) for d in b.to_data_list()])
    rows = {}
    for mode, backend in (('linear', 'sparse'), ('linear', 'pairs'), ('softmax', 'auto')):
        layer = GKATAttention(C, heads=H, mode=mode, head_channels=C // H, backend=backend)
        rwgnk = layer.payload(g)['rwgnk']
        name = f'GKAT {mode} {backend}' if mode == 'linear' else f'GKAT {mode}'
        rows[name] = timeit(fwd_bwd(
            layer, lambda m, x, p=rwgnk: m(x, g.batch, rwgnk=p), x), repeats)
    return rows


def sparse_products_only(b: Batch, repeats: int) -> float:
    r"""The two block-diagonal CSR products of the symmetric sparse backend alone
    (forward + backward), on the ``[H N, m (d + 1)]`` operand: its roofline."""
    from pyg_grf.ops import spmm
    layer = GRFAttention(C, heads=H, max_length=4, mode='symmetric', backend='sparse')
    phi = GRFPlan.build(b, [layer]).part(layer.spec()).structures.query  # pairs of Phi
    f = torch.rand(H, 5, requires_grad=True)
    m = d = C // H
    X = torch.randn(H * b.num_nodes, m * (d + 1), requires_grad=True)
    patH = phi.pattern.repeat(H)

    def run():
        vals = phi.values(f).reshape(-1)
        y = spmm(patH, vals, spmm(patH, vals, X, transpose=True))
        y.sum().backward()
    return timeit(run, repeats)


# Report ###########################################################################################


def ms(t):
    return '—' if t is None else f'{t * 1e3:.1f}'


def ratio(a, b):
    return '—' if a is None or b is None else f'{a / b:.2f}'


def to_markdown(R: dict) -> str:
    lines = [
        '# GRF attention vs the layers a PyG user already has',
        '',
        f"Forward + backward of one layer, {C} channels, {H} heads, median of "
        f"{R['repeats']} runs, {R['threads']} threads, {R['machine']}. Loads: "
        f"`{R['transform']}`. Command: `{R['command']}`.",
        '',
        '`prep` is the per-batch plan, `GRFPlan.build(batch, [layer])` (validation, sparsity '
        'patterns, mask statistics, block layout), built once per batch and shared by all layers; '
        '`2 layers` = 2 x layer + prep, the cost inside a 2-layer model. Ratios are against '
        '`Performer 4x64` (PyG `PerformerAttention` with `GPSConv`\'s default head size, padded '
        'with `to_dense_batch` as `GPSConv` runs it) and padded `MultiheadAttention`, measured in '
        'the same run.',
        '',
    ]
    for w in R['workloads']:
        base = w['baselines']
        lines += [f"## {w['name']}: {w['desc']}", '',
                  '| baseline | fwd+bwd ms |', '|---|---|']
        lines += [f'| {k} | {ms(v)} |' for k, v in base.items()]
        perf = base.get('Performer 4x64')
        perf16 = base.get('Performer 4x16')
        mha = base.get('MultiheadAttention')
        lines += ['', '| GRF mode | backend | layer ms | prep ms | 2 layers ms | layer / Performer '
                  '4x64 | layer / Performer 4x16 | layer / MHA | 2 layers / (2 x Performer 4x64) |',
                  '|---|---|---|---|---|---|---|---|---|']
        for row in w['grf']:
            t, p = row['layer'], row['prep']
            if t is None:
                lines.append(f"| {row['mode']} | {row['backend']} | — ({row.get('note', '')}) "
                             f"| | | | | | |")
                continue
            two = 2 * t + p
            backend = row['backend'] + (f" → {row['chosen']}" if row['backend'] == 'auto' else '')
            lines.append(
                f"| {row['mode']} | {backend} | {ms(t)} | {ms(p)} | {ms(two)} | "
                f"{ratio(t, perf)} | {ratio(t, perf16)} | {ratio(t, mha)} | "
                f"{ratio(two, None if perf is None else 2 * perf)} |")
        if 'products_only' in w:
            lines += ['', f"Sparse backend, the two CSR products alone (symmetric, fwd+bwd): "
                          f"{ms(w['products_only'])} ms."]
        lines.append('')
    if R.get('slope'):
        lines += [f"Log-log slope of the GRF symmetric layer (auto) from 16k to the largest grid: "
                  f"{R['slope']:.2f}.", '']
    notes = Path(__file__).resolve().parents[1] / 'experiments' / 'results' / 'bench_batch_notes.md'
    if notes.exists():
        lines += [notes.read_text()]
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--quick', action='store_true')
    p.add_argument('--big', action='store_true', help='add the 262k grid')
    p.add_argument('--gkat', action='store_true', help='add GKAT rows on the batches')
    p.add_argument('--tuned-malloc', action='store_true',
                   help='pyg_grf.utils.tune_malloc() first (as the pyg-grf CLI does)')
    p.add_argument('--only', default=None, help='comma-separated workload names (e.g. grid256k)')
    p.add_argument('--out', default=str(ROOT / 'experiments' / 'results' / 'bench_batch'))
    p.add_argument('--markdown-from', default=None,
                   help='rewrite the markdown table from a saved JSON file and exit')
    args = p.parse_args(argv)
    if args.markdown_from:
        R = json.loads(Path(args.markdown_from).read_text())
        Path(args.out).with_suffix('.md').write_text(to_markdown(R))
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.tuned_malloc:
        from pyg_grf.utils import tune_malloc
        tune_malloc()
    repeats = 2 if args.quick else args.repeats
    work = [('lrgb', '64 tree-like graphs of 120-180 nodes', lambda: make_batch(64, 120, 180)),
            ('tu', '128 tree-like graphs of 20-40 nodes', lambda: make_batch(128, 20, 40, seed=1))]
    sizes = [4096, 16384] + ([] if args.quick else [65536]) + ([262144] if args.big else [])
    for N in sizes:
        work.append((f'grid{N // 1024}k', f'one 2-D grid of {N} nodes',
                     lambda N=N: make_grid(N)))
    if args.only:
        keep = set(args.only.split(','))
        work = [w for w in work if w[0] in keep]
    R = {'repeats': repeats, 'threads': args.threads, 'transform': repr(TRANSFORM),
         'machine': f'{platform.processor() or platform.machine()}, torch {torch.__version__}',
         'command': 'python bench/bench_batch.py ' + ' '.join(argv if argv is not None
                                                               else sys.argv[1:]),
         'workloads': []}
    grid_times = {}
    for name, desc, make in work:
        b = make()
        x = torch.randn(b.num_nodes, C, requires_grad=True)
        is_batch = b.num_graphs > 1
        big = b.num_nodes > 70000
        print(f'{name}: {b.num_nodes} nodes, {b.num_graphs} graphs, {b.grf_index.size(1)} GRF '
              f'entries', flush=True)
        base = {} if big else baselines(b, x, repeats)
        rows = grf_rows(b, x, repeats if not big else 2,
                        backends=('auto',) if big else BACKENDS,
                        modes=('symmetric',) if big else MODES)
        if args.gkat and is_batch:
            base.update(gkat_rows(b, x, repeats))
        entry = {'name': name, 'desc': desc, 'num_nodes': b.num_nodes,
                 'baselines': base,
                 'grf': [dict(mode=m, backend=bk, **v) for (m, bk), v in rows.items()]}
        if not is_batch:
            entry['products_only'] = sparse_products_only(b, repeats if not big else 2)
            grid_times[b.num_nodes] = rows[('symmetric', 'auto')]['layer']
        R['workloads'].append(entry)
        for k, v in base.items():
            print(f'  {k:22s} {ms(v):>8s} ms', flush=True)
        for (m, bk), v in rows.items():
            print(f"  GRF {m:14s} {bk:6s} {ms(v['layer']):>8s} ms  prep {ms(v['prep'])} ms  "
                  f"{v.get('chosen', '')}", flush=True)
    pts = sorted((n, t) for n, t in grid_times.items() if n >= 16384)
    if len(pts) >= 2:
        xs = [math.log(n) for n, _ in pts]
        ys = [math.log(t) for _, t in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        R['slope'] = (sum((a - mx) * (c - my) for a, c in zip(xs, ys))
                      / sum((a - mx) ** 2 for a in xs))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix('.json').write_text(json.dumps(R, indent=1))
    out.with_suffix('.md').write_text(to_markdown(R))
    print(to_markdown(R))


if __name__ == '__main__':
    main()
