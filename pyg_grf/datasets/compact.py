r"""Lossless compact storage of collated PyG datasets (the format of the processed caches of
:mod:`pyg_grf.datasets.cache`); :func:`restore_collated` gives back bit-identical tensors.

* **narrow integers**: an integer tensor is stored in the smallest of ``uint8``, ``int8``,
  ``int16``, ``int32`` that holds its values (OGB's categorical features: 1 byte instead of 8);
* **sorted rows as counts**: an index attribute (a key containing ``index``, concatenated along the
  last dimension) of shape ``[2, nnz]`` whose first row :math:`r` is sorted within every graph is
  stored as its second row plus, per graph, the counts :math:`c_i = |\{e : r_e = i\}|` (the
  GRF walks' ``grf_index``: one count per start node), where that is smaller.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

COMPACT_FORMAT = 'pyg_grf.compact'
COMPACT_VERSION = 1

_INT_DTYPES = {str(dt).replace('torch.', ''): dt
               for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}
_NARROW = (torch.uint8, torch.int8, torch.int16, torch.int32)


def narrow_integers(t: Tensor) -> Tensor:
    r""":obj:`t` in the smallest integer dtype among ``uint8``, ``int8``, ``int16`` and
    ``int32`` that holds all its values, if that is smaller than its own dtype; else :obj:`t`
    itself (also for empty, floating point and boolean tensors)."""
    if t.dtype not in (torch.int16, torch.int32, torch.int64) or t.numel() == 0:
        return t
    lo, hi = int(t.min()), int(t.max())
    size = t.element_size()
    for dtype in _NARROW:
        info = torch.iinfo(dtype)
        if info.bits // 8 < size and info.min <= lo and hi <= info.max:
            return t.to(dtype)
    return t


def _segments(slices: Optional[Dict[str, Any]], key: str, n: int) -> Tensor:
    # Boundaries of the graphs along the concatenation dimension of `key` ([G + 1]).
    if slices is None:
        return torch.tensor([0, n])
    _expect(key in slices, f"Expected slices for '{key}' (the collated data has them for every "
                           f"tensor), got slices for {sorted(slices)}")
    return slices[key].long()


def _first_row_as_counts(index: Tensor, ptr: Tensor) -> Optional[Tuple[Tensor, Tensor]]:
    # (counts, lengths) if the first row of index [2, nnz] is non-negative and sorted within
    # every graph (ptr: graph boundaries), else None
    row = index[0].long()
    nnz, sizes = row.numel(), ptr.diff()
    if nnz == 0 or int(row.min()) < 0 or int(ptr[-1]) != nnz:
        return None
    if nnz > 1:
        ok = row[1:] >= row[:-1]
        starts = ptr[1:-1]
        ok[starts[(starts > 0) & (starts < nnz)] - 1] = True  # a new graph may start lower
        if not bool(ok.all()):
            return None
    # Graph g has counts for the values 0 .. (its last, i.e. largest, value).
    lengths = torch.zeros(sizes.numel(), dtype=torch.long)
    nonempty = sizes > 0
    lengths[nonempty] = row[ptr[1:][nonempty] - 1] + 1
    offset = lengths.cumsum(0) - lengths
    graph = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    counts = torch.bincount(offset[graph] + row, minlength=int(lengths.sum()))
    return counts, lengths


def compact_collated(data: Any, slices: Optional[Dict[str, Any]]
                     ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    r"""The compact form of :obj:`data` collated with :obj:`slices` (:obj:`None` for a single
    graph; :meth:`InMemoryDataset.collate`, ``increment=False``): ``(mapping, spec)``,
    :meth:`data.to_dict() <torch_geometric.data.Data.to_dict>` with the compacted tensors and what
    :func:`restore_collated` must undo. ``HeteroData`` and tensors other than plain dense
    :class:`torch.Tensor` objects are kept as they are."""
    from torch_geometric.data import Data

    if not hasattr(data, 'to_dict'):
        raise TypeError(f"Expected a collated PyG data object (Data or HeteroData), got "
                        f"{type(data).__name__}")
    mapping = dict(data.to_dict())
    spec: Dict[str, Any] = {'format': COMPACT_FORMAT, 'version': COMPACT_VERSION, 'fields': {}}
    if not isinstance(data, Data):
        return mapping, spec
    for key, value in list(mapping.items()):
        if type(value) is not torch.Tensor or value.layout != torch.strided:
            continue
        field: Dict[str, Any] = {}
        if (value.dim() == 2 and value.size(0) == 2 and value.dtype in _INT_DTYPES.values()
                and 'index' in key and data.__cat_dim__(key, value) in (-1, 1)
                and (slices is None or key in slices)):
            found = _first_row_as_counts(value, _segments(slices, key, value.size(1)))
            if found is not None:
                counts, lengths = narrow_integers(found[0]), narrow_integers(found[1])
                if counts.nbytes + lengths.nbytes < narrow_integers(value[0]).nbytes:
                    field = {'dtype': str(value.dtype)[6:], 'first_row': 'counts',
                             'counts': counts, 'lengths': lengths}
                    value = value[1]
        narrowed = narrow_integers(value)
        if narrowed.dtype != mapping[key].dtype or field:
            field.setdefault('dtype', str(mapping[key].dtype)[6:])
            spec['fields'][key] = field
        mapping[key] = narrowed.contiguous()
    return mapping, spec


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def restore_collated(mapping: Dict[str, Any], slices: Optional[Dict[str, Any]],
                     spec: Any) -> Dict[str, Any]:
    r"""Undoes :func:`compact_collated`: the tensors of :obj:`mapping` with their original
    values and dtypes. Raises :class:`ValueError` if :obj:`spec` is not a compact-format
    description of :obj:`mapping` (another format or version, an unknown dtype, a missing field,
    counts that do not add up to the number of entries of every graph)."""
    _expect(isinstance(spec, dict) and spec.get('format') == COMPACT_FORMAT,
            f"Expected a '{COMPACT_FORMAT}' spec (a dict with format={COMPACT_FORMAT!r}), got "
            f"{spec.get('format') if isinstance(spec, dict) else type(spec).__name__!r}")
    _expect(spec.get('version') == COMPACT_VERSION,
            f"Expected compact format version {COMPACT_VERSION}, got {spec.get('version')!r} "
            f"(written by another pyg_grf version)")
    fields = spec.get('fields')
    _expect(isinstance(fields, dict), f"Expected 'fields' to be a dict, got "
                                      f"{type(fields).__name__}")
    out = dict(mapping)
    for key, field in fields.items():
        _expect(key in out and isinstance(out[key], Tensor),
                f"The compact spec names the tensor '{key}', which the data does not hold")
        _expect(isinstance(field, dict) and field.get('dtype') in _INT_DTYPES,
                f"Expected '{key}' to name its original integer dtype (one of "
                f"{list(_INT_DTYPES)}), got "
                f"{field.get('dtype') if isinstance(field, dict) else field!r}")
        value, dtype = out[key], _INT_DTYPES[field['dtype']]
        if field.get('first_row') == 'counts':
            index = torch.empty((2, value.numel()), dtype=dtype)
            index[0] = _first_row_from_counts(key, field, value, slices, dtype)
            index[1] = value
            value = index
        else:
            _expect('first_row' not in field,
                    f"Unknown first_row encoding {field.get('first_row')!r} of '{key}' "
                    f"(expected 'counts')")
        out[key] = value.to(dtype)
    return out


def _first_row_from_counts(key: str, field: Dict[str, Any], row1: Tensor,
                           slices: Optional[Dict[str, Any]], dtype: torch.dtype) -> Tensor:
    counts, lengths = field.get('counts'), field.get('lengths')
    _expect(isinstance(counts, Tensor) and isinstance(lengths, Tensor) and counts.dim() == 1
            and lengths.dim() == 1, f"Expected 1-D 'counts' and 'lengths' tensors for '{key}'")
    _expect(row1.dim() == 1, f"Expected the stored second row of '{key}' to be 1-D, got shape "
                             f"{list(row1.shape)}")
    counts, lengths = counts.long(), lengths.long()
    ptr = _segments(slices, key, row1.numel())
    _expect(int(ptr[-1]) == row1.numel(),
            f"Expected {int(ptr[-1])} entries of '{key}' (its slices), got {row1.numel()}")
    _expect(lengths.numel() == ptr.numel() - 1 and int(lengths.sum()) == counts.numel()
            and bool((counts >= 0).all()) and bool((lengths >= 0).all()),
            f"Expected one count length per graph ({ptr.numel() - 1}) adding up to the "
            f"{counts.numel()} counts of '{key}', got {lengths.numel()} lengths adding up to "
            f"{int(lengths.sum())}")
    offset = lengths.cumsum(0) - lengths
    csum = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    per_graph = csum[offset + lengths] - csum[offset]
    _expect(torch.equal(per_graph, ptr.diff()),
            f"The counts of '{key}' describe {int(counts.sum())} entries "
            f"({per_graph[:5].tolist()}... per graph), but its slices hold {row1.numel()} "
            f"({ptr.diff()[:5].tolist()}... per graph)")
    # The value of every count slot (its position within its graph), each repeated count times.
    local = torch.arange(counts.numel()) - torch.repeat_interleave(offset, lengths)
    return torch.repeat_interleave(local.to(dtype), counts, output_size=row1.numel())

