r"""Full-graph training step of :class:`~pyg_grf.nn.GRFNodeModel` on a Planetoid graph, per mask
estimate and backend, against the same model without attention and with unmasked linear
attention, side by side in one process.

What it shows: the symmetric mask :math:`\widehat\Phi\widehat\Phi^\top` (GRF paper Eq. 7) has
as many pairs as the walks of two nodes overlap, so its cost grows faster than the walks' own
nonzeros on a graph whose dense regions share walks (PubMed), while the asymmetric mask
:math:`\widehat\Phi` (App. D) costs one product over the walks' nonzeros. Each variant is one
model (the node configs' settings: 64 hidden, 4 heads, ``head='conv'``), its plan built by the
first call (timed apart); then ``--steps`` training steps (forward, cross-entropy on the training
nodes, backward, Adam), the variants taking turns over ``--rounds`` rounds. Printed: the walks'
nonzeros and the symmetric mask's pairs per node, first-call seconds, the backend each GRF
variant ran (``'auto'`` chooses by :func:`~pyg_grf.nn.attention.grf.plan.multiply_adds`), and
the median step with its ratio to the model without attention (median over rounds of the
per-round ratio)::

    PYG_GRF_MIRROR=../shared/datasets OMP_NUM_THREADS=1 python bench/node_step.py --dataset PubMed
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T

from pyg_grf.datasets import load_planetoid
from pyg_grf.nn import GRFNodeModel
from pyg_grf.ops import without_csr_warning
from pyg_grf.transforms import AddGraphRandomFeatures

#: name -> (attn_type, attention kwargs): the node configs' attention settings
GRF = {'max_length': 3, 'dropout': 0.5}
VARIANTS = {
    'none (GCN alone)': (None, None),
    'linear (unmasked)': ('linear', {'dropout': 0.5}),
    'grf symmetric, auto': ('grf', dict(GRF, mode='symmetric', backend='auto')),
    'grf symmetric, pairs': ('grf', dict(GRF, mode='symmetric', backend='pairs')),
    'grf symmetric, sparse': ('grf', dict(GRF, mode='symmetric', backend='sparse')),
    'grf asymmetric, auto': ('grf', dict(GRF, mode='asymmetric', backend='auto')),
}


def mask_sizes(data) -> tuple:
    r"""Nonzeros of :math:`\widehat\Phi` and pairs of :math:`\widehat\Phi\widehat\Phi^\top`, per
    node (the mask's support, counted by a sparse product of the walks' pattern)."""
    n = data.num_nodes
    phi = torch.sparse_coo_tensor(data.grf_index, torch.ones(data.grf_index.size(1)),
                                  (n, n), check_invariants=True).coalesce()
    pairs = without_csr_warning(torch.sparse.mm, phi, phi.t().coalesce())._nnz()
    return phi._nnz() / n, pairs / n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--dataset', default='PubMed', choices=['Cora', 'CiteSeer', 'PubMed'])
    p.add_argument('--num-walks', type=int, default=32)
    p.add_argument('--steps', type=int, default=3, help='timed steps per variant and round')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_planetoid(args.dataset, transform=T.NormalizeFeatures(),
                          pre_transform=AddGraphRandomFeatures(num_walks=args.num_walks,
                                                               p_halt=0.25, max_length=3,
                                                               seed=0))[0]
    classes = int(data.y.max()) + 1
    per_phi, per_pair = mask_sizes(data)
    print(f'{args.dataset}: {data.num_nodes} nodes, {args.num_walks} walks per node; '
          f'walk nonzeros {per_phi:.1f} per node, symmetric mask pairs {per_pair:.1f} per node '
          f'({per_pair * data.num_nodes / 1e6:.1f}M); torch {torch.__version__}, '
          f'{args.threads} thread(s)')

    models, first = {}, {}
    for name, (attn_type, kwargs) in VARIANTS.items():
        torch.manual_seed(0)
        model = GRFNodeModel(data.num_features, 64, classes, num_layers=2, heads=4,
                             head='conv', input_dropout=0.5, attn_type=attn_type,
                             attn_kwargs=kwargs)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        t = time.perf_counter()
        model(data)  # builds and keeps the plan (and the GCN's adjacency)
        first[name] = time.perf_counter() - t
        models[name] = (model, opt)

    def step(model, opt):
        opt.zero_grad()
        out = model(data)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()

    times = {name: [] for name in models}
    ratios = {name: [] for name in models}
    rng = random.Random(0)
    base = next(iter(models))
    for _ in range(args.rounds):
        order = list(models)
        rng.shuffle(order)
        this = {}
        for name in order:
            model, opt = models[name]
            model.train()
            ts = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step(model, opt)
                ts.append(time.perf_counter() - t)
            this[name] = statistics.median(ts)
            times[name].append(this[name])
        for name in models:
            ratios[name].append(this[name] / this[base])
    print(f'\n| variant | ran | first call s | step s (median) | ratio to {base} '
          '(median, min-max) |')
    print('|---|---|---|---|---|')
    for name, (model, _) in models.items():
        r = ratios[name]
        print(f'| {name} | {ran(model)} | {first[name]:.2f} | '
              f'{statistics.median(times[name]):.3f} | '
              f'{statistics.median(r):.1f}x ({min(r):.1f}-{max(r):.1f}) |')


def ran(model) -> str:
    r"""The backend of the GRF plan the model's attention keeps ('' without one)."""
    plan = getattr(model.attn, '__dict__', {}).get('_plan_cache')
    parts = getattr(plan, 'parts', None)
    return ', '.join(sorted({p.backend for p in parts.values()})) if parts else ''


if __name__ == '__main__':
    main()
