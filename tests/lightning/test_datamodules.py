import warnings

import pytest
import torch

from pyg_grf.lightning.datamodules import (
    EpochSeededRandomSampler,
    LRGBDataModule,
    PlanetoidDataModule,
    SyntheticDataModule,
    TUDataModule,
)


def _grf(num_walks=4):
    from pyg_grf.transforms import AddGraphRandomFeatures
    return AddGraphRandomFeatures(num_walks=num_walks, p_halt=0.5, max_length=2, seed=0)


def test_synthetic_splits_cache_and_loaders(tmp_path):
    kwargs = dict(num_graphs=40, split=(0.5, 0.25, 0.25), dataset_kwargs={'num_nodes': 8,
                                                                         'motif': 'grid'},
                  root=str(tmp_path), batch_size=8)
    dm = SyntheticDataModule(pre_transform=_grf(), **kwargs)
    assert dm.dataset is None  # nothing loaded in __init__
    dm.prepare_data()
    dm.setup('fit')
    assert [len(d) for d in (dm.train_dataset, dm.val_dataset, dm.test_dataset)] == [20, 10, 10]
    assert dm.num_features == 5 and dm.num_classes == 2
    batch = next(iter(dm.train_dataloader()))
    assert batch.num_graphs == 8 and batch.grf_index.max() < batch.num_nodes
    # The same split and the cached features come back.
    dm2 = SyntheticDataModule(pre_transform=_grf(), **kwargs)
    dm2.setup()
    assert torch.equal(dm2.test_dataset._data.grf_load, dm.test_dataset._data.grf_load)
    assert torch.equal(dm2.test_dataset.y, dm.test_dataset.y)
    # Another pre_transform gets its own cache, never the stale one.
    dm3 = SyntheticDataModule(pre_transform=_grf(num_walks=2), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no "pre_transform differs" warning either
        dm3.setup()
    assert dm3.train_dataset._data.grf_load.numel() != dm.train_dataset._data.grf_load.numel()


def test_a_split_of_one_batch_is_loaded_without_workers(tmp_path):
    # a worker (forked every epoch) has nothing to overlap when the split is one batch: the
    # training split (2 batches) keeps the module's worker, validation and test (one each) run
    # in the process; the batches are the same either way
    kwargs = dict(num_graphs=40, split=(0.5, 0.25, 0.25), root=str(tmp_path), batch_size=10,
                  dataset_kwargs={'num_nodes': 8, 'motif': 'grid'}, pre_transform=_grf())
    dm = SyntheticDataModule(num_workers=1, **kwargs)
    dm.setup('fit')
    dm.setup('test')
    assert [dl.num_workers for dl in (dm.train_dataloader(), dm.val_dataloader(),
                                      dm.test_dataloader())] == [1, 0, 0]
    ref = SyntheticDataModule(num_workers=0, **kwargs)
    ref.setup('fit')
    for a, b in zip(dm.train_dataloader(), ref.train_dataloader()):
        assert torch.equal(a.grf_load, b.grf_load) and torch.equal(a.y, b.y)


def test_uncached_walks_are_the_same_on_every_rank():
    # Under DDP only local rank 0 calls prepare_data(); every rank calls setup(). Without a disk
    # cache, both must see the same seeded walks for the same graphs.
    kwargs = dict(num_graphs=12, split=(0.5, 0.25, 0.25), cache=False, batch_size=4,
                  dataset_kwargs={'num_nodes': 8, 'motif': 'grid'})
    rank0 = SyntheticDataModule(pre_transform=_grf(), **kwargs)
    rank0.prepare_data()
    rank0.setup('fit')
    rank1 = SyntheticDataModule(pre_transform=_grf(), **kwargs)
    rank1.setup('fit')
    for a, b in zip(rank0.test_dataset, rank1.test_dataset):
        assert torch.equal(a.grf_index, b.grf_index) and torch.equal(a.grf_load, b.grf_load)


def test_bad_options():
    with pytest.raises(ValueError, match='task must be one of'):
        SyntheticDataModule(task='cliques')
    with pytest.raises(ValueError, match='sum to 1'):
        SyntheticDataModule(split=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match=r'fold must lie in \[0, 10\)'):
        TUDataModule('MUTAG', fold=10)


def test_epoch_seeded_sampler():
    sampler = EpochSeededRandomSampler(range(10), seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(10)) and list(sampler) == first
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    again = EpochSeededRandomSampler(range(10), seed=3)
    again.set_epoch(1)
    assert list(again) == second  # a function of (seed, epoch) only: resumable


def test_lrgb_standin():
    dm = LRGBDataModule('peptides-func', standin=6, batch_size=4)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch.y.shape == (4, 10) and batch.x.dtype == torch.long


@pytest.mark.data
def test_tu_errica_folds(mirror):
    dm = TUDataModule('MUTAG', fold=3, batch_size=16)
    dm.prepare_data()
    dm.setup()
    sizes = [len(d) for d in (dm.train_dataset, dm.val_dataset, dm.test_dataset)]
    assert sum(sizes) == 188 and sizes[2] in (18, 19)
    test_idx = set(dm.test_dataset.indices())
    assert not test_idx & set(dm.train_dataset.indices())


@pytest.mark.data
def test_planetoid(mirror):
    dm = PlanetoidDataModule('Cora')
    dm.prepare_data()
    dm.setup()
    data = next(iter(dm.train_dataloader()))
    assert int(data.train_mask.sum()) == 140 and dm.num_classes == 7


@pytest.mark.data
@pytest.mark.parametrize('walks', ['restrict', 'recompute'])
def test_planetoid_node_parts(mirror, walks, tmp_path):
    # training on 4 random node parts per epoch (each with its GRF loads), validation and test
    # on the full graph: the parts partition Cora's 2708 nodes and its 140 training nodes
    from pyg_grf.transforms import AddGraphRandomFeatures
    pre = AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)
    dm = PlanetoidDataModule('Cora', pre_transform=pre, num_parts=4, part_walks=walks,
                             root=str(tmp_path))
    dm.prepare_data()
    dm.setup()
    parts = list(dm.train_dataloader())
    assert len(parts) == 4 and sum(p.num_nodes for p in parts) == 2708
    assert sorted(torch.cat([p.n_id for p in parts]).tolist()) == list(range(2708))
    assert sum(int(p.train_mask.sum()) for p in parts) == 140
    assert all(int(p.grf_index.max()) < p.num_nodes for p in parts)
    assert next(iter(dm.val_dataloader())).num_nodes == 2708


def test_planetoid_node_parts_bad_input():
    with pytest.raises(ValueError, match="'num_parts' must be an integer >= 1, got 0"):
        PlanetoidDataModule('Cora', num_parts=0)
    with pytest.raises(ValueError, match="walks='recompute' draws the walks of every part"):
        PlanetoidDataModule('Cora', num_parts=2, part_walks='recompute')


def test_split_by_needs_one_value_per_graph():
    # (split_by keeping groups together: tests/experiments/test_image_grids.py, on the digits)
    bad = SyntheticDataModule(task='motifs', num_graphs=20, split_by='source', cache=False)
    with pytest.raises(ValueError, match="split_by='source' needs one 'source' value per graph"):
        bad.setup()
