import math

import lightning.pytorch as pl
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.lightning.tasks import GraphLevelTask, NodeLevelTask
from pyg_grf.nn.models.graph_transformer import GraphTransformer


def _batch(y):
    graphs = []
    for i, n in enumerate((4, 6, 3)):
        edge_index = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
        graphs.append(Data(x=torch.randn(n, 3), edge_index=edge_index, y=y[i:i + 1]))
    return Batch.from_data_list(graphs)


MODEL = dict(in_channels=3, hidden_channels=8, num_layers=1, attn_type='linear')


@pytest.mark.parametrize('task,out,y,metric', [
    ('binary', 1, torch.tensor([0., 1., 1.]), 'acc'),
    ('multiclass', 3, torch.tensor([0, 2, 1]), 'acc'),
    ('multilabel', 2, torch.tensor([[0., 1.], [float('nan'), 0.], [1., 1.]]), 'ap'),
    ('regression', 1, torch.tensor([0.5, -1., 2.]), 'mae'),
])
def test_graph_level_steps(task, out, y, metric):
    module = GraphLevelTask(dict(MODEL, out_channels=out), task=task, num_classes=3,
                            num_labels=2)
    assert isinstance(module.model, GraphTransformer)
    assert module.hparams.task == task and module.hparams.model['out_channels'] == out
    batch = _batch(y)
    logged = {}
    module.log = lambda name, value, **kw: logged.setdefault(name, (value, kw))
    loss = module.training_step(batch, 0)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    module.validation_step(batch, 0)
    assert logged['val/loss'][1]['batch_size'] == 3
    assert logged['val/loss'][1]['sync_dist'] is True
    assert f'val/{metric}' in logged
    value = module.metrics['val_metric'].compute()
    assert torch.isfinite(value)


def test_model_object_and_errors():
    model = GraphTransformer(out_channels=2, **MODEL)
    module = GraphLevelTask(model, task='multiclass', num_classes=2)
    assert module.model is model and 'model' not in module.hparams
    with pytest.raises(ValueError, match='num_classes'):
        GraphLevelTask(model, task='multiclass')
    with pytest.raises(ValueError, match="task must be one of"):
        GraphLevelTask(model, task='ranking')
    module = GraphLevelTask(model, task='multiclass', num_classes=3)
    with pytest.raises(ValueError, match=r'num_classes=3.*\(3, 2\)'):
        module.training_step(_batch(torch.tensor([0, 1, 1])), 0)


def _closed_form_lr(step, peak, warmup, total, min_ratio):
    if step < warmup:
        return peak * (step + 1) / (warmup + 1)
    if step <= total:
        cos = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
        return peak * (min_ratio + (1 - min_ratio) * cos)
    return peak * min_ratio


@pytest.mark.parametrize('warmup_epochs,max_epochs,min_lr_ratio', [
    (2, None, 0.1),   # 10 warm-up steps, cosine over the 40 others
    (0, None, 0.0),   # no warm-up
    (1, 6, 0.2),      # a cosine horizon of 30 steps in a 50-step run: then held at 0.2
])
def test_warmup_cosine_schedule(warmup_epochs, max_epochs, min_lr_ratio):
    module = GraphLevelTask(dict(MODEL, out_channels=2), num_classes=2, lr=0.5,
                            warmup_epochs=warmup_epochs, max_epochs=max_epochs,
                            min_lr_ratio=min_lr_ratio)

    class _Trainer:  # 10 epochs of 5 steps
        estimated_stepping_batches = 50
        max_epochs = 10

    module._trainer = _Trainer()
    config = module.configure_optimizers()
    opt, sched = config['optimizer'], config['lr_scheduler']['scheduler']
    assert config['lr_scheduler']['interval'] == 'step'
    assert isinstance(sched, torch.optim.lr_scheduler.SequentialLR)
    lrs = []
    for _ in range(50):
        lrs.append([group['lr'] for group in opt.param_groups])
        opt.step()
        sched.step()
    warmup, total = 5 * warmup_epochs, 5 * (max_epochs or 10)
    for step, got in enumerate(lrs):
        expected = _closed_form_lr(step, 0.5, warmup, total, min_lr_ratio)
        assert got == pytest.approx([expected] * 2, abs=1e-9), step
    assert max(lr for lr, _ in lrs) == pytest.approx(0.5)
    # No weight decay on biases / norms.
    assert opt.param_groups[1]['weight_decay'] == 0.0


def test_warmup_cosine_schedule_bad_input():
    from pyg_grf.lightning.schedule import warmup_cosine_schedule
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r'0 <= warmup_steps <= total_steps.*got '
                                         r'total_steps=10, warmup_steps=11'):
        warmup_cosine_schedule(opt, 11, 10)
    with pytest.raises(ValueError, match=r'got total_steps=10, warmup_steps=2, min_lr_ratio=1.5'):
        warmup_cosine_schedule(opt, 2, 10, 1.5)
    two = torch.optim.SGD([{'params': [torch.nn.Parameter(torch.zeros(1))], 'lr': 1.0},
                           {'params': [torch.nn.Parameter(torch.zeros(1))], 'lr': 0.1}])
    with pytest.raises(ValueError, match=r'one learning rate for all parameter groups, '
                                         r'got \[0.1, 1.0\]'):
        warmup_cosine_schedule(two, 2, 10)


def test_node_level_task(tmp_path):
    n = 12
    edge_index = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    data = Data(x=torch.randn(n, 3), edge_index=torch.cat([edge_index, edge_index.flip(0)], 1),
                y=torch.arange(n) % 2, train_mask=torch.arange(n) < 6,
                val_mask=(torch.arange(n) >= 6) & (torch.arange(n) < 9),
                test_mask=torch.arange(n) >= 9)
    module = NodeLevelTask(dict(MODEL, out_channels=2, pooling=None), task='multiclass',
                           num_classes=2)
    from torch_geometric.loader import DataLoader
    loader = DataLoader([data], batch_size=1)
    trainer = pl.Trainer(max_epochs=2, accelerator='cpu', default_root_dir=tmp_path,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, loader, loader)
    metrics = trainer.test(module, loader, verbose=False)[0]
    assert 0.0 <= metrics['test/acc'] <= 1.0 and 'test/loss' in metrics


def test_macro_f1_metric_equals_sklearn_over_node_batches():
    # The superpixel LRGB metric: macro F1 over classes, accumulated over batches of nodes,
    # against sklearn on the concatenated predictions.
    sk = pytest.importorskip('sklearn.metrics')
    from pyg_grf.lightning.tasks import GraphLevelTask
    task = GraphLevelTask(torch.nn.Identity(), task='multiclass', num_classes=5,
                          metric='macro_f1')
    assert task.metric_name == 'macro_f1'
    gen = torch.Generator().manual_seed(0)
    outs, ys = [], []
    for n in (30, 17, 41):
        out, y = torch.randn(n, 5, generator=gen), torch.randint(0, 5, (n,), generator=gen)
        out[y == 2, 2] += 1.5  # some signal, so that F1 differs across classes
        task._update_metric('val', *task._prepare(out, y))
        outs.append(out)
        ys.append(y)
    got = float(task.metrics['val_metric'].compute())
    pred = torch.cat(outs).argmax(-1).numpy()
    expected = sk.f1_score(torch.cat(ys).numpy(), pred, average='macro')
    assert got == pytest.approx(expected, abs=1e-6)


def test_mse_metric_over_node_batches_equals_the_pooled_mean_square():
    # node-level regression on mini-batches (point clouds): the epoch's MSE is the mean of the
    # squared errors over every target entry of every batch, not a mean of batch means
    from pyg_grf.lightning.tasks import GraphLevelTask
    task = GraphLevelTask(torch.nn.Identity(), task='regression', metric='mse', loss='mse')
    gen = torch.Generator().manual_seed(1)
    sq = []
    for n in (5, 40):
        out, y = torch.randn(n, 3, generator=gen), torch.randn(n, 3, generator=gen)
        task._update_metric('test', *task._prepare(out, y))
        sq.append((out - y).pow(2).view(-1))
    assert float(task.metrics['test_metric'].compute()) == pytest.approx(
        float(torch.cat(sq).mean()), rel=1e-6)


def test_metric_must_fit_the_task():
    from pyg_grf.lightning.tasks import GraphLevelTask
    with pytest.raises(ValueError,
                       match=r"metric for task='regression' must be one of \('mae', 'mse'\)"):
        GraphLevelTask(torch.nn.Identity(), task='regression', metric='macro_f1')
    with pytest.raises(ValueError, match="must be one of"):
        GraphLevelTask(torch.nn.Identity(), task='multilabel', num_labels=3, metric='acc')


def test_binary_with_two_class_logits_is_their_softmax_cross_entropy():
    # two logits per example, as Platonov et al. and Luo et al. train binary node tasks: the
    # loss is the two-class cross-entropy, the AUROC that of the softmax's second column
    torch.manual_seed(0)
    out = torch.randn(40, 2, requires_grad=True)
    y = torch.randint(0, 2, (40,))
    y[:2] = torch.tensor([0, 1])
    module = GraphLevelTask(dict(MODEL, out_channels=2), task='binary', metric='auroc')
    z, target = module._prepare(out, y)
    loss = module._loss(z, target)
    ref = torch.nn.functional.cross_entropy(out, y)
    torch.testing.assert_close(loss, ref)
    grad, = torch.autograd.grad(loss, out)
    ref_grad, = torch.autograd.grad(ref, out)
    torch.testing.assert_close(grad, ref_grad)
    module._update_metric('val', z.detach(), target)
    p1 = torch.softmax(out.detach(), 1)[:, 1]
    pos, neg = p1[y == 1], p1[y == 0]  # AUROC: the share of (positive, negative) pairs ranked
    ref_auroc = ((pos[:, None] > neg[None]).float().mean()
                 + 0.5 * (pos[:, None] == neg[None]).float().mean())
    torch.testing.assert_close(module.metrics['val_metric'].compute(), ref_auroc)
    with pytest.raises(ValueError, match=r'out_channels=1\) or two class logits '
                                         r'\(out_channels=2\), got outputs \(40, 3\)'):
        module._prepare(torch.randn(40, 3), y)
