import os.path as osp
import time

import pytest
import torch
from torch_geometric.loader import DataLoader

from pyg_grf.datasets import (
    LRGB_INFO,
    DatasetNotFoundError,
    PeptidesFunctional,
    load_lrgb,
    lrgb_standin,
)


def test_lrgb_info():
    assert set(LRGB_INFO) == {'Peptides-func', 'Peptides-struct', 'PascalVOC-SP', 'COCO-SP',
                              'PCQM-Contact'}
    metrics = {name: (info.metric, info.maximize) for name, info in LRGB_INFO.items()}
    assert metrics == {
        'Peptides-func': ('ap', True),
        'Peptides-struct': ('mae', False),
        'PascalVOC-SP': ('macro_f1', True),
        'COCO-SP': ('macro_f1', True),
        'PCQM-Contact': ('mrr', True),
    }
    assert LRGB_INFO['Peptides-func'].num_outputs == 10
    assert LRGB_INFO['Peptides-struct'].num_outputs == 11
    assert LRGB_INFO['PascalVOC-SP'].level == 'node'
    assert LRGB_INFO['PCQM-Contact'].target == 'edge_label'


@pytest.mark.parametrize('name', list(LRGB_INFO))
def test_standin_fields(name):
    info = LRGB_INFO[name]
    dataset = lrgb_standin(name.upper(), num_graphs=6, seed=1)
    assert len(dataset) == 6 and dataset.info is info
    assert all(torch.equal(a.x, b.x) for a, b in zip(dataset, lrgb_standin(name, 6, seed=1)))
    for data in dataset:
        N, E = data.num_nodes, data.num_edges
        assert data.x.shape == (N, info.num_node_features)
        assert data.x.dtype == info.node_feature_dtype
        assert data.edge_attr.shape == (E, info.num_edge_features)
        assert data.edge_attr.dtype == info.edge_feature_dtype
        assert data.edge_index.dtype == torch.long and int(data.edge_index.max()) < N
        if info.level == 'graph':
            assert data.y.shape == (1, info.num_outputs) and data.y.dtype == torch.float
        elif info.level == 'node':
            assert data.y.shape == (N, ) and data.y.dtype == torch.long
            assert int(data.y.max()) < info.num_outputs
        else:
            assert data.edge_label_index.shape[0] == 2 and data.edge_label.dtype == torch.long
            assert data.edge_label.numel() == data.edge_label_index.size(1)
    batch = next(iter(DataLoader(dataset, batch_size=3)))
    if info.level == 'graph':
        assert batch.y.shape == (3, info.num_outputs)


def test_lrgb_bad_input(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="Unknown LRGB dataset 'ZINC'; expected one of"):
        load_lrgb('ZINC')
    with pytest.raises(ValueError, match="Unknown LRGB dataset"):
        lrgb_standin('peptides')
    with pytest.raises(ValueError, match="split to be one of"):
        load_lrgb('Peptides-func', split='valid')
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match=r"Peptides-func.*peptide_multi_class"
                                                   r".*PYG_GRF_MIRROR"):
        PeptidesFunctional()


@pytest.mark.data
def test_other_lrgb_not_in_mirror(offline_mirror):
    with pytest.raises(DatasetNotFoundError, match=r"Peptides-struct.*Only Peptides-func"):
        load_lrgb('peptides-struct')


@pytest.mark.data
@pytest.mark.slow
def test_peptides_functional(offline_mirror, tmp_path):
    start = time.perf_counter()
    train = load_lrgb('Peptides-func', split='train')
    elapsed = time.perf_counter() - start
    val, test = PeptidesFunctional(split='val'), PeptidesFunctional(split='test')
    assert (len(train), len(val), len(test)) == (10873, 2331, 2331)
    folder = tmp_path / 'data' / 'LRGB' / 'peptides-functional'
    assert {'train.pt', 'val.pt', 'test.pt'} <= {p.name for p in folder.glob('processed_*/*')}
    assert (folder / 'raw' / 'peptide_multi_class_dataset.csv.gz').exists()
    assert (folder / 'splits_random_stratified_peptide.pickle').exists()

    for dataset in (train, val, test):
        data = dataset._data
        assert data.x.dtype == torch.long and data.x.size(1) == 9
        assert data.edge_attr.dtype == torch.long and data.edge_attr.size(1) == 3
        assert data.y.dtype == torch.float and data.y.size(1) == 10
        assert set(data.y.unique().tolist()) <= {0.0, 1.0}
    sample = train[0]
    assert sample.y.shape == (1, 10)
    assert sample.edge_index.size(1) == sample.edge_attr.size(0)

    num_nodes = sum(d._data.x.size(0) for d in (train, val, test))
    num_edges = sum(d._data.edge_index.size(1) for d in (train, val, test))  # both directions
    assert abs(num_nodes / 15535 - 150.94) < 0.01 and abs(num_edges / 15535 - 307.30) < 0.01
    print(f'Peptides-func processed in {elapsed:.1f}s')


def test_peptides_cache_per_pre_transform(tmp_path):
    # The processed folder is keyed by the pre_transform's repr: different feature settings get
    # different caches (no silent reuse of stale features, no clobbering between runs).
    from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures

    def folder(pre_transform):
        ds = PeptidesFunctional.__new__(PeptidesFunctional)
        ds.root, ds.pre_transform, ds.pre_filter = str(tmp_path), pre_transform, None
        return ds.processed_dir

    plain = folder(None)
    assert osp.dirname(plain) == str(tmp_path / 'peptides-functional')
    assert osp.basename(plain).startswith('processed_')
    grf4 = folder(AddGraphRandomFeatures(num_walks=4, seed=0))
    names = {plain, grf4, folder(AddGraphRandomFeatures(num_walks=8, seed=0)),
             folder(AddRWGNKFeatures(4, 0.5, 1.0, 3))}
    assert len(names) == 4
    assert folder(AddGraphRandomFeatures(num_walks=4, seed=0)) == grf4  # deterministic


@pytest.mark.parametrize('name', ['Peptides-struct', 'PascalVOC-SP', 'COCO-SP', 'PCQM-Contact'])
def test_raw_standin_files_load_through_pyg(name, monkeypatch, tmp_path):
    # Stand-in files in PyG's raw format (what a user places under $PYG_GRF_DATA): load_lrgb runs
    # PyG's own processing on them, offline, and gives back exactly the stand-in graphs (COCO-SP:
    # PyG's label remapping undoes the original category ids written to the raw files).
    from pyg_grf.datasets.lrgb import standin_graphs, write_lrgb_raw_standin
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path))
    info = LRGB_INFO[name]
    paths = write_lrgb_raw_standin(name, num_graphs=5, seed=3)
    ext = 'pickle' if name.endswith('-SP') else 'pt'
    assert paths == [str(tmp_path / 'LRGB' / info.pyg_name / 'raw' / f'{s}.{ext}')
                     for s in ('train', 'val', 'test')]
    for i, split in enumerate(('train', 'val', 'test')):
        dataset = load_lrgb(name, split)
        expected = standin_graphs(name, 5, seed=3 + i)
        assert len(dataset) == 5
        for got, want in zip(dataset, expected):
            assert set(got.keys()) == set(want.keys())
            for key in want.keys():
                assert torch.equal(got[key], want[key]), (split, key)
    if name == 'PCQM-Contact':
        data = expected[0]
        pos = data.edge_label_index[:, data.edge_label == 1]
        assert pos.size(1) > 0 and torch.equal(pos.flip(0).unique(dim=1), pos.unique(dim=1))
    with pytest.raises(FileExistsError, match='Refusing to overwrite the raw files'):
        write_lrgb_raw_standin(name, num_graphs=5)
    write_lrgb_raw_standin(name, num_graphs=2, overwrite=True)
