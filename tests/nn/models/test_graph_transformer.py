import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
from torch_geometric.utils import erdos_renyi_graph, to_undirected

from pyg_grf.nn.models.graph_transformer import ATTENTIONS, AttentionAdapter, GraphTransformer

KWARGS = {
    'grf': {'max_length': 3},
    'samsa': {'num_samples': 4},
}


def _graphs():
    from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures
    grf = AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=3, seed=0)
    rwgnk = AddRWGNKFeatures(num_walks=8, lam=0.5, alpha=1.0, max_length=3, seed=0)
    gen = torch.Generator().manual_seed(0)
    graphs = []
    for n in (5, 9, 3):  # different sizes
        edge_index = to_undirected(erdos_renyi_graph(n, 0.5))
        data = Data(x=torch.randn(n, 4, generator=gen), edge_index=edge_index,
                    edge_attr=torch.randn(edge_index.size(1), 3, generator=gen),
                    y=torch.tensor([n % 2]))
        graphs.append(rwgnk(grf(data)))
    return graphs


@pytest.fixture(scope='module')
def graphs():
    return _graphs()


@pytest.mark.parametrize('attention', sorted(ATTENTIONS))
@pytest.mark.parametrize('local_mp', [None, 'gine'])
def test_attention_kinds_batch_equals_per_graph(graphs, attention, local_mp):
    torch.manual_seed(0)
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attention=attention,
                             attention_kwargs=KWARGS.get(attention), local_mp=local_mp,
                             edge_encoder='linear', edge_dim=3).eval()
    batch = Batch.from_data_list(graphs)
    out = model(batch)
    assert out.shape == (3, 3)
    assert torch.isfinite(out).all()
    per_graph = torch.cat([model(Batch.from_data_list([g])) for g in graphs])
    assert torch.allclose(out, per_graph, atol=1e-5)
    model.train()
    model(batch).sum().backward()


@pytest.mark.parametrize('attention', ['grf', 'linear', 'softmax'])
def test_node_level(graphs, attention):
    model = GraphTransformer(4, 16, 5, num_layers=1, attention=attention,
                             attention_kwargs=KWARGS.get(attention), pooling=None).eval()
    batch = Batch.from_data_list(graphs)
    out = model(batch)
    assert out.shape == (batch.num_nodes, 5)
    per_graph = torch.cat([model(g) for g in graphs])  # plain Data works too
    assert torch.allclose(out, per_graph, atol=1e-5)


def test_attention_never_crosses_graphs(graphs):
    # Changing one graph's features leaves the other graphs' outputs unchanged.
    model = GraphTransformer(4, 16, 2, num_layers=2, attention='grf',
                             attention_kwargs={'max_length': 3}, pooling=None).eval()
    batch = Batch.from_data_list(graphs)
    out = model(batch)
    other = batch.clone()
    other.x = other.x.clone()
    other.x[batch.batch == 1] += 1.0
    out2 = model(other)
    keep = batch.batch != 1
    assert torch.allclose(out[keep], out2[keep], atol=1e-6)
    assert not torch.allclose(out[~keep], out2[~keep])


@pytest.mark.parametrize('local_mp', ['gin', 'gat', 'gine'])
def test_local_mp_and_no_attention(graphs, local_mp):
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(4, 16, 2, num_layers=2, heads=2, attention=None, local_mp=local_mp,
                             edge_encoder='linear', edge_dim=3, pooling='add')
    assert model(batch).shape == (3, 2)


@pytest.mark.parametrize('pe', ['rwpe', 'lappe'])
def test_positional_encodings(graphs, pe):
    t = (AddRandomWalkPE(4, attr_name='random_walk_pe') if pe == 'rwpe' else
         AddLaplacianEigenvectorPE(2, attr_name='laplacian_eigenvector_pe'))
    batch = Batch.from_data_list([t(g.clone()) for g in graphs if g.num_nodes > 3])
    model = GraphTransformer(4, 16, 2, num_layers=1, attention='linear', pe=pe,
                             pe_dim=4 if pe == 'rwpe' else 2)
    assert model(batch).shape == (2, 2)
    with pytest.raises(ValueError, match='pe_dim=3'):
        GraphTransformer(4, 16, 2, num_layers=1, attention='linear', pe=pe, pe_dim=3)(batch)


@pytest.mark.parametrize('pooling', ['mean', None])
def test_graph_bridge(graphs, pooling):
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(4, 16, 2, num_layers=1, attention='linear', pe='graph_bridge',
                             pe_dim=4, edge_encoder='linear', edge_dim=3, pooling=pooling).eval()
    out = model(batch)
    assert out.shape == ((3, 2) if pooling else (batch.num_nodes, 2))
    with pytest.raises(ValueError, match="pe='graph_bridge'"):
        GraphTransformer(4, 16, 2, num_layers=1, attention='grf', pe='graph_bridge')


def test_categorical_encoders():
    # OGB atom / bond features (9 and 3 categorical columns).
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    data = Data(x=torch.zeros(3, 9, dtype=torch.long), edge_index=edge_index,
                edge_attr=torch.zeros(4, 3, dtype=torch.long))
    model = GraphTransformer(None, 16, 10, num_layers=1, attention='linear', local_mp='gine',
                             node_encoder='atom', edge_encoder='bond')
    assert model(Batch.from_data_list([data, data])).shape == (2, 10)
    # Graphs without features.
    model = GraphTransformer(None, 16, 2, num_layers=1, attention='linear', node_encoder=None)
    assert model(Batch.from_data_list([Data(edge_index=edge_index, num_nodes=3)])).shape == (1, 2)


def test_forward_does_not_mutate(graphs):
    batch = Batch.from_data_list(graphs)
    before = {k: v.clone() for k, v in batch.items() if torch.is_tensor(v)}
    model = GraphTransformer(4, 16, 2, num_layers=2, attention='grf',
                             attention_kwargs={'max_length': 3}, local_mp='gine',
                             edge_encoder='linear', edge_dim=3)
    model(batch)
    after = {k: v for k, v in batch.items() if torch.is_tensor(v)}
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_repr_and_errors(graphs):
    model = GraphTransformer(4, 16, 2, num_layers=2, heads=2, attention='linear')
    assert str(model) == ("GraphTransformer(4, 16, 2, num_layers=2, heads=2, attention='linear', "
                          "local_mp=None, pe=None, pooling='mean')")
    with pytest.raises(ValueError, match="attention must be one of"):
        GraphTransformer(4, 16, 2, num_layers=1, attention='full')
    with pytest.raises(ValueError, match="local_mp must be one of"):
        GraphTransformer(4, 16, 2, num_layers=1, local_mp='gcn')
    with pytest.raises(ValueError, match="needs edge features"):
        GraphTransformer(4, 16, 2, num_layers=1, local_mp='gine')
    with pytest.raises(ValueError, match="cannot both be None"):
        GraphTransformer(4, 16, 2, num_layers=1, attention=None)
    # Missing GRF fields: says which and how to add them.
    plain = Data(x=torch.randn(3, 4), edge_index=torch.tensor([[0, 1], [1, 0]]))
    model = GraphTransformer(4, 16, 2, num_layers=1, attention='grf')
    with pytest.raises(ValueError, match="grf_index.*AddGraphRandomFeatures"):
        model(plain)
    with pytest.raises(ValueError, match="expected data.x with 5 features"):
        GraphTransformer(5, 16, 2, num_layers=1, attention='linear')(plain)


def test_custom_adapter(graphs):
    class MeanAdapter(AttentionAdapter):  # attention = mean of the graph's nodes
        def build(self, channels, heads, dropout, **kwargs):
            return torch.nn.Linear(channels, channels)

        def forward(self, x, batch, num_graphs, fields):
            from torch_geometric.nn import global_mean_pool
            return self.attn(global_mean_pool(x, batch, num_graphs)[batch])

    model = GraphTransformer(4, 8, 2, num_layers=1, attention=MeanAdapter)
    assert model(Batch.from_data_list(graphs)).shape == (3, 2)


def test_gkat_reads_stored_kernel_pairs(graphs):
    # With the kernel pairs stored by AddRWGNKFeatures(kernel_threshold=0.) the 'gkat' softmax
    # transformer gives the same outputs as when each layer recomputes Psi Psi^T.
    from pyg_grf.nn.attention.gkat import rwgnk_kernel
    with_kernel = []
    for d in graphs:
        d = d.clone()
        d.rwgnk_kernel_index, d.rwgnk_kernel_value = rwgnk_kernel(d.rwgnk_index, d.rwgnk_value,
                                                                  d.num_nodes)
        with_kernel.append(d)
    torch.manual_seed(0)
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attention='gkat',
                             attention_kwargs={'mode': 'softmax'}).eval()
    a = model(Batch.from_data_list(graphs))
    b = model(Batch.from_data_list(with_kernel))
    assert torch.allclose(a, b, atol=1e-6)
    # And the stored pairs are used: corrupting them changes the output.
    bad = Batch.from_data_list(with_kernel)
    bad.rwgnk_kernel_value = bad.rwgnk_kernel_value * torch.rand_like(bad.rwgnk_kernel_value)
    assert not torch.allclose(a, model(bad), atol=1e-4)


def test_head_is_pyg_mlp(graphs):
    # head_layers=2: PyG's MLP, linear -> act -> dropout -> linear, checked against the formula
    # on the pooled node states (dropout is off in eval mode; an int dropout is accepted).
    from torch_geometric.nn import MLP, global_mean_pool
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(4, 16, 3, num_layers=1, attention='linear', dropout=0, act='relu')
    assert isinstance(model.head, MLP) and str(model.head) == 'MLP(16, 16, 3)'
    model.eval()
    captured = {}
    model.final_norm.register_forward_hook(lambda m, i, out: captured.setdefault('x', out))
    out = model(batch)
    pooled = global_mean_pool(captured['x'], batch.batch)
    w0, b0, w1, b1 = (model.head.lins[0].weight, model.head.lins[0].bias,
                      model.head.lins[1].weight, model.head.lins[1].bias)
    expected = torch.relu(pooled @ w0.T + b0) @ w1.T + b1
    assert torch.allclose(out, expected, atol=1e-6)
    # Dropout sits between the two layers in training mode.
    model = GraphTransformer(4, 16, 3, num_layers=1, attention='linear', dropout=0.5)
    assert model.head.dropout == [0.5, 0.0]


@pytest.mark.parametrize('local_mp', ['gin', 'gine'])
def test_checkpoints_with_the_old_mlp_layout_load(graphs, local_mp):
    # Before the two-layer MLPs were PyG MLPs they were Sequential(Linear, act, Dropout, Linear)
    # with keys '<name>.0.*' and '<name>.3.*'; such state dicts still load, to the same outputs.
    batch = Batch.from_data_list(graphs)
    kwargs = dict(num_layers=2, attention='linear', local_mp=local_mp, edge_encoder='linear',
                  edge_dim=3)
    model = GraphTransformer(4, 16, 3, **kwargs).eval()
    old = {k.replace('head.lins.0.', 'head.0.').replace('head.lins.1.', 'head.3.')
            .replace('nn.lins.0.', 'nn.0.').replace('nn.lins.1.', 'nn.3.'): v
           for k, v in model.state_dict().items()}
    assert 'head.3.weight' in old and 'blocks.1.local_mp.nn.0.bias' in old
    fresh = GraphTransformer(4, 16, 3, **kwargs).eval()
    fresh.load_state_dict(old)  # strict
    assert torch.equal(fresh(batch), model(batch))
    # The same inside a parent module (a LightningModule stores the model as 'model.*').
    parent = torch.nn.Module()
    parent.model = GraphTransformer(4, 16, 3, **kwargs).eval()
    parent.load_state_dict({f'model.{k}': v for k, v in old.items()})
    assert torch.equal(parent.model(batch), model(batch))
