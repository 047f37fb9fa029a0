r"""GRF-masked linear attention (GRF paper, Sec. 3, Algorithm 1; App. D)."""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from pyg_grf.features.loads import GRFLoads
from pyg_grf.masks.grf import GRFMask
from pyg_grf.nn import functional as F
from pyg_grf.nn.attention.base import QKVAttention, reset_hop_coefficients, split_call
# the backends, their cost model and memory checks (re-exported: public names of this module)
from pyg_grf.nn.attention.grf_backends import (BackendMemoryError, backend_costs,  # noqa: F401
                                               backend_memory, check_backend_memory,
                                               choose_backend, get_backend, mask_values,
                                               remember_choice)

MODES = ('symmetric', 'asymmetric', 'sparse_softmax')
F_MODES = ('abs', 'signed', 'free')
BACKENDS = ('auto', 'sparse', 'pairs', 'dense')


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
      (App. D with :math:`A = \exp(\mathbf{q}^\top\mathbf{k})`, Eq. 25; the video experiment of
      App. C.4); :math:`O(\mathrm{nnz})`.

    Walks never leave a connected component, so attention never crosses the graphs of a PyG
    mini-batch: no padding is needed.

    Args:
        channels (int): input and output size.
        heads (int, optional): number of heads :math:`H` (default: :obj:`1`).
        max_length (int, optional): :math:`L`, the largest hop count with a coefficient
            (default: :obj:`4`). Must match the transform's ``max_length`` (longer walks'
            entries get :math:`f = 0`).
        head_channels (int, optional): size per head (default: ``channels // heads``).
        feature_map (str or FeatureMap, optional): :math:`\phi`: ``'relu'``, ``'elu'`` or
            ``'favor+'`` (default: ``'relu'``).
        feature_map_kwargs (dict, optional): arguments of the feature map.
        mode (str, optional): ``'symmetric'``, ``'asymmetric'`` or ``'sparse_softmax'``
            (default: ``'symmetric'``).
        f_init (float, optional): initial :math:`f_l = \mathrm{f\_init}^l` (decaying, so longer
            walks start with less weight; :math:`f_0 = 1`) (default: :obj:`0.5`).
        learn_f (bool, optional): whether :math:`f` is learnable (default: :obj:`True`).
        f_mode (str, optional): how the learned :math:`f` enters the mask (see
            ``docs/grf_mask_value.md``):

            * ``'abs'`` (default): the mask uses :math:`|f|` (:meth:`coefficients`), so
              :math:`\widehat\Phi \ge 0` and :math:`M \ge 0` entrywise (the loads are
              non-negative for non-negative edge weights); with a non-negative feature map
              (``'relu'``, ``'elu'``, ``'favor+'``) every output is a convex combination of the
              values;
            * ``'signed'``: the numerator uses the signed mask of :math:`f` (any real power
              series, as in the paper, Eq. 4), the normaliser the mask of :math:`|f|`, which
              bounds it entrywise (:math:`|\widehat\Phi_f| \le \widehat\Phi_{|f|}`), so
              :math:`\lVert\mathbf{o}_i\rVert_\infty \le \max_j
              \lVert\mathbf{v}_j\rVert_\infty` still holds; two mask products instead of one
              (linear modes only);
            * ``'free'``: the paper's unconstrained :math:`f` in both; the normaliser
              :math:`\sum_j M_{ij}\phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)` can pass
              through 0 and the output diverge (the behaviour before ``f_mode`` existed).
        layer_index (int, optional): which walk draws this layer uses when the loads hold
            several independent draws (``AddGraphRandomFeatures(num_draws=D)``): head
            :math:`h` uses draw :math:`(\mathrm{layer\_index} \cdot H + h) \bmod D`, so
            :math:`D = H` gives every head its own walks and :math:`D = H \cdot L_{layers}`
            every head of every layer (GRF paper, Sec. 4: walks frozen per head and layer).
            :class:`~pyg_grf.nn.GraphTransformer` sets it per layer (default: :obj:`0`).
        dropout (float, optional): dropout on the attention coefficients only: each pair's in
            ``'sparse_softmax'`` mode; in the linear modes, which never form the coefficients,
            whole key columns per head (one draw per key and head, numerator only, unbiased:
            :func:`~pyg_grf.nn.attention.base.key_dropout`) (default: :obj:`0.`).
        bias (bool, optional): biases in the projections (default: :obj:`True`).
        eps (float, optional): added to the normaliser (default: :obj:`1e-6`).
        backend (str, optional): how the masked attention is computed, same result:
            ``'sparse'`` (two CSR products, never forms the mask), ``'pairs'`` (the mask on its
            support: one sampled product and one sparse product), ``'dense'`` (padded dense
            blocks per graph) or ``'auto'`` (the cheapest by :func:`backend_costs`)
            (default: ``'auto'``). See ``docs/speed.md``.
        global_beta (float, optional): if set, the mask gains a global term,
            :math:`M = \beta_h \mathbf{1}\mathbf{1}^\top + \widehat\Phi\widehat\Phi^\top`
            inside each graph, with a learnable :math:`\beta_h = \mathrm{softplus}(\cdot) \ge 0`
            per head initialised to ``global_beta``: every node also attends to its whole graph
            (linear modes only; :math:`O(N)` extra) (default: :obj:`None`).
        attr_prefix (str, optional): the ``attr_prefix`` of the transform whose loads
            :meth:`payload` reads (default: ``'grf'``).

    Shapes:
        - **input:** node features :math:`(N, F)` or :math:`(B, n, F)`, batch vector
          :math:`(N)` (needed for the global term and FAVOR+ with several graphs), keyword
          ``grf``: a :class:`~pyg_grf.features.GRFLoads` (:meth:`payload`)
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
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
            raise ValueError(f"'max_length' must be an integer >= 0, got {max_length!r}")
        super().__init__(channels, heads, head_channels,
                         None if mode == 'sparse_softmax' else feature_map, feature_map_kwargs,
                         dropout, bias)
        if f_mode not in F_MODES:
            raise ValueError(f"'f_mode' must be one of {F_MODES}, got {f_mode!r}")
        if f_mode == 'free' and mode != 'sparse_softmax':
            warnings.warn("GRFAttention(f_mode='free') leaves the mask coefficients "
                          "unconstrained: negative ones can drive the normaliser towards 0 and "
                          "the output to large values. f_mode='abs' (the default) or 'signed' "
                          "bound it.", UserWarning, stacklevel=2)
        if f_mode == 'signed' and mode == 'sparse_softmax':
            raise ValueError("f_mode='signed' needs a linear mode ('symmetric' or "
                             "'asymmetric'), got mode='sparse_softmax'")
        if isinstance(layer_index, bool) or not isinstance(layer_index, int) or layer_index < 0:
            raise ValueError(f"'layer_index' must be an integer >= 0, got {layer_index!r}")
        self.max_length = max_length
        self.f_mode = f_mode
        self.layer_index = layer_index
        self.mode = mode
        self.f_init = f_init
        self.learn_f = learn_f
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

    def draws(self, num_draws: int) -> Tuple[int, ...]:
        r"""The walk draw of every head when the loads hold ``num_draws`` draws."""
        H = self.heads
        return tuple((self.layer_index * H + h) % num_draws for h in range(H))

    def mask(self, grf_index: Union[Tensor, GRFLoads], grf_length: Optional[Tensor] = None,
             grf_load: Optional[Tensor] = None, num_nodes: Optional[int] = None) -> GRFMask:
        r"""The layer's current :class:`~pyg_grf.masks.GRFMask` (one mask per head), from a
        :class:`~pyg_grf.features.GRFLoads` or the three tensors and ``num_nodes``."""
        if isinstance(grf_index, GRFLoads):
            grf = grf_index
        else:
            grf = _as_loads(grf_index, grf_length, grf_load, num_nodes, None)
        if grf.num_draws > 1:
            raise ValueError("GRFAttention.mask() needs loads with one walk draw; these hold "
                             f"{grf.num_draws} (select one with grf.fold((d,)))")
        return GRFMask.from_loads(grf, f=self.coefficients(),
                                  asymmetric=self.mode != 'symmetric')

    @property
    def requires(self) -> Tuple[str, ...]:
        return tuple(f'{self.attr_prefix}_{s}' for s in ('index', 'length', 'load'))

    @property
    def optional(self) -> Tuple[str, ...]:
        p = self.attr_prefix
        return (f'{p}_key_index', f'{p}_key_length', f'{p}_key_load', f'{p}_draw',
                f'{p}_key_draw')

    hint = ("add the transform pyg_grf.transforms.AddGraphRandomFeatures (best as the dataset's "
            "pre_transform, so the walks are sampled once and cached); a second one with "
            "attr_prefix='grf_key' gives independent key-side walks (unbiased diagonal)")
    payload_keys = ('grf',)

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""``{'grf': GRFLoads.from_data(data, attr_prefix)}``, with the key-side loads of a
        second transform (``attr_prefix + '_key'``) when the data has them."""
        key = f'{self.attr_prefix}_key'
        has_key = all(getattr(data, f'{key}_{s}', None) is not None
                      for s in ('index', 'length', 'load'))
        return {'grf': GRFLoads.from_data(data, self.attr_prefix,
                                          key_prefix=key if has_key else None)}

    def forward(self, x: Tensor, *args: Any, batch: Optional[Tensor] = None,
                grf: Optional[GRFLoads] = None, **legacy: Any) -> Tensor:
        r"""
        Args:
            x (Tensor): ``[N, channels]`` node features, or ``[B, n, channels]``: ``B`` samples
                (e.g. the patches of ``B`` images) on one shared graph of ``n`` nodes, whose
                loads ``grf`` cover ``n`` nodes (no PyG ``Batch`` of copies needed).
            batch (Tensor, optional): ``[N]`` graph ids (sorted, as in PyG batches). The GRF
                mask never crosses graphs, but the global term (``global_beta``) and FAVOR+'s
                key stabilisation are per graph: they need it (or ``grf`` carrying it, as
                ``GRFLoads.from_data(batch)`` does) when ``x`` holds several graphs. Without
                either, ``x`` is one graph (PyG's convention for ``batch=None``). Given beside
                loads that carry their own, it must equal theirs (else a ``ValueError``).
            grf (GRFLoads): keyword only: the loads of the transform, ``GRFLoads.from_data(
                batch)`` (:meth:`payload`), which validates them once and shares the per-batch
                precomputation between all layers.

        The old call ``forward(x, grf_index, grf_length, grf_load, batch)`` (or a
        :class:`~pyg_grf.features.GRFLoads` second) still works for one release with a
        :class:`FutureWarning`.
        """
        batch, old = split_call(self, args, batch, legacy,
                                ('grf_index', 'grf_length', 'grf_load', 'batch'),
                                'x, grf_index, grf_length, grf_load, batch',
                                'x, batch=None, *, grf=GRFLoads.from_data(data)')
        grf_index = grf_length = grf_load = None
        if old is not None:
            grf_index, grf_length, grf_load = (old.get(n) for n in
                                               ('grf_index', 'grf_length', 'grf_load'))
            if isinstance(grf_index, GRFLoads):
                if grf is not None:
                    raise TypeError("GRFAttention.forward got the loads twice")
                grf, grf_index = grf_index, None
        samples = None
        if x.dim() == 3:  # samples on one shared graph: the loads repeated per sample
            if batch is not None:
                raise ValueError("'batch' is not used with x of shape [B, n, channels] (every "
                                 "sample is one copy of the shared graph)")
            samples, n = x.size(0), x.size(1)
            x = x.reshape(samples * n, -1)
        elif x.dim() != 2:
            raise ValueError(f"{self.__class__.__name__} expects x of shape [N, {self.channels}] "
                             f"(nodes) or [B, n, {self.channels}] (samples on one shared graph), "
                             f"got {tuple(x.shape)}")
        q, k, v = self.project(x)
        out = self.finish(self._mix(q, k, v, samples, grf_index, grf_length, grf_load, batch,
                                    grf))
        return out if samples is None else out.view(samples, -1, out.size(-1))

    @torch.compiler.disable
    def _mix(self, q: Tensor, k: Tensor, v: Tensor, samples: Optional[int],
             grf_index: Optional[Tensor], grf_length: Optional[Tensor],
             grf_load: Optional[Tensor], batch: Optional[Tensor],
             grf: Optional[GRFLoads]) -> Tensor:
        # Everything that depends on the loads (validation, cached per-batch structures, sparse
        # kernels with data-dependent shapes) runs eagerly under torch.compile: the compiled
        # graph is the projections and the output layer, and recompiles neither per batch nor
        # per GRFLoads object.
        N, H = q.size(0), self.heads
        if samples is not None:
            n = N // samples
            grf = _as_loads(grf_index, grf_length, grf_load, n, None, grf)
            grf.refresh()  # an edited payload (even through .data) drops its structures
            if grf.num_nodes != n:
                raise ValueError(f"x of shape {(samples, n, self.channels)} holds {samples} "
                                 f"samples of {n} nodes, but the GRF loads cover "
                                 f"{grf.num_nodes} nodes (pass the loads of the one shared "
                                 f"graph)")
            grf = grf.repeat(samples)
        else:
            grf = _as_loads(grf_index, grf_length, grf_load, N, batch, grf)
            grf.refresh()  # an edited payload (even through .data) drops its structures
            if grf.num_nodes != N:
                raise ValueError(f"the GRF loads cover {grf.num_nodes} nodes but 'x' has {N} "
                                 f"rows")
        grf.check_coefficients(self.max_length, f'{self.__class__.__name__}(max_length='
                                                f'{self.max_length})')
        if grf.batch is not None:  # the loads' own batch vector (the same graphs): its cached
            # structures serve, also after the loads were pickled; a 'batch' passed beside
            # them must name the same graphs (O(N) check), never be silently ignored
            if batch is not None and batch is not grf.batch and not (
                    batch.shape == grf.batch.shape and torch.equal(batch.to(grf.batch.device),
                                                                   grf.batch)):
                raise ValueError("'batch' differs from the batch vector the GRF loads were "
                                 "built with (GRFLoads.from_data(data) carries data.batch): "
                                 "pass the loads of this batch, or omit 'batch'")
            batch = None
        f = self.coefficients()
        linear = self.mode != 'sparse_softmax'
        if linear:
            phi_q, phi_k = self.features(q, k, grf.batch if batch is None else batch)
            v = self.drop_keys(v)  # coefficient dropout: whole key columns, numerator only
        else:
            phi_q, phi_k = q, k
        o = self._mask_sums(grf, phi_q, phi_k, v, f, batch)
        if self.f_mode == 'signed':  # the normaliser from the |f| mask, which bounds |M_f|
            den = self._mask_sums(grf, phi_q, phi_k, v, f.abs(), batch)
            o = torch.cat([o[..., :-1], den[..., -1:]], dim=-1)
        if not linear:  # dropout on the coefficients, not again on the output
            return o
        if self.beta is not None:  # M = beta * 1 1^T (per graph) + GRF mask
            o = o + self.beta.to(o.dtype).view(1, H, 1) * F.packing_sums(
                phi_q, phi_k, v, grf.layout(batch))
        return F.normalize_sums(o, self.eps)

    def _mask_sums(self, grf: GRFLoads, phi_q: Tensor, phi_k: Tensor, v: Tensor, f: Tensor,
                   batch: Optional[Tensor]) -> Tensor:
        # the masked sums [N, H, C + 1] (linear modes) or the output (softmax) for coefficients f
        N, H = phi_q.size(0), self.heads
        if grf.num_draws > 1:  # independent walks per head: heads folded into the node axis
            run = grf.fold(self.draws(grf.num_draws), batch)
            if run.num_groups > 1:
                def fold(t: Tensor) -> Tensor:
                    return t.transpose(0, 1).reshape(H * N, 1, t.size(-1))
                o = self._attend(run, fold(phi_q), fold(phi_k), fold(v), f, None)
                return o.view(H, N, -1).transpose(0, 1)
            return self._attend(run, phi_q, phi_k, v, f, None)
        return self._attend(grf, phi_q, phi_k, v, f, batch)

    def prepare(self, grf: GRFLoads) -> str:
        r"""Builds on ``grf`` every structure of the batch that this layer's forward reads and
        that does not depend on its weights (pairs, mask statistics, sparse patterns and their
        transposes, block layout), as the forward would on first use; returns the backend the
        layer runs. Several layers share what they have in common (it is cached on ``grf``).
        Called ahead of the training step, e.g. by :class:`pyg_grf.loader.DataLoader` in its
        workers, it leaves the step only the per-layer products.

        The choice is the forward's: with ``backend='auto'`` the cost model's pick for this
        layer's heads and widths; with several walk draws, the folded loads of the layer's
        draws (:meth:`draws`)."""
        if not isinstance(grf, GRFLoads):
            raise TypeError(f"'grf' must be a GRFLoads, got {type(grf).__name__}")
        grf.refresh()
        grf.check_coefficients(self.max_length, f'{self.__class__.__name__}(max_length='
                                                f'{self.max_length})')
        heads, d = self.heads, self.head_channels
        m = d if self.feature_map is None else self.feature_map.output_dim(d)
        run = grf
        if grf.num_draws > 1:
            run = grf.fold(self.draws(grf.num_draws))
            if run.num_groups > 1:
                heads = 1
        backend = self.backend
        if backend == 'auto':
            backend = choose_backend(run, self.mode, heads, m, d, None, self.f.dtype)
            remember_choice(run, backend, self.mode, heads, m, d)  # the forward runs it
        get_backend(backend).plan(run, self.mode, heads, self.f.dtype)
        if self.beta_raw is not None:
            grf.layout()
        return backend

    def no_weight_decay(self) -> set:
        r"""Names of the parameters an optimiser should not decay: the mask coefficients."""
        return {'f'} | ({'beta_raw'} if self.beta_raw is not None else set())

    @property
    def beta(self) -> Optional[Tensor]:
        r"""Weights :math:`\beta_h \ge 0` of the global term (:obj:`None` if disabled)."""
        return None if self.beta_raw is None else nn.functional.softplus(self.beta_raw)

    def _attend(self, grf: GRFLoads, a: Tensor, b: Tensor, v: Tensor, f: Tensor,
                batch: Optional[Tensor]) -> Tensor:
        # a, b: phi_q, phi_k (linear modes) or q, k (softmax), [N', h, .]; h is the number of
        # heads, or 1 when the heads are folded into the nodes (grouped loads, one coefficient
        # row per group). Linear modes return the sums [N', h, C + 1], softmax the output.
        backend = self.backend
        if backend == 'auto':
            backend = choose_backend(grf, self.mode, a.size(1), a.size(-1), v.size(-1), batch,
                                     f.dtype)
        else:  # an explicit backend: refuse what cannot fit before allocating it
            check_backend_memory(grf, backend, self.mode, a.size(1), a.size(-1), v.size(-1),
                                 batch, a.element_size(), a.device)
        if self.mode == 'sparse_softmax':
            return get_backend(backend).softmax(grf, a, b, v, f, self.dropout, self.training,
                                                batch)
        return get_backend(backend).linear_sums(grf, a, b, v, f, self.mode == 'symmetric',
                                                batch)

    def _extra_repr(self) -> str:
        glob = '' if self.global_beta is None else f', global_beta={self.global_beta}'
        glob += '' if self.f_mode == 'abs' else f', f_mode={self.f_mode!r}'
        return (f', max_length={self.max_length}, mode={self.mode!r}, backend={self.backend!r}'
                f'{glob}')


def _as_loads(index: Optional[Tensor], length: Optional[Tensor], load: Optional[Tensor],
              num_nodes: Optional[int], batch: Optional[Tensor],
              grf: Optional[GRFLoads] = None) -> GRFLoads:
    if grf is not None:
        if index is not None or length is not None or load is not None:
            raise ValueError("pass either 'grf' or the three tensors (grf_index, grf_length, "
                             "grf_load), not both")
        if not isinstance(grf, GRFLoads):
            raise TypeError(f"'grf' must be a pyg_grf.features.GRFLoads, got "
                            f"{type(grf).__name__}")
        return grf
    if index is None or length is None or load is None:
        raise ValueError("GRF attention needs the loads: pass grf=GRFLoads.from_data(batch) or "
                         "the three tensors grf_index, grf_length, grf_load")
    return GRFLoads(index, length, load, num_nodes, batch=batch)
