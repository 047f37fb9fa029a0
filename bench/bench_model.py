r"""Whole training steps of 2-layer GPS models, GRF attention against PyG's ``GPSConv``, side by
side in one process (a script, not a test).

One step is what a training loop does per batch: the batch's plan (for the GRF columns:
``GRFPlan.build(batch, layers)``, the :class:`~pyg_grf.nn.attention.grf.GRFPlan` that
``model_payload(model, batch)`` builds for a batch never seen before, one for both layers:
validation, owned copies of the loads, the backend rule, mask statistics, block layout),
forward, loss, backward and an ``Adam`` step. The model: node and edge encoders (``Linear``),
two GPS blocks with a ``GINEConv`` local branch (64 channels, 4 heads, batch norm, no dropout),
then mean pooling and a linear head with a 10-label BCE loss (batches) or a linear node head with a
10-class cross entropy (one big graph). Workloads:

* ``lrgb``: a batch of 64 molecule-like graphs (random trees plus ring closures) of 120-180 nodes;
* ``tu``: a batch of 128 such graphs of 20-40 nodes;
* ``grid64k``: one 2-D grid of 256 x 256 = 65,536 nodes, full-graph steps; the plan is
  built once outside the step (full-graph training keeps one for all steps).

Columns: ``GINE x2`` (the GPS block without its attention branch), PyG ``GPSConv`` with
``attn_type='multihead'``, with ``attn_type='performer'`` at PyG's default (4 heads x 64
channels) and at our width (``attn_kwargs={'head_channels': 16}``, 4 x 16), and
``pyg_grf.nn.GRFGPSConv`` with ``attn_type='grf'`` (symmetric GRF mask, backend ``'auto'``), the
same with ``global_beta=0.1``, and with ``attn_type='linear'`` (unmasked linear attention per
graph, the control), plus that control with the ``LinearAttention`` of before this change,
and on the batches the two GRF columns with ``loads prebuilt`` (one plan built outside
the timed steps: the step without the per-batch work); with ``--backends``,
``GRF-GPS [sparse|pairs]`` (an explicit backend) on the batches. Walk loads:
``AddGraphRandomFeatures(num_walks=16, p_halt=0.2, max_length=4, seed=0)`` per graph before
batching (the Peptides configs' settings). The columns are timed round-robin (one step of each
per round), so a loaded machine slows them alike; ratios are medians of per-round ratios.

Also: one ``LinearAttention`` layer forward + backward, old (masked_linear_attention with a
``PackingMask``) against new (``packed_linear_attention``), and a profile of the GRF-GPS step on
the ``lrgb`` batch (and on the grid with ``--profile-grid``). Hand-written notes in
``experiments/results/bench_model_notes.md`` are appended to the markdown.

Usage::

    OMP_NUM_THREADS=1 python bench/bench_model.py          # experiments/results/bench_model.*
    OMP_NUM_THREADS=1 python bench/bench_model.py --quick  # smoke run: tiny workloads, tmp dir
    OMP_NUM_THREADS=1 python bench/bench_model.py --repeats 15 --backends --profile-grid  # table
"""
from __future__ import annotations

import os

os.environ.setdefault('OMP_NUM_THREADS', '1')

import argparse  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the workloads of bench_batch.py (same generators, same graphs)
from bench_batch import grid_edges, molecule_like  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.nn import GINEConv, GPSConv, global_mean_pool  # noqa: E402

from pyg_grf._validation import batch_or_zeros  # noqa: E402
from pyg_grf.features import GRFLoads  # noqa: E402
from pyg_grf.features.blocks import block_layout, mask_statistics, num_join_terms  # noqa: E402
from pyg_grf.masks import PackingMask  # noqa: E402
from pyg_grf.memory import memory_budget  # noqa: E402
from pyg_grf.nn import GRFAttention, GRFGPSConv, LinearAttention  # noqa: E402
from pyg_grf.nn.attention.grf import GRFPlan, pairs, sparse  # noqa: E402
from pyg_grf.nn.feature_maps import qk_features  # noqa: E402
from pyg_grf.nn.functional import masked_linear_attention  # noqa: E402
from pyg_grf.transforms import AddGraphRandomFeatures  # noqa: E402

C, H = 64, 4
IN_NODE, IN_EDGE, OUT = 16, 4, 10
TRANSFORM = AddGraphRandomFeatures(num_walks=16, p_halt=0.2, max_length=4, seed=0)
MHA, P64, P16 = 'GPS multihead', 'GPS performer 4x64', 'GPS performer 4x16'
GRF, GRF_BETA, LIN, LIN_OLD = ('GRF-GPS', 'GRF-GPS beta=0.1', 'GRF-GPS linear',
                               'GRF-GPS linear (old LinearAttention)')
# the GRF columns with a payload built once outside the timed steps (batches only): what the
# step costs when the per-batch work is done elsewhere (e.g. in DataLoader workers)
PRE, PRE_BETA = 'GRF-GPS, loads prebuilt', 'GRF-GPS beta=0.1, loads prebuilt'
COLUMNS = ('GINE x2', MHA, P64, P16, GRF, GRF_BETA, LIN, LIN_OLD, PRE, PRE_BETA)
BACKEND_COLUMNS = tuple(f'GRF-GPS [{b}]' for b in ('sparse', 'pairs'))  # --backends
GRF_COLUMNS = (GRF, GRF_BETA, PRE, PRE_BETA) + BACKEND_COLUMNS


# Workloads ########################################################################################


def graph(ei: torch.Tensor, n: int, gen: torch.Generator, node_labels: bool = False) -> Data:
    y = (torch.randint(0, OUT, (n,), generator=gen) if node_labels
         else torch.randint(0, 2, (1, OUT), generator=gen).float())
    return TRANSFORM(Data(x=torch.randn(n, IN_NODE, generator=gen), edge_index=ei,
                          edge_attr=torch.randn(ei.size(1), IN_EDGE, generator=gen), y=y,
                          num_nodes=n))


def make_batch(num_graphs: int, lo: int, hi: int, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        graphs.append(graph(molecule_like(n, gen), n, gen))
    return Batch.from_data_list(graphs)


def make_grid(side: int) -> Batch:
    gen = torch.Generator().manual_seed(2)
    return Batch.from_data_list([graph(grid_edges(side), side * side, gen, node_labels=True)])


# Models ###########################################################################################


class LocalBlock(nn.Module):
    r"""The GPS block without its attention branch: ``norm1(x + conv(x))``, then the MLP and
    ``norm3`` as in ``GPSConv``."""

    def __init__(self, channels: int, conv: nn.Module):
        super().__init__()
        self.conv = conv
        self.norm1 = nn.BatchNorm1d(channels)
        self.mlp = nn.Sequential(nn.Linear(channels, 2 * channels), nn.ReLU(),
                                 nn.Linear(2 * channels, channels))
        self.norm3 = nn.BatchNorm1d(channels)

    def forward(self, x, edge_index, batch=None, **kwargs):
        h = self.norm1(x + self.conv(x, edge_index, **kwargs))
        return self.norm3(h + self.mlp(h))


class LegacyPackingMask(PackingMask):
    r"""``PackingMask`` as it was before this change (gather by indexing)."""

    def _matmul(self, x):
        sums = x.new_zeros((self.num_graphs, x.size(1))).index_add_(0, self.batch, x)
        return sums[self.batch]


class LegacyLinearAttention(LinearAttention):
    r"""``LinearAttention.forward`` before this change: :func:`masked_linear_attention` with a
    ``PackingMask`` (the ``[N, H, m (d + 1)]`` outer products summed per graph and gathered back
    to the nodes)."""

    def forward(self, x, batch=None):
        q, k, v = self.project(x)
        phi_q, phi_k = qk_features(self.feature_map, q, k, batch)
        mask = LegacyPackingMask(batch_or_zeros(batch, x.size(0), x.device))
        return self.finish(masked_linear_attention(phi_q, phi_k, self.drop_keys(v), mask,
                                                   eps=self.eps))


def gine() -> GINEConv:
    return GINEConv(nn.Sequential(nn.Linear(C, C), nn.ReLU(), nn.Linear(C, C)))


def block(column: str) -> nn.Module:
    if column == 'GINE x2':
        return LocalBlock(C, gine())
    if column == MHA:
        return GPSConv(C, gine(), heads=H, attn_type='multihead')
    if column == P64:  # PyG's default: head_channels=64
        return GPSConv(C, gine(), heads=H, attn_type='performer')
    if column == P16:
        return GPSConv(C, gine(), heads=H, attn_type='performer',
                       attn_kwargs={'head_channels': C // H})
    if column in (GRF, PRE):
        return GRFGPSConv(C, gine(), heads=H, attn_type='grf', attn_kwargs={'max_length': 4})
    if column in (GRF_BETA, PRE_BETA):
        return GRFGPSConv(C, gine(), heads=H, attn_type='grf',
                          attn_kwargs={'max_length': 4, 'global_beta': 0.1})
    if column in BACKEND_COLUMNS:  # 'GRF-GPS [pairs]': an explicit backend instead of 'auto'
        return GRFGPSConv(C, gine(), heads=H, attn_type='grf',
                          attn_kwargs={'max_length': 4, 'backend': column[9:-1]})
    conv = GRFGPSConv(C, gine(), heads=H, attn_type='linear')
    if column == LIN_OLD:  # the same block and weights, the old attention code
        old = LegacyLinearAttention(C, heads=H)
        old.load_state_dict(conv.attn.state_dict())
        conv.attn = old
    return conv


class Net(nn.Module):
    def __init__(self, column: str, node_level: bool):
        super().__init__()
        self.column = column
        self.node_level = node_level
        self.node_enc = nn.Linear(IN_NODE, C)
        self.edge_enc = nn.Linear(IN_EDGE, C)
        self.layers = nn.ModuleList([block(column) for _ in range(2)])
        self.head = nn.Linear(C, OUT)

    def forward(self, x, edge_index, edge_attr, batch, grf=None):
        x, edge_attr = self.node_enc(x), self.edge_enc(edge_attr)
        for layer in self.layers:
            if self.column in GRF_COLUMNS:  # PyG's call order, the loads by keyword
                x = layer(x, edge_index, batch, grf=grf, edge_attr=edge_attr)
            else:
                x = layer(x, edge_index, batch, edge_attr=edge_attr)
        return self.head(x if self.node_level else global_mean_pool(x, batch))


def fresh_plan(model: nn.Module, b: Batch):
    r"""The plan of ``b`` for the GRF layers of ``model``, built as for a batch never seen
    before: what ``model_payload(model, b)['grf']`` builds for a new batch (called directly,
    since a layer keeps its last plan and would hand it back for the same tensors)."""
    return GRFPlan.build(b, [m for m in model.modules() if isinstance(m, GRFAttention)])


def make_step(column: str, b: Batch, node_level: bool, once: bool = False):
    r"""One training step of ``column`` on ``b``. The GRF columns build the batch's plan in
    the step, except ``loads prebuilt`` and, with ``once`` (full-graph training), every GRF
    column: their plan is built here, once, and reused by every step."""
    torch.manual_seed(0)
    model = Net(column, node_level).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plan_once = None
    if column in (PRE, PRE_BETA) or (once and column in GRF_COLUMNS):
        plan_once = fresh_plan(model, b)

    def step():
        opt.zero_grad(set_to_none=True)
        grf = None
        if column in GRF_COLUMNS:  # the per-batch payload, as a training loop builds it
            grf = plan_once if plan_once is not None else fresh_plan(model, b)
        out = model(b.x, b.edge_index, b.edge_attr, b.batch, grf=grf)
        loss = (F.cross_entropy(out, b.y) if node_level
                else F.binary_cross_entropy_with_logits(out, b.y))
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


# Timing ###########################################################################################


def round_robin(fns: dict, repeats: int, warmup: int = 1) -> dict:
    r"""Seconds per call of every function, ``repeats`` rounds of one call of each (so that
    calls of one round share the machine's load of that moment)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def quartiles(x: list) -> tuple:
    r"""(median, first quartile, third quartile)."""
    if len(x) < 2:
        return (x[0], x[0], x[0])
    q = statistics.quantiles(x, n=4, method='inclusive')
    return (statistics.median(x), q[0], q[2])


def round_ratio(w: dict, col: str, base: str):
    r"""Quartiles of the per-round ratio ``time[col] / time[base]`` of a workload (:obj:`None`
    if either was not run): rounds share the load of their moment, so the ratio of one round is
    steadier than the ratio of two medians on a loaded machine."""
    t = w.get('times', {})
    if col not in t or base not in t:
        return None
    return quartiles([a / b for a, b in zip(t[col], t[base])])


def linear_layer_old_new(b: Batch, repeats: int) -> dict:
    r"""One ``LinearAttention`` layer (64 channels, 4 heads, ReLU features), forward + backward,
    before and after this change, and the largest difference of their outputs."""
    torch.manual_seed(0)
    new = LinearAttention(C, heads=H)
    old = LegacyLinearAttention(C, heads=H)
    old.load_state_dict(new.state_dict())
    x = torch.randn(b.num_nodes, C, requires_grad=True)

    def run(layer):
        def f():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x, b.batch).sum().backward()
        return f
    with torch.no_grad():
        diff = float((new(x, b.batch) - old(x, b.batch)).abs().max())
    t = round_robin({'old': run(old), 'new': run(new)}, repeats)
    return {'old': statistics.median(t['old']), 'new': statistics.median(t['new']),
            'speedup': quartiles([a / b for a, b in zip(t['old'], t['new'])]),
            'max_abs_diff': diff}


# Profile ##########################################################################################


PROFILED = ('__init__', 'from_data', 'build', 'build_part', '_try_pairs', 'memory_budget',
            'mask_statistics', 'self_join_terms', 'join_terms', 'coalesce_terms',
            'compiled_join', 'block_layout', 'num_join_terms', 'block_coords', 'pairs',
            'model_payload', 'plan_payload', 'cached_plan', 'linear_sums', 'masked_sums',
            'pair_sums', 'pair_sums_backward', 'expand', 'values', 'spmm', '_sums',
            'check_coefficients', 'features', 'project_heads', 'forward', 'backward', 'step')


def profile_step(b: Batch, column: str, steps: int, once: bool = False) -> dict:
    r"""Where the time of a GRF-GPS step goes: phases timed directly, ``cProfile`` of the
    Python-level functions (cumulative, the per-batch plan included), and the top ops
    of ``torch.profiler`` (self CPU time, backward ops included). ``once``: full-graph training
    (one graph, node-level loss), the plan built once before the steps."""
    torch.manual_seed(0)
    node_level = once
    model = Net(column, node_level=node_level).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plan_once = fresh_plan(model, b) if once else None
    phases = {'GRFPlan.build: the plan of the batch (validation, copies, structures)': [],
              'forward': [], 'backward': [], 'optimizer step': []}
    if node_level:
        phases = {'forward (plan built before the loop)': [], 'backward': [],
                  'optimizer step': []}
    names = list(phases)

    def step(record=False):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        grf = plan_once if node_level else fresh_plan(model, b)
        t1 = time.perf_counter()
        out = model(b.x, b.edge_index, b.edge_attr, b.batch, grf=grf)
        loss = (F.cross_entropy(out, b.y) if node_level
                else F.binary_cross_entropy_with_logits(out, b.y))
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        if record:
            dts = (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
            for name, dt in zip(names, dts[1:] if node_level else dts):
                phases[name].append(dt)

    step()
    for _ in range(steps):
        step(record=True)
    out = {'phases': {k: statistics.median(v) for k, v in phases.items()}}
    # the plan's per-batch work piece by piece, in the order GRFPlan.build runs it (both layers
    # share one part: same mode, backend, heads and widths)
    plan = plan_once if plan_once is not None else fresh_plan(model, b)
    backend = [p.backend for p in plan.parts.values()][0]
    pieces = {}
    for _ in range(1 if node_level else 3):
        t = time.perf_counter()
        loads = GRFLoads.from_data(b)
        box = {}
        seq = [('GRFLoads.from_data: validation (index range, hops, finite loads) and owned '
                'int32/uint8 copies', lambda: None),
               ('memory_budget(): the budget of the backend rule (\'pairs\' when its join and '
                'one layer fit, else \'sparse\')',
                lambda: box.update(budget=memory_budget(loads.device)))]
        seq += [(f'{backend}.build(): the backend\'s plan structures'
                 + (' (the join on the visited node, mask statistics coalesced per cell in '
                    'float32, CSR pattern of the mask, mirror cells)'
                    if backend == 'pairs' else ''),
                 lambda: pairs.build(loads, 'symmetric', torch.float32) if backend == 'pairs'
                 else sparse.build(loads, 'symmetric'))]
        for label, fn in seq:
            fn()
            now = time.perf_counter()
            pieces.setdefault(label, []).append(now - t)
            t = now
        if backend == 'pairs':  # of the build: the join and the statistics alone
            lay = block_layout(loads.batch, loads.num_nodes)
            t = time.perf_counter()
            mask_statistics(loads, lay, True, torch.float32)
            pieces.setdefault('join', []).append(time.perf_counter() - t)
    join = pieces.pop('join', None)
    st = [p.structures for p in plan.parts.values()][0]
    out['structures'] = {'backend': backend, 'join_terms': num_join_terms(plan.loads),
                         'nnz': plan.loads.nnz,
                         'mask_nnz': st.nnz if backend == 'pairs' else None,
                         'plan_bytes': sum(plan.nbytes().values()),
                         'pieces': {k: statistics.median(v) for k, v in pieces.items()},
                         'join': None if join is None else statistics.median(join)}
    # cProfile: cumulative seconds per step of the package's functions
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        if ('pyg_grf' in file or func in ('backward', 'step')) and func in PROFILED:
            rel = file.split('pyg_grf', 1)[-1] if 'pyg_grf' in file else Path(file).name
            rows.append({'function': f'pyg_grf{rel}:{line}({func})' if 'pyg_grf' in file
                         else f'{rel}:{line}({func})', 'calls_per_step': nc / steps,
                         'cum_s_per_step': ct / steps})
    rows.sort(key=lambda r: -r['cum_s_per_step'])
    out['cprofile'] = rows[:22]
    # torch.profiler: ops by self CPU time
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            step()
    ops = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]
    out['ops'] = [{'op': e.key, 'calls_per_step': e.count / steps,
                   'self_s_per_step': e.self_cpu_time_total / 1e6 / steps} for e in ops]
    return out


# Report ###########################################################################################


def ms(t):
    return '—' if t is None else f'{t * 1e3:.1f}'


def ratio(r):
    return '—' if r is None else f'{r[0]:.2f}'


TARGETS = [  # (workload, column, baseline, bound)
    ('lrgb', GRF, MHA, 0.8), ('lrgb', GRF, P16, 1.0),
    ('lrgb', GRF_BETA, MHA, 0.8), ('lrgb', GRF_BETA, P16, 1.0),
    ('tu', GRF, MHA, 0.8), ('tu', GRF, P16, 1.0),
    ('tu', GRF_BETA, MHA, 0.8), ('tu', GRF_BETA, P16, 1.0),
    ('grid64k', GRF, P16, 1.5), ('grid64k', GRF_BETA, P16, 1.5),
    # not the target's setting (the per-batch work leaves the step): how far that alone goes
    ('lrgb', PRE, MHA, 0.8), ('lrgb', PRE, P16, 1.0),
    ('lrgb', PRE_BETA, MHA, 0.8), ('lrgb', PRE_BETA, P16, 1.0),
    ('tu', PRE, MHA, 0.8), ('tu', PRE, P16, 1.0),
    ('tu', PRE_BETA, MHA, 0.8), ('tu', PRE_BETA, P16, 1.0),
]


def targets(R: dict) -> list:
    by_name = {w['name']: w for w in R['workloads']}
    out = []
    for wname, col, base, bound in TARGETS:
        r = round_ratio(by_name[wname], col, base) if wname in by_name else None
        if r is None:
            continue
        out.append({'workload': wname, 'column': col, 'baseline': base, 'bound': bound,
                    'ratio': r[0], 'quartiles': [r[1], r[2]], 'met': r[0] <= bound})
    return out


def to_markdown(R: dict) -> str:
    lines = [
        '# Whole training steps: GRF-GPS against PyG GPS',
        '',
        f"Median ms per training step (forward + backward + `Adam` step, per-batch preparation "
        f"included) of 2-layer GPS models with a `GINEConv` local branch, {C} channels, {H} heads, "
        f"{R['threads']} thread, round-robin rounds (one step of every column per round) after "
        f"{R['warmup']} warm-up step(s), {R['machine']}. Loads: `{R['transform']}` per graph "
        f"before batching. Command(s): "
        + '; '.join(f'`{c}`' for c in R.get('commands', [R.get('command')])) + '.',
        '',
        f"**Machine load.** {R['load_note']} The load average (1 min) at the start and end "
        f"of every workload is given under it. Under load, absolute times are slower "
        f"and noisier than on a quiet machine; the columns were timed round-robin in one "
        f"process, so their *ratios* are what this table measures: every ratio below is the "
        f"median over rounds of the ratio of the two steps of one round.",
        '',
        'Columns: `GINE x2` = the GPS block without its attention branch (GINE + batch norm + '
        'MLP); `GPS multihead` / `GPS performer 4x64` / `GPS performer 4x16` = PyG '
        '`torch_geometric.nn.GPSConv` with `attn_type=\'multihead\'`, `\'performer\'` at its '
        'default (4 heads x 64 channels each, as PyG builds it) and with `attn_kwargs='
        '{\'head_channels\': 16}` (4 x 16, our width); `GRF-GPS` = `pyg_grf.nn.GRFGPSConv('
        'attn_type=\'grf\')` (symmetric GRF mask, backend `auto`), called `conv(x, edge_index, '
        'batch, grf=plan, edge_attr=...)` with `plan = GRFPlan.build(batch, layers)` (one '
        '`GRFPlan` for both layers, what `model_payload(model, batch)[\'grf\']` builds for a '
        'new batch) built inside the step; `beta=0.1` adds '
        '`attn_kwargs={\'global_beta\': 0.1}`; `GRF-GPS linear` = '
        '`GRFGPSConv(attn_type=\'linear\')` (unmasked linear attention per graph, the control), '
        'and the same block with the `LinearAttention` code of before this change; '
        '`GRF-GPS [backend]` = `GRF-GPS` with that backend instead of `auto` (`--backends`).',
        '',
    ]
    for w in R['workloads']:
        steps = w['steps']
        lines += [f"## {w['name']}: {w['desc']}", '',
                  f"{w['num_nodes']} nodes, {w['num_graphs']} graph(s), {w['num_edges']} edges, "
                  f"{w['nnz']} GRF entries; GRF backend chosen by `auto`: "
                  f"`{w.get('backend', '?')}`." + (f" {w['note']}" if w.get('note') else '')
                  + f" Median of {w['rounds']} rounds; load average {w['loadavg'][0]:.1f} at "
                    f"the start, {w['loadavg'][1]:.1f} at the end.", '',
                  '| column | ms / step | / GPS multihead | / GPS performer 4x16 | '
                  '/ GPS performer 4x64 |', '|---|---|---|---|---|']
        for col in COLUMNS + BACKEND_COLUMNS:
            if col in w.get('skipped', {}):
                lines.append(f"| {col} | — ({w['skipped'][col]}) | | | |")
                continue
            if col not in steps:
                continue
            lines.append(f'| {col} | {ms(steps[col])} | {ratio(round_ratio(w, col, MHA))} | '
                         f'{ratio(round_ratio(w, col, P16))} | '
                         f'{ratio(round_ratio(w, col, P64))} |')
        if w.get('prep_once') is not None:
            lines += ['', f"`GRFPlan` built once outside the step and reused by all steps: "
                          f"`GRFPlan.build` {ms(w['prep_once'])} ms"
                          + (f" ({w['plan_bytes'] / 2 ** 20:.1f} MiB)" if w.get('plan_bytes')
                             else '')
                          + f"; the first `GRF-GPS` step {ms(w.get('first_grf_step'))} ms "
                          f"(against {ms(steps.get(GRF))} ms for a later step). Neither is in "
                          f"the step times above."]
        lines.append('')
    lines += ['## Targets (issue "Speed of a whole training step", item 6)', '',
              'Ratio = median over rounds of the per-round ratio (quartiles in brackets). The '
              '`loads prebuilt` rows are not the target\'s setting (there the per-batch work '
              'is inside the step): they show what moving it out of the step (e.g. into '
              'DataLoader workers) would give.', '',
              '| workload | column | against | ratio | target | met |', '|---|---|---|---|---|---|']
    for t in R['targets']:
        miss = '' if t['met'] else f" (missed by {100 * (t['ratio'] / t['bound'] - 1):.0f} %)"
        q1, q3 = t['quartiles']
        lines.append(f"| {t['workload']} | {t['column']} | {t['baseline']} | {t['ratio']:.2f} "
                     f"({q1:.2f}-{q3:.2f}) | "
                     f"<= {t['bound']} | {'yes' if t['met'] else 'no' + miss} |")
    lines.append('')
    if R.get('linear_layer'):
        lines += ['## `LinearAttention`, old against new (item 4)', '',
                  f'One layer ({C} channels, {H} heads, ReLU features), forward + backward, same '
                  'weights, timed round-robin. Old: `masked_linear_attention` with a '
                  '`PackingMask` (the `[N, H, m (d + 1)]` outer products summed per graph by '
                  '`index_add_` and gathered back); new: `packed_linear_attention` (two batched '
                  'products per size bucket on padded per-graph blocks).', '',
                  '| workload | old ms | new ms | speed-up | max abs diff of outputs |',
                  '|---|---|---|---|---|']
        for name, r in R['linear_layer'].items():
            lines.append(f"| {name} | {ms(r['old'])} | {ms(r['new'])} | "
                         f"{r['speedup'][0]:.1f}x | {r['max_abs_diff']:.1e} |")
        lines.append('')
    for P in R.get('profiles', {}).values():
        total = sum(P['phases'].values())
        lines += [f"## Where the time goes: GRF-GPS step on `{P['workload']}`", '',
                  f"Median of {P['steps']} steps, phases timed inside the step "
                  f"(total {ms(total)} ms):", '', '| phase | ms | share |', '|---|---|---|']
        for k, v in P['phases'].items():
            lines.append(f'| {k} | {ms(v)} | {100 * v / total:.0f} % |')
        s = P['structures']
        mask = '' if s['mask_nnz'] is None else f", {s['mask_nnz']} mask nonzeros"
        where = ('built once before the training loop' if 'forward (plan built before the '
                 'loop)' in P['phases'] else 'built in the step, before the forward')
        lines += ['', f"The plan's per-batch work (`GRFPlan.build`) piece by piece ({where}; "
                      f"`auto` -> "
                      f"`{s['backend']}`; {s['nnz']} entries, {s['join_terms']} join terms"
                      f"{mask}):", '', '| piece | ms |', '|---|---|']
        for k, v in s['pieces'].items():
            lines.append(f'| {k} | {ms(v)} |')
        lines += ['', f"Total: {ms(sum(s['pieces'].values()))} ms per batch"
                  + (f" (of it the join and mask statistics alone, `mask_statistics`: "
                     f"{ms(s['join'])} ms)" if s.get('join') is not None else '')
                  + (f"; the plan holds {s['plan_bytes'] / 2 ** 20:.1f} MiB"
                     if s.get('plan_bytes') else '') + '.', '',
                  '`cProfile`, cumulative ms per step of the package functions (nested: a '
                  'function includes its callees; `backward` is all of autograd):', '',
                  '| function | calls / step | cum ms / step |', '|---|---|---|']
        for r in P['cprofile']:
            lines.append(f"| `{r['function']}` | {r['calls_per_step']:.0f} | "
                         f"{ms(r['cum_s_per_step'])} |")
        lines += ['', '`torch.profiler`, top ops by self CPU time per step (forward and backward):',
                  '', '| op | calls / step | self ms / step |', '|---|---|---|']
        for r in P['ops']:
            lines.append(f"| `{r['op']}` | {r['calls_per_step']:.0f} | "
                         f"{ms(r['self_s_per_step'])} |")
        lines.append('')
    notes = ROOT / 'experiments' / 'results' / 'bench_model_notes.md'
    if notes.exists() and not R.get('quick'):
        lines += [notes.read_text()]
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repeats', type=int, default=7, help='round-robin rounds (batches)')
    p.add_argument('--grid-repeats', type=int, default=3, help='rounds on the 65k grid')
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--quick', action='store_true',
                   help='smoke run: small workloads, 2 rounds, output under the temp dir')
    p.add_argument('--only', default=None, help='comma-separated workloads (lrgb,tu,grid64k)')
    p.add_argument('--no-profile', action='store_true')
    p.add_argument('--profile-grid', action='store_true',
                   help='also profile the GRF-GPS step on the grid')
    p.add_argument('--merge', action='store_true',
                   help='keep the workloads of the existing JSON that this run (--only) skips')
    p.add_argument('--backends', action='store_true',
                   help="add GRF-GPS columns with each explicit backend on the batches")
    p.add_argument('--load-note', default='Two long training experiments ran on both CPU cores '
                   'of this 2-core machine during the run; this script was pinned to one thread.')
    p.add_argument('--out', default=None,
                   help='output prefix (default: experiments/results/bench_model)')
    p.add_argument('--markdown-from', default=None,
                   help='rewrite the markdown from a saved JSON file and exit')
    args = p.parse_args(argv)
    default_out = (Path(tempfile.gettempdir()) / 'bench_model_quick' if args.quick
                   else ROOT / 'experiments' / 'results' / 'bench_model')
    out = Path(args.out) if args.out else default_out
    if args.markdown_from:
        R = json.loads(Path(args.markdown_from).read_text())
        out.with_suffix('.md').write_text(to_markdown(R))
        return
    torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats
    grid_repeats = 1 if args.quick else args.grid_repeats
    warmup = 1
    if args.quick:
        work = [('lrgb', '8 molecule-like graphs of 120-180 nodes (quick)',
                 lambda: make_batch(8, 120, 180)),
                ('tu', '16 molecule-like graphs of 20-40 nodes (quick)',
                 lambda: make_batch(16, 20, 40, seed=1)),
                ('grid64k', 'one 2-D grid of 32 x 32 nodes (quick)', lambda: make_grid(32))]
    else:
        work = [('lrgb', '64 molecule-like graphs of 120-180 nodes (LRGB-sized)',
                 lambda: make_batch(64, 120, 180)),
                ('tu', '128 molecule-like graphs of 20-40 nodes (TU-sized)',
                 lambda: make_batch(128, 20, 40, seed=1)),
                ('grid64k', 'one 2-D grid of 256 x 256 = 65,536 nodes, full-graph steps',
                 lambda: make_grid(256))]
    if args.only:
        keep = set(args.only.split(','))
        work = [w for w in work if w[0] in keep]
    argl = list(argv if argv is not None else sys.argv[1:])
    if '--load-note' in argl[:-1]:  # the note is printed as its own paragraph
        argl[argl.index('--load-note') + 1] = '<note>'
    cmd = shlex.join(argl)
    R = {'command': f'OMP_NUM_THREADS={os.environ.get("OMP_NUM_THREADS")} python '
                    f'bench/bench_model.py {cmd}'.rstrip(),
         'threads': args.threads, 'repeats': repeats, 'grid_repeats': grid_repeats,
         'warmup': warmup, 'quick': args.quick, 'transform': repr(TRANSFORM),
         'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores, '
                    f'torch {torch.__version__}',
         'load_note': args.load_note, 'workloads': [],
         'linear_layer': {}, 'profiles': {}}
    for name, desc, make in work:
        b = make()
        node_level = b.num_graphs == 1
        entry = {'name': name, 'desc': desc, 'command': R['command'],
                 'loadavg': [os.getloadavg()[0]], 'num_nodes': b.num_nodes,
                 'num_graphs': b.num_graphs, 'num_edges': b.edge_index.size(1),
                 'nnz': b.grf_index.size(1), 'steps': {}, 'skipped': {}}
        cols = list(COLUMNS) + (list(BACKEND_COLUMNS) if args.backends and b.num_graphs > 1
                                else [])
        if node_level:  # the GRF columns here already use one payload built outside the step
            cols = [c for c in cols if c not in (PRE, PRE_BETA)]
        if node_level and b.num_nodes > 16384:
            entry['skipped'][MHA] = (
                'cannot run: exact attention over one graph of 65,536 nodes needs a '
                '65,536^2 score matrix per head, 16 GiB each in float32 and 64 GiB for 4 heads '
                '(PyG pads with to_dense_batch and passes a key padding mask, so torch runs the '
                'materialising path), above this machine\'s 23 GiB; at 16k nodes one padded '
                'MultiheadAttention layer already took 2.9 s fwd+bwd (bench_batch.md)')
            cols = [c for c in cols if c not in entry['skipped']]
            entry['note'] = ('Full-graph training: one `GRFPlan` built before the loop and '
                             'passed to every step.')
        grf_model = Net(GRF, node_level)
        t = time.perf_counter()
        plan = fresh_plan(grf_model, b)
        if node_level:
            entry['prep_once'] = time.perf_counter() - t
        entry['backend'] = [p.backend for p in plan.parts.values()][0]
        entry['plan_bytes'] = sum(plan.nbytes().values())
        del plan, grf_model
        print(f"{name}: {b.num_nodes} nodes, {b.num_graphs} graphs, {entry['nnz']} GRF entries, "
              f"backend {entry['backend']}", flush=True)
        steps = {c: make_step(c, b, node_level, once=node_level) for c in cols}
        if node_level:  # the first step (allocations, warm-up): time it apart
            t = time.perf_counter()
            steps[GRF]()
            entry['first_grf_step'] = time.perf_counter() - t
        entry['rounds'] = grid_repeats if node_level else repeats
        entry['times'] = round_robin(steps, entry['rounds'], warmup)
        entry['loadavg'].append(os.getloadavg()[0])
        entry['steps'] = {c: statistics.median(v) for c, v in entry['times'].items()}
        for c, v in entry['steps'].items():
            print(f'  {c:40s} {ms(v):>9s} ms', flush=True)
        R['workloads'].append(entry)
        if not node_level:
            R['linear_layer'][name] = linear_layer_old_new(b, repeats)
            r = R['linear_layer'][name]
            print(f"  LinearAttention layer old {ms(r['old'])} ms, new {ms(r['new'])} ms",
                  flush=True)
        if (name == 'lrgb' and not args.no_profile) or (node_level and args.profile_grid):
            n_prof = 1 if args.quick or node_level else 3
            R['profiles'][name] = dict(profile_step(b, GRF, n_prof, node_level), workload=name,
                                       steps=n_prof)
        del steps
    if args.merge and out.with_suffix('.json').exists():  # keep the workloads not run now
        old = json.loads(out.with_suffix('.json').read_text())
        done = {w['name'] for w in R['workloads']}
        order = ['lrgb', 'tu', 'grid64k']
        for w in old['workloads']:
            if w['name'] not in done:
                R['workloads'].append(w)
                for key in ('linear_layer', 'profiles'):
                    if w['name'] in old.get(key, {}):
                        R[key][w['name']] = old[key][w['name']]
        R['workloads'].sort(key=lambda w: order.index(w['name']) if w['name'] in order else 9)
    R['commands'] = list(dict.fromkeys(w['command'] for w in R['workloads']))
    R['targets'] = targets(R)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix('.json').write_text(json.dumps(R, indent=1))
    out.with_suffix('.md').write_text(to_markdown(R))
    print(to_markdown(R))


if __name__ == '__main__':
    main()
