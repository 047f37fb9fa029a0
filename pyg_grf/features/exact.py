r"""Dense references, :math:`O(N^2)` memory: the exact kernels the random features estimate."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from pyg_grf.features.grf import normalized_adjacency
from pyg_grf.memory import check_walk_memory


def dense_adjacency(edge_index: Tensor, num_nodes: int, edge_weight: Optional[Tensor] = None,
                    normalization: Optional[str] = 'sym', dtype=torch.float64) -> Tensor:
    r"""The weighted adjacency :math:`W` (see :func:`~pyg_grf.features.normalized_adjacency`) as
    a dense ``[N, N]`` tensor, multi-edges summed."""
    w = normalized_adjacency(edge_index, num_nodes, edge_weight, normalization).to(dtype)
    out = torch.zeros(num_nodes, num_nodes, dtype=dtype, device=edge_index.device)
    return out.index_put((edge_index[0].long(), edge_index[1].long()), w, accumulate=True)


def power_series_kernel(edge_index: Tensor, num_nodes: int, alpha: Union[Tensor, Sequence[float]],
                        *, edge_weight: Optional[Tensor] = None,
                        normalization: Optional[str] = 'sym') -> Tensor:
    r"""The exact graph node kernel :math:`M_\alpha = \sum_{k} \alpha_k W^k` (GRF paper, Eq. 4) as
    a dense ``[N, N]`` tensor (``[H, N, N]`` for ``alpha`` of shape ``[H, K]``), by Horner's rule.
    Differentiable in ``alpha``; dtype follows ``alpha`` (float64 for a list)."""
    alpha = torch.as_tensor(alpha, dtype=torch.float64) if not isinstance(alpha, Tensor) else alpha
    if alpha.dim() not in (1, 2) or alpha.size(-1) == 0:
        raise ValueError(f"'alpha' must have shape [K] or [H, K], got {tuple(alpha.shape)}")
    # W, the identity, and per head the running product, its update and their gradients:
    # about 2 + 4 H dense [N, N] matrices, estimated before the first one is allocated
    heads = alpha.size(0) if alpha.dim() == 2 else 1
    check_walk_memory((2 + 4 * heads) * num_nodes ** 2 * alpha.element_size(),
                      edge_index.device, None,
                      f"the exact power-series kernel of {num_nodes} nodes ({heads} x dense "
                      f"[N, N], {alpha.dtype})",
                      "Use GRFAttention (its O(N) random-feature estimate) for graphs this "
                      "large, or batch smaller graphs.", error=MemoryError)
    W = dense_adjacency(edge_index, num_nodes, edge_weight, normalization, dtype=alpha.dtype)
    eye = torch.eye(num_nodes, dtype=alpha.dtype, device=W.device)
    K = alpha.size(-1)
    out = alpha[..., K - 1, None, None] * eye
    for k in range(K - 2, -1, -1):  # loop over series terms
        out = out @ W + alpha[..., k, None, None] * eye
    return out
