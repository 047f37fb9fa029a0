r"""How much of the package one attention forward runs through (a script, not a test).

For every GRF backend and GKAT mode (``'linear'`` with each backend, ``'softmax'``), the plan
of a small batch is built first (``attn.payload``), then one forward and one backward are
traced with :func:`sys.setprofile`. Printed per call: the package functions entered
(distinct), the package files they live in, and the deepest stack of package frames. The plan
build is traced too, as its own row.

Usage::

    python bench/call_path.py
"""
from __future__ import annotations

import os
import sys
from collections import Counter

import torch
from torch_geometric.data import Batch, Data

import pyg_grf
from pyg_grf.nn.attention.gkat import GKATAttention
from pyg_grf.nn.attention.grf import GRFAttention
from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures

ROOT = os.path.dirname(os.path.abspath(pyg_grf.__file__))


def trace(fn):
    r"""Runs ``fn()`` under a profiler hook: (functions, files, depth) of the package."""
    functions, files = Counter(), set()
    depth = [0, 0]

    def hook(frame, event, arg):
        path = frame.f_code.co_filename
        if not path.startswith(ROOT):
            return
        if event == 'call':
            rel = os.path.relpath(path, ROOT)
            functions[(rel, frame.f_code.co_name)] += 1
            files.add(rel)
            depth[0] += 1
            depth[1] = max(depth[1], depth[0])
        elif event == 'return':
            depth[0] -= 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return functions, files, depth[1]


def graphs(transform, n=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for size in (7, 12, 9)[:n]:
        ring = torch.arange(size)
        ei = torch.stack([ring, (ring + 1) % size])
        ei = torch.cat([ei, ei.flip(0)], 1)
        out.append(transform(Data(x=torch.randn(size, 8, generator=gen), edge_index=ei,
                                  num_nodes=size)))
    return Batch.from_data_list(out)


def row(name, fn):
    functions, files, depth = trace(fn)
    print(f"| {name} | {len(functions)} | {len(files)} | {depth} | {', '.join(sorted(files))} |")


def main():
    torch.manual_seed(0)
    grf_batch = graphs(AddGraphRandomFeatures(num_walks=4, p_halt=0.5, max_length=2, seed=0))
    rwgnk = dict(num_walks=4, lam=0.8, alpha=1.0, max_length=2, p_halt=0.5, seed=0)
    exact = graphs(AddRWGNKFeatures(**rwgnk))  # Psi only: 'sparse' computes Psi Psi^T
    pairs = graphs(AddRWGNKFeatures(**rwgnk, kernel_threshold=0.0))  # and the kernel pairs
    print('| call | package functions | files | package frames deep | which files |')
    print('|---|---|---|---|---|')
    layers = [(f'GRF {backend}', GRFAttention(8, heads=2, max_length=2, backend=backend),
               grf_batch) for backend in ('sparse', 'pairs')]
    layers += [(f'GKAT linear {backend}', GKATAttention(8, heads=2, backend=backend), b)
               for backend, b in (('sparse', exact), ('pairs', pairs))]
    layers.append(('GKAT softmax', GKATAttention(8, heads=2, mode='softmax'), pairs))
    for name, attn, b in layers:
        row(f'{name}: plan (attn.payload)', lambda: attn.payload(b))
        payload = attn.payload(b)
        x = b.x.clone().requires_grad_()
        row(f'{name}: forward', lambda: attn(x, b.batch, **payload))
        out = attn(x, b.batch, **payload)
        row(f'{name}: backward', lambda: out.sum().backward())


if __name__ == '__main__':
    main()
