r"""Held-out Minesweeper boards: the shipped Minesweeper recipe
(``experiments/configs/node/minesweeper_grf_node.yaml``) and its controls on *new* boards drawn
the way the published one was, to see whether what the recipe gains on the published board
holds on graphs it was not chosen on.

The published board (Platonov et al., 2023; ``minesweeper.npz`` of the mirror) follows a rule
that :func:`board` re-implements, each part checked against the published file by
``tests/experiments/test_minesweeper_boards.py``:

* the graph: a 100 x 100 grid, every cell linked to its 8 neighbours (king moves), each
  undirected edge stored once (39,402 pairs);
* the labels: exactly 20 % of the cells are mines, drawn uniformly;
* the features: exactly half of the cells are "unknown" (column 0 set); every other cell holds
  the one-hot count of mines among its neighbours, capped at 5 (columns 1-6);
* ten splits, each a random 50 / 25 / 25 % train / validation / test partition.

Board ``b`` is drawn with generator seed ``b`` and run as the committed recipe runs split ``b``
of the published board: fixed split ``b % 10``, walks and weights seeded with ``b``. Variants
as :mod:`node_models` (``grf``, ``none``, ``linear``, ``gat_tuned``), same harness and budget.
Runs: ``experiments/results/minesweeper_boards/runs.jsonl``; table:
``experiments/results/minesweeper_boards.md``::

    python experiments/minesweeper_boards.py --boards 1 2 3 4 5 --variants grf none linear
"""
from __future__ import annotations

import os
import os.path as osp
import sys

import numpy as np

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import node_models  # noqa: E402
from harness import (  # noqa: E402
    experiment_main,
    fit_and_test,
    paired,
    read_rows,
    run_grid,
    summary_table,
    write_markdown,
)

HERE = osp.dirname(osp.abspath(__file__))
OUT = osp.join(HERE, 'results', 'minesweeper_boards')
TABLE = osp.join(HERE, 'results', 'minesweeper_boards.md')
NOTES = osp.join(HERE, 'results', 'minesweeper_boards_notes.md')
COMMANDS = ['python experiments/minesweeper_boards.py --boards 1 2 3 4 5 --variants grf none',
            'python experiments/minesweeper_boards.py --boards 1 2 3 4 5 --variants linear',
            'python experiments/minesweeper_boards.py --boards 1 2 3 4 5 --variants gat_tuned']
#: the published board's parameters
SIDE, MINES, UNKNOWN, CAP, SPLITS = 100, 0.2, 0.5, 5, 10


def king_edges(side: int) -> np.ndarray:
    r"""``[E, 2]`` the 8-neighbour grid's undirected edges ``(i, j)``, ``i < j``, each once, in
    the published file's order (by ``i``, then ``j``); cell ``(r, c)`` is node ``r * side + c``."""
    r, c = np.divmod(np.arange(side * side), side)
    pairs = []
    for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1)):  # the neighbours after a cell
        ok = (r + dr < side) & (c + dc >= 0) & (c + dc < side)
        i = np.flatnonzero(ok)
        pairs.append(np.stack([i, i + dr * side + dc], 1))
    e = np.concatenate(pairs)
    return e[np.lexsort((e[:, 1], e[:, 0]))]


def board(seed: int, side: int = SIDE, mines: float = MINES, unknown: float = UNKNOWN,
          cap: int = CAP, splits: int = SPLITS) -> dict:
    r"""A Minesweeper board drawn with generator ``seed``, as the arrays of the published
    ``minesweeper.npz`` (``node_features`` ``[N, cap + 2]``, ``node_labels``, ``edges``,
    ``train_masks`` / ``val_masks`` / ``test_masks`` ``[splits, N]``)."""
    if isinstance(side, bool) or not isinstance(side, int) or side < 2:
        raise ValueError(f"side must be an integer >= 2, got {side!r}")
    for name, frac in (('mines', mines), ('unknown', unknown)):
        if not 0.0 < frac < 1.0:
            raise ValueError(f"{name} must be a fraction in (0, 1), got {frac!r}")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"cap must be an integer >= 1, got {cap!r}")
    n = side * side
    rng = np.random.default_rng(seed)
    labels = np.zeros(n, dtype=np.int64)
    labels[rng.choice(n, round(mines * n), replace=False)] = 1
    edges = king_edges(side)
    count = np.zeros(n, dtype=np.int64)
    np.add.at(count, edges[:, 0], labels[edges[:, 1]])
    np.add.at(count, edges[:, 1], labels[edges[:, 0]])
    features = np.zeros((n, cap + 2), dtype=np.float32)
    hidden = np.zeros(n, dtype=bool)
    hidden[rng.choice(n, round(unknown * n), replace=False)] = True
    features[hidden, 0] = 1.0
    known = np.flatnonzero(~hidden)
    features[known, 1 + np.minimum(count[known], cap)] = 1.0
    masks = {k: np.zeros((splits, n), dtype=bool) for k in ('train', 'val', 'test')}
    n_train, n_val = n // 2, n // 4
    for s in range(splits):
        perm = rng.permutation(n)
        masks['train'][s, perm[:n_train]] = True
        masks['val'][s, perm[n_train:n_train + n_val]] = True
        masks['test'][s, perm[n_train + n_val:]] = True
    return {'node_features': features, 'node_labels': labels, 'edges': edges,
            **{f'{k}_masks': v for k, v in masks.items()}}


def write_board(root: str, seed: int) -> str:
    r"""Writes board ``seed`` where :class:`~pyg_grf.datasets.HeterophilousGraphDataset` reads
    Minesweeper under ``root`` (``<root>/minesweeper/raw/minesweeper.npz``); returns ``root``."""
    raw = osp.join(root, 'minesweeper', 'raw')
    os.makedirs(raw, exist_ok=True)
    np.savez(osp.join(raw, 'minesweeper.npz'), **board(seed))
    return root


def run(boards, variants, out: str = OUT, epochs=None):
    def fit(variant, spec, seed, root):
        config, extra = node_models.overrides('minesweeper', variant, seed, spec)
        data_root = write_board(osp.join(root, 'board'), seed)
        row = fit_and_test(config, extra + [f'--data.init_args.root={data_root}'], seed, root,
                           epochs)
        return dict(row, settings=spec, board=seed)
    return run_grid({v: {} for v in variants}, boards, out, fit,
                    key={'dataset': 'minesweeper_boards'})


def write_table(out: str = OUT, table: str = TABLE) -> str:
    rows = read_rows(osp.join(out, 'runs.jsonl'))
    order = [v for v in node_models.VARIANTS if any(r['variant'] == v for r in rows)]
    lines = ['# The Minesweeper recipe on held-out boards', '',
             'Boards drawn as the published one was (`experiments/minesweeper_boards.py`: '
             'a 100 x 100 king-move grid, 20 % mines, half the cells unknown, counts capped at 5, '
             '50 / 25 / 25 % splits); board b trained with seed b on its split b % 10, the '
             'shipped config (2000 epochs, the best validation epoch tested). Test ROC-AUC (%), '
             'mean ± std over boards, and the paired difference to the GCN alone (`none`), '
             'mean ± standard error over the boards both ran.', '']
    if rows:
        lines += [summary_table(rows, 'test/auroc', control='none', order=order), '']
        per = node_models.per_seed(rows, order, 'board')
        lines += [f'{per[0].upper()}{per[1:]}.', '']
        for control, label in (('none', 'the GCN alone'), ('linear', 'unmasked linear'),
                               ('gat_tuned', "Luo et al.'s tuned GAT")):
            d = paired(rows, 'grf', control, 'test/auroc')
            if d:
                lines += [f"GRF minus {label}, paired: {d['mean']:+.2f} ± {d['se']:.2f} "
                          f"({d['better']}/{d['seeds']} boards better).", '']
        commits = sorted({r.get('commit') for r in rows if r.get('commit')})
        machines = sorted({r.get('machine') for r in rows if r.get('machine')})
        if commits:
            lines += [f"Runs at commits {', '.join(commits)}, on {'; '.join(machines)}.", '']
    return write_markdown(table, lines, NOTES, COMMANDS)


def main(argv=None):
    def add_arguments(p):
        p.add_argument('--boards', type=int, nargs='+', default=[1, 2, 3],
                       help='generator seeds of the boards (each run on split seed %% 10)')
        p.add_argument('--variants', nargs='+', default=['grf', 'none'],
                       choices=node_models.VARIANTS[:3] + ('gat_tuned',))
        p.add_argument('--epochs', type=int, default=None, help="cap (default: the config's)")

    def go(args):
        run(args.boards, args.variants, args.out, args.epochs)
    experiment_main(__doc__, OUT, go, write_table, add_arguments, argv)


if __name__ == '__main__':
    main()
