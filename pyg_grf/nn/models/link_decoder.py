r"""Scoring node pairs from node embeddings, for link prediction (LRGB PCQM-Contact)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.nn import MLP

DECODERS = ('dot', 'hadamard_mlp')


class LinkDecoder(torch.nn.Module):
    r"""Scores a node pair :math:`(i, j)` from the node embeddings :math:`\mathbf{z}`: the dot
    product (the LRGB PCQM-Contact baselines, Dwivedi et al. 2022, after a node-wise MLP, which
    :class:`~pyg_grf.nn.models.GraphTransformer`'s head provides) or an MLP over the Hadamard
    product,

    .. math::
        s_{ij} = \mathbf{z}_i^\top \mathbf{z}_j
        \quad\text{or}\quad
        s_{ij} = \mathrm{MLP}(\mathbf{z}_i \odot \mathbf{z}_j).

    Both are symmetric in :math:`i, j`; the score is a logit (train with
    :func:`~torch.nn.functional.binary_cross_entropy_with_logits`).

    Args:
        channels (int): embedding size.
        decoder (str, optional): ``'dot'`` or ``'hadamard_mlp'`` (default: :obj:`'dot'`).
        hidden_channels, num_layers, act, dropout: of the MLP (default: :obj:`channels`,
            :obj:`2`, :obj:`'relu'`, :obj:`0.`).
        chunk_size (int, optional): most elements of the :math:`[P, K, C]` product that
            :meth:`score_candidates` forms at once for the MLP (default: :obj:`2**24`).
    """

    def __init__(self, channels: int, decoder: str = 'dot',
                 hidden_channels: Optional[int] = None, num_layers: int = 2, act: str = 'relu',
                 dropout: float = 0., chunk_size: int = 2**24):
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.channels, self.decoder, self.num_layers = channels, decoder, num_layers
        self.hidden_channels = hidden_channels or channels
        self.chunk_size = int(chunk_size)
        self.mlp = None
        if decoder == 'hadamard_mlp':
            sizes = [channels] + [self.hidden_channels] * (num_layers - 1) + [1]
            self.mlp = MLP(sizes, act=act, dropout=dropout, norm=None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.mlp is not None:
            self.mlp.reset_parameters()

    def _check(self, z: Tensor, name: str) -> None:
        if z.size(-1) != self.channels:
            raise ValueError(f"expected {name} with {self.channels} channels in the last "
                             f"dimension, got shape {tuple(z.shape)}")

    def forward(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        r"""Scores :math:`(*)` of the pairs ``(z_src[...], z_dst[...])``, :math:`(*, C)` each
        (broadcasting)."""
        self._check(z_src, 'z_src')
        self._check(z_dst, 'z_dst')
        h = z_src * z_dst
        if self.mlp is None:
            return h.sum(-1)
        return self.mlp(h.reshape(-1, self.channels)).view(h.shape[:-1])

    def score_candidates(self, z_src: Tensor, z_cand: Tensor) -> Tensor:
        r"""Scores :math:`(P, K)` of every source ``z_src[p]`` :math:`(P, C)` with each of its
        candidates ``z_cand[p, k]`` :math:`(P, K, C)`."""
        if z_src.dim() != 2 or z_cand.dim() != 3 or z_cand.size(0) != z_src.size(0):
            raise ValueError(f"expected z_src [P, C] and z_cand [P, K, C], got "
                             f"{tuple(z_src.shape)} and {tuple(z_cand.shape)}")
        self._check(z_src, 'z_src')
        self._check(z_cand, 'z_cand')
        if self.mlp is None:  # one batched product, no [P, K, C] temporary
            return torch.bmm(z_cand, z_src.unsqueeze(-1)).squeeze(-1)
        P, K, C = z_cand.shape
        step = max(1, self.chunk_size // max(K * C, 1))
        return torch.cat([self(z_src[i:i + step].unsqueeze(1), z_cand[i:i + step])
                          for i in range(0, P, step)]) if P > 0 else z_cand.new_zeros(0, K)

    def __repr__(self) -> str:
        extra = '' if self.mlp is None else (f', hidden_channels={self.hidden_channels}, '
                                             f'num_layers={self.num_layers}')
        return f'{self.__class__.__name__}({self.channels}, decoder={self.decoder!r}{extra})'
