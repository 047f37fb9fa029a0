r"""GRF-GPS against PyG's GAT recipe on Cora (public split), and against the same block with
unmasked linear attention, through the product's training stack: the configs
``experiments/configs/paper/citation_{gat,grf_gps}.yaml`` (networks of :mod:`paper_models`,
trained by ``NodeLevelTask`` on ``PlanetoidDataModule``), fitted and tested by :mod:`harness`
once per seed, the walks drawn with the seed.

* ``gat``: PyG's ``examples/gat.py`` (the runs of ``gkat_citation.py``: same config, seeds);
* ``grf_gps``: the same two GAT layers with a :class:`~pyg_grf.nn.GRFGPSConv` between them
  (width 64, 4 heads, dropout 0.6 on its branches and attention, ELU, no normalisation),
  GRF-masked linear attention with a global term (``M = beta 1 1^T + Phi Phi^T``), walks per
  head (4 draws), |f| coefficients;
* ``linear``: the same block with unmasked linear attention in GRF's place (the control: what
  the mask adds).

``--search`` selects the GRF-GPS settings (local conv, walk length, ``global_beta``) one at a
time on the validation split with selection seeds 100/101 (:func:`harness.coordinate_search`);
without it the earlier selection is used (:data:`SELECTED`). Runs go to
``experiments/results/cora_grf_gps/runs.jsonl`` and the table to
``experiments/results/cora_grf_gps.md``::

    python experiments/cora_grf_gps.py --variants grf_gps linear --seeds 10
"""
from __future__ import annotations

import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import paper_models  # noqa: E402,F401  (registers the networks for the configs)
from harness import (  # noqa: E402
    experiment_main,
    fit_and_test,
    read_rows,
    run_grid,
    select_on_validation,
    summary_table,
    write_markdown,
)

HERE = osp.dirname(osp.abspath(__file__))
CONFIG = osp.join(HERE, 'configs', 'paper', 'citation_{}.yaml')
OUT = osp.join(HERE, 'results', 'cora_grf_gps')
GAT_RUNS = osp.join(HERE, 'results', 'gkat_citation', 'runs.jsonl')
TABLE = osp.join(HERE, 'results', 'cora_grf_gps.md')
NOTES = osp.join(HERE, 'results', 'cora_grf_gps_notes.md')
#: selected on the validation split (seeds 100/101) by the search below, in its earlier run
SELECTED = {'local': 'none', 'max_length': 2, 'global_beta': 0.1}
SEARCH_SPACE = {'local': ['gat', 'none'], 'max_length': [3, 2, 4], 'global_beta': [0.1, None]}
SEARCH_SEEDS = (100, 101)
M, T = '--model.init_args.model.init_args.', '--data.init_args.pre_transform.init_args.'


def overrides(variant: str, settings: dict, seed: int):
    r"""Overrides of ``citation_grf_gps.yaml`` for a variant, its settings and a seed."""
    out = [f'{T}seed={seed}', f'{M}local={settings["local"]}']
    if variant == 'linear':
        return out + [f'{M}attn_type=linear', f'{M}attn_kwargs={{}}']
    return out + [f'{T}max_length={settings["max_length"]}',
                  f'{M}attn_kwargs=' + json.dumps({'max_length': settings['max_length'],
                                                   'global_beta': settings['global_beta'],
                                                   'f_mode': 'abs'})]


def run(variants, seeds, settings: dict, out: str = OUT, epochs=None, key=None):
    def fit(variant, spec, seed, root):
        row = fit_and_test(CONFIG.format('grf_gps'), overrides(variant, spec, seed), seed,
                           root, epochs)
        return dict(row, settings=spec)
    return run_grid({v: settings for v in variants}, seeds, out, fit, key=key)


def search(epochs=None) -> dict:
    return select_on_validation(SEARCH_SPACE, lambda candidate, seeds, key: run(
        ['grf_gps'], seeds, candidate, osp.join(OUT, 'search'), epochs, key), SEARCH_SEEDS)


def write_table() -> str:
    rows = read_rows(osp.join(OUT, 'runs.jsonl'))
    gat = [dict(r, variant='gat') for r in read_rows(GAT_RUNS)
           if r['dataset'] == 'Cora' and r['variant'] == 'gat']
    settings = next((r['settings'] for r in rows if r['variant'] == 'grf_gps'), SELECTED)
    lines = ['# GRF-GPS vs GAT on Cora (public split, PyG GAT recipe)', '',
             'Test accuracy (%) at the best validation epoch, mean ± std over seeds, and the '
             'paired difference to the same block with unmasked linear attention (`linear`). '
             'Networks: `experiments/paper_models.py`; trained by `pyg_grf.lightning` '
             '(`experiments/configs/paper/citation_{gat,grf_gps}.yaml`) through '
             '`experiments/cora_grf_gps.py`; GAT rows are the Cora GAT runs of '
             '`experiments/gkat_citation.py` (same config and seeds). One CPU thread per run; '
             f's / run is the fit time. GRF-GPS settings: {settings}, 32 walks per node and '
             'head (4 draws), p_halt 0.25, |f| coefficients.', '',
             summary_table(gat + rows, 'test/acc', control='linear',
                           order=['gat', 'linear', 'grf_gps'],
                           labels={'metric': 'test acc', 'val': 'val acc'}).rstrip(), '']
    return write_markdown(TABLE, lines, NOTES, [
        'python experiments/gkat_citation.py --dataset Cora --models gat --seeds 10',
        'python experiments/cora_grf_gps.py --variants grf_gps linear --seeds 10'])


def main(argv=None):
    def add_arguments(p):
        p.add_argument('--variants', nargs='+', default=['grf_gps', 'linear'],
                       choices=['grf_gps', 'linear'])
        p.add_argument('--seeds', type=int, default=10)
        p.add_argument('--epochs', type=int, default=None, help="cap (default: the config's)")
        p.add_argument('--search', action='store_true',
                       help='select the GRF-GPS settings on the validation split first')

    def go(args):
        settings = search(args.epochs) if args.search else SELECTED
        run(args.variants, range(args.seeds), settings, args.out, args.epochs)
    experiment_main(__doc__, OUT, go, write_table, add_arguments, argv)


if __name__ == '__main__':
    main()
