r"""Heterophilous graphs (Platonov et al., 2023): PyG's
:class:`~torch_geometric.datasets.HeterophilousGraphDataset` with the offline mirror."""
import os.path as osp
from typing import Callable, Optional

from torch_geometric.datasets import HeterophilousGraphDataset as PyGHeterophilous

from pyg_grf.datasets.cache import SafeCacheMixin
from pyg_grf.datasets.mirror import data_root

HETEROPHILOUS_DATASETS = ('roman_empire', 'amazon_ratings', 'minesweeper', 'tolokers',
                          'questions')


class HeterophilousGraphDataset(SafeCacheMixin, PyGHeterophilous):
    r"""PyG's :class:`~torch_geometric.datasets.HeterophilousGraphDataset` whose ``download()``
    copies ``HeterophilousGraphDataset/<name>/raw`` from the offline mirror first, with the
    verified cache of :class:`~pyg_grf.datasets.cache.SafeCacheMixin`. One graph whose
    ``train_mask`` / ``val_mask`` / ``test_mask`` are ``[N, 10]``: the ten fixed splits of the
    paper (50 / 25 / 25 %). Arguments as PyG's.

    **STATS (minesweeper):** 10,000 nodes (a 100 x 100 grid), 78,804 directed edges, 7 features,
    2 classes (20 % mines), metric ROC-AUC.
    """
    mirror_folder = 'HeterophilousGraphDataset'


def load_heterophilous(name: str, root: Optional[str] = None,
                       transform: Optional[Callable] = None,
                       pre_transform: Optional[Callable] = None,
                       force_reload: bool = False) -> HeterophilousGraphDataset:
    r"""One of :data:`HETEROPHILOUS_DATASETS` (case-insensitive, ``-`` or ``_``) as a
    :class:`HeterophilousGraphDataset` under :obj:`root` (default:
    ``<data_root()>/HeterophilousGraphDataset``)."""
    key = name.lower().replace('-', '_') if isinstance(name, str) else None
    if key not in HETEROPHILOUS_DATASETS:
        raise ValueError(f"Unknown heterophilous dataset {name!r}; expected one of "
                         f"{list(HETEROPHILOUS_DATASETS)}")
    root = (osp.abspath(root) if root is not None
            else osp.join(data_root(), 'HeterophilousGraphDataset'))
    return HeterophilousGraphDataset(root, key, transform=transform,
                                     pre_transform=pre_transform, force_reload=force_reload)
