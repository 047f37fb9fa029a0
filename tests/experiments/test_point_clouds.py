r"""experiments/point_clouds.py: the mass-spring clouds, their kNN graph and spring forces against
dense references, and their DataModule's standardisation with the training statistics."""
import math

import pytest
import torch

from tests.experiments import experiment_module

point_clouds = experiment_module('point_clouds')
MassSpringDataset, FEATURE_NAMES = point_clouds.MassSpringDataset, point_clouds.FEATURE_NAMES
knn_edges, spring_forces = point_clouds.knn_edges, point_clouds.spring_forces


def small(**kw):
    kw.setdefault('num_points', 100)
    kw.setdefault('num_clouds', 2)
    return MassSpringDataset(**kw)


def dense_forces(pos, springs, rest, stiffness):
    # naive reference: dense [N, N] stiffness and rest-length matrices, all pairs
    N = pos.size(0)
    K = torch.zeros(N, N, dtype=pos.dtype)
    L = torch.zeros(N, N, dtype=pos.dtype)
    K[springs[0], springs[1]] = stiffness
    K[springs[1], springs[0]] = stiffness
    L[springs[0], springs[1]] = rest
    L[springs[1], springs[0]] = rest
    d = pos.unsqueeze(0) - pos.unsqueeze(1)  # d[i, j] = x_j - x_i
    length = d.norm(dim=-1) + torch.eye(N, dtype=pos.dtype)  # no division by zero on the diagonal
    return (K * (length - L) / length).unsqueeze(-1).mul(d).sum(1)


def random_springs(N, S, gen):
    pairs = torch.combinations(torch.arange(N), 2)
    return pairs[torch.randperm(pairs.size(0), generator=gen)[:S]].T.contiguous()


def test_deterministic_under_seed():
    a, b = small(seed=3), small(seed=3)
    for da, db in zip(a, b):
        for key in ('x', 'pos', 'y', 'edge_index', 'rest_pos'):
            assert torch.equal(da[key], db[key])
    c = small(seed=4)
    assert not torch.equal(a[0].y, c[0].y)
    # cloud g depends on (seed, g) only, not on how many clouds there are
    one = small(seed=3, num_clouds=1)
    assert torch.equal(one[0].y, a[0].y)
    assert not torch.equal(a[0].y, a[1].y)


def test_sample_layout():
    ds = small(num_points=120)  # 11 x 11 lattice, last row partial
    d = ds[0]
    N = 120
    assert d.x.shape == (N, len(FEATURE_NAMES)) == (N, 15)
    assert d.pos.shape == d.y.shape == d.rest_pos.shape == (N, 3)
    # features: displacement from rest, velocity as stored
    assert torch.allclose(d.x[:, :3], d.pos - d.rest_pos, atol=1e-5)
    # pinned particles (outer rows and columns) have inverse mass 0 and do not move
    a, b = torch.arange(N) % 11, torch.arange(N) // 11
    pinned = (a == 0) | (a == 10) | (b == 0) | (b == 10)
    assert torch.equal(d.x[:, FEATURE_NAMES.index('inv_mass')] == 0, pinned)
    assert torch.all(d.y[pinned] == 0) and torch.all(d.x[pinned, 5:8] == 0)
    assert bool((d.y[~pinned].abs().sum(1) > 0).all())
    # material properties within their ranges
    for name, (lo, hi) in (('stiffness', ds.stiffness), ('prestrain', ds.prestrain),
                           ('damping', ds.damping)):
        v = d.x[:, FEATURE_NAMES.index(name)]
        assert float(v.min()) >= lo - 1e-6 and float(v.max()) <= hi + 1e-6
    # rest positions: the lattice plus jitter within bounds, in the plane z = 0
    jit = d.rest_pos[:, :2] - torch.stack([a, b], 1).float()
    assert torch.allclose(jit, d.x[:, 3:5], atol=1e-5)
    assert float(jit.abs().max()) <= ds.jitter and torch.all(d.rest_pos[:, 2] == 0)


def test_edge_index_is_symmetric_knn_of_current_positions():
    d = small(num_points=150, graph_k=5)[0]
    N = d.num_nodes
    dist = torch.cdist(d.pos.double(), d.pos.double())
    dist.fill_diagonal_(float('inf'))
    nbr = dist.topk(5, dim=1, largest=False).indices  # brute force
    A = torch.zeros(N, N, dtype=torch.bool)
    A[torch.arange(N).repeat_interleave(5), nbr.reshape(-1)] = True
    A = A | A.T
    B = torch.zeros(N, N, dtype=torch.bool)
    B[d.edge_index[0], d.edge_index[1]] = True
    assert torch.equal(A, B)
    assert d.edge_index.size(1) == int(A.sum())  # no duplicates, no self loops


@pytest.mark.parametrize('k', [1, 4, 9])
def test_knn_edges_against_cdist(k):
    gen = torch.Generator().manual_seed(k)
    pos = torch.rand(80, 3, generator=gen, dtype=torch.float64)
    src, dst = knn_edges(pos, k)
    assert torch.equal(dst, torch.arange(80).repeat_interleave(k))
    dist = torch.cdist(pos, pos)
    dist.fill_diagonal_(float('inf'))
    ref = dist.topk(k, dim=1, largest=False).indices
    assert torch.equal(src.view(80, k).sort(1).values, ref.sort(1).values)


def test_knn_edges_coincident_points_exclude_self():
    pos = torch.tensor([[0., 0.], [0., 0.], [1., 0.], [3., 0.]])
    src, dst = knn_edges(pos, 2)
    assert not bool((src == dst).any())
    assert set(src[dst == 0].tolist()) == {1, 2}


def test_spring_forces_against_dense_reference():
    gen = torch.Generator().manual_seed(0)
    N = 30
    pos = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    springs = random_springs(N, 60, gen)
    rest = torch.rand(60, generator=gen, dtype=torch.float64) + 0.5
    stiff = torch.rand(60, generator=gen, dtype=torch.float64) * 10
    out = spring_forces(pos, springs, rest, stiff)
    assert torch.allclose(out, dense_forces(pos, springs, rest, stiff), atol=1e-12)
    # a scalar stiffness is the same as a constant one
    assert torch.allclose(spring_forces(pos, springs, rest, 3.0),
                          dense_forces(pos, springs, rest, torch.full((60,), 3.0,
                                                                      dtype=torch.float64)))
    # Newton's third law: internal forces sum to zero
    assert torch.allclose(out.sum(0), torch.zeros(3, dtype=torch.float64), atol=1e-10)


def test_spring_force_at_rest_length_is_zero():
    gen = torch.Generator().manual_seed(1)
    pos = torch.randn(20, 3, generator=gen, dtype=torch.float64)
    springs = random_springs(20, 40, gen)
    rest = (pos[springs[1]] - pos[springs[0]]).norm(dim=1)
    assert torch.allclose(spring_forces(pos, springs, rest, 7.0),
                          torch.zeros(20, 3, dtype=torch.float64), atol=1e-12)
    # stretched by 10%: each spring pulls its two ends together with force 0.1 * kappa * L
    i, j = torch.tensor([[0], [1]])
    two = torch.tensor([[0., 0., 0.], [1.1, 0., 0.]], dtype=torch.float64)
    f = spring_forces(two, torch.stack([i, j]), torch.tensor([1.0], dtype=torch.float64), 5.0)
    assert torch.allclose(f, torch.tensor([[0.5, 0., 0.], [-0.5, 0., 0.]], dtype=torch.float64))


def test_unperturbed_sheet_stays_at_rest():
    # no pre-strain, displacement, velocity or external force: every spring at rest length
    ds = small(prestrain=(0., 0.), displacement=(0., 0.), velocity=(0., 0.), gravity=0.,
               forcing=0.)
    d = ds[0]
    assert torch.allclose(d.y, torch.zeros_like(d.y), atol=1e-7)
    assert torch.allclose(d.pos, d.rest_pos, atol=1e-6)


def reference_step(pos, vel, springs, rest, stiff, inv_mass, damping, accel, dt):
    # semi-implicit Euler, written out with the dense force reference
    acc = inv_mass[:, None] * dense_forces(pos, springs, rest, stiff)
    acc = acc + (inv_mass > 0).double()[:, None] * (accel - damping[:, None] * vel)
    vel = vel + dt * acc
    return pos + dt * vel, vel


def test_step_against_dense_reference():
    ds = small(num_points=36)
    gen = torch.Generator().manual_seed(2)
    N, S = 36, 80
    pos = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    vel = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    springs = random_springs(N, S, gen)
    rest = torch.rand(S, generator=gen, dtype=torch.float64) + 0.5
    stiff = torch.rand(S, generator=gen, dtype=torch.float64) * 10
    inv_mass = torch.rand(N, generator=gen, dtype=torch.float64) + 0.5
    inv_mass[:4] = 0  # pinned
    damping = torch.rand(N, generator=gen, dtype=torch.float64)
    accel = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    args = (springs, rest, inv_mass, stiff, damping, accel)
    p, v = pos, vel
    rp, rv = pos, vel
    for _ in range(ds.substeps):
        rp, rv = reference_step(rp, rv, springs, rest, stiff, inv_mass, damping, accel, ds.dt)
    p, v = ds.frame(pos, vel, *args)
    assert torch.allclose(p, rp, atol=1e-10) and torch.allclose(v, rv, atol=1e-10)
    # pinned particles keep their position and velocity... which here is nonzero: the
    # generator gives them zero velocity; only the acceleration is masked
    assert torch.allclose(v[:4], vel[:4])


def test_momentum_and_energy_of_free_springs():
    # no pins, no damping, no external force: momentum is conserved exactly, energy nearly
    ds = small(num_points=36, dt=0.001)
    gen = torch.Generator().manual_seed(5)
    N, S = 36, 90
    pos = torch.randn(N, 3, generator=gen, dtype=torch.float64) * 2
    vel = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    springs = random_springs(N, S, gen)
    rest = (pos[springs[1]] - pos[springs[0]]).norm(dim=1) * 0.9
    stiff = torch.full((S,), 4.0, dtype=torch.float64)
    mass = torch.rand(N, generator=gen, dtype=torch.float64) + 0.5
    zeros = torch.zeros(N, dtype=torch.float64)

    def energy(p, v):
        length = (p[springs[1]] - p[springs[0]]).norm(dim=1)
        return 0.5 * (mass * v.pow(2).sum(1)).sum() + 0.5 * (stiff * (length - rest) ** 2).sum()

    p, v = pos, vel
    e0 = energy(p, v)
    for _ in range(20):
        p, v = ds.frame(p, v, springs, rest, 1 / mass, stiff, zeros, torch.zeros(N, 3,
                                                                               dtype=torch.float64))
    mom0, mom = (mass[:, None] * vel).sum(0), (mass[:, None] * v).sum(0)
    assert torch.allclose(mom, mom0, atol=1e-10)
    assert abs(float(energy(p, v) - e0)) < 1e-2 * float(e0)
    assert float((p - pos).abs().max()) > 0.05  # it did move


@pytest.mark.parametrize('kw, match', [
    (dict(num_points=8), "'num_points' must be an integer >= 16"),
    (dict(num_points=100.0), "'num_points' must be an integer"),
    (dict(num_clouds=0), "'num_clouds' must be an integer >= 1"),
    (dict(seed=-1), "'seed' must be an integer >= 0"),
    (dict(graph_k=0), "'graph_k' must be an integer >= 1"),
    (dict(num_points=16, spring_k=16), "smaller than 'num_points'"),
    (dict(jitter=0.5), r"'jitter' must lie in \[0, 0.5\)"),
    (dict(dt=0.0), "'dt' must be a positive number"),
    (dict(dt=1.0), "'dt'=1.0 is unstable"),
    (dict(substeps=0), "'substeps' must be an integer >= 1"),
    (dict(warmup_frames=-1), "'warmup_frames' must be an integer >= 0"),
    (dict(stiffness=(0., 1.)), "'stiffness' must be a pair low <= high with low > 0"),
    (dict(stiffness=(2., 1.)), "'stiffness' must be a pair"),
    (dict(prestrain=(0., 1.)), r"'prestrain' must lie in \[0, 1\)"),
    (dict(damping=(-1., 0.)), "'damping' must be a pair"),
    (dict(mass=5.0), r"'mass' must be a pair \(low, high\)"),
    (dict(gravity=-1.), "'gravity' must be a number >= 0"),
    (dict(forcing=float('nan')), "'forcing' must be a number >= 0"),
    (dict(wavelength=(0., 4.)), "'wavelength' must be a pair"),
])
def test_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        small(**kw)


def test_knn_edges_bad_input():
    with pytest.raises(ValueError, match=r"'pos' must be \[N, D\] with N >= 2"):
        knn_edges(torch.zeros(1, 3), 1)
    with pytest.raises(ValueError, match="'k' must be smaller than the number of points"):
        knn_edges(torch.rand(5, 3), 5)
    with pytest.raises(ValueError, match="'k' must be an integer >= 1"):
        knn_edges(torch.rand(5, 3), 0)


def test_cached_root_roundtrip(tmp_path):
    a = small(root=str(tmp_path), seed=1)
    b = small(root=str(tmp_path), seed=1)  # loaded from the cache
    assert torch.equal(a[0].y, b[0].y) and torch.equal(a[1].edge_index, b[1].edge_index)
    assert math.isclose(float(a[0].x.sum()), float(b[0].x.sum()))


def test_mass_spring_clouds_standardised_with_training_statistics():
    # node regression on point clouds: every cloud is one graph; x and y are standardised with
    # the statistics of the training clouds only (checked against the raw clouds)
    dm = point_clouds.MassSpringDataModule(num_graphs=4, split=(0.5, 0.25, 0.25),
                                           dataset_kwargs={'num_points': 100}, cache=False,
                                           batch_size=1, standardize=['x', 'y'])
    dm.setup('fit')
    raw = MassSpringDataset(num_points=100, num_clouds=4, seed=0)
    train_idx = dm.train_dataset.indices()
    xs = torch.cat([raw[i].x for i in train_idx])
    mean, std = xs.mean(0), xs.std(0).clamp_min(1e-6)
    for part in (dm.train_dataset, dm.val_dataset, dm.test_dataset):
        for i, data in zip(part.indices(), part):
            assert torch.allclose(data.x, (raw[i].x - mean) / std, atol=1e-4)
    y = torch.cat([d.y for d in dm.train_dataset])
    assert torch.allclose(y.mean(0), torch.zeros(3), atol=1e-5)
    assert dm.num_features == 15
    batch = next(iter(dm.val_dataloader()))
    assert batch.num_graphs == 1 and batch.y.shape == (100, 3)
    assert torch.allclose(dm.standardizer.inverse(batch.y, 'y'), raw[dm.val_dataset.indices()[0]].y,
                          atol=1e-5)
