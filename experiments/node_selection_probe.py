r"""Does best-epoch selection on validation hide the GRF node model's gap on Cora? A probe of
the hypothesis in ``node_models_notes.md``: the GRF model's validation accuracy equals its
controls' while its test accuracy is lower, which would happen if the noisier model's best
validation epoch is inflated more by chance on 500 validation nodes.

Each variant of :class:`~pyg_grf.nn.GRFNodeModel` (``grf``: the Cora config with the selected
settings, gate 0, attention dropout 0.5, 4 heads; ``linear``: unmasked linear attention;
``none``: no attention, Kipf and Welling's GCN) trains in a plain loop for a fixed number of
epochs (Adam, lr 0.01, weight decay 5e-4 but on the gate, as the config), seed ``s`` drawing
the weights and the walks, and records validation and test accuracy after every epoch. Three
readings of the same curves:

* ``best val``: test at the best validation epoch (ties: the first), what the tables report;
* ``last``: test at the last epoch (no selection);
* ``mean 101-E``: test accuracy averaged over epochs 101 to E (no selection, less noise).

One more variant tests whether the *fixed* draw is what costs: ``grf_resample`` is ``grf`` with
the walks redrawn before every training step (32 walks, a reproducible sequence from the seed,
so the model cannot fit one draw's noise) and evaluated on one draw of 128 walks (the same
expected mask, a quarter of the variance).

``grf_nohop0`` tests whether the mask's identity term is what costs: ``grf`` with the hop-0
coefficient :math:`f_0` pinned at 0 (zero at the start, its gradient zeroed), so the symmetric
mask :math:`\sum_k (f * f)_k W^k` loses its :math:`I` and :math:`W` terms and no node's own
value reaches its output except through walks that return (with :math:`f` learnt, the
mask-as-propagation probe, ``node_mask_probe.md``, saw :math:`f` collapse onto hop 0, making the
branch a per-node skip around the GCN's second layer).

Rows (curves included) go to ``experiments/results/node_selection_probe/runs.jsonl``, the
table to ``node_selection_probe.md``::

    python experiments/node_selection_probe.py --seeds 10 --epochs 300
"""
from __future__ import annotations

import argparse
import copy
import os.path as osp
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from harness import full_graph_epoch, mean_std, paired, read_rows, run_grid  # noqa: E402

HERE = osp.dirname(osp.abspath(__file__))
OUT = osp.join(HERE, 'results', 'node_selection_probe')
TABLE = osp.join(HERE, 'results', 'node_selection_probe.md')
VARIANTS = {'grf': 'grf', 'linear': 'linear', 'none': None, 'grf_resample': 'grf',
            'grf_nohop0': 'grf'}
#: walks of the evaluation draw of ``grf_resample``
EVAL_WALKS = 128
WINDOW = 100  # epochs before the averaging window


def load(seed: int, num_walks: int = 32):
    import torch_geometric.transforms as T

    from pyg_grf.datasets import load_planetoid
    from pyg_grf.transforms import AddGraphRandomFeatures
    walks = AddGraphRandomFeatures(num_walks=num_walks, p_halt=0.25, max_length=3, seed=seed)
    data = load_planetoid('Cora', transform=T.NormalizeFeatures())[0]
    return walks(data)


def pin_hop0(attn) -> None:
    r"""Pins the hop-0 coefficient :math:`f_0` of a :class:`~pyg_grf.nn.GRFAttention` at 0:
    set to 0 and its gradient zeroed (Adam's weight decay of a zero is zero)."""
    with torch.no_grad():
        attn.f[:, 0] = 0.0
    attn.f.register_hook(lambda g: g.index_fill(1, g.new_zeros(1, dtype=torch.long), 0.0))


def fit(variant: str, seed: int, epochs: int) -> dict:
    from pyg_grf.nn import GRFNodeModel
    if epochs <= WINDOW:
        raise ValueError(f'the averaged reading starts after epoch {WINDOW}: expected more '
                         f'epochs than {WINDOW}, got {epochs}')
    data = load(seed)
    redraw = eval_data = None
    if variant == 'grf_resample':  # a seeded transform draws a new set at every call
        from pyg_grf.transforms import AddGraphRandomFeatures
        redraw = AddGraphRandomFeatures(num_walks=32, p_halt=0.25, max_length=3, seed=seed + 1)
        eval_data = load(seed, EVAL_WALKS)
    torch.manual_seed(seed)
    attn = VARIANTS[variant]
    kwargs = {'max_length': 3, 'dropout': 0.5} if attn == 'grf' else {'dropout': 0.5}
    model = GRFNodeModel(data.num_features, 64, 7, num_layers=2, head='conv', dropout=0.5,
                         input_dropout=0.5, attn_type=attn, heads=4, gate_init=0.0,
                         attn_kwargs=kwargs if attn else None)
    if variant == 'grf_nohop0':
        pin_hop0(model.attn)
    skip = model.no_weight_decay()
    groups = [{'params': [p for n, p in model.named_parameters() if n not in skip],
               'weight_decay': 5e-4},
              {'params': [p for n, p in model.named_parameters() if n in skip],
               'weight_decay': 0.0}]
    opt = torch.optim.Adam(groups, lr=0.01)
    val, test = [], []
    start = time.perf_counter()
    for _ in range(epochs):
        train = data if redraw is None else redraw(copy.copy(data))
        v, t = full_graph_epoch(model, opt, train, eval_data)
        val.append(v)
        test.append(t)
    best = max(range(epochs), key=lambda e: (val[e], -e))
    return {'val': val, 'test': test, 'best_epoch': best, 'best_val': val[best],
            'test/best_val': test[best], 'test/last': test[-1],
            'test/mean': sum(test[WINDOW:]) / len(test[WINDOW:]),
            'val/mean': sum(val[WINDOW:]) / len(val[WINDOW:]),
            'fit_s': time.perf_counter() - start, 'epochs': epochs}


def write_table(out: str = OUT) -> str:
    rows = read_rows(osp.join(out, 'runs.jsonl'))
    epochs = rows[0]['epochs'] if rows else 0
    cols = [('test/best_val', 'best val'), ('test/last', 'last'),
            ('test/mean', f'mean {WINDOW + 1}-{epochs}'), ('best_val', 'best val acc'),
            ('val/mean', f'val mean {WINDOW + 1}-{epochs}')]
    lines = ['# Cora: test accuracy with and without best-epoch selection', '',
             'Written by `experiments/node_selection_probe.py` (its docstring says what runs). '
             f'Plain loop, {epochs} epochs, test accuracy (%) under three readings of each '
             'curve, mean ± std over seeds; paired differences (mean ± SE, seeds where the first '
             'is better) below.', '',
             '| variant | seeds | ' + ' | '.join(c[1] for c in cols) + ' | s / run |',
             '|---|---|' + '---|' * len(cols) + '---|']
    for v in VARIANTS:
        rs = [r for r in rows if r['variant'] == v]
        if not rs:
            continue
        cells = []
        for key, _ in cols:
            m, s = mean_std([100 * r[key] for r in rs])
            cells.append(f'{m:.1f} ± {s:.1f}')
        fit_s = sum(r['fit_s'] for r in rs) / len(rs)
        lines.append(f'| {v} | {len(rs)} | ' + ' | '.join(cells) + f' | {fit_s:.0f} |')
    lines += ['', '| paired difference | ' + ' | '.join(c[1] for c in cols[:3]) + ' |',
              '|---|' + '---|' * 3]
    for a, b in (('grf', 'linear'), ('grf', 'none'), ('grf_resample', 'grf'),
                 ('grf_resample', 'linear'), ('grf_resample', 'none'), ('grf_nohop0', 'grf'),
                 ('grf_nohop0', 'linear'), ('grf_nohop0', 'none')):
        cells = []
        for key, _ in cols[:3]:
            p = paired(rows, a, b, key)
            cells.append(f"{p['mean']:+.1f} ± {p['se']:.1f} ({p['better']}/{p['seeds']})"
                         if p else '')
        if any(cells):
            lines.append(f'| {a} - {b} | ' + ' | '.join(cells) + ' |')
    prov = next((r for r in rows if r.get('commit')), None)
    if prov:
        commits = {}
        for r in rows:
            commits.setdefault(r.get('commit'), set()).add(r['variant'])
        where = '; '.join(f"{', '.join(sorted(v))} at {c}" for c, v in sorted(
            commits.items(), key=lambda cv: str(cv[0])) if c)
        lines += ['', f"Commits: {where}; {prov['machine']}, torch {prov['torch']}."]
    lines += ['', 'Command:', '', '```',
              f'python experiments/node_selection_probe.py --seeds {len({r["seed"] for r in rows})}'
              f' --epochs {epochs}', '```', '']
    text = '\n'.join(lines)
    with open(TABLE if out == OUT else osp.join(out, 'table.md'), 'w') as f:
        f.write(text)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--seeds', type=int, default=10)
    p.add_argument('--epochs', type=int, default=300)
    p.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out', default=OUT)
    p.add_argument('--table-only', action='store_true')
    args = p.parse_args(argv)
    if not args.table_only:
        torch.set_num_threads(args.threads)
        run_grid({v: {} for v in args.variants}, list(range(args.seeds)), args.out,
                 lambda v, spec, seed, root: fit(v, seed, args.epochs), key={'dataset': 'cora'})
    print(write_table(args.out))


if __name__ == '__main__':
    main()
