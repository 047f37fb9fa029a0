r"""Graph-Bridge: nodes and edges as tokens with a randomised positional encoding
(SAMSA paper, Sec. 4.3 and App. D)."""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn import MLP
from torch_geometric.typing import OptTensor

from pyg_grf._validation import batch_or_zeros, check_shape

EVAL_NOISE = ('structural', 'seeded', 'zero', 'random')

# Integer hashing modulo the Mersenne prime 2^31 - 1; every product stays below 2^62.
_P = 2**31 - 1


def _mix(h: Tensor) -> Tensor:
    r"""A deterministic integer mixer on int64 values in :math:`[0, 2^{32})`; returns values
    in :math:`[0, 2^{31} - 1)`."""
    h = (h * 1_103_515_245 + 12_345) % _P
    h = h ^ (h >> 13)
    h = (h * 747_796_405 + 2_891_336_453) % _P
    h = h ^ (h >> 16)
    return (h * 277_803_737) % _P


def structural_hash(x: Tensor, edge_index: Tensor, num_nodes: int, rounds: int = 3,
                    seed: int = 0) -> Tensor:
    r"""A permutation-equivariant integer label of every node: a hash of the node's features
    refined by :obj:`rounds` rounds of colour refinement (1-WL) over in- and out-neighbours.
    Relabelling the nodes permutes the labels the same way; the result does not depend on which
    other graphs share the mini-batch.

    ``x`` is :math:`(N, F)` or :math:`(N)` (float or integer); returns int64 labels
    :math:`(N)` in :math:`[0, 2^{31} - 1)`, salted by ``seed``.
    """
    if num_nodes == 0:  # an empty graph (or batch): no labels
        return torch.zeros(0, dtype=torch.long, device=x.device)
    x = x.view(num_nodes, -1)
    if x.is_floating_point():
        bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.long)
    else:
        bits = x.to(torch.long)
    bits = bits % _P
    salt = _mix(torch.arange(1, bits.size(1) + 1, device=x.device) * 2_654_435_761 % _P)
    h = _mix(_mix(bits + salt.view(1, -1)).sum(dim=1) % _P + seed % _P)
    src, dst = edge_index[0], edge_index[1]
    for _ in range(rounds):
        m_in = torch.zeros_like(h).index_add_(0, dst, _mix(h[src] + 97)) % _P
        m_out = torch.zeros_like(h).index_add_(0, src, _mix(h[dst] + 193)) % _P
        h = _mix((_mix(h) * 31 + _mix(m_in) * 7 + _mix(m_out + 11)) % _P)
    return h


def hashed_normal(label: Tensor, channels: int, seed: int = 0,
                  dtype: torch.dtype = torch.float32) -> Tensor:
    r"""Standard normal noise :math:`(N, C)` that is a deterministic function of the integer
    :obj:`label` :math:`(N)` of every row (Box-Muller on hashed uniforms): equal labels give
    equal rows."""
    c = torch.arange(channels, device=label.device).view(1, -1)
    base = _mix(label.view(-1, 1) + seed % _P)
    u1 = (_mix(base + c * 40_503 + 1).to(torch.float64) + 1.) / _P  # (0, 1]
    u2 = _mix(base + c * 69_069 + 7_919).to(torch.float64) / _P  # [0, 1)
    out = torch.sqrt(-2. * torch.log(u1)) * torch.cos(2. * math.pi * u2)
    return out.to(dtype)


class GraphBridge(torch.nn.Module):
    r"""The Graph-Bridge positional encoding and tokeniser from the *"SAMSA: Efficient Transformer
    for Many Data Modalities"* (TMLR submission, under review) paper (Sec. 4.3, App. D): every node
    *and* every edge becomes a token.

    Node :math:`i` gets a random positional encoding made of two sets of Gaussian noise with
    learned per-channel scales, plus an MLP of its features; an edge gets the difference of its
    endpoints' encodings, which keeps its direction:

    .. math::
        \mathbf{p}_i = \left[ \boldsymbol{\epsilon}_i^{(1)} \odot
        \mathrm{softplus}(\mathbf{s}^{(1)}) \,\Vert\, \boldsymbol{\epsilon}_i^{(2)} \odot
        \mathrm{softplus}(\mathbf{s}^{(2)}) \right] + \phi(\mathbf{x}_i), \qquad
        \boldsymbol{\epsilon}_i^{(\cdot)} \sim \mathcal{N}(\mathbf{0}, \mathbf{I}),

        \mathbf{p}_{ij} = \mathbf{p}_i - \mathbf{p}_j, \qquad
        \mathbf{h}_i = \phi_V([\mathbf{x}_i \Vert \mathbf{p}_i]), \qquad
        \mathbf{h}_{ij} = \phi_E([\mathbf{e}_{ij} \Vert \mathbf{p}_{ij}]),

    for an edge :math:`(i, j)` stored as :obj:`edge_index[:, e] = [i, j]`.

    Tokens are laid out graph by graph: the node tokens of graph :math:`g` in node order, then
    its edge tokens in edge order (:meth:`node_tokens` reads the node tokens back); the
    :obj:`token_type` of :class:`~pyg_grf.transforms.AddGraphBridgeTokens` gives the same
    layout without a sort.

    Training mode draws fresh noise :math:`\boldsymbol{\epsilon}` at every call, as the paper
    does, unless :obj:`noise` is passed (e.g. drawn once per graph by
    :class:`~pyg_grf.transforms.AddGraphBridgeTokens` with :obj:`pe_dim=2 * pe_channels`).
    Evaluation mode without :obj:`noise` follows :obj:`eval_noise`:

    * :obj:`"structural"`: a fixed function (seeded by :obj:`seed`) of a colour-refinement hash
      of the node's features and neighbourhood (:func:`structural_hash`): deterministic,
      permutation-equivariant and independent of the mini-batch;
    * :obj:`"seeded"`: a fixed noise table indexed by the node's position inside its graph
      (not permutation-equivariant);
    * :obj:`"zero"`: the mean :math:`\boldsymbol{\epsilon} = \mathbf{0}`;
    * :obj:`"random"`: fresh noise as in training.

    Args:
        in_channels (int): Size of each node feature.
        out_channels (int): Size of each token.
        edge_channels (int, optional): Size of each edge feature; :obj:`None` for none.
            (default: :obj:`None`)
        pe_channels (int, optional): Width of each of the two noise sets. (default: :obj:`16`)
        hidden_channels, num_layers, act, dropout: of the MLPs :math:`\phi, \phi_V, \phi_E`.
            (default: :obj:`out_channels`, :obj:`2`, :obj:`"gelu"`, :obj:`0.`)
        eval_noise (str, optional): See above. (default: :obj:`"structural"`)
        seed (int, optional): Seed of the evaluation noise. (default: :obj:`0`)
        hash_rounds (int, optional): Colour-refinement rounds of :obj:`"structural"` noise.
            (default: :obj:`3`)
    """

    def __init__(self, in_channels: int, out_channels: int, edge_channels: Optional[int] = None,
                 pe_channels: int = 16, hidden_channels: Optional[int] = None,
                 num_layers: int = 2, act: Union[str, Callable, None] = 'gelu',
                 dropout: float = 0., eval_noise: str = 'structural', seed: int = 0,
                 hash_rounds: int = 3):
        super().__init__()
        if in_channels < 1 or out_channels < 1 or pe_channels < 1:
            raise ValueError(f"'in_channels', 'out_channels' and 'pe_channels' must be positive "
                             f"(got {in_channels}, {out_channels}, {pe_channels})")
        if edge_channels is not None and edge_channels < 1:
            raise ValueError(f"'edge_channels' must be positive or None (got {edge_channels})")
        if num_layers < 1:
            raise ValueError(f"'num_layers' must be at least 1 (got {num_layers})")
        if eval_noise not in EVAL_NOISE:
            raise ValueError(f"Unknown eval_noise '{eval_noise}' (expected one of {EVAL_NOISE})")

        self.in_channels, self.out_channels = in_channels, out_channels
        self.edge_channels, self.pe_channels = edge_channels, pe_channels
        self.eval_noise, self.seed, self.hash_rounds = eval_noise, seed, hash_rounds
        P = 2 * pe_channels
        hidden = [out_channels if hidden_channels is None else hidden_channels] * (num_layers - 1)

        def mlp(cin: int, cout: int) -> MLP:
            return MLP([cin] + hidden + [cout], act=act, dropout=dropout, norm=None)

        # raw scales s^(1), s^(2) of the two noise sets (softplus keeps them positive)
        self.pe_scale_1 = Parameter(torch.empty(pe_channels))
        self.pe_scale_2 = Parameter(torch.empty(pe_channels))
        self.pe_mlp = mlp(in_channels, P)  # phi
        self.node_mlp = mlp(in_channels + P, out_channels)  # phi_V
        self.edge_mlp = mlp((edge_channels or 0) + P, out_channels)  # phi_E

        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        # softplus(s) = 1 at initialisation: unit-variance noise
        for scale in (self.pe_scale_1, self.pe_scale_2):
            torch.nn.init.constant_(scale, math.log(math.e - 1.))
        for mlp in (self.pe_mlp, self.node_mlp, self.edge_mlp):
            mlp.reset_parameters()

    def noise(self, x: Tensor, edge_index: Tensor, batch: OptTensor = None) -> Tensor:
        r"""The unscaled noise :math:`[\boldsymbol{\epsilon}^{(1)} \Vert
        \boldsymbol{\epsilon}^{(2)}]` of shape :math:`(N, 2 \cdot \mathrm{pe\_channels})` for
        the current mode (see :obj:`eval_noise`)."""
        N, P = x.size(0), 2 * self.pe_channels
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        if self.training or self.eval_noise == 'random':
            return torch.randn(N, P, dtype=dtype, device=x.device)
        if self.eval_noise == 'zero':
            return torch.zeros(N, P, dtype=dtype, device=x.device)
        if self.eval_noise == 'structural':
            label = structural_hash(x, edge_index, N, self.hash_rounds, self.seed)
            return hashed_normal(label, P, self.seed, dtype)
        # 'seeded': a fixed table indexed by the node's position inside its graph
        if batch is None or N == 0:
            local = torch.arange(N, device=x.device)
        else:
            counts = torch.bincount(batch)
            ptr = torch.cumsum(counts, 0) - counts
            local = torch.arange(N, device=x.device) - ptr[batch]
        size = int(local.max()) + 1 if N > 0 else 0
        gen = torch.Generator(device=x.device).manual_seed(self.seed)
        table = torch.randn(size, P, generator=gen, device=x.device, dtype=dtype)
        return table[local]

    def positional_encoding(self, x: Tensor, edge_index: Tensor, batch: OptTensor = None,
                            noise: OptTensor = None) -> Tuple[Tensor, Tensor]:
        r"""Returns the node encodings :math:`\mathbf{p}_i` :math:`(N, 2 \cdot
        \mathrm{pe\_channels})` and the edge encodings :math:`\mathbf{p}_{ij} = \mathbf{p}_i -
        \mathbf{p}_j` :math:`(E, 2 \cdot \mathrm{pe\_channels})`, from the given unscaled
        :obj:`noise` if any, else from :meth:`noise`."""
        x = self._check_x(x)
        scale = F.softplus(torch.cat([self.pe_scale_1, self.pe_scale_2]))
        N, P = x.size(0), 2 * self.pe_channels
        if noise is None:
            noise = self.noise(x, edge_index, batch)
        elif not isinstance(noise, Tensor) or not noise.is_floating_point():
            raise TypeError(f"Expected 'noise' to be a floating-point tensor (got "
                            f"{getattr(noise, 'dtype', type(noise).__name__)})")
        elif noise.shape != (N, P):
            raise ValueError(f"Expected 'noise' of shape [{N}, {P}] (one row of "
                             f"2 * pe_channels = {P} entries per node; use "
                             f"AddGraphBridgeTokens(pe_dim={P})) (got {list(noise.shape)})")
        node_pe = noise.to(scale.dtype) * scale + self.pe_mlp(x.to(scale.dtype))
        edge_pe = node_pe[edge_index[0]] - node_pe[edge_index[1]]
        return node_pe, edge_pe

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: OptTensor = None,
                batch: OptTensor = None, token_type: OptTensor = None,
                noise: OptTensor = None) -> Tuple[Tensor, Tensor, Tensor]:
        r"""Returns :obj:`(tokens, token_batch, token_type)`, :math:`(N + E, C)`, :math:`(N + E)`
        and :math:`(N + E)` (:obj:`0` node, :obj:`1` edge). :obj:`edge_attr` is required if and
        only if :obj:`edge_channels` is set; :obj:`batch` must be sorted; :obj:`token_type` (from
        :class:`~pyg_grf.transforms.AddGraphBridgeTokens`) skips a sort; :obj:`noise` is the
        unscaled :math:`[\boldsymbol{\epsilon}^{(1)} \Vert \boldsymbol{\epsilon}^{(2)}]` to
        use instead of a draw (e.g. :obj:`batch.bridge_noise`)."""
        x = self._check_x(x)
        N = x.size(0)
        check_shape(edge_index, 'edge_index', 2, 'E')
        E = edge_index.size(1)
        if batch is not None:
            check_shape(batch, 'batch', N)
        if self.edge_channels is None and edge_attr is not None:
            raise ValueError("Got 'edge_attr' but the module was built with "
                             "'edge_channels=None'")
        if self.edge_channels is not None:
            if edge_attr is not None and edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            check_shape(edge_attr, 'edge_attr', 'E' if edge_attr is None else E,
                        self.edge_channels)

        # Positional encodings of nodes and edges (Sec. 4.3):
        node_pe, edge_pe = self.positional_encoding(x, edge_index, batch, noise)

        # Node and edge tokens in a common width:
        h_node = self.node_mlp(torch.cat([x.to(node_pe.dtype), node_pe], dim=-1))
        if edge_attr is not None:
            edge_pe = torch.cat([edge_attr.to(edge_pe.dtype), edge_pe], dim=-1)
        h_edge = self.edge_mlp(edge_pe)

        # Lay the tokens out graph by graph: nodes of graph g, then edges of graph g.
        batch = batch_or_zeros(batch, N, edge_index.device)
        edge_batch = batch[edge_index[0]]
        if token_type is None:
            token_batch = torch.cat([batch, edge_batch])
            perm = torch.argsort(token_batch, stable=True)
            token_type = torch.cat([batch.new_zeros(N), batch.new_ones(E)])[perm]
            return torch.cat([h_node, h_edge])[perm], token_batch[perm], token_type

        check_shape(token_type, 'token_type', N + E)
        is_node = token_type == 0
        tokens = h_node.new_empty(N + E, h_node.size(-1))
        tokens[is_node] = h_node
        tokens[~is_node] = h_edge
        token_batch = batch.new_empty(N + E)
        token_batch[is_node] = batch
        token_batch[~is_node] = edge_batch
        return tokens, token_batch, token_type

    @staticmethod
    def node_tokens(tokens: Tensor, token_type: Tensor) -> Tensor:
        r"""Reads the node tokens :math:`(N, C)` back out of :obj:`tokens`, in node order."""
        return tokens[token_type == 0]

    def _check_x(self, x: Tensor) -> Tensor:
        x = x.view(-1, 1) if x.dim() == 1 else x
        check_shape(x, 'x', 'N', self.in_channels)
        return x

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.out_channels}, '
                f'edge_channels={self.edge_channels}, pe_channels={self.pe_channels}, '
                f'eval_noise={self.eval_noise!r})')
