import json
import os

import numpy as np
import pytest
import torch

from pyg_grf.datasets import InducedCycleDataset, errica_splits, load_tu
from pyg_grf.datasets.splits import default_splits_path


def check_errica(folds, y, num_folds=10, inner_holdout=0.1):
    y = torch.as_tensor(y)
    n, classes = y.numel(), y.unique()
    assert len(folds) == num_folds
    tests = torch.cat([f['test'] for f in folds])
    assert tests.sort().values.tolist() == list(range(n))  # outer test folds partition the set
    for fold in folds:
        train, val, test = (set(fold[k].tolist()) for k in ('train', 'val', 'test'))
        assert not train & val and not train & test and not val & test
        assert len(train | val | test) == n
        assert abs(len(val) - inner_holdout * (n - len(test))) <= 1
        train_val = torch.tensor(sorted(train | val))
        for c in classes:  # stratified: per-class counts within one graph of the class ratio
            share = float((y == c).sum()) / n
            assert abs(int((y[fold['test']] == c).sum()) - share * len(test)) <= 1
            inner_share = float((y[train_val] == c).sum()) / len(train_val)
            assert abs(int((y[fold['val']] == c).sum()) - inner_share * len(val)) <= 1


def test_errica_splits_synthetic(tmp_path):
    y = torch.tensor([0] * 70 + [1] * 25 + [2] * 15)[torch.randperm(110)]
    path = tmp_path / 'splits.json'
    folds = errica_splits(y, path=str(path))
    check_errica(folds, y)
    assert path.exists()
    stored = json.loads(path.read_text())
    assert stored['num_folds'] == 10 and stored['seed'] == 0 and len(stored['folds']) == 10

    # Reloaded identically from disk (and equal when recomputed: deterministic from the seed).
    again = errica_splits(y, path=str(path))
    path.unlink()
    recomputed = errica_splits(y, path=str(path))
    for a, b, c in zip(folds, again, recomputed):
        for k in ('train', 'val', 'test'):
            assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k])
            assert a[k].dtype == torch.long
    other = errica_splits(y, seed=1, path=str(tmp_path / 'seed1.json'))
    assert not all(torch.equal(a['test'], b['test']) for a, b in zip(folds, other))


def test_errica_splits_default_path(tmp_path, monkeypatch):
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path))
    dataset = InducedCycleDataset(num_graphs=60, seed=2)
    folds = errica_splits(dataset, num_folds=5, seed=3)
    check_errica(folds, dataset.y, num_folds=5)
    path = default_splits_path('induced-cycle', 5, 0.1, 3)
    assert path.startswith(str(tmp_path)) and 'induced-cycle' in path and 'seed3' in path
    assert (tmp_path / 'splits').is_dir()


def test_errica_splits_bad_input(tmp_path):
    y = torch.tensor([0, 1] * 20)
    path = str(tmp_path / 's.json')
    errica_splits(y, path=path)
    with pytest.raises(ValueError, match='do not match this dataset'):
        errica_splits(torch.tensor([1, 0] * 20), path=path)
    with pytest.raises(ValueError, match='do not match'):
        errica_splits(y, num_folds=5, path=path)
    with pytest.raises(ValueError, match="'num_folds' to be an integer >= 2"):
        errica_splits(y, num_folds=1, path=path)
    with pytest.raises(ValueError, match="'inner_holdout' in"):
        errica_splits(y, inner_holdout=1.5, path=path)
    with pytest.raises(ValueError, match='one integer class label per graph'):
        errica_splits(torch.rand(40), path=path)
    with pytest.raises(ValueError, match="Pass 'path' or 'name'"):
        errica_splits(y)


@pytest.mark.data
def test_errica_splits_mutag(offline_mirror, tmp_path):
    dataset = load_tu('MUTAG')
    folds = errica_splits(dataset)
    check_errica(folds, dataset.y)
    files = list((tmp_path / 'data' / 'splits').glob('MUTAG_*seed0.json'))
    assert len(files) == 1
    again = errica_splits(load_tu('MUTAG'))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(folds, again) for k in a)
    assert sum(len(f['test']) for f in folds) == 188
    assert np.allclose([len(f['test']) for f in folds], 18.8, atol=1)


def test_edited_split_file_is_refused(tmp_path):
    from pyg_grf.datasets.splits import errica_splits
    y = torch.arange(40) % 2
    path = str(tmp_path / 'splits.json')
    folds = errica_splits(y, num_folds=4, path=path)
    stored = json.load(open(path))
    # Move a test graph of fold 0 into its training set too (a leak).
    leak = stored['folds'][0]['test'][0]
    stored['folds'][0]['train'] = sorted(stored['folds'][0]['train'] + [leak])
    json.dump(stored, open(path, 'w'))
    with pytest.raises(ValueError, match=rf"Fold 0 .* graph {leak} appears more than once .*"
                                         rf"disjoint"):
        errica_splits(y, num_folds=4, path=path)
    # A consistent-looking edit (swap a train and a test graph) is caught by the folds' hash.
    stored['folds'][0]['train'].remove(leak)
    t0, tr0 = stored['folds'][0]['test'][0], stored['folds'][0]['train'][0]
    stored['folds'][0]['test'][0], stored['folds'][0]['train'][0] = tr0, t0
    json.dump(stored, open(path, 'w'))
    with pytest.raises(ValueError, match='Graph .* test set of|do not match their stored SHA'):
        errica_splits(y, num_folds=4, path=path)
    os.remove(path)
    assert all(torch.equal(a['test'], b['test'])
               for a, b in zip(folds, errica_splits(y, num_folds=4, path=path)))
