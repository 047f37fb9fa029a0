r"""The GPS layer of PyG with topology-aware linear-cost attention."""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Dropout, Linear, Sequential
from torch_geometric.nn.attention import PerformerAttention
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import reset
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver
from torch_geometric.typing import Adj
from torch_geometric.utils import to_dense_batch

from pyg_grf.features.loads import GRFLoads

ATTN_TYPES = ('grf', 'gkat', 'linear', 'performer', 'multihead')


class GRFGPSConv(torch.nn.Module):
    r"""The GPS layer of *Recipe for a General, Powerful, Scalable Graph Transformer* (Rampášek et
    al., 2022, `arXiv:2205.12454 <https://arxiv.org/abs/2205.12454>`_), shaped and computed exactly
    like :class:`torch_geometric.nn.conv.GPSConv`, whose global attention can be the topology-aware
    linear attention of the `"Linear Transformer Topological Masking with Graph Random Features"
    <https://arxiv.org/abs/2410.03462>`_ paper (Reid et al., 2024) or GKAT (the `"From
    block-Toeplitz matrices to differential equations on graphs: towards a general theory for
    scalable masked Transformers" <https://arxiv.org/abs/2107.07999>`_ paper), or, to compare like
    with like, unmasked linear attention, PyG's Performer or exact multi-head attention:

    .. math::
        \mathbf{h}_{\mathrm{local}} &= \mathrm{Norm}_1(\mathbf{x} + \mathrm{MPNN}(\mathbf{x},
            \mathcal{E})) \\
        \mathbf{h}_{\mathrm{global}} &= \mathrm{Norm}_2(\mathbf{x} + \mathrm{Attn}_M(\mathbf{x}))
            \\
        \mathbf{x}' &= \mathrm{Norm}_3(\mathbf{h} + \mathrm{MLP}(\mathbf{h})), \quad
        \mathbf{h} = \mathbf{h}_{\mathrm{local}} + \mathbf{h}_{\mathrm{global}}

    with dropout on both residual branches and inside the MLP. Attention never crosses the
    graphs of a mini-batch.

    Args:
        channels (int): size of each input and output sample.
        conv (MessagePassing, optional): the local message passing layer (any PyG
            :class:`~torch_geometric.nn.conv.MessagePassing`), or :obj:`None` for attention only.
        heads (int, optional): attention heads (default: :obj:`1`).
        dropout (float, optional): dropout of the residual branches and the MLP
            (default: :obj:`0.`).
        act (str or Callable, optional): activation of the MLP (default: :obj:`"relu"`).
        act_kwargs (dict, optional): its arguments (default: :obj:`None`).
        norm (str or Callable, optional): normalisation (default: :obj:`"batch_norm"`).
        norm_kwargs (dict, optional): its arguments (default: :obj:`None`).
        attn_type (str, optional): ``'grf'`` (:class:`~pyg_grf.nn.GRFAttention`, needs
            ``grf``), ``'gkat'`` (:class:`~pyg_grf.nn.GKATAttention`, needs ``rwgnk``),
            ``'linear'`` (unmasked linear attention per graph), ``'performer'``
            (:class:`torch_geometric.nn.attention.PerformerAttention`) or ``'multihead'``
            (:class:`torch.nn.MultiheadAttention`); the last two padded per graph as in
            :class:`~torch_geometric.nn.conv.GPSConv` (as there, the performer masks the padded
            values but not the padded keys, so padding enters its normaliser; ``'linear'`` with
            ``attn_kwargs={'feature_map': 'favor+'}`` is FAVOR+ strictly per graph)
            (default: :obj:`"grf"`).
        attn_kwargs (dict, optional): arguments of the attention layer, e.g.
            ``{'max_length': 4, 'global_beta': 0.1}`` for ``'grf'`` (default: :obj:`None`).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F)`, edge indices
          :math:`(2, |\mathcal{E}|)`, ``grf`` (a :class:`~pyg_grf.features.GRFLoads` of the
          batch), batch vector :math:`(|\mathcal{V}|)` (optional), further arguments of ``conv``
          (e.g. ``edge_attr``)
        - **output:** node features :math:`(|\mathcal{V}|, F)`
    """

    def __init__(self, channels: int, conv: Optional[MessagePassing], heads: int = 1,
                 dropout: float = 0.0, act: str = 'relu',
                 act_kwargs: Optional[Dict[str, Any]] = None, norm: Optional[str] = 'batch_norm',
                 norm_kwargs: Optional[Dict[str, Any]] = None, attn_type: str = 'grf',
                 attn_kwargs: Optional[Dict[str, Any]] = None):
        super().__init__()
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"'attn_type' must be one of {ATTN_TYPES}, got {attn_type!r}")
        if conv is not None and not isinstance(conv, torch.nn.Module):
            raise TypeError(f"'conv' must be a MessagePassing module or None, got "
                            f"{type(conv).__name__}")
        self.channels = channels
        self.conv = conv
        self.heads = heads
        self.dropout = dropout
        self.attn_type = attn_type
        self.attn_kwargs = dict(attn_kwargs or {})
        self.attn = _build_attention(attn_type, channels, heads, self.attn_kwargs)
        self.mlp = Sequential(
            Linear(channels, channels * 2),
            activation_resolver(act, **(act_kwargs or {})),
            Dropout(dropout),
            Linear(channels * 2, channels),
            Dropout(dropout),
        )
        norm_kwargs = norm_kwargs or {}
        self.norm1 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm2 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm3 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm_with_batch = False
        if self.norm1 is not None:
            self.norm_with_batch = 'batch' in inspect.signature(self.norm1.forward).parameters
        self.reset_parameters()

    def reset_parameters(self):
        r"""Resets all learnable parameters of the module."""
        if self.conv is not None:
            self.conv.reset_parameters()
        if hasattr(self.attn, 'reset_parameters'):
            self.attn.reset_parameters()
        else:  # torch's MultiheadAttention, PyG's PerformerAttention
            self.attn._reset_parameters()
        reset(self.mlp)
        for norm in (self.norm1, self.norm2, self.norm3):
            if norm is not None:
                norm.reset_parameters()

    def _norm(self, norm, h: Tensor, batch: Optional[Tensor]) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def forward(self, x: Tensor, edge_index: Adj, batch: Optional[Tensor] = None, *args,
                grf: Optional[GRFLoads] = None, rwgnk: Optional[Tuple[Tensor, ...]] = None,
                **kwargs) -> Tensor:
        r"""Runs the forward pass of the module, with the call shape of PyG's
        :class:`~torch_geometric.nn.conv.GPSConv`: ``conv(x, edge_index, batch, **kwargs)``.

        Args:
            x (Tensor): node features.
            edge_index (Tensor or SparseTensor): the graph, for ``conv``.
            batch (Tensor, optional): graph id of every node; attention never crosses graphs.
            grf (GRFLoads, optional): keyword only: the batch's GRF loads
                (``attn_type='grf'``), e.g. ``GRFLoads.from_data(batch)``, built once and
                passed to every layer.
            rwgnk (tuple, optional): keyword only: ``(rwgnk_index, rwgnk_value)``, optionally
                followed by ``(rwgnk_kernel_index, rwgnk_kernel_value)`` (``attn_type='gkat'``).
            **kwargs: further arguments of ``conv`` (e.g. ``edge_attr``).

        The old call ``conv(x, edge_index, grf, batch)`` (``grf`` third) still works for one
        release with a :class:`FutureWarning`; any other extra positional argument is an
        error, so a batch vector can never be taken for the loads.
        """
        legacy_none = batch is None and len(args) == 1 and isinstance(args[0], Tensor)
        if isinstance(batch, GRFLoads) or legacy_none:  # the old order (x, edge_index, grf, batch)
            warnings.warn("GRFGPSConv.forward(x, edge_index, grf, batch) is deprecated: use "
                          "PyG GPSConv's order, conv(x, edge_index, batch, grf=grf)",
                          FutureWarning, stacklevel=2)
            if grf is not None:
                raise TypeError("GRFGPSConv.forward got the GRF loads twice (third positional "
                                "argument and grf=)")
            grf, batch = batch, (args[0] if args else kwargs.pop('batch', None))
            args = args[1:]
        if args:
            raise TypeError(f"GRFGPSConv.forward takes (x, edge_index, batch) positionally, as "
                            f"PyG's GPSConv; pass grf=, rwgnk= and the conv's arguments by "
                            f"keyword (got {len(args)} more positional argument(s))")
        if batch is not None and not isinstance(batch, Tensor):
            raise TypeError(f"'batch' must be a tensor of graph ids, got {type(batch).__name__}")
        hs = []
        if self.conv is not None:  # local message passing
            h = self.conv(x, edge_index, **kwargs)
            if h.shape != x.shape:  # it is added to x
                raise ValueError(f"'conv' {self.conv!r} returned shape {tuple(h.shape)}, "
                                 f"expected {tuple(x.shape)} ([N, channels])")
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        # global attention, never across graphs
        h = self._attend(x, grf, batch, rwgnk)
        h = F.dropout(h, p=self.dropout, training=self.training)
        hs.append(self._norm(self.norm2, h + x, batch))
        out = sum(hs)
        out = out + self.mlp(out)
        return self._norm(self.norm3, out, batch)

    def _attend(self, x: Tensor, grf: Optional[GRFLoads], batch: Optional[Tensor],
                rwgnk: Optional[Tuple[Tensor, ...]]) -> Tensor:
        if self.attn_type == 'grf':
            if not isinstance(grf, GRFLoads):
                raise ValueError(f"attn_type='grf' needs grf=GRFLoads.from_data(batch) (the loads "
                                 f"of AddGraphRandomFeatures), got {type(grf).__name__}")
            return self.attn(x, grf=grf, batch=batch)
        if self.attn_type == 'gkat':
            if rwgnk is None or len(rwgnk) not in (2, 4):
                raise ValueError("attn_type='gkat' needs rwgnk=(rwgnk_index, rwgnk_value[, "
                                 "rwgnk_kernel_index, rwgnk_kernel_value]) from AddRWGNKFeatures")
            kernel = tuple(rwgnk[2:]) if len(rwgnk) == 4 else None
            return self.attn(x, rwgnk[0], rwgnk[1], batch, kernel=kernel)
        if self.attn_type == 'linear':
            return self.attn(x, batch)
        if x.size(0) == 0:  # an empty batch: nothing to pad
            return x * 0
        # padded per graph, as GPSConv runs these
        h, mask = to_dense_batch(x, batch)
        if self.attn_type == 'multihead':
            h, _ = self.attn(h, h, h, key_padding_mask=~mask, need_weights=False)
        else:
            h = self.attn(h, mask=mask)
        return h[mask]

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.channels}, conv={self.conv}, '
                f'heads={self.heads}, attn_type={self.attn_type!r})')


def _build_attention(attn_type: str, channels: int, heads: int,
                     kwargs: Dict[str, Any]) -> torch.nn.Module:
    if attn_type == 'grf':
        from pyg_grf.nn.attention.grf import GRFAttention
        return GRFAttention(channels, heads=heads, **kwargs)
    if attn_type == 'gkat':
        from pyg_grf.nn.attention.gkat import GKATAttention
        return GKATAttention(channels, heads=heads, **kwargs)
    if attn_type == 'linear':
        from pyg_grf.nn.attention.reference import LinearAttention
        return LinearAttention(channels, heads=heads, **kwargs)
    if attn_type == 'performer':
        return PerformerAttention(channels=channels, heads=heads, **kwargs)
    return torch.nn.MultiheadAttention(channels, heads, batch_first=True, **kwargs)
