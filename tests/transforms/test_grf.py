import math

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from pyg_grf.features import GRFLoads, grf_loads, power_series_kernel
from pyg_grf.masks import GRFMask
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import cached_dataset, er_graph, grid_graph, path_graph


def graphs():
    return [Data(x=torch.randn(n, 3), edge_index=ei, y=torch.tensor([i]))
            for i, (n, ei) in enumerate([(9, grid_graph(3, 3)), (4, path_graph(4)),
                                         (13, er_graph(13, 0.3, seed=1))])]


def test_repr_shows_every_setting():
    t = AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=6, walker='repelling',
                               seed=3)
    assert str(t) == ("AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=6, "
                      "walker='repelling', normalization='sym', importance=True, "
                      "fixed_length=False, use_edge_weight=False, seed=3, attr_prefix='grf')")


def test_stores_loads_of_grf_loads_and_does_not_mutate():
    d = graphs()[0]
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=7)
    out = t(d)
    assert 'grf_index' not in d  # input untouched
    ref = grf_loads(d.edge_index, 9, 5, 0.4, 3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(out.grf_index, ref[0]) and torch.equal(out.grf_length, ref[1])
    assert torch.allclose(out.grf_load, ref[2])
    # Seeded: reproducible (a new instance with the same seed draws the same walks).
    again = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=7)(d)
    assert torch.equal(again.grf_load, out.grf_load)


def test_batching_offsets_grf_index():
    t = AddGraphRandomFeatures(num_walks=4, max_length=3, seed=0)
    data = [t(g) for g in graphs()]
    loader = DataLoader(data, batch_size=3)
    batch = next(iter(loader))
    offsets = [0, 9, 13]
    expected = torch.cat([g.grf_index + o for g, o in zip(data, offsets)], 1)
    assert torch.equal(batch.grf_index, expected)
    assert torch.equal(batch.grf_length, torch.cat([g.grf_length for g in data]))
    # every entry stays inside its own graph
    assert torch.equal(batch.batch[batch.grf_index[0]], batch.batch[batch.grf_index[1]])


def test_pre_transform_is_cached_and_transform_is_fresh(tmp_path):
    pre = AddGraphRandomFeatures(num_walks=4, max_length=3)
    ds = cached_dataset(tmp_path / 'a', graphs, pre_transform=pre)
    first = ds[0].grf_load.clone()
    assert torch.equal(ds[0].grf_load, first)  # frozen walks
    ds2 = cached_dataset(tmp_path / 'a', graphs, pre_transform=pre)  # reloaded from processed/
    assert torch.equal(ds2[0].grf_load, first)
    fresh = cached_dataset(tmp_path / 'b', graphs,
                           transform=AddGraphRandomFeatures(num_walks=4, max_length=3))
    a, b = fresh[2], fresh[2]
    assert not (a.grf_index.shape == b.grf_index.shape and torch.equal(a.grf_load, b.grf_load))


def test_edge_weights_and_isolated_nodes():
    d = Data(edge_index=torch.tensor([[0, 1], [1, 0]]), edge_weight=torch.tensor([2.0, 2.0]),
             num_nodes=3)
    out = AddGraphRandomFeatures(num_walks=2, max_length=2, use_edge_weight=True,
                                 normalization=None, seed=0)(d)
    iso = out.grf_index[0] == 2
    assert torch.equal(out.grf_index[1, iso], torch.tensor([2]))
    with pytest.raises(ValueError, match='no .edge_weight.'):
        AddGraphRandomFeatures(use_edge_weight=True)(Data(edge_index=path_graph(3), num_nodes=3))


@pytest.mark.parametrize('kwargs,match', [
    (dict(p_halt=1.0), 'p_halt'), (dict(num_walks=0), 'num_walks'),
    (dict(walker='x'), 'walker'), (dict(normalization='x'), 'normalization'),
    (dict(attr_prefix='my_index'), 'index'),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AddGraphRandomFeatures(**kwargs)


def test_compact_storage_dtypes_and_same_values():
    d = graphs()[2]
    out = AddGraphRandomFeatures(num_walks=5, max_length=3, seed=1)(d)
    assert out.grf_index.dtype == torch.int32
    assert out.grf_length.dtype == torch.int8
    assert out.grf_load.dtype == torch.float32
    ref = grf_loads(d.edge_index, 13, 5, 0.5, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.grf_index.long(), ref[0])
    assert torch.equal(out.grf_length.long(), ref[1])
    long = AddGraphRandomFeatures(num_walks=2, max_length=130, seed=0)(d)
    assert long.grf_length.dtype == torch.int16


def test_overflowing_loads_raise_a_clear_error():
    # unnormalised weights on a dense graph: the importance weights grow like (deg / (1-p))^l
    d = Data(edge_index=er_graph(60, 0.9, seed=0), num_nodes=60)
    t = AddGraphRandomFeatures(num_walks=4, p_halt=0.01, max_length=60, normalization=None,
                               seed=0)
    with pytest.raises(ValueError, match='overflowed float32'):
        t(d)


def test_draws_are_independent_samples_of_one_estimator():
    # every draw estimates F = sum_l f_l W^l (asymmetric features, unbiased); the mean of the D
    # draws converges like 1 / sqrt(D): a statistic with a variance-derived tolerance
    n, Dn = 10, 400
    ei = er_graph(n, 0.5, 3)
    data = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=0,
                                  num_draws=Dn)(Data(edge_index=ei, num_nodes=n))
    grf = GRFLoads.from_data(data)
    f = torch.tensor([1.0, 0.7, 0.5, 0.3], dtype=torch.float64)
    phis = torch.stack([GRFMask.from_loads(grf.fold((d,)), f=f, asymmetric=True).to_dense()
                        for d in range(Dn)])  # [D, n, n]
    F = power_series_kernel(ei, n, f)  # the exact sum_l f_l W^l, by Horner's rule
    mean, se = phis.mean(0), phis.std(0) / math.sqrt(Dn)
    assert float(((mean - F).abs() - 5 * se - 1e-9).clamp_min(0).max()) == 0
    # distinct draws are not copies of each other
    assert not torch.allclose(phis[0], phis[1])


def test_one_draw_stores_no_draw_ids():
    # num_draws=1 stores exactly what the transform stored before (no grf_draw)
    data = Data(edge_index=er_graph(12, 0.3, 0), num_nodes=12)
    a = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=4)(data)
    b = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=4, num_draws=1)(data)
    assert 'grf_draw' not in b
    for name in ('grf_index', 'grf_length', 'grf_load'):
        assert torch.equal(a[name], b[name])
