r"""Precomputed graph random features through PyG's subgraph tools (``Data.subgraph``,
``RandomNodeLoader``, ``ClusterLoader``, ``NeighborLoader``), which renumber the nodes but copy
the loads of :class:`~pyg_grf.transforms.AddGraphRandomFeatures` unchanged. The restriction
keeps the entries whose two ends both survive, renumbered:

.. math::
    \mathrm{load}'(\pi(i), \pi(q), l) = \mathrm{load}(i, q, l)
    \quad \text{for } i, q \in S,

with :math:`S` the kept nodes and :math:`\pi(v)` the position of :math:`v` in :math:`S`; the
walks stay those drawn on the full graph. The asymmetric mask :math:`M = \widehat\Phi` becomes
exactly the principal submatrix :math:`\widehat\Phi_{SS}`; the symmetric one becomes
:math:`\widehat\Phi_{SS}\widehat\Phi_{SS}^\top`: walks that meet only outside :math:`S` no
longer contribute, so entries shrink (for nonnegative :math:`f`) compared with :math:`M_{SS}`.
"""
from __future__ import annotations

import copy
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform

from pyg_grf._validation import is_sorted
from pyg_grf.features.loads import GRFLoads

_SUFFIXES = ('index', 'length', 'load')


def grf_prefixes(data: Any) -> List[str]:
    r"""The attribute prefixes of every set of GRF loads on :obj:`data`: each :obj:`p` for which
    :obj:`{p}_index`, :obj:`{p}_length` and :obj:`{p}_load` are all present (e.g.
    :obj:`['grf', 'grf_key']`), sorted."""
    keys = set(data.keys())
    return sorted(key[:-len('_index')] for key in keys
                  if key.endswith('_index') and key != 'edge_index'
                  and f"{key[:-len('_index')]}_length" in keys
                  and f"{key[:-len('_index')]}_load" in keys)


def _node_map(subset: Tensor, num_nodes: int, device: torch.device) -> Tuple[Tensor, Tensor]:
    r"""Validates :obj:`subset` (node ids or a boolean mask over :obj:`num_nodes` nodes) and
    returns it as ids together with the map ``old id -> new id`` (``-1`` for dropped nodes)."""
    subset = _check_ids(subset, num_nodes, 'subset', masks=True).to(device)
    n = subset.numel()
    node_map = torch.full((num_nodes, ), -1, dtype=torch.long, device=device)
    node_map[subset] = torch.arange(n, device=device)
    # A repeated id would map two new nodes onto one old node; refuse it.
    if int((node_map >= 0).sum()) != n:
        raise ValueError("'subset' must not repeat a node id")
    return subset, node_map


def _check_range(ids: Tensor, num_nodes: int, what: str, hint: str = '') -> None:
    r"""Raises unless the ids lie in ``[0, num_nodes)``; the error starts with ``what``."""
    if ids.numel() > 0:
        lo, hi = (int(t) for t in torch.aminmax(ids))
        if lo < 0 or hi >= num_nodes:
            raise ValueError(f"{what} in [0, {num_nodes}), got ids in [{lo}, {hi}]{hint}")


def _check_loads(index: Tensor, hop: Tensor, load: Tensor, num_nodes: int, what: str,
                 hint: str = '') -> None:
    r"""The GRF loads are an index ``[2, nnz]`` of nodes in ``[0, num_nodes)`` with one hop count
    and one load per entry (see :func:`_check_range` for ``what`` and ``hint``)."""
    if index.dim() != 2 or index.size(0) != 2:
        raise ValueError(f"the GRF index must have shape [2, nnz], got {tuple(index.shape)}")
    if hop.shape != index.shape[1:] or load.shape != index.shape[1:]:
        raise ValueError(f"the GRF hop counts and loads must have shape [{index.size(1)}], got "
                         f"{tuple(hop.shape)} and {tuple(load.shape)}")
    _check_range(index, num_nodes, what, hint)


def _pair_sorted(new: Tensor, hop: Tensor, load: Tensor, num_new: int, monotone: bool,
                 dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The kept entries, renumbered to :obj:`new` ``[2, nnz]``, back in (start, visited, hop)
    order, the index in :obj:`dtype`. A renumbering that is not :obj:`monotone` changed the order
    of the (start, visited) pairs; a stable sort on the pair keeps the hop order inside each pair
    (pairs map one to one)."""
    if not monotone and new.size(1) > 1:
        perm = torch.sort(new[0] * num_new + new[1], stable=True).indices
        new, hop, load = new[:, perm], hop[perm], load[perm]
    return new.to(dtype), hop, load


def _restrict(index: Tensor, hop: Tensor, load: Tensor, node_map: Tensor, num_new: int,
              monotone: bool) -> Tuple[Tensor, Tensor, Tensor]:
    r"""The entries whose two ends survive, renumbered through :obj:`node_map` and sorted by
    (start, visited, hop) as the transform stores them."""
    _check_loads(index, hop, load, node_map.numel(),
                 "the GRF index must hold node ids of the full graph",
                 ": are these loads already restricted, or from another graph?")
    new = node_map[index.long()]
    keep = (new >= 0).all(dim=0)
    new, hop, load = new[:, keep], hop[keep], load[keep]
    return _pair_sorted(new, hop, load, num_new, monotone, index.dtype)


def subgraph_grf(
    data: Union[Data, GRFLoads],
    subset: Tensor,
    num_nodes: Optional[int] = None,
    attr_prefixes: Optional[Sequence[str]] = None,
) -> Union[Data, GRFLoads]:
    r"""The induced subgraph on :obj:`subset` with the loads restricted and renumbered (see
    the module docstring). Call it in place of :meth:`Data.subgraph`, which copies the loads
    unchanged (or slices them when their length happens to equal the number of nodes or
    edges); for a :class:`~pyg_grf.features.GRFLoads` it returns the restricted loads (key side
    and batch vector too). For many batches of one graph :class:`RestrictGraphRandomFeatures`
    is faster. A :class:`~pyg_grf.nn.attention.grf.GRFPlan` is never restricted: build the
    part's own plan.

    Args:
        data (Data or GRFLoads): The full graph and its loads.
        subset (torch.Tensor): The nodes to keep: ids (the :math:`k`-th id becomes node
            :math:`k`, as in :meth:`Data.subgraph`) or a boolean mask over the nodes.
        num_nodes (int, optional): Number of nodes of the full graph. (default: from
            :obj:`data`)
        attr_prefixes (list of str, optional): The prefixes of the loads to restrict.
            (default: every set found on the :obj:`Data`)
    """
    if isinstance(data, GRFLoads):
        N = data.num_nodes if num_nodes is None else int(num_nodes)
        if N != data.num_nodes:
            raise ValueError(f"'num_nodes' is {N} but the loads cover {data.num_nodes} nodes")
        subset, node_map = _node_map(subset, N, data.index.device)
        return _restrict_loads(data, subset, node_map)
    if not isinstance(data, Data):
        raise TypeError(f"'data' must be a torch_geometric.data.Data or a GRFLoads, got "
                        f"{type(data).__name__}")
    N = data.num_nodes if num_nodes is None else int(num_nodes)
    if N is None:
        raise ValueError("Cannot infer the number of nodes of the graph: pass 'num_nodes'")
    if data.num_nodes is not None and N != data.num_nodes:
        raise ValueError(f"'num_nodes' is {N} but the graph has {data.num_nodes} nodes")
    prefixes = _check_prefixes(data, attr_prefixes)
    device = data[f'{prefixes[0]}_index'].device if prefixes else None
    ids, node_map = _node_map(subset, N, device or subset.device)
    monotone = ids.numel() < 2 or bool((ids[1:] > ids[:-1]).all())

    # Slice everything else the PyG way, with the loads kept out of it:
    rest = copy.copy(data)
    for p in prefixes:
        for s in _SUFFIXES:
            del rest[f'{p}_{s}']
    if 'num_nodes' not in rest._store and not rest.node_attrs():
        rest.num_nodes = N  # nothing left to infer it from
    out = rest.subgraph(ids.to(subset.device) if subset.dtype != torch.bool else subset)
    for p in prefixes:
        index, hop, load = _restrict(data[f'{p}_index'], data[f'{p}_length'], data[f'{p}_load'],
                                     node_map, ids.numel(), monotone)
        out[f'{p}_index'], out[f'{p}_length'], out[f'{p}_load'] = index, hop, load
    return out


def _check_prefixes(data: Any, attr_prefixes: Optional[Sequence[str]]) -> List[str]:
    found = grf_prefixes(data)
    if attr_prefixes is None:
        return found
    if isinstance(attr_prefixes, str):
        attr_prefixes = [attr_prefixes]
    missing = [p for p in attr_prefixes if p not in found]
    if missing:
        raise ValueError(f"no GRF loads with prefix {missing} on the data (expected the "
                         f"attributes '<prefix>_index', '<prefix>_length' and '<prefix>_load'; "
                         f"found prefixes {found})")
    return list(attr_prefixes)


def _restrict_loads(grf: GRFLoads, subset: Tensor, node_map: Tensor) -> GRFLoads:
    monotone = subset.numel() < 2 or bool((subset[1:] > subset[:-1]).all())
    index, hop, load = _restrict(grf.index, grf.hop, grf.load, node_map, subset.numel(),
                                 monotone)
    key = None if grf.key is None else _restrict_loads(grf.key, subset, node_map)
    batch = None if grf.batch is None else grf.batch[subset.to(grf.batch.device)]
    if batch is not None and not is_sorted(batch):
        raise ValueError("the subset reorders the graphs of the batch ('batch' would not be "
                         "sorted): pass the node ids of each graph contiguously")
    return GRFLoads(index, hop, load, subset.numel(), batch=batch, max_length=grf.max_length,
                    key=key)


def _check_ids(ids: Tensor, num_nodes: int, name: str, masks: bool = False) -> Tensor:
    r"""Validates node ids of the full graph (or, with :obj:`masks`, a boolean mask over its
    nodes) and returns them as int64 ids."""
    what = 'node ids or a boolean mask' if masks else 'node ids'
    if not isinstance(ids, Tensor):
        raise TypeError(f"'{name}' must be a tensor of {what}, got {type(ids).__name__}")
    if ids.dim() != 1:
        raise ValueError(f"'{name}' must be 1-D ({what}), got shape {tuple(ids.shape)}")
    if masks and ids.dtype == torch.bool:
        if ids.numel() != num_nodes:
            raise ValueError(f"a boolean '{name}' must have one entry per node ({num_nodes}), "
                             f"got {ids.numel()}")
        ids = ids.nonzero().view(-1)
    elif ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"'{name}' must hold integer node ids"
                        f"{' or be a boolean mask' if masks else ''}, got {ids.dtype}")
    ids = ids.long()
    _check_range(ids, num_nodes, f"'{name}' must hold node ids of the full graph")
    return ids


def _by_start(index: Tensor, hop: Tensor, load: Tensor,
              num_nodes: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Validates full-graph loads, sorts them by (start, visited, hop) if they are not, and
    returns them with the CSR row pointer of the starts."""
    _check_loads(index, hop, load, num_nodes, "the GRF index must hold node ids")
    start = index[0].long()
    if index.numel() > 0:
        # sorted by (start, visited, hop), as the transform stores them? otherwise sort once
        pair = start * num_nodes + index[1].long()
        step = pair[1:] - pair[:-1]
        if bool((step < 0).any()) or bool(((step == 0) & (hop[1:] < hop[:-1])).any()):
            perm = torch.sort(hop, stable=True).indices
            perm = perm[torch.sort(pair[perm], stable=True).indices]
            index, hop, load, start = index[:, perm], hop[perm], load[perm], start[perm]
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=index.device)
    rowptr[1:] = torch.cumsum(torch.bincount(start, minlength=num_nodes), 0)
    return index, hop, load, rowptr


def _restrict_rows(index: Tensor, hop: Tensor, load: Tensor, rowptr: Tensor, ids: Tensor,
                   node_map: Tensor, monotone: bool) -> Tuple[Tensor, Tensor, Tensor]:
    r""":func:`_restrict` through the CSR of the starts: gathers only the entries that start at
    a node of :obj:`ids` (in the order of :obj:`ids`, so grouped by new start), then keeps those
    whose visited node is in :obj:`ids` too."""
    n = ids.numel()
    first, counts = rowptr[ids], rowptr[ids + 1] - rowptr[ids]
    # positions of all entries of the kept starts: first[k] + 0, 1, ..., counts[k] - 1
    seg = torch.repeat_interleave(torch.arange(n, device=ids.device), counts)
    offset = torch.cumsum(counts, 0) - counts
    pos = torch.arange(seg.numel(), device=ids.device) - offset[seg] + first[seg]
    visited = node_map[index[1, pos].long()]
    keep = visited >= 0
    new = torch.stack([seg[keep], visited[keep]])
    pos = pos[keep]
    hop, load = hop[pos], load[pos]
    # grouped by new start already; only the visited order inside a start may have changed
    return _pair_sorted(new, hop, load, n, monotone, index.dtype)


@functional_transform('restrict_graph_random_features')
class RestrictGraphRandomFeatures(BaseTransform):
    r"""Restricts the graph random features of a full graph to the nodes of a sampled subgraph,
    by the subgraph's record of the original node ids :obj:`node_id_attr` (functional name:
    :obj:`restrict_graph_random_features`), as :func:`subgraph_grf` but indexing the entries by
    start node once. The walks stay those drawn once on the full graph.

    :class:`~torch_geometric.loader.NeighborLoader` stores :obj:`n_id` on every batch (pass
    this transform as :obj:`transform=`); for :class:`~torch_geometric.loader.RandomNodeLoader`
    and :class:`~torch_geometric.loader.ClusterLoader` set
    :obj:`data.n_id = torch.arange(data.num_nodes)` first and apply the transform to each batch.

    Args:
        data (Data or GRFLoads): The full graph with its loads, or its
            :class:`~pyg_grf.features.GRFLoads` (written under :obj:`attr_prefix`, its key side
            under :obj:`f'{attr_prefix}_key'`).
        attr_prefixes (list of str, optional): The prefixes of the loads to take from
            :obj:`data`. (default: every set found)
        node_id_attr (str, optional): The batch attribute holding the original node ids.
            (default: :obj:`"n_id"`)
        attr_prefix (str, optional): The prefix of the loads of a :obj:`GRFLoads`.
            (default: :obj:`"grf"`)
    """
    def __init__(self, data: Union[Data, GRFLoads], attr_prefixes: Optional[Sequence[str]] = None,
                 node_id_attr: str = 'n_id', attr_prefix: str = 'grf') -> None:
        if isinstance(data, GRFLoads):
            if attr_prefixes is not None:
                raise ValueError("'attr_prefixes' selects loads on a Data object; for a GRFLoads "
                                 "use 'attr_prefix'")
            loads = {attr_prefix: (data.index, data.hop, data.load)}
            if data.key is not None:
                loads[f'{attr_prefix}_key'] = (data.key.index, data.key.hop, data.key.load)
        elif isinstance(data, Data):
            prefixes = _check_prefixes(data, attr_prefixes)
            if not prefixes:
                raise ValueError("the data holds no GRF loads (expected '<prefix>_index', "
                                 "'<prefix>_length' and '<prefix>_load', e.g. from "
                                 "AddGraphRandomFeatures)")
            loads = {p: tuple(data[f'{p}_{s}'] for s in _SUFFIXES) for p in prefixes}
        else:
            raise TypeError(f"'data' must be a torch_geometric.data.Data or a GRFLoads, got "
                            f"{type(data).__name__}")
        N = self.num_nodes = int(data.num_nodes)
        # Validate the full graph's loads once, and index them by start node (CSR), so that a
        # batch only touches the entries of its own nodes: O(entries of the batch), not O(nnz).
        self.loads = {p: _by_start(*t, N) for p, t in loads.items()}
        self.attr_prefixes, self.node_id_attr = sorted(loads), node_id_attr
        self._node_map: Optional[Tensor] = None  # old id -> new id, -1 outside the batch

    def forward(self, data: Data) -> Data:
        if not isinstance(data, Data):
            raise TypeError(f"{self.__class__.__name__} expects a torch_geometric.data.Data "
                            f"(homogeneous graph), got {type(data).__name__}")
        n_id = getattr(data, self.node_id_attr, None)
        if n_id is None:
            raise ValueError(f"the subgraph has no '{self.node_id_attr}' (the original id of each "
                             f"of its nodes): NeighborLoader stores it; for Data.subgraph, "
                             f"RandomNodeLoader and ClusterLoader set data.{self.node_id_attr} = "
                             f"torch.arange(data.num_nodes) on the full graph first")
        if data.num_nodes is not None and n_id.numel() != data.num_nodes:
            raise ValueError(f"'{self.node_id_attr}' must hold one id per node of the subgraph "
                             f"({data.num_nodes}), got {n_id.numel()}")
        N = self.num_nodes
        index0 = next(iter(self.loads.values()))[0]
        ids = _check_ids(n_id, N, self.node_id_attr).to(index0.device)
        n = ids.numel()
        if self._node_map is None or self._node_map.device != index0.device:
            self._node_map = torch.full((N, ), -1, dtype=torch.long, device=index0.device)
        node_map = self._node_map
        new_ids = torch.arange(n, device=ids.device)
        node_map[ids] = new_ids
        try:
            if not bool((node_map[ids] == new_ids).all()):
                raise ValueError(f"'{self.node_id_attr}' must not repeat a node id")
            monotone = n < 2 or bool((ids[1:] > ids[:-1]).all())
            data = copy.copy(data)  # never mutate the input
            for p, (index, hop, load, rowptr) in self.loads.items():
                index, hop, load = _restrict_rows(index, hop, load, rowptr, ids, node_map,
                                                  monotone)
                data[f'{p}_index'], data[f'{p}_length'], data[f'{p}_load'] = index, hop, load
        finally:
            node_map[ids] = -1  # leave the map clean for the next batch
        return data

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_nodes={self.num_nodes}, '
                f'attr_prefixes={self.attr_prefixes}, node_id_attr={self.node_id_attr!r})')
