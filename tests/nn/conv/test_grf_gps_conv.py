import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GINEConv, GPSConv

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFGPSConv
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import er_graph, grid_graph, path_graph

C = 8


def make_batch():
    torch.manual_seed(0)
    t = AddGraphRandomFeatures(num_walks=6, p_halt=0.4, max_length=3, seed=0)
    graphs = [Data(x=torch.randn(n, C), edge_index=ei, edge_attr=torch.randn(ei.size(1), C))
              for n, ei in [(9, grid_graph(3, 3)), (5, path_graph(5)),
                            (11, er_graph(11, 0.3, seed=2))]]
    return Batch.from_data_list([t(g) for g in graphs])


def gine():
    return GINEConv(torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(),
                                        torch.nn.Linear(C, C)), edge_dim=C)


@pytest.mark.parametrize('attn_type,attn_kwargs', [('multihead', {}),
                                                   ('performer', {'head_channels': 4})])
def test_equals_pyg_gpsconv_with_the_same_weights(attn_type, attn_kwargs):
    b = make_batch()
    torch.manual_seed(1)
    ref = GPSConv(C, gine(), heads=2, attn_type=attn_type, attn_kwargs=attn_kwargs)
    ours = GRFGPSConv(C, gine(), heads=2, attn_type=attn_type, attn_kwargs=attn_kwargs)
    ours.load_state_dict(ref.state_dict())
    ref.eval(), ours.eval()
    out = ours(b.x, b.edge_index, batch=b.batch, edge_attr=b.edge_attr)
    assert torch.allclose(out, ref(b.x, b.edge_index, b.batch, edge_attr=b.edge_attr),
                          atol=1e-6)


@pytest.mark.parametrize('attn_type', ['multihead', 'performer'])
def test_pyg_call_shape_is_gpsconvs(attn_type):
    # exactly as PyG's examples/graph_gps.py calls GPSConv: conv(x, edge_index, batch, edge_attr=)
    # (the batch third, positionally); the attention must stay inside each graph
    b = make_batch()
    torch.manual_seed(1)
    ref = GPSConv(C, gine(), heads=2, attn_type=attn_type)
    ours = GRFGPSConv(C, gine(), heads=2, attn_type=attn_type)
    ours.load_state_dict(ref.state_dict())
    ref.eval(), ours.eval()
    out = ours(b.x, b.edge_index, b.batch, edge_attr=b.edge_attr)
    assert torch.allclose(out, ref(b.x, b.edge_index, b.batch, edge_attr=b.edge_attr), atol=1e-6)
    # graphs do not mix: changing graph 0 leaves the others' outputs unchanged
    x2 = b.x.clone()
    x2[b.batch == 0] += 1.0
    out2 = ours(x2, b.edge_index, b.batch, edge_attr=b.edge_attr)
    assert torch.allclose(out2[b.batch != 0], out[b.batch != 0], atol=1e-6)


def test_bad_calls_raise():
    b = make_batch()
    conv = GRFGPSConv(C, gine(), heads=2, attn_kwargs={'max_length': 3}).eval()
    grf = GRFLoads.from_data(b)
    with pytest.raises(TypeError, match="positional argument"):
        conv(b.x, b.edge_index, b.batch, grf, edge_attr=b.edge_attr)
    with pytest.raises(TypeError, match="'batch' must be a tensor"):
        conv(b.x, b.edge_index, [0, 1], grf=grf, edge_attr=b.edge_attr)


@pytest.mark.parametrize('norm', ['batch_norm', 'layer_norm', None])
def test_grf_equals_hand_written_composition_of_its_parts(norm):
    b = make_batch()
    conv = GRFGPSConv(C, gine(), heads=2, dropout=0.0, norm=norm,
                      attn_kwargs={'max_length': 3, 'global_beta': 0.2})
    grf = GRFLoads.from_data(b)
    out = conv(b.x, b.edge_index, b.batch, grf=grf, edge_attr=b.edge_attr)

    def norm_(m, h):
        if m is None:
            return h
        return m(h, batch=b.batch) if 'batch' in m.forward.__code__.co_varnames else m(h)

    h1 = norm_(conv.norm1, conv.conv(b.x, b.edge_index, edge_attr=b.edge_attr) + b.x)
    h2 = norm_(conv.norm2, conv.attn(b.x, b.batch, grf=grf) + b.x)
    h = h1 + h2
    ref = norm_(conv.norm3, h + conv.mlp(h))
    assert torch.allclose(out, ref, atol=1e-6)
    out.square().sum().backward()
    assert conv.attn.f.grad is not None and conv.attn.beta_raw.grad is not None


def test_attention_only_linear_and_gkat():
    from pyg_grf.transforms import AddRWGNKFeatures
    b = make_batch()
    out = GRFGPSConv(C, None, heads=2, attn_type='linear')(b.x, b.edge_index, batch=b.batch)
    assert out.shape == (25, C)
    t = AddRWGNKFeatures(num_walks=8, lam=0.8, alpha=1.0, max_length=3, seed=0)
    g = Batch.from_data_list([t(d) for d in b.to_data_list()])
    conv = GRFGPSConv(C, None, heads=2, attn_type='gkat')
    plan = RWGNKPlan.from_tensors(g.rwgnk_index, g.rwgnk_value)
    out = conv(g.x, g.edge_index, batch=g.batch, rwgnk=plan)
    assert out.shape == (25, C)


def test_repr_and_bad_input():
    b = make_batch()
    conv = GRFGPSConv(C, None, heads=2)
    assert str(conv) == "GRFGPSConv(8, conv=None, heads=2, attn_type='grf')"
    # PyG's call shape without the plan: the error names the fix (the plan), not the transform
    with pytest.raises(ValueError, match=r"attn_type='grf' needs the batch's plan as grf=\.\.\.:"
                                         r" call conv\(x, edge_index, batch, \*\*conv\.payload"):
        conv(b.x, b.edge_index, b.batch)
    plan = conv.payload(b)['grf']  # PyG's call shape with the plan the data carries
    prepare = __import__('pyg_grf.nn', fromlist=['prepare_payload']).prepare_payload
    prepare(conv, b)
    assert b.grf_plan is plan
    torch.testing.assert_close(conv(b.x, b.edge_index, b.batch, grf=b.grf_plan),
                               conv(b.x, b.edge_index, b.batch, **conv.payload(b)))
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match=f"'mlp_channels' must be a positive integer .*got "
                                             f"{bad!r}"):
            GRFGPSConv(C, None, mlp_channels=bad)
    assert GRFGPSConv(C, None, mlp_channels=3).mlp[0].out_features == 3
    with pytest.raises(ValueError, match="'attn_type' must be one of"):
        GRFGPSConv(C, None, attn_type='bigbird')
    with pytest.raises(TypeError, match="'conv' must be a MessagePassing"):
        GRFGPSConv(C, 'gine')
    with pytest.raises(ValueError, match="needs the batch.s plan as rwgnk="):
        GRFGPSConv(C, None, attn_type='gkat')(b.x, b.edge_index, batch=b.batch)


def test_conv_with_the_wrong_output_size():
    from torch_geometric.nn import GINConv
    b = make_batch()
    conv = GRFGPSConv(C, GINConv(torch.nn.Linear(C, 4)), attn_type='linear')
    with pytest.raises(ValueError, match=r"returned shape \(25, 4\), expected \(25, 8\)"):
        conv(b.x, b.edge_index, batch=b.batch)
