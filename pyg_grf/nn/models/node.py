r"""A node-classification model for full-graph training: a local message-passing stack and one
GRF-masked global attention branch, summed (:class:`GRFNodeModel`)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, SAGEConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver

from pyg_grf._validation import check_int
from pyg_grf.nn.attention.registry import ATTENTIONS, attention_resolver
from pyg_grf.ops import SparsePattern, spmm

#: Local convolutions by name.
CONVS = ('gcn', 'gat', 'sage')
#: Normalisations of the local layers by name (:obj:`None`: none).
NORMS = (None, 'batch_norm', 'layer_norm')
#: Output layers by name: a linear map of the last hidden layer, or a last convolution.
HEADS = ('linear', 'conv')
#: Which hidden layer the attention reads.
ATTN_INPUTS = ('first', 'last')


class GRFNodeModel(torch.nn.Module):
    r"""A local GNN and one topologically masked global attention layer, summed, for node
    classification on one fixed graph (the SGFormer layout, Wu et al., 2023, with the GRF mask
    of the `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper, Sec. 3, Eq. 7-10, in its attention).

    The local branch is a "classic GNN" stack (Luo et al., 2024): hidden convolutions, the
    first on the input features, each with an optional linear skip (:obj:`residual`), an
    optional normalisation, the activation and dropout, then an output layer: a linear map
    (``head='linear'``, Luo et al.'s layout) or one more convolution (``head='conv'``, Kipf and
    Welling's two-layer GCN for :obj:`num_layers=2`, the better layout for a few labels). The
    global branch is one attention layer (:obj:`attn_type`, by default
    :class:`~pyg_grf.nn.GRFAttention`, whose mask
    :math:`\mathbf{M} = \widehat\Phi\widehat\Phi^\top` estimates the learnable power series
    :math:`\sum_k \alpha_k \mathbf{W}^k` of the normalised adjacency, GRF paper Eq. 4, 10) on
    a hidden layer :math:`\mathbf{h}^{(a)}` of the local stack, so that it adds no second
    projection of the raw features, mapped to the outputs and added to the local branch's.
    ``attn_input='first'`` (:math:`a = 1`) suits few labels and wide inputs (a citation graph:
    thousands of inputs learnt from 140 labels, two layers); ``'last'`` (:math:`a = L'`, what
    the output layer reads) suits a deep stack, whose last layer is the one that has seen the
    neighbourhood (Minesweeper's 12 layers):

    .. math::
        \mathbf{h}^{(0)} &= \mathrm{drop}(\mathbf{x}), \qquad
        \mathbf{h}^{(l)} = \mathrm{drop}\big(\sigma(\mathrm{norm}(
            \mathrm{conv}_l(\mathbf{h}^{(l-1)}) \;[+\,\mathbf{W}_l\mathbf{h}^{(l-1)}])
            )\big), \\
        \mathbf{y} &= \mathrm{head}(\mathbf{h}^{(L')}) + g\,\mathbf{W}_{o}\,
            \mathrm{drop}(\mathrm{Attn}_{\mathbf{M}}(\mathbf{h}^{(a)})),

    with :math:`L'` hidden layers (:obj:`num_layers`, or one fewer with ``head='conv'``) and a
    learnable scalar gate :math:`g` initialised to :obj:`gate_init` (exempt from weight
    decay). With :math:`g = 0` the model is exactly the local stack. The attention layer's plan
    (``GRFPlan``, built from the walks of :class:`~pyg_grf.transforms.AddGraphRandomFeatures`)
    is built on the first call and kept by the layer while the data holds the same walks, so
    full-graph training plans once.

    Args:
        in_channels (int): input features per node.
        hidden_channels (int): width of both branches.
        out_channels (int): outputs per node (classes, or 1 for a binary task).
        num_layers (int, optional): local convolutions, the output one included with
            ``head='conv'`` (default: :obj:`2`).
        conv (str, optional): the local convolution: ``'gcn'`` (:class:`GCNConv`), ``'gat'``
            (:class:`GATConv`, :obj:`conv_heads` heads concatenated to the width) or
            ``'sage'`` (:class:`SAGEConv`) (default: ``'gcn'``).
        conv_heads (int, optional): heads of ``'gat'`` (default: :obj:`1`).
        conv_kwargs (dict, optional): more arguments of every local convolution, e.g.
            ``{'add_self_loops': False, 'bias': False}`` for Luo et al.'s ``GATConv`` (the sizes,
            ``heads`` and, for ``'gcn'``, ``normalize`` are the model's) (default: :obj:`None`).
        attn_type (str, optional): the global attention, a name of
            :data:`~pyg_grf.nn.attention.registry.ATTENTIONS` (``'grf'``; the controls
            ``'linear'``, unmasked, and ``'power_series'``, the exact mask), or :obj:`None` (or
            ``'none'``) for the local stack alone (default: ``'grf'``).
        heads (int, optional): attention heads (default: :obj:`1`).
        attn_kwargs (dict, optional): more arguments of the attention layer, e.g.
            ``{'max_length': 3, 'global_beta': 0.1}`` (default: :obj:`None`).
        gate_init (float, optional): initial gate :math:`g` (default: :obj:`0.`).
        dropout (float, optional): dropout after every local layer and on the attention's
            output (default: :obj:`0.5`).
        input_dropout (float, optional): dropout on the input features (default: :obj:`0.`).
        norm (str, optional): ``'batch_norm'``, ``'layer_norm'`` or :obj:`None` after every
            local convolution (default: :obj:`None`).
        residual (bool, optional): a linear skip :math:`\mathbf{W}_l\mathbf{h}^{(l-1)}` added to
            every convolution, before the normalisation (Luo et al.'s residual; a node keeps its
            own features apart from its neighbours', what heterophilous graphs need)
            (default: :obj:`False`).
        act (str, optional): activation (default: ``'relu'``).
        head (str, optional): the output layer, ``'linear'`` or ``'conv'`` (see above;
            default: ``'linear'``).
        attn_input (str, optional): the hidden layer the attention reads, ``'first'`` or
            ``'last'`` (see above; default: ``'first'``).

    Shapes:
        - **input:** a :class:`~torch_geometric.data.Data` with ``x`` :math:`(N, F_{in})`,
          ``edge_index`` :math:`(2, E)` and the fields the attention reads (for ``'grf'``, the
          walks of :class:`~pyg_grf.transforms.AddGraphRandomFeatures`)
        - **output:** :math:`(N, F_{out})`
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, conv: str = 'gcn', conv_heads: int = 1,
                 conv_kwargs: Optional[Dict[str, Any]] = None,
                 attn_type: Optional[str] = 'grf', heads: int = 1,
                 attn_kwargs: Optional[Dict[str, Any]] = None, gate_init: float = 0.0,
                 dropout: float = 0.5, input_dropout: float = 0.0,
                 norm: Optional[str] = None, residual: bool = False, act: str = 'relu',
                 head: str = 'linear', attn_input: str = 'first'):
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
        self.conv_kwargs = dict(conv_kwargs or {})
        owned = {'in_channels', 'out_channels', 'heads', 'normalize'} & set(self.conv_kwargs)
        if owned:
            raise ValueError(f"'conv_kwargs' may not set {sorted(owned)}: the model sets the "
                             f"sizes, 'heads' (conv_heads) and GCN's 'normalize'; got "
                             f"{self.conv_kwargs}")
        if conv == 'gcn' and set(self.conv_kwargs) - {'bias'}:
            raise ValueError(f"conv='gcn' runs on the model's own normalised adjacency (self "
                             f"loops included): 'conv_kwargs' may only set 'bias', got "
                             f"{self.conv_kwargs}")
        if isinstance(attn_type, str) and attn_type.lower() in ('none', 'null'):
            attn_type = None  # as a command line writes it (jsonargparse passes the string)
        if attn_type is not None and attn_type not in ATTENTIONS:
            raise ValueError(f"'attn_type' must be one of {sorted(ATTENTIONS)} or None, got "
                             f"{attn_type!r}")
        if norm not in NORMS:
            raise ValueError(f"'norm' must be one of {NORMS}, got {norm!r}")
        if head not in HEADS:
            raise ValueError(f"'head' must be one of {HEADS}, got {head!r}")
        if attn_input not in ATTN_INPUTS:
            raise ValueError(f"'attn_input' must be one of {ATTN_INPUTS}, got {attn_input!r}")
        if head == 'conv' and num_layers < 2:
            raise ValueError(f"head='conv' makes the last of 'num_layers' convolutions the "
                             f"output layer and needs a hidden one before it: expected "
                             f"num_layers >= 2, got {num_layers}")
        for name, p in (('dropout', dropout), ('input_dropout', input_dropout)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"'{name}' must lie in [0, 1), got {p!r}")
        self.conv, self.attn_type, self.norm, self.residual = conv, attn_type, norm, residual
        self.head_type, self.attn_input = head, attn_input
        self.attn_kwargs = dict(attn_kwargs or {})
        self.gate_init, self.dropout, self.input_dropout = gate_init, dropout, input_dropout
        self.act = activation_resolver(act)
        self.act_name = act

        # local branch: hidden convolutions (+ linear skips, norms), the first on the inputs,
        # then the output layer (a linear map, or the last convolution)
        C = hidden_channels
        hidden = num_layers if head == 'linear' else num_layers - 1
        dims = [in_channels] + [C] * hidden
        self.convs = torch.nn.ModuleList([self._make_conv(conv, dims[i], C, conv_heads,
                                                          self.conv_kwargs)
                                          for i in range(hidden)])
        self.skips = (torch.nn.ModuleList([torch.nn.Linear(dims[i], C) for i in range(hidden)])
                      if residual else None)
        self.norms = (torch.nn.ModuleList([normalization_resolver(norm, C)
                                           for _ in range(hidden)])
                      if norm is not None else None)
        self.head = (torch.nn.Linear(C, out_channels) if head == 'linear'
                     else self._make_conv(conv, C, out_channels, 1, self.conv_kwargs))
        # global branch: one attention layer on a hidden layer's output (attn_input), gated
        if attn_type is not None:
            self.attn = attention_resolver(attn_type, C, heads=heads, **self.attn_kwargs)
            self.attn_out = torch.nn.Linear(C, out_channels)
            self.gate = torch.nn.Parameter(torch.empty(()))
        else:
            self.attn = self.attn_out = self.gate = None
        self.reset_parameters()

    @staticmethod
    def _make_conv(conv: str, c_in: int, C: int, conv_heads: int,
                   kwargs: Dict[str, Any]) -> torch.nn.Module:
        try:
            if conv == 'gcn':  # on the normalised adjacency of :meth:`adjacency`
                return GCNConv(c_in, C, normalize=False, **kwargs)
            if conv == 'gat':
                return GATConv(c_in, C // conv_heads, heads=conv_heads, **kwargs)
            return SAGEConv(c_in, C, **kwargs)
        except TypeError as exc:  # an argument the convolution does not take
            raise ValueError(f"'conv_kwargs' {kwargs} do not fit conv={conv!r}: {exc}") from None

    def reset_parameters(self):
        for module in [*self.convs, *(self.skips or []), *(self.norms or []), self.head]:
            module.reset_parameters()
        if self.attn is not None:
            self.attn.reset_parameters()
            self.attn_out.reset_parameters()
            with torch.no_grad():
                self.gate.fill_(self.gate_init)

    def no_weight_decay(self) -> set:
        r"""Parameters the optimiser leaves undecayed: the gate (decay would pull the attention
        branch back to zero whatever it contributes)."""
        return {'gate'} if self.gate is not None else set()

    def adjacency(self, edge_index: Tensor, num_nodes: int, dtype: torch.dtype = torch.float):
        r"""What the local convolutions read: for ``'gcn'`` the normalised adjacency
        :math:`\hat{\mathbf{D}}^{-1/2}(\mathbf{A} + \mathbf{I})\hat{\mathbf{D}}^{-1/2}` as a
        :class:`~pyg_grf.ops.SparsePattern` and its values, multiplied by one CSR product per
        layer whose backward reuses the pattern's transpose instead of transposing the
        adjacency again in every layer of every step (as torch's CSR ``@`` does): a 12-layer
        step on a Minesweeper-sized graph is 0.62x PyG's ``GCNConv(cached=True)`` on the CPU
        (``experiments/results/node_gcn.md``, ``bench/node_gcn.py``); built once per
        call and kept while the same ``edge_index`` tensor comes back unmodified (as
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
        pattern = SparsePattern(ei.flip(0), (num_nodes, num_nodes))
        adj = (pattern, ew)
        self.__dict__['_adjacency'] = (key, edge_index, adj)
        return adj

    def _conv(self, conv: torch.nn.Module, h: Tensor, adj) -> Tensor:
        # GCNConv(normalize=False)'s computation, lin then the normalised adjacency then bias,
        # on the kept pattern (see adjacency); the other convolutions take edge_index
        if self.conv != 'gcn':
            return conv(h, adj)
        out = spmm(adj[0], adj[1], conv.lin(h))
        return out + conv.bias if conv.bias is not None else out

    def __getstate__(self):
        # a copy or a pickle of the model leaves the kept adjacency behind
        state = self.__dict__.copy()
        state.pop('_adjacency', None)
        return state

    def local(self, x: Tensor, edge_index: Tensor) -> Tuple[Tensor, Tensor]:
        r"""The local branch of ``x`` :math:`(N, F_{in})`: its output (the output layer's,
        :math:`(N, F_{out})`) and the hidden layer the attention reads, :math:`\mathbf{h}^{(a)}`
        (:obj:`attn_input`)."""
        adj = self.adjacency(edge_index, x.size(0), x.dtype)
        h = F.dropout(x, self.input_dropout, self.training)
        first = None
        for i, conv in enumerate(self.convs):
            out = self._conv(conv, h, adj)
            if self.skips is not None:
                out = out + self.skips[i](h)
            if self.norms is not None:
                out = self.norms[i](out)
            h = F.dropout(self.act(out), self.dropout, self.training)
            first = h if first is None else first
        out = self.head(h) if self.head_type == 'linear' else self._conv(self.head, h, adj)
        return out, (first if self.attn_input == 'first' else h)

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
        y, hidden = self.local(x, edge_index)
        if self.attn is not None:
            # the attention reads its payload (for 'grf' the plan of the data's walks, kept by
            # the layer between calls on the same walks); one graph: no batch vector
            z = self.attn(hidden, getattr(data, 'batch', None), **self.attn.payload(data))
            y = y + self.gate * self.attn_out(F.dropout(z, self.dropout, self.training))
        return y

    def __repr__(self) -> str:
        attn = (f', attn_type={self.attn_type!r}, heads={self.heads}'
                if self.attn_type is not None else ', attn_type=None')
        kwargs = f', conv_kwargs={self.conv_kwargs}' if self.conv_kwargs else ''
        return (f'{type(self).__name__}({self.in_channels}, {self.hidden_channels}, '
                f'{self.out_channels}, num_layers={self.num_layers}, conv={self.conv!r}{kwargs}'
                f'{attn}, '
                f'norm={self.norm!r}, residual={self.residual}, head={self.head_type!r}, '
                f'attn_input={self.attn_input!r})')
