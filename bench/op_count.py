r"""Operators per training step, counted on the CPU (a proxy for the kernel launches of a GPU
step), GRF-GPS against PyG's ``GPSConv``, and what ``torch.compile`` makes of the GRF model.

The workload is ``bench/gpu_check.py``'s molecule batch (128 molecule-like graphs of 120-180
nodes, node and edge encoders, 2 blocks of ``GINEConv`` + attention, 64 channels, 4 heads, mean
pool, BCE on 10 labels, ``Adam``). One step = a fresh batch object, forward, loss, backward,
``Adam`` step. For GRF-GPS the plan is built as the loader builds it
(:func:`pyg_grf.loader.prepare_payload`, outside the step: ``pyg_grf.loader.DataLoader`` does it
in its workers) and, in a second row, inside the step.

Two counts per step, with a ``TorchDispatchMode`` that sees every operator that reaches the
dispatcher:

* ``dispatched``: every operator once, ``pyg_grf``'s custom operators included as one each;
* ``expanded``: ``pyg_grf``'s custom operators replaced by the operators they run inside (what
  a GPU launches for them).

``--compile`` adds ``torch._dynamo.explain`` of the GRF model's forward (graph breaks, and
whether any lies in ``pyg_grf``), and a ``torch.compile(dynamic=True)`` run over four batches of
different sizes, counting the graphs compiled after the first batch. Usage::

    python bench/op_count.py [--graphs 128] [--compile] [--out experiments/results/op_count]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / 'bench')):
    if p not in sys.path:
        sys.path.insert(0, p)

from gpu_check import GRF, MHA, PERF, GPSNet, fresh, molecule_batch  # noqa: E402

from pyg_grf.loader import prepare_payload  # noqa: E402
from pyg_grf.nn.attention.grf import pairs  # noqa: E402

#: The Python implementation of every custom operator of the package (run when expanding).
CUSTOM = {torch.ops.pyg_grf.pair_sums.default: pairs.pair_sums._init_fn,
          torch.ops.pyg_grf.pair_sums_backward.default: pairs.pair_sums_backward._init_fn}


class OpCounter(TorchDispatchMode):
    r"""Counts the operators that reach the dispatcher, by name; with ``expand`` the package's
    custom operators are run as their Python implementation, so their inner operators are
    counted instead of them."""

    def __init__(self, expand: bool):
        super().__init__()
        self.expand = expand
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.expand and func in CUSTOM:  # below autograd, as the dispatcher runs it
            with torch._C._AutoDispatchBelowAutograd(), self:
                return CUSTOM[func](*args, **kwargs)
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


def make_step(column: str, b, in_loader: bool):
    torch.manual_seed(0)
    model = GPSNet(column).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if column == GRF and in_loader:
        prepare_payload(model, b)   # what the loader's collate function does per batch

    def batch():  # a new batch object holding the same tensors (and the loader's plan)
        if column == GRF and not in_loader:  # no plan kept by the layers: built in the step
            for m in model.modules():
                m.__dict__.pop('_plan_cache', None)
        return fresh(b)

    def step(data):
        opt.zero_grad(set_to_none=True)
        out = model(data)
        loss = F.binary_cross_entropy_with_logits(out, data.y)
        loss.backward()
        opt.step()
    return model, (batch, step)


def count(make, expand: bool) -> Counter:
    batch, step = make
    step(batch())  # warm-up: lazy state (Adam's moments, cached patterns) outside the count
    data = batch()
    c = OpCounter(expand)
    with c:
        step(data)
    return c.counts


def time_steps(makes: dict, rounds: int) -> dict:
    r"""Median seconds of one step per column, the columns interleaved round by round (the same
    machine state for all), after one warm-up step each."""
    import statistics
    import time
    times = {name: [] for name in makes}
    for batch, step in makes.values():
        step(batch())
    for _ in range(rounds):
        for name, (batch, step) in makes.items():
            data = batch()
            t = time.perf_counter()
            step(data)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) for name, t in times.items()}


def compile_check(b_list) -> dict:
    import torch._dynamo as dynamo
    out = {}
    torch.manual_seed(0)
    model = GPSNet(GRF).train()
    for b in b_list:
        prepare_payload(model, b)
    expl = dynamo.explain(model)(fresh(b_list[0]))
    reasons = [str(br.reason) for br in expl.break_reasons]
    frames = [f'{fs.filename}:{fs.lineno}' for br in expl.break_reasons for fs in br.user_stack]
    out['explain'] = dict(graphs=expl.graph_count, graph_breaks=expl.graph_break_count,
                          reasons=reasons,
                          breaks_in_pyg_grf=[f for f in frames if '/pyg_grf/' in f])
    dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    compiled = torch.compile(model, dynamic=True, backend='aot_eager')
    graphs = []
    for b in b_list:
        y = compiled(fresh(b))
        y.sum().backward()
        graphs.append(int(counters['stats']['unique_graphs']))
    out['dynamic'] = dict(batches=[int(b.num_nodes) for b in b_list], unique_graphs_after=graphs,
                          new_graphs_after_first=graphs[-1] - graphs[0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--graphs', type=int, default=128)
    ap.add_argument('--compile', action='store_true')
    ap.add_argument('--time', type=int, default=0, metavar='ROUNDS',
                    help='also time whole steps, ROUNDS interleaved rounds (one thread)')
    ap.add_argument('--out', default=None, help='write OUT.json and OUT.md')
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    b = molecule_batch(args.graphs, 120, 180, 0, torch.device('cpu'))
    rows, makes = [], {}
    for column, in_loader in ((MHA, False), (PERF, False), (GRF, True), (GRF, False)):
        where = 'in the loader' if in_loader else 'in the step'
        name = column if column != GRF else f'{GRF} (plan {where})'
        _, step = make_step(column, b, in_loader)
        makes[name] = step
        row = {'column': name}
        for expand in (False, True):
            c = count(step, expand)
            row['expanded' if expand else 'dispatched'] = sum(c.values())
            if expand:
                row['top'] = c.most_common(12)
        rows.append(row)
        if column == GRF:
            b = molecule_batch(args.graphs, 120, 180, 0, torch.device('cpu'))  # no plan on it
    base = rows[0]
    for r in rows:
        r['ratio_dispatched'] = round(r['dispatched'] / base['dispatched'], 3)
        r['ratio_expanded'] = round(r['expanded'] / base['expanded'], 3)
    if args.time:
        t = time_steps(makes, args.time)
        for r in rows:
            r['step_ms'] = round(1e3 * t[r['column']], 2)
            r['ratio_time'] = round(t[r['column']] / t[rows[0]['column']], 3)
    result = dict(workload=f'{args.graphs} molecule-like graphs of 120-180 nodes, C=64, H=4, '
                           f'2 GINE blocks (gpu_check.py molecule batch)',
                  torch=torch.__version__, machine=platform.platform(), rows=rows)
    if args.compile:
        sizes = [(args.graphs, 120, 180, 0), (args.graphs // 2, 120, 180, 1),
                 (args.graphs // 4, 20, 40, 2), (args.graphs // 3, 60, 90, 3)]
        result['compile'] = compile_check([molecule_batch(*s, torch.device('cpu'))
                                           for s in sizes])
    lines = ['| step | operators dispatched | ratio | expanded (custom ops opened) | ratio | '
             'step ms (1 thread) | ratio |', '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['column']} | {r['dispatched']} | {r['ratio_dispatched']:.2f}x | "
                     f"{r['expanded']} | {r['ratio_expanded']:.2f}x | {r.get('step_ms', '—')} | "
                     + (f"{r['ratio_time']:.2f}x |" if 'ratio_time' in r else '— |'))
    text = '\n'.join(lines)
    print(text)
    if args.compile:
        print(json.dumps(result['compile'], indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + '.json').write_text(json.dumps(result, indent=1))
        cmd = 'python bench/op_count.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
        Path(args.out + '.md').write_text(f'# Operators per training step\n\n`{cmd}`\n\n'
                                          f"{result['workload']}; torch {torch.__version__}."
                                          f'\n\n{text}\n')


if __name__ == '__main__':
    main()
