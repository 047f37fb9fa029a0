r"""SAMSA transformer blocks and a small graph-level SAMSA model
(SAMSA paper, Sec. 4.3-4.4, Algorithm 1, App. C)."""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor
from torch.nn import Dropout, Linear, Parameter, RMSNorm, Sequential
from torch_geometric.data.data import BaseData
from torch_geometric.nn import MLP
from torch_geometric.nn.resolver import activation_resolver, aggregation_resolver
from torch_geometric.typing import OptTensor

from pyg_grf._validation import check_shape
from pyg_grf.nn.attention.samsa import SAMSAAttention
from pyg_grf.nn.encoders.graph_bridge import GraphBridge


def drop_path(x: Tensor, p: float, batch: OptTensor = None, training: bool = True) -> Tensor:
    r"""Stochastic depth per graph: zeroes the residual branch :obj:`x` :math:`(N, F)` of a whole
    graph with probability :obj:`p` and rescales the kept ones by :math:`1 / (1 - p)`."""
    if not training or p == 0.:
        return x
    if batch is None:
        keep = x.new_empty(1).bernoulli_(1. - p).expand(x.size(0))
    else:
        num_graphs = int(batch.max()) + 1 if batch.numel() > 0 else 0
        keep = x.new_empty(num_graphs).bernoulli_(1. - p)[batch]
    return x * keep.unsqueeze(-1) / (1. - p)


class SAMSABlock(torch.nn.Module):
    r"""One pre-RMSNorm SAMSA transformer layer from the *"SAMSA: Efficient Transformer for Many
    Data Modalities"* (TMLR submission, under review) paper (Algorithm 1, Sec. 4.4):

    .. math::
        \mathbf{X} &\leftarrow \mathbf{X} + \alpha \cdot \mathrm{DropPath}\big(
        \mathrm{SAMSA}(\mathrm{RMSNorm}(\mathbf{X}))\big)

        \mathbf{X} &\leftarrow \mathbf{X} + \alpha \cdot \mathrm{DropPath}\big(
        \mathrm{FFN}(\mathrm{RMSNorm}(\mathbf{X}))\big)

    with a zero-initialised scalar :math:`\alpha` (ReZero-style) that is *shared by all layers*
    of a network: build it once and pass the same :class:`~torch.nn.Parameter` to every block.

    Args:
        channels (int): Size of each token.
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        num_samples (int, optional): Key/value tokens :math:`k` kept per head and graph.
            (default: :obj:`32`)
        mode (str, optional): :obj:`"hard"` or :obj:`"soft"` sampling. (default: :obj:`"hard"`)
        ffn_channels (int, optional): Hidden size of the FFN; :obj:`None` uses
            :obj:`4 * channels`. (default: :obj:`None`)
        dropout (float, optional): Dropout of the attention weights and in the FFN.
            (default: :obj:`0.`)
        drop_path (float, optional): Probability of dropping a residual branch of a graph.
            (default: :obj:`0.`)
        residual_scale (torch.nn.Parameter, optional): The shared scalar :math:`\alpha`; if
            :obj:`None`, the block creates (and owns) its own, initialised to zero.
            (default: :obj:`None`)
        act (str or Callable, optional): Activation of the FFN. (default: :obj:`"gelu"`)
        **kwargs (optional): Additional arguments of
            :class:`~pyg_grf.nn.attention.samsa.SAMSAAttention` (e.g. :obj:`num_support`,
            :obj:`tau`).

    Shapes:
        - **input:** tokens :math:`(N, F)`, batch vector :math:`(N)` *(optional)*
        - **output:** tokens :math:`(N, F)`
    """
    def __init__(
        self,
        channels: int,
        heads: int = 1,
        num_samples: int = 32,
        mode: str = 'hard',
        ffn_channels: Optional[int] = None,
        dropout: float = 0.,
        drop_path: float = 0.,
        residual_scale: Optional[Parameter] = None,
        act: Union[str, Callable, None] = 'gelu',
        **kwargs,
    ):
        super().__init__()
        if not 0. <= drop_path < 1.:
            raise ValueError(f"'drop_path' must be in [0, 1) (got {drop_path})")
        if residual_scale is not None and residual_scale.numel() != 1:
            raise ValueError(f"'residual_scale' must be a scalar parameter "
                             f"(got shape {list(residual_scale.shape)})")
        self.channels = channels
        self.heads = heads
        self.num_samples = num_samples
        self.mode = mode
        self.ffn_channels = 4 * channels if ffn_channels is None else ffn_channels
        self.dropout = dropout
        self.drop_path = drop_path
        self.act = act
        self.owns_residual_scale = residual_scale is None
        self.residual_scale = (Parameter(torch.zeros(())) if residual_scale is None
                               else residual_scale)

        self.norm1 = RMSNorm(channels)
        self.attn = SAMSAAttention(channels, heads=heads, num_samples=num_samples, mode=mode,
                                   dropout=dropout, **kwargs)
        self.norm2 = RMSNorm(channels)
        self.ffn = Sequential(
            Linear(channels, self.ffn_channels),
            activation_resolver(act),
            Dropout(dropout),
            Linear(self.ffn_channels, channels),
            Dropout(dropout),
        )
        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module (the shared residual scale only if
        this block owns it)."""
        self.norm1.reset_parameters()
        self.attn.reset_parameters()
        self.norm2.reset_parameters()
        for module in self.ffn:
            if hasattr(module, 'reset_parameters'):
                module.reset_parameters()
        if self.owns_residual_scale:
            with torch.no_grad():
                self.residual_scale.zero_()

    def forward(self, x: Tensor, batch: OptTensor = None) -> Tensor:
        r"""Runs the forward pass of the module."""
        alpha = self.residual_scale
        # Sampling attention on the normalised tokens (Alg. 1, lines 2-15):
        h = self.attn(self.norm1(x), batch)
        x = x + alpha * drop_path(h, self.drop_path, batch, self.training)
        # Feed-forward network (Alg. 1, lines 16-17):
        h = self.ffn(self.norm2(x))
        return x + alpha * drop_path(h, self.drop_path, batch, self.training)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.channels}, heads={self.heads}, '
                f'num_samples={self.num_samples}, mode={self.mode!r})')


class SAMSAModel(torch.nn.Module):
    r"""A graph-level SAMSA network from the *"SAMSA: Efficient Transformer for Many Data
    Modalities"* (TMLR submission, under review) paper (Sec. 4.3-4.4, App. C): Graph-Bridge tokens
    (nodes and edges) :math:`\rightarrow` :obj:`num_layers` :class:`SAMSABlock` layers sharing one
    zero-initialised residual scale :math:`\rightarrow` final RMSNorm :math:`\rightarrow` the node
    tokens :math:`\rightarrow` graph pooling :math:`\rightarrow` an MLP head.

    Args:
        in_channels (int): Size of each node feature (after :obj:`node_encoder`, if given).
        hidden_channels (int): Token width :math:`d_{\mathrm{model}}`.
        out_channels (int): Size of each graph-level output.
        num_layers (int): Number of SAMSA blocks.
        edge_channels (int, optional): Size of each edge feature (after :obj:`edge_encoder`,
            if given); :obj:`None` for no edge features. (default: :obj:`None`)
        heads (int, optional): Attention heads. (default: :obj:`8`)
        num_samples (int, optional): Key/value tokens :math:`k` per head and graph.
            (default: :obj:`32`)
        mode (str, optional): :obj:`"hard"` or :obj:`"soft"` sampling. (default: :obj:`"hard"`)
        ffn_channels (int, optional): FFN hidden size; :obj:`None` uses
            :obj:`4 * hidden_channels`. (default: :obj:`None`)
        dropout (float, optional): Dropout in attention, FFN and head. (default: :obj:`0.`)
        drop_path (float, optional): Drop-path probability of every block. (default: :obj:`0.`)
        pe_channels (int, optional): Width of each Graph-Bridge noise set. (default: :obj:`16`)
        pool (str, optional): Aggregation over the node tokens of a graph (any PyG
            aggregation name). (default: :obj:`"mean"`)
        node_encoder (torch.nn.Module, optional): Applied to :obj:`x` first (e.g. OGB's
            :obj:`AtomEncoder` for molecules). (default: :obj:`None`)
        edge_encoder (torch.nn.Module, optional): Applied to :obj:`edge_attr` first (e.g.
            :obj:`BondEncoder`). (default: :obj:`None`)
        graph_bridge_kwargs (dict, optional): Additional arguments of :class:`GraphBridge`.
            (default: :obj:`None`)
        **kwargs (optional): Additional arguments of :class:`SAMSABlock` /
            :class:`~pyg_grf.nn.attention.samsa.SAMSAAttention`.

    Shapes:
        - **input:** node features :math:`(N, F)`, edge indices :math:`(2, E)`, edge features
          :math:`(E, G)` *(optional)*, batch vector :math:`(N)` *(optional)*, token types
          :math:`(N + E)` *(optional, from* :class:`~pyg_grf.transforms.AddGraphBridgeTokens` *)*;
          or a single :class:`~torch_geometric.data.Batch` holding them
        - **output:** :math:`(B, \mathrm{out\_channels})`
    """
    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int,
        edge_channels: Optional[int] = None,
        heads: int = 8,
        num_samples: int = 32,
        mode: str = 'hard',
        ffn_channels: Optional[int] = None,
        dropout: float = 0.,
        drop_path: float = 0.,
        pe_channels: int = 16,
        pool: str = 'mean',
        node_encoder: Optional[torch.nn.Module] = None,
        edge_encoder: Optional[torch.nn.Module] = None,
        graph_bridge_kwargs: Optional[dict] = None,
        **kwargs,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"'num_layers' must be at least 1 (got {num_layers})")
        self.in_channels = in_channels
        self.hidden_channels = hidden_channels
        self.out_channels = out_channels
        self.num_layers = num_layers
        self.edge_channels = edge_channels
        self.heads = heads
        self.num_samples = num_samples
        self.mode = mode
        self.ffn_channels = ffn_channels
        self.dropout = dropout
        self.drop_path = drop_path
        self.pe_channels = pe_channels
        self.pool = pool
        self.node_encoder = node_encoder
        self.edge_encoder = edge_encoder
        self.graph_bridge_kwargs = graph_bridge_kwargs

        self.graph_bridge = GraphBridge(in_channels, hidden_channels, edge_channels,
                                        pe_channels=pe_channels, **(graph_bridge_kwargs or {}))
        # the residual scale alpha shared by every block (Sec. 4.4)
        self.residual_scale = Parameter(torch.zeros(()))
        self.blocks = torch.nn.ModuleList([
            SAMSABlock(hidden_channels, heads=heads, num_samples=num_samples, mode=mode,
                       ffn_channels=ffn_channels, dropout=dropout, drop_path=drop_path,
                       residual_scale=self.residual_scale, **kwargs)
            for _ in range(num_layers)
        ])
        self.norm = RMSNorm(hidden_channels)
        self.aggr = aggregation_resolver(pool)
        self.head = MLP([hidden_channels, hidden_channels, out_channels], act='gelu',
                        dropout=dropout, norm=None)
        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        for encoder in (self.node_encoder, self.edge_encoder):
            if encoder is not None and hasattr(encoder, 'reset_parameters'):
                encoder.reset_parameters()
        self.graph_bridge.reset_parameters()
        with torch.no_grad():
            self.residual_scale.zero_()
        for block in self.blocks:
            block.reset_parameters()
        self.norm.reset_parameters()
        if hasattr(self.aggr, 'reset_parameters'):
            self.aggr.reset_parameters()
        self.head.reset_parameters()

    def forward(
        self,
        x: Union[Tensor, BaseData],
        edge_index: OptTensor = None,
        edge_attr: OptTensor = None,
        batch: OptTensor = None,
        token_type: OptTensor = None,
    ) -> Tensor:
        r"""Runs the forward pass of the module. :obj:`x` may also be a whole PyG
        :class:`~torch_geometric.data.Data` / :class:`~torch_geometric.data.Batch` (as the
        LightningModules of :mod:`pyg_grf.lightning` call their model); then its :obj:`x`,
        :obj:`edge_index`, :obj:`edge_attr`, :obj:`batch` and :obj:`token_type` are used."""
        noise = None
        if isinstance(x, BaseData):
            data = x
            noise = data.get('bridge_noise')  # from AddGraphBridgeTokens(pe_dim=...), if stored
            x, edge_index = data.x, data.edge_index
            edge_attr = data.get('edge_attr') if edge_attr is None else edge_attr
            batch = data.get('batch') if batch is None else batch
            token_type = data.get('token_type') if token_type is None else token_type
        check_shape(edge_index, 'edge_index', 2, 'E')
        # Encode raw features (e.g. categorical atom/bond features):
        if self.node_encoder is not None:
            x = self.node_encoder(x)
        if self.edge_encoder is not None and edge_attr is not None:
            edge_attr = self.edge_encoder(edge_attr)
        # Nodes and edges become tokens (Sec. 4.3):
        tokens, token_batch, token_type = self.graph_bridge(x, edge_index, edge_attr, batch,
                                                            token_type, noise=noise)
        # SAMSA blocks with per-graph sampling (Sec. 4.4):
        for block in self.blocks:
            tokens = block(tokens, token_batch)
        tokens = self.norm(tokens)
        # Read the node tokens back and pool them per graph:
        h = GraphBridge.node_tokens(tokens, token_type)
        if batch is None:
            batch = edge_index.new_zeros(h.size(0))
        h = self.aggr(h, batch, dim_size=int(batch.max()) + 1 if batch.numel() > 0 else 1)
        return self.head(h)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, {self.hidden_channels}, '
                f'{self.out_channels}, num_layers={self.num_layers}, heads={self.heads}, '
                f'num_samples={self.num_samples}, mode={self.mode!r})')
