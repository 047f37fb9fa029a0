import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.transforms import AddLaplacianEigenvectorPE, AddRandomWalkPE
from torch_geometric.utils import erdos_renyi_graph, to_undirected

from pyg_grf.nn import GRFAttention
from pyg_grf.nn.attention.grf import GRFPlan
from pyg_grf.nn.attention.registry import ATTENTIONS
from pyg_grf.nn.models.graph_transformer import GraphTransformer
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import batch_with_draws, make_batch, make_layer

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


# 'grid_rpe' needs every graph to be one grid: tests/masks/test_grid.py; PyG's
# PerformerAttention draws new random features on every call
@pytest.mark.parametrize('attention', [a for a in sorted(ATTENTIONS)
                                       if a not in ('grid_rpe', 'performer')])
@pytest.mark.parametrize('conv', [None, 'gine'])
def test_attention_kinds_batch_equals_per_graph(graphs, attention, conv):
    torch.manual_seed(0)
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attn_type=attention,
                             attn_kwargs=KWARGS.get(attention), conv=conv,
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
    model = GraphTransformer(4, 16, 5, num_layers=1, attn_type=attention,
                             attn_kwargs=KWARGS.get(attention), pooling=None).eval()
    batch = Batch.from_data_list(graphs)
    out = model(batch)
    assert out.shape == (batch.num_nodes, 5)
    per_graph = torch.cat([model(g) for g in graphs])  # plain Data works too
    assert torch.allclose(out, per_graph, atol=1e-5)


def test_attention_never_crosses_graphs(graphs):
    # Changing one graph's features leaves the other graphs' outputs unchanged.
    model = GraphTransformer(4, 16, 2, num_layers=2, attn_type='grf',
                             attn_kwargs={'max_length': 3}, pooling=None).eval()
    batch = Batch.from_data_list(graphs)
    out = model(batch)
    other = batch.clone()
    other.x = other.x.clone()
    other.x[batch.batch == 1] += 1.0
    out2 = model(other)
    keep = batch.batch != 1
    assert torch.allclose(out[keep], out2[keep], atol=1e-6)
    assert not torch.allclose(out[~keep], out2[~keep])


@pytest.mark.parametrize('conv', ['gin', 'gat', 'gine'])
def test_conv_and_no_attention(graphs, conv):
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(4, 16, 2, num_layers=2, heads=2, attn_type=None, conv=conv,
                             edge_encoder='linear', edge_dim=3, pooling='add')
    assert model(batch).shape == (3, 2)


@pytest.mark.parametrize('pe', ['rwpe', 'lappe'])
def test_positional_encodings(graphs, pe):
    t = (AddRandomWalkPE(4, attr_name='random_walk_pe') if pe == 'rwpe' else
         AddLaplacianEigenvectorPE(2, attr_name='laplacian_eigenvector_pe'))
    batch = Batch.from_data_list([t(g.clone()) for g in graphs if g.num_nodes > 3])
    model = GraphTransformer(4, 16, 2, num_layers=1, attn_type='linear', pe=pe,
                             pe_dim=4 if pe == 'rwpe' else 2)
    assert model(batch).shape == (2, 2)
    with pytest.raises(ValueError, match='pe_dim=3'):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type='linear', pe=pe, pe_dim=3)(batch)


@pytest.mark.parametrize('pooling', ['mean', None])
def test_graph_bridge(graphs, pooling):
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(4, 16, 2, num_layers=1, attn_type='linear', pe='graph_bridge',
                             pe_dim=4, edge_encoder='linear', edge_dim=3, pooling=pooling).eval()
    out = model(batch)
    assert out.shape == ((3, 2) if pooling else (batch.num_nodes, 2))
    with pytest.raises(ValueError, match="pe='graph_bridge'"):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type='grf', pe='graph_bridge')


def test_categorical_encoders():
    # OGB atom / bond features (9 and 3 categorical columns).
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    data = Data(x=torch.zeros(3, 9, dtype=torch.long), edge_index=edge_index,
                edge_attr=torch.zeros(4, 3, dtype=torch.long))
    model = GraphTransformer(None, 16, 10, num_layers=1, attn_type='linear', conv='gine',
                             node_encoder='atom', edge_encoder='bond')
    assert model(Batch.from_data_list([data, data])).shape == (2, 10)
    # Graphs without features.
    model = GraphTransformer(None, 16, 2, num_layers=1, attn_type='linear', node_encoder=None)
    assert model(Batch.from_data_list([Data(edge_index=edge_index, num_nodes=3)])).shape == (1, 2)


def test_forward_does_not_mutate(graphs):
    batch = Batch.from_data_list(graphs)
    before = {k: v.clone() for k, v in batch.items() if torch.is_tensor(v)}
    model = GraphTransformer(4, 16, 2, num_layers=2, attn_type='grf',
                             attn_kwargs={'max_length': 3}, conv='gine',
                             edge_encoder='linear', edge_dim=3)
    model(batch)
    after = {k: v for k, v in batch.items() if torch.is_tensor(v)}
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_repr_and_errors(graphs):
    model = GraphTransformer(4, 16, 2, num_layers=2, heads=2, attn_type='linear')
    assert str(model) == ("GraphTransformer(4, 16, 2, num_layers=2, heads=2, attn_type='linear', "
                          "conv=None, pe=None, pooling='mean')")
    with pytest.raises(ValueError, match="attn_type must be one of"):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type='full')
    with pytest.raises(ValueError, match="string 'None': write null in a YAML config"):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type='None', conv='gin')
    with pytest.raises(ValueError, match="conv must be one of"):
        GraphTransformer(4, 16, 2, num_layers=1, conv='gcn')
    with pytest.raises(ValueError, match="needs edge features"):
        GraphTransformer(4, 16, 2, num_layers=1, conv='gine')
    with pytest.raises(ValueError, match="cannot both be None"):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type=None)
    # Missing GRF fields: says which and how to add them.
    plain = Data(x=torch.randn(3, 4), edge_index=torch.tensor([[0, 1], [1, 0]]))
    model = GraphTransformer(4, 16, 2, num_layers=1, attn_type='grf')
    with pytest.raises(ValueError, match="grf_index.*AddGraphRandomFeatures"):
        model(plain)
    with pytest.raises(ValueError, match="expected data.x with 5 features"):
        GraphTransformer(5, 16, 2, num_layers=1, attn_type='linear')(plain)


def test_custom_graph_attention(graphs):
    # the way to add an attention kind: a GraphAttention subclass, built as
    # cls(hidden_channels, heads=heads, dropout=attn_dropout, **attn_kwargs)
    import warnings

    from torch_geometric.nn import global_mean_pool

    from pyg_grf.nn.attention import GraphAttention

    class MeanAttention(GraphAttention):  # attention = mean of the graph's nodes
        def __init__(self, channels, heads=1, dropout=0.0):
            super().__init__()
            self.lin = torch.nn.Linear(channels, channels)

        def forward(self, x, batch=None):
            return self.lin(global_mean_pool(x, batch)[batch])

    with warnings.catch_warnings():
        warnings.simplefilter('error', FutureWarning)
        model = GraphTransformer(4, 8, 2, num_layers=1, attn_type=MeanAttention).eval()
        batch = Batch.from_data_list(graphs)
        out = model(batch)
    assert isinstance(model.blocks[0].attn, MeanAttention) and out.shape == (3, 2)
    per_graph = torch.cat([model(Batch.from_data_list([g])) for g in graphs])
    assert torch.allclose(out, per_graph, atol=1e-5)


def test_gkat_reads_stored_kernel_pairs(graphs):
    # With the kernel pairs stored by AddRWGNKFeatures(kernel_threshold=0.) the 'gkat' softmax
    # transformer gives the same outputs as when each layer recomputes Psi Psi^T.
    from pyg_grf.features import rwgnk_kernel
    with_kernel = []
    for d in graphs:
        d = d.clone()
        d.rwgnk_kernel_index, d.rwgnk_kernel_value = rwgnk_kernel(d.rwgnk_index, d.rwgnk_value,
                                                                  d.num_nodes)
        with_kernel.append(d)
    torch.manual_seed(0)
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attn_type='gkat',
                             attn_kwargs={'mode': 'softmax'}).eval()
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
    model = GraphTransformer(4, 16, 3, num_layers=1, attn_type='linear', dropout=0, act='relu')
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
    model = GraphTransformer(4, 16, 3, num_layers=1, attn_type='linear', dropout=0.5)
    assert model.head.dropout == [0.5, 0.0]


# A MessagePassing instance as conv #######################################################


def _head(model, x):
    # head_layers=2, eval mode: linear -> act (gelu) -> linear.
    lin0, lin1 = model.head.lins
    return lin1(torch.nn.functional.gelu(lin0(x)))


@pytest.mark.parametrize('edge_attr', [True, False])
def test_conv_instance_equals_hand_composition(graphs, edge_attr):
    # Pre-norm blocks with a user's conv: x + Attn(h) + conv(h, edge_index[, edge_attr]),
    # h = Norm1(x), then the residual FFN; edge features go to the conv when its forward
    # takes them (TransformerConv does).
    from torch_geometric.nn import TransformerConv, global_mean_pool
    batch = Batch.from_data_list(graphs)
    conv = TransformerConv(16, 8, heads=2, edge_dim=16 if edge_attr else None)
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attn_type='linear',
                             conv=conv, edge_encoder='linear' if edge_attr else None,
                             edge_dim=3).eval()
    x = batch.x @ model.node_encoder.weight.T + model.node_encoder.bias
    e = None
    if edge_attr:
        e = batch.edge_attr @ model.edge_encoder.weight.T + model.edge_encoder.bias
    for block in model.blocks:
        h = block.norm1(x)
        m = (block.conv(h, batch.edge_index, edge_attr=e) if edge_attr else
             block.conv(h, batch.edge_index))
        y = x + block.attn(h, batch.batch) + m
        x = y + block.mlp(block.norm2(y))
    ref = _head(model, global_mean_pool(model.final_norm(x), batch.batch))
    assert torch.allclose(model(batch), ref, atol=1e-5)
    if edge_attr:  # the edge features do reach the conv
        other = batch.clone()
        other.edge_attr = torch.randn_like(batch.edge_attr)
        assert not torch.allclose(model(other), ref, atol=1e-4)


def test_conv_instance_is_copied_per_layer(graphs):
    from torch_geometric.nn import GATConv
    conv = GATConv(16, 8, heads=2)
    template = {k: v.clone() for k, v in conv.state_dict().items()}
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attn_type='linear',
                             conv=conv)
    first, second = model.blocks[0].conv, model.blocks[1].conv
    assert isinstance(first, GATConv) and first is not conv and first is not second
    # Reset copies: own, different weights; the template is untouched and not a submodule.
    assert not torch.equal(first.lin.weight, second.lin.weight)
    assert all(torch.equal(v, conv.state_dict()[k]) for k, v in template.items())
    own = {id(p) for p in model.parameters()}
    assert not any(id(p) in own for p in conv.parameters())
    assert not any(k.startswith(('conv', 'local_mp')) for k in model.state_dict())
    assert str(model) == ("GraphTransformer(4, 16, 3, num_layers=2, heads=2, "
                          "attn_type='linear', conv=GATConv(16, 8, heads=2), pe=None, "
                          "pooling='mean')")
    model(Batch.from_data_list(graphs)).sum().backward()
    assert first.lin.weight.grad is not None and second.lin.weight.grad is not None


def test_conv_instance_bad_input(graphs):
    from torch_geometric.nn import GATConv, GCNConv, GINConv, GINEConv
    kw = dict(num_layers=1, attn_type='linear')
    with pytest.raises(TypeError, match=r"MessagePassing instance or None, got Linear"):
        GraphTransformer(4, 16, 2, conv=torch.nn.Linear(16, 16), **kw)
    with pytest.raises(TypeError, match=r"pass an instance, e.g. GATConv\(hidden_channels"):
        GraphTransformer(4, 16, 2, conv=GATConv, **kw)
    with pytest.raises(TypeError, match="class_path/init_args"):
        GraphTransformer(4, 16, 2, conv={'class_path': 'torch_geometric.nn.GATConv'}, **kw)
    with pytest.raises(ValueError, match=r"in_channels=8, expected hidden_channels=16"):
        GraphTransformer(4, 16, 2, conv=GCNConv(8, 16), **kw)
    with pytest.raises(ValueError, match=r"out_channels=4 x heads=2 = 8 features, expected "
                                         r"hidden_channels=16"):
        GraphTransformer(4, 16, 2, conv=GATConv(16, 4, heads=2), **kw)
    with pytest.raises(ValueError, match=r"edge_dim=5, expected hidden_channels=16"):
        GraphTransformer(4, 16, 2, conv=GATConv(16, 16, edge_dim=5),
                         edge_encoder='linear', edge_dim=3, **kw)
    with pytest.raises(ValueError, match="GINEConv needs edge features"):
        GraphTransformer(4, 16, 2, conv=GINEConv(torch.nn.Linear(16, 16)), **kw)
    # A conv without stated sizes is checked on its first output.
    model = GraphTransformer(4, 16, 2, conv=GINConv(torch.nn.Linear(16, 8)), **kw)
    with pytest.raises(ValueError, match=r"returned shape \(17, 8\), expected \(17, 16\)"):
        model(Batch.from_data_list(graphs))


# block='gps': GRFGPSConv layers ##########################################################


GPS_KWARGS = {'grf': {'max_length': 3, 'global_beta': 0.1}, 'favor': {'num_features': 8}}


def _gps_batch(graphs):
    return Batch.from_data_list(graphs)


@pytest.mark.parametrize('attention', ['grf', 'gkat', 'linear', 'favor', 'multihead'])
@pytest.mark.parametrize('conv_kind,norm', [(None, 'batch_norm'), ('gine', 'layer_norm'),
                                            ('gat', None), ('instance', 'batch_norm')])
def test_gps_block_equals_hand_composition(graphs, attention, conv_kind, norm):
    # GraphTransformer(block='gps') = encoders -> GRFGPSConv layers (built here, by hand, with
    # the model's weights) -> mean pooling -> head, in float64.
    from torch_geometric.nn import MLP, GATConv, GINEConv, global_mean_pool

    from pyg_grf.features import GRFLoads
    from pyg_grf.nn import GRFGPSConv
    from pyg_grf.nn.attention.gkat import RWGNKPlan
    C, heads = 16, 2
    batch = _gps_batch(graphs)

    def conv():
        if conv_kind == 'gine':
            return GINEConv(MLP([C, C, C], act='gelu', norm=None), edge_dim=C)
        if conv_kind == 'gat':
            return GATConv(C, C // heads, heads=heads, edge_dim=C)
        if conv_kind == 'instance':
            return GATConv(C, C, heads=heads, concat=False, edge_dim=C)
        return None

    torch.manual_seed(0)
    model = GraphTransformer(4, C, 3, num_layers=2, heads=heads, attn_type=attention,
                             attn_kwargs=GPS_KWARGS.get(attention),
                             conv=conv() if conv_kind == 'instance' else conv_kind,
                             edge_encoder='linear', edge_dim=3, norm=norm, act='gelu',
                             block='gps').double().eval()
    assert all(type(layer) is GRFGPSConv for layer in model.blocks)

    # The reference: GRFGPSConv layers as a user builds them (per-node LayerNorm; exact
    # softmax attention is attn_type='multihead'; 'favor' is FAVOR+ linear attention, as
    # in block='pre_norm'), loaded with the model's weights.
    attn_type = {'favor': 'linear'}.get(attention, attention)
    attn_kwargs = GPS_KWARGS.get(attention)
    if attention == 'favor':
        attn_kwargs = {'feature_map': 'favor+', 'feature_map_kwargs': {'num_features': 8}}
    layers = []
    for layer in model.blocks:
        ref_layer = GRFGPSConv(C, conv(), heads=heads, act='gelu', norm=norm,
                               norm_kwargs={'mode': 'node'} if norm == 'layer_norm' else None,
                               attn_type=attn_type, attn_kwargs=attn_kwargs)
        ref_layer.load_state_dict(layer.state_dict())  # strict: the same parts
        layers.append(ref_layer.double().eval())
    x = batch.x.double() @ model.node_encoder.weight.T + model.node_encoder.bias
    e = batch.edge_attr.double() @ model.edge_encoder.weight.T + model.edge_encoder.bias
    grf = GRFLoads.from_data(batch) if attention == 'grf' else None
    rwgnk = (RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
             if attention == 'gkat' else None)
    for layer in layers:
        kwargs = {'edge_attr': e} if conv_kind is not None else {}
        x = layer(x, batch.edge_index, batch.batch, grf=grf, rwgnk=rwgnk, **kwargs)
    ref = _head(model, global_mean_pool(x, batch.batch))

    double = batch.clone()
    double.x, double.edge_attr = batch.x.double(), batch.edge_attr.double()
    out = model(double)
    assert out.dtype == torch.float64
    assert torch.allclose(out, ref, atol=1e-6)
    # Attention never crosses graphs: the batch equals the graphs one by one.
    per_graph = torch.cat([model(double.get_example(i)) for i in range(3)])
    assert torch.allclose(out, per_graph, atol=1e-6)


@pytest.mark.parametrize('attention', ['grf', 'gkat', 'multihead'])
def test_gps_block_gradients_flow(graphs, attention):
    batch = _gps_batch(graphs)
    model = GraphTransformer(4, 16, 3, num_layers=2, heads=2, attn_type=attention,
                             attn_kwargs=GPS_KWARGS.get(attention), conv='gine',
                             edge_encoder='linear', edge_dim=3, dropout=0.1, block='gps')
    model(batch).square().sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    if attention == 'grf':
        assert model.blocks[0].attn.f.grad.abs().sum() > 0


def test_gps_block_repr_and_errors():
    model = GraphTransformer(4, 16, 2, num_layers=1, heads=2, attn_type='grf', conv='gin',
                             block='gps')
    assert str(model) == ("GraphTransformer(4, 16, 2, num_layers=1, heads=2, attn_type='grf', "
                          "conv='gin', pe=None, pooling='mean', block='gps')")
    assert str(model.blocks[0]).startswith("GRFGPSConv(16, conv=GINConv(")
    assert isinstance(model.final_norm, torch.nn.Identity)  # the layers end with a norm
    with pytest.raises(ValueError, match=r"block must be one of \('pre_norm', 'gps'\), got "
                                         r"'post_norm'"):
        GraphTransformer(4, 16, 2, num_layers=1, block='post_norm')
    # every attention of the registry and every norm work in both layouts now; the MLP width
    # follows ffn_ratio (GPSConv's 2 * hidden_channels is the default)
    model = GraphTransformer(4, 16, 2, num_layers=1, attn_type='linear', ffn_ratio=4,
                             norm='rms_norm', block='gps')
    assert model.blocks[0].mlp[0].out_features == 64
    assert isinstance(model.blocks[0].norm3, torch.nn.RMSNorm)
    with pytest.raises(TypeError, match=r"attn_dropout, not attn_kwargs\['dropout'\]"):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type='linear',
                         attn_kwargs={'dropout': 0.1}, block='gps')
    with pytest.raises(TypeError, match=r"attn_type='grf' with attn_kwargs="
                                        r"\{'max_lenght': 3\}"):
        GraphTransformer(4, 16, 2, num_layers=1, attn_type='grf',
                         attn_kwargs={'max_lenght': 3}, block='gps')


@pytest.mark.parametrize('attention', ['softmax', 'favor', 'samsa', 'linear', 'grf',
                                       'power_series', 'gkat'])
@pytest.mark.parametrize('block', ['pre_norm', 'gps'])
def test_empty_batch(attention, block):
    # a batch without nodes gives empty node outputs / one pooled row per
    # (empty) graph, and gradients, instead of torch-internal errors
    from pyg_grf.transforms import AddRWGNKFeatures
    if block == 'gps' and attention in ('samsa', 'power_series'):
        pytest.skip('no GPS layer for this attention')
    if block == 'gps' and attention == 'softmax':
        attention = 'multihead'  # torch's MultiheadAttention in PyG GPSConv's layout
    d = Data(x=torch.zeros(0, 4), edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=0)
    d = AddGraphRandomFeatures(num_walks=2, max_length=2, seed=0)(d)
    d = AddRWGNKFeatures(num_walks=2, max_length=2, lam=0.5, alpha=1.0, seed=0)(d)
    b = Batch.from_data_list([d])
    kw = {'max_length': 2} if attention in ('grf', 'power_series') else None
    for pooling, shape in (('mean', (1, 3)), (None, (0, 3))):
        model = GraphTransformer(4, 8, 3, num_layers=1, heads=2, attn_type=attention,
                                 pooling=pooling, block=block, attn_kwargs=kw)
        out = model(b)
        assert out.shape == shape and torch.isfinite(out).all()
        out.sum().backward()


@pytest.mark.parametrize('block', ['pre_norm', 'gps'])
def test_full_graph_training_plans_once_with_one_call(block, monkeypatch):
    # a loop of one's own over one full graph: the model's first call builds the plan and its
    # layers keep it while it matches the data (GCNConv(cached=True)-like); prepare_payload
    # then leaves that plan on the data, and no step builds another
    from pyg_grf.loader import prepare_payload
    from pyg_grf.nn.attention.grf import plan as plan_module
    torch.manual_seed(0)
    data = Data(x=torch.randn(200, 4), edge_index=to_undirected(erdos_renyi_graph(200, 0.02)))
    data = AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)(data)
    model = GraphTransformer(4, 8, 3, num_layers=2, heads=2, attn_type='grf', pooling=None,
                             block=block, attn_kwargs={'max_length': 2, 'backend': 'pairs'})
    calls = []
    real = plan_module.pairs.build
    monkeypatch.setattr(plan_module.pairs, 'build',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    unprepared = model(data)
    assert len(calls) == 1  # one part for both layers (same configuration)
    prepare_payload(model, data)  # the plan the model built for this data: no new one
    assert len(calls) == 1 and isinstance(data.grf_plan, plan_module.GRFPlan)
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    for step in range(4):
        opt.zero_grad()
        out = model(data)
        out.square().mean().backward()
        opt.step()
        if step == 0:
            assert torch.allclose(out, unprepared, atol=1e-6)
    assert len(calls) == 1


def test_grf_model_under_inference_mode():
    from pyg_grf.nn import GraphTransformer
    with torch.inference_mode():
        b = make_batch()
        b.x = b.x.float()
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2, pooling=None,
                             attn_kwargs={'max_length': 3}).eval()
    with torch.inference_mode():
        out = model(b)
        assert torch.equal(out, model(b))  # 'auto' is pure: the same backend every call
    # a plan built under inference mode (trainer.validate before fit) still serves training
    fresh = make_batch()
    layer = make_layer('symmetric', 'pairs')
    with torch.inference_mode():
        plan = GRFPlan.build(fresh, [layer])
    layer(fresh.x, fresh.batch, grf=plan).sum().backward()
    assert layer.f.grad is not None


def test_each_grf_layer_gets_its_own_walk_draws():
    b = batch_with_draws(8)
    model = GraphTransformer(8, 16, 3, num_layers=2, heads=4, attn_type='grf',
                             attn_kwargs={'max_length': 3})
    layers = [m for m in model.modules() if isinstance(m, GRFAttention)]
    assert [m.layer_index for m in layers] == [0, 1]
    assert layers[1].draws(8) == (4, 5, 6, 7)
    out = model(b)
    assert out.shape == (3, 3) and torch.isfinite(out).all()
