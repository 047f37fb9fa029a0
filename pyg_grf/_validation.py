r"""Input checks shared by the layers: index ranges, batch vectors, shapes and integer
arguments, each raising a :class:`ValueError` that says what was expected and what came."""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import torch
from torch import Tensor


def check_index_range(index: Tensor, num_nodes: int, name: str, bound_name: str = 'x') -> None:
    r"""Raises :class:`ValueError` unless every entry of :obj:`index` lies in
    ``[0, num_nodes)``: a negative id silently wraps around in dense indexing and corrupts memory
    in sparse kernels built without invariant checks. ``name`` is the argument's name and
    ``bound_name`` what :math:`N` counts, for the message (default: ``'x'``, "the rows of
    'x'")."""
    if index.numel() == 0:
        return
    lo, hi = (int(v) for v in torch_aminmax(index))
    if lo < 0 or hi >= num_nodes:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} must hold node ids in [0, {num_nodes}) ('{bound_name}' has "
                         f"{num_nodes} rows), but it refers to node {bad} (values range over "
                         f"[{lo}, {hi}])")


def torch_aminmax(index: Tensor):
    out = torch.aminmax(index.reshape(-1))
    return torch.stack([out.min, out.max]).tolist()  # one host read (a GPU sync)


def is_sorted(x: Tensor) -> bool:
    r"""Whether the 1-D tensor :obj:`x` is non-decreasing (one reduction and a host read)."""
    return x.numel() < 2 or bool((x[1:] >= x[:-1]).all())


def check_sorted_batch(batch: Optional[Tensor]) -> None:
    r"""Raises a :class:`ValueError` unless the batch vector :obj:`batch` (or :obj:`None`) is
    sorted, as PyG's mini-batches are: layers that pad per graph
    (:func:`~torch_geometric.utils.to_dense_batch`) need the nodes of each graph contiguous."""
    if batch is not None and not is_sorted(batch):
        raise ValueError("'batch' must be sorted (the nodes of each graph contiguous, as in a "
                         "PyG mini-batch)")


def batch_or_zeros(batch: Optional[Tensor], num_nodes: int,
                   device: Optional[torch.device] = None) -> Tensor:
    r"""The batch vector :obj:`batch`, checked to hold one graph id per node, or, when it is
    :obj:`None`, the batch vector of a single graph: ``num_nodes`` zeros (:obj:`torch.long`)."""
    if batch is None:
        return torch.zeros(num_nodes, dtype=torch.long, device=device)
    if batch.shape != (num_nodes,):
        raise ValueError(f"'batch' must have shape [{num_nodes}] (one graph id per node), got "
                         f"{tuple(batch.shape)}")
    return batch


def check_shape(tensor: Optional[Tensor], name: str, *shape: Union[int, str]) -> None:
    r"""Raises :class:`ValueError` unless :obj:`tensor` has the shape :obj:`shape`, whose
    entries are sizes (checked) or names of free sizes (``'N'``, ``'E'``: not checked), saying
    what was expected and what came: ``Expected 'x' of shape [N, 16] (got [3, 8])``; a missing
    tensor (:obj:`None`) reads ``(got None)``."""
    if tensor is not None and tensor.dim() == len(shape) and all(
            isinstance(size, str) or tensor.size(i) == size for i, size in enumerate(shape)):
        return
    got = None if tensor is None else list(tensor.shape)
    raise ValueError(f"Expected '{name}' of shape [{', '.join(map(str, shape))}] (got {got})")


def check_int(name: str, value: Any, minimum: int = 0, maximum: Optional[int] = None) -> int:
    r"""``value`` as an ``int`` if it is an integer (Python or NumPy, not a bool) in
    ``[minimum, maximum]``; else a :class:`ValueError` naming the argument, what was expected
    and what came."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum \
            or (maximum is not None and value > maximum):
        bound = f'>= {minimum}' if maximum is None else f'in [{minimum}, {maximum}]'
        raise ValueError(f"'{name}' must be an integer {bound}, got {value!r}")
    return int(value)
