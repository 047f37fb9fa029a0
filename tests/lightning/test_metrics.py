import numpy as np
import pytest
import torch

from pyg_grf.lightning.metrics import MultilabelAveragePrecision, multilabel_average_precision

sklearn_metrics = pytest.importorskip('sklearn.metrics')


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('ties', [False, True])
def test_equals_sklearn_macro_ap(seed, ties):
    gen = torch.Generator().manual_seed(seed)
    target = (torch.rand(64, 7, generator=gen) < 0.3).float()
    target[0] = 1  # every column has a positive ...
    target[1] = 0  # ... and a negative
    preds = torch.randn(64, 7, generator=gen)
    if ties:
        preds = (preds * 2).round() / 2
    expected = sklearn_metrics.average_precision_score(target.numpy(), preds.numpy(),
                                                       average='macro')
    assert multilabel_average_precision(preds, target).item() == pytest.approx(expected, abs=1e-6)


def test_nan_labels_and_degenerate_columns_are_ignored():
    gen = torch.Generator().manual_seed(0)
    target = (torch.rand(40, 4, generator=gen) < 0.4).float()
    target[:2, :3] = torch.tensor([[1., 0., 1.], [0., 1., 0.]])
    target[5, 0] = target[9, 2] = float('nan')
    target[:, 3] = 0.  # no positive: left out (LRGB / OGB convention)
    preds = torch.randn(40, 4, generator=gen)
    expected = np.mean([
        sklearn_metrics.average_precision_score(target[~torch.isnan(target[:, i]), i].numpy(),
                                                preds[~torch.isnan(target[:, i]), i].numpy())
        for i in range(3)
    ])
    assert multilabel_average_precision(preds, target).item() == pytest.approx(expected, abs=1e-6)


def test_metric_accumulates_batches():
    gen = torch.Generator().manual_seed(1)
    target = (torch.rand(50, 3, generator=gen) < 0.5).float()
    preds = torch.randn(50, 3, generator=gen)
    metric = MultilabelAveragePrecision(num_labels=3)
    for chunk in range(0, 50, 16):
        metric.update(preds[chunk:chunk + 16], target[chunk:chunk + 16])
    assert metric.compute().item() == pytest.approx(
        multilabel_average_precision(preds, target).item())
    with pytest.raises(ValueError, match=r'\[N, 3\]'):
        metric.update(preds[:, :2], target[:, :2])
