r"""Images as graphs of patches: the 4-neighbour grid of the GRF paper's ViT experiments (Reid
et al. 2024, Sec. 4, Table 1), where every image of a batch shares one fixed grid graph, and
images cut into patch vectors in the grid's node order."""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.utils import to_undirected

from pyg_grf._validation import check_int


def grid_edge_index(height: int, width: int) -> Tensor:
    r"""Edges ``[2, E]`` (both directions, sorted) of the 4-neighbour grid graph on
    ``height * width`` nodes in row-major order: node :math:`r W + c` is joined to its
    horizontal and vertical neighbours, as in the GRF paper's ViT grids (Sec. 4); PyG's
    :func:`~torch_geometric.utils.grid` is 8-neighbour with self-loops."""
    check_int('height', height, 1)
    check_int('width', width, 1)
    idx = torch.arange(height * width).view(height, width)
    right = torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)])
    down = torch.stack([idx[:-1, :].reshape(-1), idx[1:, :].reshape(-1)])
    return to_undirected(torch.cat([right, down], 1), num_nodes=height * width)


def image_patches(images: Tensor, patch: int) -> Tensor:
    r"""``[B, H, W]`` images to ``[B, (H / patch) (W / patch), patch^2]`` non-overlapping patch
    vectors, patches in row-major order (the nodes of :func:`grid_edge_index`)."""
    if images.dim() != 3:
        raise ValueError(f"'images' must have shape [B, H, W], got {tuple(images.shape)}")
    B, H, W = images.shape
    if H % patch or W % patch:
        raise ValueError(f"the image size {H} x {W} must be divisible by 'patch' ({patch})")
    x = images.reshape(B, H // patch, patch, W // patch, patch).permute(0, 1, 3, 2, 4)
    return x.reshape(B, (H // patch) * (W // patch), patch * patch)


__all__ = ['grid_edge_index', 'image_patches']
