r"""What the GRF mask does to few-label node classification when it is nothing but a propagation:
Kipf and Welling's two-layer GCN, whose logits :math:`\mathbf{Y}` are then averaged over a mask,
:math:`\mathbf{Y}' = \mathrm{diag}(\mathbf{M}\mathbf{1})^{-1}\mathbf{M}\mathbf{Y}` (masked linear
attention with a constant kernel, :math:`\phi(\mathbf{q})^\top\phi(\mathbf{k}) = 1`), on Cora's
public split. No queries, keys or value projections: the mask alone.

The masks (GRF paper, Sec. 3, Eq. 4, 7-10; App. D):

* ``gcn``: no mask (the GCN itself);
* ``exact_sym``: :math:`\sum_k (f * f)_k \mathbf{W}^k`, the expectation of the symmetric GRF mask
  (:math:`\mathbf{W} = \mathbf{D}^{-1/2}\mathbf{A}\mathbf{D}^{-1/2}`), applied by sparse
  products;
* ``grf_sym``: its estimate :math:`\widehat\Phi\widehat\Phi^\top` from the walks of
  :class:`~pyg_grf.transforms.AddGraphRandomFeatures` (drawn once per seed);
* ``exact_asym`` / ``grf_asym``: :math:`\sum_l f_l \mathbf{W}^l` and its asymmetric estimate
  :math:`\widehat\Phi` (one-hot keys).

:math:`f` is either learnt (``learn_f``, from :math:`f_l = f_0^l`, undecayed) or fixed at
:math:`f_l = f_0^l`. Each variant is a name and a JSON of settings (``--variants
name='{"mask": "grf_sym", "num_walks": 32, "learn_f": false, "f0": 0.7}'``); rows go to
``experiments/results/node_mask_probe/runs.jsonl``, the table to ``node_mask_probe.md``::

    python experiments/node_mask_probe.py --seeds 5
"""
from __future__ import annotations

import argparse
import copy
import json
import os.path as osp
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from harness import full_graph_epoch, paired, run_grid  # noqa: E402

HERE = osp.dirname(osp.abspath(__file__))
OUT = osp.join(HERE, 'results', 'node_mask_probe')
TABLE = osp.join(HERE, 'results', 'node_mask_probe.md')
#: the default variants: name -> settings
VARIANTS = {
    'gcn': {'mask': None},
    'exact_sym_learnt': {'mask': 'exact_sym', 'learn_f': True, 'f0': 0.5},
    'grf_sym32_learnt': {'mask': 'grf_sym', 'learn_f': True, 'f0': 0.5, 'num_walks': 32},
    'exact_sym_fixed': {'mask': 'exact_sym', 'learn_f': False, 'f0': 0.7},
    'grf_sym32_fixed': {'mask': 'grf_sym', 'learn_f': False, 'f0': 0.7, 'num_walks': 32},
    'grf_sym128_fixed': {'mask': 'grf_sym', 'learn_f': False, 'f0': 0.7, 'num_walks': 128},
    'exact_asym_fixed': {'mask': 'exact_asym', 'learn_f': False, 'f0': 0.7},
    'grf_asym32_fixed': {'mask': 'grf_asym', 'learn_f': False, 'f0': 0.7, 'num_walks': 32},
    'grf_asym256_fixed': {'mask': 'grf_asym', 'learn_f': False, 'f0': 0.7, 'num_walks': 256},
}


class PropagatedGCN(torch.nn.Module):
    def __init__(self, data, mask, L, learn_f, f0, hidden=64):
        from torch_geometric.nn import GCNConv
        super().__init__()
        C = int(data.y.max()) + 1
        self.conv1 = GCNConv(data.num_features, hidden, cached=True)
        self.conv2 = GCNConv(hidden, C, cached=True)
        self.mask = mask
        self.f = torch.nn.Parameter(torch.tensor([f0 ** k for k in range(L + 1)]),
                                    requires_grad=learn_f)

    def propagate(self, data, y):
        from pyg_grf.features.grf import self_convolution
        from pyg_grf.masks import GRFMask
        N = y.size(0)
        f = self.f.abs()
        z = torch.cat([y, y.new_ones(N, 1)], 1)  # numerator and normaliser in one product
        if self.mask.startswith('grf'):
            m = GRFMask.from_loads(data.grf_index, data.grf_length, data.grf_load, f=f,
                                   num_nodes=N, asymmetric=self.mask == 'grf_asym')
            mz = m.matmul(z)
        else:  # Horner's rule with sparse products of W
            c = list(f if self.mask == 'exact_asym' else self_convolution(f))  # (f * f)_k
            mz = c[-1] * z
            for ck in reversed(c[:-1]):
                mz = ck * z + torch.sparse.mm(data.W, mz)
        return mz[:, :-1] / (mz[:, -1:] + 1e-6)

    def forward(self, data):
        x = F.dropout(data.x, 0.5, self.training)
        h = F.dropout(F.relu(self.conv1(x, data.edge_index)), 0.5, self.training)
        y = self.conv2(h, data.edge_index)
        return y if self.mask is None else self.propagate(data, y)


def fit(base, settings, seed, epochs=1000, patience=100):
    from pyg_grf.transforms import AddGraphRandomFeatures
    torch.manual_seed(seed)
    L = settings.get('max_length', 3)
    data = base
    if (settings.get('mask') or '').startswith('grf'):
        data = AddGraphRandomFeatures(num_walks=settings['num_walks'], p_halt=0.25,
                                      max_length=L, seed=seed)(copy.copy(base))
    model = PropagatedGCN(data, settings.get('mask'), L, settings.get('learn_f', False),
                          settings.get('f0', 0.7))
    decayed = [p for n, p in model.named_parameters() if n != 'f']
    opt = torch.optim.Adam([{'params': decayed, 'weight_decay': 5e-4},
                            {'params': [model.f], 'weight_decay': 0.0}], lr=0.01)
    best, test, bad, start = -1.0, 0.0, 0, time.perf_counter()
    for epoch in range(epochs):
        val, this_test = full_graph_epoch(model, opt, data)
        if val > best:
            best, bad, test = val, 0, this_test
        else:
            bad += 1
            if bad >= patience:
                break
    return {'best_val': best, 'test/acc': test, 'epochs_run': epoch + 1,
            'f': [round(v, 3) for v in model.f.abs().tolist()],
            'fit_s': round(time.perf_counter() - start, 1), 'settings': settings}


def load_cora():
    import torch_geometric.transforms as T
    from torch_geometric.utils import degree

    from pyg_grf.datasets import load_planetoid
    data = T.NormalizeFeatures()(load_planetoid('Cora')[0])
    row, col = data.edge_index
    dis = degree(row, data.num_nodes).clamp(min=1).pow(-0.5)
    data.W = torch.sparse_coo_tensor(data.edge_index, dis[row] * dis[col],
                                     (data.num_nodes,) * 2, check_invariants=False).coalesce()
    return data


def write_table(rows, names) -> str:
    import statistics
    lines = ['# The GRF mask as a propagation of GCN logits (Cora, public split)', '',
             'Written by `experiments/node_mask_probe.py` (its docstring says what each mask is). '
             "Kipf and Welling's GCN (64 hidden, dropout 0.5, Adam 0.01, weight decay 5e-4) whose "
             'logits are averaged over the mask, row-normalised; p_halt 0.25, max_length 3; '
             'walks drawn with the seed. Test accuracy (%) at the best validation epoch '
             '(patience 100), mean ± std over seeds; paired difference to `gcn` (mean ± SE).', '',
             '| variant | settings | seeds | test acc | val acc | vs gcn | learnt f (seed 0) |',
             '|---|---|---|---|---|---|---|']
    for name in names:
        rs = sorted((r for r in rows if r['variant'] == name), key=lambda r: r['seed'])
        if not rs:
            continue
        t = [100 * r['test/acc'] for r in rs]
        v = [100 * r['best_val'] for r in rs]
        sd = statistics.stdev(t) if len(t) > 1 else float('nan')
        d = None if name == 'gcn' else paired(rows, name, 'gcn', 'test/acc')
        diff = '' if d is None else (f"{d['mean']:+.1f} ± {d['se']:.1f} "
                                     f"({d['better']}/{d['seeds']} better)")
        f = rs[0]['f'] if rs[0]['settings'].get('learn_f') else ''
        lines.append(f"| {name} | `{json.dumps(rs[0]['settings'])}` | {len(rs)} | "
                     f"{statistics.mean(t):.1f} ± {sd:.1f} | {statistics.mean(v):.1f} | {diff} "
                     f"| {f} |")
    commits = sorted({r['commit'] for r in rows if r.get('commit')})
    machines = sorted({r['machine'] for r in rows if r.get('machine')})
    lines += ['', f"Runs at commits {', '.join(commits)}, on {'; '.join(machines)}; one thread.",
              '', 'Command: `python experiments/node_mask_probe.py --seeds 5`', '']
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--seeds', type=int, default=5)
    p.add_argument('--variants', nargs='+', default=list(VARIANTS),
                   help="names of VARIANTS, or name='{json settings}'")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    variants = {}
    for v in args.variants:
        name, _, spec = v.partition('=')
        if spec:
            variants[name] = json.loads(spec)
        elif name in VARIANTS:
            variants[name] = VARIANTS[name]
        else:
            p.error(f'unknown variant {name!r}; expected one of {list(VARIANTS)} or '
                    "name='{json}'")
    base = load_cora()
    rows = run_grid(variants, range(args.seeds), OUT,
                    lambda name, spec, seed, root: fit(base, spec, seed))
    names = list(dict.fromkeys([*VARIANTS, *variants]))
    with open(TABLE, 'w') as f:
        f.write(write_table(rows, names))
    print(open(TABLE).read())


if __name__ == '__main__':
    main()
