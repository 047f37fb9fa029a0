r"""A node-classification model for full-graph training: a local message-passing stack and one
GRF-masked global attention branch, summed (:class:`GRFNodeModel`)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, SAGEConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver

from pyg_grf._validation import check_int
from pyg_grf.nn.attention.registry import ATTENTIONS, attention_resolver

#: Local convolutions by name.
CONVS = ('gcn', 'gat', 'sage')
#: Normalisations of the local layers by name (:obj:`None`: none).
NORMS = (None, 'batch_norm', 'layer_norm')


class GRFNodeModel(torch.nn.Module):
    r"""A local GNN and one topologically masked global attention layer, summed, for node
    classification on one fixed graph (the SGFormer layout, Wu et al., 2023, with the GRF mask
    of the `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper, Sec. 3, Eq. 7-10, in its attention).

    The local branch is the "classic GNN" stack (Luo et al., 2024): an input projection, then
    :obj:`num_layers` convolutions, each followed by an optional normalisation, the activation,
    dropout and an optional residual connection. The global branch projects the same inputs
    and applies one attention layer (:obj:`attn_type`, by default
    :class:`~pyg_grf.nn.GRFAttention`, whose mask
    :math:`\mathbf{M} = \widehat\Phi\widehat\Phi^\top` estimates the learnable power series
    :math:`\sum_k \alpha_k \mathbf{W}^k` of the normalised adjacency, GRF paper Eq. 4, 10):

    .. math::
        \mathbf{h}^{(0)} &= \mathbf{W}_{\mathrm{in}}\,\mathrm{drop}(\mathbf{x}), \qquad
        \mathbf{h}^{(l)} = \mathrm{drop}\big(\sigma(\mathrm{norm}(
            \mathrm{conv}_l(\mathbf{h}^{(l-1)})))\big) \;[+\,\mathbf{h}^{(l-1)}], \\
        \mathbf{z} &= \mathrm{Attn}_{\mathbf{M}}\big(\mathbf{W}_{\mathrm{att}}\,
            \mathrm{drop}(\mathbf{x})\big), \qquad
        \mathbf{y} = \mathbf{W}_{\mathrm{out}}\big(\mathbf{h}^{(L)} + g\,\mathbf{z}\big),

    with a learnable scalar gate :math:`g` initialised to :obj:`gate_init` (near zero, so
    training starts from the local GNN; exempt from weight decay). With :math:`g = 0` the model
    is exactly the local stack. The attention layer's plan (``GRFPlan``, built from the walks of
    :class:`~pyg_grf.transforms.AddGraphRandomFeatures`) is built on the first call and kept by
    the layer while the data holds the same walks, so full-graph training plans once.

    Args:
        in_channels (int): input features per node.
        hidden_channels (int): width of both branches.
        out_channels (int): outputs per node (classes, or 1 for a binary task).
        num_layers (int, optional): local convolutions (default: :obj:`2`).
        conv (str, optional): the local convolution: ``'gcn'`` (:class:`GCNConv`), ``'gat'``
            (:class:`GATConv`, :obj:`conv_heads` heads concatenated to the width) or
            ``'sage'`` (:class:`SAGEConv`) (default: ``'gcn'``).
        conv_heads (int, optional): heads of ``'gat'`` (default: :obj:`1`).
        attn_type (str, optional): the global attention, a name of
            :data:`~pyg_grf.nn.attention.registry.ATTENTIONS` (``'grf'``; the controls
            ``'linear'``, unmasked, and ``'power_series'``, the exact dense mask), or
            :obj:`None` (or ``'none'``) for the local stack alone (default: ``'grf'``).
        heads (int, optional): attention heads (default: :obj:`1`).
        attn_kwargs (dict, optional): more arguments of the attention layer, e.g.
            ``{'max_length': 3, 'global_beta': 0.1}`` (default: :obj:`None`).
        gate_init (float, optional): initial gate :math:`g` (default: :obj:`0.`; the node
            configs of ``experiments/configs/node/`` use :obj:`0.5`, which beat :obj:`0` on
            Cora's validation split).
        dropout (float, optional): dropout after every local layer and on the attention's
            output (default: :obj:`0.5`).
        input_dropout (float, optional): dropout on the input features (default: :obj:`0.`).
        norm (str, optional): ``'batch_norm'``, ``'layer_norm'`` or :obj:`None` after every
            local convolution (default: :obj:`None`).
        residual (bool, optional): residual connections around the local layers
            (default: :obj:`False`).
        act (str, optional): activation (default: ``'relu'``).

    Shapes:
        - **input:** a :class:`~torch_geometric.data.Data` with ``x`` :math:`(N, F_{in})`,
          ``edge_index`` :math:`(2, E)` and the fields the attention reads (for ``'grf'``, the
          walks of :class:`~pyg_grf.transforms.AddGraphRandomFeatures`)
        - **output:** :math:`(N, F_{out})`
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, conv: str = 'gcn', conv_heads: int = 1,
                 attn_type: Optional[str] = 'grf', heads: int = 1,
                 attn_kwargs: Optional[Dict[str, Any]] = None, gate_init: float = 0.0,
                 dropout: float = 0.5, input_dropout: float = 0.0,
                 norm: Optional[str] = None, residual: bool = False, act: str = 'relu'):
        super().__init__()
        self.in_channels = check_int('in_channels', in_channels, 1)
        self.hidden_channels = check_int('hidden_channels', hidden_channels, 1)
        self.out_channels = check_int('out_channels', out_channels, 1)
        self.num_layers = check_int('num_layers', num_layers, 1)
        self.conv_heads = check_int('conv_heads', conv_heads, 1)
        self.heads = check_int('heads', heads, 1)
        if conv not in CONVS:
            raise ValueError(f"'conv' must be one of {CONVS}, got {conv!r}")
        if conv == 'gat' and hidden_channels % conv_heads:
            raise ValueError(f"conv='gat' concatenates its heads to 'hidden_channels': expected "
                             f"a multiple of conv_heads={conv_heads}, got {hidden_channels}")
        if isinstance(attn_type, str) and attn_type.lower() in ('none', 'null'):
            attn_type = None  # as a command line writes it (jsonargparse passes the string)
        if attn_type is not None and attn_type not in ATTENTIONS:
            raise ValueError(f"'attn_type' must be one of {sorted(ATTENTIONS)} or None, got "
                             f"{attn_type!r}")
        if norm not in NORMS:
            raise ValueError(f"'norm' must be one of {NORMS}, got {norm!r}")
        for name, p in (('dropout', dropout), ('input_dropout', input_dropout)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"'{name}' must lie in [0, 1), got {p!r}")
        self.conv, self.attn_type, self.norm, self.residual = conv, attn_type, norm, residual
        self.attn_kwargs = dict(attn_kwargs or {})
        self.gate_init, self.dropout, self.input_dropout = gate_init, dropout, input_dropout
        self.act = activation_resolver(act)
        self.act_name = act

        # local branch: input projection, convolutions (+ norms)
        C = hidden_channels
        self.lin_in = torch.nn.Linear(in_channels, C)
        self.convs = torch.nn.ModuleList([self._make_conv(conv, C, conv_heads)
                                          for _ in range(num_layers)])
        self.norms = (torch.nn.ModuleList([normalization_resolver(norm, C)
                                           for _ in range(num_layers)])
                      if norm is not None else None)
        # global branch: its own input projection and one attention layer, gated
        if attn_type is not None:
            self.attn_in = torch.nn.Linear(in_channels, C)
            self.attn = attention_resolver(attn_type, C, heads=heads, **self.attn_kwargs)
            self.gate = torch.nn.Parameter(torch.empty(()))
        else:
            self.attn_in = self.attn = self.gate = None
        self.lin_out = torch.nn.Linear(C, out_channels)
        self.reset_parameters()

    @staticmethod
    def _make_conv(conv: str, C: int, conv_heads: int) -> torch.nn.Module:
        if conv == 'gcn':  # on the normalised adjacency of :meth:`adjacency`
            return GCNConv(C, C, normalize=False)
        if conv == 'gat':
            return GATConv(C, C // conv_heads, heads=conv_heads)
        return SAGEConv(C, C)

    def reset_parameters(self):
        self.lin_in.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        for norm in self.norms or []:
            norm.reset_parameters()
        if self.attn is not None:
            self.attn_in.reset_parameters()
            self.attn.reset_parameters()
            with torch.no_grad():
                self.gate.fill_(self.gate_init)
        self.lin_out.reset_parameters()

    def no_weight_decay(self) -> set:
        r"""Parameters the optimiser leaves undecayed: the gate (decay would pull the attention
        branch back to zero whatever it contributes)."""
        return {'gate'} if self.gate is not None else set()

    def adjacency(self, edge_index: Tensor, num_nodes: int, dtype: torch.dtype = torch.float):
        r"""What the local convolutions read: for ``'gcn'`` the normalised adjacency
        :math:`\hat{\mathbf{D}}^{-1/2}(\mathbf{A} + \mathbf{I})\hat{\mathbf{D}}^{-1/2}` as a
        CSR tensor (one sparse product per layer: about 5x faster on the CPU than message
        passing over ``edge_index``, measured on Minesweeper), built once per call and kept
        while the same ``edge_index`` tensor comes back unmodified (as
        ``GCNConv(cached=True)``, for the one fixed graph of full-graph training); else
        ``edge_index`` itself."""
        if self.conv != 'gcn':
            return edge_index
        # (inference tensors have no version counter; one built under inference mode, as
        # Lightning validates, cannot serve a training step)
        version = -1 if edge_index.is_inference() else edge_index._version
        key = (edge_index.data_ptr(), version, tuple(edge_index.shape), num_nodes,
               edge_index.device, dtype, torch.is_inference_mode_enabled())
        cached = self.__dict__.get('_adjacency')
        if cached is not None and cached[0] == key and cached[1] is edge_index:
            return cached[2]
        ones = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
        ei, ew = gcn_norm(edge_index, ones, num_nodes, add_self_loops=True)
        # row i holds node i's in-neighbours (messages flow source -> target)
        adj = torch.sparse_coo_tensor(ei.flip(0), ew, (num_nodes, num_nodes),
                                      check_invariants=False).coalesce().to_sparse_csr()
        self.__dict__['_adjacency'] = (key, edge_index, adj)
        return adj

    def __getstate__(self):
        # a copy or a pickle of the model leaves the kept adjacency behind
        state = self.__dict__.copy()
        state.pop('_adjacency', None)
        return state

    def local(self, x: Tensor, edge_index: Tensor) -> Tensor:
        r"""The local branch :math:`\mathbf{h}^{(L)}` of ``x`` :math:`(N, F_{in})`."""
        adj = self.adjacency(edge_index, x.size(0), x.dtype)
        h = self.lin_in(F.dropout(x, self.input_dropout, self.training))
        for i, conv in enumerate(self.convs):
            out = conv(h, adj)
            if self.norms is not None:
                out = self.norms[i](out)
            out = F.dropout(self.act(out), self.dropout, self.training)
            h = out + h if self.residual else out
        return h

    def forward(self, data) -> Tensor:
        r"""The outputs :math:`(N, F_{out})` of the graph ``data`` (never modified)."""
        x, edge_index = getattr(data, 'x', None), getattr(data, 'edge_index', None)
        if not isinstance(x, Tensor) or x.dim() != 2 or x.size(1) != self.in_channels:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__} expects data.x of shape [N, "
                             f"{self.in_channels}] (in_channels), got {got}")
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 \
                or edge_index.size(0) != 2:
            got = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else \
                type(edge_index).__name__
            raise ValueError(f"{type(self).__name__} expects data.edge_index of shape [2, E], "
                             f"got {got}")
        h = self.local(x, edge_index)
        if self.attn is not None:
            # the attention reads its payload (for 'grf' the plan of the data's walks, kept by
            # the layer between calls on the same walks); one graph: no batch vector
            z = self.attn_in(F.dropout(x, self.input_dropout, self.training))
            z = self.attn(z, getattr(data, 'batch', None), **self.attn.payload(data))
            h = h + self.gate * F.dropout(z, self.dropout, self.training)
        return self.lin_out(h)

    def __repr__(self) -> str:
        attn = (f', attn_type={self.attn_type!r}, heads={self.heads}'
                if self.attn_type is not None else ', attn_type=None')
        return (f'{type(self).__name__}({self.in_channels}, {self.hidden_channels}, '
                f'{self.out_channels}, num_layers={self.num_layers}, conv={self.conv!r}{attn}, '
                f'norm={self.norm!r}, residual={self.residual})')
