r"""GraphTransformer speaks PyG GPSConv's vocabulary: ``attn_type``, ``attn_kwargs``, ``conv``.
The old names (``attention``, ``attention_kwargs``, ``local_mp``) work for one release with one
FutureWarning, in Python, in spec dicts, in YAML configs and in the hyperparameters of old
checkpoints, and build the same model."""
import copy
import warnings

import pytest
import torch
from torch_geometric.data import Batch

from pyg_grf.lightning.specs import build_model
from pyg_grf.nn import GraphTransformer
from pyg_grf.nn.models.options import RENAMED_ARGS
from tests.lightning.helpers import tiny_config, write_config
from tests.nn.models.test_graph_transformer import _graphs

# LightningCLI warns when args= is used while pytest has its own sys.argv.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

GT = 'pyg_grf.nn.models.graph_transformer.GraphTransformer'


@pytest.fixture(scope='module')
def graphs():
    return _graphs()


def old_names(kwargs):
    r"""The same arguments under the deprecated names."""
    new_to_old = {new: old for old, new in RENAMED_ARGS.items()}
    return {new_to_old.get(key, key): value for key, value in kwargs.items()}


def future_warnings(record):
    return [w for w in record if issubclass(w.category, FutureWarning)]


CASES = {
    'grf_gine': dict(attn_type='grf', attn_kwargs={'max_length': 3, 'global_beta': 0.1},
                     conv='gine', edge_encoder='linear', edge_dim=3),
    'linear_gat_gps': dict(attn_type='linear', conv='gat', block='gps', norm='batch_norm'),
    'gkat': dict(attn_type='gkat', attn_kwargs={'mode': 'softmax'}),
    'mpnn_only': dict(attn_type=None, conv='gin'),
    'conv_instance': dict(attn_type='multihead', block='gps', conv='instance'),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_new_names_equal_old_names(graphs, name):
    # The same seed gives the same weights and bit-for-bit the same float64 outputs.
    from torch_geometric.nn import GATConv

    def build(kwargs):
        kwargs = dict(kwargs)
        if kwargs.get('conv') == 'instance':
            kwargs['conv'] = GATConv(16, 8, heads=2)
        torch.manual_seed(0)
        return kwargs

    batch = Batch.from_data_list(graphs)
    batch.x, batch.edge_attr = batch.x.double(), batch.edge_attr.double()
    new_kwargs = build(CASES[name])
    new = GraphTransformer(4, 16, 3, num_layers=2, heads=2, **new_kwargs).double().eval()
    old_kwargs = old_names(build(CASES[name]))
    assert not set(old_kwargs) & set(RENAMED_ARGS.values())
    with pytest.warns(FutureWarning, match='renamed'):
        old = GraphTransformer(4, 16, 3, num_layers=2, heads=2, **old_kwargs).double().eval()
    assert str(old) == str(new)
    assert old.attn_type == new.attn_type and old.attn_kwargs == new.attn_kwargs
    assert old.state_dict().keys() == new.state_dict().keys()
    assert all(torch.equal(v, new.state_dict()[k]) for k, v in old.state_dict().items())
    out = new(batch)
    assert out.dtype == torch.float64
    assert torch.equal(old(batch), out)


def test_old_names_warn_once():
    kwargs = dict(num_layers=1, edge_encoder='linear', edge_dim=3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        model = GraphTransformer(4, 16, 2, attention='grf', attention_kwargs={'max_length': 2},
                                 local_mp='gine', **kwargs)
    (w, ) = future_warnings(record)  # exactly one, for the three
    assert w.filename == __file__  # points at the caller
    message = str(w.message)
    for old, new in RENAMED_ARGS.items():
        assert f'{new}= instead of {old}=' in message
    assert (model.attn_type, model.attn_kwargs, model.conv) == ('grf', {'max_length': 2},
                                                                'gine')
    # One old name: one warning that names its new name.
    with pytest.warns(FutureWarning, match=r"argument local_mp is renamed .*use conv= instead "
                                           r"of local_mp="):
        GraphTransformer(4, 16, 2, local_mp='gin', **kwargs)
    # The new names: no warning at all.
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        GraphTransformer(4, 16, 2, attn_type='grf', attn_kwargs={'max_length': 2}, conv='gine',
                         **kwargs)
    # Old attention *values* keep their own warning, under either name.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        model = GraphTransformer(4, 16, 2, attn_type='performer', **kwargs)
    (w, ) = future_warnings(record)
    assert "use attn_type='favor'" in str(w.message) and model.attn_type == 'favor'
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        model = GraphTransformer(4, 16, 2, attention='softmax', block='gps', **kwargs)
    assert len(future_warnings(record)) == 2 and model.attn_type == 'multihead'


def test_old_and_new_name_together_raise():
    kw = dict(num_layers=1, edge_encoder='linear', edge_dim=3)
    with pytest.raises(TypeError, match=r"GraphTransformer got both attn_type='linear' and "
                                        r"attention='grf' \(the deprecated name of attn_type\): "
                                        r"expected only attn_type"):
        GraphTransformer(4, 16, 2, attn_type='linear', attention='grf', **kw)
    with pytest.raises(TypeError, match=r"got both attn_kwargs=\{'max_length': 2\} and "
                                        r"attention_kwargs=\{'max_length': 3\}"):
        GraphTransformer(4, 16, 2, attn_kwargs={'max_length': 2},
                         attention_kwargs={'max_length': 3}, **kw)
    with pytest.raises(TypeError, match=r"got both conv='gin' and local_mp='gine'"):
        GraphTransformer(4, 16, 2, conv='gin', local_mp='gine', **kw)
    with pytest.raises(TypeError, match=r"got both attn_type=None and attention='linear'"):
        GraphTransformer(4, 16, 2, attn_type=None, conv='gin', attention='linear', **kw)
    # The same value under both names (a config merged with an old checkpoint's
    # hyperparameters), or the new name left at its default: the old one is taken.
    with pytest.warns(FutureWarning, match='renamed'):
        model = GraphTransformer(4, 16, 2, attn_type='linear', attention='linear', **kw)
    assert model.attn_type == 'linear'
    with pytest.warns(FutureWarning, match='renamed'):
        model = GraphTransformer(4, 16, 2, attn_type='grf', attention=None, conv='gin', **kw)
    assert model.attn_type is None and model.blocks[0].attn is None


def test_old_attribute_names():
    model = GraphTransformer(4, 16, 2, num_layers=1, attn_type='linear', conv='gin',
                             attn_kwargs={'feature_map': 'relu'})
    for old, new in RENAMED_ARGS.items():
        with pytest.warns(FutureWarning, match=f'GraphTransformer.{old} is renamed {new}'):
            assert getattr(model, old) == getattr(model, new)


def test_spec_dicts_with_new_and_old_names():
    # A task's model given as a spec or as a dict of arguments (how checkpoints store it).
    new = dict(in_channels=3, hidden_channels=8, out_channels=2, num_layers=1,
               attn_type='grf', attn_kwargs={'max_length': 2}, conv='gin')
    torch.manual_seed(0)
    a = build_model({'class_path': GT, 'init_args': new})
    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match='renamed'):
        b = build_model({'class_path': GT, 'init_args': old_names(new)})
    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match='renamed'):
        c = build_model(old_names(new))
    for model in (b, c):
        assert all(torch.equal(v, a.state_dict()[k]) for k, v in model.state_dict().items())


def _old_config(config):
    config = copy.deepcopy(config)
    spec = config['model']['init_args']['model']
    spec['init_args'] = old_names(spec['init_args'])
    return config


def test_yaml_configs_with_new_and_old_names(tmp_path):
    # LightningCLI (jsonargparse) takes the new names; the old ones still parse, with the
    # warning, and build the same model. The deprecated names stay out of parsed configs (and so
    # out of checkpoints) unless a config names them.
    from pyg_grf.lightning.cli import GRFLightningCLI
    new = tiny_config(tmp_path / 'run')
    spec = new['model']['init_args']['model']['init_args']
    spec['conv'] = {'class_path': 'torch_geometric.nn.GATConv',
                    'init_args': {'in_channels': 8, 'out_channels': 8}}
    assert {'attn_type', 'attn_kwargs'} <= set(spec)
    with warnings.catch_warnings():
        warnings.simplefilter('error', FutureWarning)
        cli_new = GRFLightningCLI(args=['--config', write_config(tmp_path / 'new.yaml', new)],
                                  run=False)
    dumped = cli_new.parser.dump(cli_new.config)
    assert 'attn_type: grf' in dumped and 'conv:' in dumped
    assert not any(f' {old}:' in dumped for old in RENAMED_ARGS)
    with pytest.warns(FutureWarning, match='renamed'):
        cli_old = GRFLightningCLI(args=['--config', write_config(tmp_path / 'old.yaml',
                                                                 _old_config(new))], run=False)
    a, b = cli_new.model.model, cli_old.model.model
    assert type(b.blocks[0].conv).__name__ == 'GATConv' and str(a) == str(b)
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in b.state_dict().items())


def test_old_checkpoints_load_to_the_same_outputs(tmp_path):
    # A checkpoint whose hyperparameters hold the old names (written before the rename) loads
    # with load_from_checkpoint and under `pyg-grf test` with a migrated config.
    from pyg_grf.lightning.cli import main
    from pyg_grf.lightning.tasks import GraphLevelTask
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=2,
                                      limit_val_batches=1))
    cli = main(['fit', '--config', config])
    ckpt = torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)
    spec = ckpt['hyper_parameters']['model']
    assert 'attn_type' in spec['init_args'] and 'attention' not in spec['init_args']
    spec['init_args'] = old_names(spec['init_args'])
    old = str(tmp_path / 'old.ckpt')
    torch.save(ckpt, old)
    with pytest.warns(FutureWarning, match='renamed'):
        task = GraphLevelTask.load_from_checkpoint(old).eval()
    batch = Batch.from_data_list(list(cli.datamodule.val_dataset)[:4])
    assert torch.equal(task(batch), cli.model.eval()(batch))
    with pytest.warns(FutureWarning, match='renamed'):
        cli = main(['test', '--config', config, f'--ckpt_path={old}'])
    assert 'test/acc' in cli.trainer.callback_metrics
