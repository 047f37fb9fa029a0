import pytest
import torch
from torch_geometric.data import Data

from pyg_grf.transforms import Standardize


def _graphs(sizes=(30, 50, 20), seed=0):
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.01, 1.0, 100.0])
    return [Data(x=torch.randn(n, 3, generator=gen) * scale + 5,
                 y=torch.randn(n, 2, generator=gen) * 3 - 1) for n in sizes]


def test_fit_uses_every_row_of_the_training_graphs():
    train = _graphs()
    std = Standardize(['x', 'y']).fit(train)
    x = torch.cat([g.x for g in train]).double()
    # independent reference: numpy-style moments over all stacked rows (not per graph)
    assert torch.allclose(std.mean['x'].double(), x.mean(0), rtol=1e-6)
    assert torch.allclose(std.std['x'].double(), x.std(0), rtol=1e-5)
    out = torch.cat([std(g.clone()).x for g in train])
    assert torch.allclose(out.mean(0), torch.zeros(3), atol=1e-4)
    assert torch.allclose(out.std(0), torch.ones(3), atol=1e-4)
    test = _graphs((40, ), seed=1)[0]
    y = test.y.clone()
    assert torch.allclose(std.inverse(std(test).y, 'y'), y, atol=1e-5)


def test_given_statistics_and_a_constant_column():
    std = Standardize(['x'], mean={'x': [1.0, 2.0]}, std={'x': [2.0, 0.0]})
    data = std(Data(x=torch.tensor([[3.0, 2.0]])))
    assert torch.allclose(data.x, torch.tensor([[1.0, 0.0]]))  # sigma 0 -> eps, no nan
    fitted = Standardize(['x']).fit([Data(x=torch.ones(4, 1))])
    assert torch.isfinite(fitted(Data(x=torch.ones(2, 1))).x).all()


def test_a_pyg_dataset_is_fitted_without_its_transform(tmp_path):
    from pyg_grf.datasets import MotifDataset
    ds = MotifDataset(num_graphs=2, num_nodes=20, seed=0)
    ds.transform = lambda d: Data(x=d.x * 0, y=d.y)
    std = Standardize(['x']).fit(ds)
    raw = torch.cat([ds.get(i).x for i in range(2)])
    assert raw.std(0).gt(0).any()  # (the statistics differ from the transform's zeros)
    assert torch.allclose(std.mean['x'], raw.mean(0), atol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match='non-empty list'):
        Standardize('x')
    with pytest.raises(ValueError, match='both'):
        Standardize(['x'], mean={'x': [0.]})
    with pytest.raises(ValueError, match=r"missing: \['y'\]"):
        Standardize(['x', 'y'], mean={'x': [0.]}, std={'x': [1.]})
    with pytest.raises(RuntimeError, match='call fit'):
        Standardize(['x'])(Data(x=torch.ones(2, 1)))
    with pytest.raises(ValueError, match='floating-point tensor data.y, got torch.int64'):
        Standardize(['y']).fit([Data(y=torch.ones(3, dtype=torch.long))])
    with pytest.raises(ValueError, match='data.z, got NoneType'):
        Standardize(['z']).fit([Data(x=torch.ones(3, 1))])
    with pytest.raises(ValueError, match='at least one graph'):
        Standardize(['x']).fit([])
    with pytest.raises(ValueError, match='at least two rows'):
        Standardize(['x']).fit([Data(x=torch.ones(1, 2))])
    with pytest.raises(ValueError, match="no statistics for 'y'"):
        Standardize(['x']).fit(_graphs()).inverse(torch.ones(2), 'y')


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_fit_refuses_nan_and_inf_naming_the_attribute_and_column(bad):
    graphs = _graphs()
    graphs[1].y[7, 1] = bad  # one value: its column's mean and std would become NaN
    with pytest.raises(ValueError, match=r"needs finite values, but 1 of the 200 values of 'y' "
                                         r"are NaN or inf \(column\(s\) \[1\]\)"):
        Standardize(['x', 'y']).fit(graphs)


def test_given_statistics_must_be_finite():
    with pytest.raises(ValueError, match=r"must be finite numbers, got NaN or inf for \['x'\]"):
        Standardize(['x'], mean={'x': [float('nan')]}, std={'x': [1.0]})
