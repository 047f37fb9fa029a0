r"""Mini-batches that arrive with their GRF payload prepared.

A GRF layer needs, for every new batch, structures that depend only on the batch's walks: the
pairs of :math:`\widehat\Phi`, the statistics of the symmetric mask (a join of the walks on
their visited nodes), sparse patterns and their transposes, the block layout
(:mod:`pyg_grf.features.loads`). Built inside the training step they cost as much as a layer
or more. They cannot be stored per graph with the dataset at a reasonable size (the mask
statistics of one 150-node molecule take ~160 KB, 2.5 GB for Peptides-func), so they are built
per batch, *beside* the step:

* :func:`prepare_payload` builds them for the GRF layers of a model on one batch and leaves the
  result on the batch, where :meth:`GRFLoads.from_data <pyg_grf.features.GRFLoads.from_data>`
  (hence every layer, :meth:`GRFGPSConv.payload <pyg_grf.nn.GRFGPSConv.payload>` and
  :class:`~pyg_grf.nn.GraphTransformer`) finds it, after an exact check that it was built from
  the batch's own tensors;
* :class:`DataLoader` is PyG's ``DataLoader`` that does this in its collate function, so that
  with ``num_workers >= 1`` the work runs in the worker processes while the main process
  trains. What crosses the process boundary is shared memory of about
  ``nnz(M) * (4 * K (K + 1) / 2 + 40)`` bytes per batch (``nnz(M)`` the mask's nonzeros,
  :math:`K = L + 1`): 38 MB for a batch of 64 LRGB-sized molecules.

A loader of a single batch (one full graph, e.g. Planetoid) yields a new ``Batch`` every
epoch; :class:`DataLoader` hands it the payloads built for the previous one, which
``from_data`` reuses only if the new batch holds exactly the same entries.

:class:`NodePartLoader` trains on one large graph part by part (PyG's ``RandomNodeLoader``),
each part with the GRF loads of its nodes: the full graph's walks restricted to the part, or
walks drawn afresh on it.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader as PyGDataLoader
from torch_geometric.loader import RandomNodeLoader

from pyg_grf.features.kept import PREPARED_ATTR, carry_kept
from pyg_grf.features.loads import GRFLoads
from pyg_grf.nn.attention.grf import GRFAttention

__all__ = ['DataLoader', 'PayloadCollater', 'prepare_payload', 'grf_layers', 'NodePartLoader',
           'check_part_args', 'PART_WALKS']


def grf_layers(model: Union[nn.Module, Sequence[GRFAttention]]) -> List[GRFAttention]:
    r"""The :class:`~pyg_grf.nn.GRFAttention` layers of ``model`` (a module or a sequence of
    layers), in module order."""
    if isinstance(model, nn.Module):
        return [m for m in model.modules() if isinstance(m, GRFAttention)]
    layers = list(model)
    bad = [type(m).__name__ for m in layers if not isinstance(m, GRFAttention)]
    if bad:
        raise TypeError(f"expected an nn.Module or a sequence of GRFAttention layers, got a "
                        f"sequence holding {bad}")
    return layers


def prepare_payload(model: Union[nn.Module, Sequence[GRFAttention]], data: Any) -> Any:
    r"""Builds the GRF payload that the GRF layers of ``model`` read on ``data`` (a ``Data`` or
    ``Batch`` with the loads of :class:`~pyg_grf.transforms.AddGraphRandomFeatures`), with every
    structure their backends build per batch (:meth:`GRFAttention.prepare
    <pyg_grf.nn.GRFAttention.prepare>`), and leaves it on ``data`` (returned).

    The layers then find it through :meth:`GRFLoads.from_data
    <pyg_grf.features.GRFLoads.from_data>`, which hands it out only while ``data`` still holds
    exactly the tensors it was built from (else it builds fresh loads): a payload is a
    snapshot of the batch, never served for edited data. A model without GRF layers leaves
    ``data`` unchanged."""
    prepared = dict(data.__dict__.get(PREPARED_ATTR, {}))
    for layer in grf_layers(model):
        prefix = layer.attr_prefix
        key_prefix = f'{prefix}_key'
        if any(getattr(data, f'{key_prefix}_{s}', None) is None
               for s in ('index', 'length', 'load')):
            key_prefix = None
        loads = prepared.get((prefix, key_prefix))
        if loads is None:
            loads = GRFLoads.from_data(data, prefix, key_prefix=key_prefix)
            prepared[(prefix, key_prefix)] = loads
        layer.prepare(loads)
    if prepared:
        data.__dict__[PREPARED_ATTR] = prepared
    return data


class PayloadCollater:
    r"""A collate function: ``collate(data_list)``, then :func:`prepare_payload` for the GRF
    layers of ``model`` (copied to the CPU when the collater is built; only their configuration
    is read: mode, backend, heads, widths, walk draws, dtype)."""

    def __init__(self, collate: Any, model: Union[nn.Module, Sequence[GRFAttention]]):
        self.collate = collate
        self.layers = [copy.deepcopy(m).cpu() for m in grf_layers(model)]

    def __call__(self, data_list: Any) -> Any:
        return prepare_payload(self.layers, self.collate(data_list))


class DataLoader(PyGDataLoader):
    r"""PyG's :class:`~torch_geometric.loader.DataLoader` that prepares the GRF payload of every
    mini-batch for ``model`` as it collates it (:func:`prepare_payload`). With
    ``num_workers >= 1`` this per-batch work runs in the loader's worker processes, beside the
    training step instead of inside it::

        loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=1, model=model)
        for batch in loader:
            out = model(batch)  # GraphTransformer: reads the prepared payload

        for batch in loader:  # a loop of your own with GRFGPSConv layers
            payload = convs[0].payload(batch)  # the prepared GRFLoads
            ...

    Args:
        dataset, batch_size, shuffle, follow_batch, exclude_keys, **kwargs: as in PyG's
            ``DataLoader``.
        model (nn.Module or sequence of GRFAttention, optional): the model whose GRF layers
            read the batches. Their configuration is copied when the loader is built; a layer
            changed later (e.g. cast to float64) still runs correctly, building what differs
            in the step. :obj:`None`: PyG's loader unchanged.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 follow_batch: Optional[List[str]] = None,
                 exclude_keys: Optional[List[str]] = None,
                 model: Union[nn.Module, Sequence[GRFAttention], None] = None, **kwargs: Any):
        super().__init__(dataset, batch_size, shuffle, follow_batch=follow_batch,
                         exclude_keys=exclude_keys, **kwargs)
        if model is not None:
            self.collate_fn = PayloadCollater(self.collate_fn, model)

    def __iter__(self):
        # Full-graph training: a loader of one batch collates the same graph into a new Batch
        # every epoch, which would rebuild its payload (the pair join, patterns) every step.
        # The payloads GRFLoads.from_data / RWGNKLoads.from_data kept on the previous batch go
        # to the new one; from_data returns them only after an exact comparison with the new
        # batch's entries, so walks redrawn by a transform still get fresh loads.
        single = self._single_batch()
        for batch in super().__iter__():
            if single:
                carry_kept(self.__dict__.get('_last_batch'), batch)
                self._last_batch = batch
            yield batch

    def _single_batch(self) -> bool:
        try:
            return len(self) == 1
        except TypeError:  # an iterable-style dataset has no length
            return False


#: How :class:`NodePartLoader` gives each part its walks.
PART_WALKS = ('restrict', 'recompute')


def check_part_args(num_parts: Any, walks: Any, transform: Optional[Callable]) -> None:
    r"""Checks the arguments of :class:`NodePartLoader` (a clear error at construction, not at
    the first epoch)."""
    if not isinstance(num_parts, int) or isinstance(num_parts, bool) or num_parts < 1:
        raise ValueError(f"'num_parts' must be an integer >= 1, got {num_parts!r}")
    if walks not in PART_WALKS:
        raise ValueError(f"'walks' must be one of {PART_WALKS}, got {walks!r}")
    if walks == 'recompute' and transform is None:
        raise ValueError("walks='recompute' draws the walks of every part: pass the walk "
                         "transform, e.g. transform=AddGraphRandomFeatures(...)")


class NodePartLoader:
    r"""One epoch over a large graph in ``num_parts`` random node parts (PyG's
    :class:`~torch_geometric.loader.RandomNodeLoader`: the subgraph induced by each part), each
    part carrying the GRF loads of its nodes, so that a GRF model trains on one part per step
    (memory and time per step :math:`O(N / P)`):

    * ``walks='restrict'``: the walks drawn once on the full graph, restricted to the part
      (:class:`~pyg_grf.transforms.RestrictGraphRandomFeatures`: the entries whose start and
      visited node both lie in the part; walks are not cut at the part's boundary);
    * ``walks='recompute'``: walks drawn afresh on every part by :obj:`transform` (e.g.
      :class:`~pyg_grf.transforms.AddGraphRandomFeatures`: walks stop at the boundary).

    Args:
        data (Data or callable): the full graph, with its loads for ``'restrict'``; or a callable
            returning it, called once per epoch (a dataset's ``lambda: dataset[0]``, so that a
            per-access transform runs every epoch).
        num_parts (int): parts per epoch (steps per epoch).
        walks (str, optional): ``'restrict'`` or ``'recompute'`` (default: :obj:`'restrict'`).
        transform (callable, optional): draws the walks of a part, for ``'recompute'``.
        attr_prefixes (list of str, optional): the loads' prefixes (default: every set found).
        shuffle (bool, optional): new random parts every epoch (default: :obj:`True`).
    """

    def __init__(self, data: Union[Data, Callable[[], Data]], num_parts: int,
                 walks: str = 'restrict', transform: Optional[Callable] = None,
                 attr_prefixes: Optional[Sequence[str]] = None, shuffle: bool = True):
        check_part_args(num_parts, walks, transform)
        self.data = data
        self.num_parts = num_parts
        self.walks = walks
        self.transform = transform
        self.attr_prefixes = attr_prefixes
        self.shuffle = shuffle

    def __len__(self) -> int:
        return self.num_parts

    def __iter__(self) -> Iterator[Data]:
        from pyg_grf.transforms import RestrictGraphRandomFeatures, grf_prefixes
        full = self.data if isinstance(self.data, Data) else self.data()
        if not isinstance(full, Data):
            raise TypeError(f"NodePartLoader expects a torch_geometric.data.Data, got "
                            f"{type(full).__name__}")
        restrict = None
        if self.walks == 'restrict':
            restrict = RestrictGraphRandomFeatures(full, self.attr_prefixes)
        # the parts are cut from the graph without its loads (PyG's subgraph would slice any
        # entry tensor whose length happens to equal the node count); each part gets its own.
        # A shallow copy: the keys are dropped from the copy only, no tensor is copied.
        base = copy.copy(full)
        for prefix in grf_prefixes(full):
            for name in ('index', 'length', 'load', 'draw'):
                if f'{prefix}_{name}' in base:
                    del base[f'{prefix}_{name}']
        base.n_id = torch.arange(full.num_nodes, device=full.x.device if full.x is not None
                                 else None)
        for part in RandomNodeLoader(base, num_parts=self.num_parts, shuffle=self.shuffle):
            yield restrict(part) if restrict is not None else self.transform(part)
