r"""experiments/node_models.py: the Minesweeper GAT control at Luo et al.'s tuned settings is the
network their script describes (counted by hand), built by the product's CLI class from the
node config and the variant's overrides."""
import json

import pytest
from torch_geometric.nn import GATConv

from tests.experiments import experiment_module

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

node_models = experiment_module('node_models')


def test_gat_tuned_is_luos_gat(tmp_path):
    from pyg_grf.lightning.cli import GRFLightningCLI
    config, extra = node_models.overrides('minesweeper', 'gat_tuned', 3, {})
    assert '--data.init_args.split=3' in extra
    cli = GRFLightningCLI(args=['--config', config, *extra,
                                f'--trainer.default_root_dir={tmp_path}'], run=False)
    model = cli.model.model
    assert model.attn is None and len(model.convs) == 15
    for conv in model.convs:
        assert isinstance(conv, GATConv) and conv.heads == 1
        assert conv.add_self_loops is False and conv.bias is None
    # 15 GATConv (7 -> 64, then 64 -> 64: weight, two attention vectors), 15 linear skips,
    # 15 batch norms (weight, bias) and the linear head 64 -> 1
    convs = (7 * 64 + 2 * 64) + 14 * (64 * 64 + 2 * 64)
    skips = (7 * 64 + 64) + 14 * (64 * 64 + 64)
    assert sum(p.numel() for p in model.parameters()) == convs + skips + 15 * 2 * 64 + 65
    assert cli.model.hparams.weight_decay == 0.0 and model.dropout == 0.2


def test_settings_from_another_dataset_reads_the_committed_rows(tmp_path, monkeypatch):
    # --settings from:cora with a check run's own --out: the committed Cora grf row's
    # settings, passed to run() unchanged; an unknown source names where it looked
    got = []
    monkeypatch.setattr(node_models, 'run', lambda dataset, variants, seeds, settings, *a:
                        got.append(settings))
    node_models.main(['--dataset', 'pubmed', '--variants', 'grf', '--settings', 'from:cora',
                      '--seeds', '1', '--out', str(tmp_path)])
    with open(f'{node_models.OUT}/runs.jsonl') as f:
        cora = next(r['settings'] for r in map(json.loads, f)
                    if r['dataset'] == 'cora' and r['variant'] == 'grf')
    assert got == [cora]
    with pytest.raises(SystemExit, match="from:chameleon needs a grf row of 'chameleon'"):
        node_models.main(['--dataset', 'pubmed', '--settings', 'from:chameleon', '--seeds', '1',
                          '--out', str(tmp_path)])
