r"""The LRGB dataset classes: :class:`PeptidesFunctional` (Peptides-func from the original LRGB
release, the form the offline mirror holds), :class:`SafeLRGBDataset` (PyG's
:class:`~torch_geometric.datasets.LRGBDataset` with the verified cache) and :func:`load_lrgb`
(any LRGB dataset by name)."""
import ast
import os.path as osp
import pickle
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset, download_url
from torch_geometric.datasets import LRGBDataset

from pyg_grf.datasets.cache import SafeCacheMixin
from pyg_grf.datasets.lrgb.info import LRGB_INFO, SPLITS, lrgb_name
from pyg_grf.datasets.lrgb.smiles import smiles_to_graphs
from pyg_grf.datasets.mirror import build_with_mirror, file_digest, resolve_root


def file_md5(path: str) -> str:
    r"""The md5 sum of the file :obj:`path` (the checksums the LRGB release publishes)."""
    return file_digest(path, 'md5')


def _check_split(split: str, max_graphs: Optional[int]) -> None:
    r"""The split (one of :data:`SPLITS`) and the number of its graphs to keep (:obj:`None`: all)
    that every LRGB loader takes."""
    if split not in SPLITS:
        raise ValueError(f"Expected split to be one of {list(SPLITS)} (got {split!r})")
    if max_graphs is not None and max_graphs < 1:
        raise ValueError(f"Expected max_graphs >= 1 or None (got {max_graphs})")


class PeptidesFunctional(SafeCacheMixin, InMemoryDataset):
    r"""The Peptides-func dataset of the `"Long Range Graph Benchmark"
    <https://arxiv.org/abs/2206.08164>`_ (LRGB): 15,535 peptides as molecular graphs, each with 10
    binary function labels (multi-label classification, metric: average precision).

    Built from the original LRGB release: ``peptide_multi_class_dataset.csv.gz`` (SMILES and
    labels) and the official split ``splits_random_stratified_peptide.pickle``, both checked
    against the LRGB md5 sums. The SMILES become graphs through :func:`ogb.utils.smiles2graph`
    (needs :obj:`rdkit`): :obj:`x` long [N, 9] OGB atom features, :obj:`edge_attr` long [E, 3] OGB
    bond features, :obj:`edge_index` with both directions, :obj:`y` float [1, 10]. The molecules
    are converted over :obj:`num_proc` processes with a progress bar (about a minute for all of
    them on one core, once); the three splits are then cached under ``processed_<hash>/`` (one
    folder per ``pre_transform`` and :obj:`max_graphs`, so different settings keep separate
    caches), in the lossless compact format of :mod:`pyg_grf.datasets.compact` (categorical
    features as ``uint8``, walk-feature start nodes as counts; restored on load, so the graphs
    are bit for bit those of the uncompacted data). With :obj:`max_graphs`, only the first
    :obj:`max_graphs` molecules of each split (in the official split order, before
    ``pre_filter``) are converted and pre-transformed.

    Files are looked up in ``root/peptides-functional/`` (CSV in ``raw/``, the pickle beside
    ``raw/`` as in the LRGB release), copied there from the offline mirror
    (``$PYG_GRF_MIRROR/LRGB/peptides-functional``) when present, and downloaded from the LRGB URLs
    otherwise (unless ``$PYG_GRF_OFFLINE`` is set).

    Args:
        root (str, optional): Root directory. (default: ``<data_root()>/LRGB``)
        split (str, optional): :obj:`"train"`, :obj:`"val"` or :obj:`"test"`.
            (default: :obj:`"train"`)
        transform (callable, optional): A transform applied on every access.
            (default: :obj:`None`)
        pre_transform (callable, optional): A transform applied before saving to disk.
            (default: :obj:`None`)
        pre_filter (callable, optional): A filter applied before saving to disk.
            (default: :obj:`None`)
        force_reload (bool, optional): Whether to re-process the dataset. (default: :obj:`False`)
        max_graphs (int, optional): Keep only the first :obj:`max_graphs` graphs of each split,
            chosen *before* processing (quick runs process only those). (default: :obj:`None`,
            all)
        num_proc (int, optional): Processes that convert SMILES to graphs (the result does not
            depend on it). (default: the CPUs available)
        progress (bool, optional): Show a progress bar while processing. (default: :obj:`True`)

    **STATS:**

    .. list-table::
        :widths: 10 10 10 10 10
        :header-rows: 1

        * - #graphs (train / val / test)
          - #nodes
          - #edges (both directions)
          - #features (node / edge)
          - #tasks
        * - 15,535 (10,873 / 2,331 / 2,331)
          - ~150.94
          - ~307.30
          - 9 / 3
          - 10
    """
    url = ('https://www.dropbox.com/s/ol2v01usvaxbsr8/peptide_multi_class_dataset.csv.gz?dl=1')
    split_url = ('https://www.dropbox.com/s/j4zcnx2eipuo0xz/'
                 'splits_random_stratified_peptide.pickle?dl=1')
    csv_name = 'peptide_multi_class_dataset.csv.gz'
    split_name = 'splits_random_stratified_peptide.pickle'
    md5 = {csv_name: '701eb743e899f4d793f0e13c8fa5a1b4',
           split_name: '5a0114bdadc80b94fc7ae974f13ef061'}
    folder = 'peptides-functional'
    name = 'Peptides-func'

    def __init__(
        self,
        root: Optional[str] = None,
        split: str = 'train',
        transform: Optional[Callable] = None,
        pre_transform: Optional[Callable] = None,
        pre_filter: Optional[Callable] = None,
        force_reload: bool = False,
        max_graphs: Optional[int] = None,
        num_proc: Optional[int] = None,
        progress: bool = True,
    ) -> None:
        _check_split(split, max_graphs)
        if num_proc is not None and num_proc < 1:
            raise ValueError(f"Expected num_proc >= 1 or None (got {num_proc})")
        self.split = split
        self.max_graphs = None if max_graphs is None else int(max_graphs)
        self.num_proc = num_proc
        self.progress = progress
        root = resolve_root(root, 'LRGB')
        self.root = root  # raw_paths needs it before the base constructor runs
        build_with_mirror(lambda: super(PeptidesFunctional, self).__init__(
            root, transform, pre_transform, pre_filter, force_reload=force_reload),
            f'LRGB/{self.folder}', osp.join(root, self.folder), self.raw_paths, self.name)
        self.load(self.processed_paths[SPLITS.index(split)])

    @property
    def raw_dir(self) -> str:
        return osp.join(self.root, self.folder, 'raw')

    def cache_key(self) -> Dict[str, Any]:
        key = super().cache_key()
        max_graphs = getattr(self, 'max_graphs', None)
        if max_graphs is not None:  # full-dataset caches keep the key they always had
            key['max_graphs'] = max_graphs
        return key

    @property
    def cache_parent(self) -> str:
        # One cache per pre_transform / pre_filter (``processed_<hash>`` keyed by their reprs,
        # which show every setting; see SafeCacheMixin): runs with different GRF, RWGNK or
        # Graph-Bridge settings keep their own features and never overwrite each other's.
        return osp.join(self.root, self.folder)

    @property
    def raw_file_names(self) -> List[str]:
        return [self.csv_name, self.split_name]

    @property
    def raw_paths(self) -> List[str]:
        # The LRGB release keeps the split pickle beside raw/; accept it inside raw/ as well.
        split_path = osp.join(self.root, self.folder, self.split_name)
        if not osp.exists(split_path) and osp.exists(osp.join(self.raw_dir, self.split_name)):
            split_path = osp.join(self.raw_dir, self.split_name)
        return [osp.join(self.raw_dir, self.csv_name), split_path]

    @property
    def processed_file_names(self) -> List[str]:
        return [f'{split}.pt' for split in SPLITS]

    def download(self) -> None:
        csv_path, split_path = self.raw_paths
        if not osp.exists(csv_path):
            download_url(self.url, self.raw_dir, filename=self.csv_name)
        if not osp.exists(split_path):
            download_url(self.split_url, osp.dirname(split_path), filename=self.split_name)

    def _check_md5(self, path: str) -> None:
        expected, got = self.md5[osp.basename(path)], file_md5(path)
        if got != expected:
            raise RuntimeError(f"'{path}' has md5 {got}, but the LRGB release has {expected}; "
                               f"delete the file (it is corrupt or not the LRGB one)")

    def process(self) -> None:
        import pandas as pd

        csv_path, split_path = self.raw_paths
        self._check_md5(csv_path)
        self._check_md5(split_path)  # verified before unpickling
        with open(split_path, 'rb') as f:
            split_idx = pickle.load(f)
        rows = {split: [int(i) for i in split_idx[split]][:self.max_graphs] for split in SPLITS}

        df = pd.read_csv(csv_path)
        labels = np.array([ast.literal_eval(s) for s in df['labels']], dtype=np.float32)
        if labels.shape != (len(df), 10):
            raise RuntimeError(f"Expected 10 labels per peptide in '{csv_path}' "
                               f"(got label array of shape {labels.shape})")

        # Only the molecules that are kept are converted (max_graphs before processing).
        needed = sorted(set().union(*rows.values()))
        arrays = smiles_to_graphs(df['smiles'].iloc[needed].tolist(), self.num_proc,
                                  self.progress, desc=f'{self.name}: SMILES to graphs')
        graphs = {}
        for row, (x, edge_index, edge_attr, num_nodes) in zip(needed, arrays):
            graphs[row] = Data(
                x=torch.from_numpy(x).long(),
                edge_index=torch.from_numpy(edge_index).long(),
                edge_attr=torch.from_numpy(edge_attr).long(),
                y=torch.from_numpy(labels[row]).view(1, -1),
                num_nodes=num_nodes,
            )

        for split, path in zip(SPLITS, self.processed_paths):
            data_list = [graphs[i] for i in rows[split]]
            if self.pre_filter is not None:
                data_list = [d for d in data_list if self.pre_filter(d)]
            if self.pre_transform is not None:
                data_list = [self.pre_transform(d) for d in data_list]
            self.save(data_list, path)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({len(self)}, split={self.split!r})'


class SafeLRGBDataset(SafeCacheMixin, LRGBDataset):
    r"""PyG's :class:`~torch_geometric.datasets.LRGBDataset` with the crash-safe, verified cache
    of :class:`~pyg_grf.datasets.cache.SafeCacheMixin` (``root/<name>/processed_<hash>``)."""

    def cache_key(self):
        return dict(super().cache_key(), name=self.name)


def load_lrgb(
    name: str,
    split: str = 'train',
    root: Optional[str] = None,
    transform: Optional[Callable] = None,
    pre_transform: Optional[Callable] = None,
    pre_filter: Optional[Callable] = None,
    force_reload: bool = False,
    max_graphs: Optional[int] = None,
    num_proc: Optional[int] = None,
) -> InMemoryDataset:
    r"""Loads one split of an LRGB dataset: Peptides-func through :class:`PeptidesFunctional`
    (original CSV, in the offline mirror), the others (Peptides-struct, PascalVOC-SP, COCO-SP,
    PCQM-Contact) through PyG's :class:`~torch_geometric.datasets.LRGBDataset`, whose raw files
    are copied from ``$PYG_GRF_MIRROR/LRGB/<pyg name>/raw`` when there, and downloaded otherwise.
    The task, output size and metric of each dataset are in :data:`LRGB_INFO`.

    Args:
        name (str): A key of :data:`LRGB_INFO` (case-insensitive).
        split (str, optional): :obj:`"train"`, :obj:`"val"` or :obj:`"test"`.
            (default: :obj:`"train"`)
        root (str, optional): Root directory. (default: ``<data_root()>/LRGB``)
        transform, pre_transform, pre_filter, force_reload: As in PyG datasets.
        max_graphs (int, optional): Keep the first :obj:`max_graphs` graphs of the split. For
            Peptides-func they are chosen before processing (only they are converted); PyG's
            :class:`~torch_geometric.datasets.LRGBDataset` processes whole files, so the others
            are sliced after loading. (default: :obj:`None`, all)
        num_proc (int, optional): Processes for Peptides-func's SMILES conversion
            (:class:`PeptidesFunctional`); ignored by the others. (default: the CPUs available)
    """
    name = lrgb_name(name)
    _check_split(split, max_graphs)
    if name == 'Peptides-func':
        return PeptidesFunctional(root, split, transform, pre_transform, pre_filter,
                                  force_reload, max_graphs=max_graphs, num_proc=num_proc)

    info = LRGB_INFO[name]
    root = resolve_root(root, 'LRGB')
    folder = osp.join(root, info.pyg_name)
    ext = 'pickle' if info.pyg_name.endswith('-sp') else 'pt'
    raw_paths = [osp.join(folder, 'raw', f'{s}.{ext}') for s in SPLITS]
    hint = ('Only Peptides-func is in the offline mirror (as the original CSV); the other LRGB '
            'datasets need the PyG-format files or network access.')
    dataset = build_with_mirror(
        lambda: SafeLRGBDataset(root, info.pyg_name, split, transform, pre_transform,
                                pre_filter, force_reload=force_reload),
        f'LRGB/{info.pyg_name}', folder, raw_paths, name, hint)
    return dataset if max_graphs is None else dataset[:max_graphs]


__all__ = ['PeptidesFunctional', 'SafeLRGBDataset', 'load_lrgb', 'file_md5']
