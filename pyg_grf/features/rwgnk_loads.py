r"""The typed payload of :class:`~pyg_grf.nn.GKATAttention`: the RWGNK features of a batch."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor

from pyg_grf.features.kept import KEPT_ATTR
from pyg_grf.features.kept import KeptPayloads as _Kept
from pyg_grf.features.kept import all_equal as _all_equal
from pyg_grf.features.kept import snapshot as _snapshot


class RWGNKLoads:
    r"""The RWGNK features :math:`\Psi` of a graph or a PyG batch on their nonzeros (FTFI paper,
    Sec. 4.2, Eq. 5; stored by :class:`~pyg_grf.transforms.AddRWGNKFeatures`), and optionally
    the nonzeros of the kernel :math:`\mathcal{K} = \Psi\Psi^\top` (``kernel_threshold=`` of the
    transform), which spare every layer the product. Built once per batch and passed to every
    layer, as ``GKATAttention(...)(x, batch, rwgnk=RWGNKLoads.from_data(batch))``; what the
    layers derive from the features alone (the sparse pattern of :math:`\Psi`, the kernel's
    pairs and pattern) is built by the first and cached here for the others (:meth:`cached`),
    and dropped when a tensor is edited.

    Args:
        index (Tensor): ``[2, nnz]`` (node, walk-visited node) indices of :math:`\Psi`.
        value (Tensor): ``[nnz]`` its values.
        kernel_index (Tensor, optional): ``[2, P]`` the pairs with
            :math:`\mathcal{K}_{ij} \ne 0`.
        kernel_value (Tensor, optional): ``[P]`` their kernel values.
    """

    def __init__(self, index: Tensor, value: Tensor, kernel_index: Optional[Tensor] = None,
                 kernel_value: Optional[Tensor] = None):
        if not isinstance(index, Tensor) or index.dim() != 2 or index.size(0) != 2:
            raise ValueError(f"'rwgnk_index' must have shape [2, nnz], got {_shape(index)}")
        if not isinstance(value, Tensor) or value.dim() != 1 or value.numel() != index.size(1):
            raise ValueError(f"'rwgnk_value' must have shape [{index.size(1)}] to match "
                             f"'rwgnk_index', got {_shape(value)}")
        if (kernel_index is None) != (kernel_value is None):
            raise ValueError("the kernel pairs need both 'rwgnk_kernel_index' and "
                             "'rwgnk_kernel_value'")
        if kernel_index is not None and (
                kernel_index.dim() != 2 or kernel_index.size(0) != 2
                or kernel_value.shape != (kernel_index.size(1),)):
            raise ValueError(f"'kernel' must be (index [2, P], value [P]), got shapes "
                             f"{tuple(kernel_index.shape)} and {tuple(kernel_value.shape)}")
        self.index = index
        self.value = value
        self.kernel_index = kernel_index
        self.kernel_value = kernel_value
        self._cache: dict = {}

    def _tensors(self) -> Tuple[Optional[Tensor], ...]:
        return self.index, self.value, self.kernel_index, self.kernel_value

    def cached(self, name: Any, build: Callable[[], Any]) -> Any:
        r"""``build()``, computed once per ``name`` and kept while the features hold exactly the
        values they held then (an exact :math:`O(\mathrm{nnz})` comparison with a copy taken
        at the first build, so that no edit, in place or through ``.data``, is served stale
        structures). Built outside inference mode, so that an entry first built in an
        evaluation loop serves training too. Entries that depend on values carrying gradients
        must not be cached (the layer does not)."""
        tensors = self._tensors()
        snap = self._cache.get('_snapshot')
        if snap is None or not _all_equal(snap, tensors):
            self._cache = {'_snapshot': _snapshot(tensors)}
        if name not in self._cache:
            with torch.inference_mode(False):
                self._cache[name] = build()
        return self._cache[name]

    @classmethod
    def from_data(cls, data: Any, prefix: str = 'rwgnk') -> 'RWGNKLoads':
        r"""The features stored on a ``Data`` or ``Batch`` under ``{prefix}_index`` and
        ``{prefix}_value`` (and ``{prefix}_kernel_index`` / ``_value`` when present). Kept on
        ``data`` (never copied deeply or pickled with it) and returned again while ``data``
        holds the same tensors, so one full graph seen at every step keeps its cached kernel
        pairs; edited values are caught by :meth:`cached`."""
        missing = [f'{prefix}_{s}' for s in ('index', 'value')
                   if getattr(data, f'{prefix}_{s}', None) is None]
        if missing:
            raise ValueError(f"the data has no RWGNK features {missing}: add the transform "
                             f"pyg_grf.transforms.AddRWGNKFeatures (best as pre_transform)")
        k_index = getattr(data, f'{prefix}_kernel_index', None)
        k_value = getattr(data, f'{prefix}_kernel_value', None)
        if k_index is None or k_value is None:
            k_index = k_value = None
        tensors = (data[f'{prefix}_index'], data[f'{prefix}_value'], k_index, k_value)
        kept = data.__dict__.get(KEPT_ATTR, {}).get(prefix) if hasattr(data, '__dict__') \
            else None
        if kept is not None and all(a is b for a, b in zip(kept._tensors(), tensors)):
            # the same tensors as last time (one full graph at every step): the kept payload,
            # whose caches check their inputs' values on use (cached())
            return kept
        loads = cls(*tensors)
        if hasattr(data, '__dict__'):
            holder = _Kept(data.__dict__.get(KEPT_ATTR, {}))
            holder[prefix] = loads
            data.__dict__[KEPT_ATTR] = holder
        return loads

    def repeat(self, copies: int, num_nodes: int) -> 'RWGNKLoads':
        r"""The features of ``copies`` disjoint copies of a graph of ``num_nodes`` nodes (copy
        ``c`` on nodes ``c * num_nodes + i``), e.g. for a batch of samples on one shared graph."""
        if self.index.numel() > 0 and int(self.index.max()) >= num_nodes:
            raise ValueError(f"the RWGNK features refer to node {int(self.index.max())}, but "
                             f"the shared graph has {num_nodes} nodes")

        def rep(index: Tensor) -> Tensor:  # [2, E] -> [2, copies E], copy c shifted by c n
            off = torch.arange(copies, device=index.device) * num_nodes
            return index.repeat(1, copies) + off.repeat_interleave(index.size(1)).to(index.dtype)
        kernel = (None, None) if self.kernel_index is None else (
            rep(self.kernel_index), self.kernel_value.repeat(copies))
        return RWGNKLoads(rep(self.index), self.value.repeat(copies), *kernel)

    @property
    def kernel(self) -> Optional[Tuple[Tensor, Tensor]]:
        r"""``(kernel_index, kernel_value)`` or :obj:`None`."""
        return None if self.kernel_index is None else (self.kernel_index, self.kernel_value)

    def __repr__(self) -> str:
        kernel = '' if self.kernel_index is None else f', kernel_nnz={self.kernel_index.size(1)}'
        return f'RWGNKLoads(nnz={self.index.size(1)}{kernel})'


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__
