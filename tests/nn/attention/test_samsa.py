import math

import pytest
import torch
import torch.nn.functional as F

from pyg_grf.nn.attention.samsa import SAMSAAttention, gumbel_like


def make(channels=16, heads=4, num_samples=3, mode='hard', **kwargs):
    m = SAMSAAttention(channels, heads=heads, num_samples=num_samples, mode=mode, **kwargs)
    with torch.no_grad():  # random support scores/keys so that support tokens compete
        m.support_score.normal_()
        m.support_kv.normal_()
    return m


def copied_weights(m):
    return {name: p.detach().clone() for name, p in m.named_parameters()}


def reference(w, x, batch, heads, k, mode='hard', noise=None, tau=1.0, training=False):
    r"""Independent re-implementation: loops over graphs and heads, explicit softmax,
    with weights copied out of the module. ``noise`` [B, M + S, H] is the Gumbel noise the
    module drew (the dense candidate layout: graph tokens padded to M, then S support)."""
    N, C = x.shape
    D = C // heads
    S = w['support_score'].size(0)
    q = (x @ w['to_q.weight'].T + w['to_q.bias']).view(N, heads, D)
    kv = (x @ w['to_kv.weight'].T + w['to_kv.bias']).view(N, heads, 2 * D)
    z = F.gelu(x @ w['score_lin1.weight'].T + w['score_lin1.bias'])
    z = z @ w['score_lin2.weight'].T + w['score_lin2.bias']
    M = int(torch.bincount(batch).max())
    out = torch.empty(N, heads, D)
    selected = {}
    for g in batch.unique().tolist():
        rows = (batch == g).nonzero().view(-1)
        n = rows.numel()
        for h in range(heads):
            cand_z = torch.cat([z[rows, h], w['support_score'][:, h]])
            cand_kv = torch.cat([kv[rows, h], w['support_kv'][:, h]])
            if noise is not None:
                cand_z = cand_z + torch.cat([noise[g, :n, h], noise[g, M:, h]])
            k_eff = min(k, n + S)
            order = torch.topk(cand_z, cand_z.numel()).indices
            top, nxt = order[:k_eff], order[k_eff:2 * k_eff] if training else order[:0]
            keys = []
            for m_ in top.tolist():
                if mode == 'soft' and training and nxt.numel() > 0:
                    acc = 0.
                    for v_ in nxt.tolist():
                        p = torch.sigmoid((cand_z[m_] - cand_z[v_]) / tau)
                        acc = acc + p * cand_kv[m_] + (1 - p) * cand_kv[v_]
                    keys.append(acc / nxt.numel())
                else:
                    keys.append(cand_kv[m_])
            keys = torch.stack(keys)
            kk, vv = keys[:, :D], keys[:, D:]
            att = torch.softmax(q[rows, h] @ kk.T / math.sqrt(D), dim=-1)
            out[rows, h] = att @ vv
            selected[(g, h)] = top
    out = out.reshape(N, C) @ w['to_out.weight'].T + w['to_out.bias']
    return out, selected


def global_index(selected, batch, N):
    """Map (graph-local / support) candidate positions to the module's global indices."""
    counts = torch.bincount(batch)
    ptr = torch.cumsum(counts, 0) - counts
    res = {}
    for (g, h), top in selected.items():
        n = int(counts[g])
        res[(g, h)] = torch.where(top < n, ptr[g] + top, N + top - n)
    return res


BATCH = torch.tensor([0] * 7 + [1] * 2 + [2] * 12)


def test_samsa_repr_and_shapes():
    m = SAMSAAttention(64, heads=4, num_samples=32, mode='hard')
    assert str(m) == "SAMSAAttention(64, heads=4, num_samples=32, mode='hard')"
    assert m.num_support == 64
    assert m.support_kv.shape == (64, 4, 32) and m.support_score.shape == (64, 4)
    x = torch.randn(21, 64)
    assert m(x).shape == (21, 64)
    assert m(x, BATCH).shape == (21, 64)
    out, index = m(x, BATCH, return_index=True)
    assert out.shape == (21, 64) and index.shape == (3, 32, 4)


@pytest.mark.parametrize('mode', ['soft', 'hard'])
def test_samsa_eval_selects_topk(mode):
    m = make(mode=mode).eval()
    x = torch.randn(BATCH.numel(), 16)
    w = copied_weights(m)
    out, index = m(x, BATCH, return_index=True)
    ref, selected = reference(w, x, BATCH, heads=4, k=3)
    selected = global_index(selected, BATCH, x.size(0))
    for (g, h), top in selected.items():
        assert torch.equal(index[g, :, h], top)  # same indices, same (descending) order
        assert index[g, :, h].unique().numel() == 3  # no duplicates
    assert torch.allclose(out, ref, atol=1e-5)


def test_samsa_hard_train_equals_attention_over_selected():
    m = make(mode='hard').train()
    x = torch.randn(BATCH.numel(), 16)
    w = copied_weights(m)
    torch.manual_seed(0)
    out, index = m(x, BATCH, return_index=True)
    torch.manual_seed(0)  # the Gumbel noise is the first random draw of forward
    M, S = int(torch.bincount(BATCH).max()), m.num_support
    noise = gumbel_like(torch.empty(3, M + S, 4))
    ref, selected = reference(w, x, BATCH, heads=4, k=3, noise=noise, training=True)
    for (g, h), top in global_index(selected, BATCH, x.size(0)).items():
        assert torch.equal(index[g, :, h], top)
        assert index[g, :, h].unique().numel() == 3
    # hard: forward is exactly attention over the selected (+ support) tokens only
    assert torch.allclose(out, ref, atol=1e-5)


def test_samsa_soft_train_matches_relaxed_mixture():
    m = make(mode='soft', tau=0.7).train()
    x = torch.randn(BATCH.numel(), 16)
    w = copied_weights(m)
    torch.manual_seed(1)
    out = m(x, BATCH)
    torch.manual_seed(1)
    M, S = int(torch.bincount(BATCH).max()), m.num_support
    noise = gumbel_like(torch.empty(3, M + S, 4))
    ref, _ = reference(w, x, BATCH, heads=4, k=3, mode='soft', noise=noise, tau=0.7,
                       training=True)
    assert torch.allclose(out, ref, atol=1e-5)
    hard, _ = reference(w, x, BATCH, heads=4, k=3, mode='hard', noise=noise, training=True)
    assert not torch.allclose(out, hard, atol=1e-3)


@pytest.mark.parametrize('mode', ['soft', 'hard'])
def test_samsa_gradients(mode):
    m = SAMSAAttention(16, heads=2, num_samples=4, mode=mode).train()
    batch = torch.tensor([0] * 3 + [1] * 20)  # graph 0 has fewer than k tokens
    x = torch.randn(23, 16, requires_grad=True)
    m(x, batch).square().sum().backward()
    for name in ['score_lin1.weight', 'score_lin2.weight', 'score_lin2.bias',
                 'support_kv', 'support_score', 'to_q.weight', 'to_kv.weight']:
        grad = dict(m.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
        assert torch.isfinite(grad).all()
    assert x.grad.abs().sum() > 0


def test_samsa_no_estimator_in_eval():
    m = SAMSAAttention(16, heads=2, num_samples=4).eval()
    m(torch.randn(30, 16)).sum().backward()
    assert m.score_lin1.weight.grad is None or m.score_lin1.weight.grad.abs().sum() == 0
    assert m.support_score.grad is None or m.support_score.grad.abs().sum() == 0


@pytest.mark.parametrize('num_support', [0, None])
def test_samsa_graph_smaller_than_k(num_support):
    m = make(num_samples=5, num_support=num_support).eval()
    batch = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 1])
    x = torch.randn(9, 16)
    out, index = m(x, batch, return_index=True)
    assert torch.isfinite(out).all()
    ref, selected = reference(copied_weights(m), x, batch, heads=4, k=5)
    assert torch.allclose(out, ref, atol=1e-5)
    if num_support == 0:  # graph 0: only its 2 tokens, the 3 other slots are empty
        assert (index[0, :2] >= 0).all() and (index[0, 2:] == -1).all()
        assert (index[1] >= 2).all()
    else:  # topped up by the 10 support tokens
        assert (index >= 0).all() and (index[0] >= 9).sum() >= 3
    m.train()
    out = m(x, batch)
    assert torch.isfinite(out).all()
    out.sum().backward()


@pytest.mark.parametrize('mode', ['soft', 'hard'])
def test_samsa_batch_equals_separate_graphs(mode):
    m = make(mode=mode).eval()
    x = torch.randn(BATCH.numel(), 16)
    out = m(x, BATCH)
    for g in range(3):
        mask = BATCH == g
        assert torch.allclose(out[mask], m(x[mask]), atol=1e-5)


def test_samsa_attention_dropout_runs():
    m = SAMSAAttention(16, heads=2, num_samples=4, dropout=0.5).train()
    assert m(torch.randn(12, 16)).shape == (12, 16)


def test_samsa_bad_input():
    with pytest.raises(ValueError, match='at least 1'):
        SAMSAAttention(16, num_samples=0)
    with pytest.raises(ValueError, match="Unknown mode 'medium'"):
        SAMSAAttention(16, mode='medium')
    with pytest.raises(ValueError, match='divisible'):
        SAMSAAttention(16, heads=3)
    with pytest.raises(ValueError, match='non-negative'):
        SAMSAAttention(16, num_support=-1)
    with pytest.raises(ValueError, match='tau'):
        SAMSAAttention(16, tau=0.)
    m = SAMSAAttention(16, heads=2, num_samples=4)
    with pytest.raises(ValueError, match=r'Expected \'x\' of shape \[N, 16\]'):
        m(torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"Expected 'batch' of shape \[5\]"):
        m(torch.randn(5, 16), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize('batch', [[0, 1, 0, 1, 2, 0], [2, 2, 0, 1, 1, 0], [1, 0, 1, 0, 1, 0]])
def test_unsorted_batch_equals_each_graph_alone(batch):
    from pyg_grf.nn import SAMSAAttention
    torch.manual_seed(0)
    layer = SAMSAAttention(8, heads=2, num_samples=2).eval()
    x = torch.randn(6, 8)
    batch = torch.tensor(batch)
    out, index = layer(x, batch, return_index=True)
    assert out.shape == (6, 8)  # was 5, 3 or 4 rows
    # Independent reference: every graph on its own.
    for g in batch.unique():
        rows = (batch == g).nonzero().view(-1)
        ref, ref_index = layer(x[rows], return_index=True)
        assert torch.allclose(out[rows], ref, atol=1e-6)
        # The selected tokens are reported as rows of the input (support tokens as N + s).
        got = index[int(g)]
        want = torch.where((ref_index >= 0) & (ref_index < rows.numel()),
                           rows[ref_index.clamp(0, rows.numel() - 1)],
                           torch.where(ref_index >= rows.numel(), ref_index - rows.numel() + 6,
                                       ref_index))
        assert torch.equal(got, want[0])
