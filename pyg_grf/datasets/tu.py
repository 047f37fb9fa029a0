r"""TU graph-classification benchmarks (PyG :class:`~torch_geometric.datasets.TUDataset`) through
the offline mirror, with degree features for the datasets that have no node features."""
import os.path as osp
import re
from typing import Callable, Optional

import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.datasets import TUDataset
from torch_geometric.transforms import Compose, OneHotDegree
from torch_geometric.utils import degree

from pyg_grf.datasets.cache import DatasetCacheError, SafeCacheMixin, safe_load
from pyg_grf.datasets.mirror import build_with_mirror, resolve_root

#: TU dataset names: letters, digits, '_' and '-' (no path separators, no '..').
_TU_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$')

#: The TU datasets of the GKAT paper (Choromanski et al., 2022, Sec. 5.2) plus MUTAG; the
#: ``x`` column says whether the dataset ships node features (labels or attributes).
TU_DATASETS = {
    'MUTAG': dict(x=True),
    'PROTEINS': dict(x=True),
    'ENZYMES': dict(x=True),
    'NCI1': dict(x=True),
    'DD': dict(x=True),
    'IMDB-BINARY': dict(x=False),
    'IMDB-MULTI': dict(x=False),
    'REDDIT-BINARY': dict(x=False),
    'REDDIT-MULTI-5K': dict(x=False),
    'COLLAB': dict(x=False),
}


class SafeTUDataset(SafeCacheMixin, TUDataset):
    r"""PyG's :class:`~torch_geometric.datasets.TUDataset` with the crash-safe, verified cache
    of :class:`~pyg_grf.datasets.cache.SafeCacheMixin`: ``root/<NAME>/processed_<hash>``, keyed
    by the name and the configuration of ``pre_transform`` and ``pre_filter``. The processed file
    is read with ``torch.load(weights_only=True)`` only (PyG's own loader falls back to a full
    unpickle, which runs whatever a replaced file holds)."""

    def __init__(self, root: str, name: str, transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False,
                 use_node_attr: bool = False, use_edge_attr: bool = False,
                 cleaned: bool = False) -> None:
        # TUDataset.__init__ minus its loader: download / process as PyG does, then read the
        # file through safe_load.
        self.name = name
        self.cleaned = cleaned
        InMemoryDataset.__init__(self, root, transform, pre_transform, pre_filter,
                                 force_reload=force_reload)
        out = safe_load(self.processed_paths[0])
        if not isinstance(out, tuple) or len(out) not in (3, 4):
            raise DatasetCacheError(f"'{self.processed_paths[0]}' is not a TUDataset cache (got "
                                    f"{type(out).__name__}); delete its folder or pass "
                                    f"force_reload=True")
        data, self.slices, self.sizes = out[:3]
        data_cls = out[3] if len(out) == 4 else Data
        self.data = data_cls.from_dict(data) if isinstance(data, dict) else data
        if self._data.x is not None and not use_node_attr:
            self._data.x = self._data.x[:, self.num_node_attributes:]
        if self._data.edge_attr is not None and not use_edge_attr:
            self._data.edge_attr = self._data.edge_attr[:, self.num_edge_attributes:]

    def cache_key(self):
        return dict(super().cache_key(), name=self.name, cleaned=self.cleaned)


def max_degree(dataset) -> int:
    r"""The largest (out-)degree of a node over all graphs of :obj:`dataset` (transforms are not
    applied)."""
    slices = getattr(dataset, 'slices', None)
    if getattr(dataset, '_indices', None) is None and slices and 'edge_index' in slices:
        # Collated storage keeps per-graph node indices: count (graph, source node) pairs.
        edge_index = dataset._data.edge_index
        if edge_index.numel() == 0:
            return 0
        num_edges = slices['edge_index'].diff()
        graph = torch.repeat_interleave(torch.arange(num_edges.numel()), num_edges)
        key = graph * (int(edge_index[0].max()) + 1) + edge_index[0]
        return int(torch.unique(key, return_counts=True)[1].max())
    out = 0
    for i in range(len(dataset)):
        data = dataset.get(dataset.indices()[i])
        if data.num_edges > 0:
            out = max(out, int(degree(data.edge_index[0], data.num_nodes).max()))
    return out


def load_tu(
    name: str,
    root: Optional[str] = None,
    transform: Optional[Callable] = None,
    pre_transform: Optional[Callable] = None,
    use_degree_features: bool = True,
    force_reload: bool = False,
    **kwargs,
) -> TUDataset:
    r"""Loads a `TU dataset <https://chrsmrrs.github.io/datasets/>`_ as a PyG
    :class:`~torch_geometric.datasets.TUDataset`, copying its raw files from the offline mirror
    (``$PYG_GRF_MIRROR``, layout ``TUDataset/<NAME>/raw/``) into the data root first.

    Datasets without node features (IMDB-BINARY, IMDB-MULTI, REDDIT-BINARY, ...) get one-hot
    node degrees as :obj:`x` when :obj:`use_degree_features` is set: a
    :class:`~torch_geometric.transforms.OneHotDegree` with :obj:`max_degree` equal to the largest
    degree in the dataset, applied on access before :obj:`transform`.

    Args:
        name (str): The dataset name as on the TU site, e.g. :obj:`"MUTAG"`,
            :obj:`"IMDB-BINARY"` (case-insensitive for the names in :obj:`TU_DATASETS`).
        root (str, optional): The PyG root; files go to ``root/<NAME>/raw``.
            (default: ``<data_root()>/TUDataset``)
        transform (callable, optional): A transform applied on every access.
            (default: :obj:`None`)
        pre_transform (callable, optional): A transform applied before saving to disk.
            (default: :obj:`None`)
        use_degree_features (bool, optional): Add one-hot degree features to datasets without
            node features. (default: :obj:`True`)
        force_reload (bool, optional): Whether to re-process the dataset. (default: :obj:`False`)
        **kwargs (optional): Further arguments of :class:`~torch_geometric.datasets.TUDataset`
            (:obj:`use_node_attr`, :obj:`use_edge_attr`, :obj:`pre_filter`).
    """
    canonical = {k.lower(): k for k in TU_DATASETS}
    if not isinstance(name, str) or not _TU_NAME.match(name):
        raise ValueError(f"Expected a TU dataset name such as 'MUTAG' or 'IMDB-BINARY' (letters, "
                         f"digits, '_' and '-' only; no path separators or '..') (got {name!r})")
    name = canonical.get(name.lower(), name)
    if kwargs.get('cleaned', False):
        raise ValueError("'cleaned=True' TU datasets are not supported by the mirror loader")

    root = resolve_root(root, 'TUDataset')
    folder = osp.join(root, name)
    raw_paths = [osp.join(folder, 'raw', f'{name}_{f}.txt') for f in ('A', 'graph_indicator')]
    hint = '' if name in TU_DATASETS else (
        f"'{name}' is not one of the known TU datasets {sorted(TU_DATASETS)}; check the spelling.")
    dataset = build_with_mirror(
        lambda: SafeTUDataset(root, name, transform=transform, pre_transform=pre_transform,
                              force_reload=force_reload, **kwargs),
        f'TUDataset/{name}', folder, raw_paths, name, hint)

    x = dataset._data.x
    if use_degree_features and (x is None or x.numel() == 0):
        deg = OneHotDegree(max_degree(dataset))
        dataset.transform = deg if transform is None else Compose([deg, transform])
    return dataset


__all__ = ['load_tu', 'max_degree', 'TU_DATASETS', 'SafeTUDataset']
