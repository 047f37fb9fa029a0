r"""Training: LightningModules, DataModules, metrics and the ``pyg-grf`` command line.

The CLI (:mod:`pyg_grf.lightning.cli`) is not imported here, so importing the tasks does not
pull in jsonargparse.
"""
from pyg_grf.lightning.datamodules import (
    EpochSeededRandomSampler,
    GraphDataModule,
    HeterophilousDataModule,
    LRGBDataModule,
    PlanetoidDataModule,
    SyntheticDataModule,
    TUDataModule,
)
from pyg_grf.lightning.link import LinkLevelTask
from pyg_grf.lightning.link_metrics import LinkRankingMetrics
from pyg_grf.lightning.metrics import MultilabelAveragePrecision
from pyg_grf.lightning.tasks import GraphLevelTask, NodeLevelTask

__all__ = ['GraphLevelTask', 'NodeLevelTask', 'GraphDataModule', 'SyntheticDataModule',
           'TUDataModule', 'PlanetoidDataModule', 'HeterophilousDataModule', 'LRGBDataModule',
           'EpochSeededRandomSampler',
           'MultilabelAveragePrecision', 'LinkLevelTask', 'LinkRankingMetrics']
