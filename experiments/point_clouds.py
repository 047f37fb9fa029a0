r"""A generated point-cloud dynamics task: an elastic sheet simulated as a mass-spring system
(:class:`MassSpringDataset`), and its DataModule (:class:`MassSpringDataModule`) for
``experiments/configs/paper/point_cloud.yaml`` and ``experiments/point_cloud_scale.py``.

The point-cloud experiment of the GRF paper (Reid et al., 2024, Sec. 4 "PCTs" and App. C.3)
masks attention by GRFs on a kNN graph of tens of thousands of particles; its data is not public.
:class:`MassSpringDataset` is a seeded stand-in with the same structure: a kNN graph over the
*current* positions, and a target that depends on the neighbours a few hops away.

**The body.** Rest positions :math:`\mathbf{X}_i` on a jittered square lattice of spacing 1 in the
plane :math:`z = 0`, ``ceil(sqrt(N))`` per row, the outer rows and columns pinned (a drum skin);
springs join every particle to its ``spring_k`` nearest neighbours at rest (made symmetric).
Stiffness :math:`\kappa_i`, pre-strain :math:`s_i`, damping :math:`c_i` and the external
acceleration :math:`\mathbf{g}_i` (gravity :math:`(0, 0, -g)` plus a smooth force field) vary
smoothly over the sheet; masses :math:`m_i` are drawn per particle. A spring takes the mean of its
ends: :math:`\kappa_{ij} = (\kappa_i + \kappa_j)/2`, rest length :math:`L_{ij} = (1 - (s_i +
s_j)/2)\,\lVert\mathbf{X}_i - \mathbf{X}_j\rVert` (the pinned sheet is under tension).

**The dynamics.** With :math:`\mathbf{d}_{ij} = \mathbf{x}_j - \mathbf{x}_i` and :math:`w_i = 1/m_i`
(:math:`0` when pinned),

.. math::
    \mathbf{F}_i = \sum_{j \in \mathcal{S}(i)} \kappa_{ij}\,\big(\lVert\mathbf{d}_{ij}\rVert
    - L_{ij}\big)\,\frac{\mathbf{d}_{ij}}{\lVert\mathbf{d}_{ij}\rVert}, \qquad
    \mathbf{a}_i = w_i\,\mathbf{F}_i + [w_i > 0]\,(\mathbf{g}_i - c_i\,\mathbf{v}_i),

integrated by semi-implicit Euler (:math:`\mathbf{v} \leftarrow \mathbf{v} + \Delta t\,\mathbf{a}`,
then :math:`\mathbf{x} \leftarrow \mathbf{x} + \Delta t\,\mathbf{v}`); a *frame* is ``substeps``
steps, so a particle's motion over a frame depends on particles up to ``substeps`` hops away.

**A sample.** Random fields are sums of ``num_modes`` plane waves with wavelengths in
``wavelength``; a property with range :math:`[a, b]` is :math:`a + (b - a)(1 + \tanh h)/2` for such
a field :math:`h` of unit RMS. The sheet starts displaced and moving by such fields, runs
``warmup_frames`` frames, then records :math:`(\mathbf{x}_t, \mathbf{v}_t)` and the target
:math:`\mathbf{y} = \mathbf{x}_{t+1} - \mathbf{x}_t`. Nothing depends on :math:`N`, so errors are
comparable across sizes. Each sample is a :class:`~torch_geometric.data.Data` with ``pos`` [N, 3]
(:math:`\mathbf{x}_t`), ``x`` [N, 15] (:data:`FEATURE_NAMES`: displacement from rest, rest jitter,
velocity, inverse mass, :math:`\kappa_i, s_i, c_i`, :math:`\mathbf{g}_i`; no absolute position),
``edge_index`` (the symmetric kNN graph over ``pos``, ``graph_k`` neighbours, not the springs),
``y`` [N, 3] and ``rest_pos`` [N, 3].

Importing this module registers the DataModule for configs
(:func:`~pyg_grf.lightning.specs.register_config_class`); from the command line::

    PYTHONPATH=experiments PYG_GRF_TRUSTED_CLASSES=point_clouds \
        pyg-grf fit --config experiments/configs/paper/point_cloud.yaml
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from pyg_grf._validation import check_int
from pyg_grf.datasets.synthetic import GeneratedDataset
from pyg_grf.lightning.datamodules import SyntheticDataModule
from pyg_grf.lightning.specs import register_config_class

FEATURE_NAMES = ('ux', 'uy', 'uz', 'jitter_x', 'jitter_y', 'vx', 'vy', 'vz', 'inv_mass',
                 'stiffness', 'prestrain', 'damping', 'gx', 'gy', 'gz')


def _pair(name: str, value, lo: float = 0.0, strict: bool = False) -> Tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"'{name}' must be a pair (low, high), got {value!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)) or a > b or a < lo or (strict and a <= lo):
        raise ValueError(f"'{name}' must be a pair low <= high with low "
                         f"{'>' if strict else '>='} {lo}, got {value!r}")
    return a, b


def knn_edges(pos: Tensor, k: int) -> Tensor:
    r"""The directed k-nearest-neighbour edges ``[2, N k]`` (source = neighbour, target = point,
    as :func:`torch_geometric.nn.knn_graph` with ``flow='source_to_target'``), self excluded,
    exact in Euclidean distance, from a k-d tree (:class:`scipy.spatial.cKDTree`,
    :math:`O(N \log N)`)."""
    if pos.dim() != 2 or pos.size(0) < 2:
        raise ValueError(f"'pos' must be [N, D] with N >= 2, got {tuple(pos.shape)}")
    N = pos.size(0)
    k = check_int('k', k, 1)
    if k >= N:
        raise ValueError(f"'k' must be smaller than the number of points ({N}), got {k}")
    from scipy.spatial import cKDTree
    p = pos.detach().cpu().double().numpy()
    nbr = torch.from_numpy(cKDTree(p).query(p, k=k + 1)[1].astype(np.int64))
    # drop the point itself; with coincident points it may sit anywhere in the list, or not at all
    own = torch.arange(N).view(-1, 1)
    is_self = nbr == own
    drop = torch.where(is_self.any(1), is_self.float().argmax(1), torch.full((N,), k))
    keep = torch.ones_like(nbr, dtype=torch.bool)
    keep[torch.arange(N), drop] = False
    nbr = nbr[keep].view(N, k)
    return torch.stack([nbr.reshape(-1), own.expand(N, k).reshape(-1)])


def spring_forces(pos: Tensor, springs: Tensor, rest_length: Tensor,
                  stiffness: Union[float, Tensor]) -> Tensor:
    r"""Hooke forces :math:`\mathbf{F}_i = \sum_j \kappa_{ij} (\lVert\mathbf{d}_{ij}\rVert - L_{ij})
    \mathbf{d}_{ij}/\lVert\mathbf{d}_{ij}\rVert` ``[N, 3]`` of the undirected springs
    ``springs`` ``[2, S]`` (each listed once) with rest lengths ``rest_length`` ``[S]`` and
    stiffness ``stiffness`` (a number or ``[S]``): one vectorised pass, equal and opposite forces
    on the two ends."""
    i, j = springs
    d = pos[j] - pos[i]
    length = d.norm(dim=1, keepdim=True).clamp_min(1e-12)
    if isinstance(stiffness, Tensor):
        stiffness = stiffness.view(-1, 1)
    f = stiffness * (length - rest_length.view(-1, 1)) * d / length  # on i, towards j if stretched
    out = torch.zeros_like(pos)
    out.index_add_(0, i, f)
    out.index_add_(0, j, -f)
    return out


def _smooth_field(X: Tensor, num_modes: int, wavelength: Tuple[float, float],
                  amplitude: Tensor, gen: torch.Generator) -> Tensor:
    # sum of num_modes random plane waves on the rest plane, amplitude per component [3]
    M = num_modes
    lam = torch.empty(M, dtype=X.dtype).uniform_(*wavelength, generator=gen)
    theta = torch.rand(M, dtype=X.dtype, generator=gen) * 2 * math.pi
    wave = (2 * math.pi / lam).view(-1, 1) * torch.stack([theta.cos(), theta.sin()], dim=1)
    phase = torch.rand(M, dtype=X.dtype, generator=gen) * 2 * math.pi
    amp = torch.randn(M, 3, dtype=X.dtype, generator=gen) * amplitude / math.sqrt(M)
    return torch.sin(X[:, :2] @ wave.T + phase) @ amp  # [N, M] @ [M, 3]


class MassSpringDataset(GeneratedDataset):
    r"""Particle clouds of a mass-spring elastic sheet, the displacement over the next frame as
    node-level regression target: the seeded stand-in for the GRF paper's point-cloud dynamics
    experiment (Sec. 4, App. C.3); physics, equations and attributes in the module docstring.

    Args:
        root (str, optional): Cache folder; :obj:`None` keeps the dataset in memory only.
        num_points (int): Particles per cloud :math:`N` (at least 16).
        num_clouds (int): Number of clouds.
        seed (int): Cloud :math:`g` depends only on ``(seed, g)`` and the settings, not on
            ``num_clouds``.
        graph_k (int): Neighbours per particle of the kNN graph in ``edge_index``.
        spring_k (int): Neighbours per particle at rest joined by springs.
        jitter (float): Rest positions are lattice points plus a uniform offset in
            :math:`[-\mathrm{jitter}, \mathrm{jitter}]^2`, in :math:`[0, 0.5)`.
        dt, substeps, warmup_frames: The integration step :math:`\Delta t`, steps per frame,
            and frames simulated before the recorded one.
        stiffness, prestrain, damping, mass (tuple): Ranges of :math:`\kappa_i`, :math:`s_i`
            (within :math:`[0, 1)`), :math:`c_i` and of the masses :math:`m_i` (uniform).
        gravity (float): :math:`g`, the uniform part of :math:`\mathbf{g}_i`, along :math:`-z`.
        forcing (float): RMS per component of its random smooth part.
        num_modes, wavelength: Plane waves of the initial fields, and the range of their
            wavelengths in lattice spacings.
        displacement, velocity (tuple): RMS amplitudes (in-plane, out-of-plane) of the initial
            displacement and velocity fields.
        transform, pre_transform, pre_filter, force_reload: As in PyG datasets.

    **STATS** (defaults): :math:`N` points, about :math:`7.4 N` kNN edges (directed, both
    ways), 15 features, 3 targets (node-level regression).
    """
    settings = ('num_points', 'num_clouds', 'seed', 'graph_k', 'spring_k', 'jitter', 'dt',
                'substeps', 'warmup_frames', 'stiffness', 'prestrain', 'damping', 'mass',
                'gravity', 'forcing', 'num_modes', 'wavelength', 'displacement', 'velocity')

    def __init__(self, root: Optional[str] = None, num_points: int = 8192, num_clouds: int = 4,
                 seed: int = 0, graph_k: int = 6, spring_k: int = 8, jitter: float = 0.1,
                 dt: float = 0.04, substeps: int = 5, warmup_frames: int = 2,
                 stiffness: Tuple[float, float] = (5., 20.),
                 prestrain: Tuple[float, float] = (0.02, 0.2),
                 damping: Tuple[float, float] = (0., 0.5), mass: Tuple[float, float] = (0.5, 1.5),
                 gravity: float = 0.3, forcing: float = 0.2, num_modes: int = 8,
                 wavelength: Tuple[float, float] = (4., 16.),
                 displacement: Tuple[float, float] = (0.15, 1.5),
                 velocity: Tuple[float, float] = (0.05, 0.3), transform: Optional[Callable] = None,
                 pre_transform: Optional[Callable] = None,
                 pre_filter: Optional[Callable] = None, force_reload: bool = False) -> None:
        for name, value, lo in (('num_points', num_points, 16), ('seed', seed, 0),
                                ('num_clouds', num_clouds, 1), ('graph_k', graph_k, 1),
                                ('spring_k', spring_k, 1), ('substeps', substeps, 1),
                                ('num_modes', num_modes, 1), ('warmup_frames', warmup_frames, 0)):
            setattr(self, name, check_int(name, value, lo))
        if max(self.graph_k, self.spring_k) >= self.num_points:
            raise ValueError(f"'graph_k' and 'spring_k' must be smaller than 'num_points' "
                             f"({self.num_points}), got {graph_k} and {spring_k}")
        if not 0.0 <= float(jitter) < 0.5:
            raise ValueError(f"'jitter' must lie in [0, 0.5) lattice spacings, got {jitter!r}")
        for name, value, positive in (('dt', dt, True), ('gravity', gravity, False),
                                      ('forcing', forcing, False)):
            if not (math.isfinite(float(value)) and (float(value) > 0 or not positive
                                                     and float(value) >= 0)):
                what = 'positive number' if positive else 'number >= 0'
                raise ValueError(f"'{name}' must be a {what}, got {value!r}")
        self.jitter, self.dt = float(jitter), float(dt)
        self.gravity, self.forcing = float(gravity), float(forcing)
        for name, value in (('stiffness', stiffness), ('prestrain', prestrain),
                            ('damping', damping), ('mass', mass), ('wavelength', wavelength),
                            ('displacement', displacement), ('velocity', velocity)):
            setattr(self, name, _pair(name, value, strict=name in ('stiffness', 'mass',
                                                                    'wavelength')))
        if self.prestrain[1] >= 1.0:
            raise ValueError(f"'prestrain' must lie in [0, 1), got {prestrain!r}")
        # explicit-Euler stability: the stiffest spring on the lightest particle, ~2 * spring_k
        # springs' worth of curvature (a bound, not a tight one)
        omega = math.sqrt(2 * self.spring_k * self.stiffness[1] / self.mass[0])
        if self.dt * omega >= 2.0:
            raise ValueError(f"'dt'={self.dt} is unstable for stiffness up to "
                             f"{self.stiffness[1]} and mass down to {self.mass[0]}: need "
                             f"dt < {2.0 / omega:.4g}")
        self.name = f'mass-spring-{self.num_points}'
        super().__init__(root, transform, pre_transform, pre_filter, force_reload)

    def generate(self) -> List[Data]:
        return [self.cloud(g) for g in range(self.num_clouds)]

    def rest_state(self, gen: torch.Generator) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""Rest positions ``[N, 3]`` (float64), jitter ``[N, 2]``, pinned mask ``[N]`` and the
        springs ``[2, S]`` (each pair once, ``i < j``)."""
        N = self.num_points
        nx = math.ceil(math.sqrt(N))
        ny = math.ceil(N / nx)
        idx = torch.arange(N)
        a, b = idx % nx, idx // nx
        jit = (torch.rand(N, 2, dtype=torch.float64, generator=gen) * 2 - 1) * self.jitter
        X = torch.zeros(N, 3, dtype=torch.float64)
        X[:, 0] = a.double() + jit[:, 0]
        X[:, 1] = b.double() + jit[:, 1]
        pinned = (a == 0) | (a == nx - 1) | (b == 0) | (b == ny - 1)
        springs = to_undirected(knn_edges(X, self.spring_k), num_nodes=N)
        springs = springs[:, springs[0] < springs[1]]
        return X, jit, pinned, springs

    def frame(self, pos: Tensor, vel: Tensor, springs: Tensor, rest_length: Tensor,
              inv_mass: Tensor, stiffness: Tensor, damping: Tensor,
              accel: Tensor) -> Tuple[Tensor, Tensor]:
        r"""One frame: ``substeps`` semi-implicit Euler steps of :math:`\Delta t` (see the module
        docstring); ``stiffness``, ``rest_length`` per spring ``[S]``, ``inv_mass``, ``damping``
        per particle ``[N]``, the external acceleration ``accel`` ``[N, 3]``."""
        free = (inv_mass > 0).to(pos.dtype).view(-1, 1)
        for _ in range(self.substeps):  # over time steps; every step is vectorised
            acc = (inv_mass.view(-1, 1) * spring_forces(pos, springs, rest_length, stiffness)
                   + free * (accel - damping.view(-1, 1) * vel))
            vel = vel + self.dt * acc
            pos = pos + self.dt * vel
        return pos, vel

    def cloud(self, index: int) -> Data:
        r"""Cloud number :obj:`index` (a function of the seed, the index and the settings)."""
        state = np.random.SeedSequence([self.seed, int(index)]).generate_state(2, dtype=np.uint32)
        gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        X, jit, pinned, springs = self.rest_state(gen)
        N = self.num_points
        f64 = torch.float64

        def material(lo_hi):  # a smooth field with values in [lo, hi]
            h = _smooth_field(X, self.num_modes, self.wavelength,
                              torch.tensor([math.sqrt(2.0), 0.0, 0.0], dtype=f64), gen)[:, 0]
            return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * 0.5 * (1.0 + torch.tanh(h))

        stiffness, prestrain, damping = (material(self.stiffness), material(self.prestrain),
                                         material(self.damping))
        F = self.forcing
        accel = _smooth_field(X, self.num_modes, self.wavelength,
                              torch.tensor([F, F, F], dtype=f64), gen)
        accel[:, 2] -= self.gravity
        mass = torch.empty(N, dtype=f64).uniform_(*self.mass, generator=gen)
        inv_mass = torch.where(pinned, torch.zeros_like(mass), 1.0 / mass)
        i, j = springs
        spring_stiffness = 0.5 * (stiffness[i] + stiffness[j])
        rest_length = (1.0 - 0.5 * (prestrain[i] + prestrain[j])) * (X[j] - X[i]).norm(dim=1)

        def amp(lo_hi):
            return torch.tensor([lo_hi[0], lo_hi[0], lo_hi[1]], dtype=f64)

        free = (~pinned).to(f64).view(-1, 1)
        u = _smooth_field(X, self.num_modes, self.wavelength, amp(self.displacement), gen) * free
        vel = _smooth_field(X, self.num_modes, self.wavelength, amp(self.velocity), gen) * free
        pos = X + u
        args = (springs, rest_length, inv_mass, spring_stiffness, damping, accel)
        for _ in range(self.warmup_frames):
            pos, vel = self.frame(pos, vel, *args)
        nxt, _ = self.frame(pos, vel, *args)

        x = torch.cat([pos - X, jit, vel, inv_mass.view(-1, 1), stiffness.view(-1, 1),
                       prestrain.view(-1, 1), damping.view(-1, 1), accel], dim=1)
        edge_index = to_undirected(knn_edges(pos, self.graph_k), num_nodes=N)
        return Data(x=x.float(), pos=pos.float(), edge_index=edge_index,
                    y=(nxt - pos).float(), rest_pos=X.float())

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(num_points={self.num_points}, ' \
               f'num_clouds={self.num_clouds}, seed={self.seed})'


@register_config_class
class MassSpringDataModule(SyntheticDataModule):
    r""":class:`~pyg_grf.lightning.datamodules.SyntheticDataModule` over
    :class:`MassSpringDataset` (``task='mass_spring'``): ``num_graphs`` clouds with node
    regression targets, to be standardised with the training clouds' statistics
    (``standardize=['x', 'y']``)."""

    TASKS = {'mass_spring': MassSpringDataset}
    _SIZE_ARG = {'mass_spring': 'num_clouds'}

    def __init__(self, task: str = 'mass_spring', **kwargs):
        super().__init__(task=task, **kwargs)


__all__ = ['FEATURE_NAMES', 'MassSpringDataModule', 'MassSpringDataset', 'knn_edges',
           'spring_forces']
