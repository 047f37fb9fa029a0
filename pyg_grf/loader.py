r"""Mini-batches that arrive with their attention plans built.

The structures a GRF (or GKAT) layer reads depend only on the batch's walks and are too large to
store per graph, so they are built per batch, once, into an immutable plan
(:class:`~pyg_grf.nn.attention.grf.GRFPlan`, a snapshot of the batch as in PyG's ``cached=True``
contract): by :func:`prepare_payload`, or by :class:`DataLoader` in its collate function, so that
with ``num_workers >= 1`` the work runs in the worker processes beside the training step.
:class:`NodePartLoader` trains on one large graph part by part.
"""
from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader as PyGDataLoader
from torch_geometric.loader import RandomNodeLoader

from pyg_grf._validation import check_int
from pyg_grf.features.join import warm_compiled_join
from pyg_grf.nn.attention.base import attention_layers, plan_field, prepare_payload

__all__ = ['DataLoader', 'PayloadCollater', 'prepare_payload', 'attention_layers',
           'NodePartLoader', 'check_part_args', 'PART_WALKS']


class PayloadCollater:
    r"""A collate function: ``collate(data_list)``, then :func:`prepare_payload` for the
    attention layers of ``model`` (copied to the CPU when the collater is built; only their
    configuration is read). With ``plan_cache_bytes > 0``, a batch of one graph whose walk
    entries were planned before gets that plan (least recently used plans out first)."""

    def __init__(self, collate: Any, model: Union[nn.Module, Sequence[nn.Module]],
                 plan_cache_bytes: int = 0):
        self.collate = collate
        self.layers = [copy.deepcopy(m).cpu() for m in attention_layers(model)]
        self.plan_cache_bytes = int(plan_cache_bytes)
        self.prefixes = sorted({getattr(m, 'attr_prefix', 'grf') for m in self.layers}
                               | {'rwgnk'})
        self._plans: 'OrderedDict[bytes, Tuple[Dict[str, Any], int]]' = OrderedDict()

    def __call__(self, data_list: Any) -> Any:
        try:
            batch = self.collate(data_list)
        except KeyError as e:  # PyG's collation: an attribute some graphs lack
            name = str(e.args[0]) if e.args else ''
            if name.endswith('_draw'):
                raise ValueError(f"the graphs of this batch were given walks with different "
                                 f"num_draws ('{name}' is on some graphs only): use one "
                                 f"AddGraphRandomFeatures(num_draws=...) for every graph of "
                                 f"the dataset") from None
            raise
        if not self.layers:
            return batch
        key = None
        if self.plan_cache_bytes > 0 and getattr(batch, 'num_graphs', 1) == 1:
            key = _digest(batch, self.prefixes)
            if key in self._plans:
                self._plans.move_to_end(key)
                for name, plan in self._plans[key][0].items():
                    batch[plan_field(name)] = plan
                return batch
        prepare_payload(self.layers, batch)
        payload = {name[:-5]: batch[name] for name in batch.keys() if name.endswith('_plan')}
        if key is not None and payload:
            size = sum(_nbytes(v) for v in payload.values())
            if size <= self.plan_cache_bytes:
                self._plans[key] = (payload, size)
                while sum(size for _, size in self._plans.values()) > self.plan_cache_bytes:
                    self._plans.popitem(last=False)
        return batch


def _digest(data: Any, prefixes: Sequence[str]) -> bytes:
    # the graph's identity for the plan cache: its size and every tensor a plan of these
    # layers may read (the fields under their attr_prefix, whatever it is, and the batch)
    h = hashlib.blake2b(digest_size=16)
    h.update(str(data.num_nodes).encode())
    for name in sorted(data.keys()):
        value = data[name]
        if isinstance(value, torch.Tensor) and (name == 'batch' or any(
                name.startswith(f'{p}_') for p in prefixes)):
            h.update(f'{name}:{value.dtype}:{tuple(value.shape)}'.encode())
            h.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
                     .tobytes())
    return h.digest()


def _nbytes(plan: Any) -> int:
    sizes = plan.nbytes() if hasattr(plan, 'nbytes') else 0
    return sum(sizes.values()) if isinstance(sizes, dict) else int(sizes)


class DataLoader(PyGDataLoader):
    r"""PyG's :class:`~torch_geometric.loader.DataLoader` that builds the attention plans of
    every mini-batch for ``model`` as it collates it (:func:`prepare_payload`). With
    ``num_workers >= 1`` this per-batch work runs in the loader's worker processes, beside the
    training step instead of inside it::

        loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=1, model=model)
        for batch in loader:
            out = model(batch)  # reads the prepared plans (a layer: layer.payload(batch))

    Args:
        dataset, batch_size, shuffle, follow_batch, exclude_keys, **kwargs: as in PyG's
            ``DataLoader``.
        model (nn.Module or sequence of attention layers, optional): the model whose
            attention layers read the batches. Their configuration is copied when the loader
            is built; a layer changed later (e.g. cast to float64) builds the part that
            differs in the step. :obj:`None`: PyG's loader unchanged.
        plan_cache_bytes (int, optional): keep the plans of single-graph batches up to this
            many bytes, keyed by a digest of the graph's walk entries, so that each graph of a
            full-graph dataset is planned once and redrawn walks get a fresh plan (default:
            ``2 ** 30``).
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 follow_batch: Optional[List[str]] = None,
                 exclude_keys: Optional[List[str]] = None,
                 model: Union[nn.Module, Sequence[nn.Module], None] = None,
                 plan_cache_bytes: int = 2 ** 30, **kwargs: Any):
        super().__init__(dataset, batch_size, shuffle, follow_batch=follow_batch,
                         exclude_keys=exclude_keys, **kwargs)
        if model is not None:
            self.collate_fn = PayloadCollater(self.collate_fn, model, plan_cache_bytes)
            if self.num_workers > 0 and self.collate_fn.layers:
                warm_compiled_join()  # the workers, forked every epoch, inherit the kernels


#: How :class:`NodePartLoader` gives each part its walks.
PART_WALKS = ('restrict', 'recompute')


def check_part_args(num_parts: Any, walks: Any, transform: Optional[Callable]) -> None:
    r"""Checks the arguments of :class:`NodePartLoader`."""
    check_int('num_parts', num_parts, 1)
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
        walks = (RestrictGraphRandomFeatures(full, self.attr_prefixes)
                 if self.walks == 'restrict' else self.transform)
        # the parts are cut from a shallow copy without the loads (PyG's subgraph would slice
        # any entry tensor whose length happens to equal the node count); each part gets its own
        base = copy.copy(full)
        for prefix in grf_prefixes(full):
            for name in ('index', 'length', 'load', 'draw'):
                if f'{prefix}_{name}' in base:
                    del base[f'{prefix}_{name}']
        base.n_id = torch.arange(full.num_nodes, device=full.x.device if full.x is not None
                                 else None)
        for part in RandomNodeLoader(base, num_parts=self.num_parts, shuffle=self.shuffle):
            yield walks(part)
