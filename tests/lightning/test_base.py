r"""The shared base of the tasks (:class:`~pyg_grf.lightning.base.Task`): the step methods, the
loss logging, the hyperparameters of subclasses, the schedule's length and the random state."""
import random

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.lightning.base import Task
from pyg_grf.lightning.link import LinkLevelTask
from pyg_grf.lightning.rng import rng_states, set_rng_states
from pyg_grf.lightning.schedule import schedule_steps
from pyg_grf.lightning.tasks import GraphLevelTask, NodeLevelTask

MODEL = dict(in_channels=3, hidden_channels=8, num_layers=1, attn_type='linear')


def _batch():
    graphs = []
    for i, n in enumerate((4, 6, 3)):
        edge_index = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
        graphs.append(Data(x=torch.randn(n, 3), edge_index=edge_index, y=torch.tensor([i % 2]),
                           edge_label_index=torch.tensor([[0, 1, 0], [1, 2, n - 1]]),
                           edge_label=torch.tensor([1, 1, 0]),
                           train_mask=torch.ones(n, dtype=torch.bool)))
    return Batch.from_data_list(graphs)


def _tasks():
    return [GraphLevelTask(dict(MODEL, out_channels=2), num_classes=2),
            NodeLevelTask(dict(MODEL, out_channels=1, pooling=None), task='regression'),
            LinkLevelTask(dict(MODEL, out_channels=4, pooling=None))]


@pytest.mark.parametrize('split', ['train', 'val', 'test'])
def test_every_task_logs_its_loss_the_same_way(split):
    # The loss is logged by Task.log_loss for all tasks: per step and epoch in training, per
    # epoch and averaged over processes in validation and test, in the progress bar but in test.
    expected = dict(batch_size=3, on_step=split == 'train', on_epoch=True,
                    prog_bar=split != 'test', sync_dist=split != 'train')
    batch = _batch()
    batch.y = batch.y.float()
    for task in _tasks():
        if isinstance(task, NodeLevelTask):
            batch.y = torch.zeros(batch.num_nodes)
            setattr(batch, f'{split}_mask', torch.arange(batch.num_nodes) < 3)
        logged = {}
        task.log = lambda name, value, **kw: logged.__setitem__(name, kw)
        step = {'train': task.training_step, 'val': task.validation_step,
                'test': task.test_step}[split]
        out = step(batch, 0)
        assert (out is not None) == (split == 'train'), type(task).__name__
        assert logged[f'{split}/loss'] == expected, type(task).__name__


def test_subclass_supplies_the_step_and_gets_its_hyperparameters():
    class Bare(Task):
        pass

    with pytest.raises(NotImplementedError, match=r"Bare must implement shared_step\(batch, "
                                                  r"split\)"):
        Bare(torch.nn.Identity()).training_step(_batch(), 0)

    class Mean(Task):  # a task of one's own: the mean output as the loss
        def __init__(self, model: torch.nn.Module, scale: float = 1., lr: float = 1e-3):
            super().__init__(model, lr=lr, warmup_epochs=1.)
            self.scale = scale

        def shared_step(self, batch, split):
            loss = self.scale * self(batch).mean()
            self.log_loss(split, loss, batch.num_graphs)
            return loss

    task = Mean(dict(MODEL, out_channels=1), scale=2.)
    # The hyperparameters are the concrete task's constructor arguments, in their order.
    assert list(task.hparams) == ['model', 'scale', 'lr']
    assert task.hparams.scale == 2. and task.optim['warmup_epochs'] == 1.
    task.log = lambda *args, **kw: None
    assert task.training_step(_batch(), 0).dim() == 0
    assert task.predict_step(_batch(), 0).shape == (3, 1)
    with pytest.raises(ValueError, match=r"expected warmup_epochs >= 0 and 0 <= min_lr_ratio "
                                         r"<= 1, got 0.0 and 2"):
        Task(torch.nn.Identity(), min_lr_ratio=2)
    assert list(Task(torch.nn.Identity(), lr=0.1).hparams) == [
        'lr', 'weight_decay', 'warmup_epochs', 'max_epochs', 'min_lr_ratio', 'betas',
        'optimizer']


@pytest.mark.parametrize('stepping_batches,trainer_epochs,warmup_epochs,max_epochs,expected', [
    (50, 10, 2, None, (10, 50)),   # 5 steps per epoch
    (50, 10, 1, 6, (5, 30)),       # the cosine ends at epoch 6
    (50, 10, 0.5, None, (2, 50)),  # round(2.5) = 2
    (7, -1, 1, None, (7, 7)),      # bounded by steps: one "epoch"
    (7, None, 3, None, (7, 7)),    # warm-up at most the whole run
    (0, 3, 0, None, (0, 1)),       # at least one step
])
def test_schedule_steps(stepping_batches, trainer_epochs, warmup_epochs, max_epochs, expected):
    assert schedule_steps(stepping_batches, trainer_epochs, warmup_epochs, max_epochs) == expected
    Task(torch.nn.Identity(), warmup_epochs=warmup_epochs, min_lr_ratio=0.5)  # accepted


def test_rng_states_round_trip():
    states = rng_states()
    first = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_states(states)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert first[2] == again[2]
    # tensors and plain Python objects only: a weights_only checkpoint holds them
    assert isinstance(states['numpy'][1], torch.Tensor) and isinstance(states['python'], tuple)



@pytest.mark.parametrize('name', ['adam', 'adamw'])
def test_optimizer_option_against_a_hand_written_step(name):
    # One step at a constant learning rate (no warm-up, min_lr_ratio=1) against Adam's first
    # step written out: with m = (1 - b1) g and v = (1 - b2) g^2 the bias-corrected update is
    # lr * g / (|g| + eps). For 'adam' g includes the L2 term wd * w; for 'adamw' it does not,
    # and the weight shrinks by lr * wd * w apart from it. Biases are never decayed.
    from types import SimpleNamespace
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    lr, wd, eps = 0.1, 0.5, 1e-8
    task = NodeLevelTask(lin, num_classes=2, lr=lr, weight_decay=wd, min_lr_ratio=1.0,
                         optimizer=name)
    task._trainer = SimpleNamespace(estimated_stepping_batches=10, max_epochs=1)
    opt = task.configure_optimizers()['optimizer']
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    x = torch.randn(5, 3)
    lin(x).pow(2).sum().backward()
    gw, gb = lin.weight.grad.clone(), lin.bias.grad.clone()
    opt.step()
    adam = lambda g: lr * g / (g.abs() + eps)  # noqa: E731
    if name == 'adam':
        expected_w = w0 - adam(gw + wd * w0)
    else:
        expected_w = w0 * (1 - lr * wd) - adam(gw)
    torch.testing.assert_close(lin.weight.detach(), expected_w)
    torch.testing.assert_close(lin.bias.detach(), b0 - adam(gb))
    assert task.hparams.optimizer == name


def test_optimizer_option_rejects_unknown_names():
    with pytest.raises(ValueError, match="optimizer must be one of .*got 'sgd'"):
        GraphLevelTask(torch.nn.Linear(2, 2), num_classes=2, optimizer='sgd')


def test_mask_coefficients_are_not_weight_decayed():
    from pyg_grf.lightning.tasks import GraphLevelTask
    from pyg_grf.nn import GraphTransformer
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2,
                             attn_kwargs={'max_length': 3, 'global_beta': 0.1})
    task = GraphLevelTask(model=model, task='multiclass', num_classes=2, weight_decay=0.1)
    task.trainer = type('T', (), {'estimated_stepping_batches': 10, 'max_epochs': 1})()
    opt = task.configure_optimizers()
    opt = opt['optimizer'] if isinstance(opt, dict) else opt[0][0] if isinstance(opt, tuple) \
        else opt
    decayed = {id(p) for g in opt.param_groups if g['weight_decay'] > 0 for p in g['params']}
    for name, p in model.named_parameters():
        if name.endswith('.f') or name.endswith('beta_raw'):
            assert id(p) not in decayed, name
    assert any(id(p) in decayed for n, p in model.named_parameters() if n.endswith('to_qkv.weight'))
