r"""Transform storing graph random feature loads on a PyG ``Data`` object."""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform

from pyg_grf._validation import check_int
from pyg_grf.features.grf import NORMALIZATIONS, grf_loads
from pyg_grf.transforms._seeding import TransformRNG
from pyg_grf.walks import check_walk_args


@functional_transform('add_graph_random_features')
class AddGraphRandomFeatures(BaseTransform):
    r"""Samples random walks on a graph and stores the importance-weighted loads of its graph
    random features (GRF paper, Eq. 10, Algorithm 1), from which
    :class:`~pyg_grf.nn.GRFAttention` builds :math:`\widehat\Phi` for any learnable :math:`f`:

    * ``grf_index`` ``[2, nnz]`` (``int32``): (start node, visited node), sorted; PyG batching
      offsets it;
    * ``grf_length`` ``[nnz]``: hop count :math:`l` (``int8``; ``int16`` for
      ``max_length >= 128``);
    * ``grf_load`` ``[nnz]``: :math:`\mathrm{load}(i, q, l)`, duplicates summed (``float32``).

    Layers read them through the batch's plan (``attn.payload(batch)``, ``{'grf': GRFPlan}``).
    As a ``pre_transform`` the walks are drawn once; as a ``transform`` at every access.

    Args:
        num_walks (int): walks per node :math:`n` (default: :obj:`16`).
        p_halt (float): halting probability (default: :obj:`0.5`); ignored if ``fixed_length``.
        max_length (int): maximum hops :math:`L` (default: :obj:`4`).
        walker (str): ``'iid'``, ``'antithetic'`` or ``'repelling'`` (default: ``'iid'``).
        normalization (str, optional): of :math:`W`: ``'sym'``, ``'rw'`` or :obj:`None`
            (default: ``'sym'``).
        importance (bool): importance weights; :obj:`False` gives the ad-hoc Eq. 21 variant
            (default: :obj:`True`).
        fixed_length (bool): walks of exactly ``max_length`` hops (default: :obj:`False`).
        use_edge_weight (bool): use ``data.edge_weight`` as raw weights (default: :obj:`False`).
        seed (int, optional): makes the walks reproducible (see
            :mod:`pyg_grf.transforms._seeding`); :obj:`None`: torch's global generator
            (default: :obj:`None`).
        attr_prefix (str): prefix of the stored attributes (default: ``'grf'``). Use e.g.
            ``'grf_key'`` for an independent key-side sample.
        num_draws (int): independent walk sets :math:`D` (default: :obj:`1`). With :math:`D > 1`
            the entries of all draws are stored together with ``grf_draw`` ``[nnz]`` (draw id,
            ``int16``), and head :math:`h` of a layer with ``layer_index`` :math:`l` uses draw
            :math:`l H + h` (:class:`~pyg_grf.nn.GRFAttention`), which must be below :math:`D`
            (fewer draws are an error): :math:`D = H \cdot L_{layers}` gives every head of every
            layer its own walks, as the GRF paper does for its ViTs (Sec. 4). Storage and walk
            time grow :math:`D`-fold.
    """

    def __init__(self, num_walks: int = 16, p_halt: Optional[float] = 0.5, max_length: int = 4,
                 walker: str = 'iid', normalization: Optional[str] = 'sym',
                 importance: bool = True, fixed_length: bool = False,
                 use_edge_weight: bool = False, seed: Optional[int] = None,
                 attr_prefix: str = 'grf', num_draws: int = 1):
        check_walk_args(num_walks, p_halt, max_length, walker, fixed_length)
        check_int('num_draws', num_draws, 1, 2 ** 15 - 1)
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"'normalization' must be one of {NORMALIZATIONS}, got "
                             f"{normalization!r}")
        if 'index' in attr_prefix:
            raise ValueError(f"'attr_prefix' must not contain 'index', got {attr_prefix!r}")
        self.num_walks, self.p_halt, self.max_length = num_walks, p_halt, max_length
        self.walker, self.normalization, self.importance = walker, normalization, importance
        self.fixed_length, self.use_edge_weight = fixed_length, use_edge_weight
        self.seed, self.rng = seed, TransformRNG(seed)
        self.attr_prefix, self.num_draws = attr_prefix, num_draws

    def forward(self, data: Data) -> Data:
        data = copy.copy(data)  # never mutate the input
        N = data.num_nodes
        edge_index = data.edge_index
        if edge_index is None:
            edge_index = torch.empty(2, 0, dtype=torch.long)
        edge_weight = data.edge_weight if self.use_edge_weight else None
        if self.use_edge_weight and edge_weight is None:
            raise ValueError("'use_edge_weight=True' but the graph has no 'edge_weight'")
        gen = self.rng.generator(edge_index.device)  # None when unseeded
        D = self.num_draws
        if D > 1:  # D independent draws = one draw on D disjoint copies of the graph
            E = edge_index.size(1)
            edge_index = (edge_index.repeat(1, D)
                          + torch.arange(D, device=edge_index.device).repeat_interleave(E) * N)
            edge_weight = None if edge_weight is None else edge_weight.repeat(D)
        index, length, load = grf_loads(
            edge_index, N * D, self.num_walks, self.p_halt, self.max_length,
            edge_weight=edge_weight, normalization=self.normalization, walker=self.walker,
            importance=self.importance, fixed_length=self.fixed_length, generator=gen)
        if not bool(torch.isfinite(load).all()):
            raise ValueError(f"the GRF loads overflowed float32 (normalization="
                             f"{self.normalization!r}, max_length={self.max_length}): use "
                             f"normalization='sym' or 'rw', or a smaller max_length")
        if D > 1:  # walks never leave their copy: the copy of the start node is the draw
            data[f'{self.attr_prefix}_draw'] = (index[0] // N).to(torch.int16)
            index = index % N
        # Compact storage (cached with the dataset): node ids in int32 (room for PyG batches of
        # up to 2^31 - 1 nodes), hop counts in int8.
        data[f'{self.attr_prefix}_index'] = index.to(torch.int32 if N < 2 ** 30 else torch.int64)
        data[f'{self.attr_prefix}_length'] = length.to(
            torch.int8 if self.max_length < 128 else torch.int16)
        data[f'{self.attr_prefix}_load'] = load
        # one per graph (batched to [B]): a batch of graphs with different num_draws is refused
        # by GRFLoads.from_data instead of mixing the draws of one graph into one set of walks
        data[f'{self.attr_prefix}_num_draws'] = torch.tensor([D], dtype=torch.int16)
        return data

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_walks={self.num_walks}, p_halt={self.p_halt}, '
                f'max_length={self.max_length}, walker={self.walker!r}, '
                f'normalization={self.normalization!r}, importance={self.importance}, '
                f'fixed_length={self.fixed_length}, use_edge_weight={self.use_edge_weight}, '
                f'seed={self.seed}, attr_prefix={self.attr_prefix!r}'
                + ('' if self.num_draws == 1 else f', num_draws={self.num_draws}') + ')')
