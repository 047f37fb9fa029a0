r"""Long Range Graph Benchmark (LRGB, Dwivedi et al., NeurIPS 2022 Datasets and Benchmarks).

* :class:`PeptidesFunctional`: Peptides-func built from the *original* LRGB release (SMILES CSV +
  official split pickle), the form the offline mirror holds.
* :func:`load_lrgb`: any LRGB dataset by name (Peptides-func through
  :class:`PeptidesFunctional`, the others through PyG's
  :class:`~torch_geometric.datasets.LRGBDataset`, which downloads when online).
* :data:`LRGB_INFO`: each dataset's official task, output size, loss and metric.
* :func:`lrgb_standin`: tiny random datasets with the same fields, dtypes and shapes as each LRGB
  dataset, to test the training wiring without data; :func:`write_lrgb_raw_standin` writes them
  as the raw files of PyG's :class:`~torch_geometric.datasets.LRGBDataset`, to test the real
  loading path.
"""
import ast
import hashlib
import multiprocessing as mp
import os
import os.path as osp
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset, download_url
from torch_geometric.datasets import LRGBDataset

from pyg_grf.datasets.cache import SafeCacheMixin
from pyg_grf.datasets.mirror import (
    DatasetNotFoundError,
    data_root,
    download_failed,
    ensure_raw_files,
    missing_files,
)
from pyg_grf.datasets.synthetic import GeneratedDataset

SPLITS = ('train', 'val', 'test')


@dataclass(frozen=True)
class LRGBInfo:
    r"""The official setting of an LRGB dataset (Dwivedi et al., 2022, Table 1 and Sec. 4).

    Attributes:
        name: Canonical name, e.g. :obj:`"Peptides-func"`.
        pyg_name: Name in PyG's :class:`~torch_geometric.datasets.LRGBDataset`.
        level: :obj:`"graph"`, :obj:`"node"` or :obj:`"link"`.
        task: :obj:`"multilabel_classification"`, :obj:`"regression"`,
            :obj:`"multiclass_classification"` or :obj:`"link_prediction"`.
        num_outputs: Outputs per prediction (labels, targets or classes; 1 for links).
        metric: :obj:`"ap"` (average precision, macro over the labels), :obj:`"mae"`,
            :obj:`"macro_f1"` or :obj:`"mrr"` (mean reciprocal rank).
        maximize: Whether a larger metric is better.
        loss: The loss of the reference baselines (:obj:`"bce_with_logits"`, :obj:`"l1"`,
            :obj:`"cross_entropy"`).
        target: The attribute holding the targets (:obj:`"y"`, or :obj:`"edge_label"` with
            :obj:`edge_label_index` for PCQM-Contact).
        num_node_features, node_feature_dtype: Shape [N, F] and dtype of :obj:`x` (long features
            are categorical OGB atom features for the molecular datasets).
        num_edge_features, edge_feature_dtype: Shape [E, F] and dtype of :obj:`edge_attr`.
        num_graphs: Graphs in train / val / test together.
    """
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


LRGB_INFO: Dict[str, LRGBInfo] = {
    'Peptides-func': LRGBInfo('Peptides-func', 'peptides-func', 'graph',
                              'multilabel_classification', 10, 'ap', True, 'bce_with_logits', 'y',
                              9, torch.long, 3, torch.long, 15535),
    'Peptides-struct': LRGBInfo('Peptides-struct', 'peptides-struct', 'graph', 'regression', 11,
                                'mae', False, 'l1', 'y', 9, torch.long, 3, torch.long, 15535),
    'PascalVOC-SP': LRGBInfo('PascalVOC-SP', 'pascalvoc-sp', 'node', 'multiclass_classification',
                             21, 'macro_f1', True, 'cross_entropy', 'y', 14, torch.float, 2,
                             torch.float, 11355),
    'COCO-SP': LRGBInfo('COCO-SP', 'coco-sp', 'node', 'multiclass_classification', 81,
                        'macro_f1', True, 'cross_entropy', 'y', 14, torch.float, 2, torch.float,
                        123286),
    'PCQM-Contact': LRGBInfo('PCQM-Contact', 'pcqm-contact', 'link', 'link_prediction', 1, 'mrr',
                             True, 'cross_entropy', 'edge_label', 9, torch.long, 3, torch.long,
                             529434),
}

_ALIASES = {'peptides-functional': 'Peptides-func', 'peptides-structural': 'Peptides-struct'}


def lrgb_name(name: str) -> str:
    r"""The canonical LRGB name for :obj:`name` (case-insensitive; PyG names accepted)."""
    table = {k.lower(): k for k in LRGB_INFO}
    table.update(_ALIASES)
    key = name.lower() if isinstance(name, str) else name
    if key not in table:
        raise ValueError(f"Unknown LRGB dataset {name!r}; expected one of {list(LRGB_INFO)}")
    return table[key]


def _md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


def _quiet_rdkit() -> None:
    # Pool initializer: rdkit's per-molecule warnings would flood the terminal.
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')


def _smiles_to_arrays(smiles: str) -> tuple:
    r"""One SMILES string as ``(x, edge_index, edge_attr, num_nodes)`` numpy arrays
    (:func:`ogb.utils.smiles2graph`); a top-level function, so worker processes can run it."""
    from ogb.utils import smiles2graph
    g = smiles2graph(smiles)
    return g['node_feat'], g['edge_index'], g['edge_feat'], int(g['num_nodes'])


def default_num_proc() -> int:
    r"""The CPUs this process may use (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return max(1, os.cpu_count() or 1)


class _Progress:
    r"""A progress bar over :obj:`total` items: :mod:`tqdm` when installed, else one plain line
    on stderr about every 10% (and at the end)."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.desc, self.enabled, self.done, self._next = total, desc, enabled, 0, 0
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc)
        self._start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and (self.done >= self._next or self.done == self.total):
            elapsed = time.perf_counter() - self._start
            print(f'{self.desc}: {self.done}/{self.total} ({elapsed:.0f}s)', file=sys.stderr,
                  flush=True)
            self._next = self.done + max(1, self.total // 10)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def smiles_to_graphs(smiles: Sequence[str], num_proc: Optional[int] = None,
                     progress: bool = True, desc: str = 'SMILES to graphs') -> List[tuple]:
    r"""Turns SMILES strings into graphs with :func:`ogb.utils.smiles2graph` (needs
    :obj:`rdkit`), over :obj:`num_proc` worker processes in chunks, in the input order (the result
    does not depend on :obj:`num_proc`), with a progress bar.

    Args:
        smiles (sequence of str): The molecules.
        num_proc (int, optional): Worker processes; ``1`` works in this process.
            (default: :func:`default_num_proc`)
        progress (bool, optional): Show progress (tqdm, else a line on stderr about every 10%).
            (default: :obj:`True`)

    Returns:
        One ``(x, edge_index, edge_attr, num_nodes)`` tuple of numpy arrays per molecule.
    """
    smiles = list(smiles)
    num_proc = default_num_proc() if num_proc is None else int(num_proc)
    if num_proc < 1:
        raise ValueError(f"num_proc must be >= 1, got {num_proc}")
    num_proc = min(num_proc, max(1, len(smiles)))
    bar = _Progress(len(smiles), desc, progress)
    out: List[tuple] = []
    try:
        if num_proc == 1:
            _quiet_rdkit()
            for s in smiles:
                out.append(_smiles_to_arrays(s))
                bar.update()
        else:
            # Fork where available (workers start at once and inherit the imports); a few chunks
            # per worker balance the load; imap keeps the input order.
            methods = mp.get_all_start_methods()
            ctx = mp.get_context('fork' if 'fork' in methods else None)
            chunksize = max(1, min(256, len(smiles) // (8 * num_proc)))
            with ctx.Pool(num_proc, initializer=_quiet_rdkit) as pool:
                for g in pool.imap(_smiles_to_arrays, smiles, chunksize=chunksize):
                    out.append(g)
                    bar.update()
    finally:
        bar.close()
        from rdkit import RDLogger
        RDLogger.EnableLog('rdApp.*')
    return out


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
    caches). With :obj:`max_graphs`, only the first :obj:`max_graphs` molecules of each split (in
    the official split order, before ``pre_filter``) are converted and pre-transformed.

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
        if split not in SPLITS:
            raise ValueError(f"Expected split to be one of {list(SPLITS)} (got {split!r})")
        if max_graphs is not None and max_graphs < 1:
            raise ValueError(f"Expected max_graphs >= 1 or None (got {max_graphs})")
        if num_proc is not None and num_proc < 1:
            raise ValueError(f"Expected num_proc >= 1 or None (got {num_proc})")
        self.split = split
        self.max_graphs = None if max_graphs is None else int(max_graphs)
        self.num_proc = num_proc
        self.progress = progress
        root = osp.abspath(root) if root is not None else osp.join(data_root(), 'LRGB')
        self.root = root  # raw_paths needs it before the base constructor runs
        rel = f'LRGB/{self.folder}'
        missing = ensure_raw_files(rel, osp.join(root, self.folder), self.raw_paths, self.name)
        try:
            super().__init__(root, transform, pre_transform, pre_filter,
                             force_reload=force_reload)
        except Exception as exc:
            if missing and missing_files(self.raw_paths):  # the download failed
                raise download_failed(exc, rel, osp.join(root, self.folder), missing,
                                      self.name) from exc
            raise
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
        expected, got = self.md5[osp.basename(path)], _md5(path)
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
    if split not in SPLITS:
        raise ValueError(f"Expected split to be one of {list(SPLITS)} (got {split!r})")
    if max_graphs is not None and max_graphs < 1:
        raise ValueError(f"Expected max_graphs >= 1 or None (got {max_graphs})")
    if name == 'Peptides-func':
        return PeptidesFunctional(root, split, transform, pre_transform, pre_filter,
                                  force_reload, max_graphs=max_graphs, num_proc=num_proc)

    info = LRGB_INFO[name]
    root = osp.abspath(root) if root is not None else osp.join(data_root(), 'LRGB')
    folder = osp.join(root, info.pyg_name)
    ext = 'pickle' if info.pyg_name.endswith('-sp') else 'pt'
    raw_paths = [osp.join(folder, 'raw', f'{s}.{ext}') for s in SPLITS]
    hint = ('Only Peptides-func is in the offline mirror (as the original CSV); the other LRGB '
            'datasets need the PyG-format files or network access.')
    missing = ensure_raw_files(f'LRGB/{info.pyg_name}', folder, raw_paths, name, hint)
    try:
        dataset = SafeLRGBDataset(root, info.pyg_name, split, transform, pre_transform,
                                  pre_filter, force_reload=force_reload)
    except Exception as exc:
        if missing and missing_files(raw_paths):
            raise download_failed(exc, f'LRGB/{info.pyg_name}', folder, missing, name,
                                  hint) from exc
        raise
    return dataset if max_graphs is None else dataset[:max_graphs]


def _hop_distances(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    # All-pairs hop distances of a small graph ([n, n], n + 1 where unreachable).
    adj = torch.zeros(n, n, dtype=torch.bool)
    adj[edge_index[0], edge_index[1]] = True
    dist = torch.full((n, n), n + 1, dtype=torch.long)
    reach = torch.eye(n, dtype=torch.bool)
    dist[reach] = 0
    for hops in range(1, n):
        reach = reach | (reach.float() @ adj.float()).bool()
        dist[reach & (dist > hops)] = hops
    return dist


def standin_graphs(name: str, num_graphs: int = 8, seed: int = 0) -> List[Data]:
    r"""The graphs of :func:`lrgb_standin` (before any transform), as a list."""
    from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

    info, gen = LRGB_INFO[lrgb_name(name)], torch.Generator().manual_seed(int(seed))
    molecular = info.node_feature_dtype == torch.long
    data_list = []
    while len(data_list) < num_graphs:
        n = int(torch.randint(8, 25, (1, ), generator=gen))
        # A random tree (molecule backbone) plus a few chords, both directions stored.
        parent = (torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long()
        row = torch.cat([torch.arange(1, n), torch.randint(n, (2, ), generator=gen)])
        col = torch.cat([parent, torch.randint(n, (2, ), generator=gen)])
        keep = row != col
        row, col = row[keep], col[keep]
        edge_index = torch.stack([torch.cat([row, col]), torch.cat([col, row])])
        edge_index = torch.unique(edge_index, dim=1)
        E = edge_index.size(1)
        if molecular:
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
            # Link prediction, laid out as LRGB stores PCQM-Contact: the "contacts" (both
            # directions) first, then two negatives per contact from the same source. A learnable
            # synthetic rule: atoms at least 3 bonds apart with the same chirality tag (feature
            # column 1, 5 values). Graphs without a contact are redrawn (LRGB drops such
            # molecules).
            far = _hop_distances(edge_index, n) >= 3
            same = x[:, 1].view(-1, 1) == x[:, 1].view(1, -1)
            pos = (far & same).nonzero().t()
            if pos.size(1) == 0:
                continue
            # For each contact (s, t): two distinct non-contacts of s (self allowed, as in LRGB).
            allowed = ~(far & same)
            keys = torch.rand(pos.size(1), n, generator=gen).masked_fill(~allowed[pos[0]], -1.)
            top, dst = keys.topk(min(2, n), dim=1)
            valid = top >= 0
            neg = torch.stack([pos[0].view(-1, 1).expand_as(dst)[valid], dst[valid]])
            data.edge_label_index = torch.cat([pos, neg], dim=1)
            data.edge_label = torch.cat([torch.ones(pos.size(1), dtype=torch.long),
                                         torch.zeros(neg.size(1), dtype=torch.long)])
        data_list.append(data)
    return data_list


class LRGBStandIn(GeneratedDataset):
    r"""A tiny random dataset with the fields, dtypes and shapes of an LRGB dataset (see
    :func:`lrgb_standin`); the values carry no signal."""

    def __init__(self, name: str, num_graphs: int = 8, seed: int = 0,
                 transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None) -> None:
        self.info = LRGB_INFO[lrgb_name(name)]
        self.name = self.info.name
        if num_graphs < 1:
            raise ValueError(f"Expected num_graphs >= 1 (got {num_graphs})")
        self.num_graphs, self.seed = int(num_graphs), int(seed)
        super().__init__(None, transform, pre_transform)

    @property
    def tag(self) -> str:
        return f'{self.info.pyg_name}_g{self.num_graphs}_s{self.seed}'

    def generate(self) -> List[Data]:
        return standin_graphs(self.info.name, self.num_graphs, self.seed)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({len(self)}, name={self.name!r})'


def lrgb_standin(name: str, num_graphs: int = 8, seed: int = 0,
                 transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None) -> LRGBStandIn:
    r"""A tiny in-memory stand-in for the LRGB dataset :obj:`name`, with the same fields, dtypes
    and feature widths (see :data:`LRGB_INFO`): random molecule-like graphs of 8-24 nodes with
    OGB-range categorical features for the molecular datasets, float features for the
    superpixel ones; :obj:`y` float [1, 10] / [1, 11] for Peptides-func / -struct, long [N] for
    PascalVOC-SP / COCO-SP, :obj:`edge_label_index` [2, L] and :obj:`edge_label` long [L] for
    PCQM-Contact (the positive pairs in both directions, then two negatives per positive from its
    source; positives follow a learnable rule: atoms at least 3 bonds apart with the same
    chirality tag). Deterministic from :obj:`seed`. The stand-in's :obj:`info` attribute is the
    dataset's :class:`LRGBInfo`. :func:`write_lrgb_raw_standin` writes the same graphs as PyG's
    raw files."""
    return LRGBStandIn(name, num_graphs, seed, transform, pre_transform)



def _raw_tuple(info: LRGBInfo, data: Data) -> tuple:
    # One graph as the tuple PyG's LRGBDataset.process() unpacks (see its docstrings).
    if info.level == 'link':
        return (data.x, data.edge_attr, data.edge_index, data.edge_label_index, data.edge_label)
    y = data.y
    if info.pyg_name == 'coco-sp':  # the raw files hold the original, non-contiguous COCO ids
        original = sorted(LRGBDataset.label_remap_coco(None).items(), key=lambda kv: kv[1])
        y = torch.tensor([k for k, _ in original])[y]
    return (data.x, data.edge_attr, data.edge_index, y)


def write_lrgb_raw_standin(name: str, root: Optional[str] = None, num_graphs: int = 8,
                           seed: int = 0, overwrite: bool = False) -> List[str]:
    r"""Writes the graphs of :func:`lrgb_standin` as the *raw* files of PyG's
    :class:`~torch_geometric.datasets.LRGBDataset`, in the layout its ``process()`` reads:
    ``root/<pyg name>/raw/{train,val,test}.pt`` (:func:`torch.save` of a list of tuples) for
    Peptides-func / -struct and PCQM-Contact, ``.pickle`` (:mod:`pickle` of a list of tuples) for
    PascalVOC-SP / COCO-SP. Tuples: ``(x, edge_attr, edge_index, y)``, or
    ``(x, edge_attr, edge_index, edge_label_index, edge_label)`` for PCQM-Contact; COCO-SP labels
    in the original COCO category ids that PyG remaps. :func:`load_lrgb` then runs the real loading
    path (PyG's processing, our cache) on them, without data or network. The split ``i`` (train,
    val, test) uses seed ``seed + i``.

    Args:
        name (str): A key of :data:`LRGB_INFO` (case-insensitive).
        root (str, optional): Root directory. (default: ``<data_root()>/LRGB``)
        num_graphs (int, optional): Graphs per split. (default: :obj:`8`)
        seed (int, optional): Seed of the train split. (default: :obj:`0`)
        overwrite (bool, optional): Replace existing raw files; otherwise they are refused, since
            they may be the real dataset. (default: :obj:`False`)

    Returns:
        The paths written.
    """
    from pyg_grf.datasets.mirror import check_not_in_mirror

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
    for i, path in enumerate(paths):
        graphs = [_raw_tuple(info, d) for d in standin_graphs(info.name, num_graphs, seed + i)]
        if ext == 'pt':
            torch.save(graphs, path)
        else:
            with open(path, 'wb') as f:
                pickle.dump(graphs, f)
    return paths


__all__ = [
    'PeptidesFunctional',
    'load_lrgb',
    'lrgb_standin',
    'lrgb_name',
    'LRGBInfo',
    'LRGB_INFO',
    'LRGBStandIn',
    'standin_graphs',
    'write_lrgb_raw_standin',
    'DatasetNotFoundError',
]
