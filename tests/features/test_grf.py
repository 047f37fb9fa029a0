import math

import numpy as np
import pytest
import torch

from pyg_grf.features import (
    deconvolve,
    dense_adjacency,
    graph_random_features,
    grf_constant,
    grf_loads,
    grf_tail_bound,
    normalized_adjacency,
    power_series_kernel,
    required_walks,
    self_convolution,
    sparsity_bound,
)
from pyg_grf.walks import sample_walks
from tests.utils import er_graph, grid_graph, path_graph

F = torch.tensor([1.0, 0.5, 0.3, 0.2], dtype=torch.float64)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- exact references

def test_normalized_adjacency_matches_dense_formula():
    ei = er_graph(12, 0.3, seed=1)
    N = 12
    w = torch.rand(ei.size(1), dtype=torch.float64) + 0.5
    A = torch.zeros(N, N, dtype=torch.float64).index_put((ei[0], ei[1]), w, accumulate=True)
    d = A.sum(1)
    dinv = torch.where(d > 0, d.pow(-0.5), torch.zeros_like(d))
    d_in = A.sum(0)  # 'sym' is D_out^-1/2 A D_in^-1/2 (the weights here differ per direction)
    dinv_in = torch.where(d_in > 0, d_in.pow(-0.5), torch.zeros_like(d_in))
    ref = dinv[:, None] * A * dinv_in[None, :]
    assert torch.allclose(dense_adjacency(ei, N, w, 'sym'), ref)
    rinv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    assert torch.allclose(dense_adjacency(ei, N, w, 'rw'), rinv[:, None] * A)
    assert torch.allclose(dense_adjacency(ei, N, w, None), A)


def test_power_series_kernel_matches_numpy_matrix_powers():
    ei = grid_graph(3, 4)
    W = dense_adjacency(ei, 12).numpy()
    alpha = [0.7, -0.2, 0.4, 0.1, 0.05]
    ref = sum(a * np.linalg.matrix_power(W, k) for k, a in enumerate(alpha))
    assert np.allclose(power_series_kernel(ei, 12, alpha).numpy(), ref)
    heads = torch.tensor([alpha, alpha[::-1]], dtype=torch.float64)
    out = power_series_kernel(ei, 12, heads)
    assert out.shape == (2, 12, 12) and np.allclose(out[0].numpy(), ref)


def test_deconvolve_inverts_self_convolution():
    alpha = torch.tensor([2.0, 0.3, -0.4, 0.25, 0.1], dtype=torch.float64)
    f = deconvolve(alpha)
    assert torch.allclose(self_convolution(f)[:5], alpha)
    # closed form: alpha_k = 1 for all k gives f = binom(-1/2, k) (-1)^k
    f = deconvolve(torch.ones(5, dtype=torch.float64))
    ref = torch.tensor([math.comb(2 * k, k) / 4 ** k for k in range(5)], dtype=torch.float64)
    assert torch.allclose(f, ref)
    with pytest.raises(ValueError, match='positive'):
        deconvolve([0.0, 1.0])


# ---------------------------------------------------------------- loads

def test_loads_are_unbiased_per_hop_count():
    # E[load(i, q, l)] = (W^l)_iq for every hop count l: per-walk loads are iid, so the
    # tolerance follows from their sample variance.
    ei = grid_graph(4, 4)
    N, L, n = 16, 3, 4000
    rw = sample_walks(ei, N, n, 0.4, L, generator=gen(7))
    # mean loads via the public function on these walks, and per-walk second moments
    idx, hop, load = grf_loads(ei, N, n, 0.4, L, walks=rw, dtype=torch.float64)
    est = torch.zeros(L + 1, N, N, dtype=torch.float64)
    est[hop, idx[0], idx[1]] = load
    idx2, hop2, sq = grf_loads(ei, N, 1, 0.4, L, walks=rw._replace(num_walks=1),
                               dtype=torch.float64)
    # (sum over walks of loads)^2 is not the second moment; bound the variance instead by
    # (max load) * mean: loads are products of at most L weights d/(1-p) * W <= (2/0.6)^L
    W = dense_adjacency(ei, N)
    for l in range(L + 1):
        ref = torch.linalg.matrix_power(W, l)
        bound = (W.max() * 4 / 0.6) ** l  # max single-walk load at hop l (max degree 4)
        se = torch.sqrt(bound * ref / n)
        assert bool(((est[l] - ref).abs() <= 5 * se + 1e-12).all()), l


def test_adhoc_loads_count_visits():
    ei = path_graph(4)
    idx, hop, load = grf_loads(ei, 4, 5, None, 3, importance=False, fixed_length=True,
                               generator=gen(0))
    # fixed-length walks: every walk makes exactly one visit per hop count, weight 1/n each
    totals = torch.zeros(4, 4, dtype=load.dtype).index_add_(0, hop, torch.zeros(hop.numel(), 4,
                                                                         dtype=load.dtype))
    per_start_hop = torch.zeros(4, 4, dtype=load.dtype)
    per_start_hop.index_put_((idx[0], hop), load, accumulate=True)
    assert torch.allclose(per_start_hop, torch.ones(4, 4, dtype=load.dtype))
    assert totals.sum() == 0


def test_loads_sorted_and_coalesced():
    ei = er_graph(20, 0.2, seed=3)
    idx, hop, load = grf_loads(ei, 20, 8, 0.3, 4, generator=gen(1))
    key = (idx[0] * 20 + idx[1]) * 5 + hop
    assert bool((key[1:] > key[:-1]).all())
    # hop 0 is the start itself with load 1
    zero = hop == 0
    assert torch.equal(idx[0, zero], idx[1, zero]) and bool((load[zero] == 1).all())


# ---------------------------------------------------------------- unbiasedness of the kernel

def _kernel_samples(ei, N, f, walker, repeats, num_walks=6, p_halt=0.4, L=3, seed=0,
                    independent_keys=False, importance=True):
    g = gen(seed)
    samples = []
    for _ in range(repeats):
        def draw():
            return graph_random_features(ei, N, f, num_walks, p_halt, L, walker=walker,
                                         generator=g, importance=importance).to_dense()
        phi = draw()
        samples.append(phi @ (draw() if independent_keys else phi).T)
    return torch.stack(samples)


def _kernel_stats(*args, **kwargs):
    s = _kernel_samples(*args, **kwargs)
    return s.mean(0), s.std(0) / math.sqrt(s.size(0))


def _unbiasedness_stats(samples, exact, include_diagonal=False):
    """z-scores of the Monte Carlo mean against the exact kernel. The estimator is heavy-tailed
    (importance weights of rare long walks), so sample standard errors of rarely-hit entries are
    unreliable: we check (a) mean z^2 over all entries (~1 if unbiased) and (b) max z over
    entries hit by at least 20% of the samples."""
    R, N = samples.size(0), samples.size(1)
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(R)
    sel = se > 0
    if not include_diagonal:
        sel &= ~torch.eye(N, dtype=torch.bool)
    z = (mean - exact).abs() / (se + 1e-300)
    well = sel & ((samples != 0).double().mean(0) >= 0.2)
    # entries that no sample ever reached must be zero in the exact kernel too
    unreached = ~(se > 0) & (samples[0] == mean)
    if not include_diagonal:
        unreached &= ~torch.eye(N, dtype=torch.bool)
    worst_unreached = float(exact[unreached].abs().max()) if bool(unreached.any()) else 0.0
    return float(z[sel].pow(2).mean()), float(z[well].max()), worst_unreached


@pytest.mark.parametrize('walker', ['iid', 'antithetic', 'repelling'])
@pytest.mark.parametrize('graph', ['grid', 'er'])
def test_grf_kernel_unbiased_off_diagonal(walker, graph):
    ei, N = (grid_graph(5, 5), 25) if graph == 'grid' else (er_graph(24, 0.15, seed=2), 24)
    exact = power_series_kernel(ei, N, self_convolution(F))
    samples = _kernel_samples(ei, N, F, walker, repeats=200)
    mean_z2, max_z, unreached = _unbiasedness_stats(samples, exact)
    # measured over seeds 0-2 for all schemes: mean z^2 in [0.99, 1.41], max z in [3.0, 5.9]
    assert mean_z2 < 2.0 and max_z < 6.5 and unreached < 1e-12, (mean_z2, max_z, unreached)


def test_unbiasedness_check_detects_a_biased_estimator():
    # Negative control: the ad-hoc estimator (Eq. 21, no importance weights) is not an
    # estimate of sum_k alpha_k W^k and must fail the same check.
    ei, N = grid_graph(5, 5), 25
    exact = power_series_kernel(ei, N, self_convolution(F))
    samples = _kernel_samples(ei, N, F, 'iid', repeats=200, importance=False)
    mean_z2, _, _ = _unbiasedness_stats(samples, exact)
    assert mean_z2 > 20.0


def test_grf_error_shrinks_with_repeats():
    ei, N = grid_graph(5, 5), 25
    exact = power_series_kernel(ei, N, self_convolution(F))
    off = ~torch.eye(N, dtype=torch.bool)
    errs = []
    for R in (20, 320):
        mean, _ = _kernel_stats(ei, N, F, 'iid', repeats=R, seed=11)
        errs.append(((mean - exact)[off] ** 2).mean().sqrt().item())
    # RMSE ~ 1/sqrt(R): 16x the repeats should give ~4x smaller error
    assert errs[1] < errs[0] / 2.5, errs


def test_diagonal_bias_and_independent_keys():
    ei, N = grid_graph(4, 4), 16
    exact = power_series_kernel(ei, N, self_convolution(F))
    mean, se = _kernel_stats(ei, N, F, 'iid', repeats=300, seed=5)
    # same walks on both sides: the diagonal is biased upwards by the estimator's variance
    z_diag = (mean - exact).diagonal() / se.diagonal()
    assert bool((z_diag > 2).all()) and float(z_diag.mean()) > 5, z_diag
    samples = _kernel_samples(ei, N, F, 'iid', repeats=300, seed=5, independent_keys=True)
    mean_z2, max_z, _ = _unbiasedness_stats(samples, exact, include_diagonal=True)
    assert mean_z2 < 2.0 and max_z < 6.5, (mean_z2, max_z)
    z_diag = ((samples.mean(0) - exact).diagonal() / (samples.std(0).diagonal() / math.sqrt(300)))
    assert float(z_diag.abs().max()) < 5.0


def test_feature_expectation_is_truncated_power_series():
    ei, N = er_graph(15, 0.25, seed=4), 15
    W = dense_adjacency(ei, N)
    ref = sum(F[l] * torch.linalg.matrix_power(W, l) for l in range(4))
    phis = torch.stack([graph_random_features(ei, N, F, 10, 0.3, 3, generator=gen(s)).to_dense()
                        for s in range(200)])
    mean, se = phis.mean(0), phis.std(0) / math.sqrt(200)
    assert float(((mean - ref).abs() / (se + 1e-12))[se > 0].max()) < 5.0


@pytest.mark.slow
def test_variance_reduction():
    # antithetic and repelling walkers beat iid at equal numbers of walks (figures in README)
    ei, N = grid_graph(6, 6), 36
    f = deconvolve(torch.tensor([1.0, 0.6, 0.36, 0.216], dtype=torch.float64))
    exact = power_series_kernel(ei, N, self_convolution(f))
    off = ~torch.eye(N, dtype=torch.bool)
    mse = {}
    for walker in ('iid', 'antithetic', 'repelling'):
        g = gen(0)
        errs = torch.stack([
            ((lambda P: (P @ P.T - exact)[off].pow(2).mean())(
                graph_random_features(ei, N, f, 8, 0.5, 3, walker=walker, generator=g).to_dense()))
            for _ in range(300)])
        mse[walker] = (errs.mean().item(), errs.std().item() / math.sqrt(300))
    for w in ('antithetic', 'repelling'):
        diff = mse['iid'][0] - mse[w][0]
        assert diff > 4 * math.hypot(mse['iid'][1], mse[w][1]), mse


@pytest.mark.data
def test_grf_unbiased_on_mutag_graph(mirror):
    from pyg_grf.datasets import load_tu
    data = load_tu('MUTAG')[0]
    N = data.num_nodes
    exact = power_series_kernel(data.edge_index, N, self_convolution(F))
    samples = _kernel_samples(data.edge_index, N, F, 'repelling', repeats=200)
    mean_z2, max_z, unreached = _unbiasedness_stats(samples, exact)
    # Pairs at distance 2L have kernel values ~1e-4 that 200 samples of 6 walks may never
    # co-reach: the original sampler left 4.8e-4 and 2.6e-4 unreached at seeds 1 and 3 (and 0 at
    # seed 0, by chance). Bias shows in the z-scores; unreached entries only need to be tiny.
    assert mean_z2 < 2.0 and max_z < 6.5 and unreached < 1e-3, (mean_z2, max_z, unreached)


# ---------------------------------------------------------------- bounds

def test_required_walks_satisfies_thm_3_1():
    c = grf_constant(F, max_weighted_degree=1.0, p_halt=0.5)
    assert c == pytest.approx(sum(float(F[k]) * 2.0 ** k for k in range(4)))
    for t, delta in [(0.5, 0.1), (1.0, 0.01), (2.0, 0.05)]:
        n = required_walks(t, delta, c)
        assert grf_tail_bound(t, n, c) <= delta
        if n > 1:
            assert grf_tail_bound(t, n - 1, c) > delta
    with pytest.raises(ValueError, match='delta'):
        required_walks(0.1, 1.5, c)


def test_sparsity_bound_holds_empirically():
    ei = grid_graph(30, 30)
    n, p, delta = 8, 0.3, 0.05
    bound = sparsity_bound(n, p, delta)
    phi = graph_random_features(ei, 900, torch.ones(51), n, p, 50, generator=gen(0))
    # nonzeros per row (each walk of length b visits at most b new nodes beyond the start)
    nnz = torch.bincount(phi.indices()[0], minlength=900) - 1
    assert (nnz <= bound).double().mean().item() >= 1 - delta - 0.02


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize('kwargs,match', [
    (dict(edge_weight=torch.tensor([1.0, float('nan'), 1.0, 1.0])), 'finite'),
    (dict(edge_weight=torch.tensor([1.0, 1.0])), r'shape \[4\]'),
    (dict(edge_weight=torch.tensor([1.0, -1.0, 1.0, 1.0])), 'positive'),
    (dict(normalization='l2'), 'normalization'),
])
def test_bad_weights(kwargs, match):
    with pytest.raises(ValueError, match=match):
        graph_random_features(path_graph(3), 3, F, 2, 0.5, 3, **kwargs)


def test_bad_f_and_walk_args():
    with pytest.raises(ValueError, match='p_halt'):
        graph_random_features(path_graph(3), 3, F, 2, 1.5, 3)
    with pytest.raises(ValueError, match='num_walks'):
        graph_random_features(path_graph(3), 3, F, 0, 0.5, 3)
    with pytest.raises(ValueError, match='1-D'):
        graph_random_features(path_graph(3), 3, F.view(2, 2), 2, 0.5, 3)


def test_isolated_nodes_and_empty_graph():
    ei = torch.tensor([[0, 1], [1, 0]])
    phi = graph_random_features(ei, 4, F, 3, 0.5, 3, generator=gen(0)).to_dense()
    # isolated nodes 2, 3 only see themselves with f_0
    assert torch.allclose(phi[2:], torch.eye(4, dtype=phi.dtype)[2:] * F[0])
    empty = graph_random_features(torch.empty(2, 0, dtype=torch.long), 0, F, 3, 0.5, 3)
    assert empty.shape == (0, 0)


def test_sym_normalisation_of_an_edge_into_a_sink():
    ei = torch.tensor([[0, 0, 1], [1, 2, 2]])  # 2 is a sink
    w = normalized_adjacency(ei, 3, normalization='sym')
    # D_out^-1/2 A D_in^-1/2: out-degrees (2, 1, 0), in-degrees (0, 1, 2).
    ref = torch.tensor([1 / (2 * 1) ** 0.5, 1 / (2 * 2) ** 0.5, 1 / (1 * 2) ** 0.5])
    assert torch.allclose(w, ref)  # the edges into the sink used to get weight 0


def test_directed_graph_warns_and_estimates_F():
    from pyg_grf.features import DirectedGraphWarning, graph_random_features
    from pyg_grf.features.exact import dense_adjacency
    ei = torch.tensor([[0, 0, 1, 2, 3, 1], [1, 2, 2, 3, 1, 3]])  # directed, no sinks
    f = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    with pytest.warns(DirectedGraphWarning, match=r'not symmetric .* estimates F F\^T, not the '
                                                  r'power-series kernel'):
        phi = graph_random_features(ei, 4, f, 20000, 0.3, 2,
                                    generator=torch.Generator().manual_seed(0)).to_dense()
    W = dense_adjacency(ei, 4, normalization='sym').double()
    F = f[0] * torch.eye(4, dtype=torch.float64) + f[1] * W + f[2] * W @ W
    assert torch.allclose(phi, F, atol=0.03)  # unbiased for F = sum_l f_l W^l
    # ... and Phi Phi^T is near F F^T, far from sum_k (f*f)_k W^k, which the docs claimed.
    ff = torch.tensor([1.0, 1.0, 0.75, 0.25, 0.0625], dtype=torch.float64)
    series = sum(c * torch.linalg.matrix_power(W, k) for k, c in enumerate(ff))
    gram = phi @ phi.t()
    off = ~torch.eye(4, dtype=torch.bool)
    assert (gram - F @ F.t())[off].abs().max() < 0.05 < (gram - series)[off].abs().max()


def test_symmetric_graph_does_not_warn():
    import warnings as _w

    from pyg_grf.features import graph_random_features
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    with _w.catch_warnings():
        _w.simplefilter('error')
        graph_random_features(ei, 3, [1.0, 0.5], 4, 0.5, 1)
