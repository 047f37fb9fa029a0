r"""Datasets on PyG's :class:`~torch_geometric.data.InMemoryDataset` machinery: generated tasks
(no data needed); TU, Planetoid and LRGB with an offline-mirror ``download()`` and a verified cache
(:mod:`.cache`, :mod:`.mirror`); Errica et al. cross-validation splits; image patch grids
(:mod:`.grid`). The datasets only the experiments use (digits as patch grids, mass-spring point
clouds) live beside them, in ``experiments/image_grids.py`` and ``experiments/point_clouds.py``."""
from pyg_grf.datasets.cache import DatasetCacheError
from pyg_grf.datasets.grid import grid_edge_index, image_patches
from pyg_grf.datasets.heterophilous import (
    HETEROPHILOUS_DATASETS,
    HeterophilousGraphDataset,
    load_heterophilous,
)
from pyg_grf.datasets.lrgb import (
    LRGB_INFO,
    LRGBDataset,
    LRGBInfo,
    PeptidesFunctional,
    load_lrgb,
    lrgb_standin,
    write_lrgb_raw_standin,
)
from pyg_grf.datasets.mirror import (
    DatasetNotFoundError,
    MirrorIntegrityError,
    data_root,
    fetch_from_mirror,
    mirror_root,
)
from pyg_grf.datasets.planetoid import PLANETOID_DATASETS, Planetoid, load_planetoid
from pyg_grf.datasets.splits import errica_splits
from pyg_grf.datasets.synthetic import (
    MOTIFS,
    InducedCycleDataset,
    MotifDataset,
    TwoHopMajorityDataset,
    motif_graph,
)
from pyg_grf.datasets.tu import TU_DATASETS, TUDataset, load_tu

__all__ = [
    'MotifDataset', 'InducedCycleDataset', 'MOTIFS', 'motif_graph', 'TwoHopMajorityDataset',
    'grid_edge_index', 'image_patches',
    'TUDataset', 'load_tu', 'TU_DATASETS', 'Planetoid', 'load_planetoid', 'PLANETOID_DATASETS',
    'HeterophilousGraphDataset', 'load_heterophilous', 'HETEROPHILOUS_DATASETS',
    'LRGBDataset', 'PeptidesFunctional', 'load_lrgb', 'LRGB_INFO', 'LRGBInfo', 'lrgb_standin',
    'write_lrgb_raw_standin', 'errica_splits',
    'data_root', 'mirror_root', 'fetch_from_mirror',
    'DatasetNotFoundError', 'MirrorIntegrityError', 'DatasetCacheError',
]
