r"""The networks of the papers' own experiments, for the product's training stack.

The papers compare attention layers inside small, fixed networks (two GAT-shaped layers on the
citation graphs, the GKAT classifier of the TU tables, the motif detector), not inside a graph
transformer. These modules are those networks, built from the product's layers
(:class:`~pyg_grf.nn.GKATAttention`, :class:`~pyg_grf.nn.GRFAttention`,
:class:`~pyg_grf.nn.GRFGPSConv`) and PyG's (:class:`~torch_geometric.nn.GATConv`, ...), each
mapping a :class:`~torch_geometric.data.Data` / batch to its logits, so that
:class:`~pyg_grf.lightning.tasks.NodeLevelTask` and
:class:`~pyg_grf.lightning.tasks.GraphLevelTask` train them like any model: configs in
``experiments/configs/paper/``, run by ``pyg-grf fit`` or by :mod:`harness` (seeds, folds,
searches). Everything but the network (data modules, transforms, optimiser, early stopping,
checkpoint selection, test) is the product's.

Importing this module registers the classes for configs
(:func:`~pyg_grf.lightning.specs.register_model_class`); from the command line::

    PYTHONPATH=experiments PYG_GRF_TRUSTED_CLASSES=paper_models \
        pyg-grf fit --config experiments/configs/paper/citation_gkat.yaml
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, global_add_pool, global_mean_pool
from torch_geometric.nn.models import GIN

from pyg_grf.lightning.specs import register_model_class
from pyg_grf.nn import GKATAttention, GRFAttention, GRFGPSConv
from pyg_grf.nn.attention.base import model_payload
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.nn.attention.reference import LinearAttention


@register_model_class
class CitationGAT(torch.nn.Module):
    r"""GAT on the citation graphs (Velickovic et al., 2018; PyG's ``examples/gat.py``):
    dropout, ``GATConv(heads x hidden)``, ELU, dropout, ``GATConv(1 head, out_channels)``, with
    dropout :obj:`dropout` on the inputs of both layers and on the attention coefficients."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 8,
                 heads: int = 8, dropout: float = 0.6):
        super().__init__()
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden_channels, heads=heads, dropout=dropout)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False,
                             dropout=dropout)

    def forward(self, data) -> Tensor:
        x = F.dropout(data.x, self.dropout, self.training)
        x = F.elu(self.conv1(x, data.edge_index))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, data.edge_index)


@register_model_class
class CitationGCN(torch.nn.Module):
    r"""GCN on the citation graphs (Kipf & Welling, 2017; PyG's ``examples/gcn.py``): dropout,
    ``GCNConv(hidden)``, ReLU, dropout, ``GCNConv(out_channels)``, dropout :obj:`dropout` on the
    inputs of both layers."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 16,
                 dropout: float = 0.5):
        super().__init__()
        self.dropout = dropout
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, data) -> Tensor:
        x = F.dropout(data.x, self.dropout, self.training)
        x = F.relu(self.conv1(x, data.edge_index))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, data.edge_index)


@register_model_class
class CitationGKAT(torch.nn.Module):
    r"""GKAT in GAT's place on the citation graphs (FTFI paper, App. A.5.2): the same network as
    :class:`CitationGAT` with the adjacency mask replaced by the RWGNK kernel ``K = Psi Psi^T``
    of the pre-transform's walks (:class:`~pyg_grf.transforms.AddRWGNKFeatures`). ``mode``,
    ``threshold`` and ``kernel_weighting`` are :class:`~pyg_grf.nn.GKATAttention`'s
    (``kernel_weighting=False``: the kernel gives the support of the softmax only)."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 8,
                 heads: int = 8, dropout: float = 0.6, mode: str = 'softmax',
                 threshold: float = 0.0, kernel_weighting: bool = True):
        super().__init__()
        self.dropout = dropout
        kw = dict(mode=mode, dropout=dropout, threshold=threshold,
                  kernel_weighting=kernel_weighting, project=False)  # GAT-shaped layers
        self.conv1 = GKATAttention(in_channels, heads=heads, head_channels=hidden_channels, **kw)
        self.conv2 = GKATAttention(hidden_channels * heads, heads=1, head_channels=out_channels,
                                   concat=False, **kw)
        self._plan = None

    def forward(self, data) -> Tensor:
        # one fixed graph in full-batch training: its plan is built on the first call and kept,
        # as GCNConv(cached=True) keeps its normalised graph (valid for that graph only)
        if self._plan is None:
            self._plan = GKATAttention.plan_payload(data, [self.conv1, self.conv2])['rwgnk']
        rwgnk = self._plan
        x = F.dropout(data.x, self.dropout, self.training)
        x = F.elu(self.conv1(x, rwgnk=rwgnk))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, rwgnk=rwgnk)


@register_model_class
class CitationGRFGPS(torch.nn.Module):
    r"""GAT with a :class:`~pyg_grf.nn.GRFGPSConv` block between its two layers: ``GATConv``,
    ELU, ``GRFGPSConv(width, conv)`` (ELU, no normalisation, dropout :obj:`dropout` on its
    branches and attention), dropout, ``GATConv(1 head)``. The block's attention is
    :obj:`attn_type` with :obj:`attn_kwargs` (``'grf'``: GRF-masked linear attention reading
    the pre-transform's walks; ``'linear'``: the unmasked control); its local ``conv`` is a third
    ``GATConv`` (:obj:`local` ``'gat'``) or none (``'none'``)."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 8,
                 gat_heads: int = 8, heads: int = 4, local: str = 'none',
                 attn_type: str = 'grf', attn_kwargs: Optional[dict] = None,
                 dropout: float = 0.6):
        super().__init__()
        if local not in ('none', 'gat'):
            raise ValueError(f"local must be 'none' or 'gat', got {local!r}")
        self.dropout = dropout
        width = hidden_channels * gat_heads
        self.conv1 = GATConv(in_channels, hidden_channels, heads=gat_heads, dropout=dropout)
        conv = (GATConv(width, hidden_channels, heads=gat_heads, dropout=dropout)
                if local == 'gat' else None)
        self.gps = GRFGPSConv(width, conv, heads=heads, dropout=dropout, act='elu', norm=None,
                              attn_type=attn_type,
                              attn_kwargs=dict({'dropout': dropout}, **(attn_kwargs or {})))
        self.conv2 = GATConv(width, out_channels, heads=1, concat=False, dropout=dropout)

    def forward(self, data) -> Tensor:
        # the block's payload (for 'grf' its GRFPlan): the one the product's DataLoader built for
        # this graph (kept between epochs), else built here
        kw = model_payload(self, data) if self.gps.attn_type == 'grf' else {}
        x = F.dropout(data.x, self.dropout, self.training)
        x = F.elu(self.conv1(x, data.edge_index))
        x = self.gps(x, data.edge_index, **kw)
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, data.edge_index)


@register_model_class
class TUAttentionClassifier(torch.nn.Module):
    r"""The GKAT paper's graph classifier (FTFI paper, App. A.3.2, Table 7): [BatchNorm]
    [Linear - ReLU] - dropout - attention (``heads x head_channels``) - ELU - dropout -
    attention (one head) - ELU - sum pooling - ``Linear(fc_channels)`` - ReLU - Linear. The
    attention is :class:`~pyg_grf.nn.GKATAttention` in softmax mode over the RWGNK kernel
    (:obj:`kind` ``'gkat'``) or PyG's ``GATConv`` over the edges (``'gat'``)."""

    def __init__(self, in_channels: int, out_channels: int, kind: str = 'gkat', heads: int = 4,
                 head_channels: int = 8, fc_channels: int = 32, dropout: float = 0.0,
                 input_fc: bool = True, input_bn: bool = True):
        super().__init__()
        if kind not in ('gkat', 'gat'):
            raise ValueError(f"kind must be 'gkat' or 'gat', got {kind!r}")
        self.kind = kind
        self.dropout = dropout
        self.bn = torch.nn.BatchNorm1d(in_channels) if input_bn else None
        width = fc_channels if input_fc else in_channels
        self.fc = torch.nn.Linear(in_channels, width) if input_fc else None
        hidden = heads * head_channels
        if kind == 'gkat':
            kw = dict(mode='softmax', dropout=dropout, project=False)
            self.att1 = GKATAttention(width, heads=heads, head_channels=head_channels, **kw)
            self.att2 = GKATAttention(hidden, heads=1, head_channels=hidden, **kw)
        else:
            self.att1 = GATConv(width, head_channels, heads=heads, dropout=dropout)
            self.att2 = GATConv(hidden, hidden, heads=1, dropout=dropout)
        self.head = torch.nn.Sequential(torch.nn.Linear(hidden, fc_channels), torch.nn.ReLU(),
                                        torch.nn.Linear(fc_channels, out_channels))

    def forward(self, data) -> Tensor:
        x = data.x.float()
        if self.bn is not None:
            x = self.bn(x)
        if self.fc is not None:
            x = F.relu(self.fc(x))
        if self.kind == 'gkat':
            rwgnk = RWGNKPlan.build(data)
            attend = lambda layer, h: layer(h, batch=data.batch, rwgnk=rwgnk)  # noqa: E731
        else:
            attend = lambda layer, h: layer(h, data.edge_index)  # noqa: E731
        x = F.dropout(x, self.dropout, self.training)
        x = F.elu(attend(self.att1, x))
        x = F.dropout(x, self.dropout, self.training)
        x = F.elu(attend(self.att2, x))
        return self.head(global_add_pool(x, data.batch))


@register_model_class
class TUGIN(torch.nn.Module):
    r"""PyG's :class:`~torch_geometric.nn.models.GIN` (``num_layers x hidden_channels``,
    learnable epsilon), sum pooling, then ``Linear - ReLU - Linear``: the message-passing
    baseline of the TU tables."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64,
                 num_layers: int = 3, dropout: float = 0.0):
        super().__init__()
        self.gin = GIN(in_channels, hidden_channels, num_layers=num_layers, dropout=dropout,
                       train_eps=True)
        self.head = torch.nn.Sequential(torch.nn.Linear(hidden_channels, hidden_channels),
                                        torch.nn.ReLU(),
                                        torch.nn.Linear(hidden_channels, out_channels))

    def forward(self, data) -> Tensor:
        x = self.gin(data.x.float(), data.edge_index)
        return self.head(global_add_pool(x, data.batch))


@register_model_class
class MotifNet(torch.nn.Module):
    r"""The motif detector of the FTFI paper's Sec. 5.1.1 (Fig. 6): two layers of :obj:`kind`
    (``'gkat'``: GAT-shaped :class:`~pyg_grf.nn.GKATAttention`; ``'gat'``; ``'gcn'``; ``'grf'``:
    a linear input layer then two :class:`~pyg_grf.nn.GRFAttention` layers, each with its own
    walk draws when the pre-transform drew several; ``'linear'``: the same with unmasked linear
    attention, the control), ELU after each, mean pooling, a linear classifier.
    ``hidden_channels`` is per head (``heads`` heads; GCN: the width). ``init='glorot'``
    initialises the ``'grf'`` and ``'linear'`` networks' linear maps as PyG's GATConv does
    (default ``'torch'``: torch's own initialisation); ``init='mha'`` only their attention
    layers, as :class:`torch.nn.MultiheadAttention` initialises its own (q, k, v projection
    Glorot-uniform, zero biases, output weight torch's default): what the package's attention
    would start from if it adopted that convention."""

    KINDS = ('gkat', 'gat', 'gcn', 'grf', 'linear')
    INITS = ('torch', 'glorot', 'mha')

    def __init__(self, in_channels: int, out_channels: int = 2, kind: str = 'gkat',
                 hidden_channels: int = 9, heads: int = 2, mode: str = 'softmax',
                 threshold: float = 0.0, max_length: int = 3, f_mode: str = 'abs',
                 init: str = 'torch'):
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        if init not in self.INITS:
            raise ValueError(f"init must be one of {self.INITS}, got {init!r}")
        self.kind = kind
        width = heads * hidden_channels
        self.lin = (torch.nn.Linear(in_channels, width) if kind in ('grf', 'linear')
                    else None)
        if kind == 'grf':
            kw = dict(heads=heads, head_channels=hidden_channels, max_length=max_length,
                      f_mode=f_mode)
            self.conv1 = GRFAttention(width, layer_index=0, **kw)
            self.conv2 = GRFAttention(width, layer_index=1, **kw)
        elif kind == 'linear':
            self.conv1 = LinearAttention(width, heads=heads, head_channels=hidden_channels)
            self.conv2 = LinearAttention(width, heads=heads, head_channels=hidden_channels)
        elif kind == 'gkat':
            kw = dict(heads=heads, head_channels=hidden_channels, mode=mode,
                      threshold=threshold, project=False)
            self.conv1 = GKATAttention(in_channels, **kw)
            self.conv2 = GKATAttention(width, **kw)
        elif kind == 'gat':
            self.conv1 = GATConv(in_channels, hidden_channels, heads=heads)
            self.conv2 = GATConv(width, hidden_channels, heads=heads)
        else:
            width = hidden_channels
            self.conv1 = GCNConv(in_channels, width)
            self.conv2 = GCNConv(width, width)
        self.head = torch.nn.Linear(width, out_channels)
        if init == 'glorot' and self.lin is not None:
            # the attention networks' linear maps as PyG's GATConv initialises its own (and
            # torch.nn.MultiheadAttention its fused q, k, v projection): Glorot-uniform weights,
            # zero biases. Under torch's default (Kaiming-uniform, a = sqrt(5)) each of their
            # six maps between input and pooling shrinks the signal (std 1 / sqrt(3 fan_in)),
            # and the logits start ~10x flatter across graphs than GAT's or GCN's
            # (gkat_motifs_notes.md, 2026-12-07).
            for lin in (self.lin, self.conv1.to_qkv, self.conv1.to_out, self.conv2.to_qkv,
                        self.conv2.to_out):
                torch.nn.init.xavier_uniform_(lin.weight)
                torch.nn.init.zeros_(lin.bias)
        elif init == 'mha' and self.lin is not None:
            for conv in (self.conv1, self.conv2):
                torch.nn.init.xavier_uniform_(conv.to_qkv.weight)
                torch.nn.init.zeros_(conv.to_qkv.bias)
                torch.nn.init.zeros_(conv.to_out.bias)

    def forward(self, data) -> Tensor:
        x = data.x if self.lin is None else self.lin(data.x)
        if self.kind == 'grf':
            grf = model_payload(self, data)['grf']  # one GRFPlan for both layers
            layer = lambda conv, h: conv(h, grf=grf)  # noqa: E731
        elif self.kind == 'linear':
            layer = lambda conv, h: conv(h, data.batch)  # noqa: E731
        elif self.kind == 'gkat':
            rwgnk = RWGNKPlan.build(data)
            layer = lambda conv, h: conv(h, rwgnk=rwgnk)  # noqa: E731
        else:
            layer = lambda conv, h: conv(h, data.edge_index)  # noqa: E731
        x = F.elu(layer(self.conv1, x))
        x = F.elu(layer(self.conv2, x))
        return self.head(global_mean_pool(x, data.batch))
