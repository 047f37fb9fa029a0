r"""Cost of the three ways to train a GRF model on one large graph (PubMed, 19,717 nodes):

* ``full``: the whole graph every step, one :class:`~pyg_grf.nn.attention.grf.GRFPlan` (the
  payload of both GRF layers, ``model_payload(model, data)``) built once and reused for every
  step (O(N) per step);
* ``restrict``: :class:`~torch_geometric.loader.RandomNodeLoader` with ``--parts`` parts, the full
  graph's walks restricted to each part (:class:`~pyg_grf.transforms.RestrictGraphRandomFeatures`);
* ``recompute``: the same loader, fresh walks drawn on every part
  (:class:`~pyg_grf.transforms.AddGraphRandomFeatures` as the per-batch transform);
* ``ddp``: ``restrict`` under :class:`~torch.nn.parallel.DistributedDataParallel` with
  ``--ranks`` CPU processes (gloo), each taking its share of the parts of every epoch.

Each way runs in its own process (clean peak memory). Reported: median seconds per epoch (one
epoch = one pass over all training nodes: one full-graph step, or one step per part) over
``--epochs`` epochs after one warm-up epoch; the peak resident memory of training (``VmHWM``
over the warm-up and timed epochs, reset through ``/proc/self/clear_refs`` once the data, the
walks and the model are ready, minus the resident memory at that point; the largest rank for
DDP) and the process's peak over its lifetime (loading, walks and training). Writes
``experiments/results/large_graphs.md`` and JSON under ``experiments/results/runs/large_graphs/``
(git-ignored; ``--runs`` elsewhere)::

    OMP_NUM_THREADS=1 taskset -c 1 python bench/large_graphs.py --threads 1
    python bench/large_graphs.py --dataset Cora --ways full restrict --epochs 1 \
        --runs /tmp/large_graphs   # smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

import torch.nn.functional as F
from torch import nn

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from pyg_grf.nn import GRFAttention  # noqa: E402
from pyg_grf.nn.attention.base import model_payload  # noqa: E402
from pyg_grf.nn.attention.grf import GRFPlan  # noqa: E402

RUNS = osp.join(REPO, 'experiments', 'results', 'runs', 'large_graphs')
TABLE = osp.join(REPO, 'experiments', 'results', 'large_graphs.md')
WAYS = ('full', 'restrict', 'recompute', 'ddp')
BACKENDS = ('auto', 'sparse', 'pairs')


def _status():
    out = {}
    with open('/proc/self/status') as fh:
        for line in fh:
            if line.startswith(('VmRSS', 'VmHWM')):
                k, v = line.split(':')
                out[k] = int(v.split()[0]) / 1024.  # MiB
    return out


def _reset_peak():
    with open('/proc/self/clear_refs', 'w') as fh:
        fh.write('5')


def load(name: str = 'Cora'):
    mirror = osp.join(osp.dirname(REPO), 'shared', 'datasets')
    if 'PYG_GRF_MIRROR' not in os.environ and osp.isdir(mirror):
        os.environ['PYG_GRF_MIRROR'] = mirror
    os.environ.setdefault('PYG_GRF_DATA', tempfile.mkdtemp(prefix='pyg_grf_data_'))
    from torch_geometric.transforms import NormalizeFeatures

    from pyg_grf.datasets.planetoid import load_planetoid
    return load_planetoid(name, transform=NormalizeFeatures())[0]


class GRFNodeModel(nn.Module):
    r"""Input MLP, :obj:`num_layers` residual GRF attention layers, linear head."""
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 heads: int = 4, max_length: int = 3, num_layers: int = 1,
                 dropout: float = 0.5, backend: str = 'auto'):
        super().__init__()
        self.dropout = dropout
        self.lin_in = nn.Linear(in_channels, hidden_channels)
        self.attns = nn.ModuleList(GRFAttention(hidden_channels, heads=heads,
                                                max_length=max_length, backend=backend)
                                   for _ in range(num_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_channels) for _ in range(num_layers))
        self.lin_out = nn.Linear(hidden_channels, out_channels)

    def forward(self, x, grf: GRFPlan):
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.lin_in(x))
        for attn, norm in zip(self.attns, self.norms):
            h = F.dropout(x, self.dropout, self.training)
            x = norm(x + attn(h, grf=grf))
        return self.lin_out(F.dropout(x, self.dropout, self.training))


def _prepare(args):
    import torch

    from pyg_grf.transforms import AddGraphRandomFeatures
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = load(args.dataset)
    t0 = time.perf_counter()
    full = AddGraphRandomFeatures(num_walks=args.num_walks, p_halt=args.p_halt,
                                  max_length=args.max_length, seed=0)(data)
    grf_s = time.perf_counter() - t0
    full.n_id = torch.arange(full.num_nodes)
    model = GRFNodeModel(data.num_features, args.hidden, int(data.y.max()) + 1, heads=args.heads,
                         max_length=args.max_length, num_layers=args.layers, dropout=0.5,
                         backend=args.backend)
    return torch, data, full, model, grf_s


def _epochs(args, torch, model, opt, batches, barrier=None):
    import torch.nn.functional as F
    times = []
    for epoch in range(args.epochs + 1):
        if barrier:
            barrier()
        if epoch == 0:  # data, walks and model ready
            st = _status()
            rss0, hwm0 = st['VmRSS'], st['VmHWM']
            _reset_peak()
        t0 = time.perf_counter()
        for part, grf in batches(epoch):
            opt.zero_grad()
            out = model(part.x, grf)
            mask = part.train_mask
            # a part without training nodes still takes its (zero-loss) step under DDP, so that
            # the ranks stay in step
            loss = F.cross_entropy(out[mask], part.y[mask]) if bool(mask.any()) else out.sum() * 0
            loss.backward()
            opt.step()
        if barrier:
            barrier()
        if epoch >= 1:  # after the warm-up epoch
            times.append(time.perf_counter() - t0)
    hwm = _status()['VmHWM']
    return statistics.median(times), hwm - rss0, max(hwm, hwm0)


def worker(args, way, rank=0, world=1):
    torch, data, full, model, grf_s = _prepare(args)
    from pyg_grf.transforms import AddGraphRandomFeatures, RestrictGraphRandomFeatures
    barrier = None
    if way == 'ddp':
        import torch.distributed as dist
        dist.init_process_group('gloo', rank=rank, world_size=world)
        torch.manual_seed(0)  # same initial weights on every rank
        model = torch.nn.parallel.DistributedDataParallel(model)
        barrier = dist.barrier
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    # one plan for both GRF layers (they share its structures), built once for the full graph
    full_grf = model_payload(model, full)['grf']
    restrict = RestrictGraphRandomFeatures(full)
    fresh = AddGraphRandomFeatures(num_walks=args.num_walks, p_halt=args.p_halt,
                                   max_length=args.max_length)
    base = data.clone()
    base.n_id = torch.arange(base.num_nodes)

    def batches(epoch):
        if way == 'full':
            yield full, full_grf
            return
        # The parts of RandomNodeLoader (Data.subgraph of a random chunk of the nodes), drawn
        # here from a per-epoch seed so that all DDP ranks agree on them.
        gen = torch.Generator().manual_seed(epoch)  # same parts on every rank
        perm = torch.randperm(full.num_nodes, generator=gen)
        parts = perm.tensor_split(args.parts)
        for k in range(rank, args.parts, world):  # this rank's share of the parts
            part = (full if way != 'recompute' else base).subgraph(parts[k])
            part = restrict(part) if way != 'recompute' else fresh(part)
            yield part, model_payload(model, part)['grf']  # the part's plan, per step

    s_epoch, train_peak, process_peak = _epochs(args, torch, model, opt, batches, barrier)
    res = dict(way=way, backend=args.backend, rank=rank, ranks=world,
               parts=1 if way == 'full' else args.parts,
               s_per_epoch=s_epoch, train_peak_mib=train_peak,
               process_peak_mib=process_peak, grf_s=grf_s,
               nnz=int(full.grf_index.size(1)), num_nodes=int(full.num_nodes),
               num_edges=int(full.num_edges), threads=torch.get_num_threads())
    if way == 'ddp':
        import torch.distributed as dist
        gathered = [None] * world
        dist.all_gather_object(gathered, res)
        dist.barrier()
        dist.destroy_process_group()
        if rank != 0:
            return None
        res = dict(gathered[0], s_per_epoch=max(r['s_per_epoch'] for r in gathered),
                   train_peak_mib=max(r['train_peak_mib'] for r in gathered),
                   process_peak_mib=max(r['process_peak_mib'] for r in gathered),
                   per_rank=gathered)
    return res


def _ddp_entry(rank, args, world, path):
    res = worker(args, 'ddp', rank, world)
    if res is not None:
        with open(path, 'w') as fh:
            json.dump(res, fh)


def table(args) -> str:
    rows = []
    for way, backend in [(w, b) for b in BACKENDS for w in WAYS]:
        path = osp.join(args.runs, f'{way}_{backend}.json')
        if not osp.exists(path):
            continue
        with open(path) as fh:
            r = json.load(fh)
        desc = {'full': 'full graph, one GRFPlan for all steps',
                'restrict': f"RandomNodeLoader, {r['parts']} parts, full-graph walks restricted",
                'recompute': f"RandomNodeLoader, {r['parts']} parts, walks redrawn per part",
                'ddp': f"DDP, {r['ranks']} ranks (gloo) x {r['parts']} parts, restricted"}[way]
        rows.append(f"| {desc} | {backend} | {r['s_per_epoch']:.2f} | {r['train_peak_mib']:.0f} | "
                    f"{r['process_peak_mib']:.0f} |")
    head = ('| way | backend | s / epoch | training peak (MiB above the RSS before training) '
            '| process peak RSS (MiB) |\n|---|---|---|---|---|')
    return head + '\n' + '\n'.join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--ways', nargs='+', default=list(WAYS), choices=WAYS)
    p.add_argument('--dataset', default='PubMed')
    p.add_argument('--parts', type=int, default=8)
    p.add_argument('--ranks', type=int, default=2)
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--hidden', type=int, default=64)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--layers', type=int, default=2)
    p.add_argument('--num_walks', type=int, default=32)
    p.add_argument('--p_halt', type=float, default=0.3)
    p.add_argument('--max_length', type=int, default=3)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--backend', default='auto', choices=BACKENDS,
                   help="GRFAttention backend (see docs/speed.md)")
    p.add_argument('--runs', default=RUNS, help='folder of the JSON results (default: %(default)s)')
    p.add_argument('--worker', choices=WAYS, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault('PYG_GRF_DATA', tempfile.mkdtemp(prefix='pyg_grf_data_'))
    os.makedirs(args.runs, exist_ok=True)
    if args.worker == 'ddp':
        import torch.multiprocessing as mp
        os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
        os.environ.setdefault('MASTER_PORT', '29533')
        mp.spawn(_ddp_entry,
                 args=(args, args.ranks, osp.join(args.runs, f'ddp_{args.backend}.json')),
                 nprocs=args.ranks)
        return
    if args.worker is not None:
        res = worker(args, args.worker)
        with open(osp.join(args.runs, f'{args.worker}_{args.backend}.json'), 'w') as fh:
            json.dump(res, fh)
        return
    for way in args.ways:
        cmd = [sys.executable, osp.abspath(__file__), '--worker', way]
        for k, v in vars(args).items():
            if k not in ('ways', 'worker'):
                cmd += [f'--{k}', str(v)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        with open(osp.join(args.runs, f'{way}_{args.backend}.json')) as fh:
            r = json.load(fh)
        print(json.dumps({k: v for k, v in r.items() if k != 'per_rank'}),
              f'({time.perf_counter() - t0:.0f} s)', flush=True)
    text = table(args)
    print(text)


if __name__ == '__main__':
    main()
