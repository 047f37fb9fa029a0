r"""Images as patch-grid graphs: the 4-neighbour grid against networkx, patches against a loop
reference."""
import networkx as nx
import pytest
import torch

from pyg_grf.datasets import grid_edge_index, image_patches


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
