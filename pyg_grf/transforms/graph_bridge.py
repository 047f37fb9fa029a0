r"""Per-graph token layout of Graph-Bridge (SAMSA paper, paper 004, Sec. 4.3)."""
from __future__ import annotations

import torch

from torch_geometric.data import Data
from torch_geometric.data.datapipes import functional_transform
from torch_geometric.transforms import BaseTransform


@functional_transform('add_graph_bridge_tokens')
class AddGraphBridgeTokens(BaseTransform):
    r"""Stores the Graph-Bridge token layout of a graph (SAMSA paper, paper 004, Sec. 4.3):
    its :math:`N` nodes and :math:`E` edges are both tokens, the node tokens first (in node
    order), then the edge tokens (in edge order)
    (functional name: :obj:`add_graph_bridge_tokens`).

    Adds :obj:`data[attr_name]`, a long tensor of shape :math:`(N + E)` holding :obj:`0` for a
    node token and :obj:`1` for an edge token, and :obj:`data[num_tokens_attr] = N + E`. PyG
    concatenates :obj:`token_type` graph by graph when batching, which is exactly the layout of
    :class:`~pyg_grf.nn.GraphBridge`, so a mini-batch needs neither a Python loop nor a sort:
    pass :obj:`token_type=batch.token_type` to :meth:`GraphBridge.forward`. Apply it after any
    transform that changes :obj:`edge_index` (e.g.
    :class:`~torch_geometric.transforms.ToUndirected`).

    Args:
        attr_name (str, optional): Attribute name of the token types.
            (default: :obj:`"token_type"`)
        num_tokens_attr (str, optional): Attribute name of the token count :math:`N + E`;
            :obj:`None` to skip it. (default: :obj:`"num_tokens"`)
    """
    def __init__(self, attr_name: str = 'token_type',
                 num_tokens_attr: str | None = 'num_tokens') -> None:
        if 'index' in attr_name or 'batch' in attr_name:
            raise ValueError(f"'attr_name' must not contain 'index' or 'batch' "
                             f"(PyG would offset it when batching; got '{attr_name}')")
        self.attr_name = attr_name
        self.num_tokens_attr = num_tokens_attr

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
        return data

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(attr_name={self.attr_name!r}, '
                f'num_tokens_attr={self.num_tokens_attr!r})')
