r"""Long Range Graph Benchmark (LRGB, Dwivedi et al., NeurIPS 2022 Datasets and Benchmarks).

* :class:`PeptidesFunctional`: Peptides-func built from the *original* LRGB release (SMILES CSV +
  official split pickle), the form the offline mirror holds (:mod:`.dataset`; its SMILES are
  turned into graphs by :func:`smiles_to_graphs`, :mod:`.smiles`).
* :func:`load_lrgb`: any LRGB dataset by name (Peptides-func through
  :class:`PeptidesFunctional`, the others through PyG's
  :class:`~torch_geometric.datasets.LRGBDataset`, which downloads when online).
* :data:`LRGB_INFO`: each dataset's official task, output size, loss and metric (:mod:`.info`).
* :func:`lrgb_standin`: tiny random datasets with the same fields, dtypes and shapes as each LRGB
  dataset, to test the training wiring without data; :func:`write_lrgb_raw_standin` writes them
  as the raw files of PyG's :class:`~torch_geometric.datasets.LRGBDataset`, to test the real
  loading path (:mod:`.standin`).
"""
from pyg_grf.datasets.lrgb.dataset import (
    PeptidesFunctional,
    SafeLRGBDataset,
    file_md5,
    load_lrgb,
)
from pyg_grf.datasets.lrgb.info import LRGB_INFO, SPLITS, LRGBInfo, lrgb_name
from pyg_grf.datasets.lrgb.smiles import default_num_proc, smiles_to_graphs
from pyg_grf.datasets.lrgb.standin import (
    LRGBStandIn,
    lrgb_standin,
    standin_graphs,
    write_lrgb_raw_standin,
)
from pyg_grf.datasets.mirror import DatasetNotFoundError

__all__ = [
    'PeptidesFunctional',
    'SafeLRGBDataset',
    'load_lrgb',
    'lrgb_standin',
    'lrgb_name',
    'LRGBInfo',
    'LRGB_INFO',
    'SPLITS',
    'LRGBStandIn',
    'standin_graphs',
    'write_lrgb_raw_standin',
    'smiles_to_graphs',
    'default_num_proc',
    'file_md5',
    'DatasetNotFoundError',
]
