r"""A graph transformer: encoders, ``num_layers`` x :class:`~pyg_grf.nn.GRFGPSConv`, readout
(options and their checks: :mod:`pyg_grf.nn.models.options`)."""
from __future__ import annotations

import copy
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Linear
from torch_geometric.nn import GATConv, GINConv, GINEConv
from torch_geometric.nn.conv import MessagePassing

from pyg_grf._validation import batch_or_zeros
from pyg_grf.nn.attention.base import GraphAttention, model_payload
from pyg_grf.nn.conv.grf_gps_conv import GRFGPSConv, norm_resolver
from pyg_grf.nn.models.options import (
    POOLINGS,
    check_conv,
    check_options,
    embed,
    encoder,
    two_layer_mlp,
)


class GraphTransformer(torch.nn.Module):
    r"""A graph transformer with the topology-aware linear-cost attention of the `"Linear
    Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Sec. 4), in GPS-style blocks as in
    :class:`torch_geometric.nn.conv.GPSConv`, pre-norm by default
    (``block='pre_norm'``):

    .. math::
        \mathbf{x}^{(l+1)} = \mathbf{y} + \mathrm{FFN}(\mathrm{Norm}(\mathbf{y})), \quad
        \mathbf{y} = \mathbf{x}^{(l)} + \mathrm{Attn}_M(\mathrm{Norm}(\mathbf{x}^{(l)}))
        + \mathrm{MPNN}(\mathrm{Norm}(\mathbf{x}^{(l)}))

    or with ``block='gps'`` the post-norm layout of :class:`~torch_geometric.nn.conv.GPSConv`
    (no final norm); every layer is a :class:`~pyg_grf.nn.GRFGPSConv`. The attentions' payload
    is built once per batch for all layers (:func:`~pyg_grf.nn.attention.base.model_payload`),
    in the loader's workers with :class:`pyg_grf.loader.DataLoader` (``model=``).

    Args:
        in_channels (int): node feature size (for ``node_encoder='linear'``; the number of
            categories for ``'embedding'``; ignored for ``'atom'``).
        hidden_channels (int): hidden size.
        out_channels (int): output size (classes, labels or targets).
        num_layers (int): number of blocks.
        heads (int, optional): attention heads (default: :obj:`1`).
        attn_type (str or type, optional): the attention of every layer: a name of
            :data:`~pyg_grf.nn.attention.registry.ATTENTIONS`, a
            :class:`~pyg_grf.nn.attention.GraphAttention` subclass (built as
            ``cls(hidden_channels, heads=heads, dropout=attn_dropout, **attn_kwargs)``), or
            :obj:`None` for none (a pure MPNN) (default: :obj:`'grf'`).
        attn_kwargs (dict, optional): arguments of the attention layer, e.g.
            ``{'max_length': 4}`` (default: :obj:`None`).
        conv (str or MessagePassing, optional): the local message passing: ``'gine'`` (needs
            edge features), ``'gin'``, ``'gat'``, a
            :class:`~torch_geometric.nn.conv.MessagePassing` instance mapping
            ``hidden_channels`` to ``hidden_channels`` (every layer gets a reset deep copy, and
            the encoded ``edge_attr`` when its ``forward`` takes one) or :obj:`None`
            (default: :obj:`None`).
        pe (str, optional): positional encoding: ``'rwpe'`` (``data.random_walk_pe`` of
            :class:`~torch_geometric.transforms.AddRandomWalkPE`), ``'lappe'``
            (``data.laplacian_eigenvector_pe``, random sign flips in training),
            ``'graph_bridge'`` (:class:`pyg_grf.nn.encoders.GraphBridge`, SAMSA paper Sec. 4.3:
            nodes *and* edges become tokens; needs an attention over plain tokens and
            ``conv=None``) or :obj:`None` (default: :obj:`None`).
        pe_dim (int, optional): size of the stored PE (walk length / number of eigenvectors;
            the width of each noise set for Graph-Bridge) (default: :obj:`16`).
        node_encoder (str, optional): ``'linear'``, ``'atom'`` (OGB :class:`AtomEncoder`),
            ``'embedding'`` (one categorical column) or :obj:`None` (one learned vector)
            (default: :obj:`'linear'`).
        edge_encoder (str, optional): ``'linear'``, ``'bond'`` (OGB :class:`BondEncoder`),
            ``'embedding'`` or :obj:`None` (default: :obj:`None`).
        edge_dim (int, optional): edge feature size (categories for ``'embedding'``).
        pooling (str, optional): ``'mean'``, ``'add'``, ``'max'``, or :obj:`None` for node-level
            outputs (default: :obj:`'mean'`).
        dropout (float, optional): dropout of the residual branches and the head
            (default: :obj:`0.`).
        attn_dropout (float, optional): dropout on the attention coefficients
            (:func:`~pyg_grf.nn.attention.base.key_dropout`) (default: :obj:`0.`).
        ffn_ratio (float, optional): FFN hidden size / ``hidden_channels`` (default: :obj:`2.`).
        act (str, optional): activation (default: :obj:`'gelu'`).
        norm (str, optional): a PyG normalization (``'layer_norm'``, per node here,
            ``'batch_norm'``, ...), ``'rms_norm'`` or :obj:`None` (default: :obj:`'layer_norm'`).
        head_layers (int, optional): layers of the output MLP, ``1`` = linear
            (default: :obj:`2`).
        block (str, optional): ``'pre_norm'`` (above) or ``'gps'`` (default: ``'pre_norm'``).

    Shapes:
        - **input:** a :class:`~torch_geometric.data.Batch` with ``x``, ``edge_index``, optional
          ``edge_attr``, ``batch`` and the fields the attention needs (:attr:`requires`).
        - **output:** :math:`(B, F_{out})` with pooling, :math:`(|\mathcal{V}|, F_{out})`
          without.
    """

    def __init__(self, in_channels: Optional[int], hidden_channels: int, out_channels: int,
                 num_layers: int, heads: int = 1, attn_type: Optional[str] = 'grf',
                 attn_kwargs: Optional[Dict[str, Any]] = None,
                 conv: Union[str, MessagePassing, None] = None, pe: Optional[str] = None,
                 pe_dim: int = 16, node_encoder: Optional[str] = 'linear',
                 edge_encoder: Optional[str] = None, edge_dim: Optional[int] = None,
                 pooling: Optional[str] = 'mean', dropout: float = 0., attn_dropout: float = 0.,
                 ffn_ratio: float = 2., act: str = 'gelu', norm: Optional[str] = 'layer_norm',
                 head_layers: int = 2, block: str = 'pre_norm'):
        super().__init__()
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers, self.heads = out_channels, num_layers, heads
        self.attn_type, self.attn_kwargs = attn_type, dict(attn_kwargs or {})
        # A MessagePassing instance is a template (each layer gets a reset deep copy): kept as a
        # plain attribute, not a submodule, so its parameters are not the model's.
        object.__setattr__(self, 'conv', conv)
        self.pe, self.pe_dim, self.pooling, self.block = pe, pe_dim, pooling, block
        self.node_encoder_kind, self.edge_encoder_kind = node_encoder, edge_encoder
        self.dropout, self.attn_dropout = dropout, attn_dropout
        self.ffn_ratio, self.act, self.norm = ffn_ratio, act, norm

        C = hidden_channels
        check_options(in_channels, self.attn_type, conv, pe, node_encoder, edge_encoder,
                      edge_dim, pooling, block)
        if isinstance(conv, MessagePassing):
            check_conv(conv, C, edge_encoder)
        if 'dropout' in self.attn_kwargs:
            raise TypeError(f"attn_type={attn_type!r} with attn_kwargs={self.attn_kwargs}: set "
                            f"the attention dropout with attn_dropout, not "
                            f"attn_kwargs['dropout']")
        self.node_emb = None
        self.node_encoder = encoder(node_encoder, in_channels, C)
        if self.node_encoder is None:  # graphs without features: one learned vector
            self.node_emb = torch.nn.Parameter(torch.empty(1, C))
        # Edge encoder (only read by the local message passing and Graph-Bridge).
        self.edge_encoder = encoder(edge_encoder, edge_dim, C)
        self.pe_encoder = None
        if pe in ('rwpe', 'lappe'):
            self.pe_encoder = Linear(pe_dim, C)
        elif pe == 'graph_bridge':
            from pyg_grf.nn.encoders.graph_bridge import GraphBridge
            self.pe_encoder = GraphBridge(C, C, edge_channels=C if edge_encoder else None,
                                          pe_channels=pe_dim)
        self.blocks = torch.nn.ModuleList([self._make_block() for _ in range(num_layers)])
        if 'layer_index' not in self.attn_kwargs:  # walk draws per layer (num_draws > 1)
            from pyg_grf.nn.attention.grf import GRFAttention
            for i, layer in enumerate(self.blocks):
                if isinstance(layer.attn, GRFAttention):
                    layer.attn.layer_index = i
        # Post-norm GPS layers end with a norm already.
        self.final_norm = torch.nn.Identity()
        if block == 'pre_norm' and norm is not None:
            self.final_norm = norm_resolver(norm, C, **self._norm_kwargs)
        if head_layers == 1:
            self.head = Linear(C, out_channels)
        elif head_layers == 2:
            self.head = two_layer_mlp(C, C, out_channels, act, dropout)
        else:
            raise ValueError(f"head_layers must be 1 or 2, got {head_layers}")

        self.reset_parameters()

    @property
    def _norm_kwargs(self) -> Dict[str, Any]:
        return {'mode': 'node'} if self.norm == 'layer_norm' else {}

    def _make_block(self) -> GRFGPSConv:
        C, attn = self.hidden_channels, self.attn_type
        kwargs = dict(self.attn_kwargs, dropout=self.attn_dropout)
        try:
            if isinstance(attn, type):  # a GraphAttention subclass
                attn, kwargs = attn(C, heads=self.heads, **kwargs), {}
            return GRFGPSConv(C, self._make_conv(self.conv, C, self.heads),
                              heads=self.heads, dropout=self.dropout, act=self.act,
                              norm=self.norm, norm_kwargs=self._norm_kwargs, attn_type=attn,
                              attn_kwargs=kwargs if attn is not None else None,
                              layout='post_norm' if self.block == 'gps' else 'pre_norm',
                              mlp_channels=int(self.ffn_ratio * C))
        except TypeError as exc:  # e.g. a misspelt attn_kwargs key
            raise TypeError(f"attn_type={self.attn_type!r} with attn_kwargs="
                            f"{self.attn_kwargs}: {exc}") from exc

    def _make_conv(self, kind: Union[str, MessagePassing, None], C: int, heads: int):
        if kind is None:
            return None
        if isinstance(kind, MessagePassing):  # a layer's own copy, not shared with the others
            conv = copy.deepcopy(kind)
            conv.reset_parameters()
            return conv
        if kind == 'gine':
            return GINEConv(two_layer_mlp(C, C, C, self.act), edge_dim=C)
        if kind == 'gin':
            return GINConv(two_layer_mlp(C, C, C, self.act))
        if C % heads != 0:
            raise ValueError(f"conv='gat' needs hidden_channels ({C}) divisible by heads "
                             f"({heads})")
        return GATConv(C, C // heads, heads=heads,
                       edge_dim=C if self.edge_encoder_kind is not None else None)

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        for module in (self.node_encoder, self.edge_encoder, self.pe_encoder, self.final_norm,
                       *self.blocks, self.head):
            if hasattr(module, 'reset_parameters'):
                module.reset_parameters()
        if self.node_emb is not None:
            torch.nn.init.normal_(self.node_emb, std=1.0)

    @property
    def _attn(self) -> Optional[torch.nn.Module]:
        # the first layer's attention: it builds the payload shared by every layer
        return self.blocks[0].attn if len(self.blocks) > 0 else None

    @property
    def _uses_edge_attr(self) -> bool:
        return self.edge_encoder is not None and (self.conv is not None
                                                  or self.pe == 'graph_bridge')

    @property
    def requires(self) -> Tuple[str, ...]:
        r"""The batch attributes this model reads besides ``x``, ``edge_index``, ``batch``."""
        attn = self._attn
        req = list(attn.requires) if isinstance(attn, GraphAttention) else []
        if self.pe == 'rwpe':
            req.append('random_walk_pe')
        elif self.pe == 'lappe':
            req.append('laplacian_eigenvector_pe')
        if self._uses_edge_attr:
            req.append('edge_attr')
        return tuple(dict.fromkeys(req))

    def _check(self, data) -> None:
        missing = [name for name in self.requires if getattr(data, name, None) is None]
        if missing:
            hint = getattr(self._attn, 'hint', '')
            hints = {
                'random_walk_pe': f'add torch_geometric.transforms.AddRandomWalkPE('
                f'walk_length={self.pe_dim}, attr_name="random_walk_pe")',
                'laplacian_eigenvector_pe': f'add torch_geometric.transforms.'
                f'AddLaplacianEigenvectorPE(k={self.pe_dim}, attr_name="laplacian_eigenvector_pe")',
                'edge_attr': 'use a dataset with edge features or set edge_encoder=None',
            }
            extra = '; '.join(hints.get(name, hint) for name in missing if hints.get(name, hint))
            raise ValueError(f"{self.__class__.__name__}(attn_type={self.attn_type!r}, "
                             f"pe={self.pe!r}) needs the batch attributes {missing}, which the "
                             f"input lacks" + (f": {extra}" if extra else ''))

    def encode(self, data) -> Tensor:
        r"""Node embeddings before the blocks, ``[N, hidden_channels]``."""
        x = data.x
        if self.node_encoder is None:
            h = self.node_emb.expand(data.num_nodes, -1)
        else:
            if x is None:
                raise ValueError(f"node_encoder='{self.node_encoder_kind}' needs data.x; for "
                                 f"graphs without node features use node_encoder=None")
            if self.node_encoder_kind == 'linear' and (x.size(-1) if x.dim() > 1 else 1) != \
                    self.in_channels:
                raise ValueError(f"expected data.x with {self.in_channels} features "
                                 f"(in_channels), got shape {tuple(x.shape)}")
            h = embed(self.node_encoder, self.node_encoder_kind, x)

        if self.pe in ('rwpe', 'lappe'):
            pe = data.random_walk_pe if self.pe == 'rwpe' else data.laplacian_eigenvector_pe
            if pe.size(-1) != self.pe_dim:
                raise ValueError(f"expected a positional encoding of size pe_dim={self.pe_dim}, "
                                 f"got shape {tuple(pe.shape)}")
            if self.pe == 'lappe' and self.training:
                # Eigenvectors are defined up to sign: flip at random in training.
                sign = torch.randint(0, 2, (1, pe.size(-1)), device=pe.device) * 2 - 1
                pe = pe * sign
            h = h + self.pe_encoder(pe.to(self.pe_encoder.weight.dtype))
        return h

    def payload(self, data) -> Dict[str, Any]:
        r"""The payload of every attention layer for ``data`` (e.g. ``{'grf': GRFPlan}``, one
        plan for all GRF layers), or the one :class:`pyg_grf.loader.DataLoader` built for it
        in its workers (:func:`~pyg_grf.nn.attention.base.model_payload`)."""
        # the graph itself goes to the blocks as edge_index, not as a payload keyword
        return {k: v for k, v in model_payload(self, data).items() if k != 'edge_index'}

    def forward(self, data) -> Tensor:
        r"""Runs the model on a :class:`~torch_geometric.data.Data` or
        :class:`~torch_geometric.data.Batch` (never modified)."""
        self._check(data)
        edge_index = data.edge_index
        # the layers get the data's own batch vector (None for one graph: the same as zeros,
        # and it keeps the per-batch structures of one full graph cached between steps)
        layer_batch = getattr(data, 'batch', None)
        batch = batch_or_zeros(layer_batch, data.num_nodes, edge_index.device)
        num_graphs = int(getattr(data, 'num_graphs', 1) or 1)

        x = self.encode(data)
        edge_attr = (embed(self.edge_encoder, self.edge_encoder_kind, data.edge_attr)
                     if self._uses_edge_attr else None)
        token_type = None
        if self.pe == 'graph_bridge':  # nodes and edges become tokens (SAMSA paper, Sec. 4.3)
            # noise precomputed by AddGraphBridgeTokens(pe_dim=...) when present, else fresh
            x, batch, token_type = self.pe_encoder(x, edge_index, edge_attr, batch,
                                                   token_type=getattr(data, 'token_type', None),
                                                   noise=getattr(data, 'bridge_noise', None))
            layer_batch = batch

        kwargs = self.payload(data)
        if edge_attr is not None and len(self.blocks) > 0 and self.blocks[0].conv_edge_attr:
            kwargs = dict(kwargs, edge_attr=edge_attr)  # to the local conv
        for layer in self.blocks:
            x = layer(x, edge_index, layer_batch, **kwargs)
        x = self.final_norm(x)
        if self.pooling is None and token_type is not None:
            x = x[token_type == 0]  # node tokens, in node order
        if self.pooling is not None:
            x = POOLINGS[self.pooling](x, batch, size=num_graphs)
        return self.head(x)

    def __repr__(self) -> str:
        block = f', block={self.block!r}' if self.block != 'pre_norm' else ''
        return (f'{self.__class__.__name__}({self.in_channels}, {self.hidden_channels}, '
                f'{self.out_channels}, num_layers={self.num_layers}, heads={self.heads}, '
                f'attn_type={self.attn_type!r}, conv={self.conv!r}, pe={self.pe!r}, '
                f'pooling={self.pooling!r}{block})')
