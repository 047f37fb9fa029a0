import copy
import pickle

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.utils import to_undirected

from pyg_grf.features import rwgnk_features
from pyg_grf.transforms import AddRWGNKFeatures
from tests.utils import cached_dataset


def graphs():
    out = []
    for n, edges in [(4, [[0, 1, 2], [1, 2, 3]]), (3, [[0, 1, 2], [1, 2, 0]]),
                     (5, [[0, 0, 1, 3], [1, 2, 3, 4]])]:
        ei = to_undirected(torch.tensor(edges), num_nodes=n)
        out.append(Data(x=torch.randn(n, 2), edge_index=ei, num_nodes=n))
    return out


def test_stores_features_and_does_not_mutate():
    data = graphs()[2]
    before = copy.copy(data)
    transform = AddRWGNKFeatures(num_walks=6, lam=0.5, alpha=1.0, max_length=3, seed=3)
    out = transform(data)
    assert 'rwgnk_index' not in data and set(data.keys()) == set(before.keys())
    psi = rwgnk_features(data.edge_index, 5, 6, lam=0.5, alpha=1.0, max_length=3,
                         generator=torch.Generator().manual_seed(3))
    assert torch.equal(out.rwgnk_index, psi.indices())
    assert torch.allclose(out.rwgnk_value, psi.values())
    assert out.rwgnk_index.shape == (2, out.rwgnk_value.numel())
    # Seeded: reproducible sequence across instances; fresh walks on every call.
    again = AddRWGNKFeatures(num_walks=6, lam=0.5, alpha=1.0, max_length=3, seed=3)(data)
    assert torch.equal(again.rwgnk_value, out.rwgnk_value)
    # Picklable (DataLoader workers), generator state included.
    clone = pickle.loads(pickle.dumps(transform))
    assert torch.equal(clone(data).rwgnk_value, transform(data).rwgnk_value)


def test_repr():
    t = AddRWGNKFeatures(num_walks=8, lam=0.8, alpha=1.0, max_length=4, p_halt=0.1,
                         walker='antithetic', seed=7)
    assert str(t) == ("AddRWGNKFeatures(num_walks=8, lam=0.8, alpha=1.0, max_length=4, "
                      "p_halt=0.1, walker='antithetic', seed=7)")


def test_batching_offsets_index():
    data_list = graphs()
    transform = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, seed=0)
    data_list = [transform(d) for d in data_list]
    batch = next(iter(DataLoader(data_list, batch_size=3)))
    offset = 0
    parts_idx, parts_val = [], []
    for d in data_list:
        parts_idx.append(d.rwgnk_index + offset)
        parts_val.append(d.rwgnk_value)
        offset += d.num_nodes
    assert torch.equal(batch.rwgnk_index, torch.cat(parts_idx, 1))
    assert torch.equal(batch.rwgnk_value, torch.cat(parts_val))
    # Block-diagonal: features never connect two graphs.
    g = batch.batch
    assert torch.equal(g[batch.rwgnk_index[0]], g[batch.rwgnk_index[1]])
    # Unbatching gives the per-graph features back.
    for i, d in enumerate(data_list):
        assert torch.equal(batch.get_example(i).rwgnk_index, d.rwgnk_index)


def seeded_graphs():
    torch.manual_seed(0)
    return graphs()


def test_pre_transform_cached_and_transform(tmp_path):
    pre = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=2, seed=1)
    ds = cached_dataset(tmp_path, seeded_graphs, pre_transform=pre)
    assert ds[0].rwgnk_index.size(0) == 2
    first = ds[1].rwgnk_value.clone()
    # Reloading uses the cache (same walks), as long as the repr is unchanged.
    ds2 = cached_dataset(tmp_path, seeded_graphs,
                         pre_transform=AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0,
                                                        max_length=2, seed=1))
    assert torch.equal(ds2[1].rwgnk_value, first)
    # As a transform: fresh walks on every access.
    ds3 = cached_dataset(tmp_path / 'b', seeded_graphs,
                         transform=AddRWGNKFeatures(num_walks=1, lam=0.7, alpha=0.0, max_length=3,
                                                    p_halt=0.5))
    values = {tuple(ds3[2].rwgnk_value.tolist()) for _ in range(20)}
    assert len(values) > 1
    batch = next(iter(DataLoader(ds3, batch_size=3)))
    assert batch.rwgnk_index.max() < batch.num_nodes


@pytest.mark.parametrize('kwargs,match', [
    (dict(lam=0.0), "'lam'"),
    (dict(lam=1.01), "'lam'"),
    (dict(alpha=-0.5), "'alpha'"),
    (dict(num_walks=0), "'num_walks'"),
    (dict(max_length=-1), "'max_length'"),
    (dict(p_halt=1.0), "'p_halt'"),
    (dict(walker='lazy'), "'walker'"),
])
def test_bad_input(kwargs, match):
    args = dict(num_walks=4, lam=0.5, alpha=1.0, max_length=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        AddRWGNKFeatures(**args)
