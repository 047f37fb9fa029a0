r"""Filtered MRR / Hits@k (LRGB PCQM-Contact) against independent references on fixed scores:
a per-pair Python loop (ties counted half), the LRGB procedure (dense -inf filter + argsort) on
untied scores, and OGB's link-prediction evaluator."""
import math

import numpy as np
import pytest
import torch

from pyg_grf.lightning.link_metrics import LinkRankingMetrics, filtered_link_candidates, link_ranks
from tests.lightning.helpers import filtered_link_ranks, link_ranking_metrics


def reference_ranks(scores, pairs, labels, exclude_self=False):
    r"""Per graph, per positive pair (s, t), in the order given: 1 + #(candidates scoring above)
    + #(tied candidates) / 2, the candidates being the nodes v of the graph with (s, v) not a
    positive pair (and v != s with exclude_self). Plain loops over numpy arrays."""
    out = []  # (graph, rank)
    for g, (S, P, y) in enumerate(zip(scores, pairs, labels)):
        positives = {(int(s), int(t)) for (s, t), lab in zip(P, y) if lab == 1}
        for (s, t), lab in zip(P, y):
            if lab != 1:
                continue
            s, t = int(s), int(t)
            above = tied = 0
            for v in range(S.shape[0]):
                if (s, v) in positives or (exclude_self and v == s):
                    continue
                if S[s, v] > S[s, t]:
                    above += 1
                elif S[s, v] == S[s, t]:
                    tied += 1
            out.append((g, 1 + above + 0.5 * tied))
    return out


def reference_metrics(per_pair, reduction='graph', ks=(1, 3, 10)):
    def stats(ranks):
        return [sum(1 / r for r in ranks) / len(ranks)] + \
            [sum(r <= k for r in ranks) / len(ranks) for k in ks]
    if reduction == 'edge':
        return stats([r for _, r in per_pair])
    graphs = sorted({g for g, _ in per_pair})
    per_graph = [stats([r for g2, r in per_pair if g2 == g]) for g in graphs]
    return [sum(col) / len(col) for col in zip(*per_graph)]


def random_case(seed, sizes=(5, 1, 7, 3, 6, 4), num_levels=3):
    r"""Graphs of the given sizes with integer scores in [0, num_levels) (many ties), random
    positive and negative pairs (repeats allowed), one graph without any positive."""
    rng = np.random.default_rng(seed)
    scores, pairs, labels = [], [], []
    for g, n in enumerate(sizes):
        S = rng.integers(0, num_levels, size=(n, n)).astype(np.float32)
        L = int(rng.integers(1, 3 * n + 1))
        P = rng.integers(0, n, size=(L, 2))
        y = rng.integers(0, 2, size=L)
        if g == 3:
            y[:] = 0  # no positive pair in this graph
        scores.append(S)
        pairs.append(P)
        labels.append(y)
    return scores, pairs, labels


def to_batch(scores, pairs, labels):
    r"""The batched inputs: dense [B, N_max, N_max] scores, global edge_label_index, batch."""
    sizes = [S.shape[0] for S in scores]
    n_max, offsets = max(sizes), np.cumsum([0] + sizes[:-1])
    dense = torch.full((len(sizes), n_max, n_max), float('nan'),  # padding is never read
                       dtype=torch.from_numpy(scores[0]).dtype)
    for g, S in enumerate(scores):
        dense[g, :S.shape[0], :S.shape[0]] = torch.from_numpy(S)
    index = torch.cat([torch.from_numpy(P.T + o) for P, o in zip(pairs, offsets)], 1).long()
    label = torch.cat([torch.from_numpy(y) for y in labels])
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return dense, index, label, batch


def test_hand_computed_example():
    # One graph, 4 nodes; positives (0, 1), (0, 2), (2, 3).
    S = torch.tensor([[5., 2., 2., 2.],
                      [0., 0., 0., 0.],
                      [1., 3., 1., 0.],
                      [0., 0., 0., 0.]])
    index = torch.tensor([[0, 0, 2, 1], [1, 2, 3, 0]])
    label = torch.tensor([1, 1, 1, 0])
    ranks, graph = filtered_link_ranks(S, index, label)
    # (0, 1): candidates {0, 3} (1 and 2 are positives of 0): 5 above, 2 tied -> 1 + 1 + 0.5.
    # (0, 2): the same candidates and scores -> 2.5.
    # (2, 3): candidates {0, 1, 2}: 1, 3, 1 all above 0 -> 4.
    assert ranks.tolist() == [2.5, 2.5, 4.0] and graph.tolist() == [0, 0, 0]
    ranks, _ = filtered_link_ranks(S, index, label, exclude_self=True)
    assert ranks.tolist() == [1.5, 1.5, 3.0]  # 0 is no candidate of 0, 2 none of 2
    out = link_ranking_metrics(torch.tensor([2.5, 2.5, 4.0]), reduction='edge')
    assert out['mrr'].item() == pytest.approx((0.4 + 0.4 + 0.25) / 3)
    assert [out[f'hits@{k}'].item() for k in (1, 3, 10)] == pytest.approx([0, 2 / 3, 1])


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('exclude_self', [False, True])
@pytest.mark.parametrize('reduction', ['graph', 'edge'])
def test_equals_loop_reference_with_ties(seed, exclude_self, reduction):
    scores, pairs, labels = random_case(seed)
    dense, index, label, batch = to_batch(scores, pairs, labels)
    ranks, graph = filtered_link_ranks(dense, index, label, batch, exclude_self=exclude_self)
    ref = reference_ranks(scores, pairs, labels, exclude_self)
    assert [(int(g), float(r)) for g, r in zip(graph, ranks)] == ref
    assert any(r != int(r) for _, r in ref)  # ties did occur
    out = link_ranking_metrics(ranks, graph, reduction=reduction)
    expected = reference_metrics(ref, reduction)
    got = [out[k].item() for k in ('mrr', 'hits@1', 'hits@3', 'hits@10')]
    assert got == pytest.approx(expected, rel=1e-6)


def lrgb_procedure(scores, pairs, labels, noself=False):
    r"""The LRGB code's filtered MRR for one graph at a time: positives scored -inf in a copy of
    the score matrix, the positive prepended to its source's row, rank = 1 + position of the
    positive in argsort(descending); the mean over the graph's positives, then over graphs."""
    per_graph = []
    for S, P, y in zip(scores, pairs, labels):
        S = torch.from_numpy(S).double()
        pos = torch.from_numpy(P[y == 1].T).long()
        if pos.size(1) == 0:
            continue
        pred_pos = S[pos[0], pos[1]]
        masked = S.clone()
        masked[pos[0], pos[1]] = -math.inf
        if noself:
            masked.fill_diagonal_(-math.inf)
        y_pred = torch.cat([pred_pos.view(-1, 1), masked[pos[0]]], dim=1)
        rank = (torch.argsort(y_pred, dim=1, descending=True) == 0).nonzero()[:, 1] + 1
        per_graph.append([(1. / rank).mean().item()] +
                         [(rank <= k).double().mean().item() for k in (1, 3, 10)])
    return np.mean(per_graph, axis=0)


@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('noself', [False, True])
def test_equals_lrgb_procedure_without_ties(seed, noself):
    # Continuous scores: no ties, so LRGB's argsort order is well defined and must agree.
    scores, pairs, labels = random_case(seed, sizes=(12, 3, 30, 8, 17))
    rng = np.random.default_rng(100 + seed)
    scores = [rng.normal(size=S.shape).astype(np.float64) for S in scores]
    dense, index, label, batch = to_batch(scores, pairs, labels)
    ranks, graph = filtered_link_ranks(dense, index, label, batch, exclude_self=noself)
    out = link_ranking_metrics(ranks, graph)
    expected = lrgb_procedure(scores, pairs, labels, noself)
    got = [out[k].item() for k in ('mrr', 'hits@1', 'hits@3', 'hits@10')]
    assert got == pytest.approx(list(expected), rel=1e-6)


def test_equals_ogb_evaluator_with_ties():
    # OGB's evaluator ranks a positive among a fixed-width row of negatives, ties counted half;
    # filtered-out candidates become -inf padding (never above or tied with a finite score).
    ogb_eval = pytest.importorskip('ogb.linkproppred').Evaluator('ogbl-citation2')
    scores, pairs, labels = random_case(7, sizes=(6, 9, 4))
    dense, index, label, batch = to_batch(scores, pairs, labels)
    cand = filtered_link_candidates(index, label, batch)
    rows = dense[cand.graph, cand.src_local]
    pos = rows.gather(1, cand.dst_local.unsqueeze(1)).squeeze(1)
    neg = rows.masked_fill(~cand.mask, -math.inf)
    res = ogb_eval.eval({'y_pred_pos': pos, 'y_pred_neg': neg})
    ranks, graph = filtered_link_ranks(dense, index, label, batch)
    assert torch.allclose(1. / ranks.float(), res['mrr_list'])
    for k in (1, 3, 10):
        assert torch.equal((ranks <= k).float(), res[f'hits@{k}_list'])


def test_metric_accumulates_batches():
    scores, pairs, labels = random_case(3, sizes=(5, 6, 2, 7, 4, 6, 3))
    metric = LinkRankingMetrics()
    for lo, hi in ((0, 3), (3, 5), (5, 7)):  # whole graphs per update, as in a DataLoader
        dense, index, label, batch = to_batch(scores[lo:hi], pairs[lo:hi], labels[lo:hi])
        ranks, graph = filtered_link_ranks(dense, index, label, batch)
        metric.update(ranks, graph + lo)
    out = metric.compute()
    expected = reference_metrics(reference_ranks(scores, pairs, labels))
    assert [out[k].item() for k in ('mrr', 'hits@1', 'hits@3', 'hits@10')] == \
        pytest.approx(expected, rel=1e-6)
    metric.reset()
    with pytest.warns(UserWarning, match='before the ``update``'):
        assert math.isnan(metric.compute()['mrr'].item())  # nothing seen yet
    edge = LinkRankingMetrics(ks=(2, ), reduction='edge')
    edge.update(torch.tensor([1., 2., 4.]))
    assert set(edge.compute()) == {'mrr', 'hits@2'}
    assert edge.compute()['hits@2'].item() == pytest.approx(2 / 3)


def test_link_ranks_plain():
    pos = torch.tensor([0.5, 2.0])
    cand = torch.tensor([[1.0, 0.5, 0.0], [2.0, 2.0, 9.0]])
    assert link_ranks(pos, cand).tolist() == [2.5, 3.0]
    mask = torch.tensor([[False, True, True], [True, False, False]])
    assert link_ranks(pos, cand, mask).tolist() == [1.5, 1.5]


def test_bad_input():
    S = torch.zeros(2, 4, 4)
    index = torch.tensor([[0, 4], [1, 5]])
    label = torch.tensor([1, 1])
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    filtered_link_ranks(S, index, label, batch)  # fine
    with pytest.raises(ValueError, match=r"expected edge_label_index \[2, L\] and edge_label "
                                         r"\[L\], got \(2, 2\) and \(3,\)"):
        filtered_link_ranks(S, index, torch.tensor([1, 0, 1]), batch)
    with pytest.raises(ValueError, match=r"expected edge_label in \{0, 1\} \(1 = link\), got "
                                         r"values such as \[2\]"):
        filtered_link_ranks(S, index, torch.tensor([1, 2]), batch)
    with pytest.raises(ValueError, match=r"\[2, L\] and edge_label \[L\], got \(3, 2\)"):
        filtered_link_ranks(S, torch.zeros(3, 2, dtype=torch.long), label, batch)
    with pytest.raises(ValueError, match="pair 1 joins graphs 0 and 1"):
        filtered_link_ranks(S, torch.tensor([[0, 1], [1, 5]]), label, batch)
    with pytest.raises(ValueError, match=r"outside \[0, 8\)"):
        filtered_link_ranks(S, torch.tensor([[0, 4], [1, 8]]), label, batch)
    with pytest.raises(ValueError, match="sorted batch"):
        filtered_link_ranks(S, index, label, batch.flip(0))
    S_nan = S.clone()
    S_nan[0, 0, 2] = float('nan')
    with pytest.raises(ValueError, match="NaN scores"):
        filtered_link_ranks(S_nan, index, label, batch)
    with pytest.raises(ValueError, match=r"cand_score of shape \[P=2, C\], got \(3, 4\)"):
        link_ranks(torch.zeros(2), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="reduction must be one of"):
        LinkRankingMetrics(reduction='mean')
    with pytest.raises(ValueError, match="positive ks"):
        link_ranking_metrics(torch.ones(2), ks=(0, ))
    with pytest.raises(ValueError, match="needs the graph id of every rank"):
        link_ranking_metrics(torch.ones(2))
