r"""The GRF layer: reads its plan part and calls the engine (GRF paper, Sec. 3, Algorithm 1;
App. D)."""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from pyg_grf._validation import check_int
from pyg_grf.features.loads import GRFLoads
from pyg_grf.masks.packing import packing_layout
from pyg_grf.nn import functional as F
from pyg_grf.nn.attention.base import (
    QKVAttention,
    cached_plan,
    plan_input,
    reset_hop_coefficients,
)
from pyg_grf.nn.attention.grf import pairs, sparse
from pyg_grf.nn.attention.grf.plan import GRFPlan, LayerSpec, PlanPart

MODES = ('symmetric', 'asymmetric', 'sparse_softmax')
F_MODES = ('abs', 'signed', 'free')
BACKENDS = ('auto', 'pairs', 'sparse')


class GRFAttention(QKVAttention):
    r"""Multi-head linear attention with a learnable topological mask estimated by graph random
    features, from the `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Reid et al., 2024), in :math:`O(N)`:

    .. math::
        \mathbf{x}'_i = \mathbf{W}_o\,\Big\Vert_{h=1}^{H}
        \frac{\sum_j M^{(h)}_{ij}\,\phi(\mathbf{q}^{(h)}_i)^\top\phi(\mathbf{k}^{(h)}_j)\,
              \mathbf{v}^{(h)}_j}
             {\sum_j M^{(h)}_{ij}\,\phi(\mathbf{q}^{(h)}_i)^\top\phi(\mathbf{k}^{(h)}_j)},
        \qquad M^{(h)} = \widehat\Phi^{(h)}\widehat\Phi^{(h)\top},\quad
        \widehat\phi^{(h)}(v_i)_q = \sum_{l=0}^{L} f^{(h)}_l\,\mathrm{load}(i, q, l),

    with the loads of frozen random walks (:class:`~pyg_grf.transforms.AddGraphRandomFeatures`)
    and a learnable :math:`f^{(h)}` per head, so that
    :math:`\mathbb{E}[M^{(h)}] \approx \sum_k (f^{(h)} * f^{(h)})_k W^k` (Eq. 4, 10).

    Modes:

    * ``'symmetric'``: :math:`M = \widehat\Phi\widehat\Phi^\top` (Eq. 7);
    * ``'asymmetric'``: one-hot key features, :math:`M = \widehat\Phi` with
      :math:`\mathbb{E}[M] = \sum_l f_l W^l` (App. D, Eq. 24-26): one sparse product;
    * ``'sparse_softmax'``: softmax attention restricted to the nonzeros of the asymmetric
      feature, :math:`a_{ij} \propto \widehat\Phi_{ij}\exp(\mathbf{q}_i^\top\mathbf{k}_j/\sqrt{C})`
      (App. D with :math:`A = \exp(\mathbf{q}^\top\mathbf{k})`, Eq. 25; App. C.4);
      :math:`O(\mathrm{nnz})`.

    Walks never leave a connected component, so attention never crosses the graphs of a PyG
    mini-batch: no padding is needed.

    Args:
        channels (int): input and output size.
        heads (int, optional): number of heads :math:`H` (default: :obj:`1`).
        max_length (int, optional): :math:`L`, the largest hop count with a coefficient; must
            cover the transform's ``max_length`` (default: :obj:`4`).
        head_channels (int, optional): size per head (default: ``channels // heads``).
        feature_map (str or FeatureMap, optional): :math:`\phi`: ``'relu'``, ``'elu'`` or
            ``'favor+'`` (default: ``'relu'``).
        feature_map_kwargs (dict, optional): arguments of the feature map.
        mode (str, optional): ``'symmetric'``, ``'asymmetric'`` or ``'sparse_softmax'``
            (default: ``'symmetric'``).
        f_init (float, optional): initial :math:`f_l = \mathrm{f\_init}^l` (default:
            :obj:`0.5`).
        learn_f (bool, optional): whether :math:`f` is learnable (default: :obj:`True`).
        f_mode (str, optional): how the learned :math:`f` enters the mask
            (``docs/grf_mask_value.md``):

            * ``'abs'`` (default): the mask uses :math:`|f|` (:meth:`coefficients`), so
              :math:`M \ge 0` entrywise for non-negative edge weights and, with a non-negative
              feature map, every output is a convex combination of the values (or 0 where all
              of a row's terms vanish; ``eps`` keeps that finite), though the normaliser is not
              bounded away from 0;
            * ``'signed'``: the numerator uses the signed mask of :math:`f` (any real power
              series, as in the paper, Eq. 4), the normaliser the mask of :math:`|f|`, which
              bounds it entrywise, so :math:`\lVert\mathbf{o}_i\rVert_\infty \le \max_j
              \lVert\mathbf{v}_j\rVert_\infty`; two mask products (linear modes only);
            * ``'free'``: the paper's unconstrained :math:`f` in both; the normaliser can pass
              through 0 and the output diverge.
        layer_index (int, optional): with loads of several independent walk draws
            (``AddGraphRandomFeatures(num_draws=D)``), head :math:`h` uses draw
            :math:`\mathrm{layer\_index} \cdot H + h` (GRF paper, Sec. 4: walks frozen per
            head and layer; fewer draws are an error, :meth:`draws`); :math:`D = 1` shares one
            set of walks between all heads. :class:`~pyg_grf.nn.GraphTransformer` sets it per
            layer (default: :obj:`0`).
        dropout (float, optional): dropout on the attention coefficients: each pair's in
            ``'sparse_softmax'`` mode, whole key columns per head in the linear modes
            (numerator only, unbiased: :func:`~pyg_grf.nn.attention.base.key_dropout`)
            (default: :obj:`0.`).
        bias (bool, optional): biases in the projections (default: :obj:`True`).
        eps (float, optional): added to the normaliser (default: :obj:`1e-6`).
        backend (str, optional): how the masked attention is computed, same result:
            ``'pairs'`` (the engine: the mask on its support, every head in one custom
            operator, :mod:`~pyg_grf.nn.attention.grf.pairs`), ``'sparse'`` (low rank: two CSR
            products, never forms the mask) or ``'auto'`` (``'pairs'`` when its structures and
            one layer fit the memory budget, else ``'sparse'``:
            :func:`~pyg_grf.nn.attention.grf.plan.build_part`), resolved when the plan is built
            (default: ``'auto'``). See ``docs/speed.md``.
        global_beta (float, optional): if set, the mask gains a global term,
            :math:`M = \beta_h \mathbf{1}\mathbf{1}^\top + \widehat\Phi\widehat\Phi^\top`
            inside each graph, with a learnable :math:`\beta_h = \mathrm{softplus}(\cdot) \ge 0`
            per head initialised to ``global_beta``: every node also attends to its whole graph
            (linear modes only) (default: :obj:`None`).
        attr_prefix (str, optional): the ``attr_prefix`` of the transform whose loads
            :meth:`payload` reads (default: ``'grf'``).

    Shapes:
        - **input:** node features :math:`(N, F)` or :math:`(B, n, F)`, batch vector
          :math:`(N)` (needed for the global term and FAVOR+ with several graphs), keyword
          ``grf``: the batch's :class:`~pyg_grf.nn.attention.grf.GRFPlan` (:meth:`payload`)
        - **output:** node features :math:`(N, F)` or :math:`(B, n, F)`
    """

    def __init__(self, channels: int, heads: int = 1, max_length: int = 4,
                 head_channels: Optional[int] = None, feature_map: Any = 'relu',
                 feature_map_kwargs: Optional[Dict[str, Any]] = None, mode: str = 'symmetric',
                 f_init: float = 0.5, learn_f: bool = True, dropout: float = 0.0,
                 bias: bool = True, eps: float = 1e-6, backend: str = 'auto',
                 global_beta: Optional[float] = None, f_mode: str = 'abs',
                 layer_index: int = 0, attr_prefix: str = 'grf'):
        if mode not in MODES:
            raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
        if global_beta is not None:
            if mode == 'sparse_softmax':
                raise ValueError("'global_beta' (a global term beta * 1 1^T in the mask) needs a "
                                 "linear mode ('symmetric' or 'asymmetric'), got "
                                 "mode='sparse_softmax'")
            if not global_beta > 0:
                raise ValueError(f"'global_beta' must be > 0 (its initial value), got "
                                 f"{global_beta!r}")
        if backend not in BACKENDS:
            raise ValueError(f"'backend' must be one of {BACKENDS}, got {backend!r}")
        max_length = check_int('max_length', max_length, 0)
        super().__init__(channels, heads, head_channels,
                         None if mode == 'sparse_softmax' else feature_map, feature_map_kwargs,
                         dropout, bias)
        if f_mode not in F_MODES:
            raise ValueError(f"'f_mode' must be one of {F_MODES}, got {f_mode!r}")
        if f_mode == 'free':
            bound = ("f_mode='abs' (the default) or 'signed' bound it" if mode != 'sparse_softmax'
                     else "f_mode='abs' (the default) keeps the weights >= 0")
            warnings.warn(f"GRFAttention(f_mode='free') leaves the mask coefficients "
                          f"unconstrained: negative ones can drive the normaliser towards 0 and "
                          f"the output to large values. {bound}.", UserWarning, stacklevel=2)
        if f_mode == 'signed' and mode == 'sparse_softmax':
            raise ValueError("f_mode='signed' needs a linear mode ('symmetric' or "
                             "'asymmetric'), got mode='sparse_softmax'")
        layer_index = check_int('layer_index', layer_index, 0)
        self.max_length = max_length
        self.f_mode = f_mode
        self.layer_index = layer_index
        self.mode = mode
        self.f_init = f_init
        self.eps = eps
        self.backend = backend
        self.attr_prefix = attr_prefix
        self.global_beta = global_beta
        self.f = nn.Parameter(torch.empty(heads, max_length + 1), requires_grad=learn_f)
        self.beta_raw = None if global_beta is None else nn.Parameter(torch.empty(heads))
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        reset_hop_coefficients(self.f, self.f_init)
        if self.beta_raw is not None:  # softplus(beta_raw) = global_beta
            with torch.no_grad():
                self.beta_raw.fill_(math.log(math.expm1(self.global_beta)))

    def coefficients(self) -> Tensor:
        r"""The hop coefficients of the mask (its numerator), ``[H, L + 1]``: :math:`|f|` with
        ``f_mode='abs'`` (the default), else :math:`f` itself."""
        return self.f.abs() if self.f_mode == 'abs' else self.f

    @property
    def requires(self) -> Tuple[str, ...]:
        return tuple(f'{self.attr_prefix}_{s}' for s in ('index', 'length', 'load'))

    hint = ("add the transform pyg_grf.transforms.AddGraphRandomFeatures (best as the dataset's "
            "pre_transform, so the walks are sampled once and cached); a second one with "
            "attr_prefix='grf_key' gives independent key-side walks (unbiased diagonal)")
    payload_keys = ('grf',)

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""``{'grf': plan}``: the :class:`GRFPlan` of ``data`` for this layer: the one
        ``data`` carries (``data.grf_plan``, left by :class:`pyg_grf.loader.DataLoader` or
        :func:`pyg_grf.loader.prepare_payload`) if it matches ``data``, else the one this layer
        built last if it matches (a loop over one fixed graph builds it once), else a new one.
        """
        return type(self).plan_payload(data, [self])

    @classmethod
    def plan_payload(cls, data: Any, layers) -> Dict[str, Any]:
        r"""``{'grf': plan}``: one plan for several GRF layers of a model (the structures they
        share are built once), found or built as in :meth:`payload`."""
        return {'grf': cached_plan(list(layers), 'grf', data, GRFPlan.build)}

    def spec(self, num_draws: int = 1) -> LayerSpec:
        r"""The :class:`~pyg_grf.nn.attention.grf.plan.LayerSpec` of this layer on loads with
        ``num_draws`` walk draws: what its plan part depends on."""
        d = self.head_channels
        m = d if self.feature_map is None else self.feature_map.output_dim(d)
        draws = None if num_draws == 1 else self.draws(num_draws)
        return LayerSpec(self.mode, self.backend, self.heads, m, d, draws, self.f.dtype,
                         self.max_length)

    def draws(self, num_draws: int) -> Tuple[int, ...]:
        r"""The walk draw of every head when the loads hold ``num_draws`` draws: head
        :math:`h` of this layer uses draw :math:`\mathrm{layer\_index} \cdot H + h`. Raises
        if the loads hold fewer draws than that (a silent reuse of the same walks by two heads
        or layers would correlate their masks)."""
        H = self.heads
        top = (self.layer_index + 1) * H
        if top > num_draws:
            raise ValueError(f"{self.__class__.__name__}(heads={H}, layer_index="
                             f"{self.layer_index}) needs walk draws up to {top - 1} (one per "
                             f"head and layer), but the loads hold {num_draws}: use "
                             f"AddGraphRandomFeatures(num_draws={top}) or more, or num_draws=1 "
                             f"(all heads share one set of walks)")
        return tuple(self.layer_index * H + h for h in range(H))

    def forward(self, x: Tensor, batch: Optional[Tensor] = None, *,
                grf: Optional['GRFPlan'] = None) -> Tensor:
        r"""
        Args:
            x (Tensor): ``[N, channels]`` node features, or ``[B, n, channels]``: ``B`` samples
                (e.g. the patches of ``B`` images) on one shared graph of ``n`` nodes, whose
                plan covers ``n`` nodes (no PyG ``Batch`` of copies needed).
            batch (Tensor, optional): ``[N]`` graph ids (sorted, as in PyG batches). The plan
                holds the batch vector it was built with, which the layer uses; this one is
                read only without a plan's (FAVOR+ key stabilisation, the global term).
            grf (GRFPlan): keyword only: the batch's plan (:meth:`payload`).
        """
        if grf is None:
            raise ValueError(f"{self.__class__.__name__} needs the plan of the batch: pass "
                             f"grf=attn.payload(data)['grf'] (or **attn.payload(data)), got "
                             f"NoneType")
        if isinstance(grf, GRFLoads):
            grf = GRFPlan(grf, {})
        if not isinstance(grf, GRFPlan):
            raise TypeError(f"'grf' must be a GRFPlan (attn.payload(data), or "
                            f"pyg_grf.nn.attention.grf.GRFPlan.build(data, layers)), got "
                            f"{type(grf).__name__}")
        # samples on one shared graph: its copies ride in the rows
        x, _, samples = plan_input(self, x, batch, 'GRF', grf.num_nodes, grf.loads.num_graphs)
        if batch is not None and batch.shape != (x.size(0),):
            raise ValueError(f"'batch' must have shape [{x.size(0)}] (one graph id per node), "
                             f"got {tuple(batch.shape)}")
        if grf.device != x.device:
            grf = grf.to(x.device)
        if x.size(0) == 0:
            return self.empty_output(x)
        B, H, C = samples or 1, self.heads, self.head_channels
        q, k, v = self.project_heads(x)  # [H, B n, C] each, head-major
        part = grf.part(self.spec(grf.loads.num_draws))
        f = self.coefficients()
        linear = self.mode != 'sparse_softmax'
        if linear:
            gbatch = batch if samples is None and grf.batch is None else grf.batch
            if samples is not None and self.feature_map.uses_batch:
                gbatch = torch.arange(B, device=x.device).repeat_interleave(grf.num_nodes)
            phi_q, phi_k = self.features(q.transpose(0, 1), k.transpose(0, 1), gbatch)
            phi_q, phi_k = phi_q.transpose(0, 1), phi_k.transpose(0, 1)
            # the values with a column of ones (the normaliser's sums), coefficient dropout on
            # whole key columns (numerator only)
            v1 = torch.nn.functional.pad(self.drop_keys(v.transpose(0, 1)).transpose(0, 1),
                                         (0, 1), value=1.0)
            sym = self.mode == 'symmetric'
            o = masked_sums(part, phi_q, phi_k, v1, f, B, sym)
            if self.f_mode == 'signed':  # the normaliser from the |f| mask, which bounds |M_f|
                den = masked_sums(part, phi_q, phi_k, v1, f.abs(), B, sym)
                o = torch.cat([o[..., :-1], den[..., -1:]], dim=-1)
            if self.beta is not None:  # M = beta * 1 1^T (per graph) + GRF mask
                o = o + self.beta.to(o.dtype).view(H, 1, 1) * self._global(
                    phi_q, phi_k, v, grf, samples, batch)
            # numerator / normaliser, in float32 at least (a half normaliser's gradient
            # overflows where a row's features vanish)
            out = F.normalize_sums(o, self.eps, v.dtype)
        else:
            out = _node_major(part, q, k, v, B, lambda st, q, k, v: sparse.softmax(
                st, q, k, v, f, self.dropout, self.training))
        out = self.to_out(out.transpose(0, 1).reshape(x.size(0), H * C))
        return out if samples is None else out.view(samples, -1, out.size(-1))

    def _global(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, plan: 'GRFPlan',
                samples: Optional[int], batch: Optional[Tensor]) -> Tensor:
        # unmasked linear attention sums inside each graph (or sample), [H, B n, C + 1]
        if samples is not None:
            layout = packing_layout(torch.arange(samples, device=v.device).repeat_interleave(
                plan.num_nodes), samples)
        elif plan.batch is None and batch is not None:
            layout = packing_layout(batch)
        else:
            layout = plan.layout
        return F.packed_linear_attention(phi_q.transpose(0, 1), phi_k.transpose(0, 1),
                                         v.transpose(0, 1), return_sums=True,
                                         layout=layout).transpose(0, 1)

    def no_weight_decay(self) -> set:
        r"""Names of the parameters an optimiser should not decay: the mask coefficients."""
        return {'f'} | ({'beta_raw'} if self.beta_raw is not None else set())

    @property
    def beta(self) -> Optional[Tensor]:
        r"""Weights :math:`\beta_h \ge 0` of the global term (:obj:`None` if disabled)."""
        return None if self.beta_raw is None else nn.functional.softplus(self.beta_raw)

    def _extra_repr(self) -> str:
        glob = '' if self.global_beta is None else f', global_beta={self.global_beta}'
        glob += '' if self.f_mode == 'abs' else f', f_mode={self.f_mode!r}'
        return (f', max_length={self.max_length}, mode={self.mode!r}, backend={self.backend!r}'
                f'{glob}')



def masked_sums(part: PlanPart, phi_q: Tensor, phi_k: Tensor, v1: Tensor, f: Tensor,
                samples: int = 1, symmetric: bool = True) -> Tensor:
    r"""The masked sums ``[H, B n, d + 1]`` of head-major operands ``[H, B n, C]`` (``v1``: the
    values with a column of ones) for a plan part and coefficients ``f`` ``[H, L + 1]``: the
    engine's (:func:`~pyg_grf.nn.attention.grf.pairs.linear_sums`) or the low-rank
    fallback's; ``B = samples`` copies of the plan's graph. Half-precision operands are summed
    in float32 and the sums stay float32: where a row's query features vanish, numerator and
    normaliser are 0 and the division's gradient is ``1 / eps``, beyond float16's range."""
    if phi_q.dtype in (torch.float16, torch.bfloat16):
        phi_q, phi_k, v1 = phi_q.float(), phi_k.float(), v1.float()
    if part.backend == 'pairs':
        return pairs.linear_sums(part.structures, phi_q, phi_k, v1, f, samples)
    with torch.autocast(phi_q.device.type, enabled=False):  # in the operands' dtype
        return _node_major(part, phi_q, phi_k, v1, samples, lambda st, q, k, v:
                           sparse.linear_sums(st, q, k, v[..., :-1], f, symmetric))


@torch.compiler.disable
def _node_major(part: PlanPart, q: Tensor, k: Tensor, v: Tensor, samples: int, call) -> Tensor:
    # the low-rank path and the softmax mode take node-major [rows, h, C]: with walks per head
    # the heads are folded into the rows ([B, H, n] copies of the graph, one head each). They
    # run eagerly under torch.compile (their patterns cache per-head repeats in Python)
    H, R = q.size(0), q.size(1)
    folded = part.groups > 1
    st = part.structures.repeat(samples)

    def arrange(t: Tensor) -> Tensor:
        if not folded:
            return t.transpose(0, 1)
        return t.view(H, samples, -1, t.size(-1)).transpose(0, 1).reshape(-1, 1, t.size(-1))
    o = call(st, arrange(q), arrange(k), arrange(v))
    if not folded:
        return o.transpose(0, 1)
    return o.view(samples, H, -1, o.size(-1)).transpose(0, 1).reshape(H, R, -1)
