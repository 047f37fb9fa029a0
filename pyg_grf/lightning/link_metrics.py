r"""Ranking metrics of link prediction on batches of graphs (LRGB PCQM-Contact).

Every positive pair :math:`(s, t)` of a graph is ranked against the nodes of the same graph as
candidate targets of :math:`s`, with the other positive targets of :math:`s` filtered out: the
*filtered* MRR and Hits@k that the LRGB code reports for PCQM-Contact (Dwivedi et al., 2022;
the filtered variant follows Toenshoff et al., 2023, who pointed out that the original, raw ranking
counts the other true contacts of a source as negatives). Ties count half, as in OGB's
link-prediction evaluator (the LRGB code breaks ties by the order ``torch.argsort`` happens to
return).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

#: Hits@k reported by default (LRGB: Hits@1, Hits@3, Hits@10).
LINK_HITS_KS = (1, 3, 10)
LINK_REDUCTIONS = ('graph', 'edge')


def link_ranks(pos_score: Tensor, cand_score: Tensor,
               cand_mask: Optional[Tensor] = None) -> Tensor:
    r"""The rank of each positive score among its candidate scores, ties counted half
    (the convention of OGB's link-prediction evaluator):

    .. math::
        r_p = 1 + |\{j \in C_p : c_{pj} > s_p\}|
              + \tfrac{1}{2}\, |\{j \in C_p : c_{pj} = s_p\}|,

    where :math:`C_p` are the columns where :obj:`cand_mask` is :obj:`True`. Without ties this is
    the position of the positive in the list sorted by decreasing score.

    Args:
        pos_score (Tensor): ``[P]`` score of each positive pair.
        cand_score (Tensor): ``[P, C]`` scores of the candidates it is ranked against.
        cand_mask (Tensor, optional): ``[P, C]`` boolean, which candidates count
            (default: :obj:`None`, all).

    Returns:
        ``[P]`` float ranks, :math:`\ge 1`.
    """
    if pos_score.dim() != 1:
        raise ValueError(f"expected pos_score of shape [P], got {tuple(pos_score.shape)}")
    if cand_score.dim() != 2 or cand_score.size(0) != pos_score.size(0):
        raise ValueError(f"expected cand_score of shape [P={pos_score.size(0)}, C], got "
                         f"{tuple(cand_score.shape)}")
    if cand_mask is None:
        cand_mask = torch.ones_like(cand_score, dtype=torch.bool)
    elif cand_mask.shape != cand_score.shape or cand_mask.dtype != torch.bool:
        raise ValueError(f"expected a boolean cand_mask of shape {tuple(cand_score.shape)}, got "
                         f"{tuple(cand_mask.shape)} ({cand_mask.dtype})")
    if bool(torch.isnan(pos_score).any()) or bool((torch.isnan(cand_score) & cand_mask).any()):
        raise ValueError("link_ranks got NaN scores; a rank is undefined (check the model's "
                         "outputs)")
    pos = pos_score.unsqueeze(1)
    above = ((cand_score > pos) & cand_mask).sum(1)
    tied = ((cand_score == pos) & cand_mask).sum(1)
    return 1. + above.to(torch.float64) + 0.5 * tied.to(torch.float64)


@dataclass
class LinkCandidates:
    r"""The positive pairs of a batch of graphs (``[P]`` each: batch node ids :obj:`src` /
    :obj:`dst`, ids inside their :obj:`graph` :obj:`src_local` / :obj:`dst_local`), the
    candidate :obj:`mask` ``[P, N_max]`` (``mask[p, j]``: node ``j`` of the graph of pair ``p``
    is a negative for it) and :obj:`num_nodes` ``[B]`` per graph
    (:func:`filtered_link_candidates`)."""
    src: Tensor
    dst: Tensor
    graph: Tensor
    src_local: Tensor
    dst_local: Tensor
    mask: Tensor
    num_nodes: Tensor

    @property
    def num_graphs(self) -> int:
        return self.num_nodes.numel()

    @property
    def max_num_nodes(self) -> int:
        return self.mask.size(1)


def check_pairs_in_graphs(index: Tensor, batch: Tensor) -> None:
    r"""Raises a :class:`ValueError` unless every pair of ``index`` (``[2, L]``, long) joins two
    node ids in ``[0, N)`` of one graph of the batch vector ``batch`` (``[N]``)."""
    if index.numel() == 0:
        return
    N, lo, hi = batch.numel(), int(index.min()), int(index.max())
    if lo < 0 or hi >= N:
        raise ValueError(f"edge_label_index holds node ids outside [0, {N}) (got {lo}..{hi})")
    cross = batch[index[0]] != batch[index[1]]
    if bool(cross.any()):
        k = int(cross.nonzero()[0])
        raise ValueError(f"edge_label_index pairs must join two nodes of the same graph; pair "
                         f"{k} joins graphs {int(batch[index[0, k]])} and "
                         f"{int(batch[index[1, k]])}")


def check_labelled_pairs(edge_label_index: Tensor, edge_label: Tensor) -> Tensor:
    r"""Checks labelled node pairs: ``edge_label_index [2, L]`` of integer node ids and
    ``edge_label [L]`` in :math:`\{0, 1\}` (1 = link, any numeric or bool dtype). Returns the
    index as ``torch.long``."""
    index, label = edge_label_index, edge_label
    if index.dim() != 2 or index.size(0) != 2 or label.dim() != 1 or \
            label.numel() != index.size(1):
        raise ValueError(f"expected edge_label_index [2, L] and edge_label [L], got "
                         f"{tuple(index.shape)} and {tuple(label.shape)}")
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        # .long() would truncate: 0.6 -> 0, -0.5 -> 0 (another node, in range)
        shown = [round(v, 4) if isinstance(v, float) else v
                 for v in index.flatten()[:4].tolist()]
        raise TypeError(f"expected an integer edge_label_index (node ids, torch.long), got "
                        f"{index.dtype} with values such as {shown}")
    bad = (label != 0) & (label != 1)
    if bool(bad.any()):
        raise ValueError(f"expected edge_label in {{0, 1}} (1 = link), got values such as "
                         f"{label[bad][:3].tolist()}")
    return index.long()


def filtered_link_candidates(edge_label_index: Tensor, edge_label: Tensor,
                             batch: Optional[Tensor] = None, num_nodes: Optional[int] = None,
                             *, exclude_self: bool = False) -> LinkCandidates:
    r"""The filtered candidate sets of link ranking (LRGB PCQM-Contact): every positive pair
    :math:`(s, t)` (``edge_label == 1``) of graph :math:`g` is ranked against the nodes
    :math:`v` of :math:`g` such that :math:`(s, v)` is not a positive pair (this removes
    :math:`t` itself and the other positive targets of :math:`s`); with
    :obj:`exclude_self`, :math:`v = s` is removed too (LRGB's ``filtered_noself``).
    Negative pairs in :obj:`edge_label_index` play no part: every non-positive node counts.

    Args:
        edge_label_index (Tensor), edge_label (Tensor): the labelled pairs, batch node ids
            (:func:`check_labelled_pairs`).
        batch (Tensor, optional): ``[N]`` sorted graph id of every node (default: one graph).
        num_nodes (int, optional): :math:`N` when :obj:`batch` is :obj:`None`
            (default: the largest index + 1).
        exclude_self (bool, optional): also remove the source itself (default: :obj:`False`).
    """
    edge_label_index = check_labelled_pairs(edge_label_index, edge_label)
    L = edge_label_index.size(1)
    device = edge_label_index.device
    if batch is None:
        if num_nodes is None:
            num_nodes = int(edge_label_index.max()) + 1 if L > 0 else 0
        batch = torch.zeros(num_nodes, dtype=torch.long, device=device)
    if batch.dim() != 1 or batch.is_floating_point():
        raise ValueError(f"expected batch of shape [N] with integer graph ids, got "
                         f"{tuple(batch.shape)} ({batch.dtype})")
    batch = batch.long()
    N = batch.numel()
    if N > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("expected a sorted batch vector (nodes of a graph contiguous, as in a "
                         "PyG Batch)")
    check_pairs_in_graphs(edge_label_index, batch)

    B = int(batch.max()) + 1 if N > 0 else 0
    counts = torch.bincount(batch, minlength=B)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    src, dst = edge_label_index[:, edge_label == 1]
    graph = batch[src]
    src_local, dst_local = src - ptr[graph], dst - ptr[graph]
    n_max = int(counts.max()) if B > 0 else 0

    cols = torch.arange(n_max, device=device)
    mask = cols.unsqueeze(0) < counts[graph].unsqueeze(1)  # [P, N_max]: nodes of the graph
    # Remove every positive target of the same source: one row of positives per distinct source.
    sources, inverse = torch.unique(src, return_inverse=True)
    positive = torch.zeros(sources.numel(), n_max, dtype=torch.bool, device=device)
    positive[inverse, dst_local] = True
    mask &= ~positive[inverse]
    if exclude_self:
        mask &= cols.unsqueeze(0) != src_local.unsqueeze(1)
    return LinkCandidates(src, dst, graph, src_local, dst_local, mask, counts)


class LinkRankingMetrics(Metric):
    r"""Mean reciprocal rank and Hits@k of link ranks (from :func:`link_ranks`), accumulated
    over batches (sums are reduced across processes in DDP). :meth:`compute` returns
    ``{'mrr': ..., 'hits@1': ..., 'hits@3': ..., 'hits@10': ...}`` (``NaN`` without a positive
    pair).

    Args:
        ks (sequence of int, optional): the k of Hits@k (default: :obj:`(1, 3, 10)`).
        reduction (str, optional): ``'graph'``: mean over graphs of the mean over each graph's
            positive pairs (LRGB; graphs without positive pairs are left out); ``'edge'``: mean
            over all positive pairs (default: :obj:`'graph'`).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, ks: Sequence[int] = LINK_HITS_KS, reduction: str = 'graph',
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.ks = tuple(int(k) for k in ks)
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"expected positive ks for Hits@k, got {self.ks}")
        if reduction not in LINK_REDUCTIONS:
            raise ValueError(f"reduction must be one of {LINK_REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.add_state('total', default=torch.zeros(1 + len(self.ks), dtype=torch.float64),
                       dist_reduce_fx='sum')
        self.add_state('count', default=torch.zeros((), dtype=torch.float64),
                       dist_reduce_fx='sum')

    def update(self, ranks: Tensor, graph: Optional[Tensor] = None) -> None:
        r"""Adds the ranks ``[P]`` of one batch (with ``reduction='graph'``, the graph of each:
        a graph's pairs must all come in the same update)."""
        ranks = ranks.detach()
        if ranks.dim() != 1:
            raise ValueError(f"expected ranks of shape [P], got {tuple(ranks.shape)}")
        if bool((ranks < 1).any()) or bool(torch.isnan(ranks).any()):
            raise ValueError("expected ranks >= 1 (ranks start at 1)")
        # [P, 1 + len(ks)]: reciprocal rank, then hit@k for every k; summed per unit (a graph or
        # a pair) as means
        stats = torch.stack([1. / ranks.double(), *[(ranks <= k).double() for k in self.ks]], 1)
        if self.reduction == 'edge' or ranks.numel() == 0:
            total, count = stats.sum(0), ranks.numel()
        else:
            if graph is None or graph.shape != ranks.shape:
                raise ValueError(f"reduction='graph' needs the graph id of every rank, of shape "
                                 f"{tuple(ranks.shape)} (got "
                                 f"{None if graph is None else tuple(graph.shape)})")
            _, unit = torch.unique(graph, return_inverse=True)
            count = int(unit.max()) + 1
            sums = stats.new_zeros(count, stats.size(1)).index_add_(0, unit, stats)
            total = (sums / torch.bincount(unit, minlength=count).unsqueeze(1)).sum(0)
        # Not in place: states reset under inference mode (trainer.validate) are inference
        # tensors, which a later update outside it may not modify.
        self.total = self.total + total.to(self.total.device)
        self.count = self.count + count

    def compute(self) -> Dict[str, Tensor]:
        values = self.total / self.count if self.count > 0 else \
            torch.full_like(self.total, float('nan'))
        names = ['mrr'] + [f'hits@{k}' for k in self.ks]
        return {name: values[i].float() for i, name in enumerate(names)}


__all__ = ['LINK_HITS_KS', 'LinkCandidates', 'LinkRankingMetrics', 'check_labelled_pairs',
           'check_pairs_in_graphs', 'filtered_link_candidates', 'link_ranks']
