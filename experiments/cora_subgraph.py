r"""Cora with precomputed GRFs: full-graph training against training on random node parts, through
the product's training stack (``experiments/configs/cora_grf.yaml``: the GRF
``GraphTransformer`` trained by ``NodeLevelTask`` on ``PlanetoidDataModule``, run by
:mod:`harness`, walks drawn with the seed):

* ``full``: one step per epoch on the whole graph (its payload built once and reused);
* ``restrict<P>``: ``PlanetoidDataModule(num_parts=P)``, one step per random node part
  (:class:`~pyg_grf.loader.NodePartLoader`), the full graph's walks restricted to each part;
* ``recompute<P>``: the same parts with walks drawn afresh on every part (cut at its boundary).

Validation and test always run on the full graph with the full graph's walks; test accuracy of
the best validation epoch. Runs go to ``experiments/results/cora_subgraph/runs.jsonl`` and the
table to ``experiments/results/cora_subgraph.md``::

    python experiments/cora_subgraph.py --seeds 3
"""
from __future__ import annotations

import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from harness import (  # noqa: E402
    experiment_main,
    fit_and_test,
    read_rows,
    run_grid,
    summary_table,
    write_markdown,
)

HERE = osp.dirname(osp.abspath(__file__))
CONFIG = osp.join(HERE, 'configs', 'cora_grf.yaml')
OUT = osp.join(HERE, 'results', 'cora_subgraph')
TABLE = osp.join(HERE, 'results', 'cora_subgraph.md')
NOTES = osp.join(HERE, 'results', 'cora_subgraph_notes.md')
D = '--data.init_args.'
#: variant -> (overrides, epochs): the part runs take 100 epochs (P steps each), the full graph
#: 200 (the config's) and 400 (as many steps as restrict4)
VARIANTS = {
    'full': ([], 200),
    'full_400': ([], 400),
    'restrict4': ([f'{D}num_parts=4', f'{D}part_walks=restrict'], 100),
    'restrict8': ([f'{D}num_parts=8', f'{D}part_walks=restrict'], 100),
    'recompute4': ([f'{D}num_parts=4', f'{D}part_walks=recompute'], 100),
    'recompute8': ([f'{D}num_parts=8', f'{D}part_walks=recompute'], 100),
}


def run(variants, seeds, out: str = OUT):
    def fit(variant, spec, seed, root):
        overrides, epochs = spec
        return fit_and_test(CONFIG, overrides + [f'{D}pre_transform.init_args.seed={seed}'],
                            seed, root, epochs)
    return run_grid({v: VARIANTS[v] for v in variants}, seeds, out, fit)


def write_table() -> str:
    rows = read_rows(osp.join(OUT, 'runs.jsonl'))
    return write_markdown(TABLE, [
        '# Cora: full-graph training vs training on random node parts (precomputed GRFs)', '',
        'The GRF `GraphTransformer` of `experiments/configs/cora_grf.yaml` (2 pre-norm blocks, '
        '64 channels, 4 heads, max_length 3; 32 walks per node, p_halt 0.3, drawn with the '
        'seed), trained by `pyg_grf.lightning` through `experiments/cora_subgraph.py`. '
        '`restrictP` / `recomputeP`: `PlanetoidDataModule(num_parts=P, part_walks=...)`, one '
        'step per part, 100 epochs; `full`: 200 epochs, `full_400`: as many steps as '
        '`restrict4`. Validation and test on the full graph; test accuracy (%) of the best '
        'validation epoch, mean ± std over seeds, paired difference to `full`. One CPU thread '
        'per run; s / run is the fit time.', '',
        summary_table(rows, 'test/acc', control='full', order=list(VARIANTS),
                      labels={'metric': 'test acc', 'val': 'val acc'}).rstrip(), ''],
        NOTES, ['python experiments/cora_subgraph.py --seeds 3'])


def main(argv=None):
    def add_arguments(p):
        p.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=list(VARIANTS))
        p.add_argument('--seeds', type=int, default=3)
    experiment_main(__doc__, OUT, lambda a: run(a.variants, range(a.seeds), a.out), write_table,
                    add_arguments, argv)


if __name__ == '__main__':
    main()
