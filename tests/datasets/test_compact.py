import os

import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.loader import DataLoader

from pyg_grf.datasets import MotifDataset, load_lrgb, write_lrgb_raw_standin
from pyg_grf.datasets.cache import DatasetCacheError, SafeCacheMixin, safe_load
from pyg_grf.datasets.compact import (
    COMPACT_FORMAT,
    compact_collated,
    narrow_integers,
    restore_collated,
)
from pyg_grf.datasets.lrgb import SPLITS, standin_graphs
from pyg_grf.transforms import AddGraphRandomFeatures


def grf(**kwargs):
    return AddGraphRandomFeatures(**dict(dict(num_walks=4, p_halt=0.3, max_length=3, seed=0),
                                         **kwargs))


class Plain(InMemoryDataset):
    # The reference: graphs collated in memory, as PyG keeps them (never compacted).
    def __init__(self, data_list):
        super().__init__()
        self.data, self.slices = self.collate(data_list)


def plain_size(dataset, path):
    # The size of the same data in PyG's own file format.
    InMemoryDataset.save(list(dataset), str(path))
    return os.path.getsize(path)


def assert_same_tensors(a, b):
    assert set(a.keys()) == set(b.keys())
    for key in a.keys():
        if torch.is_tensor(a[key]):
            assert a[key].dtype == b[key].dtype, key
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def assert_same_dataset(compact, plain):
    assert_same_tensors(compact._data, plain._data)
    assert_same_tensors(compact.slices or {}, plain.slices or {})
    for x, y in zip(compact, plain):
        assert_same_tensors(x, y)
    for x, y in zip(DataLoader(compact, batch_size=3), DataLoader(plain, batch_size=3)):
        assert_same_tensors(x, y)


@pytest.mark.parametrize('value,dtype', [
    ([0, 7, 255], torch.uint8),
    ([-1, 5, 127], torch.int8),
    ([0, 300], torch.int16),
    ([-40000, 0], torch.int32),
    ([0, 2 ** 40], torch.int64),
])
def test_narrow_integers(value, dtype):
    t = torch.tensor(value)
    out = narrow_integers(t)
    assert out.dtype == dtype and torch.equal(out.long(), t)
    if dtype != torch.int64:  # from int32 too
        assert narrow_integers(t.to(torch.int32)).dtype == (dtype if dtype != torch.int32
                                                            else torch.int32)


def test_narrow_integers_keeps_other_tensors():
    for t in (torch.tensor([0.5, 1.0]), torch.tensor([True, False]), torch.tensor([1, 2],
              dtype=torch.int8), torch.empty(0, dtype=torch.long)):
        assert narrow_integers(t) is t


def test_compact_hand_written():
    # Two graphs (3 and 2 nodes); grf_index's first row sorted within each graph.
    data = Data(x=torch.tensor([[1], [2], [3], [4], [5]]),
                grf_index=torch.tensor([[0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1],
                                        [0, 1, 2, 2, 0, 1, 0, 0, 1, 0, 1]], dtype=torch.int32),
                grf_load=torch.arange(11.))
    slices = {'x': torch.tensor([0, 3, 5]), 'grf_index': torch.tensor([0, 7, 11]),
              'grf_load': torch.tensor([0, 7, 11])}
    mapping, spec = compact_collated(data, slices)
    assert spec['format'] == COMPACT_FORMAT
    assert mapping['x'].dtype == torch.uint8 and mapping['grf_load'] is data.grf_load
    field = spec['fields']['grf_index']
    # Graph 0: values 0..2 with counts (3, 0, 4); graph 1: values 0..1 with counts (0, 4).
    assert field['first_row'] == 'counts' and field['dtype'] == 'int32'
    assert field['counts'].tolist() == [3, 0, 4, 0, 4] and field['lengths'].tolist() == [3, 2]
    assert mapping['grf_index'].tolist() == data.grf_index[1].tolist()
    assert mapping['grf_index'].dtype == torch.uint8
    assert_same_tensors(restore_collated(mapping, slices, spec), data.to_dict())

    # A first row that is not sorted within a graph is only narrowed.
    data.grf_index = data.grf_index.flip(0)
    mapping, spec = compact_collated(data, slices)
    assert 'first_row' not in spec['fields']['grf_index']
    assert mapping['grf_index'].dtype == torch.uint8 and mapping['grf_index'].shape == (2, 11)
    assert_same_tensors(restore_collated(mapping, slices, spec), data.to_dict())
    # A single graph (no slices), counts only where smaller than the narrowed row.
    one = Data(edge_index=torch.tensor([[0, 0, 0, 1, 1, 1], [1, 2, 3, 0, 2, 3]]))
    mapping, spec = compact_collated(one, None)
    assert spec['fields']['edge_index']['counts'].tolist() == [3, 3]
    assert_same_tensors(restore_collated(mapping, None, spec), one.to_dict())
    one = Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]))
    mapping, spec = compact_collated(one, None)
    assert 'first_row' not in spec['fields']['edge_index']
    assert_same_tensors(restore_collated(mapping, None, spec), one.to_dict())


@pytest.mark.parametrize('name', ['Peptides-struct', 'PascalVOC-SP', 'PCQM-Contact'])
def test_compact_cache_round_trip(name, monkeypatch, tmp_path):
    # Stand-in raw files processed through PyG's LRGBDataset and the cache (written compact):
    # bit-identical data, slices, graphs and batches to the same graphs collated in memory.
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    write_lrgb_raw_standin(name, str(tmp_path), num_graphs=7, seed=1)
    compact = load_lrgb(name, 'val', str(tmp_path), pre_transform=grf())
    t = grf()  # the transform sees train, then val, as in process()
    graphs = {s: [t(d) for d in standin_graphs(name, 7, seed=1 + i)] for i, s in enumerate(SPLITS)}
    plain = Plain(graphs['val'])
    if name == 'PascalVOC-SP':  # PyG's process() casts the superpixel features to float
        plain._data.x, plain._data.edge_attr = plain._data.x.float(), plain._data.edge_attr.float()
    assert_same_dataset(compact, plain)
    assert compact._data.grf_index.dtype == torch.int32

    path = compact.processed_paths[1]
    mapping, slices, _, spec = safe_load(path)
    assert spec['fields']['grf_index']['first_row'] == 'counts'  # sorted by start node
    assert mapping['grf_index'].dim() == 1
    if name != 'PascalVOC-SP':  # categorical OGB features
        assert mapping['x'].dtype == torch.uint8 and mapping['edge_attr'].dtype == torch.uint8
    assert os.path.getsize(path) < plain_size(plain, tmp_path / 'plain.pt')


def test_compact_with_draws_and_motifs(tmp_path):
    # Several walk draws: grf_index is sorted by (draw, start node), not by start node, so its
    # first row is kept (narrowed); the data is still restored bit for bit.
    kwargs = dict(motif='circle', num_graphs=6, num_nodes=12)
    compact = MotifDataset(str(tmp_path), pre_transform=grf(num_draws=2), **kwargs)
    plain = MotifDataset(pre_transform=grf(num_draws=2), **kwargs)  # in memory, not cached
    assert_same_dataset(compact, plain)
    spec = safe_load(compact.processed_paths[0])[3]
    assert 'first_row' not in spec['fields']['grf_index']


def test_restore_bad_input():
    data = Data(x=torch.tensor([[1], [2], [3]]),
                edge_index=torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2, 2],
                                         [0, 1, 2, 0, 1, 2, 0, 1, 2]]))
    mapping, spec = compact_collated(data, None)
    assert spec['fields']['edge_index']['first_row'] == 'counts'
    with pytest.raises(ValueError, match="Expected a 'pyg_grf.compact' spec .* got 'other'"):
        restore_collated(mapping, None, dict(spec, format='other'))
    with pytest.raises(ValueError, match="Expected a 'pyg_grf.compact' spec .* got 'list'"):
        restore_collated(mapping, None, [])
    with pytest.raises(ValueError, match="Expected compact format version 1, got 99"):
        restore_collated(mapping, None, dict(spec, version=99))
    bad = {'x': {'dtype': 'float64'}}
    with pytest.raises(ValueError, match=r"Expected 'x' to name its original integer dtype "
                                         r"\(one of \['uint8'.*\]\), got 'float64'"):
        restore_collated(mapping, None, dict(spec, fields=bad))
    with pytest.raises(ValueError, match="names the tensor 'y', which the data does not hold"):
        restore_collated(mapping, None, dict(spec, fields={'y': {'dtype': 'int64'}}))
    field = dict(spec['fields']['edge_index'], counts=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="counts of 'edge_index' describe 3 entries .* its "
                                         "slices hold 9"):
        restore_collated(mapping, None, dict(spec, fields={'edge_index': field}))
    with pytest.raises(ValueError, match="Expected 9 entries of 'edge_index' .*, got 8"):
        restore_collated(dict(mapping, edge_index=mapping['edge_index'][:8]),
                         {'x': torch.tensor([0, 3]), 'edge_index': torch.tensor([0, 9])}, spec)
    field = dict(spec['fields']['edge_index'], lengths=torch.tensor([2]))
    with pytest.raises(ValueError, match=r"one count length per graph \(1\) adding up to the 3 "
                                         r"counts of 'edge_index', got 1 lengths adding up to 2"):
        restore_collated(mapping, None, dict(spec, fields={'edge_index': field}))
    with pytest.raises(TypeError, match="Expected a collated PyG data object .* got dict"):
        compact_collated(data.to_dict(), None)


def test_load_rejects_broken_compact_cache(tmp_path):
    # A compact file whose spec does not describe its tensors (the manifest was bypassed).
    data = Data(x=torch.tensor([[1], [2]]), edge_index=torch.tensor([[0, 1], [1, 0]]))
    mapping, spec = compact_collated(data, None)
    spec['fields']['x']['dtype'] = 'complex64'
    path = str(tmp_path / 'data.pt')
    torch.save((mapping, None, Data, spec), path)
    dataset = InMemoryDataset.__new__(MotifDataset)
    with pytest.raises(DatasetCacheError, match=r"data.pt' is not a readable compact cache: "
                                                r"Expected 'x' to name .*force_reload"):
        SafeCacheMixin.load(dataset, path)
    torch.save((mapping, None, Data, spec, 'extra'), path)
    with pytest.raises(DatasetCacheError, match=r"expected a tuple \(mapping, slices, class, "
                                                r"spec\), got tuple of 5"):
        SafeCacheMixin.load(dataset, path)


@pytest.mark.data
def test_peptides_compact_round_trip(offline_mirror, tmp_path):
    # The real Peptides-func molecules (first 40 of each split) with GRF walk features, cached
    # compact: bit-identical to the same graphs collated in memory, OGB ids stored as uint8.
    pytest.importorskip('rdkit')
    from pyg_grf.datasets import PeptidesFunctional

    def load(split, pre_transform):
        return PeptidesFunctional(str(tmp_path), split=split, max_graphs=40, num_proc=1,
                                  progress=False, pre_transform=pre_transform)

    def walks():
        return grf(num_walks=16, p_halt=0.2, max_length=4)
    compact = load('val', walks())
    t = walks()  # train first, then val, as in process()
    plain = [[t(d) for d in load(s, None)] for s in ('train', 'val')][1]
    plain = Plain(plain)
    assert_same_dataset(compact, plain)
    mapping, _, _, spec = safe_load(compact.processed_paths[1])
    assert mapping['x'].dtype == torch.uint8 and mapping['edge_attr'].dtype == torch.uint8
    assert spec['fields']['grf_index']['first_row'] == 'counts'
    size = os.path.getsize(compact.processed_paths[1])
    assert size < 0.45 * plain_size(plain, tmp_path / 'plain.pt')
