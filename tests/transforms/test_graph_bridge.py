import pytest
import torch

from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from pyg_grf.transforms.graph_bridge import AddGraphBridgeTokens


def test_add_graph_bridge_tokens():
    transform = AddGraphBridgeTokens()
    assert str(transform) == ("AddGraphBridgeTokens(attr_name='token_type', "
                              "num_tokens_attr='num_tokens')")
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    data = Data(x=torch.randn(3, 2), edge_index=edge_index)
    out = transform(data)
    assert out.token_type.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert out.num_tokens == 7
    assert 'token_type' not in data  # the input is not modified


def test_add_graph_bridge_tokens_functional_and_options():
    transform = AddGraphBridgeTokens(attr_name='gb_type', num_tokens_attr=None)
    assert str(transform) == "AddGraphBridgeTokens(attr_name='gb_type', num_tokens_attr=None)"
    out = transform(Data(num_nodes=4, edge_index=torch.empty(2, 0, dtype=torch.long)))
    assert out.gb_type.tolist() == [0, 0, 0, 0] and 'num_tokens' not in out
    with pytest.raises(ValueError, match="must not contain 'index'"):
        AddGraphBridgeTokens(attr_name='token_index')


def test_add_graph_bridge_tokens_batching():
    transform = AddGraphBridgeTokens()
    sizes = [(3, 4), (1, 0), (5, 7)]
    data_list = [transform(Data(x=torch.randn(n, 2), edge_index=torch.randint(0, n, (2, e))))
                 for n, e in sizes]
    batch = Batch.from_data_list(data_list)
    expected = sum(([0] * n + [1] * e for n, e in sizes), [])
    assert batch.token_type.tolist() == expected  # graph by graph, no offsets
    assert batch.num_tokens.tolist() == [7, 1, 12]
    loader = DataLoader(data_list, batch_size=2)
    assert [b.token_type.numel() for b in loader] == [8, 12]
