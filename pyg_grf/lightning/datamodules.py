r"""LightningDataModules for the datasets of :mod:`pyg_grf.datasets`.

Every module takes a ``pre_transform`` (applied once when the dataset is processed, then cached
on disk: the place for :class:`~pyg_grf.transforms.AddGraphRandomFeatures`, so walks are sampled
once) and a ``transform`` (applied on every access). Both may be one transform or a list, which is
composed. When the cached ``processed/`` data was made with another ``pre_transform`` (PyG
compares their ``repr``), it is rebuilt instead of silently reused.

Data is loaded in :meth:`prepare_data` (once per node: processing and caching) and
:meth:`setup` (every process), never in ``__init__``. Training loaders shuffle with
:class:`EpochSeededRandomSampler`, a function of ``(seed, epoch)`` only, so a run resumed from a
checkpoint sees the same batches as an uninterrupted one.
"""
from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os.path as osp
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import lightning.pytorch as pl
import torch
from torch.utils.data import RandomSampler
from torch_geometric.transforms import BaseTransform, Compose

from pyg_grf.loader import DataLoader, NodePartLoader, check_part_args
from pyg_grf.transforms.standardize import Standardize

TransformArg = Optional[Union[BaseTransform, List[BaseTransform]]]


def _dataset_api(name: str):
    r"""``pyg_grf.datasets.<name>``, looked up when called (so that a patched name is used)."""
    return getattr(importlib.import_module('pyg_grf.datasets'), name)


def _compose(transform: TransformArg) -> Optional[Callable]:
    if not isinstance(transform, (list, tuple)):
        return transform
    if not transform:
        return None
    return transform[0] if len(transform) == 1 else Compose(list(transform))


def _load_fresh(factory: Callable[..., Any], **kwargs: Any):
    r"""Calls ``factory(**kwargs)``; if PyG reports that the cached data was processed with a
    different ``pre_transform`` or ``pre_filter``, processes again (``force_reload=True``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        dataset = factory(**kwargs)
    stale = False
    for w in caught:
        message = str(w.message)
        if 'argument differs from the one used in the pre-processed' in message:
            stale = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if stale:
        warnings.warn(f"Cached data of {factory.__name__}({kwargs.get('name', '')}) was made with "
                      f"another pre_transform/pre_filter; processing it again", stacklevel=2)
        dataset = factory(**kwargs, force_reload=True)
    return dataset


class EpochSeededRandomSampler(RandomSampler):
    r"""Shuffles with a permutation that depends only on ``(seed, epoch)``; Lightning calls
    :meth:`set_epoch` before every training epoch. Subclasses :class:`RandomSampler`, so under DDP
    Lightning replaces it with a shuffling
    :class:`~torch.utils.data.distributed.DistributedSampler`.

    Args:
        data_source (Sized): the dataset.
        seed (int): base seed (default: :obj:`0`).
    """

    def __init__(self, data_source, seed: int = 0):
        super().__init__(data_source)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.data_source)


class _TrainLoader(DataLoader):
    r"""The training loader, whose iterator starts torch's at the first batch, not at ``iter()``.

    Lightning calls ``iter()`` on the training loader before it sets the sampler's epoch, and a
    run resumed from a checkpoint trains its first epoch on that iterator. With workers, torch's
    iterator takes its first indices from the sampler as soon as it is made, so that epoch would
    be shuffled with another epoch's permutation.
    """

    def __iter__(self):
        yield from super().__iter__()


class _DatasetDataModule(pl.LightningDataModule):
    r"""What every DataModule here shares: the composed :obj:`pre_transform` and
    :obj:`transform`, the root, the loader workers, and the dataset, loaded by
    :meth:`load_dataset` in :meth:`prepare_data` (once per node) and :meth:`setup` (every
    process), whose :attr:`num_features` and :attr:`num_classes` models are built from."""

    def __init__(self, pre_transform: TransformArg = None, transform: TransformArg = None,
                 root: Optional[str] = None, num_workers: int = 0):
        super().__init__()
        self.num_workers = num_workers
        self.pre_transform = _compose(pre_transform)
        self.transform = _compose(transform)
        self.root = root
        self.dataset = None

    def load_dataset(self):
        raise NotImplementedError

    def prepare_data(self) -> None:
        self.load_dataset()  # process and cache once per node

    def setup(self, stage: Optional[str] = None) -> None:
        if self.dataset is None:
            self.dataset = self.load_dataset()

    def _described_dataset(self):
        r"""The dataset whose :obj:`num_features` and :obj:`num_classes` describe the data."""
        return self.dataset

    @property
    def num_features(self) -> int:
        self.setup()
        return self._described_dataset().num_features

    @property
    def num_classes(self) -> int:
        self.setup()
        return self._described_dataset().num_classes


def _trained_model(dm) -> Optional[torch.nn.Module]:
    # the model of the LightningModule being trained, whose attention plans the loader builds
    trainer = getattr(dm, 'trainer', None)
    model = getattr(getattr(trainer, 'lightning_module', None), 'model', None)
    return model if isinstance(model, torch.nn.Module) else None


class GraphDataModule(_DatasetDataModule):
    r"""Base of the graph-level DataModules: subclasses implement :meth:`load_dataset` (build or
    load the dataset, cached) and :meth:`split` (train / val / test subsets).

    Args:
        batch_size (int, optional): graphs per batch (default: :obj:`32`).
        num_workers (int, optional): loader workers (default: :obj:`1`). The loader builds
            every batch's attention plans for the model being trained
            (:class:`pyg_grf.loader.DataLoader`); with workers they are built beside the
            training step, not in it (:obj:`0`: in the training process). A split of one
            batch is loaded without workers (nothing to overlap). Workers start anew every
            epoch (so that a resumed run equals an uninterrupted one), which costs more than
            they save on a tiny dataset: MUTAG trains 1.2x faster with :obj:`0`, PROTEINS
            1.3x slower (``docs/speed.md``).
        pre_transform (BaseTransform or list, optional): applied once, cached
            (default: :obj:`None`).
        transform (BaseTransform or list, optional): applied on access (default: :obj:`None`).
        root (str, optional): dataset root (default: under ``$PYG_GRF_DATA`` / ``./datasets``).
        seed (int, optional): seed of the training shuffle (default: :obj:`0`).
        pin_memory (bool, optional): loader option (default: :obj:`False`).
        standardize (list of str, optional): attributes standardised per column with the
            training split's statistics (:class:`~pyg_grf.transforms.Standardize`, kept as
            :attr:`standardizer`), e.g. ``['x', 'y']`` for a regression (default: :obj:`None`).
    """

    def __init__(self, batch_size: int = 32, num_workers: int = 1,
                 pre_transform: TransformArg = None, transform: TransformArg = None,
                 root: Optional[str] = None, seed: int = 0, pin_memory: bool = False,
                 standardize: Optional[List[str]] = None):
        super().__init__(pre_transform, transform, root, num_workers)
        self.standardizer = Standardize(standardize) if standardize else None
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.seed = seed
        self.pin_memory = pin_memory
        self.train_dataset = self.val_dataset = self.test_dataset = None

    # To implement: load_dataset (of the base) and split ------------------------------------

    def split(self, dataset) -> Tuple[Any, Any, Any]:
        raise NotImplementedError

    # Lightning hooks -----------------------------------------------------------------------

    def setup(self, stage: Optional[str] = None) -> None:
        if self.dataset is None:
            super().setup(stage)
            splits = self.split(self.dataset)
            if self.standardizer is not None:  # training statistics, applied before transform
                self.standardizer.fit(splits[0])
                for part in splits:
                    part.transform = _compose([self.standardizer, *filter(None, [part.transform])])
            self.train_dataset, self.val_dataset, self.test_dataset = splits

    def _loader(self, dataset, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{self.__class__.__name__}: call setup() before asking for a "
                               f"dataloader")
        sampler = EpochSeededRandomSampler(dataset, self.seed) if train else None
        # the loader builds each batch's attention plans for the model being trained
        # (pyg_grf.loader), in its workers when there are any, so that the training step
        # only runs the layers; a loader of one batch has nothing to overlap (the step waits
        # for it anyway), so its worker, forked every epoch, would only add its start
        workers = self.num_workers if len(dataset) > self.batch_size else 0
        return (_TrainLoader if train else DataLoader)(
            dataset, batch_size=self.batch_size, sampler=sampler, shuffle=False,
            num_workers=workers, pin_memory=self.pin_memory,
            model=_trained_model(self))

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, False)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(batch_size={self.batch_size}, '
                f'pre_transform={self.pre_transform}, transform={self.transform})')


def _random_split(n: int, fractions: Sequence[float], seed: int):
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"split must be three non-negative fractions (train, val, test) that sum "
                         f"to 1, got {tuple(fractions)}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_train = int(round(fractions[0] * n))
    n_val = int(round(fractions[1] * n))
    return perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]


def _transform_key(pre_transform) -> str:
    # Cache generated datasets per pre_transform so different GRF settings never collide: its
    # full configuration, not only its repr (which may hide settings).
    from pyg_grf.datasets.cache import describe
    text = repr(pre_transform) if pre_transform is not None else 'none'
    text += json.dumps(describe(pre_transform), sort_keys=True, default=str)
    return 'pre_' + hashlib.sha1(text.encode()).hexdigest()[:10]


class SyntheticDataModule(GraphDataModule):
    r"""The synthetic GKAT tasks (FTFI paper, Sec. 5.1): :class:`~pyg_grf.datasets.MotifDataset`
    (``task='motifs'``, does the graph contain the motif) or
    :class:`~pyg_grf.datasets.InducedCycleDataset` (``task='induced_cycles'``). Generated
    deterministically from ``data_seed`` and split at random from ``split_seed``; needs no
    download. A subclass serves other generated datasets through :attr:`TASKS` (task name to
    dataset class, or its name in :mod:`pyg_grf.datasets`), as the experiments' digit grids and
    point clouds do (``experiments/image_grids.py``, ``experiments/point_clouds.py``).

    Args:
        task (str, optional): ``'motifs'`` or ``'induced_cycles'`` (default: :obj:`'motifs'`).
        num_graphs (int, optional): dataset size (default: :obj:`1024`).
        split (tuple, optional): train / val / test fractions (default: :obj:`(0.8, 0.1, 0.1)`).
        data_seed (int, optional): generator seed (default: :obj:`0`).
        split_seed (int, optional): split seed (default: :obj:`0`).
        dataset_kwargs (dict, optional): more dataset options, e.g. ``{'motif': 'caveman',
            'num_nodes': 100, 'features': 'neighbor_degrees'}`` (default: :obj:`None`).
        cache (bool, optional): cache the processed dataset on disk under ``root`` (one folder
            per ``pre_transform``) (default: :obj:`True`).
        split_by (str, optional): a per-graph attribute (``[1]`` integer) whose groups stay
            together: the split is drawn over the groups, e.g. ``'source'`` so that the
            augmented copies of one image never land in different splits (default:
            :obj:`None`, graphs split independently).
        **kwargs: of :class:`GraphDataModule`.
    """

    #: Task name to dataset class (or its name in :mod:`pyg_grf.datasets`).
    TASKS: Dict[str, Any] = {'motifs': 'MotifDataset', 'induced_cycles': 'InducedCycleDataset'}
    #: The dataset argument that takes ``num_graphs``, where it is not ``num_graphs``.
    _SIZE_ARG: Dict[str, str] = {}

    def __init__(self, task: str = 'motifs', num_graphs: int = 1024,
                 split: Tuple[float, float, float] = (0.8, 0.1, 0.1), data_seed: int = 0,
                 split_seed: int = 0, dataset_kwargs: Optional[Dict[str, Any]] = None,
                 cache: bool = True, batch_size: int = 32, num_workers: int = 1,
                 pre_transform: TransformArg = None, transform: TransformArg = None,
                 root: Optional[str] = None, seed: int = 0, pin_memory: bool = False,
                 split_by: Optional[str] = None, standardize: Optional[List[str]] = None):
        super().__init__(batch_size, num_workers, pre_transform, transform, root, seed,
                         pin_memory, standardize)
        self.split_by = split_by
        if task not in self.TASKS:
            raise ValueError(f"task must be one of {sorted(self.TASKS)}, got '{task}'")
        self.task = task
        self.num_graphs = num_graphs
        self.split_fractions = tuple(split)
        _random_split(2, self.split_fractions, 0)  # validates
        self.data_seed = data_seed
        self.split_seed = split_seed
        self.dataset_kwargs = dict(dataset_kwargs or {})
        self.cache = cache

    def load_dataset(self):
        cls = self.TASKS[self.task]
        cls = _dataset_api(cls) if isinstance(cls, str) else cls
        root = None
        if self.cache:
            root = osp.join(self.root or osp.join(_dataset_api('data_root')(), 'synthetic'),
                            _transform_key(self.pre_transform))
        size = {self._SIZE_ARG.get(self.task, 'num_graphs'): self.num_graphs}
        return _load_fresh(cls, root=root, **size, seed=self.data_seed,
                           transform=self.transform, pre_transform=self.pre_transform,
                           **self.dataset_kwargs)

    def prepare_data(self) -> None:
        # Without a disk cache there is nothing to prepare once per node, and processing here
        # would advance a seeded pre_transform's generator on local rank 0 only: every rank
        # then drew other walks for the same graphs in setup().
        if self.cache:
            super().prepare_data()

    def split(self, dataset):
        if self.split_by is None:
            idx = _random_split(len(dataset), self.split_fractions, self.split_seed)
            return tuple(dataset[i] for i in idx)
        groups = getattr(dataset._data, self.split_by, None) if len(dataset) else None
        if groups is None or groups.numel() != len(dataset):
            raise ValueError(f"split_by={self.split_by!r} needs one '{self.split_by}' value per "
                             f"graph of {type(dataset).__name__}, got "
                             f"{None if groups is None else tuple(groups.shape)}")
        uniq, inv = torch.unique(groups.view(-1), return_inverse=True)
        parts = _random_split(uniq.numel(), self.split_fractions, self.split_seed)
        which = torch.empty(uniq.numel(), dtype=torch.long)
        for k, part in enumerate(parts):
            which[part] = k
        return tuple(dataset[(which[inv] == k).nonzero().view(-1)] for k in range(3))


class TUDataModule(GraphDataModule):
    r"""A TU dataset (:func:`~pyg_grf.datasets.load_tu`, offline mirror aware) with the
    model-assessment splits of Errica et al. (2020) (:func:`~pyg_grf.datasets.errica_splits`):
    ``fold`` selects the outer test fold, a stratified holdout of the rest validates.

    Args:
        name (str): e.g. ``'MUTAG'``, ``'PROTEINS'``.
        fold (int, optional): outer fold, ``0 <= fold < num_folds`` (default: :obj:`0`).
        num_folds (int, optional): outer folds (default: :obj:`10`).
        inner_holdout (float, optional): validation fraction of the outer training set
            (default: :obj:`0.1`).
        split_seed (int, optional): seed of the folds (default: :obj:`0`).
        use_degree_features (bool, optional): one-hot degrees for featureless datasets
            (default: :obj:`True`).
        dataset_kwargs (dict, optional): more :func:`load_tu` options (e.g.
            ``{'use_node_attr': True}``) (default: :obj:`None`).
        **kwargs: of :class:`GraphDataModule`.
    """

    def __init__(self, name: str, fold: int = 0, num_folds: int = 10,
                 inner_holdout: float = 0.1, split_seed: int = 0,
                 use_degree_features: bool = True, dataset_kwargs: Optional[Dict[str, Any]] = None,
                 batch_size: int = 32, num_workers: int = 1, pre_transform: TransformArg = None,
                 transform: TransformArg = None, root: Optional[str] = None, seed: int = 0,
                 pin_memory: bool = False):
        super().__init__(batch_size, num_workers, pre_transform, transform, root, seed,
                         pin_memory)
        if not 0 <= fold < num_folds:
            raise ValueError(f"fold must lie in [0, {num_folds}), got {fold}")
        self.name = name
        self.fold = fold
        self.num_folds = num_folds
        self.inner_holdout = inner_holdout
        self.split_seed = split_seed
        self.use_degree_features = use_degree_features
        self.dataset_kwargs = dict(dataset_kwargs or {})

    def load_dataset(self):
        load_tu = _dataset_api('load_tu')
        return _load_fresh(load_tu, name=self.name, root=self.root, transform=self.transform,
                           pre_transform=self.pre_transform,
                           use_degree_features=self.use_degree_features, **self.dataset_kwargs)

    def split(self, dataset):
        errica_splits = _dataset_api('errica_splits')
        folds = errica_splits(dataset, num_folds=self.num_folds, inner_holdout=self.inner_holdout,
                              seed=self.split_seed, name=self.name)
        fold = folds[self.fold]
        return dataset[fold['train']], dataset[fold['val']], dataset[fold['test']]


class LRGBDataModule(GraphDataModule):
    r"""A Long Range Graph Benchmark dataset (Dwivedi et al., 2022): Peptides-func from the
    original CSV (:class:`~pyg_grf.datasets.PeptidesFunctional`, needs ``rdkit``; its
    ``num_proc`` goes in ``dataset_kwargs``) for ``name='peptides-func'``, else
    :func:`~pyg_grf.datasets.load_lrgb`. Official splits. PCQM-Contact (``'pcqm-contact'``)
    pairs with :class:`~pyg_grf.lightning.link.LinkLevelTask`.

    Args:
        name (str, optional): LRGB name (default: :obj:`'peptides-func'`).
        max_graphs (int, optional): keep only the first ``max_graphs`` graphs of each split, for
            quick CPU runs; for Peptides-func chosen before processing, so only those are
            converted and pre-transformed (a cache of its own) (default: :obj:`None`, all).
        standin (int, optional): use :func:`~pyg_grf.datasets.lrgb_standin`, tiny random graphs
            with the dataset's fields and shapes, ``standin`` graphs per split: tests the wiring
            without data (default: :obj:`None`).
        dataset_kwargs (dict, optional): more dataset options (default: :obj:`None`).
        **kwargs: of :class:`GraphDataModule`.
    """

    def __init__(self, name: str = 'peptides-func', max_graphs: Optional[int] = None,
                 standin: Optional[int] = None,
                 dataset_kwargs: Optional[Dict[str, Any]] = None, batch_size: int = 32,
                 num_workers: int = 1, pre_transform: TransformArg = None,
                 transform: TransformArg = None, root: Optional[str] = None, seed: int = 0,
                 pin_memory: bool = False):
        super().__init__(batch_size, num_workers, pre_transform, transform, root, seed,
                         pin_memory)
        self.name = name
        self.max_graphs = max_graphs
        self.standin = standin
        self.dataset_kwargs = dict(dataset_kwargs or {})

    def _is_peptides_func(self) -> bool:
        return self.name.lower().replace('_', '-') in ('peptides-func', 'peptides-functional')

    def load_dataset(self):
        if self.standin is not None:
            lrgb_standin = _dataset_api('lrgb_standin')
            return {split: lrgb_standin(self.name, num_graphs=self.standin, seed=i,
                                        transform=self.transform,
                                        pre_transform=self.pre_transform)
                    for i, split in enumerate(('train', 'val', 'test'))}
        common = dict(transform=self.transform, pre_transform=self.pre_transform,
                      **self.dataset_kwargs)
        if self.root is not None:
            common['root'] = self.root
        if self._is_peptides_func():
            # max_graphs before processing: only the kept molecules are converted.
            cls = _dataset_api('PeptidesFunctional')
            return {split: _load_fresh(cls, split=split, max_graphs=self.max_graphs, **common)
                    for split in ('train', 'val', 'test')}
        load_lrgb = _dataset_api('load_lrgb')
        return {split: _load_fresh(load_lrgb, name=self.name, split=split, **common)
                for split in ('train', 'val', 'test')}

    def split(self, dataset):
        out = []
        for key in ('train', 'val', 'test'):
            ds = dataset[key]
            if self.max_graphs is not None:
                ds = ds[:self.max_graphs]
            out.append(ds)
        return tuple(out)

    def _described_dataset(self):
        return self.train_dataset  # self.dataset holds the three splits


class PlanetoidDataModule(_DatasetDataModule):
    r"""A citation graph (:func:`~pyg_grf.datasets.load_planetoid`: Cora, CiteSeer, PubMed) for
    node classification with :class:`~pyg_grf.lightning.tasks.NodeLevelTask`: every loader
    yields the one full graph, whose ``train_mask`` / ``val_mask`` / ``test_mask`` select the
    nodes of the split.

    Args:
        name (str, optional): dataset name (default: :obj:`'Cora'`).
        split (str, optional): Planetoid split (default: :obj:`'public'`).
        pre_transform, transform: as in :class:`GraphDataModule`.
        root (str, optional): dataset root (default: under the data root).
        num_parts (int, optional): train on ``num_parts`` random node parts per epoch, one
            step per part (:class:`~pyg_grf.loader.NodePartLoader`); validation and test stay
            on the full graph (default: :obj:`None`: the full graph every step).
        part_walks (str, optional): the walks of a part: ``'restrict'`` (the pre-transform's
            walks on the full graph, restricted to the part) or ``'recompute'`` (the
            pre-transform applied to the part) (default: :obj:`'restrict'`).
    """

    def __init__(self, name: str = 'Cora', split: str = 'public',
                 pre_transform: TransformArg = None, transform: TransformArg = None,
                 root: Optional[str] = None, num_workers: int = 0,
                 num_parts: Optional[int] = None, part_walks: str = 'restrict'):
        super().__init__(pre_transform, transform, root, num_workers)
        self.name = name
        self.split = split
        if num_parts is not None:
            check_part_args(num_parts, part_walks, self.pre_transform)
        self.num_parts = num_parts
        self.part_walks = part_walks

    def load_dataset(self):
        load_planetoid = _dataset_api('load_planetoid')
        return _load_fresh(load_planetoid, name=self.name, root=self.root, split=self.split,
                           transform=self.transform, pre_transform=self.pre_transform)

    def _loader(self) -> DataLoader:
        if self.dataset is None:
            raise RuntimeError("PlanetoidDataModule: call setup() before asking for a dataloader")
        # the full graph's plans are built once (the loader keeps them: plan_cache_bytes)
        return DataLoader(self.dataset, batch_size=1, shuffle=False,
                          num_workers=self.num_workers, model=_trained_model(self))

    def train_dataloader(self):
        if self.num_parts is None:
            return self._loader()
        if self.dataset is None:
            raise RuntimeError("PlanetoidDataModule: call setup() before asking for a dataloader")
        return NodePartLoader(lambda: self.dataset[0], self.num_parts, self.part_walks,
                              transform=copy.deepcopy(self.pre_transform))

    def val_dataloader(self) -> DataLoader:  # validation and test: the full graph
        return self._loader()

    test_dataloader = val_dataloader


class HeterophilousDataModule(_DatasetDataModule):
    r"""A heterophilous graph of Platonov et al. (2023)
    (:func:`~pyg_grf.datasets.load_heterophilous`: Minesweeper, Roman-empire, ...) for node
    classification with :class:`~pyg_grf.lightning.tasks.NodeLevelTask`: every loader yields
    the one full graph, with ``train_mask`` / ``val_mask`` / ``test_mask`` of the fixed split
    :obj:`split` (the dataset holds ten, one per column). Minesweeper, Tolokers and Questions
    are binary and scored by ROC-AUC (``task: binary``, ``metric: auroc``, ``out_channels: 1``).

    Args:
        name (str, optional): dataset name (default: :obj:`'minesweeper'`).
        split (int, optional): which of the fixed splits, ``0 <= split < 10``
            (default: :obj:`0`).
        pre_transform, transform, root: as in :class:`PlanetoidDataModule`.
        num_workers (int, optional): loader workers (default: :obj:`0`).
    """

    def __init__(self, name: str = 'minesweeper', split: int = 0,
                 pre_transform: TransformArg = None, transform: TransformArg = None,
                 root: Optional[str] = None, num_workers: int = 0):
        super().__init__(pre_transform, transform, root, num_workers)
        if isinstance(split, bool) or not isinstance(split, int) or split < 0:
            raise ValueError(f"split must be an integer >= 0 (one of the dataset's fixed "
                             f"splits), got {split!r}")
        self.name = name
        self.split = split
        self.graph = None

    def load_dataset(self):
        load_heterophilous = _dataset_api('load_heterophilous')
        return _load_fresh(load_heterophilous, name=self.name, root=self.root,
                           transform=self.transform, pre_transform=self.pre_transform)

    def setup(self, stage: Optional[str] = None) -> None:
        super().setup(stage)
        if self.graph is None:
            data = self.dataset[0]
            num_splits = data.train_mask.size(1) if data.train_mask.dim() == 2 else 1
            if self.split >= num_splits:
                raise ValueError(f"split must be in [0, {num_splits}) for {self.name}, got "
                                 f"{self.split}")
            data = copy.copy(data)
            for key in ('train_mask', 'val_mask', 'test_mask'):
                mask = data[key]
                data[key] = mask[:, self.split] if mask.dim() == 2 else mask
            self.graph = data

    def _loader(self) -> DataLoader:
        if self.graph is None:
            raise RuntimeError("HeterophilousDataModule: call setup() before asking for a "
                               "dataloader")
        # one graph, the same object every epoch: the attention's plan is built once
        return DataLoader([self.graph], batch_size=1, shuffle=False,
                          num_workers=self.num_workers, model=_trained_model(self))

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    val_dataloader = test_dataloader = train_dataloader
