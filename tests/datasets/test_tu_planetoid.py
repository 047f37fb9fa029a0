import pytest
import torch

from pyg_grf.datasets import load_planetoid, load_tu
from tests.datasets.conftest import toy_mirror


@pytest.mark.data
def test_mutag(offline_mirror, tmp_path):
    dataset = load_tu('MUTAG')
    assert len(dataset) == 188
    assert dataset.num_node_features == 7 and dataset.num_edge_features == 4
    assert dataset.y.bincount().tolist() == [63, 125]
    assert dataset.transform is None  # MUTAG has node features: no degree features added
    assert (tmp_path / 'data' / 'TUDataset' / 'MUTAG' / 'raw' / 'MUTAG_A.txt').exists()
    mutag = tmp_path / 'data' / 'TUDataset' / 'MUTAG'
    assert len(list(mutag.glob('processed_*/MANIFEST.json'))) == 1
    # Second load uses the processed cache (and the name is case-insensitive).
    assert len(load_tu('mutag')) == 188


@pytest.mark.data
def test_proteins(offline_mirror):
    dataset = load_tu('PROTEINS')
    assert len(dataset) == 1113
    assert dataset.num_classes == 2


@pytest.mark.data
def test_imdb_binary_degree_features(offline_mirror):
    dataset = load_tu('IMDB-BINARY')
    assert len(dataset) == 1000 and dataset._data.x is None
    max_deg = max(int(torch.bincount(d.edge_index[0]).max()) for d in dataset)
    data = dataset[0]
    assert data.x.shape == (data.num_nodes, max_deg + 1)
    deg = torch.bincount(data.edge_index[0], minlength=data.num_nodes)
    assert torch.equal(data.x.argmax(1), deg) and torch.equal(data.x.sum(1), torch.ones(20))
    # A user transform runs after the degree features.
    seen = []
    with_transform = load_tu('IMDB-BINARY', transform=lambda d: seen.append(d.x.size(1)) or d)
    with_transform[0]
    assert seen == [max_deg + 1]
    assert load_tu('IMDB-BINARY', use_degree_features=False)[0].x is None


@pytest.mark.data
def test_cora(offline_mirror):
    dataset = load_planetoid('Cora')
    data = dataset[0]
    assert (data.num_nodes, data.num_edges, dataset.num_features, dataset.num_classes) == \
        (2708, 10556, 1433, 7)
    assert [int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)] == \
        [140, 500, 1000]


@pytest.mark.data
def test_pubmed_from_mirror(offline_mirror):
    data = load_planetoid('PubMed')[0]
    assert (data.num_nodes, data.num_edges) == (19717, 88648)


def test_unknown_planetoid():
    with pytest.raises(ValueError, match="Unknown Planetoid dataset 'Corra'; expected one of"):
        load_planetoid('Corra')


class _Evil:
    r"""A pickle payload that runs a shell command when unpickled."""
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return (os.system, (f'touch {self.marker}',))


@pytest.mark.data
def test_replaced_tu_cache_runs_no_code(offline_mirror, tmp_path):
    # PyG's TUDataset loader falls back to a full unpickle; a replaced
    # processed file (with a regenerated manifest) must be refused without running anything
    import json
    import pickle

    from pyg_grf.datasets.cache import MANIFEST, DatasetCacheError, write_manifest
    load_tu('MUTAG')
    # The cache folder (not its processed_<hash>.lock beside it)
    folder = next(p for p in (tmp_path / 'data' / 'TUDataset' / 'MUTAG').glob('processed_*')
                  if p.is_dir())
    marker = tmp_path / 'pwned'
    with open(folder / 'data.pt', 'wb') as f:
        pickle.dump(_Evil(marker), f)
    info = json.loads((folder / MANIFEST).read_text())
    info.pop('files'), info.pop('version')
    write_manifest(str(folder), info)  # the attacker rewrote the checksums too
    with pytest.raises(DatasetCacheError, match="refused, nothing of it was run"):
        load_tu('MUTAG')
    assert not marker.exists()


@pytest.mark.parametrize('name', ['../../escape_pyg', '../TOY', '/tmp/x', 'A/B', '..', ''])
def test_tu_name_cannot_leave_the_data_root(tmp_path, monkeypatch, name):
    toy_mirror(tmp_path, monkeypatch)
    before = sorted(p for p in tmp_path.rglob('*'))
    with pytest.raises(ValueError, match='Expected a TU dataset name such as'):
        load_tu(name)
    assert sorted(p for p in tmp_path.rglob('*')) == before
