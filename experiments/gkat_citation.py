r"""GKAT vs GAT on the citation networks (FTFI paper, App. A.5; Table 10).

Setup of App. A.5.2 (= GAT's, Velickovic et al. 2018): two attention layers, 8 heads x 8 hidden
units then 1 head with one output per class, ELU after the first layer, dropout 0.6 on the inputs
of both layers and on the normalised attention coefficients, Adam (lr 0.005, weight decay 5e-4),
early stopping on the validation split (patience 100, best validation accuracy, ties broken by
validation loss; test accuracy reported at the selected epoch). GKAT replaces GAT's adjacency mask
by the RWGNK kernel K = Psi Psi^T (walks sampled once per seed, as a pre-transform would).

Data: the public Planetoid split, raw files copied from the offline mirror
($PYG_GRF_MIRROR, default ../shared/datasets beside the repo) into $PYG_GRF_DATA (default
./datasets) by :func:`pyg_grf.datasets.planetoid.load_planetoid`.

Every (dataset, model) run stores a JSON summary under experiments/results/runs/gkat_citation/
(git-ignored) and the markdown table experiments/results/gkat_citation.md is rebuilt from all of
them, so datasets and models can run as separate, short jobs::

    nice -n 10 python experiments/gkat_citation.py --dataset Cora --model gkat --seeds 5
    nice -n 10 python experiments/gkat_citation.py --dataset Cora --model gat --seeds 5
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import os.path as osp
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv
from torch_geometric.transforms import NormalizeFeatures

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from pyg_grf.features import RWGNKLoads  # noqa: E402
from pyg_grf.nn import GKATAttention  # noqa: E402
from pyg_grf.transforms import AddRWGNKFeatures  # noqa: E402

RUNS = osp.join(REPO, 'experiments', 'results', 'runs', 'gkat_citation')
TABLE = osp.join(REPO, 'experiments', 'results', 'gkat_citation.md')
NOTES = osp.join(REPO, 'experiments', 'results', 'gkat_citation_notes.md')
PAPER = {('Cora', 'gkat'): '82.1 ± 0.7', ('CiteSeer', 'gkat'): '73.0 ± 0.7',
         ('Cora', 'gat'): '83.0 ± 0.7', ('CiteSeer', 'gat'): '72.5 ± 0.7'}


def load(name: str):
    mirror = osp.join(osp.dirname(REPO), 'shared', 'datasets')
    if 'PYG_GRF_MIRROR' not in os.environ and osp.isdir(mirror):
        os.environ['PYG_GRF_MIRROR'] = mirror
    from pyg_grf.datasets.planetoid import load_planetoid
    return load_planetoid(name)


class GKAT(torch.nn.Module):
    def __init__(self, in_channels, num_classes, mode, threshold=0.0, hidden=8, heads=8,
                 dropout=0.6, kernel_weighting=True):
        super().__init__()
        self.dropout = dropout
        kw = dict(mode=mode, dropout=dropout, threshold=threshold, cached=True,
                  kernel_weighting=kernel_weighting, project=False)  # GAT-shaped layers
        self.conv1 = GKATAttention(in_channels, heads=heads, head_channels=hidden, **kw)
        self.conv2 = GKATAttention(hidden * heads, heads=1, head_channels=num_classes,
                                   concat=False, **kw)

    def forward(self, data):
        rwgnk = RWGNKLoads(data.rwgnk_index, data.rwgnk_value)
        x = F.dropout(data.x, self.dropout, self.training)
        x = F.elu(self.conv1(x, rwgnk=rwgnk))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, rwgnk=rwgnk)


class GAT(torch.nn.Module):
    def __init__(self, in_channels, num_classes, hidden=8, heads=8, dropout=0.6):
        super().__init__()
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout)
        self.conv2 = GATConv(hidden * heads, num_classes, heads=1, concat=False, dropout=dropout)

    def forward(self, data):
        x = F.dropout(data.x, self.dropout, self.training)
        x = F.elu(self.conv1(x, data.edge_index))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, data.edge_index)


def run_seed(data, num_classes, args, seed):
    torch.manual_seed(seed)
    if args.model == 'gkat':
        data = AddRWGNKFeatures(num_walks=args.num_walks, lam=args.lam, alpha=args.alpha,
                                max_length=args.walk_length, seed=seed)(data)
        model = GKAT(data.num_features, num_classes, args.mode, args.threshold,
                     kernel_weighting=not args.support_only)
    else:
        model = GAT(data.num_features, num_classes)
    return dict(seed=seed, **train(model, data, args))


def train(model, data, args):
    r"""Full-batch training with early stopping on validation accuracy (ties: validation
    loss); returns the validation and test accuracy at the selected epoch. Parameters a module
    lists in ``no_weight_decay()`` (GRF's modulation ``f`` and global ``beta``) get no decay."""
    exempt = {f'{m_name}.{n}' if m_name else n for m_name, m in model.named_modules()
              if hasattr(m, 'no_weight_decay') for n in m.no_weight_decay()}
    groups = [[p for n, p in model.named_parameters() if (n in exempt) == flag]
              for flag in (False, True)]
    opt = torch.optim.Adam([{'params': groups[0], 'weight_decay': args.weight_decay},
                            {'params': groups[1], 'weight_decay': 0.0}], lr=args.lr)
    best = (-1.0, float('inf'), 0.0, 0)  # val acc, val loss, test acc, epoch
    bad, epochs, t0 = 0, 0, time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        opt.zero_grad()
        out = model(data)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            out = model(data)
            pred = out.argmax(-1)
            val_loss = float(F.cross_entropy(out[data.val_mask], data.y[data.val_mask]))
            val_acc = float((pred[data.val_mask] == data.y[data.val_mask]).float().mean())
            test_acc = float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())
        epochs = epoch
        if args.verbose and epoch % 25 == 0:
            print(f'  epoch {epoch}: val {100 * val_acc:.1f} test {100 * test_acc:.1f} '
                  f'({(time.perf_counter() - t0) / epoch:.3f} s/epoch)', flush=True)
        if val_acc > best[0] or (val_acc == best[0] and val_loss < best[1]):
            best, bad = (val_acc, val_loss, test_acc, epoch), 0
        else:
            bad += 1
            if bad >= args.patience:
                break
    sec = (time.perf_counter() - t0) / epochs
    return {'val_acc': best[0], 'test_acc': best[2], 'best_epoch': best[3],
            'epochs': epochs, 'sec_per_epoch': sec}


SEARCH_SPACE = {  # coordinate-wise search, in this order, starting from the first value of each
    'walk_length': [3, 1, 2, 4, 5, 6, 7],
    'lam': [0.8, 0.5, 1.0],
    'threshold': [0.05, 0.0, 0.1],
    'num_walks': [16, 32],
}
SEARCH_SEEDS = (100, 101)  # selection seeds, disjoint from the reported seeds 0..9


def search(data, num_classes, args):
    r"""Selects the RWGNK settings on the validation split only: one coordinate at a time (walk
    length 1-7 first, then lambda, kernel threshold, number of walks), each candidate trained with
    the two selection seeds; the best mean validation accuracy wins (ties: the earlier, cheaper
    value). Returns the chosen settings and every evaluated configuration."""
    current = {k: v[0] for k, v in SEARCH_SPACE.items()}
    tried = {}
    for key, values in SEARCH_SPACE.items():
        scores = {}
        for value in values:
            cfg = dict(current, **{key: value})
            ident = tuple(sorted(cfg.items()))
            if ident not in tried:
                trial = argparse.Namespace(**dict(vars(args), **cfg))
                runs = [run_seed(data, num_classes, trial, s) for s in SEARCH_SEEDS]
                tried[ident] = statistics.mean(r['val_acc'] for r in runs)
                print(f'  search {cfg}: val {100 * tried[ident]:.2f}', flush=True)
            scores[value] = tried[ident]
        current[key] = max(values, key=lambda v: (scores[v], -values.index(v)))
    return current, [dict(dict(k), val_acc=v) for k, v in tried.items()]


def write_table():
    rows = []
    for path in sorted(glob.glob(osp.join(RUNS, '*.json'))):
        with open(path) as f:
            rows.append(json.load(f))
    lines = [
        '# GKAT vs GAT on citation networks (FTFI paper, App. A.5, Table 10)',
        '',
        'Public Planetoid split; 2 layers (8 heads x 8 hidden, then 1 head), ELU, dropout 0.6, '
        'Adam lr 0.005, weight decay 5e-4, early stopping on validation accuracy (patience and '
        'maximum epochs: see the commands; the paper uses patience 100). '
        'Test accuracy (%) at the selected epoch, mean ± std over seeds. CPU, one thread per '
        'run; seconds per epoch include the evaluation pass.',
        '',
        '| dataset | model | RWGNK settings | seeds | test acc (ours) | paper | val acc | '
        'epochs (mean) | s / epoch |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        accs = [100 * s['test_acc'] for s in r['seeds']]
        vals = [100 * s['val_acc'] for s in r['seeds']]
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        rw = (f"mode={r['args']['mode']}, tau={r['args']['walk_length']}, "
              f"n={r['args']['num_walks']}, lam={r['args']['lam']}, alpha={r['args']['alpha']}"
              + (f", threshold={r['args'].get('threshold', 0.0)}"
                 if r['args']['mode'] != 'linear' else '')
              + (', support only' if r['args'].get('support_only') else '')
              + (f" (selected on val. from {len(r['search'])} settings)" if r.get('search')
                 else '')
              if r['args']['model'] == 'gkat' else '-')
        lines.append(
            f"| {r['args']['dataset']} | {r['args']['model'].upper()} | {rw} | {len(accs)} | "
            f"{statistics.mean(accs):.1f} ± {std:.1f} | "
            f"{PAPER.get((r['args']['dataset'], r['args']['model']), '-')} | "
            f"{statistics.mean(vals):.1f} | "
            f"{statistics.mean(s['epochs'] for s in r['seeds']):.0f} | "
            f"{statistics.mean(s['sec_per_epoch'] for s in r['seeds']):.3f} |")
    if osp.exists(NOTES):  # hand-written notes on the current table
        with open(NOTES) as f:
            lines += ['', f.read().rstrip()]
    lines += ['', 'Commands:', '', '```']
    lines += sorted({r['command'] for r in rows})
    lines += ['```', '']
    os.makedirs(osp.dirname(TABLE), exist_ok=True)
    with open(TABLE, 'w') as f:
        f.write('\n'.join(lines))
    print('\n'.join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--dataset', default='Cora', choices=['Cora', 'CiteSeer'])
    p.add_argument('--model', default='gkat', choices=['gkat', 'gat'])
    p.add_argument('--mode', default='softmax', choices=['softmax', 'linear', 'dense'])
    p.add_argument('--seeds', type=int, default=5)
    p.add_argument('--first-seed', type=int, default=0)
    p.add_argument('--epochs', type=int, default=1000)
    p.add_argument('--patience', type=int, default=100)
    p.add_argument('--lr', type=float, default=0.005)
    p.add_argument('--weight-decay', type=float, default=5e-4)
    p.add_argument('--walk-length', type=int, default=3)
    p.add_argument('--num-walks', type=int, default=16)
    p.add_argument('--lam', type=float, default=0.8)
    p.add_argument('--alpha', type=float, default=1.0)
    p.add_argument('--threshold', type=float, default=0.05)
    p.add_argument('--support-only', action='store_true',
                   help='K gives the support of the softmax only, no weighting by K_ij '
                        '(GAT with its adjacency mask replaced by supp(K))')
    p.add_argument('--raw-features', action='store_true',
                   help='skip the row normalisation of the bag-of-words features (the GAT '
                        'paper and PyG\'s GAT example normalise each row to sum 1)')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--tag', default='')
    p.add_argument('--verbose', action='store_true')
    p.add_argument('--table-only', action='store_true')
    p.add_argument('--search', action='store_true',
                   help='GKAT only: select walk length (1-7), lambda, threshold and number of '
                        'walks on the validation split (seeds 100, 101), then report the chosen '
                        'setting over --seeds seeds')
    args = p.parse_args(argv)
    if args.table_only:
        write_table()
        return
    torch.set_num_threads(args.threads)
    dataset = load(args.dataset)
    data = dataset[0]
    if not args.raw_features:
        data = NormalizeFeatures()(data)
    searched = None
    if args.search:
        if args.model != 'gkat':
            p.error('--search applies to --model gkat')
        chosen, searched = search(data, dataset.num_classes, args)
        print(f'selected on validation: {chosen}', flush=True)
        for key, value in chosen.items():
            setattr(args, key, value)
    results = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        r = run_seed(data, dataset.num_classes, args, seed)
        results.append(r)
        print(f"{args.dataset} {args.model} seed {seed}: test {100 * r['test_acc']:.1f} "
              f"(val {100 * r['val_acc']:.1f}, best epoch {r['best_epoch']}/{r['epochs']}, "
              f"{r['sec_per_epoch']:.3f} s/epoch)", flush=True)
    accs = torch.tensor([100 * r['test_acc'] for r in results])
    print(f"{args.dataset} {args.model}: {accs.mean():.1f} ± "
          f"{accs.std() if len(accs) > 1 else 0.0:.1f}")
    os.makedirs(RUNS, exist_ok=True)
    name = f"{args.dataset}_{args.model}" + (f"_{args.mode}" if args.model == 'gkat' else '')
    name += f"_{args.tag}" if args.tag else ''
    command = 'nice -n 10 python experiments/gkat_citation.py ' + ' '.join(
        argv if argv is not None else sys.argv[1:])
    with open(osp.join(RUNS, name + '.json'), 'w') as f:
        json.dump({'args': vars(args), 'seeds': results, 'command': command,
                   'search': searched}, f, indent=1)
    write_table()


if __name__ == '__main__':
    main()
