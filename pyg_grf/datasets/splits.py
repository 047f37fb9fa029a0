r"""Cross-validation splits for graph classification: the protocol of Errica et al., *A Fair
Comparison of Graph Neural Networks for Graph Classification* (ICLR 2020), used by the GKAT
paper (Choromanski et al., 2022, Sec. 5.2)."""
import hashlib
import json
import os
import os.path as osp
import re
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from pyg_grf.datasets.mirror import data_root

SPLITS_VERSION = 2
_SPLITS = ('train', 'val', 'test')


def _labels(dataset) -> np.ndarray:
    if isinstance(dataset, (Tensor, np.ndarray, list, tuple)):
        y = torch.as_tensor(np.asarray(dataset))
    else:
        y = None
        try:
            y = dataset.y  # InMemoryDataset: collated labels
        except (AttributeError, KeyError):
            pass
        if not isinstance(y, Tensor) or y.size(0) != len(dataset):
            y = torch.cat([dataset[i].y.view(-1) for i in range(len(dataset))])
    y = y.view(-1) if y.dim() > 1 and y.numel() == y.size(0) else y
    if y.dim() != 1 or torch.is_floating_point(y):
        raise ValueError(f"Expected one integer class label per graph (got labels of shape "
                         f"{tuple(y.shape)} and dtype {y.dtype})")
    return y.cpu().numpy().astype(np.int64)


def _folds_digest(folds) -> str:
    return hashlib.sha256(json.dumps(folds, sort_keys=True).encode()).hexdigest()


def check_folds(folds, num_graphs: int, path: str = '<splits>') -> None:
    r"""Checks cross-validation folds: every index an integer in ``[0, num_graphs)``, no
    duplicates, ``train``, ``val`` and ``test`` pairwise disjoint and covering every graph in each
    fold, and the test sets of the folds a partition of the graphs; else raises
    :class:`ValueError` naming the first violation (fold, split, index)."""
    hint = f"Delete '{path}' to recompute the splits."
    if not isinstance(folds, list) or not folds:
        raise ValueError(f"Expected a non-empty list of folds in '{path}'. {hint}")
    tested = np.zeros(num_graphs, dtype=np.int64)
    for i, fold in enumerate(folds):
        for split in _SPLITS:
            idx = fold.get(split) if isinstance(fold, dict) else None
            if not isinstance(idx, list) or not all(type(j) is int for j in idx):
                raise ValueError(f"Fold {i} of '{path}': expected '{split}' to be a list of "
                                 f"integers. {hint}")
            bad = [j for j in idx if not 0 <= j < num_graphs]
            if bad:
                raise ValueError(f"Fold {i} of '{path}': '{split}' holds index {bad[0]}, "
                                 f"outside [0, {num_graphs}). {hint}")
        seen = np.bincount(np.asarray(fold['train'] + fold['val'] + fold['test'], dtype=np.int64),
                           minlength=num_graphs)
        tested += np.bincount(np.asarray(fold['test'], dtype=np.int64), minlength=num_graphs)
        if (seen > 1).any():
            j = int(np.flatnonzero(seen > 1)[0])
            where = [s for s in _SPLITS if j in set(fold[s])]
            raise ValueError(f"Fold {i} of '{path}': graph {j} appears more than once (in "
                             f"{where}); train, val and test must be disjoint. {hint}")
        if (seen == 0).any():
            j = int(np.flatnonzero(seen == 0)[0])
            raise ValueError(f"Fold {i} of '{path}': graph {j} is in none of train, val and "
                             f"test. {hint}")
    if (tested != 1).any():
        j = int(np.flatnonzero(tested != 1)[0])
        raise ValueError(f"Graph {j} is in the test set of {int(tested[j])} folds of '{path}' "
                         f"(expected exactly 1: the test sets partition the dataset). {hint}")


def default_splits_path(name: str, num_folds: int, inner_holdout: float, seed: int) -> str:
    r"""Where :func:`errica_splits` stores the splits of dataset :obj:`name`:
    ``<data_root()>/splits/<name>_errica_<num_folds>fold_val<inner_holdout>_seed<seed>.json``."""
    safe = re.sub(r'[^A-Za-z0-9_.-]+', '_', str(name))
    return osp.join(data_root(), 'splits',
                    f'{safe}_errica_{num_folds}fold_val{inner_holdout:g}_seed{seed}.json')


def errica_splits(
    dataset,
    num_folds: int = 10,
    inner_holdout: float = 0.1,
    seed: int = 0,
    path: Optional[str] = None,
    name: Optional[str] = None,
) -> List[Dict[str, Tensor]]:
    r"""The model-assessment splits of Errica et al. (2020): :obj:`num_folds` stratified outer
    folds (:class:`sklearn.model_selection.StratifiedKFold`, shuffled with :obj:`seed`); inside
    each outer training set, a stratified holdout of :obj:`inner_holdout` for validation (model
    selection / early stopping), the rest for training.

    The splits are saved as JSON and reloaded when the file exists, so that runs share the same
    folds; a stored file must match the dataset (size, hash of the labels), the arguments, its
    folds' stored SHA-256 and :func:`check_folds`, else an error is raised (never foreign or
    edited splits, test graphs leaking into training).

    Args:
        dataset (Dataset or Tensor): A graph-classification dataset whose graphs carry one integer
            label :obj:`y` each, or the labels themselves.
        num_folds (int): Number of outer folds.
        inner_holdout (float): Fraction of each outer training set held out for validation.
        seed (int): Seed of both shuffles.
        path (str, optional): JSON file to read or write. (default: :func:`default_splits_path`)
        name (str, optional): Dataset name for the default path. (default: :obj:`dataset.name`)

    Returns:
        A list of :obj:`num_folds` dicts with :obj:`"train"`, :obj:`"val"` and :obj:`"test"`
        index tensors (:obj:`torch.long`, sorted) into :obj:`dataset`.
    """
    from sklearn.model_selection import StratifiedKFold, train_test_split

    if not isinstance(num_folds, int) or num_folds < 2:
        raise ValueError(f"Expected 'num_folds' to be an integer >= 2 (got {num_folds!r})")
    if not 0.0 < inner_holdout < 1.0:
        raise ValueError(f"Expected 'inner_holdout' in (0, 1) (got {inner_holdout!r})")

    y = _labels(dataset)
    digest = hashlib.sha1(y.tobytes()).hexdigest()
    meta = dict(version=SPLITS_VERSION, protocol='errica2020', num_graphs=int(y.size),
                num_folds=num_folds, inner_holdout=inner_holdout, seed=seed, labels_sha1=digest)

    if path is None:
        name = name if name is not None else getattr(dataset, 'name', None)
        if name is None:
            raise ValueError("Pass 'path' or 'name' to store the splits of a dataset that has no "
                             "'name' attribute")
        path = default_splits_path(name, num_folds, inner_holdout, seed)

    if osp.exists(path):
        with open(path) as f:
            stored = json.load(f)
        stored_meta = {k: stored.get(k) for k in meta}
        if stored_meta != meta:
            diff = {k: (stored_meta[k], v) for k, v in meta.items() if stored_meta[k] != v}
            raise ValueError(
                f"The splits stored at '{path}' do not match this dataset/arguments "
                f"(field: (stored, expected)): {diff}. Delete the file or pass another 'path'.")
        folds = stored.get('folds')
        check_folds(folds, int(y.size), path)
        if len(folds) != num_folds:
            raise ValueError(f"'{path}' holds {len(folds)} folds, expected {num_folds}. Delete "
                             f"'{path}' to recompute the splits.")
        if stored.get('folds_sha256') != _folds_digest(folds):
            raise ValueError(f"The folds in '{path}' do not match their stored SHA-256: the file "
                             f"was edited. Delete '{path}' to recompute the splits.")
    else:
        outer = StratifiedKFold(n_splits=num_folds, shuffle=True, random_state=seed)
        folds = []
        for train_val, test in outer.split(np.zeros(y.size), y):
            train, val = train_test_split(train_val, test_size=inner_holdout,
                                          stratify=y[train_val], random_state=seed)
            folds.append({k: sorted(int(i) for i in v) for k, v in zip(_SPLITS,
                                                                       (train, val, test))})
        os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
        tmp = f'{path}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            json.dump(dict(meta, folds=folds, folds_sha256=_folds_digest(folds)), f)
        os.replace(tmp, path)
    return [{k: torch.tensor(fold[k], dtype=torch.long) for k in _SPLITS} for fold in folds]

