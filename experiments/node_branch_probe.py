r"""Cora: does the GRF branch of :class:`~pyg_grf.nn.GRFNodeModel` lose because of *where* it
enters the model or because of *how much* of it training keeps? A probe for issue 41, where the
GRF model sits 1.5-2 points below its own no-attention control on the citation graphs.

Two hypotheses, each with the unmasked control beside it (same place, same decay):

* **Placement.** The branch reads the first hidden layer and is added to the *logits*, so it
  bypasses the GCN's second propagation: a node's output may then depend on its own hidden
  features without smoothing, which 140 labels can overfit. ``*_hidden`` adds the attention's
  output to the hidden layer instead, before the second convolution, which propagates it:
  :math:`\mathbf{y} = \mathrm{conv}_2(\mathbf{h}^{(1)} + g\,\mathrm{drop}(\mathrm{Attn}(
  \mathbf{h}^{(1)})))`.
* **Decay.** The gate :math:`g` is exempt from weight decay, so the product :math:`g\mathbf{W}_o`
  can grow past the decay of :math:`\mathbf{W}_o` (learnt gates end at :math:`|g| \approx 1`).
  ``*_decay`` decays the whole branch, gate included, at 5e-3 (10x the GCN's 5e-4);
  ``*_gatedecay`` only adds the gate to the GCN's 5e-4; ``*_zero`` drops the free gate (fixed at
  1) and zero-initialises :math:`\mathbf{W}_o`, so the branch starts at 0 and decays with it.

Every run is the same plain loop (``harness.full_graph_epoch``): Kipf and Welling's GCN (64
hidden, dropout 0.5 on inputs and hidden, ``head='conv'``) with the selected Cora settings of
``node_models.md`` (4 heads, attention dropout 0.5, gate from 0, walks 32 / p_halt 0.25 /
length 3 drawn with the seed), Adam at 0.01 with weight decay 5e-4 on every parameter but the
gate (biases included, as ``node_selection_probe.py``), at most 1000 epochs, patience 100 on
validation accuracy, test accuracy at the best validation epoch (ties: the first). Rows go to
``experiments/results/node_branch_probe/runs.jsonl``, the table to ``node_branch_probe.md``::

    python experiments/node_branch_probe.py --seeds 10
"""
from __future__ import annotations

import functools
import os.path as osp
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from harness import (  # noqa: E402
    experiment_main,
    full_graph_epoch,
    mean_std,
    paired,
    read_rows,
    run_grid,
)
from node_selection_probe import load  # noqa: E402

HERE = osp.dirname(osp.abspath(__file__))
OUT = osp.join(HERE, 'results', 'node_branch_probe')
TABLE = osp.join(HERE, 'results', 'node_branch_probe.md')
#: variant -> (attention, placement, branch weight decay, gate decayed, zero-initialised output)
VARIANTS = {
    'none': (None, 'logits', 5e-4, False, False),
    'grf': ('grf', 'logits', 5e-4, False, False),
    'linear': ('linear', 'logits', 5e-4, False, False),
    'grf_hidden': ('grf', 'hidden', 5e-4, False, False),
    'linear_hidden': ('linear', 'hidden', 5e-4, False, False),
    'grf_decay': ('grf', 'logits', 5e-3, True, False),
    'linear_decay': ('linear', 'logits', 5e-3, True, False),
    'grf_hidden_decay': ('grf', 'hidden', 5e-3, True, False),
    'grf_gatedecay': ('grf', 'logits', 5e-4, True, False),
    'linear_gatedecay': ('linear', 'logits', 5e-4, True, False),
    'grf_zero': ('grf', 'logits', 5e-4, False, True),
    'linear_zero': ('linear', 'logits', 5e-4, False, True),
}
PATIENCE, MAX_EPOCHS = 100, 1000


def hidden_forward(model, data):
    r"""``model`` (a two-layer ``head='conv'`` :class:`~pyg_grf.nn.GRFNodeModel`) with its
    attention added to the hidden layer before the second convolution."""
    x = data.x
    adj = model.adjacency(data.edge_index, x.size(0), x.dtype)
    h = F.dropout(x, model.input_dropout, model.training)
    h = F.dropout(model.act(model._conv(model.convs[0], h, adj)), model.dropout, model.training)
    z = model.attn(h, None, **model.attn.payload(data))
    h = h + model.gate * F.dropout(z, model.dropout, model.training)
    return model._conv(model.head, h, adj)


def fit(variant: str, seed: int) -> dict:
    from pyg_grf.nn import GRFNodeModel
    attn, place, wd_branch, gate_decay, zero = VARIANTS[variant]
    data = load(seed)
    torch.manual_seed(seed)
    kwargs = {'max_length': 3, 'dropout': 0.5} if attn == 'grf' else {'dropout': 0.5}
    model = GRFNodeModel(data.num_features, 64, 7, num_layers=2, head='conv', dropout=0.5,
                         input_dropout=0.5, attn_type=attn, heads=4, gate_init=0.0,
                         attn_kwargs=kwargs if attn else None)
    if zero:  # no free gate: the output map starts at zero and decays with the branch
        with torch.no_grad():
            model.gate.fill_(1.0)
            model.attn_out.weight.zero_()
            model.attn_out.bias.zero_()
        model.gate.requires_grad_(False)
    if place == 'hidden':  # the model's own call (train / eval switch) runs this forward
        model.forward = functools.partial(hidden_forward, model)
    skip = set() if gate_decay else model.no_weight_decay()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    branch = {n for n, _ in named if n.startswith('attn') or n == 'gate'}
    groups = [{'params': [p for n, p in named if n not in skip and n not in branch],
               'weight_decay': 5e-4},
              {'params': [p for n, p in named if n not in skip and n in branch],
               'weight_decay': wd_branch},
              {'params': [p for n, p in named if n in skip], 'weight_decay': 0.0}]
    opt = torch.optim.Adam(groups, lr=0.01)
    val, test = [], []
    start, best, since = time.perf_counter(), 0, 0
    for epoch in range(MAX_EPOCHS):
        v, t = full_graph_epoch(model, opt, data)
        val.append(v)
        test.append(t)
        if v > val[best]:
            best, since = epoch, 0
        elif epoch:
            since += 1
            if since >= PATIENCE:
                break
    gate = float(model.gate.detach()) if model.gate is not None and not zero else None
    return {'best_val': val[best], 'test/acc': test[best], 'best_epoch': best,
            'epochs_run': len(val), 'gate': gate, 'fit_s': time.perf_counter() - start,
            'params': sum(p.numel() for p in model.parameters())}


PAIRS = [('grf', 'none'), ('grf', 'linear'), ('linear', 'none'),
         ('grf_hidden', 'none'), ('grf_hidden', 'linear_hidden'), ('grf_hidden', 'grf'),
         ('grf_decay', 'none'), ('grf_decay', 'linear_decay'), ('grf_decay', 'grf'),
         ('grf_hidden_decay', 'none'), ('grf_gatedecay', 'none'),
         ('grf_gatedecay', 'linear_gatedecay'), ('grf_zero', 'none'),
         ('grf_zero', 'linear_zero')]


def write_table(out: str = OUT) -> str:
    rows = read_rows(osp.join(out, 'runs.jsonl'))
    lines = ['# Cora: where the GRF branch enters, and how much of it weight decay keeps', '',
             'Written by `experiments/node_branch_probe.py` (its docstring says what each '
             'variant is). Plain loop, patience 100, test accuracy (%) at the best validation '
             'epoch, mean ± std over seeds; abs(gate) is the mean absolute learnt gate at the end '
             '(none for `*_zero`, whose gate is fixed at 1).',
             '', '| variant | seeds | test acc | best val acc | abs(gate) | s / run |',
             '|---|---|---|---|---|---|']
    for v in VARIANTS:
        rs = [r for r in rows if r['variant'] == v]
        if not rs:
            continue
        m, s = mean_std([100 * r['test/acc'] for r in rs])
        val, _ = mean_std([100 * r['best_val'] for r in rs])
        gates = [abs(r['gate']) for r in rs if r.get('gate') is not None and not VARIANTS[v][4]]
        gate = f'{sum(gates) / len(gates):.2f}' if gates else ''
        fit_s = sum(r['fit_s'] for r in rs) / len(rs)
        lines.append(f'| {v} | {len(rs)} | {m:.1f} ± {s:.1f} | {val:.1f} | {gate} | '
                     f'{fit_s:.0f} |')
    lines += ['', '| paired difference (test) | mean ± SE (seeds better) | val, mean ± SE |',
              '|---|---|---|']
    for a, b in PAIRS:
        p = paired(rows, a, b, 'test/acc')
        q = paired(rows, a, b, 'best_val')
        if p:
            lines.append(f"| {a} - {b} | {p['mean']:+.1f} ± {p['se']:.1f} "
                         f"({p['better']}/{p['seeds']}) | {q['mean']:+.1f} ± {q['se']:.1f} |")
    commits = sorted({str(r.get('commit')) for r in rows if r.get('commit')})
    prov = next((r for r in rows if r.get('machine')), None)
    if prov:
        lines += ['', f"Commits {', '.join(commits)}; {prov['machine']}, torch "
                      f"{prov['torch']}; one thread per run."]
    lines += ['', 'Command:', '', '```',
              f'python experiments/node_branch_probe.py --seeds '
              f'{len({r["seed"] for r in rows})}', '```', '']
    text = '\n'.join(lines)
    with open(TABLE if out == OUT else osp.join(out, 'table.md'), 'w') as f:
        f.write(text)
    return text


def main(argv=None):
    def add_arguments(p):
        p.add_argument('--seeds', type=int, default=10)
        p.add_argument('--first-seed', type=int, default=0)
        p.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=list(VARIANTS))

    def run(args):
        run_grid({v: {} for v in args.variants}, range(args.first_seed, args.seeds), args.out,
                 lambda v, spec, seed, root: fit(v, seed), key={'dataset': 'cora'})

    experiment_main(__doc__, OUT, run, write_table, add_arguments, argv)


if __name__ == '__main__':
    main()
