import re

import pytest
import torch

from pyg_grf.lightning.cli import GRFLightningCLI
from tests.conftest import REPO

# LightningCLI warns when args= is used while pytest has its own sys.argv.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


CONFIG_DIR = REPO / 'experiments' / 'configs'
#: Every config in experiments/configs.
CONFIGS = sorted(path.stem for path in CONFIG_DIR.glob('*.yaml'))


def base_of(name):
    """The base config a variant overrides (its '# Overrides <base>.yaml' line), or None."""
    for line in (CONFIG_DIR / f'{name}.yaml').read_text().splitlines():
        if line.startswith('# Overrides '):
            return line.split()[2][:-len('.yaml')]
    return None


def config_args(name):
    """The --config arguments of a config: its base first, then the config itself."""
    base = base_of(name)
    return ([] if base is None else ['--config', str(CONFIG_DIR / f'{base}.yaml')]) + \
        ['--config', str(CONFIG_DIR / f'{name}.yaml')]
#: One GKAT config per task family: synthetic motifs, TU cross-validation, citation, LRGB.
GKAT_CONFIGS = ['motifs_gkat', 'mutag_gkat_cv', 'proteins_gkat_cv', 'cora_gkat',
                'peptides_func_gkat']


def test_config_list():
    assert len(CONFIGS) >= 28 and set(GKAT_CONFIGS) <= set(CONFIGS)


@pytest.mark.parametrize('name', [n for n in CONFIGS if base_of(n) is not None])
def test_variant_says_only_what_differs(name):
    # one level: a base stands alone; a variant is a short override of it
    import yaml
    base = base_of(name)
    assert base in CONFIGS and base_of(base) is None
    variant = yaml.safe_load((CONFIG_DIR / f'{name}.yaml').read_text())
    assert set(variant) <= {'trainer', 'model', 'data', 'checkpoint', 'seed_everything'}
    assert variant['trainer']['default_root_dir'] == f'runs/{name}'  # its own run folder
    lines = [ln for ln in (CONFIG_DIR / f'{name}.yaml').read_text().splitlines()
             if not ln.startswith('#')]
    assert len(lines) < 30


def experiments_modules(name):
    """The modules of experiments/ whose classes the config names (`class_path: module.Class`),
    imported: importing registers them for configs, as `PYTHONPATH=experiments` and
    `$PYG_GRF_TRUSTED_CLASSES` do on the command line."""
    from tests.experiments import EXPERIMENTS, experiment_module
    text = (CONFIG_DIR / f'{name}.yaml').read_text()
    names = re.findall(r'^\s*class_path:\s*(\w+)\.\w+\s*$', text, re.M)
    return [experiment_module(m) for m in sorted(set(names)) if (EXPERIMENTS / f'{m}.py').exists()]


@pytest.mark.parametrize('name', CONFIGS)
def test_config_instantiates(name, tmp_path):
    # Every key is checked and every class built (no data is loaded in __init__).
    experiments_modules(name)
    cli = GRFLightningCLI(args=[*config_args(name),
                                f'--trainer.default_root_dir={tmp_path}'], run=False)
    model = cli.model.model
    if cli.model.task == 'regression':
        assert model.out_channels == 11
    elif cli.model.task == 'link':  # a node encoder: its output is the pair decoder's input
        assert cli.model.metric_name == 'mrr'
    else:
        assert model.out_channels == cli.model.hparams.get('num_classes') or \
            model.out_channels == cli.model.hparams.get('num_labels')
    # A checkpoint that monitors a metric monitors the task's metric.
    monitor = cli.config.checkpoint.monitor
    assert monitor is None or monitor in (f'val/{cli.model.metric_name}', 'val/loss')
    attention = getattr(model, 'attn_type', None)
    transform = cli.datamodule.pre_transform
    if name.endswith('_grf') or name.endswith('_grf_cv'):
        assert attention == 'grf'
        # The GRF layers and the transform must agree on the walk length.
        assert model.attn_kwargs['max_length'] == transform.max_length
    if 'gkat' in name:
        from pyg_grf.transforms import AddRWGNKFeatures
        assert attention == 'gkat' and isinstance(transform, AddRWGNKFeatures)
        # The layers threshold the kernel where the transform stored its pairs.
        assert model.attn_kwargs['threshold'] == transform.kernel_threshold
    if name.endswith('_cv'):
        assert cli.datamodule.num_folds == 10


@pytest.mark.parametrize('name', ['peptides_func_grf', 'peptides_func_linear',
                                  'peptides_func_gine', 'peptides_func_gkat'])
def test_peptides_configs_run_on_standin(name, tmp_path):
    # The LRGB wiring (atom/bond encoders, 10 labels, AP) on tiny random stand-in graphs.
    from pyg_grf.lightning.cli import main
    cli = main(['fit', *config_args(name), f'--trainer.default_root_dir={tmp_path}',
                '--trainer.fast_dev_run=true', '--trainer.accelerator=cpu',
                '--trainer.enable_progress_bar=false', '--data.init_args.standin=8',
                '--data.init_args.batch_size=4', '--test_after_fit=true'])
    assert {'test/ap', 'test/loss'} <= set(cli.trainer.callback_metrics)


@pytest.mark.parametrize('name,metric', [('peptides_struct_grf', 'mae'),
                                         ('pascalvoc_sp_grf', 'macro_f1'),
                                         ('coco_sp_grf', 'macro_f1')])
def test_other_lrgb_configs_run_on_standin(name, metric, tmp_path):
    # Peptides-struct (graph regression, MAE) and the superpixel datasets (node classification
    # on mini-batches of graphs, macro F1) on stand-ins with the real fields and shapes.
    from pyg_grf.lightning.cli import main
    cli = main(['fit', *config_args(name), f'--trainer.default_root_dir={tmp_path}',
                '--trainer.fast_dev_run=true', '--trainer.accelerator=cpu',
                '--trainer.enable_progress_bar=false', '--data.init_args.standin=8',
                '--data.init_args.batch_size=4', '--test_after_fit=true'])
    assert {f'test/{metric}', 'test/loss'} <= set(cli.trainer.callback_metrics)


def _fit_motifs_briefly(config: str, tmp_path):
    # Two training steps, one validation and one test batch of a motifs config, through the CLI.
    from pyg_grf.lightning.cli import main
    return main(['fit', *config_args(config),
                 f'--trainer.default_root_dir={tmp_path}', '--trainer.max_epochs=1',
                 '--trainer.limit_train_batches=2', '--trainer.limit_val_batches=1',
                 '--trainer.limit_test_batches=1', '--trainer.enable_progress_bar=false',
                 '--data.init_args.num_graphs=64', f'--data.init_args.root={tmp_path / "data"}'])


def test_gkat_motifs_config_runs(tmp_path):
    # A few steps of fit + test (test_after_fit: the test loop's inference tensors included).
    cli = _fit_motifs_briefly('motifs_gkat', tmp_path)
    assert cli.trainer.global_step == 2
    assert {'test/acc', 'test/loss'} <= set(cli.trainer.callback_metrics)
    attn = [m for m in cli.model.model.blocks[0].modules() if type(m).__name__ == 'GKATAttention']
    assert len(attn) == 1 and attn[0].mode == 'softmax'


@pytest.mark.data
@pytest.mark.parametrize('name', ['mutag_gkat_cv', 'proteins_gkat_cv', 'cora_gkat'])
def test_gkat_configs_run_on_real_data(name, mirror, tmp_path):
    from pyg_grf.lightning.cli import main
    cli = main(['fit', *config_args(name),
                f'--trainer.default_root_dir={tmp_path}', '--trainer.max_epochs=1',
                '--trainer.limit_train_batches=2', '--trainer.limit_val_batches=1',
                '--trainer.limit_test_batches=1', '--test_after_fit=true'])
    assert cli.trainer.global_step >= 1
    assert {'test/acc', 'test/loss'} <= set(cli.trainer.callback_metrics)


def test_gps_block_config_fits_and_reloads(tmp_path):
    # GraphTransformer(block='gps') with a local conv given by class_path: a few steps of fit +
    # test, then load_from_checkpoint rebuilds the model (the nested conv spec included) to the
    # same outputs.
    from torch_geometric.data import Batch
    from torch_geometric.nn import GATConv

    from pyg_grf.lightning.tasks import GraphLevelTask
    from pyg_grf.nn import GRFGPSConv
    cli = _fit_motifs_briefly('motifs_grf_gpsconv', tmp_path)
    assert cli.trainer.global_step == 2
    assert {'test/acc', 'test/loss'} <= set(cli.trainer.callback_metrics)
    model = cli.model.model
    assert model.block == 'gps' and isinstance(model.conv, GATConv)
    assert all(type(layer) is GRFGPSConv and type(layer.conv) is GATConv
               for layer in model.blocks)
    best = cli.trainer.checkpoint_callback.best_model_path
    task = GraphLevelTask.load_from_checkpoint(best).eval()
    batch = Batch.from_data_list(list(cli.datamodule.test_dataset)[:4])
    assert torch.allclose(task(batch), cli.model.eval()(batch), atol=1e-6)
