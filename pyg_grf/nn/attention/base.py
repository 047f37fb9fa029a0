r"""Shared scaffolding of the multi-head attention layers: projections and head reshapes."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from pyg_grf.nn.feature_maps import FeatureMap, feature_map_resolver, qk_features


def reset_hop_coefficients(f: Tensor, f_init: float) -> None:
    r"""Sets the per-head hop coefficients ``f`` (``[H, L + 1]``) to :math:`f_l =
    \mathrm{f\_init}^l` in place: :math:`f_0 = 1`, longer walks start with less weight."""
    with torch.no_grad():
        f.copy_(f_init ** torch.arange(f.size(-1), dtype=torch.float).expand_as(f))


def key_dropout(v: Tensor, p: float, training: bool) -> Tensor:
    r"""Coefficient dropout of the linear attention paths: zeroes the values of whole keys
    (``v`` is ``[N, H, C]``; one draw per key and head, shared by every query) and scales the
    kept ones by :math:`1 / (1 - p)`. Passing the result as the values, with the normaliser
    computed from the keys as usual, gives
    :math:`\mathbf{o}_i = \sum_j a_{ij} \frac{z_{jh}}{1 - p} \mathbf{v}_j` with the undropped
    coefficients :math:`a_{ij}`: every :math:`a_{ij}` is zeroed with probability :math:`p`, and
    :math:`\mathbb{E}[\mathbf{o}_i]` is the output without dropout."""
    if not training or p == 0.0:
        return v
    keep = torch.empty(v.size(0), v.size(1), 1, dtype=v.dtype, device=v.device)
    keep.bernoulli_(1.0 - p)
    return v * (keep / (1.0 - p))


def resolve_head_channels(channels: int, heads: int, head_channels: Optional[int],
                          dropout: float = 0.0) -> int:
    r"""Checks the sizes and the dropout of the contract (:class:`QKVAttention`) and returns
    the size per head: :obj:`head_channels` if given, else ``channels // heads``, which must
    then divide evenly."""
    if channels < 1 or heads < 1:
        raise ValueError(f"'channels' and 'heads' must be positive, got {channels} and {heads}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"'dropout' must lie in [0, 1), got {dropout}")
    if head_channels is None:
        if channels % heads != 0:
            raise ValueError(f"'channels' ({channels}) must be divisible by 'heads' ({heads}) "
                             f"unless 'head_channels' is given")
        head_channels = channels // heads
    if head_channels < 1:
        raise ValueError(f"'head_channels' must be positive, got {head_channels}")
    return head_channels


def contract_repr(layer: nn.Module, extra: str = '') -> str:
    r"""``Name(channels, heads=H[, head_channels=C][extra][, dropout=p])``: the one ``repr``
    format of the attention layers (``head_channels`` only when it differs from
    ``channels // heads``, ``dropout`` only when positive)."""
    hc = ''
    if layer.head_channels * layer.heads != layer.channels:
        hc = f', head_channels={layer.head_channels}'
    drop = f', dropout={layer.dropout}' if layer.dropout > 0 else ''
    return f'{layer.__class__.__name__}({layer.channels}, heads={layer.heads}{hc}{extra}{drop})'


class GraphAttention(nn.Module):
    r"""The call contract of every attention layer of the package:
    ``forward(x, batch=None, *, <payload>)``, ``x`` ``[N, channels]`` (the nodes of a PyG batch;
    attention never crosses graphs) or, where supported, ``[B, n, channels]`` (``B`` samples on
    one shared graph). What a layer needs besides the nodes is one typed *payload* passed by
    keyword and built from the batch by :meth:`payload` (e.g. ``grf=`` the batch's
    :class:`~pyg_grf.nn.attention.grf.GRFPlan`)::

        payload = attn.payload(data)          # once per batch, shared by all layers
        out = attn(x, data.batch, **payload)

    :meth:`plan_payload` builds one payload for several layers of a class;
    :func:`model_payload` does so for every attention of a model, as
    :class:`pyg_grf.loader.DataLoader` does in its workers (:func:`prepared_payload`).
    """

    #: ``Data`` attributes the payload reads.
    requires: Tuple[str, ...] = ()
    #: How to provide :attr:`requires` (shown when they are missing).
    hint: str = ''
    #: Keyword names of the payload (what :meth:`payload` returns).
    payload_keys: Tuple[str, ...] = ()

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""The keyword arguments of :meth:`forward` besides ``x`` and ``batch``, read from a
        ``Data`` or ``Batch`` (empty for attentions that need only the nodes)."""
        return {}

    def __getstate__(self):
        # a copy or a pickle of the layer leaves its last plan behind (cached_plan)
        state = self.__dict__.copy()
        state.pop('_plan_cache', None)
        return state

    @classmethod
    def plan_payload(cls, data: Any, layers: Sequence['GraphAttention']) -> Dict[str, Any]:
        r"""One payload for several layers of this class on ``data`` (default: the first
        layer's :meth:`payload`)."""
        return layers[0].payload(data) if layers else {}


def samples_as_graphs(x: Tensor, batch: Optional[Tensor]
                      ) -> Tuple[Tensor, Optional[Tensor], Optional[int]]:
    r"""``x`` ``[B, n, C]`` (``B`` samples on one shared graph of ``n`` nodes) as ``B`` graphs
    of a batch: ``([B n, C], batch, B)``; ``[N, C]`` unchanged: ``(x, batch, None)``."""
    if x.dim() != 3:
        return x, batch, None
    if batch is not None:
        raise ValueError("'batch' is not used with x of shape [B, n, channels] (every sample is "
                         "one copy of the shared graph)")
    B, n = x.size(0), x.size(1)
    graphs = torch.arange(B, device=x.device).repeat_interleave(n)
    return x.reshape(B * n, x.size(-1)), graphs, B


def plan_input(layer: nn.Module, x: Tensor, batch: Optional[Tensor], plan: str, num_nodes: int,
               num_graphs: int) -> Tuple[Tensor, Optional[Tensor], Optional[int]]:
    r""":func:`samples_as_graphs` of ``x`` checked against the ``plan`` (its name, e.g.
    ``'GRF'``) of a layer: ``[N, channels]`` for a plan of ``N`` nodes, or ``[B, n, channels]``
    (``B`` samples) for the plan of one graph of ``n`` nodes; a :class:`ValueError` says what
    the plan covers and what came."""
    shape, C = tuple(x.shape), layer.channels
    x, batch, samples = samples_as_graphs(x, batch)
    if samples is not None and num_graphs > 1:
        raise ValueError(f"x of shape {shape} holds samples on one shared graph, but the {plan} "
                         f"plan covers a batch of {num_graphs} graphs")
    if samples is not None and shape[1] != num_nodes:
        raise ValueError(f"x of shape {shape} holds {samples} samples of {shape[1]} nodes, but "
                         f"the {plan} plan covers {num_nodes} nodes (pass the plan of the one "
                         f"shared graph)")
    if x.dim() != 2 or x.size(-1) != C:
        raise ValueError(f"{layer.__class__.__name__} expects x of shape [N, {C}] (nodes) or "
                         f"[B, n, {C}] (samples on one shared graph), got {shape}")
    if x.size(0) != num_nodes * (samples or 1):
        raise ValueError(f"the {plan} plan covers {num_nodes} nodes but 'x' has {x.size(0)} "
                         f"rows (build the plan from the same batch)")
    return x, batch, samples


def tensor_version(t: Any) -> int:
    r"""The version counter of a tensor (-1 for an inference tensor, which has none, or for
    anything else)."""
    return t._version if isinstance(t, Tensor) and not t.is_inference() else -1


def pin(data: Any, names: Sequence[str]) -> Tuple[Tuple[str, Any, int], ...]:
    r"""The fields ``names`` of ``data`` with the version counter of each tensor, then the node
    count: what a plan was built from (:func:`unchanged`)."""
    return tuple((n, t, tensor_version(t)) for n, t in ((n, getattr(data, n, None))
                                                         for n in names)) + (
        ('num_nodes', data.num_nodes, 0),)


def unchanged(now: Tuple, pinned: Optional[Tuple]) -> bool:
    r"""Whether the fields ``now`` (:func:`pin`) are those ``pinned``: the same tensors,
    unmodified, and the same node count (:math:`O(1)`, no device work)."""
    return pinned is not None and all(
        (a is b if isinstance(a, Tensor) else a == b) and va == vb
        for (_, a, va), (_, b, vb) in zip(now, pinned))


def plan_field(key: str) -> str:
    r"""The ``Data`` field that carries the plan of payload ``key`` (``'grf'`` ->
    ``'grf_plan'``): an ordinary field, so that ``Data.to()`` moves it with the tensors."""
    return f'{key}_plan'


def prepared_payload(data: Any, keys: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    r"""The plans that ``data`` carries (:func:`pyg_grf.loader.prepare_payload`,
    :class:`pyg_grf.loader.DataLoader`) under the payload ``keys`` (default: every plan field),
    those that still match ``data`` only (``plan.matches(data)``: a copy of the data whose
    walks were redrawn or edited, or a subgraph, carries a plan it may not use)."""
    if keys is None:
        keys = [name[:-5] for name in getattr(data, 'keys', lambda: ())()
                if name.endswith('_plan')]
    out = {}
    for key in keys:
        plan = getattr(data, plan_field(key), None)
        if hasattr(plan, 'matches') and plan.matches(data):
            out[key] = plan
    return out


def model_payload(model: Union[nn.Module, Sequence[nn.Module]], data: Any) -> Dict[str, Any]:
    r"""The payload of every attention layer of ``model`` on ``data``, merged: the layers of
    each class share one payload (:meth:`GraphAttention.plan_payload`, e.g. one
    :class:`~pyg_grf.nn.attention.grf.GRFPlan` for all GRF layers), or the plans ``data``
    carries (:func:`prepared_payload`)."""
    modules = (model.modules() if isinstance(model, nn.Module)
               else (m for layer in model for m in layer.modules()))
    groups: Dict[type, List[GraphAttention]] = {}
    for m in modules:
        if isinstance(m, GraphAttention):
            groups.setdefault(type(m), []).append(m)
    out: Dict[str, Any] = {}
    for cls, layers in groups.items():
        out.update(cls.plan_payload(data, layers))
    return out


def attention_layers(model: Union[nn.Module, Sequence[nn.Module]]) -> List[GraphAttention]:
    r"""The attention layers (:class:`~pyg_grf.nn.attention.base.GraphAttention`) of ``model``
    (a module or a sequence of layers), in module order."""
    if isinstance(model, nn.Module):
        return [m for m in model.modules() if isinstance(m, GraphAttention)]
    layers = list(model)
    bad = [type(m).__name__ for m in layers if not isinstance(m, GraphAttention)]
    if bad:
        raise TypeError(f"expected an nn.Module or a sequence of attention layers, got a "
                        f"sequence holding {bad}")
    return layers


def prepare_payload(model: Union[nn.Module, Sequence[nn.Module]], data: Any) -> Any:
    r"""Builds the plan of every attention layer of ``model`` on ``data`` (a ``Data`` or
    ``Batch``; :func:`~pyg_grf.nn.attention.base.model_payload`) and leaves it on ``data``
    (returned) as an ordinary field, ``data.grf_plan`` (``data.rwgnk_plan`` for GKAT), where
    the layers' ``payload(data)`` find it and which ``data.to(device)`` moves with the
    tensors. A plan is used only while it matches the data: a copy whose walks were redrawn
    gets a new one. A model whose attentions need no payload leaves ``data`` unchanged."""
    for key, plan in model_payload(attention_layers(model), data).items():
        if hasattr(plan, 'matches'):
            data[plan_field(key)] = plan
    return data


def cached_plan(layers: Sequence[nn.Module], key: str, data: Any, build) -> Any:
    r"""The plan of ``data`` for ``layers`` under payload ``key``: the one ``data`` carries
    (:func:`prepared_payload`), else the one the first layer built last if it still matches
    ``data`` (as ``GCNConv(cached=True)``: a loop over one fixed graph builds it once), else
    ``build(data, layers)``, kept by the first layer for the next call."""
    carried = prepared_payload(data, (key,))
    if key in carried:
        return carried[key]
    owner = layers[0]
    plan = owner.__dict__.get('_plan_cache')
    device = _tensor_device(data)
    if plan is not None and plan.matches(data) and getattr(plan, 'covers', None) is not None \
            and plan.covers(layers):
        if device is not None and plan.device != device:
            plan = plan.to(device)
    else:
        plan = build(data, layers)
    owner.__dict__['_plan_cache'] = plan
    return plan


def _tensor_device(data: Any) -> Optional[torch.device]:
    # the device of the first tensor of a Data / Batch (HeteroData: of its first store)
    for store in getattr(data, 'stores', ()):
        for value in store.values():
            if isinstance(value, Tensor):
                return value.device
    return None


def split_heads(qkv: Tensor, H: int, C: int) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(q, k, v)`` of the stacked projection ``qkv`` ``[N, 3 H C]`` (rows ``[q; k; v]`` of
    the weight), each head-major ``[H, N, C]`` and contiguous (a head's rows are a view): one
    copy; unbound, not sliced: its backward is one stack, where each slice's is a zero-filled
    gradient of the whole product."""
    N = qkv.size(0)
    return qkv.view(N, 3 * H, C).transpose(0, 1).contiguous().view(3, H, N, C).unbind(0)


class QKVAttention(GraphAttention):
    r"""Base of the attention layers, and the contract every attention layer follows:
    constructor ``(channels, heads=1, head_channels=channels // heads, dropout=0.0, bias=True,
    ...)``; ``to_qkv`` projects ``[N, channels]`` to the queries, keys and values, ``heads``
    heads of ``head_channels`` each (one weight, rows ``[q; k; v]``, as the ``in_proj`` of
    :class:`torch.nn.MultiheadAttention`), and ``to_out`` projects the concatenated heads
    back; ``dropout`` acts on
    the attention coefficients only (:func:`key_dropout`); ``repr`` is :func:`contract_repr`.
    """

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None,
                 feature_map: Any = None, feature_map_kwargs: Optional[Dict[str, Any]] = None,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        head_channels = resolve_head_channels(channels, heads, head_channels, dropout)
        self.channels, self.heads, self.head_channels = channels, heads, head_channels
        self.dropout = dropout
        inner = heads * head_channels
        self.to_qkv = nn.Linear(channels, 3 * inner, bias=bias)
        self.to_out = nn.Linear(inner, channels, bias=bias)
        self.feature_map_name = feature_map
        self.feature_map: Optional[FeatureMap] = None
        if feature_map is not None:
            self.feature_map = feature_map_resolver(feature_map, head_channels,
                                                    **(feature_map_kwargs or {}))

    def reset_parameters(self):
        for lin in (self.to_qkv, self.to_out):
            lin.reset_parameters()
        if self.feature_map is not None:
            self.feature_map.redraw()

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        if x.dim() != 2 or x.size(-1) != self.channels:
            raise ValueError(f"{self.__class__.__name__} expects node features of shape "
                             f"[N, {self.channels}], got {tuple(x.shape)}")
        N, H, C = x.size(0), self.heads, self.head_channels
        return self.to_qkv(x).view(N, 3, H, C).unbind(1)

    def project_heads(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        r"""``(q, k, v)``, each head-major ``[H, N, C]`` (:func:`split_heads`)."""
        return split_heads(self.to_qkv(x), self.heads, self.head_channels)

    def forward(self, x: Tensor, batch: Optional[Tensor] = None) -> Tensor:
        r"""``x``: ``[N, channels]`` (graphs given by ``batch``) or ``[B, n, channels]``
        (``B`` samples, attention inside each): :meth:`attend` on the graphs of the batch."""
        x, batch, samples = samples_as_graphs(x, batch)
        if x.size(0) == 0:  # an empty batch
            self.project(x)  # shape checks
            out = self.empty_output(x)
        else:
            out = self.attend(x, batch)
        return out if samples is None else out.view(samples, -1, self.channels)

    def attend(self, x: Tensor, batch: Optional[Tensor]) -> Tensor:  # pragma: no cover
        r"""The attention inside each graph of ``batch`` on ``x`` ``[N, channels]``
        (``N > 0``), for the default :meth:`forward`."""
        raise NotImplementedError

    def features(self, q: Tensor, k: Tensor,
                 batch: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        # keys are stabilised per graph of the batch (never across graphs)
        return qk_features(self.feature_map, q, k, batch)

    def drop_keys(self, v: Tensor) -> Tensor:
        r"""The values with the layer's coefficient dropout of the linear paths
        (:func:`key_dropout`); identity in evaluation mode."""
        return key_dropout(v, self.dropout, self.training)

    def empty_output(self, x: Tensor) -> Tensor:
        r"""The output for an input without rows (an empty batch): ``[0, channels]``, still
        connected to the layer's parameters."""
        return self.to_out(x.new_zeros(0, self.heads * self.head_channels)) + 0 * x.sum()

    def finish(self, out: Tensor) -> Tensor:
        r"""Concatenates the heads and applies ``to_out`` (no dropout here: see the class)."""
        return self.to_out(out.reshape(out.size(0), self.heads * self.head_channels))

    def _extra_repr(self) -> str:
        return ''

    def __repr__(self) -> str:
        fm = '' if self.feature_map is None else f', feature_map={self.feature_map!r}'
        fm = fm.replace("feature_map=relu", "feature_map='relu'").replace(
            "feature_map=elu", "feature_map='elu'")
        return contract_repr(self, f'{fm}{self._extra_repr()}')
