"""Node-level data with fixed splits and ROC-AUC: HeterophilousDataModule (one split column of
the dataset's ten), NodeLevelTask(metric='auroc') against the pairwise definition of ROC-AUC,
and the node-model configs of experiments/configs/node/."""
import pytest
import torch
from torch_geometric.data import Data

from pyg_grf.lightning import HeterophilousDataModule, NodeLevelTask
from pyg_grf.nn import GRFNodeModel
from tests.conftest import REPO

NODE_CONFIGS = sorted((REPO / 'experiments' / 'configs' / 'node').glob('*.yaml'))


def pairwise_auroc(scores, labels):
    """P(score of a random positive > score of a random negative), ties counting one half."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


class Scores(torch.nn.Module):
    def __init__(self, scores):
        super().__init__()
        self.scores = torch.nn.Parameter(scores)

    def forward(self, data):
        return self.scores.view(-1, 1)


def test_auroc_metric_is_the_pairwise_probability():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, generator=g).round(decimals=1)  # ties included
    y = (torch.rand(40, generator=g) < 0.3).long()
    data = Data(y=y, val_mask=torch.ones(40, dtype=torch.bool), num_nodes=40)
    task = NodeLevelTask(Scores(scores), task='binary', metric='auroc')
    task.shared_step(data, 'val')
    got = float(task.metrics['val_metric'].compute())
    assert got == pytest.approx(pairwise_auroc(scores, y), abs=1e-6)


def test_auroc_is_binary_only():
    with pytest.raises(ValueError, match=r"metric for task='multiclass' must be one of "
                                         r"\('acc', 'macro_f1'\), got 'auroc'"):
        NodeLevelTask(Scores(torch.zeros(3)), task='multiclass', num_classes=3, metric='auroc')


class ToyDataset(list):
    num_features = 4


def toy_dataset():
    g = torch.Generator().manual_seed(0)
    masks = torch.rand(30, 10, generator=g)
    return ToyDataset([Data(x=torch.randn(30, 4, generator=g), y=torch.arange(30) % 2,
                 edge_index=torch.tensor([[0, 1], [1, 0]]), train_mask=masks < 0.5,
                 val_mask=(masks >= 0.5) & (masks < 0.75), test_mask=masks >= 0.75)])


def test_heterophilous_datamodule_selects_one_split(monkeypatch):
    import pyg_grf.datasets
    dataset = toy_dataset()
    monkeypatch.setattr(pyg_grf.datasets, 'load_heterophilous', lambda **kw: dataset,
                        raising=False)
    dm = HeterophilousDataModule('minesweeper', split=3)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    for key in ('train_mask', 'val_mask', 'test_mask'):
        assert torch.equal(batch[key], dataset[0][key][:, 3])
    assert dataset[0].train_mask.dim() == 2  # the dataset's graph is not modified
    assert dm.num_features == 4
    bad = HeterophilousDataModule('minesweeper', split=10)
    with pytest.raises(ValueError, match=r"split must be in \[0, 10\) for minesweeper, got 10"):
        bad.setup()
    with pytest.raises(ValueError, match=r"split must be an integer >= 0 .*got -1"):
        HeterophilousDataModule('minesweeper', split=-1)


@pytest.mark.parametrize('path', NODE_CONFIGS, ids=[p.stem for p in NODE_CONFIGS])
@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_node_configs_build(path):
    from pyg_grf.lightning.cli import GRFLightningCLI
    cli = GRFLightningCLI(args=['--config', str(path)], run=False)
    assert isinstance(cli.model.model, GRFNodeModel)
    assert cli.model.model.attn_type == 'grf'


@pytest.mark.data
def test_minesweeper_from_the_mirror(mirror):
    from pyg_grf.datasets import load_heterophilous
    data = load_heterophilous('Minesweeper')[0]
    assert data.num_nodes == 10_000 and data.x.shape == (10_000, 7)
    assert data.train_mask.shape == (10_000, 10)
    assert data.train_mask.sum(0).tolist() == [5000] * 10
    dm = HeterophilousDataModule('minesweeper', split=2)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert int(batch.train_mask.sum()) == 5000 and int(batch.test_mask.sum()) == 2500
    with pytest.raises(ValueError, match="expected one of"):
        load_heterophilous('chess')
