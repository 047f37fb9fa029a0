r"""Full-graph training step of :class:`~pyg_grf.nn.GRFNodeModel`'s local GCN stack (no
attention) against the same stack written with PyG's ``GCNConv`` two ways, side by side in one
process, on a Minesweeper-sized graph (a 100 x 100 grid with diagonals, 10k nodes; Luo et al.'s
tuned stack: 12 layers of 64 with linear skips, batch norm, dropout 0.2).

Variants, all holding the same weights:

* ``GRFNodeModel``: the normalised adjacency kept as a :class:`~pyg_grf.ops.SparsePattern` with
  its transpose, one CSR product per layer and one per layer in the backward;
* ``GCNConv(cached=True)``: PyG's message passing over ``edge_index``, normalisation cached;
* ``GCNConv on a CSR adjacency``: ``GCNConv(normalize=False)`` given the normalised adjacency
  as a torch CSR tensor (PyG's sparse path, which ``GRFNodeModel`` ran before), whose backward
  transposes the adjacency again in every layer of every step.

One step: forward, binary cross-entropy on every node, backward, Adam. The variants take turns
over ``--rounds`` rounds; printed: median step and its ratio to ``GCNConv(cached=True)``
(median over rounds of the per-round ratio)::

    OMP_NUM_THREADS=1 python bench/node_gcn.py
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.utils import grid, remove_self_loops

from pyg_grf.nn import GRFNodeModel
from pyg_grf.ops import csr_tensor


def pyg_stack(model: GRFNodeModel, cached: bool):
    r"""The model's local stack computed by PyG's ``GCNConv``: on ``edge_index`` with the
    normalisation cached (``cached=True``), or (``cached=False``) with ``normalize=False`` on the
    normalised adjacency as a torch CSR tensor."""
    convs = []
    for conv in model.convs:
        ref = GCNConv(conv.in_channels, conv.out_channels, cached=cached, normalize=cached)
        ref.lin.weight, ref.bias = conv.lin.weight, conv.bias  # shared parameters
        convs.append(ref)

    def forward(x, edge_index, adj):
        h = x
        for conv, skip, norm in zip(convs, model.skips, model.norms):
            out = conv(h, edge_index if cached else adj) + skip(h)
            h = F.dropout(F.relu(norm(out)), model.dropout, model.training)
        return model.head(h)
    return forward


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--side', type=int, default=100, help='grid side (nodes: side^2)')
    p.add_argument('--layers', type=int, default=12)
    p.add_argument('--steps', type=int, default=5, help='timed steps per variant and round')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    edge_index = remove_self_loops(grid(args.side, args.side)[0])[0]
    n = args.side ** 2
    gen = torch.Generator().manual_seed(0)
    data = Data(x=torch.randn(n, 7, generator=gen), edge_index=edge_index)
    y = (torch.rand(n, generator=gen) < 0.2).float()
    torch.manual_seed(0)
    model = GRFNodeModel(7, 64, 1, num_layers=args.layers, attn_type=None, norm='batch_norm',
                         residual=True, dropout=0.2)
    pattern, values = model.adjacency(edge_index, n)
    perm = pattern.perm if pattern.perm is not None else slice(None)
    adj = csr_tensor(pattern.crow, pattern.col, values[perm], (n, n))
    variants = {'GCNConv(cached=True)': pyg_stack(model, True),
                'GRFNodeModel': lambda x, ei, a: model(data),
                'GCNConv on a CSR adjacency': pyg_stack(model, False)}
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.eval()
    with torch.no_grad():  # the variants compute the same function
        want = variants['GRFNodeModel'](data.x, edge_index, adj)
        for name, fn in variants.items():
            assert torch.allclose(fn(data.x, edge_index, adj), want, atol=1e-4), name
    model.train()

    def step(fn):
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(fn(data.x, edge_index, adj).view(-1), y).backward()
        opt.step()

    base = next(iter(variants))
    times = {name: [] for name in variants}
    ratios = {name: [] for name in variants}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(variants)
        rng.shuffle(order)
        this = {}
        for name in order:
            step(variants[name])  # warm
            ts = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step(variants[name])
                ts.append(time.perf_counter() - t)
            this[name] = statistics.median(ts)
            times[name].append(this[name])
        for name in variants:
            ratios[name].append(this[name] / this[base])
    print(f'{n} nodes, {edge_index.size(1)} edges, {args.layers} GCN layers of 64 (skips, batch '
          f'norm); torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds of '
          f'{args.steps} steps\n')
    print(f'| variant | step ms (median) | ratio to {base} (median, min-max) |')
    print('|---|---|---|')
    for name in variants:
        r = ratios[name]
        print(f'| {name} | {1e3 * statistics.median(times[name]):.0f} | '
              f'{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}) |')


if __name__ == '__main__':
    main()
