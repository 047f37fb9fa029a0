r"""Per-graph token layout of Graph-Bridge (SAMSA paper, Sec. 4.3)."""
from __future__ import annotations

from typing import Optional

import torch
from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform

from pyg_grf.transforms._seeding import TransformRNG


@functional_transform('add_graph_bridge_tokens')
class AddGraphBridgeTokens(BaseTransform):
    r"""Stores the Graph-Bridge token layout of a graph (SAMSA paper, Sec. 4.3): its :math:`N`
    nodes and :math:`E` edges are all tokens, the node tokens first (in node order), then the
    edge tokens (functional name: :obj:`add_graph_bridge_tokens`).

    Adds :obj:`data[attr_name]`, :math:`(N + E)`, :obj:`0` for a node token and :obj:`1` for an
    edge token, and :obj:`data[num_tokens_attr] = N + E`. PyG batches :obj:`token_type` graph by
    graph, which is the layout of :class:`~pyg_grf.nn.GraphBridge`, so a mini-batch needs no
    sort (``token_type=batch.token_type``). Apply it after any transform that changes
    :obj:`edge_index`.

    With :obj:`pe_dim` it also draws the Gaussian noise of the Graph-Bridge positional encoding,
    :math:`[\boldsymbol{\epsilon}^{(1)} \Vert \boldsymbol{\epsilon}^{(2)}]_i \sim
    \mathcal{N}(\mathbf{0}, \mathbf{I})`, as :obj:`data[pe_attr]` :math:`(N, \mathrm{pe\_dim})`,
    which :class:`~pyg_grf.nn.GraphBridge` uses as :obj:`noise=` (:obj:`pe_dim = 2 *
    pe_channels`): as a :obj:`pre_transform` drawn once and cached, so every epoch sees the same
    encoding. Without it the module draws fresh noise at every forward pass, as in the paper.

    Args:
        attr_name (str, optional): Attribute of the token types. (default: :obj:`"token_type"`)
        num_tokens_attr (str, optional): Attribute of the token count :math:`N + E`;
            :obj:`None` to skip it. (default: :obj:`"num_tokens"`)
        pe_dim (int, optional): Width of the stored noise; :obj:`None` stores none.
            (default: :obj:`None`)
        seed (int, optional): Seed of the noise (see :mod:`pyg_grf.transforms._seeding`);
            :obj:`None` uses torch's global generator. (default: :obj:`None`)
        pe_attr (str, optional): Attribute of the noise. (default: :obj:`"bridge_noise"`)
    """
    def __init__(self, attr_name: str = 'token_type',
                 num_tokens_attr: Optional[str] = 'num_tokens', pe_dim: Optional[int] = None,
                 seed: Optional[int] = None, pe_attr: str = 'bridge_noise') -> None:
        for name, value in (('attr_name', attr_name), ('pe_attr', pe_attr)):
            if 'index' in value or 'batch' in value:
                raise ValueError(f"'{name}' must not contain 'index' or 'batch' "
                                 f"(PyG would offset it when batching; got '{value}')")
        if pe_dim is not None and (isinstance(pe_dim, bool) or not isinstance(pe_dim, int)
                                   or pe_dim < 1):
            raise ValueError(f"'pe_dim' must be a positive integer or None (got {pe_dim!r})")
        if pe_attr in (attr_name, num_tokens_attr):
            raise ValueError(f"'pe_attr' must differ from 'attr_name' and 'num_tokens_attr' "
                             f"(got '{pe_attr}')")
        self.attr_name, self.num_tokens_attr = attr_name, num_tokens_attr
        self.pe_dim, self.pe_attr = pe_dim, pe_attr
        self.seed, self.rng = seed, TransformRNG(seed)

    def forward(self, data: Data) -> Data:
        N = data.num_nodes
        if N is None:
            raise ValueError("Cannot infer the number of nodes of the graph")
        E = data.num_edges
        device = data.edge_index.device if data.edge_index is not None else None
        data[self.attr_name] = torch.cat([
            torch.zeros(N, dtype=torch.long, device=device),
            torch.ones(E, dtype=torch.long, device=device),
        ])
        if self.num_tokens_attr is not None:
            data[self.num_tokens_attr] = N + E
        if self.pe_dim is not None:
            # drawn on the CPU (the generator's device), so a seed gives the same noise anywhere
            noise = torch.randn(N, self.pe_dim, generator=self.rng.generator())
            data[self.pe_attr] = noise.to(device) if device is not None else noise
        return data

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(attr_name={self.attr_name!r}, '
                f'num_tokens_attr={self.num_tokens_attr!r}, pe_dim={self.pe_dim}, '
                f'seed={self.seed}, pe_attr={self.pe_attr!r})')
