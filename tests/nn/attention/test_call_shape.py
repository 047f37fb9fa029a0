"""The one call shape of the attention layers (:class:`pyg_grf.nn.attention.GraphAttention`),
checked on every name of the registry: ``layer(x, batch, **layer.payload(data))`` on a PyG
batch; bad calls (no payload, a payload of the wrong type, too many positional arguments) raise
clear errors; and :class:`~pyg_grf.nn.GRFGPSConv` routes the payload to its attention."""
import warnings

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GINEConv

from pyg_grf.datasets import grid_edge_index
from pyg_grf.features import GRFLoads
from pyg_grf.masks import DenseMask
from pyg_grf.nn import GRFGPSConv
from pyg_grf.nn.attention import (
    ATTENTIONS,
    GraphAttention,
    MaskedLinearAttention,
    attention_resolver,
)
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures

D = torch.float64
C, HEADS = 8, 2
GRID = (2, 3)  # every graph of the batch is this grid ('grid_rpe' needs one grid shape)

#: attention_resolver arguments per name (the others need none)
KWARGS = {
    'grf': {'max_length': 3},
    'favor': {'num_features': 8},
    'performer': {'head_channels': 4},
    'power_series': {'max_length': 3},
    'grid_rpe': {'grid_shape': GRID},
    'samsa': {'num_samples': 4},
}


def make_batch(seed=0):
    # three 2 x 3 grids (one with an extra diagonal edge), the GRF loads and the RWGNK features
    # with their kernel pairs, so that every payload has all its parts
    gen = torch.Generator().manual_seed(seed)
    grf = AddGraphRandomFeatures(num_walks=6, p_halt=0.3, max_length=3, seed=seed)
    rwgnk = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, seed=seed,
                             kernel_threshold=0.0)
    n = GRID[0] * GRID[1]
    graphs = []
    for g in range(3):
        ei = grid_edge_index(*GRID)
        if g == 1:
            ei = torch.cat([ei, torch.tensor([[0, 4], [4, 0]])], 1)
        data = Data(x=torch.randn(n, C, generator=gen, dtype=D), edge_index=ei,
                    edge_attr=torch.randn(ei.size(1), C, generator=gen, dtype=D), num_nodes=n)
        graphs.append(rwgnk(grf(data)))
    batch = Batch.from_data_list(graphs)
    batch.rwgnk_value = batch.rwgnk_value.to(D)
    batch.rwgnk_kernel_value = batch.rwgnk_kernel_value.to(D)
    return batch


def build(name, **kwargs):
    torch.manual_seed(1)
    return attention_resolver(name, C, HEADS, **{**KWARGS.get(name, {}), **kwargs}).to(D).eval()


@pytest.fixture(scope='module')
def batch():
    return make_batch()


# (a) layer(x, batch, **layer.payload(data)) ###################################################


@pytest.mark.parametrize('name', sorted(ATTENTIONS))
def test_every_layer_takes_the_one_call_shape(batch, name):
    layer = build(name)
    assert isinstance(layer, GraphAttention)
    payload = layer.payload(batch)
    assert set(payload) == set(layer.payload_keys)
    with warnings.catch_warnings():
        warnings.simplefilter('error', FutureWarning)  # the current form: no deprecation
        out = layer(batch.x, batch.batch, **payload)
        assert out.shape == (batch.num_nodes, C) and out.dtype == D
        assert torch.isfinite(out).all()
        # attention never crosses graphs: every graph alone (its own payload) gives its rows
        for g in range(batch.num_graphs):
            data = batch.get_example(g)
            alone = layer(data.x, None, **layer.payload(data))
            assert torch.allclose(out[batch.batch == g], alone, atol=1e-10), g


def test_masked_linear_takes_the_one_call_shape(batch):
    # not in the registry (its mask is an argument, not read from the data): mask= by keyword
    torch.manual_seed(1)
    layer = MaskedLinearAttention(C, heads=HEADS).to(D).eval()
    assert layer.payload(batch) == {}
    mask = DenseMask(torch.block_diag(*[torch.rand(6, 6, dtype=D) for _ in range(3)]))
    with warnings.catch_warnings():
        warnings.simplefilter('error', FutureWarning)
        out = layer(batch.x, batch.batch, mask=mask)
        assert out.shape == (batch.num_nodes, C) and torch.isfinite(out).all()
        # no mask: unmasked linear attention inside each graph
        unmasked = layer(batch.x, batch.batch)
        for g in range(batch.num_graphs):
            rows = batch.batch == g
            assert torch.allclose(unmasked[rows], layer(batch.x[rows]), atol=1e-12)


# (b) bad input: clear errors ####################################################################


@pytest.mark.parametrize('name,error,match', [
    ('grf', ValueError, r"needs the plan of the batch: pass grf=attn.payload.*got NoneType"),
    ('gkat', ValueError, r'needs rwgnk=RWGNKPlan.*got NoneType'),
    ('power_series', ValueError, r'needs the graph: edge_index= \(got NoneType\)'),
])
def test_missing_payload(batch, name, error, match):
    layer = build(name)
    with pytest.raises(error, match=match):
        layer(batch.x, batch.batch)
    # and building the payload from data without the transform's fields names the transform
    if name != 'power_series':  # (every Data has an edge_index slot)
        with pytest.raises(ValueError, match={'grf': 'AddGraphRandomFeatures',
                                              'gkat': 'AddRWGNKFeatures'}[name]):
            layer.payload(Data(x=batch.x[:6], num_nodes=6))


def test_payload_of_the_wrong_type(batch):
    b = batch
    grf, rwgnk = GRFLoads.from_data(b), RWGNKPlan.build(b)
    layer = build('grf')
    with pytest.raises(TypeError, match=r"'grf' must be a GRFPlan .*got RWGNKPlan"):
        layer(b.x, b.batch, grf=rwgnk)
    with pytest.raises(TypeError, match="'grf' must be a GRFPlan .*got tuple"):
        layer(b.x, b.batch, grf=(b.grf_index, b.grf_length, b.grf_load))
    layer = build('gkat')
    with pytest.raises(TypeError, match=r'needs rwgnk=RWGNKPlan.*got GRFLoads'):
        layer(b.x, b.batch, rwgnk=grf)
    with pytest.raises(TypeError, match=r'needs rwgnk=RWGNKPlan.*got tuple'):
        layer(b.x, b.batch, rwgnk=(b.rwgnk_index, b.rwgnk_value))
    layer = build('power_series')
    with pytest.raises(ValueError, match=r'needs the graph: edge_index= \(got list\)'):
        layer(b.x, b.batch, edge_index=b.edge_index.tolist())
    layer = MaskedLinearAttention(C, heads=HEADS).to(D)
    with pytest.raises(TypeError, match="'mask' must be a pyg_grf.masks.MaskOperator, got "
                                        "Tensor"):
        layer(b.x, b.batch, mask=torch.ones(b.num_nodes, b.num_nodes, dtype=D))
    # the grid attention takes MaskedLinearAttention's mask= (issue 39: it raised TypeError)
    from pyg_grf.masks import DenseMask
    grid = build('grid_rpe')
    x = b.x[:grid.grid_nodes].unsqueeze(0)
    M = torch.rand(grid.grid_nodes, grid.grid_nodes, dtype=D)
    torch.testing.assert_close(grid(x, mask=DenseMask(M)),
                               MaskedLinearAttention.forward(grid, x, mask=DenseMask(M)))
    # a payload the layer does not take is refused, not ignored
    for name in ('linear', 'softmax', 'multihead', 'power_series', 'grid_rpe', 'samsa'):
        with pytest.raises(TypeError, match="unexpected keyword argument 'grf'"):
            build(name)(b.x, b.batch, grf=grf)


@pytest.mark.parametrize('name', sorted(ATTENTIONS) + ['masked_linear'])
def test_too_many_positional_arguments(batch, name):
    if name == 'masked_linear':
        layer = MaskedLinearAttention(C, heads=HEADS).to(D)
    else:
        layer = build(name)
    extra = [None] * 5
    with warnings.catch_warnings():
        # GRFAttention's former call form is removed
        warnings.filterwarnings('ignore', category=FutureWarning)
        with pytest.raises(TypeError, match='positional argument'):
            layer(batch.x, batch.batch, *extra)


def test_gps_conv_missing_and_misplaced_payload(batch):
    b = batch
    conv = GRFGPSConv(C, None, heads=HEADS, attn_kwargs={'max_length': 3})
    with pytest.raises(ValueError, match=r"attn_type='grf' needs the batch's plan as grf=.*"
                                         r"AddGraphRandomFeatures"):
        conv(b.x, b.edge_index, b.batch)
    conv = GRFGPSConv(C, None, heads=HEADS, attn_type='gkat')
    with pytest.raises(ValueError, match=r"attn_type='gkat' needs the batch's plan as rwgnk=.*"
                                         r"AddRWGNKFeatures"):
        conv(b.x, b.edge_index, b.batch)
    with pytest.raises(TypeError, match='positional argument'):
        conv(b.x, b.edge_index, b.batch, RWGNKPlan.build(b))


# (c) GRFGPSConv routes the payload to its attention ############################################


def _norm(norm, h, batch):
    if norm is None:
        return h
    return norm(h, batch=batch) if 'batch' in norm.forward.__code__.co_varnames else norm(h)


def _block_formula(conv, x, edge_index, batch, edge_attr, attn):
    # the block written out, with the attention called directly (attn(h) -> [N, C])
    if conv.layout == 'pre_norm':  # x + attn(norm1(x)) + conv(norm1(x)), then + mlp(norm2(.))
        h = _norm(conv.norm1, x, batch)
        y = x + attn(h) + conv.conv(h, edge_index, edge_attr=edge_attr)
        return y + conv.mlp(_norm(conv.norm2, y, batch))
    h1 = _norm(conv.norm1, conv.conv(x, edge_index, edge_attr=edge_attr) + x, batch)
    h2 = _norm(conv.norm2, attn(x) + x, batch)
    h = h1 + h2
    return _norm(conv.norm3, h + conv.mlp(h), batch)


def _gps_conv(name, layout):
    torch.manual_seed(2)
    gine = GINEConv(torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(),
                                        torch.nn.Linear(C, C)), edge_dim=C)
    conv = GRFGPSConv(C, gine, heads=HEADS, attn_type=name, attn_kwargs=KWARGS.get(name),
                      norm='layer_norm', layout=layout).to(D).eval()
    with torch.no_grad():  # away from the initial identity, so that the norms matter
        for p in conv.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return conv


@pytest.mark.parametrize('layout', ['post_norm', 'pre_norm'])
@pytest.mark.parametrize('name', sorted(ATTENTIONS))
def test_gps_conv_routes_the_payload(batch, name, layout):
    b = batch
    conv = _gps_conv(name, layout)
    payload = conv.payload(b)  # the layer's, without the graph the block passes itself
    assert 'edge_index' not in payload
    with warnings.catch_warnings():
        warnings.simplefilter('error', FutureWarning)
        out = conv(b.x, b.edge_index, b.batch, **payload, edge_attr=b.edge_attr)
    ref = _block_formula(conv, b.x, b.edge_index, b.batch, b.edge_attr,
                         lambda h: conv.attn(h, b.batch, **conv.attn.payload(b)))
    assert out.dtype == D and torch.allclose(out, ref, atol=1e-12, rtol=0)
    if payload:  # the payload reaches the attention: other loads change the output
        other = make_batch(seed=5)
        moved = conv(b.x, b.edge_index, b.batch, **conv.payload(other),
                     edge_attr=b.edge_attr)
        assert not torch.allclose(moved, out)


@pytest.mark.parametrize('layout', ['post_norm', 'pre_norm'])
def test_gps_conv_gives_power_series_its_own_graph(batch, layout):
    # the attention reads the block's edge_index (what its payload holds)
    b = batch
    conv = _gps_conv('power_series', layout)
    out = conv(b.x, b.edge_index, b.batch, edge_attr=b.edge_attr)
    ref = _block_formula(conv, b.x, b.edge_index, b.batch, b.edge_attr,
                         lambda h: conv.attn(h, b.batch, **conv.attn.payload(b)))
    assert torch.allclose(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize('name', sorted(ATTENTIONS))
def test_every_layer_takes_samples_on_one_shared_graph(batch, name):
    # x [B, n, C]: B samples on one graph (its payload), the same as a batch of B copies
    layer = build(name)
    graph = batch.get_example(0)
    B, n = 4, graph.num_nodes
    x = torch.randn(B, n, C, dtype=D, generator=torch.Generator().manual_seed(2))
    out = layer(x, None, **layer.payload(graph))
    assert out.shape == (B, n, C)
    copies = Batch.from_data_list([graph] * B)
    ref = layer(x.reshape(B * n, C), copies.batch, **layer.payload(copies))
    assert torch.allclose(out.reshape(B * n, C), ref, atol=1e-10)
    with pytest.raises(ValueError, match="'batch' is not used with x of shape"):
        layer(x, torch.zeros(B * n, dtype=torch.long), **layer.payload(graph))
