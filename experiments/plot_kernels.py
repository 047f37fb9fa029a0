r"""Adjacency, graph diffusion kernel and RWGNK matrix of a small graph side by side (FTFI paper,
Fig. 4): the last two are smoothings of the adjacency matrix.

    python experiments/plot_kernels.py [--rows 6 --cols 6 --lam 0.5 --walk-length 3]

Writes experiments/results/kernels.png. Uses matplotlib when it is installed; otherwise a
dependency-free fallback writes the same three panels as a grayscale PNG (darker = stronger, each
panel scaled to its own maximum) with the standard library's zlib.
"""
from __future__ import annotations

import argparse
import os.path as osp
import struct
import sys
import zlib

import numpy as np
import scipy.linalg
import torch
from torch_geometric.utils import grid

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from pyg_grf.features import rwgnk_features  # noqa: E402

OUT = osp.join(REPO, 'experiments', 'results', 'kernels.png')


def matrices(rows, cols, lam, walk_length, num_walks, seed):
    n = rows * cols
    edge_index, _ = grid(rows, cols)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]  # PyG's grid adds self-loops
    adj = np.zeros((n, n))
    adj[edge_index[0].numpy(), edge_index[1].numpy()] = 1.0
    lap = np.diag(adj.sum(1)) - adj
    diffusion = scipy.linalg.expm(-lam * lap)
    psi = rwgnk_features(edge_index, n, num_walks, lam=lam, alpha=1.0, max_length=walk_length,
                         generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    psi = psi.to_dense().numpy()
    return adj, diffusion, psi @ psi.T


def save_png_fallback(panels, path, scale=8, gap=8):
    r"""Grayscale PNG of the panels side by side, without matplotlib."""
    imgs = []
    for m in panels:
        m = np.clip(m / max(float(m.max()), 1e-12), 0.0, 1.0)
        img = (255 * (1.0 - m)).astype(np.uint8)  # darker = stronger
        imgs.append(np.kron(img, np.ones((scale, scale), dtype=np.uint8)))
    h = max(i.shape[0] for i in imgs)
    sep = np.full((h, gap), 255, dtype=np.uint8)
    canvas = np.concatenate(sum(([i, sep] for i in imgs), [])[:-1], axis=1)
    raw = b''.join(b'\x00' + row.tobytes() for row in canvas)

    def chunk(tag, data):
        return (struct.pack('>I', len(data)) + tag + data
                + struct.pack('>I', zlib.crc32(tag + data) & 0xffffffff))

    png = (b'\x89PNG\r\n\x1a\n'
           + chunk(b'IHDR', struct.pack('>IIBBBBB', canvas.shape[1], canvas.shape[0], 8, 0, 0,
                                        0, 0))
           + chunk(b'IDAT', zlib.compress(raw, 9)) + chunk(b'IEND', b''))
    with open(path, 'wb') as f:
        f.write(png)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rows', type=int, default=6)
    p.add_argument('--cols', type=int, default=6)
    p.add_argument('--lam', type=float, default=0.5)
    p.add_argument('--walk-length', type=int, default=3)
    p.add_argument('--num-walks', type=int, default=64)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=OUT)
    args = p.parse_args(argv)
    adj, diffusion, rwgnk = matrices(args.rows, args.cols, args.lam, args.walk_length,
                                     args.num_walks, args.seed)
    titles = ['adjacency', f'diffusion exp(-{args.lam} L)',
              f'RWGNK (tau={args.walk_length}, lam={args.lam}, alpha=1)']
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: writing a plain grayscale PNG instead '
              f'(panels: {", ".join(titles)})')
        save_png_fallback([adj, diffusion, rwgnk], args.out)
    else:
        fig, axes = plt.subplots(1, 3, figsize=(12, 4))
        for ax, m, t in zip(axes, [adj, diffusion, rwgnk], titles):
            ax.imshow(m, cmap='Greys')
            ax.set_title(t)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.suptitle(f'{args.rows}x{args.cols} grid graph (8 neighbours, '
                     f'torch_geometric.utils.grid)')
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
