import numpy as np
import pytest
import torch

from pyg_grf.lightning.metrics import MultilabelAveragePrecision

sklearn_metrics = pytest.importorskip('sklearn.metrics')


def multilabel_average_precision(preds, target):
    metric = MultilabelAveragePrecision(num_labels=preds.size(-1))
    metric.update(preds, target)
    return metric.compute()


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
    target = (torch.rand(40, 5, generator=gen) < 0.4).float()
    target[:2, :3] = torch.tensor([[1., 0., 1.], [0., 1., 0.]])
    target[5, 0] = target[9, 2] = float('nan')
    target[:, 3] = 0.  # no positive: left out (LRGB / OGB convention)
    target[:, 4] = 1.  # no negative: left out too
    target[7, 4] = float('nan')
    preds = torch.randn(40, 5, generator=gen)
    expected = np.mean([
        sklearn_metrics.average_precision_score(target[~torch.isnan(target[:, i]), i].numpy(),
                                                preds[~torch.isnan(target[:, i]), i].numpy())
        for i in range(3)
    ])
    assert multilabel_average_precision(preds, target).item() == pytest.approx(expected, abs=1e-6)
    metric = MultilabelAveragePrecision(num_labels=5)
    metric.update(preds[:25], target[:25])
    metric.update(preds[25:], target[25:])
    assert metric.compute().item() == pytest.approx(expected, abs=1e-6)


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


def test_equals_torchmetrics_macro_on_complete_targets():
    # Without NaN targets and with both classes in every column, the wrapper is torchmetrics'
    # macro AP.
    from torchmetrics.classification import MultilabelAveragePrecision as TMAveragePrecision
    gen = torch.Generator().manual_seed(5)
    target = (torch.rand(60, 6, generator=gen) < 0.4).long()
    target[0], target[1] = 1, 0
    preds = torch.rand(60, 6, generator=gen)
    reference = TMAveragePrecision(num_labels=6, average='macro')
    reference.update(preds, target)
    ours = MultilabelAveragePrecision(num_labels=6)
    ours.update(preds, target.float())
    assert ours.compute().item() == pytest.approx(reference.compute().item(), abs=1e-6)


def test_large_logits_keep_their_order():
    # Logits above ~17 all become 1.0 under a float32 sigmoid; the ranking (and sklearn's AP on
    # the logits) must not see ties there.
    target = torch.tensor([[1.], [0.], [1.], [0.], [0.]])
    preds = torch.tensor([[40.], [30.], [25.], [20.], [-3.]])
    expected = sklearn_metrics.average_precision_score(target.numpy(), preds.numpy())
    assert expected == pytest.approx((1 + 2 / 3) / 2)
    assert multilabel_average_precision(preds, target).item() == pytest.approx(expected)
    metric = MultilabelAveragePrecision(num_labels=1)  # one label works too
    metric.update(preds, target)
    assert metric.compute().item() == pytest.approx(expected)


def test_no_informative_column_and_bad_input():
    target = torch.tensor([[1., float('nan')], [1., 0.]])
    assert torch.isnan(multilabel_average_precision(torch.randn(2, 2), target))
    with pytest.raises(ValueError, match=r'same shape \[N, 4\], got \(4,\) and \(4,\)'):
        multilabel_average_precision(torch.randn(4), torch.ones(4))
    with pytest.raises(ValueError, match=r'\[N, 2\], got \(4, 2\) and \(4, 3\)'):
        multilabel_average_precision(torch.randn(4, 2), torch.ones(4, 3))
    with pytest.raises(ValueError, match=r'targets in \{0, 1\} \(NaN for missing labels\), '
                                         r'got the value 2'):
        MultilabelAveragePrecision(num_labels=2).update(torch.randn(2, 2),
                                                        torch.tensor([[0., 1.], [2., 0.]]))
