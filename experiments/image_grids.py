r"""scikit-learn's digits as graphs of image patches (:class:`DigitsGridDataset`), the GRF paper's
ViT setting (Reid et al. 2024, Sec. 4, Table 1) at CPU scale, and its DataModule
(:class:`DigitsGridDataModule`) for ``experiments/configs/digits_grid_grf.yaml`` and
``experiments/digits_grid.py``. Every image of a batch shares one fixed grid graph
(:func:`pyg_grf.datasets.grid_edge_index`).

Importing this module registers the DataModule for configs
(:func:`~pyg_grf.lightning.specs.register_config_class`); from the command line::

    PYTHONPATH=experiments PYG_GRF_TRUSTED_CLASSES=image_grids \
        pyg-grf fit --config experiments/configs/digits_grid_grf.yaml
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from torch_geometric.data import Data

from pyg_grf.datasets import grid_edge_index, image_patches
from pyg_grf.datasets.synthetic import GeneratedDataset
from pyg_grf.lightning.datamodules import SyntheticDataModule
from pyg_grf.lightning.specs import register_config_class

#: Images in scikit-learn's digits dataset.
NUM_DIGITS = 1797


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


@register_config_class
class DigitsGridDataModule(SyntheticDataModule):
    r""":class:`~pyg_grf.lightning.datamodules.SyntheticDataModule` over
    :class:`DigitsGridDataset` (``task='digits_grid'``; ``num_graphs`` at most 1797 per copy);
    split with ``split_by='source'`` so that the copies of one digit stay in one split."""

    TASKS = {'digits_grid': DigitsGridDataset}

    def __init__(self, task: str = 'digits_grid', **kwargs):
        super().__init__(task=task, **kwargs)


__all__ = ['DigitsGridDataset', 'DigitsGridDataModule', 'NUM_DIGITS']
