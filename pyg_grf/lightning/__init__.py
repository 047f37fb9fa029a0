r"""Training: LightningModules, DataModules, metrics and the ``pyg-grf`` command line.

The CLI (:mod:`pyg_grf.lightning.cli`) is not imported here, so importing the tasks does not
pull in jsonargparse.
"""
from pyg_grf.lightning.datamodules import (
    EpochSeededRandomSampler,
    GraphDataModule,
    LRGBDataModule,
    PlanetoidDataModule,
    SyntheticDataModule,
    TUDataModule,
)
from pyg_grf.lightning.link import LinkLevelTask
from pyg_grf.lightning.link_metrics import (
    LinkRankingMetrics,
    filtered_link_ranks,
    link_ranking_metrics,
)
from pyg_grf.lightning.metrics import MultilabelAveragePrecision, multilabel_average_precision
from pyg_grf.lightning.tasks import GraphLevelTask, NodeLevelTask

__all__ = [
    'GraphLevelTask',
    'NodeLevelTask',
    'GraphDataModule',
    'SyntheticDataModule',
    'TUDataModule',
    'PlanetoidDataModule',
    'LRGBDataModule',
    'EpochSeededRandomSampler',
    'MultilabelAveragePrecision',
    'multilabel_average_precision',
    'LinkLevelTask',
    'LinkRankingMetrics',
    'filtered_link_ranks',
    'link_ranking_metrics',
]
