r"""SAMSA sampling self-attention (SAMSA paper, Sec. 4.2 and 4.4, Algorithm 1): per head,
every query attends to the ``k`` best-scored tokens of its graph, :math:`O(nkd)`."""
from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Linear, Parameter
from torch_geometric.nn.resolver import activation_resolver
from torch_geometric.typing import OptTensor
from torch_geometric.utils import to_dense_batch

from pyg_grf._validation import check_shape
from pyg_grf.nn.attention.base import (
    GraphAttention,
    contract_repr,
    resolve_head_channels,
    samples_as_graphs,
)

MODES = ('soft', 'hard')


def gumbel_like(x: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    r"""Samples i.i.d. :math:`\mathrm{Gumbel}(0, 1)` noise of the shape, dtype and device of
    :obj:`x` as :math:`-\log(-\log u)`, :math:`u \sim U(0, 1)`."""
    u = torch.rand(x.shape, dtype=x.dtype, device=x.device, generator=generator)
    tiny = torch.finfo(x.dtype).tiny
    return -torch.log(-torch.log(u.clamp(min=tiny, max=1.0 - 1e-7)))


class SAMSAAttention(GraphAttention):
    r"""The sampling self-attention from the *"SAMSA: Efficient Transformer for Many Data
    Modalities"* (TMLR submission, under review) paper (Sec. 4.4, Algorithm 1): each head keeps
    only the :math:`k` key/value tokens with the highest learned importance and every query of a
    graph attends to those.

    Per head :math:`h`, with importance scores :math:`\mathbf{z}^{(h)} = \mathrm{MLP}(\mathbf{X})
    _{:, h}` (perturbed by Gumbel noise :math:`\mathbf{g}` during training) over the graph's
    :math:`n` tokens and :math:`s` learnable support tokens (scores
    :math:`\mathbf{z}_{\mathrm{supp}}`, key/values :math:`\mathbf{P}_{\mathrm{supp}}`, Sec. 4.4),

    .. math::
        \mathbf{i} = \mathrm{ArgTopK}_{1..k}(\mathbf{z}), \qquad
        \mathbf{j} = \mathrm{ArgTopK}_{k+1..2k}(\mathbf{z}),

        \tilde{\mathbf{P}}_m = \frac{1}{|\mathbf{j}|} \sum_{v}
        p_{mv} \mathbf{P}_{i_m} + (1 - p_{mv}) \mathbf{P}_{j_v}, \qquad
        p_{mv} = \sigma\!\left(\frac{z_{i_m} - z_{j_v}}{\tau}\right),

        \mathbf{x}^{\prime}_i = \mathbf{W}_o \,\big\Vert_{h=1}^{H}\,
        \mathrm{softmax}\!\left(\frac{\mathbf{q}^{(h)}_i \tilde{\mathbf{K}}^{(h)\top}}
        {\sqrt{d}}\right) \tilde{\mathbf{V}}^{(h)},

    the local-search estimator of Sec. 4.2 that compares the current top-:math:`k` set with its
    next-:math:`k` neighbours. Since the scores already carry Gumbel noise, the difference
    :math:`z_{i_m} - z_{j_v}` carries logistic noise, so :math:`p_{mv}` is exactly a
    Gumbel-Sigmoid sample (App. D). In :obj:`mode="hard"` the straight-through estimator is
    used: the forward pass takes :math:`p_{mv} = 1` (the selected tokens exactly) and the backward
    pass the gradient of the sigmoid; in :obj:`mode="soft"` the relaxed :math:`p_{mv}` is used in
    the forward pass too. In evaluation mode both modes take the plain top-:math:`k` without
    noise or gradient estimation.

    Sampling is per graph: each graph's queries see the keys picked from that graph plus the
    support tokens, which every graph shares; slots that neither can fill are masked. Each head
    picks its own subset ("mixture of attention experts", Sec. 4.4).

    Args:
        channels (int): Size of each input and output sample.
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        num_samples (int, optional): Number :math:`k` of key/value tokens each head keeps per
            graph. (default: :obj:`32`)
        mode (str, optional): :obj:`"hard"` or :obj:`"soft"`, Sec. 5.1. (default: :obj:`"hard"`)
        num_support (int, optional): Number of support tokens; :obj:`None`: :math:`2k`
            (Sec. 4.4). (default: :obj:`None`)
        dropout (float, optional): Dropout of the attention weights. (default: :obj:`0.`)
        tau (float, optional): Temperature :math:`\tau`. (default: :obj:`1.`)
        score_channels, act, act_kwargs: hidden size, activation and its arguments of the
            importance-score MLP. (default: :obj:`channels`, :obj:`"gelu"`, :obj:`None`)
        bias (bool, optional): Biases of the projections. (default: :obj:`True`)
        head_channels (int, optional): Size per head. (default: :obj:`channels // heads`)
    """
    def __init__(self, channels: int, heads: int = 1, num_samples: int = 32, mode: str = 'hard',
                 num_support: Optional[int] = None, dropout: float = 0., tau: float = 1.,
                 score_channels: Optional[int] = None,
                 act: Union[str, Callable, None] = 'gelu', act_kwargs: Optional[dict] = None,
                 bias: bool = True, head_channels: Optional[int] = None):
        super().__init__()
        head_channels = resolve_head_channels(channels, heads, head_channels, dropout)
        if num_samples < 1:
            raise ValueError(f"'num_samples' must be at least 1 (got {num_samples})")
        if mode not in MODES:
            raise ValueError(f"Unknown mode '{mode}' (expected one of {MODES})")
        if num_support is not None and num_support < 0:
            raise ValueError(f"'num_support' must be non-negative (got {num_support})")
        if tau <= 0.:
            raise ValueError(f"'tau' must be positive (got {tau})")
        self.channels, self.heads, self.head_channels = channels, heads, head_channels
        self.num_samples, self.mode, self.dropout, self.tau = num_samples, mode, dropout, tau
        self.num_support = 2 * num_samples if num_support is None else num_support
        score_channels = channels if score_channels is None else score_channels

        H, D, S = heads, head_channels, self.num_support
        self.to_q = Linear(channels, H * D, bias=bias)
        self.to_kv = Linear(channels, 2 * H * D, bias=bias)
        self.to_out = Linear(H * D, channels, bias=bias)
        # importance-score network (Sec. 4.4: "a simple multi-layer perceptron")
        self.score_lin1 = Linear(channels, score_channels)
        self.score_act = activation_resolver(act, **(act_kwargs or {}))
        self.score_lin2 = Linear(score_channels, heads)
        # support key/value tokens P_supp [S, H, 2D] and their scores Z_supp [S, H]
        self.support_kv = Parameter(torch.empty(S, H, 2 * D))
        self.support_score = Parameter(torch.empty(S, H))
        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        for lin in (self.to_q, self.to_kv, self.to_out, self.score_lin1, self.score_lin2):
            lin.reset_parameters()
        torch.nn.init.trunc_normal_(self.support_kv, std=0.02)
        # small random scores: no ties among the support tokens, so the top-k (and the
        # output) does not depend on how the candidates of a graph are laid out
        torch.nn.init.trunc_normal_(self.support_score, std=0.02)

    def forward(self, x: Tensor, batch: OptTensor = None, *,
                return_index: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        r"""
        Args:
            x (torch.Tensor): The tokens :math:`(N, F)`, or :math:`(B, n, F)`: :math:`B`
                samples of :math:`n` tokens (one graph each).
            batch (torch.Tensor, optional): The graph of every token :math:`(N)`; an unsorted
                one is sorted internally and the output returned in the input order.
                (default: :obj:`None`, one graph)
            return_index (bool, optional): Also return the selected token indices
                :math:`(B, k, H)` (support token :math:`s` as :math:`N + s`, an empty slot as
                :math:`-1`). (default: :obj:`False`)
        """
        x, batch, samples = samples_as_graphs(x, batch)  # [B, n, F]: B graphs
        if samples is not None:
            out = self.forward(x, batch, return_index=return_index)
            if return_index:
                return out[0].view(samples, -1, out[0].size(-1)), out[1]
            return out.view(samples, -1, out.size(-1))
        check_shape(x, 'x', 'N', self.channels)
        N = x.size(0)
        if batch is not None:
            check_shape(batch, 'batch', N)
        if N == 0:  # an empty batch: no tokens, nothing selected
            out = self.to_out(x.new_zeros(0, self.to_out.in_features)) + 0 * x.sum()
            if return_index:
                return out, torch.empty(0, self.num_samples, self.heads, dtype=torch.long,
                                        device=x.device)
            return out
        if batch is None:
            return self._forward_sorted(x, None, None, return_index)
        # One host read for the number of graphs (to_dense_batch would read it anyway) and
        # for whether 'batch' is sorted.
        batch = batch.long()
        unsorted = (batch[1:] < batch[:-1]).any()
        lo, hi, flag = torch.stack([batch.min(), batch.max(), unsorted.long()]).tolist()
        if lo < 0:
            raise ValueError(f"Expected 'batch' to hold graph ids >= 0 (got {lo})")
        if not flag:
            return self._forward_sorted(x, batch, hi + 1, return_index)
        perm = torch.sort(batch, stable=True)[1]
        res = self._forward_sorted(x[perm], batch[perm], hi + 1, return_index)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(N, device=perm.device)
        if not return_index:
            return res[inv]
        out, index = res
        # Selected rows refer to sorted positions: map graph tokens back to input rows.
        index = torch.where((index >= 0) & (index < N), perm[index.clamp(0, N - 1)], index)
        return out[inv], index

    def _forward_sorted(self, x: Tensor, batch: OptTensor, batch_size: Optional[int],
                        return_index: bool) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        N = x.size(0)
        H, D, k, S = self.heads, self.head_channels, self.num_samples, self.num_support

        # Project queries and key/values, score tokens (Alg. 1, lines 2-6):
        q = self.to_q(x).view(N, H, D)
        kv = self.to_kv(x).view(N, H, 2 * D)
        z = self.score_lin2(self.score_act(self.score_lin1(x)))  # scores Z [N, H] (Alg. 1, l. 6)

        # Scores per graph, padded with -inf over graphs: [B, M, H]
        if batch is None:
            z_dense = z.unsqueeze(0)
            ptr = z.new_zeros(1, dtype=torch.long)
        else:
            z_dense, _ = to_dense_batch(z, batch, fill_value=float('-inf'),
                                        batch_size=batch_size)
            counts = torch.bincount(batch, minlength=z_dense.size(0))
            ptr = torch.cumsum(counts, 0) - counts
        B, M = z_dense.size(0), z_dense.size(1)

        # Append the support tokens' scores (Alg. 1, lines 8-10), Gumbel noise when training:
        z_supp = self.support_score.unsqueeze(0).expand(B, S, H).to(z.dtype)
        cand = torch.cat([z_dense, z_supp], dim=1)  # [B, M + S, H]
        if self.training:
            cand = cand + gumbel_like(cand)

        # Top-k and next-k candidates of every head (Sec. 4.2):
        k_eff = min(k, M + S)
        k_all = min(2 * k, M + S) if self.training else k_eff
        top_val, top_idx = cand.topk(k_all, dim=1)  # [B, k_all, H], sorted
        valid = torch.isfinite(top_val)
        in_graph = top_idx < M
        row = torch.where(in_graph, ptr.view(B, 1, 1) + top_idx, N + (top_idx - M))
        row = row.masked_fill(~valid, 0)

        # Gather the key/values of the candidates head by head: [B, k_all, H, 2D]
        table = torch.cat([kv, self.support_kv.to(kv.dtype)], dim=0)  # [N + S, H, 2D]
        head = torch.arange(H, device=x.device).view(1, 1, H)
        kv_all = table[row, head]

        kv_i, valid_i = kv_all[:, :k_eff], valid[:, :k_eff]
        if self.training and k_all > k_eff:
            # Local-search straight-through Gumbel-Sigmoid estimator (Sec. 4.2, App. D):
            kv_j, valid_j = kv_all[:, k_eff:], valid[:, k_eff:]
            z_i = top_val[:, :k_eff].masked_fill(~valid_i, 0.)
            z_j = top_val[:, k_eff:].masked_fill(~valid_j, 0.)
            p = torch.sigmoid((z_i.unsqueeze(2) - z_j.unsqueeze(1)) / self.tau)  # [B,k,k',H]
            # hard: forward value exactly 0 (p = 1), gradient of the sigmoid;
            # soft: relaxed mixture p P_i + (1 - p) P_j in the forward pass.
            delta = p - p.detach() if self.mode == 'hard' else p - 1.
            w = valid_j.to(p.dtype)
            w = w / w.sum(dim=1, keepdim=True).clamp(min=1.)
            a = delta * w.unsqueeze(1) * valid_i.to(p.dtype).unsqueeze(2)  # [B, k, k', H]
            kv_i = kv_i + (a.sum(dim=2).unsqueeze(-1) * kv_i -
                           torch.einsum('bmvh,bvhd->bmhd', a, kv_j))

        # Attend all queries of a graph to its selected keys (Alg. 1, line 15):
        k_sel = kv_i[..., :D].permute(0, 2, 1, 3)  # [B, H, k, D]
        v_sel = kv_i[..., D:].permute(0, 2, 1, 3)
        if batch is None:
            q_dense, node_mask = q.unsqueeze(0), None
        else:
            q_dense, node_mask = to_dense_batch(q, batch, batch_size=B, max_num_nodes=M)
        q_dense = q_dense.permute(0, 2, 1, 3)  # [B, H, M, D]
        attn_mask = None
        if not bool(valid_i.all()):
            attn_mask = valid_i.permute(0, 2, 1).unsqueeze(2)  # [B, H, 1, k]
        out = F.scaled_dot_product_attention(
            q_dense, k_sel, v_sel, attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.)
        out = out.permute(0, 2, 1, 3).reshape(B, M, H * D)
        out = out[0] if node_mask is None else out[node_mask]
        out = self.to_out(out)

        if return_index:
            return out, row[:, :k_eff].masked_fill(~valid_i, -1)
        return out

    def __repr__(self) -> str:
        return contract_repr(self, f', num_samples={self.num_samples}, mode={self.mode!r}')
