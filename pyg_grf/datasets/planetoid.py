r"""Citation graphs: PyG's :class:`~torch_geometric.datasets.Planetoid` with the offline mirror."""
import os.path as osp
from typing import Callable, Optional

from torch_geometric.datasets import Planetoid as PyGPlanetoid

from pyg_grf.datasets.cache import SafeCacheMixin
from pyg_grf.datasets.mirror import data_root

PLANETOID_DATASETS = ('Cora', 'CiteSeer', 'PubMed')


class Planetoid(SafeCacheMixin, PyGPlanetoid):
    r"""PyG's :class:`~torch_geometric.datasets.Planetoid` whose ``download()`` copies
    ``Planetoid/<Name>/raw`` from the offline mirror first (the ``ind.*`` pickles only with a hash
    pinned in the package), with the verified cache of
    :class:`~pyg_grf.datasets.cache.SafeCacheMixin`. Arguments as PyG's."""
    mirror_folder = 'Planetoid'


def load_planetoid(name: str, root: Optional[str] = None, split: str = 'public',
                   transform: Optional[Callable] = None,
                   pre_transform: Optional[Callable] = None, force_reload: bool = False,
                   **kwargs) -> Planetoid:
    r"""Cora, CiteSeer or PubMed (case-insensitive) as a :class:`Planetoid`, under
    :obj:`root` (default: ``<data_root()>/Planetoid``); the other arguments are PyG's."""
    canonical = {k.lower(): k for k in PLANETOID_DATASETS}
    if not isinstance(name, str) or name.lower() not in canonical:
        raise ValueError(f"Unknown Planetoid dataset {name!r}; expected one of "
                         f"{list(PLANETOID_DATASETS)}")
    root = osp.abspath(root) if root is not None else osp.join(data_root(), 'Planetoid')
    return Planetoid(root, canonical[name.lower()], split=split, transform=transform,
                     pre_transform=pre_transform, force_reload=force_reload, **kwargs)

