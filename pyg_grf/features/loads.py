r"""The typed GRF loads of a graph or a mini-batch (:class:`GRFLoads`): validated once, owned,
immutable; the input of the per-batch plan (:class:`~pyg_grf.nn.attention.grf.GRFPlan`)."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_grf._validation import is_sorted
from pyg_grf.features.grf import hop_values

_INT32_MAX = 2 ** 31 - 1


def _check_tensor(name: str, t: Any, dim: int) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"'{name}' must be a tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"'{name}' must be {dim}-D, got shape {tuple(t.shape)}")
    return t


def narrow_index(index: Tensor, bound: int, copy: bool = False) -> Tensor:
    r"""``index`` as ``int32`` when every id is below ``bound`` < :math:`2^{31}` (half the
    bytes, and what torch's CPU CSR kernels take without a conversion), else ``int64``."""
    return index.to(torch.int32 if bound <= _INT32_MAX else torch.int64, copy=copy)


class GRFLoads:
    r"""The importance-weighted loads that :class:`~pyg_grf.transforms.AddGraphRandomFeatures`
    stores on a ``Data`` object (GRF paper, Eq. 10): entry :math:`e` is a (start node
    :math:`i`, visited node :math:`q`, hop count :math:`l`) with
    :math:`\mathrm{load}(i, q, l)`, and a layer with coefficients :math:`f` turns them into

    .. math::
        \widehat\Phi_{iq} = \sum_l f_l\,\mathrm{load}(i, q, l).

    Build it with :meth:`from_data`. The inputs are validated here (index range, hop counts,
    finite loads, batch vector), once per batch, with one host read; the entries are the
    object's own copies (``int32`` ids and ``uint8`` hop counts where the sizes allow), and every
    method is a pure function of them.

    Args:
        index (Tensor): ``[2, nnz]`` (start node, visited node) of every entry.
        hop (Tensor): ``[nnz]`` hop count :math:`l \ge 0` of every entry.
        load (Tensor): ``[nnz]`` load of every entry.
        num_nodes (int): :math:`N`.
        batch (Tensor, optional): ``[N]`` graph id of every node, sorted (a PyG batch).
            :obj:`None` for a single graph.
        max_length (int, optional): the transform's :math:`L` (hop counts must not exceed it).
        key (GRFLoads, optional): loads of independent key-side walks on the same nodes
            (unbiased diagonal, GRF paper Sec. 3.3): the symmetric mask becomes
            :math:`\widehat\Phi_Q\widehat\Phi_K^\top`.
        draw (Tensor, optional): ``[nnz]`` id of the independent walk draw of every entry
            (``AddGraphRandomFeatures(num_draws=D)``); the layers give each head its own draw
            (:meth:`fold`). :obj:`None`: one draw.
    """

    def __init__(self, index: Tensor, hop: Tensor, load: Tensor, num_nodes: int,
                 batch: Optional[Tensor] = None, max_length: Optional[int] = None,
                 key: Optional['GRFLoads'] = None, draw: Optional[Tensor] = None):
        _check_tensor('grf_index', index, 2)
        if index.size(0) != 2:
            raise ValueError(f"'grf_index' must have shape [2, nnz], got {tuple(index.shape)}")
        _check_tensor('grf_length', hop, 1)
        _check_tensor('grf_load', load, 1)
        nnz = index.size(1)
        if hop.numel() != nnz or load.numel() != nnz:
            raise ValueError(f"'grf_length' and 'grf_load' must have shape [{nnz}] (one per entry "
                             f"of 'grf_index'), got {tuple(hop.shape)} and {tuple(load.shape)}")
        if index.is_floating_point() or hop.is_floating_point():
            raise TypeError(f"'grf_index' and 'grf_length' must be integer tensors, got "
                            f"{index.dtype} and {hop.dtype}")
        if not load.is_floating_point():
            raise TypeError(f"'grf_load' must be a floating-point tensor, got {load.dtype}")
        num_nodes = int(num_nodes)
        if batch is not None:
            _check_tensor('batch', batch, 1)
            if batch.numel() != num_nodes:
                raise ValueError(f"'batch' must have one entry per node ({num_nodes}), got "
                                 f"{batch.numel()}")
            if batch.is_floating_point():
                raise TypeError(f"'batch' must be an integer tensor, got {batch.dtype}")
        if key is not None:
            if not isinstance(key, GRFLoads):
                raise TypeError(f"'key' must be a GRFLoads, got {type(key).__name__}")
            if key.num_nodes != num_nodes:
                raise ValueError(f"'key' covers {key.num_nodes} nodes but the query side covers "
                                 f"{num_nodes}")
        if draw is not None:
            _check_tensor('grf_draw', draw, 1)
            if draw.numel() != nnz or draw.is_floating_point():
                raise ValueError(f"'grf_draw' must be an integer tensor of shape [{nnz}] (one "
                                 f"draw id per entry), got {draw.dtype} {tuple(draw.shape)}")
        stats = _check_entries(index, hop, load, num_nodes, draw, batch)
        self.max_hop, self.num_draws, self.num_graphs = stats
        if max_length is not None and self.max_hop > max_length:
            raise ValueError(f"the loads have hop counts up to {self.max_hop} but "
                             f"'max_length' is {max_length}")
        if key is not None and key.num_draws != self.num_draws:
            raise ValueError(f"the key-side loads hold {key.num_draws} walk draws but the query "
                             f"side holds {self.num_draws}: use the same num_draws for both")
        # owned copies (normal tensors even under inference mode: the plan serves training)
        with torch.inference_mode(False):
            self.index = narrow_index(index, num_nodes, copy=True)
            self.hop = hop.to(torch.uint8 if self.max_hop < 256 else torch.int64).clone()
            self.load = load.clone()
            self.draw = None if draw is None or self.num_draws == 1 else draw.to(
                torch.int16 if self.num_draws < 2 ** 15 else torch.int64).clone()
            self.batch = None if batch is None else batch.clone()
        self.num_nodes = num_nodes
        self.max_length = max_length
        self.key = key

    @classmethod
    def from_data(cls, data: Any, prefix: str = 'grf',
                  key_prefix: Optional[str] = None) -> 'GRFLoads':
        r"""The loads stored on a ``Data`` object or a PyG ``Batch`` under
        ``{prefix}_index``, ``{prefix}_length``, ``{prefix}_load`` (and ``{prefix}_draw``),
        with the data's ``batch`` vector.

        Args:
            data (Data or Batch): the graph or mini-batch.
            prefix (str): attribute prefix used by the transform (default: ``'grf'``).
            key_prefix (str, optional): prefix of independent key-side loads (e.g.
                ``'grf_key'``, from a second transform with ``attr_prefix='grf_key'``).
        """
        missing = [f'{prefix}_{s}' for s in ('index', 'length', 'load')
                   if getattr(data, f'{prefix}_{s}', None) is None]
        if missing:
            raise ValueError(f"the data has no GRF loads {missing}: add the transform "
                             f"AddGraphRandomFeatures(attr_prefix={prefix!r}) (best as the "
                             f"dataset's pre_transform)")
        draw = getattr(data, f'{prefix}_draw', None)
        counts = getattr(data, f'{prefix}_num_draws', None)  # per graph, from the transform
        if isinstance(counts, Tensor) and counts.numel() > 0:
            lo, hi = (int(c) for c in torch.aminmax(counts.long()))
            if lo != hi:
                raise ValueError(f"the graphs of this batch were given walks with different "
                                 f"num_draws ({lo} and {hi}): use one AddGraphRandomFeatures("
                                 f"num_draws=...) for every graph of the dataset")
            if hi > 1 and draw is None:
                raise ValueError(f"the loads hold {hi} walk draws but '{prefix}_draw' is "
                                 f"missing (it was dropped, e.g. by batching with graphs that "
                                 f"have one draw)")
        key = None if key_prefix is None else cls.from_data(data, key_prefix)
        return cls(data[f'{prefix}_index'], data[f'{prefix}_length'], data[f'{prefix}_load'],
                   data.num_nodes, batch=getattr(data, 'batch', None), key=key, draw=draw)

    @property
    def nnz(self) -> int:
        return self.index.size(1)

    @property
    def device(self) -> torch.device:
        return self.index.device

    def to(self, device: Any) -> 'GRFLoads':
        r"""The same loads on ``device`` (``self`` if already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        out = object.__new__(GRFLoads)
        out.__dict__.update(self.__dict__)
        for name in ('index', 'hop', 'load', 'draw', 'batch'):
            t = getattr(self, name)
            setattr(out, name, None if t is None else t.to(device))
        out.key = None if self.key is None else self.key.to(device)
        return out

    def nbytes(self) -> int:
        r"""Bytes held by the entries (and the key side's)."""
        own = sum(t.numel() * t.element_size() for t in
                  (self.index, self.hop, self.load, self.draw, self.batch) if t is not None)
        return own + (0 if self.key is None else self.key.nbytes())

    def __repr__(self) -> str:
        key = '' if self.key is None else ', key=True'
        draws = '' if self.num_draws == 1 else f', num_draws={self.num_draws}'
        return (f'GRFLoads(num_nodes={self.num_nodes}, nnz={self.nnz}, max_hop={self.max_hop}'
                f'{draws}{key})')

    def fold(self, draws: Sequence[int]) -> 'GRFLoads':
        r"""The loads of the walk draws ``draws`` (one per head) as one graph of :math:`G N`
        nodes, :math:`G` = ``len(draws)``: copy :math:`g` holds the entries of draw
        ``draws[g]`` on nodes :math:`g N + i` (its group is :math:`\lfloor u / N \rfloor`), and
        graph :math:`b` of copy :math:`g` is graph :math:`g B + b` of the folded batch vector.
        A layer runs its :math:`G` heads as one head on the folded nodes (one coefficient row
        per copy): one pass of every backend instead of a loop over heads."""
        draws = tuple(int(d) for d in draws)
        if not draws or any(not 0 <= d < self.num_draws for d in draws):
            raise ValueError(f"'draws' must be a non-empty sequence of draw ids in [0, "
                             f"{self.num_draws}), got {draws}")
        G, N, dev = len(draws), self.num_nodes, self.device
        if self.draw is None:  # one draw: every copy holds all entries
            e = torch.arange(self.nnz, device=dev).repeat(G)
            g = torch.arange(G, device=dev).repeat_interleave(self.nnz)
        else:
            sel = self.draw.long().unsqueeze(1) == torch.tensor(draws, device=dev)
            e, g = sel.nonzero(as_tuple=True)
            order = torch.argsort(g, stable=True)  # group-major: each copy stays sorted
            e, g = e[order], g[order]
        index = self.index.long()[:, e] + g * N
        copies = torch.arange(G, device=dev).repeat_interleave(N)
        fbatch = copies if self.batch is None else (
            copies * self.num_graphs + self.batch.long().repeat(G))
        key = None if self.key is None else self.key.fold(draws)
        return GRFLoads(index, self.hop[e], self.load[e], G * N, batch=fbatch,
                        max_length=self.max_length, key=key)

    def pairs(self) -> Tuple[Tensor, Tensor]:
        r"""The distinct (start, visited) pairs of the entries, row-major (``[2, P]``), and
        the pair of every entry (``[nnz]``): the support of :math:`\widehat\Phi`. Computed on
        every call (:math:`O(\mathrm{nnz})`; no sort for the transform's sorted entries)."""
        N = self.num_nodes
        key = self.index[0].long() * N + self.index[1].long()
        if not is_sorted(key):
            uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
        else:  # the transform's order: consecutive duplicates only, no sort needed
            new = torch.ones_like(key, dtype=torch.bool)
            if key.numel() > 1:
                new[1:] = key[1:] != key[:-1]
            inv = torch.cumsum(new, 0) - 1
            uniq = key[new]
        return torch.stack([uniq // N, uniq % N]), inv

    def num_pairs(self) -> int:
        r"""The number of distinct (start, visited) pairs (:meth:`pairs`), counted without
        building them."""
        key = self.index[0].long() * self.num_nodes + self.index[1].long()
        if not is_sorted(key):
            return torch.unique(key).numel()
        return int((key[1:] != key[:-1]).sum()) + int(key.numel() > 0)

    def pair_values(self, f: Tensor, inv: Tensor, num_pairs: int,
                    group: Optional[Tensor] = None) -> Tensor:
        r"""``[h, P]`` values of :math:`\widehat\Phi` on the pairs (:meth:`pairs`) for
        coefficients ``f`` (:meth:`entry_values`), differentiable in ``f``."""
        v = self.entry_values(f, group)
        return v.new_zeros(v.shape[:-1] + (num_pairs,)).index_add(-1, inv, v)

    def entry_values(self, f: Tensor, group: Optional[Tensor] = None) -> Tensor:
        r""":math:`f_{l_e}\,\mathrm{load}_e` per entry: ``[nnz]`` for ``f`` ``[L + 1]``,
        ``[H, nnz]`` for ``f`` ``[H, L + 1]``; with ``group`` (``[nnz]``, the row of ``f`` of
        every entry, on folded loads) ``[1, nnz]``, entry :math:`e` taking row ``group[e]``."""
        if f.dim() not in (1, 2):
            raise ValueError(f"'f' must have shape [L + 1] or [H, L + 1], got {tuple(f.shape)}")
        self.check_coefficients(f.size(-1) - 1)
        hop = self.hop.long()
        if group is None:
            return hop_values(f, hop, self.load)
        flat = group * f.size(1) + hop
        return hop_values(f.reshape(-1), flat, self.load).unsqueeze(0)

    def check_coefficients(self, max_length: int, who: str = 'f'):
        r"""Raises if the loads have hop counts beyond ``max_length`` (their entries would get
        no coefficient and silently vanish from the mask)."""
        top = self.max_hop if self.key is None else max(self.max_hop, self.key.max_hop)
        if top > max_length:
            raise ValueError(f"the GRF loads have hop counts up to {top} but {who} has "
                             f"coefficients only up to hop {max_length}: use max_length >= "
                             f"{top} (the transform's max_length)")


def _check_entries(index: Tensor, hop: Tensor, load: Tensor, num_nodes: int,
                   draw: Optional[Tensor], batch: Optional[Tensor]) -> Tuple[int, int, int]:
    # node ids in [0, N), hop counts >= 0, finite loads, draw ids >= 0, a sorted batch vector;
    # returns (largest hop count, number of draws, number of graphs). One host read per batch
    # (PyG's pattern), not one per layer.
    zero = index.new_zeros(())
    nnz = index.size(1)
    parts = [index.amin() if nnz else zero, index.amax() if nnz else zero - 1,
             hop.amin().to(index.dtype) if nnz else zero, hop.amax().to(index.dtype) if nnz
             else zero, (~torch.isfinite(load)).any().to(index.dtype),
             draw.amin().to(index.dtype) if draw is not None and nnz else zero,
             draw.amax().to(index.dtype) if draw is not None and nnz else zero]
    if batch is not None and batch.numel():
        b = batch.long()
        parts += [(b[1:] < b[:-1]).any().to(index.dtype), b.amin().to(index.dtype),
                  b.amax().to(index.dtype)]
    else:
        parts += [zero, zero, zero]
    lo, hi, hlo, hhi, bad, dlo, dhi, unsorted, blo, bhi = (
        int(v) for v in torch.stack([p.long() for p in parts]).tolist())
    if nnz and (lo < 0 or hi >= num_nodes):
        raise ValueError(f"'grf_index' must hold node ids in [0, {num_nodes}), got ids in "
                         f"[{lo}, {hi}]")
    if hlo < 0:
        raise ValueError(f"'grf_length' (hop counts) must be >= 0, got {hlo}")
    if bad:
        raise ValueError("'grf_load' holds non-finite values (the loads overflowed: use "
                         "normalization='sym' or 'rw', or shorter walks)")
    if dlo < 0:
        raise ValueError(f"'grf_draw' (draw ids) must be >= 0, got {dlo}")
    if unsorted or blo < 0:
        raise ValueError("'batch' must hold non-negative graph ids in sorted order (as PyG "
                         "batches do)")
    return hhi, dhi + 1, (bhi + 1 if batch is not None and batch.numel() else 1)
