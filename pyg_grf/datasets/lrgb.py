r"""Long Range Graph Benchmark (LRGB, Dwivedi et al., NeurIPS 2022 Datasets and Benchmarks) on
PyG's :class:`~torch_geometric.datasets.LRGBDataset`, Peptides-func from its original release (the
form the offline mirror holds), and stand-ins with each dataset's fields to test without data."""
import ast
import multiprocessing as mp
import os
import os.path as osp
import pickle
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset, download_url
from torch_geometric.datasets import LRGBDataset as PyGLRGBDataset
from torch_geometric.utils import to_scipy_sparse_matrix

from pyg_grf.datasets.cache import SafeCacheMixin
from pyg_grf.datasets.mirror import check_not_in_mirror, data_root, file_digest
from pyg_grf.datasets.synthetic import GeneratedDataset

#: The official splits, in the order of the processed files.
SPLITS = ('train', 'val', 'test')


@dataclass(frozen=True)
class LRGBInfo:
    r"""The official setting of an LRGB dataset (Dwivedi et al., 2022, Table 1 and Sec. 4): its
    :obj:`level` (``graph``, ``node``, ``link``), :obj:`metric` (``ap``, ``mae``, ``macro_f1``,
    ``mrr``), the baselines' :obj:`loss` and the :obj:`target` attribute, among others."""
    name: str
    pyg_name: str
    level: str
    task: str
    num_outputs: int
    metric: str
    maximize: bool
    loss: str
    target: str
    num_node_features: int
    node_feature_dtype: torch.dtype
    num_edge_features: int
    edge_feature_dtype: torch.dtype
    num_graphs: int


_L, _F = torch.long, torch.float
LRGB_INFO: Dict[str, LRGBInfo] = {info.name: info for info in (
    LRGBInfo('Peptides-func', 'peptides-func', 'graph', 'multilabel_classification', 10, 'ap',
             True, 'bce_with_logits', 'y', 9, _L, 3, _L, 15535),
    LRGBInfo('Peptides-struct', 'peptides-struct', 'graph', 'regression', 11, 'mae', False, 'l1',
             'y', 9, _L, 3, _L, 15535),
    LRGBInfo('PascalVOC-SP', 'pascalvoc-sp', 'node', 'multiclass_classification', 21, 'macro_f1',
             True, 'cross_entropy', 'y', 14, _F, 2, _F, 11355),
    LRGBInfo('COCO-SP', 'coco-sp', 'node', 'multiclass_classification', 81, 'macro_f1', True,
             'cross_entropy', 'y', 14, _F, 2, _F, 123286),
    LRGBInfo('PCQM-Contact', 'pcqm-contact', 'link', 'link_prediction', 1, 'mrr', True,
             'cross_entropy', 'edge_label', 9, _L, 3, _L, 529434))}


def lrgb_name(name: str) -> str:
    r"""The canonical LRGB name for :obj:`name` (case-insensitive; PyG names accepted)."""
    table = {k.lower(): k for k in LRGB_INFO}
    table.update({i.pyg_name: k for k, i in LRGB_INFO.items()},
                 **{'peptides-functional': 'Peptides-func',
                    'peptides-structural': 'Peptides-struct'})
    key = name.lower() if isinstance(name, str) else name
    if key not in table:
        raise ValueError(f"Unknown LRGB dataset {name!r}; expected one of {list(LRGB_INFO)}")
    return table[key]


def _check_split(split: str, max_graphs: Optional[int]) -> None:
    if split not in SPLITS:
        raise ValueError(f"Expected split to be one of {list(SPLITS)} (got {split!r})")
    if max_graphs is not None and max_graphs < 1:
        raise ValueError(f"Expected max_graphs >= 1 or None (got {max_graphs})")


# SMILES to graphs ------------------------------------------------------------------------------
def _quiet_rdkit() -> None:
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')  # per-molecule warnings would flood the terminal


def _smiles_to_arrays(smiles: str) -> tuple:
    from ogb.utils import smiles2graph
    g = smiles2graph(smiles)
    return g['node_feat'], g['edge_index'], g['edge_feat'], int(g['num_nodes'])


def smiles_to_graphs(smiles: Sequence[str], num_proc: Optional[int] = None,
                     progress: bool = True, desc: str = 'SMILES to graphs') -> List[tuple]:
    r"""One ``(x, edge_index, edge_attr, num_nodes)`` tuple of numpy arrays per SMILES string
    (:func:`ogb.utils.smiles2graph`, needs ``rdkit``), in the input order, over :obj:`num_proc`
    processes (default: the CPUs available; the result does not depend on it), with a
    :mod:`tqdm` progress bar labelled :obj:`desc` when :obj:`progress` is set."""
    from rdkit import RDLogger
    from tqdm.auto import tqdm
    smiles = list(smiles)
    if num_proc is None:
        num_proc = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (
            os.cpu_count() or 1)
    num_proc = int(num_proc)
    if num_proc < 1:
        raise ValueError(f"num_proc must be >= 1, got {num_proc}")
    num_proc = min(num_proc, max(1, len(smiles)))
    # fork where available; a few chunks per worker; imap keeps the order
    ctx = mp.get_context('fork' if 'fork' in mp.get_all_start_methods() else None)
    pool = ctx.Pool(num_proc, initializer=_quiet_rdkit) if num_proc > 1 else None
    try:
        _quiet_rdkit()
        graphs = (map(_smiles_to_arrays, smiles) if pool is None else pool.imap(
            _smiles_to_arrays, smiles, chunksize=max(1, min(256, len(smiles) // (8 * num_proc)))))
        return list(tqdm(graphs, total=len(smiles), desc=desc, disable=not progress))
    finally:
        if pool is not None:
            pool.terminate()
        RDLogger.EnableLog('rdApp.*')


# Datasets --------------------------------------------------------------------------------------
class LRGBDataset(SafeCacheMixin, PyGLRGBDataset):
    r"""PyG's :class:`~torch_geometric.datasets.LRGBDataset` whose ``download()`` copies
    ``LRGB/<name>/raw`` from the offline mirror first, with the verified cache of
    :class:`~pyg_grf.datasets.cache.SafeCacheMixin` (``root/<name>/processed_<hash>``).
    Arguments as PyG's."""
    mirror_folder = 'LRGB'
    not_found_hint = ('Only Peptides-func is in the offline mirror (as the original CSV); the '
                      'other LRGB datasets need the PyG-format files or network access.')


class PeptidesFunctional(LRGBDataset):
    r"""Peptides-func of the `"Long Range Graph Benchmark" <https://arxiv.org/abs/2206.08164>`_
    (peptides with 10 binary function labels each, metric: average precision) from the original
    LRGB release that PyG's preprocessed files were made from:
    ``raw/peptide_multi_class_dataset.csv.gz`` (SMILES, labels) and
    ``raw/splits_random_stratified_peptide.pickle`` (the official split), both checked against
    the LRGB md5 sums before use. :func:`ogb.utils.smiles2graph` (needs ``rdkit``) gives PyG's
    fields: :obj:`x` long [N, 9] OGB atom features, :obj:`edge_attr` long [E, 3] bond features,
    :obj:`edge_index` both directions, :obj:`y` float [1, 10]; one cache per ``pre_transform``
    and :obj:`max_graphs`.

    Args:
        root (str, optional): Root directory. (default: ``<data_root()>/LRGB``)
        split (str): :obj:`"train"`, :obj:`"val"` or :obj:`"test"`.
        transform, pre_transform, pre_filter, force_reload: As in PyG datasets.
        max_graphs (int, optional): Keep only the first :obj:`max_graphs` molecules of each split,
            chosen *before* processing (quick runs convert only those). (default: all)
        num_proc (int, optional): Processes converting SMILES (the result does not depend on
            it). (default: the CPUs available)
        progress (bool): Show a progress bar while processing.

    **STATS:** 15,535 graphs (train / val / test: 10,873 / 2,331 / 2,331) of ~150.94 nodes and
    ~307.30 directed edges on average; 9 node and 3 edge features; 10 tasks.
    """
    url = 'https://www.dropbox.com/s/ol2v01usvaxbsr8/peptide_multi_class_dataset.csv.gz?dl=1'
    split_url = ('https://www.dropbox.com/s/j4zcnx2eipuo0xz/'
                 'splits_random_stratified_peptide.pickle?dl=1')
    csv_name = 'peptide_multi_class_dataset.csv.gz'
    split_name = 'splits_random_stratified_peptide.pickle'
    md5 = {csv_name: '701eb743e899f4d793f0e13c8fa5a1b4',
           split_name: '5a0114bdadc80b94fc7ae974f13ef061'}
    not_found_hint = ''

    def __init__(self, root: Optional[str] = None, split: str = 'train',
                 transform: Optional[Callable] = None, pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False,
                 max_graphs: Optional[int] = None, num_proc: Optional[int] = None,
                 progress: bool = True) -> None:
        _check_split(split, max_graphs)
        if num_proc is not None and num_proc < 1:
            raise ValueError(f"Expected num_proc >= 1 or None (got {num_proc})")
        self.split, self.num_proc, self.progress = split, num_proc, progress
        self.max_graphs = None if max_graphs is None else int(max_graphs)
        root = osp.abspath(root) if root is not None else osp.join(data_root(), 'LRGB')
        super().__init__(root, 'peptides-func', split, transform, pre_transform, pre_filter,
                         force_reload)

    @property
    def raw_file_names(self) -> List[str]:
        return [self.csv_name, self.split_name]

    def mirror_sources(self):
        rel = 'LRGB/peptides-functional'
        return [(f'{rel}/raw', self.raw_dir), (f'{rel}/{self.split_name}', self.raw_dir)]

    def download_from_source(self) -> None:
        for url, name in ((self.url, self.csv_name), (self.split_url, self.split_name)):
            if not osp.exists(osp.join(self.raw_dir, name)):
                download_url(url, self.raw_dir, filename=name)

    def cache_key(self):
        return {} if self.max_graphs is None else {'max_graphs': self.max_graphs}

    def process(self) -> None:
        import pandas as pd
        csv_path, split_path = self.raw_paths
        for path in self.raw_paths:  # verified before unpickling
            expected, got = self.md5[osp.basename(path)], file_digest(path, 'md5')
            if got != expected:
                raise RuntimeError(f"'{path}' has md5 {got}, but the LRGB release has "
                                   f"{expected}; delete the file (it is corrupt or not the "
                                   f"LRGB one)")
        with open(split_path, 'rb') as f:
            split_idx = pickle.load(f)
        rows = {s: [int(i) for i in split_idx[s]][:self.max_graphs] for s in SPLITS}
        df = pd.read_csv(csv_path)
        labels = np.array([ast.literal_eval(s) for s in df['labels']], dtype=np.float32)
        if labels.shape != (len(df), 10):
            raise RuntimeError(f"Expected 10 labels per peptide in '{csv_path}' (got a label "
                               f"array of shape {labels.shape})")
        needed = sorted(set().union(*rows.values()))  # only the molecules that are kept
        arrays = smiles_to_graphs(df['smiles'].iloc[needed].tolist(), self.num_proc,
                                  self.progress, desc='Peptides-func: SMILES to graphs')
        graphs = {row: Data(x=torch.from_numpy(x).long(),
                            edge_index=torch.from_numpy(edge_index).long(),
                            edge_attr=torch.from_numpy(edge_attr).long(),
                            y=torch.from_numpy(labels[row]).view(1, -1), num_nodes=num_nodes)
                  for row, (x, edge_index, edge_attr, num_nodes) in zip(needed, arrays)}
        for split, path in zip(SPLITS, self.processed_paths):
            self.save(self.pre_process([graphs[i] for i in rows[split]]), path)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({len(self)}, split={self.split!r})'


def load_lrgb(name: str, split: str = 'train', root: Optional[str] = None,
              transform: Optional[Callable] = None, pre_transform: Optional[Callable] = None,
              pre_filter: Optional[Callable] = None, force_reload: bool = False,
              max_graphs: Optional[int] = None, num_proc: Optional[int] = None
              ) -> InMemoryDataset:
    r"""One split of an LRGB dataset (a key of :data:`LRGB_INFO`, case-insensitive):
    :class:`PeptidesFunctional` for Peptides-func, :class:`LRGBDataset` for the others, under
    :obj:`root` (default: ``<data_root()>/LRGB``). :obj:`max_graphs` keeps the first graphs of
    the split (Peptides-func: before processing; the others: sliced after loading);
    :obj:`num_proc` is Peptides-func's SMILES conversion."""
    name = lrgb_name(name)
    _check_split(split, max_graphs)
    if name == 'Peptides-func':
        return PeptidesFunctional(root, split, transform, pre_transform, pre_filter,
                                  force_reload, max_graphs=max_graphs, num_proc=num_proc)
    root = osp.abspath(root) if root is not None else osp.join(data_root(), 'LRGB')
    dataset = LRGBDataset(root, LRGB_INFO[name].pyg_name, split, transform, pre_transform,
                          pre_filter, force_reload=force_reload)
    return dataset if max_graphs is None else dataset[:max_graphs]


# Stand-ins -------------------------------------------------------------------------------------
def standin_graphs(name: str, num_graphs: int = 8, seed: int = 0) -> List[Data]:
    r"""The graphs of :func:`lrgb_standin` (before any transform)."""
    from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims
    from scipy.sparse.csgraph import shortest_path
    info, gen = LRGB_INFO[lrgb_name(name)], torch.Generator().manual_seed(int(seed))
    data_list: List[Data] = []
    while len(data_list) < num_graphs:
        n = int(torch.randint(8, 25, (1, ), generator=gen))
        # A random tree (molecule backbone) plus a few chords, both directions stored.
        parent = (torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long()
        row = torch.cat([torch.arange(1, n), torch.randint(n, (2, ), generator=gen)])
        col = torch.cat([parent, torch.randint(n, (2, ), generator=gen)])
        row, col = row[row != col], col[row != col]
        edge_index = torch.stack([torch.cat([row, col]), torch.cat([col, row])]).unique(dim=1)
        E = edge_index.size(1)
        if info.node_feature_dtype == torch.long:  # molecular: OGB categorical features
            x = torch.stack([torch.randint(d, (n, ), generator=gen)
                             for d in get_atom_feature_dims()], dim=1)
            edge_attr = torch.stack([torch.randint(d, (E, ), generator=gen)
                                     for d in get_bond_feature_dims()], dim=1)
        else:
            x = torch.rand(n, info.num_node_features, generator=gen)
            edge_attr = torch.rand(E, info.num_edge_features, generator=gen)
        data = Data(x=x, edge_index=edge_index, edge_attr=edge_attr)
        if info.task == 'multilabel_classification':
            data.y = torch.randint(2, (1, info.num_outputs), generator=gen).float()
        elif info.task == 'regression':
            data.y = torch.randn(1, info.num_outputs, generator=gen)
        elif info.task == 'multiclass_classification':
            data.y = torch.randint(info.num_outputs, (n, ), generator=gen)
        else:
            # Link prediction as LRGB stores PCQM-Contact: the contacts (both directions), then
            # two negatives per contact from its source. A learnable rule: atoms at least 3 bonds
            # apart with the same chirality tag (feature column 1). Graphs without a contact are
            # redrawn (LRGB drops such molecules).
            adj = to_scipy_sparse_matrix(edge_index, num_nodes=n).tocsr()
            hops = shortest_path(adj, unweighted=True)
            pos_mask = (torch.from_numpy(hops) >= 3) & (x[:, 1].view(-1, 1) == x[:, 1])
            pos = pos_mask.nonzero().t()
            if pos.size(1) == 0:
                continue
            keys = torch.rand(pos.size(1), n, generator=gen).masked_fill(pos_mask[pos[0]], -1.)
            top, dst = keys.topk(min(2, n), dim=1)
            neg = torch.stack([pos[0].view(-1, 1).expand_as(dst)[top >= 0], dst[top >= 0]])
            data.edge_label_index = torch.cat([pos, neg], dim=1)
            data.edge_label = torch.cat([torch.ones(pos.size(1), dtype=torch.long),
                                         torch.zeros(neg.size(1), dtype=torch.long)])
        data_list.append(data)
    return data_list


class LRGBStandIn(GeneratedDataset):
    r"""A tiny in-memory stand-in for the LRGB dataset :obj:`name` with its fields, dtypes and
    widths (:data:`LRGB_INFO`), values without signal: molecule-like random graphs of 8-24 nodes
    (OGB-range categorical features for the molecular datasets, float ones for the superpixel
    ones); :obj:`y` float [1, 10] / [1, 11] (Peptides), long [N] (superpixels), or
    :obj:`edge_label_index` [2, L] and :obj:`edge_label` long [L] (PCQM-Contact: contacts both
    ways, then two negatives per contact). Deterministic from :obj:`seed`; :obj:`info` is the
    dataset's :class:`LRGBInfo`."""

    def __init__(self, name: str, num_graphs: int = 8, seed: int = 0,
                 transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None) -> None:
        self.info = LRGB_INFO[lrgb_name(name)]
        self.name = self.info.name
        if num_graphs < 1:
            raise ValueError(f"Expected num_graphs >= 1 (got {num_graphs})")
        self.num_graphs, self.seed = int(num_graphs), int(seed)
        super().__init__(None, transform, pre_transform)

    def generate(self) -> List[Data]:
        return standin_graphs(self.info.name, self.num_graphs, self.seed)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({len(self)}, name={self.name!r})'


lrgb_standin = LRGBStandIn


def write_lrgb_raw_standin(name: str, root: Optional[str] = None, num_graphs: int = 8,
                           seed: int = 0, overwrite: bool = False) -> List[str]:
    r"""Writes the graphs of :func:`lrgb_standin` (split ``i`` with seed ``seed + i``) as the raw
    files PyG's :class:`~torch_geometric.datasets.LRGBDataset` reads,
    ``root/<pyg name>/raw/{train,val,test}.pt`` (``.pickle`` for the superpixel datasets; COCO-SP
    labels as the original COCO ids PyG remaps), so that :func:`load_lrgb` runs the real loading
    path without data or network. Existing raw files are refused unless :obj:`overwrite` (they
    may be the real dataset). :obj:`root` defaults to ``<data_root()>/LRGB``. Returns the paths."""
    info = LRGB_INFO[lrgb_name(name)]
    root = osp.abspath(root) if root is not None else osp.join(data_root(), 'LRGB')
    raw_dir = osp.join(root, info.pyg_name, 'raw')
    check_not_in_mirror(raw_dir)
    ext = 'pickle' if info.pyg_name.endswith('-sp') else 'pt'
    paths = [osp.join(raw_dir, f'{split}.{ext}') for split in SPLITS]
    existing = [p for p in paths if osp.exists(p)]
    if existing and not overwrite:
        raise FileExistsError(f"Refusing to overwrite the raw files {existing} (they may be the "
                              f"real {info.name} dataset); pass overwrite=True or another root")
    os.makedirs(raw_dir, exist_ok=True)
    coco = sorted(PyGLRGBDataset.label_remap_coco(None).items(), key=lambda kv: kv[1])
    for i, path in enumerate(paths):
        graphs = []
        for d in standin_graphs(info.name, num_graphs, seed + i):
            if info.level == 'link':
                graphs.append((d.x, d.edge_attr, d.edge_index, d.edge_label_index, d.edge_label))
            else:
                y = torch.tensor([k for k, _ in coco])[d.y] if info.name == 'COCO-SP' else d.y
                graphs.append((d.x, d.edge_attr, d.edge_index, y))
        if ext == 'pt':
            torch.save(graphs, path)
        else:
            with open(path, 'wb') as f:
                pickle.dump(graphs, f)
    return paths

