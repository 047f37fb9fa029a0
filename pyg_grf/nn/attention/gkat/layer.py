r"""The GKAT layer (FTFI paper, Sec. 4.2 and App. A.5): the linear mode on the GRF engine
(:func:`~pyg_grf.nn.attention.grf.layer.masked_sums`), the softmax mode one message passing
over the kernel pairs (:func:`~pyg_grf.nn.functional.pair_softmax_attention`)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros
from torch_geometric.typing import OptTensor

from pyg_grf.nn.attention.base import (
    GraphAttention,
    cached_plan,
    contract_repr,
    key_dropout,
    plan_input,
    resolve_head_channels,
    split_heads,
)
from pyg_grf.nn.attention.gkat.plan import RWGNKPlan
from pyg_grf.nn.attention.grf.layer import masked_sums
from pyg_grf.nn.attention.grf.plan import LayerSpec
from pyg_grf.nn.feature_maps import apply_feature_map, feature_map_resolver
from pyg_grf.nn.functional import normalize_sums, pair_scores, pair_softmax_attention

MODES = ('linear', 'softmax')
BACKENDS = ('auto', 'pairs', 'sparse')
SCORES = ('gat', 'dot')


class GKATAttention(GraphAttention):
    r"""The Graph Kernel Attention layer of GKAT from the `"From block-Toeplitz matrices to
    differential equations on graphs: towards a general theory for scalable masked Transformers"
    <https://arxiv.org/abs/2107.07999>`_ paper (Choromanski et al., ICML 2022; Sec. 4.2, App. A.5):
    multi-head attention masked by the RWGNK kernel :math:`\mathcal{K} = \Psi\Psi^\top`
    (:class:`~pyg_grf.transforms.AddRWGNKFeatures`). With values
    :math:`\mathbf{v}_j = \mathbf{W}\mathbf{x}_j` per head, every mode computes the masked
    attention of FTFI Sec. 2,

    .. math::
        \mathbf{x}'_i = \sum_j \frac{\mathcal{K}_{ij}\,\kappa(i, j)}
                                    {\sum_l \mathcal{K}_{il}\,\kappa(i, l)} \mathbf{v}_j,

    * ``mode='linear'`` (GKAT): :math:`\kappa(i, j) = \phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)`,
      on the GRF engine (the kernel on its support, :math:`\Psi` as walk loads of hop 0), or
      when that does not fit the memory, low rank (Sec. 4.2: :math:`\mathcal{K}` never
      formed);
    * ``mode='softmax'``: :math:`\kappa(i, j) = \exp(e_{ij})`, the softmax of
      :math:`e_{ij} + \log\mathcal{K}_{ij}` over the pairs with :math:`|\mathcal{K}_{ij}| > t`
      (App. A.5.2: GAT with its adjacency mask replaced by the RWGNK similarity matrix);

    Logits: ``score='gat'``, :math:`e_{ij} = \mathrm{LeakyReLU}(\mathbf{a}_{dst}^\top
    \mathbf{v}_i + \mathbf{a}_{src}^\top\mathbf{v}_j)` as in GAT, or ``score='dot'``,
    :math:`e_{ij} = \mathbf{q}_i^\top\mathbf{k}_j / \sqrt{C}`. Walks never leave a graph, so
    no node attends across the graphs of a batch.

    Args:
        channels (int): input size, and output size with the default ``project=True``.
        heads (int): number of heads :math:`H` (default: ``1``).
        mode (str): ``'linear'`` or ``'softmax'`` (default: ``'linear'``).
        feature_map (str or FeatureMap): :math:`\phi` of ``'linear'`` mode: ``'elu'``
            (:math:`\mathrm{ELU}+1`), ``'relu'`` or ``'favor+'`` (default: ``'elu'``).
        concat (bool): concatenate the heads (``[N, H * C]``) or average them (``[N, C]``)
            (default: :obj:`True`).
        dropout (float): dropout on the normalised attention coefficients, as in GAT;
            ``'linear'`` never forms them and drops whole key columns per head instead
            (numerator only, unbiased: :func:`~pyg_grf.nn.attention.base.key_dropout`)
            (default: ``0.``).
        negative_slope (float): LeakyReLU slope of ``score='gat'`` (default: ``0.2``).
        head_channels (int, optional): channels per head :math:`C` (default:
            ``channels // heads`` if ``concat`` else ``channels``).
        score (str): logits of ``'softmax'``: ``'gat'`` or ``'dot'``
            (default: ``'gat'``).
        kernel_weighting (bool): weight the coefficients by :math:`\mathcal{K}_{ij}`; if
            :obj:`False`, :math:`\mathcal{K}` only gives the support (an ablation)
            (default: :obj:`True`).
        bias (bool): a learnable bias on the output: in ``to_out`` with ``project``, else added
            to the heads as in GAT; ``to_v``, ``to_q``, ``to_k`` have none (default:
            :obj:`True`).
        threshold (float): pairs with :math:`|\mathcal{K}_{ij}| \le` ``threshold`` are left
            out of the mask, in every mode (with ``alpha=1``, :math:`\mathcal{K}_{ii} = 1` is
            always kept) (default: ``0.``, the exact kernel).
        feature_map_kwargs (dict, optional): arguments of the feature map.
        eps (float): added to the normaliser of ``'linear'`` mode (default: ``1e-6``).
        backend (str): ``'linear'`` mode on the GRF engine
            (:func:`~pyg_grf.nn.attention.grf.plan.build_part`): ``'pairs'`` (the kernel's
            nonzeros: the pairs stored by ``AddRWGNKFeatures(kernel_threshold=...)``, which
            then define the mask, else those of :math:`\Psi\Psi^\top`), ``'sparse'`` (the
            exact kernel only: two products with :math:`\Psi`) or ``'auto'`` (GRF's rule:
            the pairs when they fit the memory budget and need no more multiply-adds than the
            low-rank path, else low rank); the softmax mode runs on the kernel pairs whatever
            it says (default: ``'auto'``).
        project (bool): project the combined heads back to ``channels`` with ``to_out``
            (default: :obj:`True`); :obj:`False` gives the paper's GAT-shaped layer.

    Shapes:
        - **input:** node features :math:`(N, F)` (or :math:`(B, n, F)` on one shared graph),
          batch vector :math:`(N)` *(optional)*, ``rwgnk=`` the batch's
          :class:`~pyg_grf.nn.attention.gkat.RWGNKPlan` (:meth:`payload`)
        - **output:** :math:`(N, \mathrm{channels})`; with ``project=False``,
          :math:`(N, H * C)` if ``concat`` else :math:`(N, C)`
    """

    def __init__(self, channels: int, heads: int = 1, mode: str = 'linear',
                 feature_map: Any = 'elu', concat: bool = True, dropout: float = 0.,
                 negative_slope: float = 0.2, head_channels: Optional[int] = None,
                 score: str = 'gat', kernel_weighting: bool = True, bias: bool = True,
                 threshold: float = 0.0,
                 feature_map_kwargs: Optional[Dict[str, Any]] = None, eps: float = 1e-6,
                 backend: str = 'auto', project: bool = True):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
        if backend not in BACKENDS:
            raise ValueError(f"'backend' must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        if score not in SCORES:
            raise ValueError(f"'score' must be one of {SCORES}, got {score!r}")
        if threshold < 0:
            raise ValueError(f"'threshold' must be >= 0, got {threshold}")
        if head_channels is None and not concat:  # averaged heads, each of the output size
            head_channels = channels
        head_channels = resolve_head_channels(channels, heads, head_channels, dropout)
        self.channels = channels
        self.heads = heads
        self.mode = mode
        self.concat = concat
        self.dropout = dropout
        self.negative_slope = negative_slope
        self.head_channels = head_channels
        self.score = score
        self.kernel_weighting = kernel_weighting
        self.threshold = float(threshold)
        self.feature_map_kwargs = feature_map_kwargs or {}
        self.eps = eps
        self.project = project
        H, C = heads, head_channels

        self.to_v = Linear(channels, H * C, bias=False, weight_initializer='glorot')
        if mode == 'linear' or score == 'dot':
            self.to_q = Linear(channels, H * C, bias=False, weight_initializer='glorot')
            self.to_k = Linear(channels, H * C, bias=False, weight_initializer='glorot')
        else:
            self.register_module('to_q', None)
            self.register_module('to_k', None)
        if mode != 'linear' and score == 'gat':
            self.att_src = Parameter(torch.empty(1, H, C))
            self.att_dst = Parameter(torch.empty(1, H, C))
        else:
            self.register_parameter('att_src', None)
            self.register_parameter('att_dst', None)
        self.feature_map = (feature_map_resolver(feature_map, C, **self.feature_map_kwargs)
                            if mode == 'linear' else None)
        self.feature_map_name = feature_map
        heads_out = H * C if concat else C
        if project:  # the contract's output projection back to 'channels'
            self.to_out = torch.nn.Linear(heads_out, channels, bias=bias)
            self.register_parameter('bias', None)
        else:  # the paper's GAT-shaped layer: heads out, plus a bias
            self.register_module('to_out', None)
            if bias:
                self.bias = Parameter(torch.empty(heads_out))
            else:
                self.register_parameter('bias', None)
        self.reset_parameters()

    @property
    def out_channels(self) -> int:
        r"""Size of the output: ``channels`` with ``project``, else ``heads * head_channels``
        (``concat``) or ``head_channels``."""
        if self.project:
            return self.channels
        return self.heads * self.head_channels if self.concat else self.head_channels

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        self.to_v.reset_parameters()
        if self.to_q is not None:
            self.to_q.reset_parameters()
            self.to_k.reset_parameters()
        if self.to_out is not None:
            self.to_out.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        zeros(self.bias)
        if self.feature_map is not None and hasattr(self.feature_map, 'redraw'):
            self.feature_map.redraw()

    @property
    def feature_dim(self) -> int:
        r"""Size :math:`m` of :math:`\phi` in ``'linear'`` mode (else :math:`C`)."""
        if self.feature_map is None:
            return self.head_channels
        return self.feature_map.output_dim(self.head_channels)

    requires = ('rwgnk_index', 'rwgnk_value')
    hint = "add the transform pyg_grf.transforms.AddRWGNKFeatures (best as pre_transform)"
    payload_keys = ('rwgnk',)

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""``{'rwgnk': plan}``: the batch's :class:`RWGNKPlan` for this layer: the one
        ``data`` carries (``data.rwgnk_plan``) if it matches, else the one this layer built
        last if it matches, else a new one. Build it once per batch for every layer
        (:meth:`plan_payload`)."""
        return type(self).plan_payload(data, [self])

    @classmethod
    def plan_payload(cls, data: Any, layers: Sequence['GKATAttention']) -> Dict[str, Any]:
        r"""``{'rwgnk': plan}``: one plan for all GKAT ``layers`` of a model (what they read,
        built once; e.g. in DataLoader workers), found or built as in :meth:`payload`."""
        layers = [m for m in layers if isinstance(m, cls)]
        return {'rwgnk': cached_plan(layers, 'rwgnk', data, RWGNKPlan.build)}

    def spec(self, exact: bool) -> LayerSpec:
        r"""The GRF engine's configuration of the linear mode: the symmetric mask of
        :math:`\Psi` (``exact``) or the asymmetric mask of the kernel pairs, hop 0 only.
        ``backend='auto'`` is GRF's rule: the kernel on its support unless the low-rank path
        (FTFI paper, Sec. 4.2: :math:`\mathcal{K}` never formed) needs fewer multiply-adds
        or the support does not fit the memory budget."""
        return LayerSpec('symmetric' if exact else 'asymmetric', self.backend, self.heads,
                         self.feature_dim, self.head_channels, None, self.to_v.weight.dtype, 0)

    def forward(self, x: Tensor, batch: OptTensor = None, *,
                rwgnk: Optional[RWGNKPlan] = None) -> Tensor:
        r"""Runs the layer.

        Args:
            x (Tensor): ``[N, channels]`` node features, or ``[B, n, channels]``: ``B`` samples
                on the one graph of the plan.
            batch (Tensor, optional): ``[N]`` graph ids. Not needed for the result (the kernel
                is block-diagonal); FAVOR+ (``'linear'``) stabilises the keys of each graph by
                their own maximum with it.
            rwgnk (RWGNKPlan): keyword only: the batch's plan (:meth:`payload`).
        """
        if not isinstance(rwgnk, RWGNKPlan):
            raise (ValueError if rwgnk is None else TypeError)(
                f"GKATAttention needs rwgnk=RWGNKPlan (layer.payload(batch) or "
                f"GKATAttention.plan_payload(batch, layers), from the features of "
                f"AddRWGNKFeatures), got {type(rwgnk).__name__}")
        plan, shape = rwgnk, tuple(x.shape)
        # B samples on one shared graph: its copies ride in the rows
        x, batch, samples = plan_input(self, x, batch, 'RWGNK', plan.num_nodes, plan.num_graphs)
        if samples is not None and self.mode == 'softmax':  # the pairs of B copies, this call
            plan = plan.repeat(samples, [self])
        if plan.device != x.device:
            plan = plan.to(x.device)
        N, H, C = x.size(0), self.heads, self.head_channels
        if self.mode == 'linear':
            exact = plan.exact and self.threshold == 0
            if self.backend == 'sparse' and not exact:
                raise ValueError("backend='sparse' computes the exact kernel Psi Psi^T, but the "
                                 "mask here is cut (stored kernel pairs or threshold > 0): use "
                                 "backend='pairs' or 'auto'")
            part = plan.linear_part(self.spec(exact), self.threshold)
            q, k, v = self._project(x, head_major=True)            # [H, N, C] each
            phi_q = self.feature_map(q, is_query=True)
            phi_k = apply_feature_map(self.feature_map, k.transpose(0, 1),
                                      batch=batch).transpose(0, 1)  # stabilised per graph
            v1 = F.pad(key_dropout(v.transpose(0, 1), self.dropout, self.training)
                       .transpose(0, 1), (0, 1), value=1.0)
            o = masked_sums(part, phi_q, phi_k, v1, phi_q.new_ones(H, 1), samples or 1, exact)
            out = normalize_sums(o, self.eps, v.dtype).transpose(0, 1)  # [N, H, C]
        else:
            q, k, v = self._project(x)
            kp = plan.kernel_pairs(self.threshold)
            out = pair_softmax_attention(kp.pattern, self._logits(kp, q, k, v), v,
                                         kp.value if self.kernel_weighting else None,
                                         self.dropout, self.training)
        out = out.reshape(N, H * C) if self.concat else out.mean(dim=1)
        if self.to_out is not None:
            out = self.to_out(out)
        elif self.bias is not None:
            out = out + self.bias
        return out if samples is None else out.view(samples, shape[1], -1)

    def _logits(self, kp, q: OptTensor, k: OptTensor, v: Tensor) -> Tensor:
        r"""Head-major logits ``[H, P]`` of the kernel pairs ``kp``: ``score='gat'``,
        :math:`\mathrm{LeakyReLU}(\mathbf{a}_{dst}^\top\mathbf{v}_i +
        \mathbf{a}_{src}^\top\mathbf{v}_j)` (two gathers of ``[H, N]`` scores), or ``'dot'``,
        :math:`\mathbf{q}_i^\top\mathbf{k}_j / \sqrt{C}` (one sampled product)."""
        if self.score == 'dot':
            return pair_scores(kp.pattern, q, k)
        a_src = (v * self.att_src).sum(-1).t()                      # [H, N]
        a_dst = (v * self.att_dst).sum(-1).t()
        e = a_dst.index_select(1, kp.pattern.row) + a_src.index_select(1, kp.pattern.col)
        return F.leaky_relu(e, self.negative_slope)

    def _project(self, x: Tensor,
                 head_major: bool = False) -> Tuple[OptTensor, OptTensor, Tensor]:
        r"""``(q, k, v)``, each ``[N, H, C]``, or head-major ``[H, N, C]``
        (:func:`~pyg_grf.nn.attention.base.split_heads`) (``q``, ``k`` :obj:`None` without
        ``to_q``): one product with the stacked weights of ``to_q``, ``to_k``, ``to_v`` (as
        GATConv's one ``lin``)."""
        N, H, C = x.size(0), self.heads, self.head_channels
        if self.to_q is None:
            return None, None, self.to_v(x).view(N, H, C)
        qkv = F.linear(x, torch.cat([self.to_q.weight, self.to_k.weight, self.to_v.weight]))
        if head_major:
            return split_heads(qkv, H, C)
        # one copy to three contiguous [N, H, C] blocks: the feature map and the per-head
        # operands then run on contiguous memory
        return qkv.view(N, 3, H * C).transpose(0, 1).contiguous().view(3, N, H, C).unbind(0)

    def __repr__(self) -> str:
        extra = f', mode={self.mode!r}'
        if self.mode == 'linear':
            extra += f', feature_map={self.feature_map_name!r}'
        else:
            extra += f', score={self.score!r}'
        extra += f', threshold={self.threshold:g}' if self.threshold else ''
        extra += f', backend={self.backend!r}' if self.backend != 'auto' else ''
        extra += '' if self.concat else ', concat=False'
        extra += '' if self.project else ', project=False'
        return contract_repr(self, extra)
