r"""What a ``pyg-grf`` config, command line or ``--ckpt_path`` may make the command build or
read: only allow-listed classes (:mod:`pyg_grf.lightning.specs`), only local checkpoints. Each
refusal comes before anything is built or read (a marker file that the refused input would
create stays absent)."""
import contextlib
import re

import pytest
import torch

from pyg_grf.lightning import cli as cli_module
from pyg_grf.lightning import specs
from pyg_grf.lightning.cli import GRFLightningCLI, main
from pyg_grf.lightning.specs import UntrustedClassError
from tests.conftest import REPO
from tests.lightning.helpers import tiny_config, write_config

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def _sequential_config(tmp_path, marker):
    # The adversarial review's config (p12_config_pygseq_rce.sh): PyG's Sequential evaluates
    # its input_args string when it is built.
    cfg = tiny_config(tmp_path / 'run')
    cfg['model']['init_args']['model'] = {
        'class_path': 'torch_geometric.nn.Sequential',
        'init_args': {'input_args': f"x -> __import__('os').system('touch {marker}') or Tensor",
                      'modules': []}}
    return write_config(tmp_path / 'rce.yaml', cfg)


def test_config_naming_pyg_sequential_is_refused_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / 'MARK_RCE'
    config = _sequential_config(tmp_path, marker)
    with pytest.raises(SystemExit) as exc:
        main(['fit', '--config', config])
    assert exc.value.code == 2 and not marker.exists()
    err = capsys.readouterr().err
    assert "Refusing to import 'torch_geometric.nn.Sequential'" in err
    assert 'register_model_class' in err and 'PYG_GRF_TRUSTED_CLASSES' in err
    # --print_config parses only: refused as well
    with pytest.raises(SystemExit) as exc:
        main(['fit', '--config', config, '--print_config'])
    assert exc.value.code == 2 and not marker.exists()


def test_parsed_config_is_checked_before_anything_is_built(tmp_path, monkeypatch):
    # Without jsonargparse's import policy (older jsonargparse), the check of the parsed
    # config still refuses before the class is built.
    monkeypatch.setattr(cli_module, 'config_import_policy',
                        lambda allowed: contextlib.nullcontext())
    marker = tmp_path / 'MARK_RCE'
    with pytest.raises(UntrustedClassError, match=r"Refusing to build 'model\.init_args\.model' "
                                                  r"from class_path 'torch_geometric\.nn\."
                                                  r"Sequential'.*register_model_class"):
        main(['fit', '--config', _sequential_config(tmp_path, marker)])
    assert not marker.exists()


def _refused(tmp_path, capsys, cfg, *args, name):
    with pytest.raises(SystemExit) as exc:
        GRFLightningCLI(args=['--config', write_config(tmp_path / 'c.yaml', cfg), *args],
                        run=False)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"Refusing to import '{name}'" in err, err


@pytest.mark.parametrize('where', ['data', 'transform', 'callback', 'logger', 'optimizer',
                                   'callable', 'dict_kwargs'])
def test_every_class_path_of_a_config_is_allow_listed(where, tmp_path, capsys):
    cfg = tiny_config(tmp_path / 'run')
    data, args = cfg['data'], []
    if where == 'data':  # a data module that is not in the lists
        name = data['class_path'] = 'tests.lightning.helpers.FoldedSyntheticDataModule'
    elif where == 'transform':
        name = 'torch_geometric.transforms.Compose'  # takes callables by name
        data['init_args']['transform'] = {'class_path': name,
                                          'init_args': {'transforms': ['builtins.print']}}
    elif where == 'callback':
        name = 'lightning.pytorch.callbacks.LambdaCallback'
        cfg['trainer']['callbacks'] = [{'class_path': name,
                                        'init_args': {'on_fit_start': 'builtins.print'}}]
    elif where == 'logger':
        name = 'lightning.pytorch.loggers.MLFlowLogger'
        cfg['trainer']['logger'] = {'class_path': name}
    elif where == 'optimizer':
        name = 'torch.optim.LBFGS'
        args = [f'--optimizer={name}']
    elif where == 'callable':  # a Callable argument given as a dotted function name
        name = 'builtins.print'
        cfg['model']['init_args']['model']['init_args']['conv'] = {
            'class_path': 'torch_geometric.nn.GINConv', 'init_args': {'nn': name}}
        cfg['model']['init_args']['model']['init_args']['block'] = 'gps'
    else:  # a spec inside a dict of Any: kept as a dict by the parser, refused by the check
        data['init_args']['dataset_kwargs']['extra'] = {
            'class_path': 'torch_geometric.nn.Sequential', 'init_args': {'input_args': 'x'}}
        with pytest.raises(UntrustedClassError, match=r"'data\.init_args\.dataset_kwargs\."
                                                      r"extra' from class_path 'torch_geometric"):
            GRFLightningCLI(args=['--config', write_config(tmp_path / 'c.yaml', cfg)],
                            run=False)
        return
    _refused(tmp_path, capsys, cfg, *args, name=name)


def test_allow_listed_and_trusted_classes_are_built(tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import EarlyStopping
    from torch_geometric.transforms import NormalizeFeatures
    cfg = tiny_config(tmp_path / 'run')
    cfg['model']['class_path'] = 'GraphLevelTask'  # short names still resolve
    cfg['data']['init_args']['transform'] = {
        'class_path': 'torch_geometric.transforms.NormalizeFeatures'}
    cfg['trainer']['callbacks'] = [{'class_path': 'lightning.pytorch.callbacks.EarlyStopping',
                                    'init_args': {'monitor': 'val/loss'}}]
    cfg['trainer']['logger'] = {'class_path': 'lightning.pytorch.loggers.CSVLogger',
                                'init_args': {'save_dir': str(tmp_path / 'logs')}}
    config = write_config(tmp_path / 'ok.yaml', cfg)
    cli = GRFLightningCLI(args=['--config', config, '--optimizer=torch.optim.SGD',
                                '--optimizer.lr=0.1'], run=False)
    assert isinstance(cli.datamodule.transform, NormalizeFeatures)
    assert any(isinstance(c, EarlyStopping) for c in cli.trainer.callbacks)
    assert cli.config.optimizer.class_path == 'torch.optim.SGD'

    # A class of one's own: refused, then allowed by $PYG_GRF_TRUSTED_CLASSES (itself or
    # its package) or register_config_class.
    cfg['data']['class_path'] = 'tests.lightning.helpers.FoldedSyntheticDataModule'
    config = write_config(tmp_path / 'own.yaml', cfg)
    for trusted in ('tests.lightning.helpers.FoldedSyntheticDataModule', 'tests.lightning'):
        monkeypatch.setenv('PYG_GRF_TRUSTED_CLASSES', trusted)
        assert GRFLightningCLI(args=['--config', config], run=False).datamodule.num_folds == 3
    monkeypatch.delenv('PYG_GRF_TRUSTED_CLASSES')
    from tests.lightning.helpers import FoldedSyntheticDataModule
    monkeypatch.setattr(specs, '_REGISTERED_CONFIG', {})
    specs.register_config_class(FoldedSyntheticDataModule)
    assert GRFLightningCLI(args=['--config', config], run=False).datamodule.num_folds == 3
    with pytest.raises(TypeError, match='register_config_class needs a class, got'):
        specs.register_config_class(print)
    monkeypatch.setenv('PYG_GRF_TRUSTED_CLASSES', 'ok.Name, not a name')
    with pytest.raises(ValueError, match=r"PYG_GRF_TRUSTED_CLASSES must hold comma-separated "
                                         r"dotted names .* got 'not a name'"):
        GRFLightningCLI(args=['--config', config], run=False)


def test_import_policy_is_restored(tmp_path):
    from jsonargparse import _common
    before = (dict(_common.parsing_settings['import_path_verdicts']),
              _common.parsing_settings['import_paths_enforced'])
    with pytest.raises(SystemExit):
        main(['fit', '--config', _sequential_config(tmp_path, tmp_path / 'm')])
    assert (_common.parsing_settings['import_path_verdicts'],
            _common.parsing_settings['import_paths_enforced']) == before


def test_shipped_configs_print(capsys):
    # --print_config and the other parse-only options still work for the shipped configs.
    with pytest.raises(SystemExit) as exc:
        main(['fit', '--config', str(REPO / 'experiments/configs/motifs_grf.yaml'),
              '--config', str(REPO / 'experiments/configs/motifs_grf_gpsconv.yaml'),
              '--print_config'])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and 'class_path: torch_geometric.nn.GATConv' in out


def test_check_config_class_paths_walks_everything():
    ok = {'model': {'class_path': 'pyg_grf.lightning.tasks.GraphLevelTask', 'init_args': {
        'model': {'class_path': 'pyg_grf.nn.GraphTransformer'}}},  # a re-export
        'trainer': {'callbacks': [{'class_path': 'lightning.pytorch.callbacks.EarlyStopping'}]}}
    specs.check_config_class_paths(ok)
    for bad, key in [({'a': [{'b': {'class_path': 'os.system'}}]}, r"'a\[0\]\.b'"),
                     ({'x': {'_class_path': 'builtins.eval'}}, r"'x'"),
                     ({'act': print}, r"'act' from the Python object 'builtins\.print'"),
                     ({'m': torch}, r"'m' from the Python object 'torch'")]:
        with pytest.raises(UntrustedClassError, match=f'Refusing to build {key}'):
            specs.check_config_class_paths(bad)
    with pytest.raises(UntrustedClassError, match=r"allowed under this name: "
                                                  r"lightning\.pytorch\.callbacks\.EarlyStopping"):
        specs.check_config_class_paths({'class_path': 'pytorch_lightning.callbacks.EarlyStopping'})
    with pytest.raises(UntrustedClassError, match="'class_path' must be a dotted class name"):
        specs.check_config_class_paths({'class_path': ['os.system']})
    specs.check_config_class_paths({'class_path': 'mine.Cls'}, trusted=['mine'])


def test_checkpoint_hyperparameters_given_to_the_cli_are_checked(tmp_path):
    # LightningCLI parses the hyperparameters of a local --ckpt_path into the config (to build
    # the model they describe): they go through the same allow-list.
    marker = tmp_path / 'MARK_CK'
    hparams = {'task': 'multiclass', 'num_classes': 2,
               '_class_path': 'pyg_grf.lightning.tasks.GraphLevelTask',
               'model': {'class_path': 'torch_geometric.nn.Sequential', 'init_args': {
                   'input_args': f"x -> __import__('os').system('touch {marker}') or Tensor",
                   'modules': []}}}
    ckpt = tmp_path / 'evil.ckpt'
    torch.save({'state_dict': {}, 'hyper_parameters': hparams, 'epoch': 0, 'global_step': 0,
                'pytorch-lightning_version': '2.6.0'}, ckpt)
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    with pytest.raises(SystemExit):
        main(['test', '--config', config, f'--ckpt_path={ckpt}'])
    assert not marker.exists()


# --ckpt_path: local files only -------------------------------------------------------------

REMOTE = ['simplecache::http://127.0.0.1:9/x.ckpt', 'filecache::http://127.0.0.1:9/x.ckpt',
          '  http://127.0.0.1:9/x.ckpt', '\ts3://bucket/x.ckpt', 'x.ckpt::http://a/b',
          'blockcache::file:///tmp/x.ckpt', 'data:application/octet-stream;base64,AAAA',
          'registry:some-model', 'REGISTRY']


@pytest.mark.parametrize('subcommand', ['fit', 'validate', 'test', 'predict'])
def test_remote_and_chained_checkpoint_paths_are_refused(subcommand, tmp_path, monkeypatch):
    import fsspec.core

    def no_io(*args, **kwargs):
        raise AssertionError(f'fsspec was asked for {args}')
    monkeypatch.setattr(fsspec.core, 'url_to_fs', no_io)
    monkeypatch.setattr(GRFLightningCLI, 'instantiate_classes', no_io)
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    for url in REMOTE:
        with pytest.raises(ValueError, match=r"--ckpt_path .*: remote checkpoints are refused"):
            main([subcommand, '--config', config, f'--ckpt_path={url}'])


def test_check_local_ckpt_path():
    from pyg_grf.lightning.checkpoints import check_local_ckpt_path
    for ok in (None, 'last', 'best', 'hpc', 'runs/v0/checkpoints/last.ckpt', '/abs/x.ckpt',
               'dir:with:colons/x.ckpt'):
        check_local_ckpt_path(ok)
    for url in REMOTE:
        with pytest.raises(ValueError, match=re.escape(f'--ckpt_path {url!r}: remote '
                                                       f'checkpoints are refused')):
            check_local_ckpt_path(url)
    with pytest.raises(ValueError, match='must be the path of a local checkpoint file, got int'):
        check_local_ckpt_path(3)


def test_remote_run_folders_are_refused(tmp_path):
    # --ckpt_path last looks in the run folders: a URL there had checkpoints listed from elsewhere
    from pyg_grf.lightning.checkpoints import check_local_dirs
    for opt, value in [('checkpoint.dirpath', 'http://127.0.0.1:9/x'),
                       ('trainer.default_root_dir', 'simplecache::s3://bucket/run')]:
        section, key = opt.split('.')
        with pytest.raises(ValueError, match=f"--{opt} .*run folders must be local"):
            check_local_dirs({section: {key: value}})
    check_local_dirs({'trainer': {'default_root_dir': str(tmp_path)},
                      'checkpoint': {'dirpath': None}})
