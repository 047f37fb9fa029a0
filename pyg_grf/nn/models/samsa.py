r"""SAMSA transformer blocks and a small graph-level SAMSA model
(SAMSA paper, Sec. 4.3-4.4, Algorithm 1, App. C)."""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor
from torch.nn import Dropout, Linear, Parameter, RMSNorm, Sequential
from torch_geometric.data.data import BaseData
from torch_geometric.nn import MLP
from torch_geometric.nn.inits import reset
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
        heads, num_samples, mode: as :class:`~pyg_grf.nn.attention.samsa.SAMSAAttention`.
        ffn_channels (int, optional): Hidden size of the FFN. (default: :obj:`4 * channels`)
        dropout (float, optional): Dropout of the attention weights and in the FFN.
            (default: :obj:`0.`)
        drop_path (float, optional): Probability of dropping a residual branch of a graph.
            (default: :obj:`0.`)
        residual_scale (torch.nn.Parameter, optional): The shared scalar :math:`\alpha`;
            :obj:`None`: the block owns its own, initialised to zero. (default: :obj:`None`)
        act (str or Callable, optional): Activation of the FFN. (default: :obj:`"gelu"`)
        **kwargs (optional): Further arguments of
            :class:`~pyg_grf.nn.attention.samsa.SAMSAAttention` (e.g. :obj:`tau`).
    """
    def __init__(self, channels: int, heads: int = 1, num_samples: int = 32, mode: str = 'hard',
                 ffn_channels: Optional[int] = None, dropout: float = 0., drop_path: float = 0.,
                 residual_scale: Optional[Parameter] = None,
                 act: Union[str, Callable, None] = 'gelu', **kwargs):
        super().__init__()
        if not 0. <= drop_path < 1.:
            raise ValueError(f"'drop_path' must be in [0, 1) (got {drop_path})")
        if residual_scale is not None and residual_scale.numel() != 1:
            raise ValueError(f"'residual_scale' must be a scalar parameter "
                             f"(got shape {list(residual_scale.shape)})")
        self.channels, self.heads, self.num_samples, self.mode = channels, heads, num_samples, mode
        self.drop_path = drop_path
        ffn_channels = 4 * channels if ffn_channels is None else ffn_channels
        self.owns_residual_scale = residual_scale is None
        self.residual_scale = (Parameter(torch.zeros(())) if residual_scale is None
                               else residual_scale)

        self.norm1 = RMSNorm(channels)
        self.attn = SAMSAAttention(channels, heads=heads, num_samples=num_samples, mode=mode,
                                   dropout=dropout, **kwargs)
        self.norm2 = RMSNorm(channels)
        self.ffn = Sequential(Linear(channels, ffn_channels), activation_resolver(act),
                              Dropout(dropout), Linear(ffn_channels, channels), Dropout(dropout))
        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module (the shared residual scale only if
        this block owns it)."""
        for module in (self.norm1, self.attn, self.norm2, self.ffn):
            reset(module)
        if self.owns_residual_scale:
            with torch.no_grad():
                self.residual_scale.zero_()

    def forward(self, x: Tensor, batch: OptTensor = None) -> Tensor:
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
        edge_channels (int, optional): Size of each edge feature (after :obj:`edge_encoder`);
            :obj:`None` for no edge features. (default: :obj:`None`)
        heads, num_samples, mode, ffn_channels, drop_path: as :class:`SAMSABlock`.
            (default: :obj:`8`, :obj:`32`, :obj:`"hard"`, :obj:`None`, :obj:`0.`)
        dropout (float, optional): Dropout in attention, FFN and head. (default: :obj:`0.`)
        pe_channels (int, optional): Width of each Graph-Bridge noise set. (default: :obj:`16`)
        pool (str, optional): A PyG aggregation over the node tokens of a graph.
            (default: :obj:`"mean"`)
        node_encoder, edge_encoder (torch.nn.Module, optional): Applied to :obj:`x` /
            :obj:`edge_attr` first (e.g. OGB's :obj:`AtomEncoder` / :obj:`BondEncoder`).
            (default: :obj:`None`)
        graph_bridge_kwargs (dict, optional): Further arguments of :class:`GraphBridge`.
        **kwargs (optional): Further arguments of :class:`SAMSABlock`.

    The input is a :class:`~torch_geometric.data.Batch` or its tensors (``token_type`` from
    :class:`~pyg_grf.transforms.AddGraphBridgeTokens` optional); the output is
    :math:`(B, \mathrm{out\_channels})`.
    """
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, edge_channels: Optional[int] = None, heads: int = 8,
                 num_samples: int = 32, mode: str = 'hard', ffn_channels: Optional[int] = None,
                 dropout: float = 0., drop_path: float = 0., pe_channels: int = 16,
                 pool: str = 'mean', node_encoder: Optional[torch.nn.Module] = None,
                 edge_encoder: Optional[torch.nn.Module] = None,
                 graph_bridge_kwargs: Optional[dict] = None, **kwargs):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"'num_layers' must be at least 1 (got {num_layers})")
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers = out_channels, num_layers
        self.heads, self.num_samples, self.mode = heads, num_samples, mode
        self.node_encoder, self.edge_encoder = node_encoder, edge_encoder

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
        for module in (self.node_encoder, self.edge_encoder, self.graph_bridge, *self.blocks,
                       self.norm, self.aggr, self.head):
            if hasattr(module, 'reset_parameters'):
                module.reset_parameters()
        with torch.no_grad():
            self.residual_scale.zero_()

    def forward(self, x: Union[Tensor, BaseData], edge_index: OptTensor = None,
                edge_attr: OptTensor = None, batch: OptTensor = None,
                token_type: OptTensor = None) -> Tensor:
        r""":obj:`x` may also be a whole :class:`~torch_geometric.data.Batch` (as the
        LightningModules call their model), which then gives the other arguments."""
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
