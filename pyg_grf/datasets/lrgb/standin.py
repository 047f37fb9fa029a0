r"""Stand-ins for the LRGB datasets, to test the training wiring and the real loading path without
data or network: :func:`lrgb_standin` (tiny random datasets with the fields, dtypes and shapes of
each LRGB dataset) and :func:`write_lrgb_raw_standin` (the same graphs written as the raw files
of PyG's :class:`~torch_geometric.datasets.LRGBDataset`)."""
import os
import os.path as osp
import pickle
from typing import Callable, List, Optional

import torch
from torch_geometric.data import Data
from torch_geometric.datasets import LRGBDataset

from pyg_grf.datasets.lrgb.info import LRGB_INFO, SPLITS, LRGBInfo, lrgb_name
from pyg_grf.datasets.mirror import check_not_in_mirror, resolve_root
from pyg_grf.datasets.synthetic import GeneratedDataset


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
    info = LRGB_INFO[lrgb_name(name)]
    root = resolve_root(root, 'LRGB')
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


__all__ = ['LRGBStandIn', 'lrgb_standin', 'standin_graphs', 'write_lrgb_raw_standin']
