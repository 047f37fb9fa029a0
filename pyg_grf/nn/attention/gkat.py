r"""Graph Kernel Attention (GKAT): attention masked by the RWGNK kernel (FTFI paper, Sec. 4.2 and
App. A.5)."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros
from torch_geometric.typing import OptTensor
from torch_geometric.utils import softmax

from pyg_grf._validation import check_index_range
from pyg_grf.masks.rwgnk import RWGNKMask
from pyg_grf.memory import check_walk_memory
from pyg_grf.features.rwgnk_loads import RWGNKLoads
from pyg_grf.nn.attention.base import GraphAttention, contract_repr, key_dropout
from pyg_grf.nn.feature_maps import apply_feature_map, feature_map_resolver
from pyg_grf.nn.functional import masked_linear_attention, pair_masked_linear_attention
from pyg_grf.ops import SparsePattern, head_spmm

MODES = ('linear', 'softmax', 'dense')
LINEAR_BACKENDS = ('auto', 'sparse', 'pairs')
SCORES = ('gat', 'dot')


def rwgnk_kernel(rwgnk_index: Tensor, rwgnk_value: Tensor, num_nodes: int,
                 threshold: float = 0.0) -> Tuple[Tensor, Tensor]:
    r"""The nonzero entries of the RWGNK kernel :math:`\mathcal{K} = \Psi\Psi^\top` (FTFI paper,
    Eq. 5) as a sparse product, never a dense :math:`N \times N` matrix.

    Args:
        rwgnk_index (Tensor): ``[2, nnz]`` indices of :math:`\Psi`.
        rwgnk_value (Tensor): ``[nnz]`` values of :math:`\Psi`.
        num_nodes (int): :math:`N`.
        threshold (float): drop the pairs with :math:`|\mathcal{K}_{ij}| \le` ``threshold``
            (default: ``0.``: keep every nonzero).

    Returns:
        ``(kernel_index [2, P], kernel_value [P])``: the pairs :math:`(i, j)` with
        :math:`|\mathcal{K}_{ij}| >` ``threshold``, sorted by :math:`i`, and their values.
    """
    if rwgnk_index.dim() != 2 or rwgnk_index.size(0) != 2:
        raise ValueError(f"'rwgnk_index' must have shape [2, nnz], got "
                         f"{tuple(rwgnk_index.shape)}")
    # Validated here every time (once per batch: the payload caches the result), not by the
    # remembered check: the COO tensor below skips its own invariant checks, so an id outside
    # [0, N) would corrupt memory, and a write through .data moves no version counter.
    check_index_range(rwgnk_index, num_nodes, "'rwgnk_index'", 'num_nodes', remember=False)
    # Psi Psi^T has up to sum_q c_q^2 entries (c_q: rows visiting q; a hub makes it N^2): check
    # the memory (~48 bytes an entry while coalescing) before the product allocates it
    count = torch.bincount(rwgnk_index[1].long(), minlength=num_nodes)
    pairs = int((count.double() ** 2).sum())
    check_walk_memory(48 * pairs, rwgnk_value.device, None,
                      f"the GKAT kernel Psi Psi^T of {num_nodes} nodes ({pairs} products)",
                      "Use GKATAttention(mode='linear') (never forms the kernel) or a "
                      "kernel_threshold.", error=MemoryError)
    # sparse products have no bf16 / fp16 kernels: the (parameter-free) kernel is built in at
    # least float32 and returned in the values' dtype
    work = torch.promote_types(rwgnk_value.dtype, torch.float32)
    psi = torch.sparse_coo_tensor(rwgnk_index, rwgnk_value.to(work), (num_nodes, num_nodes),
                                  check_invariants=False).coalesce()
    kernel = torch.sparse.mm(psi, psi.t()).coalesce()
    index, value = kernel.indices(), kernel.values().to(rwgnk_value.dtype)
    keep = value.abs() > threshold
    if not bool(keep.all()):
        index, value = index[:, keep], value[keep]
    return index, value


class GKATAttention(GraphAttention):
    r"""The Graph Kernel Attention layer of GKAT from the `"From block-Toeplitz matrices to
    differential equations on graphs: towards a general theory for scalable masked Transformers"
    <https://arxiv.org/abs/2107.07999>`_ paper (Choromanski et al., ICML 2022; Sec. 4.2, App. A.5):
    multi-head attention whose mask is the RWGNK kernel :math:`\mathcal{K} = \Psi\Psi^\top` of
    random-walk frequency vectors (see :class:`~pyg_grf.transforms.AddRWGNKFeatures`).

    With values :math:`\mathbf{v}_j = \mathbf{W}\mathbf{x}_j` per head, every mode computes

    .. math::
        \mathbf{x}'_i = \sum_j \frac{\mathcal{K}_{ij}\,\kappa(i, j)}
                                    {\sum_l \mathcal{K}_{il}\,\kappa(i, l)} \mathbf{v}_j,

    the masked attention of FTFI Sec. 2 (:math:`\mathbf{M} \odot` kernel, rows normalised), with

    * ``mode='linear'`` (GKAT): :math:`\kappa(i, j) = \phi(\mathbf{q}_i)^\top\phi(\mathbf{k}_j)`,
      computed in time linear in :math:`N` by
      :func:`~pyg_grf.nn.functional.masked_linear_attention` with
      :class:`~pyg_grf.masks.RWGNKMask` (Sec. 4.2: low-rank masking, :math:`\mathcal{K}` is never
      formed).
    * ``mode='softmax'``: :math:`\kappa(i, j) = \exp(e_{ij})`, a softmax restricted to the support
      of :math:`\mathcal{K}` and weighted by it (App. A.5.2: GAT with its adjacency mask replaced
      by the RWGNK similarity matrix). The pairs with :math:`\mathcal{K}_{ij} \ne 0` come from a
      sparse product :math:`\Psi\Psi^\top`, and the softmax of
      :math:`e_{ij} + \log\mathcal{K}_{ij}` runs over them like GAT's over edges.
    * ``mode='dense'`` (GKAT-0, Sec. 5.3): the same as ``'softmax'`` with dense
      :math:`N \times N` matrices; a brute-force reference, :math:`O(N^2)`.

    Logits (``'softmax'``, ``'dense'``): ``score='gat'``,
    :math:`e_{ij} = \mathrm{LeakyReLU}(\mathbf{a}_{dst}^\top\mathbf{v}_i +
    \mathbf{a}_{src}^\top\mathbf{v}_j)` as in GAT, or ``score='dot'``,
    :math:`e_{ij} = \mathbf{q}_i^\top\mathbf{k}_j / \sqrt{C}`.

    Walks never leave a graph, so :math:`\mathcal{K}` is block-diagonal over a PyG batch and no
    node attends across graphs, in every mode.

    Args:
        channels (int): input size, and output size with the default ``project=True``.
        heads (int): number of heads :math:`H` (default: ``1``).
        mode (str): ``'linear'``, ``'softmax'`` or ``'dense'`` (default: ``'linear'``).
        feature_map (str or FeatureMap): :math:`\phi` of ``'linear'`` mode: ``'elu'``
            (:math:`\mathrm{ELU}+1`), ``'relu'`` or ``'favor+'`` (default: ``'elu'``).
        concat (bool): concatenate the heads (``[N, H * C]``) or average them (``[N, C]``)
            (default: :obj:`True`).
        dropout (float): dropout on the normalised attention coefficients only, as in GAT, in
            ``'softmax'`` and ``'dense'`` modes; ``'linear'`` never forms the coefficients and
            drops whole key columns per head instead (numerator only, unbiased:
            :func:`~pyg_grf.nn.attention.base.key_dropout`) (default: ``0.``).
        negative_slope (float): LeakyReLU slope of ``score='gat'`` (default: ``0.2``).
        head_channels (int, optional): channels per head :math:`C` (default:
            ``channels // heads`` if ``concat`` else ``channels``).
        score (str): logits of ``'softmax'``/``'dense'``: ``'gat'`` or ``'dot'``
            (default: ``'gat'``).
        kernel_weighting (bool): weight the coefficients by :math:`\mathcal{K}_{ij}`; if
            :obj:`False`, :math:`\mathcal{K}` only gives the support (an ablation)
            (default: :obj:`True`).
        bias (bool): a learnable bias on the output: in ``to_out`` with ``project``, else added
            to the heads as in GAT (default: :obj:`True`). The value, query and key
            projections ``to_v``, ``to_q``, ``to_k`` have none, as in GAT.
        threshold (float): in ``'softmax'`` and ``'dense'`` modes, pairs with
            :math:`\mathcal{K}_{ij} \le` ``threshold`` are left out of the support: a sparser,
            faster approximation (with ``alpha=1``, :math:`\mathcal{K}_{ii} = 1` is always kept)
            (default: ``0.``, the exact support).
        cached (bool): in ``'softmax'`` mode, cache the kernel pairs of the first call (for
            full-batch training on one fixed graph, as GCNConv's ``cached``) (default:
            :obj:`False`).
        feature_map_kwargs (dict, optional): arguments of the feature map.
        eps (float): added to the normaliser of ``'linear'`` mode (default: ``1e-6``).
        backend (str): how ``'linear'`` mode applies :math:`\mathcal{K} = \Psi\Psi^\top`:
            ``'sparse'`` (two sparse products, never forms :math:`\mathcal{K}`), ``'pairs'``
            (the kernel on its nonzeros: one sampled and one sparse product; the pairs passed
            as ``kernel``, e.g. stored by ``AddRWGNKFeatures(kernel_threshold=0.)``, which
            equal all of :math:`\Psi\Psi^\top`, or computed once per call) or ``'auto'``
            (``'pairs'`` when ``kernel`` is given, else ``'sparse'``) (default: ``'auto'``).
            With a positive ``kernel_threshold`` the stored pairs drop the small entries, so
            ``'pairs'`` then approximates ``'sparse'``.
        project (bool): project the combined heads back to ``channels`` with ``to_out``, as
            every attention layer of the package does (default: :obj:`True`). With
            :obj:`False` the layer is the paper's GAT-shaped one (no output projection), e.g. to
            stack it as a convolution with ``concat=False`` for class scores.

    Shapes:
        - **input:** node features :math:`(N, F)`, ``rwgnk_index`` :math:`(2, |\Psi|)`,
          ``rwgnk_value`` :math:`(|\Psi|)`, batch vector :math:`(N)` *(optional)*
        - **output:** :math:`(N, \mathrm{channels})`; with ``project=False``,
          :math:`(N, H * C)` if ``concat`` else :math:`(N, C)`
    """

    def __init__(self, channels: int, heads: int = 1, mode: str = 'linear',
                 feature_map: Any = 'elu', concat: bool = True, dropout: float = 0.,
                 negative_slope: float = 0.2, head_channels: Optional[int] = None,
                 score: str = 'gat', kernel_weighting: bool = True, bias: bool = True,
                 threshold: float = 0.0, cached: bool = False,
                 feature_map_kwargs: Optional[Dict[str, Any]] = None, eps: float = 1e-6,
                 backend: str = 'auto', project: bool = True):
        super().__init__()
        if backend not in LINEAR_BACKENDS:
            raise ValueError(f"'backend' must be one of {LINEAR_BACKENDS}, got {backend!r}")
        self.backend = backend
        if mode not in MODES:
            raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
        if score not in SCORES:
            raise ValueError(f"'score' must be one of {SCORES}, got {score!r}")
        if threshold < 0:
            raise ValueError(f"'threshold' must be >= 0, got {threshold}")
        if channels < 1 or heads < 1:
            raise ValueError(f"'channels' and 'heads' must be positive, got {channels} and "
                             f"{heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"'dropout' must lie in [0, 1), got {dropout}")
        if head_channels is None:
            if concat and channels % heads != 0:
                raise ValueError(f"'channels' ({channels}) must be divisible by 'heads' "
                                 f"({heads}) when concat=True and head_channels is not given")
            head_channels = channels // heads if concat else channels
        self.channels = channels
        self.heads = heads
        self.mode = mode
        self.concat = concat
        self.dropout = dropout
        self.negative_slope = negative_slope
        self.head_channels = head_channels
        self.score = score
        self.kernel_weighting = kernel_weighting
        self.threshold = threshold
        self.cached = cached
        self.feature_map_kwargs = feature_map_kwargs or {}
        self.eps = eps
        self.project = project
        self._cache: Optional[Tuple[Tensor, Tensor, SparsePattern]] = None
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
        if mode == 'linear':
            self.feature_map = feature_map_resolver(feature_map, C, **self.feature_map_kwargs)
        else:
            self.feature_map = None
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
        self._cache = None

    requires = ('rwgnk_index', 'rwgnk_value')
    optional = ('rwgnk_kernel_index', 'rwgnk_kernel_value')
    hint = "add the transform pyg_grf.transforms.AddRWGNKFeatures (best as pre_transform)"
    payload_keys = ('rwgnk',)

    def payload(self, data: Any) -> Dict[str, Any]:
        r"""``{'rwgnk': RWGNKLoads.from_data(data)}``."""
        return {'rwgnk': RWGNKLoads.from_data(data)}

    def forward(self, x: Tensor, batch: OptTensor = None, *,
                rwgnk: Optional[RWGNKLoads] = None) -> Tensor:
        r"""Runs the layer.

        Args:
            x (Tensor): ``[N, channels]`` node features.
            batch (Tensor, optional): ``[N]`` graph ids. Not needed for the result (the kernel
                is block-diagonal already); ``'dense'`` mode uses it to mask cross-graph pairs
                explicitly, and FAVOR+ (``'linear'``) to stabilise the keys of each graph by
                their own maximum.
            rwgnk (RWGNKLoads): keyword only: the batch's RWGNK features
                (:meth:`payload`, ``RWGNKLoads.from_data(batch)``), with the kernel pairs when
                the transform stored them.
        """
        if not isinstance(rwgnk, RWGNKLoads):
            raise (ValueError if rwgnk is None else TypeError)(
                f"GKATAttention needs rwgnk=RWGNKLoads.from_data(batch) (the features of "
                f"AddRWGNKFeatures), got {type(rwgnk).__name__}")
        if x.dim() == 3:  # B samples on one shared graph: the features repeated per sample
            if batch is not None:
                raise ValueError("'batch' is not used with x of shape [B, n, channels] (every "
                                 "sample is one copy of the shared graph)")
            B, n = x.size(0), x.size(1)
            out = self(x.reshape(B * n, -1),
                       torch.arange(B, device=x.device).repeat_interleave(n),
                       rwgnk=rwgnk.repeat(B, n))
            return out.view(B, n, -1)
        if x.dim() != 2 or x.size(-1) != self.channels:
            raise ValueError(f"'x' must have shape [N, {self.channels}], got {tuple(x.shape)}")
        rwgnk_index, rwgnk_value, kernel = rwgnk.index, rwgnk.value, rwgnk.kernel
        N, H, C = x.size(0), self.heads, self.head_channels
        # Ids in [0, N): checked once per batch tensor, not in every layer (see
        # pyg_grf._validation); a negative id used to wrap around ('dense') or abort the
        # process ('softmax').
        check_index_range(rwgnk_index, N, "'rwgnk_index'")
        rwgnk_value = rwgnk_value.to(x.dtype)

        # Values, one set per head: [N, H, C].
        v = self.to_v(x).view(N, H, C)

        if self.mode == 'linear':
            # Low-rank masked attention: phi(q_i)^T sum_j K_ij phi(k_j) v_j^T / (...), with
            # K X = Psi (Psi^T X) (FTFI Sec. 4.2, Algorithm 1).
            phi_q = self.feature_map(self.to_q(x).view(N, H, C), is_query=True)
            # Keys are stabilised per graph (never by a quantity of other graphs).
            phi_k = apply_feature_map(self.feature_map, self.to_k(x).view(N, H, C),
                                      batch=batch)
            # Coefficient dropout without coefficients: whole key columns, numerator only.
            v = key_dropout(v, self.dropout, self.training)
            use_pairs = self.backend == 'pairs' or (self.backend == 'auto' and kernel is not None)
            if use_pairs:
                # The kernel on its nonzeros: one sampled product, one sparse product; its pairs
                # and pattern are built once per batch (cached on the payload, shared by layers)
                k_index, k_value, pattern = self._kernel_pairs(rwgnk, N, 0., x.dtype)
                out = pair_masked_linear_attention(
                    phi_q, phi_k, v, pattern, k_value.to(x.dtype).expand(H, -1), self.eps)
            else:
                # Psi's pattern (a sort) once per batch, shared by every layer (values with
                # gradients: built per call, nothing cached)
                def build_mask():
                    return RWGNKMask.from_index(rwgnk.index, rwgnk.value, N)
                mask = (build_mask() if rwgnk.value.requires_grad
                        else rwgnk.cached(('mask', N), build_mask))
                out = masked_linear_attention(phi_q, phi_k, v, mask, eps=self.eps)
        elif self.mode == 'softmax':
            # Pairs (i, j) with K_ij != 0 from the sparse product Psi Psi^T.
            if kernel is None and self.cached and self._cache is not None:
                k_index, k_value, pattern = self._cache
            else:
                k_index, k_value, pattern = self._kernel_pairs(rwgnk, N, self.threshold,
                                                                x.dtype)
                if kernel is None and self.cached:
                    self._cache = (k_index, k_value.detach(), pattern)
            dst = k_index[0]
            logits = self._logits(x, v, k_index)  # [P, H]
            # Softmax over each query's support, weighted by K: exp(e_ij + log K_ij).
            if self.kernel_weighting:
                logits = logits + torch.log(k_value.to(x.dtype)).unsqueeze(-1)
            alpha = softmax(logits, dst, num_nodes=N)
            alpha = F.dropout(alpha, p=self.dropout, training=self.training)
            # Aggregate sum_j alpha_ij v_j: all heads in one block-diagonal CSR product.
            out = head_spmm(pattern, alpha.t(), v)
        else:
            out = self._dense(x, v, rwgnk_index, rwgnk_value, batch)

        # Combine heads.
        out = out.reshape(N, H * C) if self.concat else out.mean(dim=1)
        if self.to_out is not None:
            return self.to_out(out)
        if self.bias is not None:
            out = out + self.bias
        return out

    @staticmethod
    def _kernel_pairs(rwgnk: RWGNKLoads, N: int, threshold: float, dtype: torch.dtype
                      ) -> Tuple[Tensor, Tensor, SparsePattern]:
        # (index, value, pattern) of the kernel's pairs with |K_ij| > threshold: the stored
        # pairs, else Psi Psi^T (memory estimated first); once per batch, cached on the payload
        def build():
            if rwgnk.kernel is not None:
                k_index, k_value = rwgnk.kernel  # shapes checked by RWGNKLoads
                if threshold > 0:
                    keep = k_value.abs() > threshold
                    k_index, k_value = k_index[:, keep], k_value[keep]
            else:
                k_index, k_value = rwgnk_kernel(rwgnk.index, rwgnk.value.to(dtype), N,
                                                threshold)
            return k_index, k_value, SparsePattern(k_index, (N, N))
        if rwgnk.value.requires_grad or (rwgnk.kernel_value is not None
                                         and rwgnk.kernel_value.requires_grad):
            return build()  # values carrying gradients: nothing cached
        return rwgnk.cached(('kernel', N, threshold, dtype), build)

    def _logits(self, x: Tensor, v: Tensor, pairs: Optional[Tensor] = None) -> Tensor:
        r"""Logits :math:`e_{ij}` of ``score`` for the ``[2, P]`` (query, key) ``pairs``
        (``[P, H]``), or for all pairs (``[H, N, N]``) when :obj:`None`."""
        N, H, C = v.shape
        if self.score == 'gat':
            a_src = (v * self.att_src).sum(-1)  # [N, H]
            a_dst = (v * self.att_dst).sum(-1)
            if pairs is None:
                e = a_dst.t().unsqueeze(-1) + a_src.t().unsqueeze(1)  # [H, N, N]
            else:
                e = a_dst[pairs[0]] + a_src[pairs[1]]
            return F.leaky_relu(e, self.negative_slope)
        q = self.to_q(x).view(N, H, C)
        k = self.to_k(x).view(N, H, C)
        if pairs is None:
            return torch.einsum('ihc,jhc->hij', q, k) / math.sqrt(C)
        return (q[pairs[0]] * k[pairs[1]]).sum(-1) / math.sqrt(C)

    def _dense(self, x: Tensor, v: Tensor, rwgnk_index: Tensor, rwgnk_value: Tensor,
               batch: OptTensor) -> Tensor:
        # GKAT-0: dense K = Psi Psi^T and a dense masked softmax, O(N^2).
        N = v.size(0)
        # about 6 [N, N] matrices (Psi, K, the support and its masks) and 4 [H, N, N] ones
        # (logits, weights and their gradients), estimated before the first is allocated
        check_walk_memory((6 + 4 * v.size(1)) * N * N * x.element_size(), x.device, None,
                          f"GKATAttention(mode='dense') on {N} nodes (dense [N, N] kernel and "
                          f"[{v.size(1)}, N, N] attention)",
                          "Use GKATAttention(mode='linear') (never forms the kernel) or "
                          "mode='softmax' (the kernel's nonzeros only).", error=MemoryError)
        psi = x.new_zeros(N, N).index_put((rwgnk_index[0], rwgnk_index[1]), rwgnk_value,
                                          accumulate=True)
        kernel = psi @ psi.t()
        if batch is not None:
            kernel = kernel * (batch.view(-1, 1) == batch.view(1, -1)).to(x.dtype)
        logits = self._logits(x, v)  # [H, N, N]
        support = kernel.abs() > self.threshold
        if self.kernel_weighting:
            logits = logits + torch.log(torch.where(support, kernel, torch.ones_like(kernel)))
        logits = logits.masked_fill(~support, float('-inf'))
        alpha = torch.softmax(logits, dim=-1)
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        return torch.einsum('hij,jhc->ihc', alpha, v)

    def __repr__(self) -> str:
        extra = f', mode={self.mode!r}'
        if self.mode == 'linear':
            extra += f', feature_map={self.feature_map_name!r}'
            extra += f', backend={self.backend!r}' if self.backend != 'auto' else ''
        else:
            extra += f', score={self.score!r}'
            extra += f', threshold={self.threshold}' if self.threshold else ''
        extra += '' if self.concat else ', concat=False'
        extra += '' if self.project else ', project=False'
        return contract_repr(self, extra)
