import pytest

from pyg_grf.lightning.cli import GRFLightningCLI
from tests.conftest import REPO

# LightningCLI warns when args= is used while pytest has its own sys.argv.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


CONFIGS = [
    'motifs_grf', 'motifs_linear', 'mutag_grf_cv', 'mutag_linear_cv', 'proteins_grf_cv',
    'proteins_linear_cv', 'cora_grf', 'cora_gat', 'peptides_func_grf', 'peptides_func_linear',
    'peptides_func_gine', 'peptides_struct_grf', 'pascalvoc_sp_grf', 'coco_sp_grf',
]


@pytest.mark.parametrize('name', CONFIGS)
def test_config_instantiates(name, tmp_path):
    # Every key is checked and every class built (no data is loaded in __init__).
    path = REPO / 'experiments' / 'configs' / f'{name}.yaml'
    cli = GRFLightningCLI(args=['--config', str(path),
                                f'--trainer.default_root_dir={tmp_path}'], run=False)
    model = cli.model.model
    if cli.model.task == 'regression':
        assert model.out_channels == 11
    else:
        assert model.out_channels == cli.model.hparams.get('num_classes') or \
            model.out_channels == cli.model.hparams.get('num_labels')
    # A checkpoint that monitors a metric monitors the task's metric.
    monitor = cli.config.checkpoint.monitor
    assert monitor is None or monitor in (f'val/{cli.model.metric_name}', 'val/loss')
    attention = model.attention
    if 'grf' in name:
        assert attention == 'grf'
        # The GRF layers and the transform must agree on the walk length.
        transform = cli.datamodule.pre_transform
        assert model.attention_kwargs['max_length'] == transform.max_length
    if name.endswith('_cv'):
        assert cli.datamodule.num_folds == 10


@pytest.mark.parametrize('name', ['peptides_func_grf', 'peptides_func_linear',
                                  'peptides_func_gine'])
def test_peptides_configs_run_on_standin(name, tmp_path):
    # The LRGB wiring (atom/bond encoders, 10 labels, AP) on tiny random stand-in graphs.
    from pyg_grf.lightning.cli import main
    path = REPO / 'experiments' / 'configs' / f'{name}.yaml'
    cli = main(['fit', '--config', str(path), f'--trainer.default_root_dir={tmp_path}',
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
    path = REPO / 'experiments' / 'configs' / f'{name}.yaml'
    cli = main(['fit', '--config', str(path), f'--trainer.default_root_dir={tmp_path}',
                '--trainer.fast_dev_run=true', '--trainer.accelerator=cpu',
                '--trainer.enable_progress_bar=false', '--data.init_args.standin=8',
                '--data.init_args.batch_size=4', '--test_after_fit=true'])
    assert {f'test/{metric}', 'test/loss'} <= set(cli.trainer.callback_metrics)
