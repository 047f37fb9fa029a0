r"""Index-range validation that costs one check per tensor, not one per layer.

Layers that take node indices from a batch (``rwgnk_index``, ``grf_index``, ...) must reject ids
outside ``[0, N)``: a negative id silently wraps around in dense indexing and corrupts memory in
sparse kernels built without invariant checks. Checking costs a reduction and a host read (a GPU
sync), so :func:`check_index_range` remembers the tensors it has validated: every layer of a
model receives the *same* ``batch.rwgnk_index`` tensor, and only the first layer of each batch
pays (PyG's "validate once per batch" pattern, without changing the model's signature). A tensor
modified in place (its version counter moves) or a different bound is checked again. Inference
tensors (made under :func:`torch.inference_mode`, as Lightning's test loop does) have no version
counter and are checked every time.
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor

_MAX_REMEMBERED = 256
_validated: Dict[int, Tuple['weakref.ref', int, int]] = {}


def _remembered(index: Tensor, num_nodes: int) -> bool:
    entry = _validated.get(id(index))
    return (entry is not None and entry[0]() is index and entry[1] == index._version
            and entry[2] == num_nodes)


def check_index_range(index: Tensor, num_nodes: int, name: str, bound_name: str = 'x',
                      remember: bool = True) -> None:
    r"""Raises :class:`ValueError` unless every entry of :obj:`index` lies in
    ``[0, num_nodes)``; a tensor already validated against the same bound (and not modified
    since) is not checked again.

    Args:
        index (Tensor): integer indices of any shape.
        num_nodes (int): the exclusive upper bound :math:`N`.
        name (str): the argument's name, for the message.
        bound_name (str, optional): what :math:`N` counts, for the message (default: ``'x'``,
            "the rows of 'x'").
        remember (bool, optional): skip tensors validated before (by identity and version
            counter). Pass :obj:`False` right before a kernel without bounds checks: a write
            through ``.data`` moves no version counter (default: :obj:`True`).
    """
    if index.numel() == 0 or (remember and _remembered(index, num_nodes)):
        return
    lo, hi = (int(v) for v in torch_aminmax(index))
    if lo < 0 or hi >= num_nodes:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} must hold node ids in [0, {num_nodes}) ('{bound_name}' has "
                         f"{num_nodes} rows), but it refers to node {bad} (values range over "
                         f"[{lo}, {hi}])")
    if index.is_inference():  # no version counter: an in-place change could not be seen
        return
    if len(_validated) >= _MAX_REMEMBERED:
        _validated.clear()
    try:
        _validated[id(index)] = (weakref.ref(index), index._version, num_nodes)
    except TypeError:  # pragma: no cover (tensor subclasses without weakref support)
        pass


def torch_aminmax(index: Tensor):
    out = torch.aminmax(index.reshape(-1))
    return torch.stack([out.min, out.max]).tolist()  # one host read


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
