r"""Link prediction on mini-batches of graphs (LRGB PCQM-Contact): :class:`LinkLevelTask`."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import to_dense_batch

from pyg_grf.lightning.base import SPLITS, Task
from pyg_grf.lightning.link_metrics import (
    LINK_HITS_KS,
    LinkRankingMetrics,
    check_labelled_pairs,
    check_pairs_in_graphs,
    filtered_link_candidates,
    link_ranks,
)
from pyg_grf.nn.models.link_decoder import LinkDecoder


def structured_negatives(edge_label_index: Tensor, edge_label: Tensor,
                         batch: Optional[Tensor] = None, num_nodes: Optional[int] = None,
                         num_negatives: int = 2,
                         generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
    r"""Keeps the positive pairs of :obj:`edge_label_index` and draws fresh negatives for them, as
    LRGB's ``resample_negative`` does for PCQM-Contact: for each positive pair :math:`(s, t)`,
    :obj:`num_negatives` distinct nodes :math:`v` of the graph of :math:`s`, uniformly among those
    with :math:`(s, v)` not a positive pair (:math:`v = s` allowed, as in LRGB); fewer where the
    graph has fewer. Vectorised over all pairs (random keys, top-k per pair). Returns
    ``(edge_label_index, edge_label)``: the positives, then the negatives.
    """
    if num_negatives < 1:
        raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
    cand = filtered_link_candidates(edge_label_index, edge_label, batch, num_nodes)
    P, n = cand.mask.shape
    device = edge_label_index.device
    k = min(num_negatives, n)
    keys = torch.rand(P, n, generator=generator, device=device)
    keys = keys.masked_fill(~cand.mask, -1.)  # keys of candidates lie in [0, 1)
    top, local = keys.topk(k, dim=1)
    valid = top >= 0
    ptr = cand.num_nodes.cumsum(0) - cand.num_nodes
    neg_src = cand.src.unsqueeze(1).expand(-1, k)[valid]
    neg_dst = (local + ptr[cand.graph].unsqueeze(1))[valid]
    index = torch.cat([torch.stack([cand.src, cand.dst]), torch.stack([neg_src, neg_dst])], 1)
    label = torch.cat([torch.ones(P, dtype=edge_label.dtype, device=device),
                       torch.zeros(neg_src.numel(), dtype=edge_label.dtype, device=device)])
    return index, label


class LinkLevelTask(Task):
    r"""Link prediction on mini-batches of graphs with labelled node pairs
    (``edge_label_index``, ``edge_label``), e.g. LRGB PCQM-Contact.

    A :class:`~pyg_grf.nn.models.link_decoder.LinkDecoder` scores pairs of node embeddings.
    Training: binary cross-entropy on the labelled pairs (or on the positives plus
    :obj:`num_negatives` fresh negatives per positive, :func:`structured_negatives`). Validation
    and test: the same loss, and every positive pair ranked against all nodes of its graph with
    the other positives of its source filtered out
    (:func:`~pyg_grf.lightning.link_metrics.filtered_link_candidates`), as MRR and Hits@k.

    Args:
        model (torch.nn.Module): the node encoder, mapping a batch to ``[N, C]`` (a
            :class:`~pyg_grf.nn.models.GraphTransformer` with ``pooling=None`` and
            ``out_channels=C``; a dict of its arguments or a ``class_path`` spec works too).
        decoder (str, optional): ``'dot'`` (the LRGB baselines) or ``'hadamard_mlp'``
            (default: :obj:`'dot'`).
        decoder_kwargs (dict, optional): more :class:`LinkDecoder` options, e.g.
            ``{'num_layers': 2, 'dropout': 0.1}`` (default: :obj:`None`).
        num_negatives (int, optional): draw this many fresh negatives per positive pair at every
            training step instead of using the dataset's negative pairs (LRGB's
            ``resample_negative``; the dataset's pairs still give the validation loss)
            (default: :obj:`None`: the dataset's pairs).
        exclude_self (bool, optional): do not rank a source against itself (LRGB's
            ``filtered_noself``) (default: :obj:`False`: LRGB's ``filtered``).
        ks (sequence of int, optional): the k of Hits@k (default: :obj:`(1, 3, 10)`).
        reduction (str, optional): ``'graph'``: MRR / Hits@k averaged per graph, then over the
            graphs (LRGB); ``'edge'``: over all positive pairs (default: :obj:`'graph'`).
        **kwargs: the optimiser and its schedule (``lr``, ``weight_decay``, ...), as in
            :class:`~pyg_grf.lightning.base.Task`.

    Logs ``{train,val,test}/loss`` and ``{val,test}/{mrr,hits@1,hits@3,hits@10}``
    (``metric_name`` is ``'mrr'``: monitor ``val/mrr`` with ``mode: max``).
    """

    def __init__(self, model: torch.nn.Module, decoder: str = 'dot',
                 decoder_kwargs: Optional[Dict[str, Any]] = None,
                 num_negatives: Optional[int] = None, exclude_self: bool = False,
                 ks: Sequence[int] = LINK_HITS_KS, reduction: str = 'graph', **kwargs):
        if num_negatives is not None and num_negatives < 1:
            raise ValueError(f"num_negatives must be None or >= 1, got {num_negatives}")
        super().__init__(model, **kwargs)
        self.task = 'link'
        self.num_negatives = num_negatives
        self.exclude_self = exclude_self
        channels = getattr(self.model, 'out_channels', None)
        if not isinstance(channels, int):
            raise ValueError(f"LinkLevelTask needs a model with an integer 'out_channels' (the "
                             f"node embedding size), got {type(self.model).__name__} with "
                             f"out_channels={channels!r}")
        if getattr(self.model, 'pooling', None) is not None:
            raise ValueError(f"LinkLevelTask needs node embeddings: build the model with "
                             f"pooling=None (got pooling={self.model.pooling!r})")
        self.decoder = LinkDecoder(channels, decoder, **(decoder_kwargs or {}))
        self.metric_name = 'mrr'
        self.metrics = torch.nn.ModuleDict({
            f'{split}_metric': LinkRankingMetrics(ks, reduction) for split in SPLITS})

    # Pieces ------------------------------------------------------------------------------

    @staticmethod
    def _labelled_pairs(batch) -> Tuple[Tensor, Tensor]:
        index = getattr(batch, 'edge_label_index', None)
        label = getattr(batch, 'edge_label', None)
        if index is None or label is None:
            keys = sorted(batch.keys()) if callable(getattr(batch, 'keys', None)) else '?'
            raise ValueError(f"LinkLevelTask expects labelled node pairs on every batch: "
                             f"'edge_label_index' [2, L] and 'edge_label' [L] (as in LRGB "
                             f"PCQM-Contact), got a batch with attributes {keys}. For graph or "
                             f"node targets use GraphLevelTask or NodeLevelTask.")
        index = check_labelled_pairs(index, label)
        # every step checks the pairs (training and predict too): ids in range, one graph each
        check_pairs_in_graphs(index, LinkLevelTask._batch_vector(batch))
        return index, label

    @staticmethod
    def _batch_vector(batch) -> Tensor:
        vector = getattr(batch, 'batch', None)
        if vector is None:
            vector = torch.zeros(batch.num_nodes, dtype=torch.long, device=batch.edge_index.device)
        return vector

    def forward(self, data) -> Tensor:
        r"""Node embeddings ``[N, C]``."""
        z = self.model(data)
        if z.dim() != 2 or z.size(0) != data.num_nodes:
            raise ValueError(f"LinkLevelTask expects node embeddings [N={data.num_nodes}, C] from "
                             f"the model (a GraphTransformer with pooling=None), got "
                             f"{tuple(z.shape)}")
        return z

    def score(self, z: Tensor, index: Tensor) -> Tensor:
        r"""Logits of the pairs :obj:`index` ``[2, L]`` from node embeddings :obj:`z`."""
        return self.decoder(z[index[0]], z[index[1]])

    def rank(self, z: Tensor, edge_label_index: Tensor, edge_label: Tensor,
             batch: Tensor) -> Tuple[Tensor, Tensor]:
        r"""Filtered ranks ``[P]`` of the positive pairs and their graphs ``[P]``."""
        cand = filtered_link_candidates(edge_label_index, edge_label, batch, z.size(0),
                                        exclude_self=self.exclude_self)
        # Every positive's source against all nodes of its graph (padded per graph).
        z_dense, _ = to_dense_batch(z, batch, batch_size=cand.num_graphs,
                                    max_num_nodes=cand.max_num_nodes)
        rows = self.decoder.score_candidates(z[cand.src], z_dense[cand.graph])  # [P, N_max]
        pos = rows.gather(1, cand.dst_local.unsqueeze(1)).squeeze(1)
        return link_ranks(pos, rows, cand.mask), cand.graph

    # Steps -------------------------------------------------------------------------------

    def shared_step(self, batch, split: str) -> Tensor:
        r"""Binary cross-entropy on the labelled pairs (in training, with fresh negatives when
        :obj:`num_negatives` is set); in validation and test, the filtered ranks of the
        positives go to the split's metric too."""
        index, label = self._labelled_pairs(batch)
        if split == 'train' and self.num_negatives is not None:
            index, label = structured_negatives(index, label, self._batch_vector(batch),
                                                batch.num_nodes, self.num_negatives)
        z = self(batch)
        loss = F.binary_cross_entropy_with_logits(self.score(z, index), label.float())
        if split != 'train':
            ranks, graph = self.rank(z, index, label, self._batch_vector(batch))
            self.metrics[f'{split}_metric'].update(ranks, graph)
        self.log_loss(split, loss, batch.num_graphs)
        return loss

    def _log_epoch(self, split: str) -> None:
        metric = self.metrics[f'{split}_metric']
        # compute() already gathers the sums of all processes.
        for name, value in metric.compute().items():
            self.log(f'{split}/{name}', value, prog_bar=name == 'mrr', sync_dist=True)
        metric.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_epoch('val')

    def on_test_epoch_end(self) -> None:
        self._log_epoch('test')

    def predict_step(self, batch, batch_idx: int) -> Tensor:
        r"""Logits of the batch's labelled pairs."""
        index, _ = self._labelled_pairs(batch)
        return self.score(self(batch), index)


__all__ = ['LinkLevelTask', 'structured_negatives']
