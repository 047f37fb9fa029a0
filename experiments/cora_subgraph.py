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

import argparse
import os
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from harness import fit_and_test, read_rows, run_grid, summary_table  # noqa: E402

HERE = osp.dirname(osp.abspath(__file__))
CONFIG = osp.join(HERE, 'configs', 'cora_grf.yaml')
OUT = osp.join(HERE, 'results', 'cora_subgraph')
TABLE = osp.join(HERE, 'results', 'cora_subgraph.md')
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
    text = '\n'.join([
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
                      labels={'metric': 'test acc', 'val': 'val acc'}).rstrip(), '',
        'Command:', '', '```', 'python experiments/cora_subgraph.py --seeds 3', '```', ''])
    with open(TABLE, 'w') as f:
        f.write(text)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out', default=OUT)
    p.add_argument('--table-only', action='store_true')
    args = p.parse_args(argv)
    if not args.table_only:
        torch.set_num_threads(args.threads)
        os.environ.setdefault('PYG_GRF_MIRROR', osp.join(osp.dirname(osp.dirname(HERE)),
                                                         'shared', 'datasets'))
        run(args.variants, range(args.seeds), args.out)
    if args.out == OUT:
        print(write_table())


if __name__ == '__main__':
    main()
