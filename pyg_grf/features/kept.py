r"""Payloads kept on a ``Data`` / ``Batch`` object between calls.

:meth:`GRFLoads.from_data <pyg_grf.features.GRFLoads.from_data>` and
:meth:`RWGNKLoads.from_data <pyg_grf.features.RWGNKLoads.from_data>` keep what they built on
the data object (under :data:`KEPT_ATTR`) and :mod:`pyg_grf.loader` leaves prepared payloads
there (under :data:`PREPARED_ATTR`): plain attributes (leading underscore), not data fields, so
PyG's collation, ``.to()`` and slicing never touch them. A payload is handed out again only
after an exact comparison of its tensors with the data's (:func:`all_equal` against a
:func:`snapshot`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: Where pyg_grf.loader leaves prepared loads on a Data / Batch.
PREPARED_ATTR = '_grf_prepared'
#: Where ``from_data`` keeps the loads it built, for the next call on the same unchanged data.
KEPT_ATTR = '_grf_kept'


class KeptPayloads(dict):
    r"""The holder under :data:`KEPT_ATTR`: neither copied by ``deepcopy`` (``Data.clone``) nor
    pickled, so the caches never travel with the data."""

    def __deepcopy__(self, memo):
        return KeptPayloads()

    def __reduce__(self):
        return (KeptPayloads, ())


def carry_kept(source: Any, target: Any) -> None:
    r"""Hands the payloads kept on :obj:`source` to :obj:`target` (which has none), e.g. from
    one epoch's batch of a full graph to the next one's; ``from_data`` uses them only if
    :obj:`target` holds exactly the same entries."""
    kept = getattr(source, '__dict__', {}).get(KEPT_ATTR)
    if kept and hasattr(target, '__dict__') and KEPT_ATTR not in target.__dict__:
        target.__dict__[KEPT_ATTR] = KeptPayloads(kept)


def snapshot(tensors: Sequence[Optional[Tensor]]) -> Tuple[Optional[Tensor], ...]:
    r"""Copies of :obj:`tensors` to compare a payload's tensors with later (normal tensors,
    even in inference mode)."""
    with torch.inference_mode(False):
        return tuple(None if t is None else t.clone() for t in tensors)


def all_equal(a: Sequence[Optional[Tensor]], b: Sequence[Optional[Tensor]]) -> bool:
    r"""Exact equality of two sequences of tensors (or :obj:`None`) with one host read, not
    one per tensor."""
    if any((x is None) != (y is None) or (x is not None and x.shape != y.shape)
           for x, y in zip(a, b)):
        return False
    flags = [(x == y).all() for x, y in zip(a, b) if x is not None and x.numel() > 0]
    return not flags or bool(torch.stack(flags).all())
