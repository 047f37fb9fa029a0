import os.path as osp
import pickle
import time

import numpy as np
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


def test_lrgb_classes_are_pyg_lrgb_datasets():
    # Peptides-func's own class is PyG's LRGBDataset with other raw files, download and process
    from torch_geometric.datasets import LRGBDataset as PyGLRGBDataset

    import pyg_grf.datasets as datasets
    from pyg_grf.datasets.lrgb import LRGBDataset
    assert issubclass(PeptidesFunctional, LRGBDataset) and issubclass(LRGBDataset, PyGLRGBDataset)
    for name in ('raw_file_names', 'download_from_source', 'process'):
        assert name in vars(PeptidesFunctional)
    assert 'processed_file_names' not in vars(PeptidesFunctional)
    assert datasets.PeptidesFunctional is PeptidesFunctional


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
    with pytest.raises(DatasetNotFoundError, match=r"peptides-func.*peptide_multi_class"
                                                   r".*PYG_GRF_MIRROR"):
        PeptidesFunctional()


@pytest.mark.data
def test_other_lrgb_not_in_mirror(offline_mirror):
    with pytest.raises(DatasetNotFoundError, match=r"peptides-struct.*Only Peptides-func"):
        load_lrgb('peptides-struct')


@pytest.mark.data
@pytest.mark.slow
def test_peptides_functional(offline_mirror, tmp_path):
    start = time.perf_counter()
    train = load_lrgb('Peptides-func', split='train')
    elapsed = time.perf_counter() - start
    val, test = PeptidesFunctional(split='val'), PeptidesFunctional(split='test')
    assert (len(train), len(val), len(test)) == (10873, 2331, 2331)
    folder = tmp_path / 'data' / 'LRGB' / 'peptides-func'  # PyG's LRGBDataset layout
    assert {'train.pt', 'val.pt', 'test.pt'} <= {p.name for p in folder.glob('processed_*/*')}
    assert (folder / 'raw' / 'peptide_multi_class_dataset.csv.gz').exists()
    assert (folder / 'raw' / 'splits_random_stratified_peptide.pickle').exists()

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
        ds.name, ds.max_graphs = 'peptides-func', None
        return ds.processed_dir

    plain = folder(None)
    assert osp.dirname(plain) == str(tmp_path / 'peptides-func')
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


SMILES = ['CCO', 'c1ccccc1O', 'CC(=O)N[C@@H](C)C(=O)O', 'C1CC1N', 'O=C=O',
          'CN1C=NC2=C1C(=O)N(C)C(=O)N2C', 'CC(C)C[C@H](N)C(=O)O', 'c1ccncc1', 'C#N', 'OCC(O)CO',
          'CCCCCCCC', 'N[C@@H](Cc1ccccc1)C(=O)O']


def _graph_tuples_equal(a, b):
    return len(a) == len(b) and all(
        all(np.array_equal(u, v) for u, v in zip(ga, gb)) for ga, gb in zip(a, b))


def test_smiles_to_graphs_parallel_equals_serial(capsys):
    pytest.importorskip('rdkit')
    from ogb.utils import smiles2graph

    from pyg_grf.datasets.lrgb import smiles_to_graphs
    smiles = SMILES * 5  # 60 molecules: several chunks per worker
    serial = smiles_to_graphs(smiles, num_proc=1, progress=False)
    parallel = smiles_to_graphs(smiles, num_proc=2, progress=False)
    assert _graph_tuples_equal(serial, parallel)  # same graphs, same order
    ref = [smiles2graph(s) for s in smiles]  # independent: OGB directly, one by one
    assert _graph_tuples_equal(serial, [(g['node_feat'], g['edge_index'], g['edge_feat'],
                                         g['num_nodes']) for g in ref])
    # The progress bar (tqdm, a dependency of PyG) on stderr, and nothing without progress.
    capsys.readouterr()
    smiles_to_graphs(SMILES, num_proc=2, desc='mols')
    err = capsys.readouterr().err
    assert 'mols: 100%' in err and '12/12' in err
    smiles_to_graphs(SMILES, num_proc=1, progress=False)
    assert capsys.readouterr().err == ''
    with pytest.raises(ValueError, match='num_proc must be >= 1, got 0'):
        smiles_to_graphs(SMILES, num_proc=0)


def _fake_peptides(root, num_rows=30):
    # A small CSV + split pickle as the LRGB release has them (md5 sums patched in by the test).
    import gzip

    import pandas as pd
    folder = root / 'peptides-func'
    (folder / 'raw').mkdir(parents=True)
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'smiles': [SMILES[i % len(SMILES)] for i in range(num_rows)],
                       'peptide_seq': ['X'] * num_rows,
                       'labels': [str(rng.integers(0, 2, 10).tolist()) for _ in range(num_rows)],
                       'identifier': range(num_rows)})
    with gzip.open(folder / 'raw' / PeptidesFunctional.csv_name, 'wt') as f:
        df.to_csv(f)
    perm = rng.permutation(num_rows)
    split = {'train': perm[:18], 'val': perm[18:24], 'test': perm[24:]}
    with open(folder / 'raw' / PeptidesFunctional.split_name, 'wb') as f:
        pickle.dump(split, f)
    return df, split


def test_peptides_max_graphs_before_processing(monkeypatch, tmp_path):
    pytest.importorskip('rdkit')
    from ogb.utils import smiles2graph

    import pyg_grf.datasets.lrgb as lrgb_dataset
    from pyg_grf.datasets.mirror import file_digest
    df, split = _fake_peptides(tmp_path)
    raw = tmp_path / 'peptides-func' / 'raw'
    md5 = {name: file_digest(str(raw / name), 'md5')
           for name in (PeptidesFunctional.csv_name, PeptidesFunctional.split_name)}
    monkeypatch.setattr(PeptidesFunctional, 'md5', md5)
    converted = []
    real = lrgb_dataset.smiles_to_graphs
    monkeypatch.setattr(lrgb_dataset, 'smiles_to_graphs',
                        lambda smiles, *a, **kw: converted.append(len(smiles)) or
                        real(smiles, *a, **kw))

    small = {s: PeptidesFunctional(str(tmp_path), split=s, max_graphs=4, num_proc=2,
                                   progress=False) for s in ('train', 'val', 'test')}
    assert converted == [12]  # only the first 4 molecules of each split, once
    for s, dataset in small.items():
        assert len(dataset) == 4
        for data, row in zip(dataset, split[s][:4]):
            g = smiles2graph(df['smiles'][row])
            assert torch.equal(data.x, torch.from_numpy(g['node_feat']))
            assert torch.equal(data.edge_index, torch.from_numpy(g['edge_index']))
            assert torch.equal(data.y, torch.tensor([eval(df['labels'][row])]).float())
    full = PeptidesFunctional(str(tmp_path), split='val', num_proc=1, progress=False)
    assert converted == [12, 30] and len(full) == 6  # its own cache
    assert small['val'].processed_dir != full.processed_dir
    for a, b in zip(small['val'], full):  # the same graphs either way
        assert torch.equal(a.x, b.x) and torch.equal(a.edge_attr, b.edge_attr)
    PeptidesFunctional(str(tmp_path), split='test', max_graphs=4)
    assert converted == [12, 30]  # cached
    with pytest.raises(ValueError, match=r"max_graphs >= 1 or None \(got 0\)"):
        PeptidesFunctional(str(tmp_path), max_graphs=0)
    with pytest.raises(ValueError, match=r"num_proc >= 1 or None \(got 0\)"):
        PeptidesFunctional(str(tmp_path), num_proc=0)


@pytest.mark.data
def test_peptides_max_graphs_on_mirror(offline_mirror):
    import pandas as pd
    from ogb.utils import smiles2graph
    dataset = load_lrgb('Peptides-func', split='test', max_graphs=25, num_proc=2)
    assert len(dataset) == 25
    raw = osp.join(offline_mirror, 'LRGB', 'peptides-functional')
    df = pd.read_csv(osp.join(raw, 'raw', PeptidesFunctional.csv_name))
    with open(osp.join(raw, PeptidesFunctional.split_name), 'rb') as f:
        rows = pickle.load(f)['test'][:25]
    for data, row in zip(dataset, rows):
        g = smiles2graph(df['smiles'][row])
        assert torch.equal(data.edge_index, torch.from_numpy(g['edge_index']))
        assert torch.equal(data.x, torch.from_numpy(g['node_feat']))
