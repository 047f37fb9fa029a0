r"""TU graph-classification benchmarks: PyG's :class:`~torch_geometric.datasets.TUDataset` with the
offline mirror and the safe cache, and degree features for the datasets without node features."""
import os.path as osp
import re
from typing import Callable, Optional

import torch
from torch_geometric.data import InMemoryDataset
from torch_geometric.datasets import TUDataset as PyGTUDataset
from torch_geometric.transforms import Compose, OneHotDegree

from pyg_grf.datasets.cache import DatasetCacheError, SafeCacheMixin, safe_load
from pyg_grf.datasets.mirror import data_root

#: The TU datasets of the GKAT paper (Choromanski et al., 2022, Sec. 5.2) plus MUTAG, and whether
#: each ships node features (labels or attributes).
TU_DATASETS = {'MUTAG': True, 'PROTEINS': True, 'ENZYMES': True, 'NCI1': True, 'DD': True,
               'IMDB-BINARY': False, 'IMDB-MULTI': False, 'REDDIT-BINARY': False,
               'REDDIT-MULTI-5K': False, 'COLLAB': False}
_TU_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$')  # no path separators, no '..'


class TUDataset(SafeCacheMixin, PyGTUDataset):
    r"""PyG's :class:`~torch_geometric.datasets.TUDataset` whose ``download()`` copies
    ``TUDataset/<NAME>/raw`` from the offline mirror first, with the verified cache of
    :class:`~pyg_grf.datasets.cache.SafeCacheMixin` (``root/<NAME>/processed_<hash>``), read with
    ``torch.load(weights_only=True)`` only. Arguments as PyG's."""
    mirror_folder = 'TUDataset'

    def __init__(self, root: str, name: str, transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False,
                 use_node_attr: bool = False, use_edge_attr: bool = False,
                 cleaned: bool = False) -> None:
        if not isinstance(name, str) or not _TU_NAME.match(name):
            raise ValueError(f"Expected a TU dataset name such as 'MUTAG' or 'IMDB-BINARY' "
                             f"(letters, digits, '_' and '-' only; no path separators or '..') "
                             f"(got {name!r})")
        if cleaned:
            raise ValueError("'cleaned=True' TU datasets are not in the mirror nor supported")
        self.name = {k.lower(): k for k in TU_DATASETS}.get(name.lower(), name)
        self.cleaned = False
        if self.name not in TU_DATASETS:
            self.not_found_hint = (f"'{self.name}' is not one of the known TU datasets "
                                   f"{sorted(TU_DATASETS)}; check the spelling.")
        # TUDataset.__init__ minus its loader, which falls back to a full unpickle.
        InMemoryDataset.__init__(self, root, transform, pre_transform, pre_filter,
                                 force_reload=force_reload)
        out = safe_load(self.processed_paths[0])
        if not isinstance(out, tuple) or len(out) != 4 or not isinstance(out[0], dict):
            raise DatasetCacheError(f"'{self.processed_paths[0]}' is not a TUDataset cache; "
                                    f"delete its folder or pass force_reload=True")
        data, self.slices, self.sizes, data_cls = out
        self.data = data_cls.from_dict(data)
        if self._data.x is not None and not use_node_attr:
            self._data.x = self._data.x[:, self.num_node_attributes:]
        if self._data.edge_attr is not None and not use_edge_attr:
            self._data.edge_attr = self._data.edge_attr[:, self.num_edge_attributes:]


def max_degree(dataset: InMemoryDataset) -> int:
    r"""The largest out-degree of a node over all graphs of the collated :obj:`dataset`."""
    edge_index, counts = dataset._data.edge_index, dataset.slices['edge_index'].diff()
    if edge_index.numel() == 0:
        return 0
    graph = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    key = graph * (int(edge_index[0].max()) + 1) + edge_index[0]  # (graph, source node)
    return int(torch.unique(key, return_counts=True)[1].max())


def load_tu(name: str, root: Optional[str] = None, transform: Optional[Callable] = None,
            pre_transform: Optional[Callable] = None, use_degree_features: bool = True,
            force_reload: bool = False, **kwargs) -> TUDataset:
    r"""A `TU dataset <https://chrsmrrs.github.io/datasets/>`_ :obj:`name` (:class:`TUDataset`,
    names of :data:`TU_DATASETS` case-insensitive) under :obj:`root` (default:
    ``<data_root()>/TUDataset``); :obj:`kwargs` go to :class:`TUDataset`. Datasets without node
    features (IMDB-BINARY, ...) get one-hot degrees as :obj:`x` if :obj:`use_degree_features`: a
    :class:`~torch_geometric.transforms.OneHotDegree` up to the largest degree of the dataset,
    applied on access before :obj:`transform`."""
    root = osp.abspath(root) if root is not None else osp.join(data_root(), 'TUDataset')
    dataset = TUDataset(root, name, transform=transform, pre_transform=pre_transform,
                        force_reload=force_reload, **kwargs)
    x = dataset._data.x
    if use_degree_features and (x is None or x.numel() == 0):
        deg = OneHotDegree(max_degree(dataset))
        dataset.transform = deg if transform is None else Compose([deg, transform])
    return dataset

