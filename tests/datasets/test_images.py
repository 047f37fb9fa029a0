r"""Images as patch-grid graphs: the 4-neighbour grid against networkx, patches against a loop
reference, and the digits dataset against scikit-learn's own statistics."""
import networkx as nx
import numpy as np
import pytest
import torch

from pyg_grf.datasets import DigitsGridDataset, grid_edge_index, image_patches


@pytest.mark.parametrize('h,w', [(1, 1), (1, 5), (4, 4), (3, 7)])
def test_grid_edge_index_is_networkx_grid(h, w):
    ei = grid_edge_index(h, w)
    g = nx.grid_2d_graph(h, w)  # nodes (r, c); ours are r * w + c
    ref = sorted((r1 * w + c1, r2 * w + c2) for (r1, c1), (r2, c2) in g.edges())
    ref = sorted(ref + [(b, a) for a, b in ref])
    assert [tuple(e) for e in ei.t().tolist()] == ref
    assert ei.size(1) == 2 * (h * (w - 1) + w * (h - 1))


def test_grid_edge_index_errors():
    with pytest.raises(ValueError, match="'height' must be an integer >= 1, got 0"):
        grid_edge_index(0, 3)
    with pytest.raises(ValueError, match="'width' must be an integer >= 1"):
        grid_edge_index(2, 2.5)


def test_image_patches_against_loop():
    img = torch.randn(3, 8, 12)
    p = image_patches(img, 4)
    assert p.shape == (3, 6, 16)
    for b in range(3):
        for r in range(2):
            for c in range(3):
                assert torch.equal(p[b, r * 3 + c], img[b, 4 * r:4 * r + 4, 4 * c:4 * c + 4]
                                   .reshape(-1))
    with pytest.raises(ValueError, match="divisible by 'patch'"):
        image_patches(img, 5)
    with pytest.raises(ValueError, match=r"shape \[B, H, W\]"):
        image_patches(img[0], 4)


def test_digits_grid_dataset_statistics():
    sklearn = pytest.importorskip('sklearn.datasets')
    target = sklearn.load_digits().target
    ds = DigitsGridDataset(seed=0)
    assert len(ds) == 1797 and ds.num_classes == 10 and ds.num_features == 16 + 16
    y = torch.cat([d.y for d in ds])
    assert torch.equal(y, torch.from_numpy(target.astype(np.int64)))
    d = ds[5]
    assert torch.equal(d.edge_index, grid_edge_index(4, 4))
    assert torch.equal(d.x[:, 16:], torch.eye(16))  # one-hot positions
    # the digit's ink stays on the canvas: without noise, total ink is the source's times
    # about s^2 for a scale s in [1, 2] (bilinear resampling)
    clean = DigitsGridDataset(seed=0, noise=0.0)
    ink = clean.x[:, :16].reshape(len(ds), -1).sum(1)
    src = torch.from_numpy(sklearn.load_digits().images.reshape(1797, -1).sum(1) / 16.0)
    ratio = ink / src.float()
    assert 0.85 < float(ratio.min()) and float(ratio.max()) < 4.6
    # the same placements plus Gaussian noise of std 0.1 (tolerance: 5 standard errors of the
    # sample std, sqrt(1 / (2 n)) relative)
    noise = (ds.x[:, :16] - clean.x[:, :16]).reshape(-1)
    assert abs(float(noise.std()) - 0.1) < 5 * 0.1 / (2 * noise.numel()) ** 0.5
    # deterministic in the seed, different across seeds
    assert torch.equal(DigitsGridDataset(seed=0).x, ds.x)
    assert not torch.equal(DigitsGridDataset(seed=1).x, ds.x)
    assert len(DigitsGridDataset(num_graphs=100)) == 100


def test_digits_grid_dataset_errors():
    with pytest.raises(ValueError, match="divisible by 'patch'"):
        DigitsGridDataset(canvas=16, patch=5)
    with pytest.raises(ValueError, match=r"8 \* high <= canvas \(16\)"):
        DigitsGridDataset(scale=(1.0, 3.0))
    with pytest.raises(ValueError, match="'num_graphs' must lie in"):
        DigitsGridDataset(num_graphs=5000)
