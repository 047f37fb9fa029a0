r"""Images as graphs of patches: the grid setting of the GRF paper's ViT experiments (Reid et al.
2024, Sec. 4, Table 1), where every image of a batch shares one fixed grid graph."""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from pyg_grf._validation import check_int
from pyg_grf.datasets.synthetic import GeneratedDataset

#: Images in scikit-learn's digits dataset.
NUM_DIGITS = 1797


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


class DigitsGridDataset(GeneratedDataset):
    r"""scikit-learn's handwritten digits (1,797 images of 8 x 8 pixels, 10 classes; shipped
    inside the package) as graphs of image patches, a small offline stand-in for the GRF paper's
    ViT task (Sec. 4, Table 1): every digit is resampled at a random scale in ``scale`` (its side
    becomes ``8 * s`` pixels), placed at a random offset on a ``canvas x canvas`` canvas, Gaussian
    noise of std ``noise`` is added (pixel values in [0, 1]), and the canvas is cut into
    ``patch x patch`` patches. Graph :math:`g`:

    * ``x`` ``[P, patch^2 + P]``: the patch pixels, then a one-hot patch position (a linear node
      encoder then adds a learned absolute position embedding, as the paper's ViTs do);
    * ``edge_index``: the 4-neighbour patch grid (:func:`grid_edge_index`), the same for every
      image;
    * ``y`` ``[1]``: the digit;
    * ``source`` ``[1]``: the index of the source image in scikit-learn's set.

    Each source digit appears ``copies`` times with independent placements (augmentation). Split
    by ``source`` (``SyntheticDataModule(split_by='source')``) so that the copies of one digit
    never land in different splits.

    Args:
        root (str, optional): Cache folder; :obj:`None` keeps the dataset in memory only.
        canvas (int): Canvas side in pixels.
        patch (int): Patch side; ``canvas`` must be divisible by it.
        scale (tuple): Range of the digit's scale factor.
        noise (float): Std of the added Gaussian noise.
        copies (int): Placements per source digit.
        num_graphs (int, optional): Keep only the first ``num_graphs`` samples (default: all,
            ``1797 * copies``).
        seed (int): Seed of the placements and the noise.
    """
    settings = ('canvas', 'patch', 'scale', 'noise', 'copies', 'num_graphs', 'seed')
    version = 2

    def __init__(self, root: Optional[str] = None, canvas: int = 16, patch: int = 4,
                 scale: Tuple[float, float] = (1.0, 2.0), noise: float = 0.1, copies: int = 1,
                 num_graphs: Optional[int] = None, seed: int = 0,
                 transform: Optional[Callable] = None, pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False) -> None:
        if canvas < 8 or patch < 1 or canvas % patch:
            raise ValueError(f"'canvas' must be >= 8 and divisible by 'patch', got canvas="
                             f"{canvas}, patch={patch}")
        scale = tuple(float(s) for s in scale)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] or 8 * scale[1] > canvas:
            raise ValueError(f"'scale' must be (low, high) with 0 < low <= high and 8 * high <= "
                             f"canvas ({canvas}), got {scale}")
        if noise < 0 or copies < 1:
            raise ValueError(f"'noise' must be >= 0 and 'copies' >= 1, got {noise}, {copies}")
        self.canvas, self.patch, self.scale, self.noise = canvas, patch, scale, float(noise)
        if num_graphs is not None and not 1 <= num_graphs <= NUM_DIGITS * copies:
            raise ValueError(f"'num_graphs' must lie in [1, {NUM_DIGITS * copies}] "
                             f"(1797 digits x copies={copies}), got {num_graphs}")
        self.copies, self.seed = int(copies), int(seed)
        self.num_graphs = None if num_graphs is None else int(num_graphs)
        super().__init__(root, transform, pre_transform, pre_filter, force_reload)

    @property
    def grid_shape(self) -> Tuple[int, int]:
        return self.canvas // self.patch, self.canvas // self.patch

    def generate(self) -> List[Data]:
        from sklearn.datasets import load_digits
        digits = load_digits()
        images = torch.from_numpy(np.asarray(digits.images, dtype=np.float32)) / 16.0
        labels = torch.from_numpy(np.asarray(digits.target, dtype=np.int64))
        images = images.repeat_interleave(self.copies, 0)[:self.num_graphs]
        labels = labels.repeat_interleave(self.copies, 0)[:self.num_graphs]
        source = torch.arange(NUM_DIGITS).repeat_interleave(self.copies)[:self.num_graphs]
        # each digit at a random scale (side 8 * s pixels) and offset inside the canvas, plus
        # Gaussian noise: one batched affine_grid / grid_sample
        gen, B, C = torch.Generator().manual_seed(self.seed), images.size(0), self.canvas
        side = 8.0 * torch.empty(B).uniform_(*self.scale, generator=gen) / C  # canvas fraction
        off = (torch.rand(B, 2, generator=gen) - 0.5) * (1.0 - side).clamp_min(0.0).unsqueeze(1)
        theta = torch.zeros(B, 2, 3)  # output coords u in [-1, 1] read input (u - 2 off) / side
        theta[:, 0, 0] = theta[:, 1, 1] = 1.0 / side
        theta[:, :, 2] = -2.0 * off / side.unsqueeze(1)
        grid = torch.nn.functional.affine_grid(theta, (B, 1, C, C), align_corners=False)
        canvas = torch.nn.functional.grid_sample(images.unsqueeze(1), grid, align_corners=False,
                                                 padding_mode='zeros').squeeze(1)
        canvas = canvas + self.noise * torch.randn(canvas.shape, generator=gen)
        x = image_patches(canvas, self.patch)                      # [B, P, patch^2]
        P = x.size(1)
        pos = torch.eye(P).expand(x.size(0), P, P)
        x = torch.cat([x, pos], -1)
        edge_index = grid_edge_index(*self.grid_shape)
        return [Data(x=x[g], edge_index=edge_index, y=labels[g:g + 1], source=source[g:g + 1])
                for g in range(x.size(0))]

    @property
    def num_classes(self) -> int:
        return 10

