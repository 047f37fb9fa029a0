r"""Citation graphs (PyG :class:`~torch_geometric.datasets.Planetoid`) through the offline
mirror."""
import os.path as osp
from typing import Callable, Optional

from torch_geometric.datasets import Planetoid

from pyg_grf.datasets.cache import SafeCacheMixin
from pyg_grf.datasets.mirror import build_with_mirror, mirror_root, resolve_root

PLANETOID_DATASETS = ('Cora', 'CiteSeer', 'PubMed')
_RAW = ('x', 'tx', 'allx', 'y', 'ty', 'ally', 'graph', 'test.index')


class SafePlanetoid(SafeCacheMixin, Planetoid):
    r"""PyG's :class:`~torch_geometric.datasets.Planetoid` with the crash-safe, verified cache
    of :class:`~pyg_grf.datasets.cache.SafeCacheMixin` (``root/<Name>/processed_<hash>``)."""

    def cache_key(self):
        return dict(super().cache_key(), name=self.name, split=self.split)


def load_planetoid(
    name: str,
    root: Optional[str] = None,
    split: str = 'public',
    transform: Optional[Callable] = None,
    pre_transform: Optional[Callable] = None,
    force_reload: bool = False,
    **kwargs,
) -> Planetoid:
    r"""Loads Cora, CiteSeer or PubMed as a PyG :class:`~torch_geometric.datasets.Planetoid`
    with the public split, copying the raw files from the offline mirror (``$PYG_GRF_MIRROR``,
    layout ``Planetoid/<Name>/raw/ind.<name>.*``) into the data root first.

    The mirror has no complete PubMed (``ind.pubmed.allx`` is missing); PubMed loads when its
    eight files are in the data root or the mirror, or when it can be downloaded.

    Args:
        name (str): :obj:`"Cora"`, :obj:`"CiteSeer"` or :obj:`"PubMed"` (case-insensitive).
        root (str, optional): The PyG root; files go to ``root/<Name>/raw``.
            (default: ``<data_root()>/Planetoid``)
        split (str, optional): The node split, see :class:`~torch_geometric.datasets.Planetoid`.
            (default: :obj:`"public"`)
        transform (callable, optional): A transform applied on every access.
            (default: :obj:`None`)
        pre_transform (callable, optional): A transform applied before saving to disk.
            (default: :obj:`None`)
        force_reload (bool, optional): Whether to re-process the dataset. (default: :obj:`False`)
        **kwargs (optional): Further arguments of :class:`~torch_geometric.datasets.Planetoid`.
    """
    canonical = {k.lower(): k for k in PLANETOID_DATASETS}
    if not isinstance(name, str) or name.lower() not in canonical:
        raise ValueError(
            f"Unknown Planetoid dataset {name!r}; expected one of {list(PLANETOID_DATASETS)}")
    name = canonical[name.lower()]
    if split == 'geom-gcn':
        raise ValueError("split='geom-gcn' needs extra split files that the mirror loader does "
                         "not fetch; use split='public', 'full' or 'random'")

    root = resolve_root(root, 'Planetoid')
    folder = osp.join(root, name)
    raw_paths = [osp.join(folder, 'raw', f'ind.{name.lower()}.{f}') for f in _RAW]
    hint = ''
    mirror = mirror_root()
    if mirror is not None and osp.isdir(osp.join(mirror, '_incomplete', 'Planetoid', name)):
        hint = (f"The mirror holds only an incomplete copy of {name} under "
                f"'{osp.join(mirror, '_incomplete', 'Planetoid', name)}' (see the mirror's "
                f"README); add the missing file(s) and move it to 'Planetoid/{name}'.")
    return build_with_mirror(
        lambda: SafePlanetoid(root, name, split=split, transform=transform,
                              pre_transform=pre_transform, force_reload=force_reload, **kwargs),
        f'Planetoid/{name}', folder, raw_paths, name, hint)


__all__ = ['load_planetoid', 'PLANETOID_DATASETS', 'SafePlanetoid']
