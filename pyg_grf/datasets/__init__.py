r"""Datasets: the synthetic GKAT tasks, scikit-learn's digits as patch-grid graphs and a mass-spring point-cloud dynamics task (no data
needed), Peptides-func from the original LRGB CSV,
TU and Planetoid benchmarks through the offline mirror, and Errica et al. cross-validation splits.

The data root is ``$PYG_GRF_DATA`` (else ``./datasets``); ``$PYG_GRF_MIRROR`` names a read-only
offline mirror to copy raw files from; ``$PYG_GRF_OFFLINE=1`` forbids downloads.
"""
from pyg_grf.datasets.mirror import (
    DatasetNotFoundError,
    data_root,
    fetch_from_mirror,
    is_offline,
    mirror_root,
)
from pyg_grf.datasets.images import DigitsGridDataset, grid_edge_index, image_patches
from pyg_grf.datasets.synthetic import MOTIFS, InducedCycleDataset, MotifDataset, motif_graph
from pyg_grf.datasets.lrgb import (
    LRGB_INFO,
    LRGBInfo,
    PeptidesFunctional,
    load_lrgb,
    lrgb_standin,
    write_lrgb_raw_standin,
)
from pyg_grf.datasets.tu import TU_DATASETS, load_tu
from pyg_grf.datasets.topology import TwoHopMajorityDataset
from pyg_grf.datasets.point_cloud import MassSpringDataset, knn_edges, spring_forces
from pyg_grf.datasets.planetoid import PLANETOID_DATASETS, load_planetoid
from pyg_grf.datasets.splits import errica_splits

__all__ = [
    'DigitsGridDataset',
    'grid_edge_index',
    'image_patches',
    'TwoHopMajorityDataset',
    'MassSpringDataset',
    'knn_edges',
    'spring_forces',
    'MotifDataset',
    'InducedCycleDataset',
    'PeptidesFunctional',
    'MOTIFS',
    'motif_graph',
    'load_lrgb',
    'lrgb_standin',
    'write_lrgb_raw_standin',
    'LRGB_INFO',
    'LRGBInfo',
    'load_tu',
    'TU_DATASETS',
    'load_planetoid',
    'PLANETOID_DATASETS',
    'errica_splits',
    'data_root',
    'mirror_root',
    'fetch_from_mirror',
    'is_offline',
    'DatasetNotFoundError',
]
