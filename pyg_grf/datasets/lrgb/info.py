r"""The official settings of the LRGB datasets (Dwivedi et al., `"Long Range Graph Benchmark"
<https://arxiv.org/abs/2206.08164>`_, NeurIPS 2022 Datasets and Benchmarks, Table 1 and Sec. 4):
:class:`LRGBInfo`, :data:`LRGB_INFO` and :func:`lrgb_name`."""
from dataclasses import dataclass
from typing import Dict

import torch

#: The official splits, in the order of the processed files.
SPLITS = ('train', 'val', 'test')


@dataclass(frozen=True)
class LRGBInfo:
    r"""The official setting of an LRGB dataset (Dwivedi et al., 2022, Table 1 and Sec. 4).

    Attributes:
        name: Canonical name, e.g. :obj:`"Peptides-func"`.
        pyg_name: Name in PyG's :class:`~torch_geometric.datasets.LRGBDataset`.
        level: :obj:`"graph"`, :obj:`"node"` or :obj:`"link"`.
        task: :obj:`"multilabel_classification"`, :obj:`"regression"`,
            :obj:`"multiclass_classification"` or :obj:`"link_prediction"`.
        num_outputs: Outputs per prediction (labels, targets or classes; 1 for links).
        metric: :obj:`"ap"` (average precision, macro over the labels), :obj:`"mae"`,
            :obj:`"macro_f1"` or :obj:`"mrr"` (mean reciprocal rank).
        maximize: Whether a larger metric is better.
        loss: The loss of the reference baselines (:obj:`"bce_with_logits"`, :obj:`"l1"`,
            :obj:`"cross_entropy"`).
        target: The attribute holding the targets (:obj:`"y"`, or :obj:`"edge_label"` with
            :obj:`edge_label_index` for PCQM-Contact).
        num_node_features, node_feature_dtype: Shape [N, F] and dtype of :obj:`x` (long features
            are categorical OGB atom features for the molecular datasets).
        num_edge_features, edge_feature_dtype: Shape [E, F] and dtype of :obj:`edge_attr`.
        num_graphs: Graphs in train / val / test together.
    """
    name: str
    pyg_name: str
    level: str
    task: str
    num_outputs: int
    metric: str
    maximize: bool
    loss: str
    target: str
    num_node_features: int
    node_feature_dtype: torch.dtype
    num_edge_features: int
    edge_feature_dtype: torch.dtype
    num_graphs: int


LRGB_INFO: Dict[str, LRGBInfo] = {
    'Peptides-func': LRGBInfo('Peptides-func', 'peptides-func', 'graph',
                              'multilabel_classification', 10, 'ap', True, 'bce_with_logits', 'y',
                              9, torch.long, 3, torch.long, 15535),
    'Peptides-struct': LRGBInfo('Peptides-struct', 'peptides-struct', 'graph', 'regression', 11,
                                'mae', False, 'l1', 'y', 9, torch.long, 3, torch.long, 15535),
    'PascalVOC-SP': LRGBInfo('PascalVOC-SP', 'pascalvoc-sp', 'node', 'multiclass_classification',
                             21, 'macro_f1', True, 'cross_entropy', 'y', 14, torch.float, 2,
                             torch.float, 11355),
    'COCO-SP': LRGBInfo('COCO-SP', 'coco-sp', 'node', 'multiclass_classification', 81,
                        'macro_f1', True, 'cross_entropy', 'y', 14, torch.float, 2, torch.float,
                        123286),
    'PCQM-Contact': LRGBInfo('PCQM-Contact', 'pcqm-contact', 'link', 'link_prediction', 1, 'mrr',
                             True, 'cross_entropy', 'edge_label', 9, torch.long, 3, torch.long,
                             529434),
}

_ALIASES = {'peptides-functional': 'Peptides-func', 'peptides-structural': 'Peptides-struct'}


def lrgb_name(name: str) -> str:
    r"""The canonical LRGB name for :obj:`name` (case-insensitive; PyG names accepted)."""
    table = {k.lower(): k for k in LRGB_INFO}
    table.update(_ALIASES)
    key = name.lower() if isinstance(name, str) else name
    if key not in table:
        raise ValueError(f"Unknown LRGB dataset {name!r}; expected one of {list(LRGB_INFO)}")
    return table[key]


__all__ = ['LRGBInfo', 'LRGB_INFO', 'SPLITS', 'lrgb_name']
