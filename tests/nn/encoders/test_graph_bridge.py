import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data

from pyg_grf.nn.encoders.graph_bridge import GraphBridge, hashed_normal, structural_hash
from pyg_grf.transforms.graph_bridge import AddGraphBridgeTokens

# a directed 5-node graph (asymmetric, so all nodes are structurally distinct)
X = torch.randn(5, 3)
EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 3, 4], [1, 2, 0, 4, 1, 2]])
EDGE_ATTR = torch.randn(6, 2)


def test_graph_bridge_repr_and_shapes():
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4)
    assert str(gb) == ("GraphBridge(3, 8, edge_channels=2, pe_channels=4, "
                       "eval_noise='structural')")
    tokens, token_batch, token_type = gb(X, EDGE_INDEX, EDGE_ATTR)
    assert tokens.shape == (5 + 6, 8)
    assert token_batch.tolist() == [0] * 11
    assert token_type.tolist() == [0] * 5 + [1] * 6
    node_pe, edge_pe = gb.positional_encoding(X, EDGE_INDEX)
    assert node_pe.shape == (5, 8) and edge_pe.shape == (6, 8)


def test_graph_bridge_token_counts_per_graph():
    data = [Data(x=torch.randn(n, 3), edge_index=torch.randint(0, n, (2, e)),
                 edge_attr=torch.randn(e, 2)) for n, e in [(4, 6), (2, 0), (7, 9)]]
    batch = Batch.from_data_list(data)
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4)
    tokens, token_batch, token_type = gb(batch.x, batch.edge_index, batch.edge_attr,
                                         batch.batch)
    assert torch.bincount(token_batch).tolist() == [4 + 6, 2 + 0, 7 + 9]
    # graph by graph: nodes of g, then edges of g
    expected = [0] * 4 + [1] * 6 + [0] * 2 + [0] * 7 + [1] * 9
    assert token_type.tolist() == expected
    assert torch.equal(token_batch, torch.sort(token_batch).values)
    assert GraphBridge.node_tokens(tokens, token_type).shape == (13, 8)
    assert tokens[token_type == 1].shape == (15, 8)


def test_graph_bridge_tokens_are_the_mlps_of_nodes_and_edges():
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4).eval()
    tokens, _, token_type = gb(X, EDGE_INDEX, EDGE_ATTR)
    node_pe, edge_pe = gb.positional_encoding(X, EDGE_INDEX)
    assert torch.allclose(GraphBridge.node_tokens(tokens, token_type),
                          gb.node_mlp(torch.cat([X, node_pe], -1)))
    assert torch.allclose(tokens[token_type == 1],
                          gb.edge_mlp(torch.cat([EDGE_ATTR, edge_pe], -1)))


@pytest.mark.parametrize('training', [True, False])
def test_graph_bridge_edge_pe_is_difference(training):
    gb = GraphBridge(3, 8, pe_channels=4).train(training)
    node_pe, edge_pe = gb.positional_encoding(X, EDGE_INDEX)
    src, dst = EDGE_INDEX
    assert torch.allclose(edge_pe, node_pe[src] - node_pe[dst])
    assert not torch.allclose(edge_pe, node_pe[dst] - node_pe[src])  # direction kept


def test_graph_bridge_noise_scale_is_learned():
    gb = GraphBridge(3, 8, pe_channels=4, eval_noise='zero').eval()
    assert torch.allclose(F.softplus(gb.pe_scale_1), torch.ones(4))  # unit variance at init
    node_pe, _ = gb.positional_encoding(X, EDGE_INDEX)
    assert torch.allclose(node_pe, gb.pe_mlp(X))  # zero noise: the mean
    gb.train()
    node_pe, edge_pe = gb.positional_encoding(X, EDGE_INDEX)
    (node_pe.sum() + edge_pe.square().sum()).backward()
    assert gb.pe_scale_1.grad.abs().sum() > 0 and gb.pe_scale_2.grad.abs().sum() > 0


def test_graph_bridge_deterministic_in_eval_random_in_train():
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4)
    gb.train()
    assert not torch.allclose(gb(X, EDGE_INDEX, EDGE_ATTR)[0], gb(X, EDGE_INDEX, EDGE_ATTR)[0])
    gb.eval()
    for mode in ['structural', 'seeded', 'zero']:
        gb.eval_noise = mode
        assert torch.equal(gb(X, EDGE_INDEX, EDGE_ATTR)[0], gb(X, EDGE_INDEX, EDGE_ATTR)[0])
    gb.eval_noise = 'structural'
    node_pe, _ = gb.positional_encoding(X, EDGE_INDEX)
    gb.seed = 1
    assert not torch.allclose(node_pe, gb.positional_encoding(X, EDGE_INDEX)[0])


def test_graph_bridge_permutation_equivariant_in_eval():
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4).eval()
    tokens, _, token_type = gb(X, EDGE_INDEX, EDGE_ATTR)
    perm = torch.tensor([3, 0, 4, 2, 1])  # new node i is old node perm[i]
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(5)
    tokens_p, _, token_type_p = gb(X[perm], inv[EDGE_INDEX], EDGE_ATTR)
    assert torch.equal(token_type_p, token_type)
    node, node_p = GraphBridge.node_tokens(tokens, token_type), GraphBridge.node_tokens(
        tokens_p, token_type_p)
    assert torch.allclose(node_p, node[perm], atol=1e-6)
    assert torch.allclose(tokens_p[token_type_p == 1],
                          tokens[token_type == 1], atol=1e-6)
    # the noise is not zero, and it tells structurally different nodes apart
    eps = gb.noise(X, EDGE_INDEX)
    assert eps.abs().sum() > 0 and torch.unique(eps, dim=0).size(0) == 5


def test_graph_bridge_batch_equals_separate_and_transform_layout():
    data = [Data(x=torch.randn(n, 3), edge_index=torch.randint(0, n, (2, e)),
                 edge_attr=torch.randn(e, 2)) for n, e in [(4, 6), (3, 2), (6, 9)]]
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4).eval()
    batch = Batch.from_data_list([AddGraphBridgeTokens()(d) for d in data])
    out_sort = gb(batch.x, batch.edge_index, batch.edge_attr, batch.batch)
    out_tt = gb(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.token_type)
    for a, b in zip(out_sort, out_tt):
        assert torch.allclose(a, b) if a.is_floating_point() else torch.equal(a, b)
    tokens, token_batch, _ = out_tt
    for g, d in enumerate(data):
        single, _, _ = gb(d.x, d.edge_index, d.edge_attr)
        assert torch.allclose(tokens[token_batch == g], single, atol=1e-6)


def test_structural_hash_and_hashed_normal():
    h = structural_hash(X, EDGE_INDEX, 5)
    assert h.dtype == torch.long and h.shape == (5, ) and h.unique().numel() == 5
    # a 6-cycle with equal features: all nodes equivalent -> equal labels
    ring = torch.stack([torch.arange(6), (torch.arange(6) + 1) % 6])
    assert structural_hash(torch.ones(6, 1), ring, 6).unique().numel() == 1
    z = hashed_normal(torch.arange(20000), 4)
    assert abs(float(z.mean())) < 0.03 and abs(float(z.std()) - 1.) < 0.03


def test_graph_bridge_bad_input():
    with pytest.raises(ValueError, match='must be positive'):
        GraphBridge(3, 0)
    with pytest.raises(ValueError, match="Unknown eval_noise 'fixed'"):
        GraphBridge(3, 8, eval_noise='fixed')
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4)
    with pytest.raises(ValueError, match=r"Expected 'x' of shape \[N, 3\]"):
        gb(torch.randn(5, 4), EDGE_INDEX, EDGE_ATTR)
    with pytest.raises(ValueError, match=r"Expected 'edge_attr' of shape \[6, 2\]"):
        gb(X, EDGE_INDEX, torch.randn(6, 3))
    with pytest.raises(ValueError, match=r"Expected 'edge_attr'.*got None"):
        gb(X, EDGE_INDEX)
    with pytest.raises(ValueError, match=r"Expected 'edge_index' of shape \[2, E\]"):
        gb(X, EDGE_INDEX.t(), EDGE_ATTR)
    with pytest.raises(ValueError, match=r"Expected 'token_type' of shape \[11\]"):
        gb(X, EDGE_INDEX, EDGE_ATTR, token_type=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="edge_channels=None"):
        GraphBridge(3, 8)(X, EDGE_INDEX, EDGE_ATTR)


@pytest.mark.parametrize('training', [True, False])
def test_graph_bridge_uses_given_noise(training, monkeypatch):
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4).train(training)
    eps = AddGraphBridgeTokens(pe_dim=8, seed=0)(Data(x=X, edge_index=EDGE_INDEX)).bridge_noise
    torch.manual_seed(0)
    out = gb(X, EDGE_INDEX, EDGE_ATTR, noise=eps)
    # the module's own draw replaced by the same noise gives the same output
    monkeypatch.setattr(gb, 'noise', lambda *args: eps)
    torch.manual_seed(0)  # same dropout masks (none here)
    ref = gb(X, EDGE_INDEX, EDGE_ATTR)
    for a, b in zip(out, ref):
        assert torch.equal(a, b)
    # and the encoding is the documented one
    node_pe, edge_pe = gb.positional_encoding(X, EDGE_INDEX, noise=eps)
    scale = F.softplus(torch.cat([gb.pe_scale_1, gb.pe_scale_2]))
    assert torch.allclose(node_pe, eps * scale + gb.pe_mlp(X))
    assert torch.allclose(edge_pe, node_pe[EDGE_INDEX[0]] - node_pe[EDGE_INDEX[1]])


def test_graph_bridge_given_noise_is_deterministic_in_training():
    gb = GraphBridge(3, 8, pe_channels=4).train()
    eps = torch.randn(5, 8)
    assert torch.equal(gb(X, EDGE_INDEX, noise=eps)[0], gb(X, EDGE_INDEX, noise=eps)[0])
    assert not torch.allclose(gb(X, EDGE_INDEX)[0], gb(X, EDGE_INDEX)[0])  # default: fresh


def test_graph_bridge_given_noise_in_a_batch():
    transform = AddGraphBridgeTokens(pe_dim=8, seed=1)
    data = [transform(Data(x=torch.randn(n, 3), edge_index=torch.randint(0, n, (2, e)),
                           edge_attr=torch.randn(e, 2))) for n, e in [(4, 6), (3, 2), (6, 9)]]
    batch = Batch.from_data_list(data)
    gb = GraphBridge(3, 8, edge_channels=2, pe_channels=4).train()
    tokens, token_batch, _ = gb(batch.x, batch.edge_index, batch.edge_attr, batch.batch,
                                batch.token_type, noise=batch.bridge_noise)
    for g, d in enumerate(data):
        single, _, _ = gb(d.x, d.edge_index, d.edge_attr, noise=d.bridge_noise)
        assert torch.allclose(tokens[token_batch == g], single, atol=1e-6)


def test_graph_bridge_bad_noise():
    gb = GraphBridge(3, 8, pe_channels=4)
    with pytest.raises(ValueError, match=r"Expected 'noise' of shape \[5, 8\].*"
                                         r"AddGraphBridgeTokens\(pe_dim=8\).*got \[5, 4\]"):
        gb(X, EDGE_INDEX, noise=torch.randn(5, 4))
    with pytest.raises(TypeError, match=r"Expected 'noise' to be a floating-point tensor "
                                        r"\(got torch.int64\)"):
        gb(X, EDGE_INDEX, noise=torch.zeros(5, 8, dtype=torch.long))
