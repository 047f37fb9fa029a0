r"""Transform that stores RWGNK features on a graph (FTFI paper, Sec. 4.2)."""
from __future__ import annotations

import copy
from typing import Optional

from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform

from pyg_grf.features.rwgnk import check_rwgnk_args, rwgnk_features, rwgnk_kernel
from pyg_grf.transforms._seeding import TransformRNG
from pyg_grf.walks import check_walk_args


@functional_transform('add_rwgnk_features')
class AddRWGNKFeatures(BaseTransform):
    r"""Samples random walks out of every node and stores the RWGNK features :math:`\Psi` of the
    graph (FTFI paper, Sec. 4.2, Eq. 5; see :func:`pyg_grf.features.rwgnk_features`) as a sparse
    matrix in COO form (functional name: :obj:`add_rwgnk_features`):

    ``rwgnk_index`` ``[2, nnz]`` (start node :math:`h`, visited node :math:`i`; PyG's batching
    offsets it, so a mini-batch holds the block-diagonal stack) and ``rwgnk_value`` ``[nnz]``
    (:math:`\Psi_{hi}`). With ``kernel_threshold`` it also stores the pairs of the kernel
    :math:`\mathcal{K} = \Psi\Psi^\top` above that threshold
    (:func:`~pyg_grf.features.rwgnk_kernel`), ``rwgnk_kernel_index`` ``[2, P]`` and
    ``rwgnk_kernel_value`` ``[P]``, which then *are* the mask of the GKAT layers
    (:class:`~pyg_grf.nn.GKATAttention`) and spare the plan of a batch the sparse product.
    As a ``pre_transform`` the walks are sampled once; as a ``transform`` at every access.

    Args:
        num_walks (int): walks per node :math:`n`.
        lam (float): discount :math:`\lambda \in (0, 1]`.
        alpha (float): normalisation exponent :math:`\alpha \ge 0` (``1``: unit rows).
        max_length (int): walk length in hops :math:`\tau` (maximum length if ``p_halt`` is
            given).
        p_halt (float, optional): halting probability; :obj:`None` for walks of fixed length
            ``max_length``, as in the paper's experiments (default: :obj:`None`).
        walker (str): ``'iid'``, ``'antithetic'`` or ``'repelling'`` (default: ``'iid'``).
        seed (int, optional): makes the walks reproducible (see
            :mod:`pyg_grf.transforms._seeding`) (default: :obj:`None`, torch's global generator).
        kernel_threshold (float, optional): also store the kernel pairs with
            :math:`|\mathcal{K}_{ij}| >` ``kernel_threshold`` (``0.``: every nonzero); :obj:`None`
            stores none (default: :obj:`None`).
    """

    def __init__(self, num_walks: int, lam: float, alpha: float, max_length: int,
                 p_halt: Optional[float] = None, walker: str = 'iid',
                 seed: Optional[int] = None, kernel_threshold: Optional[float] = None) -> None:
        check_rwgnk_args(lam, alpha)
        if kernel_threshold is not None and not kernel_threshold >= 0:
            raise ValueError(f"'kernel_threshold' must be None or >= 0, got {kernel_threshold!r}")
        check_walk_args(num_walks, p_halt, max_length, walker, p_halt is None)
        self.num_walks, self.lam, self.alpha = num_walks, lam, alpha
        self.max_length, self.p_halt, self.walker = max_length, p_halt, walker
        self.seed, self.rng = seed, TransformRNG(seed)
        self.kernel_threshold = kernel_threshold

    def forward(self, data: Data) -> Data:
        if data.edge_index is None:
            raise ValueError("AddRWGNKFeatures needs 'data.edge_index'")
        data = copy.copy(data)
        edge_index = data.edge_index
        num_nodes = data.num_nodes
        generator = self.rng.generator()
        if generator is not None:  # the seeded generator lives on the CPU
            edge_index = edge_index.cpu()
        psi = rwgnk_features(edge_index, num_nodes, self.num_walks, lam=self.lam,
                             alpha=self.alpha, p_halt=self.p_halt, max_length=self.max_length,
                             walker=self.walker, generator=generator)
        data.rwgnk_index = psi.indices().to(data.edge_index.device)
        data.rwgnk_value = psi.values().to(data.edge_index.device)
        if self.kernel_threshold is not None:
            k_index, k_value = rwgnk_kernel(psi.indices(), psi.values(), num_nodes,
                                            self.kernel_threshold)
            data.rwgnk_kernel_index = k_index.to(data.edge_index.device)
            data.rwgnk_kernel_value = k_value.to(data.edge_index.device)
        return data

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_walks={self.num_walks}, lam={self.lam}, '
                f'alpha={self.alpha}, max_length={self.max_length}, p_halt={self.p_halt}, '
                f'walker={self.walker!r}, seed={self.seed}'
                + (f', kernel_threshold={self.kernel_threshold}'
                   if self.kernel_threshold is not None else '') + ')')
