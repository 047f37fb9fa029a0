r"""GRF-masked linear attention (GRF paper, Sec. 3, Algorithm 1; App. D)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn

from pyg_grf.masks.grf import GRFMask
from pyg_grf.nn.attention.base import QKVAttention
from pyg_grf.nn.functional import masked_linear_attention
from pyg_grf.ops import SparsePattern

MODES = ('symmetric', 'asymmetric', 'sparse_softmax')


class GRFAttention(QKVAttention):
    r"""Multi-head linear attention with a learnable topological mask estimated by graph random
    features, from *Linear Transformer Topological Masking with Graph Random Features*
    (Reid et al., 2024), in :math:`O(N)`:

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
        dropout (float, optional): dropout on the attention output (default: :obj:`0.`).
        bias (bool, optional): biases in the projections (default: :obj:`True`).
        eps (float, optional): added to the normaliser (default: :obj:`1e-6`).

    Shapes:
        - **input:** node features :math:`(N, F)`, ``grf_index`` :math:`(2, |\mathcal{E}_{GRF}|)`,
          ``grf_length`` and ``grf_load`` :math:`(|\mathcal{E}_{GRF}|)`, batch vector :math:`(N)`
          (optional, unused: masking is already per graph)
        - **output:** node features :math:`(N, F)`
    """

    def __init__(self, channels: int, heads: int = 1, max_length: int = 4,
                 head_channels: Optional[int] = None, feature_map: Any = 'relu',
                 feature_map_kwargs: Optional[Dict[str, Any]] = None, mode: str = 'symmetric',
                 f_init: float = 0.5, learn_f: bool = True, dropout: float = 0.0,
                 bias: bool = True, eps: float = 1e-6):
        if mode not in MODES:
            raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
            raise ValueError(f"'max_length' must be an integer >= 0, got {max_length!r}")
        super().__init__(channels, heads, head_channels,
                         None if mode == 'sparse_softmax' else feature_map, feature_map_kwargs,
                         dropout, bias)
        self.max_length = max_length
        self.mode = mode
        self.f_init = f_init
        self.learn_f = learn_f
        self.eps = eps
        self.f = nn.Parameter(torch.empty(heads, max_length + 1), requires_grad=learn_f)
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        with torch.no_grad():
            self.f.copy_(self.f_init ** torch.arange(self.max_length + 1, dtype=torch.float)
                         .expand(self.heads, -1))

    def mask(self, grf_index: Tensor, grf_length: Tensor, grf_load: Tensor, num_nodes: int,
             pattern: Optional[SparsePattern] = None) -> GRFMask:
        r"""The layer's current :class:`~pyg_grf.masks.GRFMask` (one mask per head)."""
        return GRFMask.from_loads(grf_index, grf_length, grf_load, self.f, num_nodes,
                                  asymmetric=self.mode != 'symmetric', pattern=pattern)

    def forward(self, x: Tensor, grf_index: Tensor, grf_length: Tensor, grf_load: Tensor,
                batch: Optional[Tensor] = None,
                pattern: Optional[SparsePattern] = None) -> Tensor:
        r"""
        Args:
            pattern (SparsePattern, optional): sparsity pattern of the GRFs built by an earlier
                layer on the same batch (``layer.mask(...).pattern``); saves rebuilding it.
        """
        N = x.size(0)
        q, k, v = self.project(x)
        M = self.mask(grf_index, grf_length, grf_load, N, pattern)
        if self.mode == 'sparse_softmax':
            out = _sparse_masked_softmax(q, k, v, M, self.training, self.dropout)
        else:
            # phi(q), phi(k): [N, H, m]; masked sums through two sparse products per head.
            phi_q, phi_k = self.features(q, k)
            out = masked_linear_attention(phi_q, phi_k, v, M, eps=self.eps)
        return self.finish(out)

    def _extra_repr(self) -> str:
        return f', max_length={self.max_length}, mode={self.mode!r}'


def _sparse_masked_softmax(q: Tensor, k: Tensor, v: Tensor, M: GRFMask, training: bool,
                           dropout: float) -> Tensor:
    r"""Softmax over the nonzeros of the asymmetric GRF :math:`\widehat\Phi`, weighted by its
    values: :math:`o_i = \sum_j \Phi_{ij} e^{s_{ij}} v_j / \sum_j \Phi_{ij} e^{s_{ij}}`."""
    pat, vals = M.query.pattern, M.query.values  # vals [H, P], rows sorted
    row, col = pat.row, pat.col
    if pat.perm is not None:
        vals = vals[:, pat.perm]
    N, H, C = q.shape
    s = (q[row] * k[col]).sum(-1) * C ** -0.5  # [P, H]
    smax = s.new_full((N, H), float('-inf')).scatter_reduce(
        0, row.view(-1, 1).expand(-1, H), s, 'amax', include_self=True)
    e = torch.exp(s - smax[row].detach()) * vals.t()
    den = e.new_zeros(N, H).index_add(0, row, e)
    a = e / (den[row] + 1e-16)
    a = nn.functional.dropout(a, p=dropout, training=training)
    return v.new_zeros(N, H, v.size(-1)).index_add(0, row, a.unsqueeze(-1) * v[col])
