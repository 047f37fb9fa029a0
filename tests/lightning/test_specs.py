r"""Model specs and the class allow-list (:mod:`pyg_grf.lightning.specs`): a config's or a
checkpoint's ``class_path`` may name allow-listed classes only, and checkpoints written by the
tasks load back to the same model."""
import inspect

import lightning.pytorch as pl
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from pyg_grf.lightning.base import Task
from pyg_grf.lightning.link import LinkLevelTask
from pyg_grf.lightning.specs import (
    UntrustedClassError,
    allowed_class_paths,
    build_model,
    register_model_class,
)
from pyg_grf.lightning.tasks import GraphLevelTask, NodeLevelTask

MODEL = dict(in_channels=3, hidden_channels=8, num_layers=1, attn_type='linear', dropout=0.1)


def test_task_class_paths():
    allowed = allowed_class_paths()
    for path in ('pyg_grf.lightning.tasks.GraphLevelTask', 'pyg_grf.lightning.tasks.NodeLevelTask',
                 'pyg_grf.lightning.link.LinkLevelTask'):
        assert allowed[path] == path  # the class paths of configs and checkpoints, unchanged


def test_model_spec_with_a_nested_conv_spec():
    # A checkpoint's model spec may hold module specs in its init_args (GraphTransformer's
    # conv by class_path): they are built too, each class checked before it is imported.
    from torch_geometric.nn import GATConv
    conv = {'class_path': 'torch_geometric.nn.GATConv',
            'init_args': {'in_channels': 16, 'out_channels': 8, 'heads': 2}}
    spec = {'class_path': 'pyg_grf.nn.GraphTransformer',
            'init_args': {'in_channels': 4, 'hidden_channels': 16, 'out_channels': 2,
                          'num_layers': 1, 'heads': 2, 'attn_type': 'linear',
                          'conv': conv, 'block': 'gps'}}
    model = GraphLevelTask(spec, num_classes=2).model
    assert isinstance(model.conv, GATConv) and isinstance(model.blocks[0].conv, GATConv)
    bad = {**spec, 'init_args': {**spec['init_args'],
                                 'conv': {'class_path': 'os.system', 'init_args': {}}}}
    with pytest.raises(UntrustedClassError, match=r"model\.init_args\.conv.*'os.system'"):
        GraphLevelTask(bad, num_classes=2)
    with pytest.raises(UntrustedClassError, match=r"'model\.init_args' must be a dict \(got "
                                                  r"list\)"):
        build_model({'class_path': 'torch.nn.Linear', 'init_args': [2, 2]})
    with pytest.raises(TypeError, match="'model' must be a torch.nn.Module or a dict.*got int"):
        build_model(3)


class Mine(torch.nn.Linear):
    r"""A user's own module, for register_model_class."""


def test_class_allow_list_is_explicit_not_by_package(tmp_path):
    # torch_geometric.nn.Sequential evaluates strings from its input_args; a package-wide
    # allow-list would admit it, so the list is explicit
    marker = tmp_path / 'pwned'
    evil = {'class_path': 'torch_geometric.nn.Sequential',
            'init_args': {'input_args': f"x, __import__('os').system('touch {marker}')",
                          'modules': []}}
    with pytest.raises(UntrustedClassError, match="'torch_geometric.nn.Sequential'.*"
                                                  "pyg_grf.lightning.specs.MODEL_CLASS_PATHS"):
        build_model(evil)
    with pytest.raises(UntrustedClassError, match="'torch.nn.Module'"):
        build_model({'class_path': 'torch.nn.Module'})
    assert not marker.exists()
    allowed = allowed_class_paths()
    # public and defining-module names of an allowed class
    assert 'torch_geometric.nn.GATConv' in allowed
    assert 'torch_geometric.nn.conv.gat_conv.GATConv' in allowed
    # the Peptides SAMSA configs' OGB encoders, when ogb is installed
    try:
        import ogb  # noqa: F401
        assert 'ogb.graphproppred.mol_encoder.AtomEncoder' in allowed
    except ImportError:
        pass
    path = f'{Mine.__module__}.{Mine.__qualname__}'
    with pytest.raises(UntrustedClassError, match='register_model_class'):
        build_model({'class_path': path})
    register_model_class(Mine)
    assert isinstance(build_model({'class_path': path, 'init_args': {
        'in_features': 2, 'out_features': 2}}), Mine)
    with pytest.raises(TypeError, match='torch.nn.Module subclass'):
        register_model_class(len)


# Checkpoints written by the tasks ---------------------------------------------------------


def _graphs(num_graphs=6, node_targets=False):
    gen = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(num_graphs):
        n = 4 + i % 3
        edge_index = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
        y = torch.arange(n) % 2 if node_targets else torch.tensor([i % 2])
        graphs.append(Data(x=torch.randn(n, 3, generator=gen), edge_index=edge_index, y=y))
    return graphs


def _graph_case():
    task = GraphLevelTask(dict(MODEL, out_channels=2), num_classes=2, warmup_epochs=1)
    return task, _graphs()


def _node_case():
    data = _graphs(1, node_targets=True)[0]
    n = data.num_nodes
    data.train_mask = torch.arange(n) < 2
    data.val_mask = data.test_mask = torch.arange(n) >= 2
    task = NodeLevelTask(dict(MODEL, out_channels=2, pooling=None), num_classes=2)
    return task, [data]


def _link_case():
    graphs = _graphs()
    for data in graphs:
        n = data.num_nodes
        data.edge_label_index = torch.tensor([[0, 1, 0, 2], [1, 2, n - 1, n - 1]])
        data.edge_label = torch.tensor([1, 1, 0, 0])
    task = LinkLevelTask(dict(MODEL, out_channels=4, pooling=None), num_negatives=1)
    return task, graphs


@pytest.mark.filterwarnings('ignore:You defined a `validation_step` but have no')
@pytest.mark.parametrize('case', [_graph_case, _node_case, _link_case])
def test_checkpoint_round_trip_and_refusal(case, tmp_path):
    # A checkpoint written by each task loads back (no arguments: the model spec is a
    # hyperparameter) to the same weights, hyperparameters and predictions; the hyperparameters
    # are the task's constructor arguments and Task's; a checkpoint whose model spec names
    # a class outside the allow-list is refused before anything is built.
    task, graphs = case()
    cls = type(task)
    loader = DataLoader(graphs, batch_size=3)
    trainer = pl.Trainer(max_steps=1, accelerator='cpu', default_root_dir=tmp_path, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(task, loader)
    path = tmp_path / 'task.ckpt'
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=True)
    # (the optimiser's arguments, which the task passes on to Task as **kwargs, come first)
    names = [*inspect.signature(Task.__init__).parameters,
             *inspect.signature(cls.__init__).parameters]
    assert list(ckpt['hyper_parameters']) == [n for n in dict.fromkeys(names)
                                              if n not in ('self', 'kwargs')]
    assert 'pyg_grf_rng_states' in ckpt

    loaded = cls.load_from_checkpoint(path)
    assert dict(loaded.hparams) == dict(task.hparams)
    state = task.state_dict()
    assert all(torch.equal(state[key], value) for key, value in loaded.state_dict().items())
    batch = Batch.from_data_list(graphs[:3])
    task.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(task.predict_step(batch, 0), loaded.predict_step(batch, 0))

    marker = tmp_path / 'pwned'
    ckpt['hyper_parameters']['model'] = {
        'class_path': 'torch_geometric.nn.Sequential',
        'init_args': {'input_args': f"x, __import__('os').system('touch {marker}')",
                      'modules': []}}
    torch.save(ckpt, tmp_path / 'evil.ckpt')
    with pytest.raises(UntrustedClassError, match=r"Refusing to build 'hparams\.model' from "
                                                  r"class_path 'torch_geometric\.nn\.Sequential'"):
        cls.load_from_checkpoint(tmp_path / 'evil.ckpt')
    assert not marker.exists()


def _evil_checkpoint(path, class_path, init_args, instantiator=False):
    hparams = {'model': {'class_path': class_path, 'init_args': init_args},
               'task': 'multiclass', 'num_classes': 2}
    if instantiator:  # the LightningCLI form
        hparams = {'_class_path': 'pyg_grf.lightning.tasks.GraphLevelTask',
                   '_instantiator': 'lightning.pytorch.cli.instantiate_module', **hparams}
    torch.save({'state_dict': {}, 'hyper_parameters': hparams,
                'pytorch-lightning_version': '2.6.0'}, path)


@pytest.mark.parametrize('instantiator', [False, True])
def test_checkpoint_cannot_run_code(tmp_path, instantiator):
    marker = tmp_path / 'pwned'
    ckpt = tmp_path / 'evil.ckpt'
    _evil_checkpoint(ckpt, 'os.system', {'command': f'touch {marker}'}, instantiator)
    torch.load(ckpt, weights_only=True)  # plain dicts and strings: passes weights_only
    with pytest.raises(UntrustedClassError, match=r"Refusing to build .* 'os\.system'.*only "
                                                  r"the torch\.nn\.Module subclasses listed"):
        GraphLevelTask.load_from_checkpoint(ckpt)
    assert not marker.exists()


def test_allow_list_refuses_non_modules(tmp_path):
    with pytest.raises(UntrustedClassError, match="Refusing to build .* 'torch.hub.load'"):
        build_model({'class_path': 'torch.hub.load', 'init_args': {'repo_or_dir': 'x'}})
    with pytest.raises(UntrustedClassError, match='must be a dotted name'):
        build_model({'class_path': 'torch.nn.Linear; import os'})
    # Allowed: a torch / pyg_grf module from a checkpoint of plain data.
    assert isinstance(build_model({'class_path': 'torch.nn.Linear',
                                   'init_args': {'in_features': 2, 'out_features': 3}}),
                      torch.nn.Linear)
    ckpt = tmp_path / 'ok.ckpt'
    _evil_checkpoint(ckpt, 'torch.nn.Linear', {'in_features': 2, 'out_features': 2})
    task = GraphLevelTask.load_from_checkpoint(ckpt, strict=False)
    assert isinstance(task.model, torch.nn.Linear)
