import math

import pytest
import torch
from torch_geometric.utils import erdos_renyi_graph, to_undirected

from pyg_grf.features import rwgnk_expected_features, rwgnk_features
from pyg_grf.features.rwgnk import normalize_rows
from pyg_grf.walks import sample_walks
from tests.utils import node_matrix


def path_graph(n):
    src = torch.arange(n - 1)
    return to_undirected(torch.stack([src, src + 1]), num_nodes=n)


def cycle_graph(n):
    src = torch.arange(n)
    return to_undirected(torch.stack([src, (src + 1) % n]), num_nodes=n)


def random_graph(n=8, p=0.4, seed=3):
    torch.manual_seed(seed)
    ei = erdos_renyi_graph(n, p)
    # A spanning path keeps the graph connected (every node has neighbours).
    return to_undirected(torch.cat([ei, path_graph(n)], dim=1), num_nodes=n)


GRAPHS = {'path': (path_graph(6), 6), 'cycle': (cycle_graph(7), 7), 'random': (random_graph(), 8)}


def per_walk_frequencies(edge_index, num_nodes, num_walks, lam, p_halt, max_length, gen):
    """Reference from the padded node matrix: one frequency vector per walk, [N, n, N]."""
    walks = sample_walks(edge_index, num_nodes, num_walks, p_halt, max_length,
                         fixed_length=p_halt is None, generator=gen)
    nodes = node_matrix(walks)  # [W, L + 1]
    W, L1 = nodes.shape
    freq = torch.zeros(W, num_nodes, dtype=torch.float64)
    disc = torch.tensor(lam, dtype=torch.float64) ** torch.arange(L1, dtype=torch.float64)
    valid = nodes >= 0
    rows = torch.arange(W).view(-1, 1).expand(-1, L1)
    freq.index_put_((rows[valid], nodes[valid]), disc.expand(W, -1)[valid], accumulate=True)
    return freq.view(num_nodes, num_walks, num_nodes)


def test_hand_computed_path():
    # Path 0-1-2, walks of fixed length 1 from node 0 always go to 1.
    ei = path_graph(3)
    psi = rwgnk_features(ei, 3, 4, lam=0.5, alpha=0.0, max_length=1).to_dense()
    assert psi[0].tolist() == [1.0, 0.5, 0.0]
    assert psi[2].tolist() == [0.0, 0.5, 1.0]
    # From the middle node half of the walks (in expectation) go either way.
    assert psi[1, 1] == 1.0 and math.isclose(float(psi[1, 0] + psi[1, 2]), 0.5, rel_tol=1e-6)
    exact = rwgnk_expected_features(ei, 3, lam=0.5, max_length=1)
    assert torch.allclose(exact, torch.tensor([[1.0, 0.5, 0.0], [0.25, 1.0, 0.25],
                                               [0.0, 0.5, 1.0]], dtype=torch.float64))


def test_revisits_sum_discounts():
    # Two nodes, fixed length 2: 0 -> 1 -> 0, so f_0 = [1 + lam^2, lam].
    ei = path_graph(2)
    psi = rwgnk_features(ei, 2, 3, lam=0.5, alpha=0.0, max_length=2, dtype=torch.float64)
    assert torch.allclose(psi.to_dense(), torch.tensor([[1.25, 0.5], [0.5, 1.25]],
                                                       dtype=torch.float64))


def test_matches_per_walk_reference():
    ei, n = GRAPHS['random']
    psi = rwgnk_features(ei, n, 5, lam=0.7, alpha=0.0, p_halt=0.3, max_length=4,
                         generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    freq = per_walk_frequencies(ei, n, 5, 0.7, 0.3, 4, torch.Generator().manual_seed(1))
    assert torch.allclose(psi.to_dense(), freq.mean(1))


@pytest.mark.parametrize('alpha', [0.5, 1.0, 2.0])
def test_normalisation(alpha):
    ei, n = GRAPHS['cycle']
    gen = torch.Generator().manual_seed(0)
    raw = rwgnk_features(ei, n, 8, lam=0.6, alpha=0.0, max_length=3, generator=gen,
                         dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    psi = rwgnk_features(ei, n, 8, lam=0.6, alpha=alpha, max_length=3, generator=gen,
                         dtype=torch.float64)
    assert psi.is_sparse and psi.is_coalesced() and psi.shape == (n, n)
    dense_raw = raw.to_dense()
    expected = dense_raw / dense_raw.norm(dim=1, keepdim=True) ** alpha
    assert torch.allclose(psi.to_dense(), expected)
    if alpha == 1.0:
        assert torch.allclose(psi.to_dense().norm(dim=1), torch.ones(n, dtype=torch.float64))
    assert torch.equal(normalize_rows(raw, 0.0).to_dense(), dense_raw)


@pytest.mark.parametrize('graph', ['path', 'cycle', 'random'])
@pytest.mark.parametrize('p_halt', [None, 0.25])
def test_monte_carlo_converges_to_expectation(graph, p_halt):
    ei, n = GRAPHS[graph]
    lam, L = 0.8, 3
    exact = rwgnk_expected_features(ei, n, lam=lam, max_length=L, p_halt=p_halt)
    errors = []
    for num_walks in (64, 1024):
        gen = torch.Generator().manual_seed(num_walks)
        freq = per_walk_frequencies(ei, n, num_walks, lam, p_halt, L,
                                    torch.Generator().manual_seed(num_walks))
        psi = rwgnk_features(ei, n, num_walks, lam=lam, alpha=0.0, p_halt=p_halt, max_length=L,
                             generator=gen, dtype=torch.float64).to_dense()
        # The sparse estimator equals the mean of the per-walk frequency vectors ...
        assert torch.allclose(psi, freq.mean(1))
        # ... whose entrywise standard error is measured from the walks themselves.
        stderr = (freq.var(1, unbiased=True) / num_walks).sqrt()
        err = (psi - exact).abs()
        # Entries with zero variance (deterministic, e.g. the start node) must be exact.
        assert bool((err <= 5 * stderr + 1e-12).all()), float((err - 5 * stderr).max())
        errors.append(float(err.max()))
    # 16x more walks: the error shrinks (4x in expectation; allow slack).
    assert errors[1] < errors[0]


def test_expected_kernel_off_diagonal_factorises():
    # Walks from different start nodes are independent: E[Psi_i . Psi_j] = E[Psi_i] . E[Psi_j]
    # for i != j. On the diagonal the same walks meet themselves: E[|Psi_i|^2] exceeds
    # |E[Psi_i]|^2 by trace(Cov(f_i)) / n.
    ei, n = GRAPHS['random']
    lam, L, p, n_walks, reps = 0.7, 3, 0.2, 4, 3000
    exact = rwgnk_expected_features(ei, n, lam=lam, max_length=L, p_halt=p)
    target = exact @ exact.t()
    # reps independent estimates with n_walks walks each, vectorised as one big sample.
    freq = per_walk_frequencies(ei, n, n_walks * reps, lam, p, L, torch.Generator().manual_seed(7))
    psi = freq.view(n, reps, n_walks, n).mean(2)  # [N, reps, N]
    kernels = torch.einsum('irk,jrk->rij', psi, psi)  # [reps, N, N]
    mean, stderr = kernels.mean(0), (kernels.var(0) / reps).sqrt()
    off = ~torch.eye(n, dtype=torch.bool)
    assert bool(((mean - target).abs()[off] <= 5 * stderr[off] + 1e-12).all())
    # Diagonal bias: trace of the per-walk covariance / n_walks.
    cov_trace = freq.var(1).sum(-1)  # [N]
    diag = torch.diagonal(target) + cov_trace / n_walks
    assert bool(((torch.diagonal(mean) - diag).abs() <= 5 * torch.diagonal(stderr) + 1e-3).all())
    # And the bias is really there (not within noise of the factorised value).
    assert bool((torch.diagonal(mean) > torch.diagonal(target)).all())


def _gamma(a, terms=None):
    """Gamma(A) = sum_i (i + 1) A^i = (I - A)^-2 (or a truncated sum)."""
    n = a.size(0)
    eye = torch.eye(n, dtype=a.dtype)
    if terms is None:
        inv = torch.linalg.inv(eye - a)
        return inv @ inv
    out, power = torch.zeros_like(a), eye
    for i in range(terms + 1):
        out, power = out + (i + 1) * power, power @ a
    return out


def _adjacency(ei, n):
    adj = torch.zeros(n, n, dtype=torch.float64)
    adj[ei[0], ei[1]] = 1.0
    return adj


@pytest.mark.parametrize('graph', ['path', 'cycle', 'random'])
@pytest.mark.parametrize('lam', [0.3, 0.6])
def test_theorem_4_2_bounds(graph, lam):
    # Thm 4.2 (alpha = 0, 0 < p < 1, untruncated walks):
    #   Gamma(rho / d_max Adj) <= K <= Gamma(rho / d_min Adj),  rho = (1 - p) lam.
    ei, n = GRAPHS[graph]
    p = 0.3
    rho = (1 - p) * lam
    adj = _adjacency(ei, n)
    deg = adj.sum(1)
    # Untruncated kernel: walks of length up to 200 (the tail rho^200 is far below float64).
    psi = rwgnk_expected_features(ei, n, lam=lam, max_length=200, p_halt=p)
    kernel = psi @ psi.t()
    lower = _gamma(rho / deg.max() * adj)
    upper_arg = rho / deg.min() * adj
    assert bool((lower <= kernel + 1e-12).all())
    # The upper series converges iff the spectral radius is < 1 (else the bound is +inf).
    if float(torch.linalg.eigvalsh(upper_arg).abs().max()) < 1:
        upper = _gamma(upper_arg)
        assert bool((kernel <= upper + 1e-12).all())
    else:
        assert graph == 'random' and lam == 0.6
        upper = None
    if graph == 'cycle':  # regular graph: d_min = d_max and both bounds are equalities
        assert torch.allclose(kernel, lower) and torch.allclose(kernel, upper)
    # Walks truncated at L hops: the lower bound keeps the terms i <= L of Gamma.
    L = 3
    psi_l = rwgnk_expected_features(ei, n, lam=lam, max_length=L, p_halt=p)
    kernel_l = psi_l @ psi_l.t()
    assert bool((_gamma(rho / deg.max() * adj, terms=L) <= kernel_l + 1e-12).all())
    assert bool((kernel_l <= kernel + 1e-12).all())


def test_theorem_4_2_monte_carlo():
    # The Monte Carlo kernel (alpha = 0) lies within the Thm 4.2 bounds up to its measured
    # statistical error, off the diagonal (where it is unbiased).
    ei, n = GRAPHS['cycle']
    lam, p, L, n_walks, reps = 0.6, 0.3, 30, 2, 400
    adj = _adjacency(ei, n)
    rho = (1 - p) * lam
    bound = _gamma(rho / 2 * adj)  # 2-regular: lower == upper
    freq = per_walk_frequencies(ei, n, n_walks * reps, lam, p, L, torch.Generator().manual_seed(5))
    psi = freq.view(n, reps, n_walks, n).mean(2)
    kernels = torch.einsum('irk,jrk->rij', psi, psi)
    mean, stderr = kernels.mean(0), (kernels.var(0) / reps).sqrt()
    off = ~torch.eye(n, dtype=torch.bool)
    assert bool(((mean - bound).abs()[off] <= 5 * stderr[off] + rho ** L).all())


def test_sinks_and_directed():
    # Directed path 0 -> 1 -> 2: node 2 is a sink, walks stop there.
    ei = torch.tensor([[0, 1], [1, 2]])
    exact = rwgnk_expected_features(ei, 3, lam=0.5, max_length=5)
    assert torch.allclose(exact[0], torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64))
    psi = rwgnk_features(ei, 3, 4, lam=0.5, alpha=0.0, max_length=5, dtype=torch.float64)
    assert torch.allclose(psi.to_dense(), exact)


def test_isolated_node_and_antithetic():
    ei = torch.tensor([[0, 1], [1, 0]])
    psi = rwgnk_features(ei, 3, 4, lam=0.5, alpha=1.0, p_halt=0.4, max_length=3,
                         walker='antithetic')
    assert psi.to_dense()[2].tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize('kwargs,match', [
    (dict(lam=0.0), "'lam'"),
    (dict(lam=1.5), "'lam'"),
    (dict(lam=float('nan')), "'lam'"),
    (dict(lam=0.5, alpha=-1.0), "'alpha'"),
    (dict(lam=0.5, p_halt=1.5, fixed_length=False), "'p_halt'"),
    (dict(lam=0.5, walker='bogus'), "'walker'"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rwgnk_features(path_graph(3), 3, 4, max_length=2, **kwargs)


def test_bad_input_expected():
    with pytest.raises(ValueError, match="'lam'"):
        rwgnk_expected_features(path_graph(3), 3, lam=2.0, max_length=2)
    with pytest.raises(ValueError, match="'p_halt'"):
        rwgnk_expected_features(path_graph(3), 3, lam=0.5, max_length=2, p_halt=0.0)
    with pytest.raises(ValueError, match='node ids'):
        rwgnk_expected_features(path_graph(3), 2, lam=0.5, max_length=2)


def test_rwgnk_kernel_validates_its_input():
    from pyg_grf.features import rwgnk_kernel
    with pytest.raises(ValueError, match=r"must hold node ids in \[0, 3\).*node -2"):
        rwgnk_kernel(torch.tensor([[0, 1], [-2, 1]]), torch.ones(2), 3)
