r"""experiments/image_grids.py: the digits dataset against scikit-learn's own statistics, and
its DataModule's split by source digit."""
import numpy as np
import pytest
import torch

from pyg_grf.datasets import grid_edge_index
from tests.experiments import experiment_module

image_grids = experiment_module('image_grids')
DigitsGridDataset = image_grids.DigitsGridDataset


def test_digits_grid_dataset_statistics():
    sklearn = pytest.importorskip('sklearn.datasets')
    target = sklearn.load_digits().target
    ds = DigitsGridDataset(seed=0)
    assert len(ds) == 1797 and ds.num_classes == 10 and ds.num_features == 16 + 16
    y = torch.cat([d.y for d in ds])
    assert torch.equal(y, torch.from_numpy(target.astype(np.int64)))
    d = ds[5]
    assert torch.equal(d.edge_index, grid_edge_index(4, 4))
    assert torch.equal(d.x[:, 16:], torch.eye(16))  # one-hot positions
    # the digit's ink stays on the canvas: without noise, total ink is the source's times
    # about s^2 for a scale s in [1, 2] (bilinear resampling)
    clean = DigitsGridDataset(seed=0, noise=0.0)
    ink = clean.x[:, :16].reshape(len(ds), -1).sum(1)
    src = torch.from_numpy(sklearn.load_digits().images.reshape(1797, -1).sum(1) / 16.0)
    ratio = ink / src.float()
    assert 0.85 < float(ratio.min()) and float(ratio.max()) < 4.6
    # the same placements plus Gaussian noise of std 0.1 (tolerance: 5 standard errors of the
    # sample std, sqrt(1 / (2 n)) relative)
    noise = (ds.x[:, :16] - clean.x[:, :16]).reshape(-1)
    assert abs(float(noise.std()) - 0.1) < 5 * 0.1 / (2 * noise.numel()) ** 0.5
    # deterministic in the seed, different across seeds
    assert torch.equal(DigitsGridDataset(seed=0).x, ds.x)
    assert not torch.equal(DigitsGridDataset(seed=1).x, ds.x)
    assert len(DigitsGridDataset(num_graphs=100)) == 100


def test_digits_grid_dataset_errors():
    with pytest.raises(ValueError, match="divisible by 'patch'"):
        DigitsGridDataset(canvas=16, patch=5)
    with pytest.raises(ValueError, match=r"8 \* high <= canvas \(16\)"):
        DigitsGridDataset(scale=(1.0, 3.0))
    with pytest.raises(ValueError, match="'num_graphs' must lie in"):
        DigitsGridDataset(num_graphs=5000)


def test_digits_grid_split_by_source_keeps_copies_together():
    pytest.importorskip('sklearn')
    dm = image_grids.DigitsGridDataModule(num_graphs=600, split=(0.6, 0.2, 0.2),
                                          dataset_kwargs={'copies': 3}, split_by='source',
                                          cache=False)
    dm.setup()
    parts = [torch.cat([d.source for d in ds]) for ds in
             (dm.train_dataset, dm.val_dataset, dm.test_dataset)]
    assert sum(p.numel() for p in parts) == 600
    sets = [set(p.tolist()) for p in parts]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert [len(s) for s in sets] == [120, 40, 40]  # 200 source digits, 3 copies each
    assert all(p.numel() == 3 * len(s) for p, s in zip(parts, sets))
    # without split_by the copies of a digit are scattered over the splits
    dm2 = image_grids.DigitsGridDataModule(num_graphs=600, split=(0.6, 0.2, 0.2),
                                           dataset_kwargs={'copies': 3}, cache=False)
    dm2.setup()
    s2 = [set(torch.cat([d.source for d in ds]).tolist()) for ds in
          (dm2.train_dataset, dm2.test_dataset)]
    assert s2[0] & s2[1]
    # the DataModule serves the digits only
    with pytest.raises(ValueError, match=r"task must be one of \['digits_grid'\], got 'motifs'"):
        image_grids.DigitsGridDataModule(task='motifs')
