"""GRFNodeModel against independent references: with the gate at 0 it is the local stack
computed by PyG's own layers on ``edge_index``; its attention branch equals a float64 dense
masked-attention loop on the GRF mask built entry by entry from the walks' loads."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from pyg_grf.datasets import grid_edge_index
from pyg_grf.nn import GRFNodeModel
from pyg_grf.transforms import AddGraphRandomFeatures

D = torch.float64


def small_graph(num_features=5, seed=0):
    # a 4 x 5 grid plus one chord: 20 nodes, irregular degrees
    edge_index = grid_edge_index(4, 5)
    edge_index = torch.cat([edge_index, torch.tensor([[0, 19], [19, 0]])], 1)
    g = torch.Generator().manual_seed(seed)
    data = Data(x=torch.randn(20, num_features, generator=g), edge_index=edge_index)
    return AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=3, seed=seed)(data)


def pyg_gcn(conv, x, edge_index):
    """The model's GCN layer ``conv`` recomputed by PyG's GCNConv, which normalises
    ``edge_index`` itself, holding the same weights."""
    ref = GCNConv(conv.in_channels, conv.out_channels, bias=conv.bias is not None).to(x.dtype)
    ref.lin.weight.data.copy_(conv.lin.weight)
    if conv.bias is not None:
        ref.bias.data.copy_(conv.bias)
    return ref(x, edge_index)


def pyg_reference(model, data):
    """The local stack recomputed with PyG layers in their default (message-passing) form,
    holding the model's weights, then the output layer: what the model is at gate 0."""
    h = data.x
    for i, conv in enumerate(model.convs):
        c_in = h.size(1)
        if model.conv == 'gcn':
            ref = lambda h, edge_index, conv=conv: pyg_gcn(conv, h, edge_index)  # noqa: E731
        elif model.conv == 'gat':
            ref = GATConv(c_in, model.hidden_channels // model.conv_heads,
                          heads=model.conv_heads, **model.conv_kwargs).to(h.dtype)
            ref.load_state_dict(conv.state_dict())
        else:
            ref = SAGEConv(c_in, model.hidden_channels, **model.conv_kwargs).to(h.dtype)
            ref.load_state_dict(conv.state_dict())
        out = ref(h, data.edge_index)
        if model.residual:  # the linear skip, before the norm
            out = out + h @ model.skips[i].weight.t() + model.skips[i].bias
        if model.norms is not None:
            out = model.norms[i](out)
        h = F.relu(out)
    if model.head_type == 'linear':
        return model.head(h)
    if model.conv == 'gcn':
        return pyg_gcn(model.head, h, data.edge_index)
    ref = (GATConv if model.conv == 'gat' else SAGEConv)(h.size(1), model.out_channels,
                                                        **model.conv_kwargs).to(h.dtype)
    ref.load_state_dict(model.head.state_dict())
    return ref(h, data.edge_index)


@pytest.mark.parametrize('conv', ['gcn', 'gat', 'sage'])
@pytest.mark.parametrize('norm,residual', [(None, False), ('batch_norm', True),
                                           ('layer_norm', True)])
@pytest.mark.parametrize('attn_type,head', [('grf', 'linear'), ('linear', 'conv'),
                                            (None, 'linear'), ('power_series', 'conv')])
def test_gate_zero_is_the_pyg_stack(conv, norm, residual, attn_type, head):
    data = small_graph()
    data.x = data.x.double()
    model = GRFNodeModel(5, 8, 3, num_layers=3, conv=conv, conv_heads=2, attn_type=attn_type,
                         heads=2, attn_kwargs={'max_length': 3} if attn_type == 'grf' else None,
                         norm=norm, residual=residual, head=head).double()
    # batch norm with running statistics that are not the identity
    model.train()
    model(data)
    model.eval()
    if attn_type is not None:
        assert model.gate.item() == 0.0
    out = model(data)
    assert out.shape == (20, 3)
    assert torch.allclose(out, pyg_reference(model, data), atol=1e-10)


@pytest.mark.parametrize('head', ['linear', 'conv'])
def test_gcn_gradients_equal_pyg_on_a_directed_graph(head):
    # the backward reuses the kept pattern's transpose: on a directed graph (A != A^T) a
    # product with the adjacency instead of its transpose would give other gradients
    data = small_graph()
    keep = data.edge_index[0] < data.edge_index[1]                     # one direction only
    data = Data(x=data.x.double().requires_grad_(), edge_index=data.edge_index[:, keep])
    model = GRFNodeModel(5, 8, 3, num_layers=3, attn_type=None, residual=True,
                         head=head).double().eval()  # (eval: no dropout)
    w = torch.randn(20, 3, dtype=D, generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # the second call runs on the kept adjacency
        # the input's gradient passes back through every layer's product
        got, = torch.autograd.grad((model(data) * w).sum(), data.x)
        want, = torch.autograd.grad((pyg_reference(model, data) * w).sum(), data.x)
        assert torch.allclose(got, want, atol=1e-12)


def dense_grf_reference(attn, x, data):
    """GRF-masked linear attention written densely: Phi[i, q] = sum_l f_l load(i, q, l) from
    the walks' entries, M = Phi Phi^T (GRF paper, Eq. 7, 10), relu features, and per head
    out_i = sum_j M_ij phi(q_i).phi(k_j) v_j / (sum_j M_ij phi(q_i).phi(k_j) + eps)."""
    N, H, C = x.size(0), attn.heads, attn.head_channels
    f = attn.coefficients().detach().to(D)                             # [H, L + 1]
    i, q = data.grf_index.long()
    length = data.grf_length.long()
    qh, kh, vh = attn.to_qkv(x).view(N, 3, H, C).unbind(1)
    out = torch.zeros(N, H, C, dtype=D)
    for h in range(H):
        phi = torch.zeros(N, N, dtype=D)
        phi.index_put_((i, q), f[h, length] * data.grf_load.to(D), accumulate=True)
        M = phi @ phi.t()
        A = M * (F.relu(qh[:, h]) @ F.relu(kh[:, h]).t())              # [N, N]
        out[:, h] = (A @ vh[:, h]) / (A.sum(1, keepdim=True) + attn.eps)
    return attn.to_out(out.reshape(N, H * C))


@pytest.mark.parametrize('heads', [1, 2])
def test_attention_branch_equals_dense_reference(heads):
    data = small_graph()
    data.x = data.x.double()
    model = GRFNodeModel(5, 8, 3, attn_type='grf', heads=heads,
                         attn_kwargs={'max_length': 3, 'f_init': 0.7}, gate_init=0.5).double()
    model.eval()
    with torch.no_grad():  # distinct coefficients per head
        model.attn.f.add_(0.1 * torch.randn_like(model.attn.f))
    h, first = model.local(data.x, data.edge_index)     # the attention reads the first layer
    assert torch.allclose(first, F.relu(pyg_gcn(model.convs[0], data.x, data.edge_index)))
    ref = dense_grf_reference(model.attn, first, data)
    expected = h + 0.5 * model.attn_out(ref)
    assert torch.allclose(model(data), expected, atol=1e-10)


def test_attention_reads_the_last_hidden_layer():
    # attn_input='last': the attention reads what the output layer reads, h^(L')
    data = small_graph()
    data.x = data.x.double()
    model = GRFNodeModel(5, 8, 3, num_layers=3, attn_type='grf', attn_kwargs={'max_length': 3},
                         gate_init=0.5, residual=True, attn_input='last').double().eval()
    h = data.x
    for conv, skip in zip(model.convs, model.skips):
        h = F.relu(pyg_gcn(conv, h, data.edge_index) + skip(h))
    out, hidden = model.local(data.x, data.edge_index)
    assert torch.allclose(hidden, h) and torch.allclose(out, model.head(h))
    ref = dense_grf_reference(model.attn, h, data)
    assert torch.allclose(model(data), out + 0.5 * model.attn_out(ref), atol=1e-10)


def test_trains_and_gate_gets_gradient():
    data = small_graph()
    data.y = torch.arange(20) % 3
    model = GRFNodeModel(5, 8, 3, attn_type='grf', attn_kwargs={'max_length': 3},
                         dropout=0.2, input_dropout=0.1)
    loss = F.cross_entropy(model(data), data.y)
    loss.backward()
    assert model.gate.grad is not None and model.gate.grad.abs() > 0
    assert model.no_weight_decay() == {'gate'}
    # the plan and the adjacency are kept for the same graph, and not carried by a copy
    assert model.adjacency(data.edge_index, 20) is model.adjacency(data.edge_index, 20)
    clone = copy.deepcopy(model)
    assert '_adjacency' not in clone.__dict__
    assert torch.allclose(clone.eval()(data), model.eval()(data))


@pytest.mark.parametrize('conv,kwargs', [('gat', {'add_self_loops': False, 'bias': False}),
                                         ('sage', {'aggr': 'max', 'bias': False}),
                                         ('gcn', {'bias': False})])
@pytest.mark.parametrize('head', ['linear', 'conv'])
def test_conv_kwargs_reach_every_convolution(conv, kwargs, head):
    # Luo et al.'s GATConv (no self loops, no bias): the stack equals PyG layers built with
    # the same arguments (their state dicts load strictly: no bias anywhere), and differs from
    # the stack without them
    data = small_graph()
    data.x = data.x.double()
    model = GRFNodeModel(5, 8, 3, num_layers=3, conv=conv, conv_heads=2, conv_kwargs=kwargs,
                         attn_type=None, head=head, norm='batch_norm', residual=True).double()
    model.eval()
    convs = list(model.convs) + ([model.head] if head == 'conv' else [])
    assert not [n for c in convs for n, _ in c.named_parameters() if n.endswith('bias')]
    out = model(data)
    assert torch.allclose(out, pyg_reference(model, data), atol=1e-10)
    plain = copy.deepcopy(model)
    plain.conv_kwargs = {}
    if conv != 'gcn':  # with the defaults, the same weights give another output
        with pytest.raises(RuntimeError, match='Missing key'):
            pyg_reference(plain, data)  # the defaults have a bias the model lacks
        assert not torch.allclose(out, pyg_reference_without_bias(plain, data, conv),
                                  atol=1e-6)


def pyg_reference_without_bias(model, data, conv):
    """The stack with the convolutions' own defaults but no bias (only 'bias' switched off),
    holding the model's weights."""
    model = copy.deepcopy(model)
    model.conv_kwargs = {'bias': False}
    return pyg_reference(model, data)


def test_repr():
    assert str(GRFNodeModel(7, 16, 2)) == (
        "GRFNodeModel(7, 16, 2, num_layers=2, conv='gcn', attn_type='grf', heads=1, norm=None, "
        "residual=False, head='linear', attn_input='first')")
    assert str(GRFNodeModel(7, 16, 2, attn_type=None, num_layers=4, norm='batch_norm',
                            residual=True, head='conv')) == (
        "GRFNodeModel(7, 16, 2, num_layers=4, conv='gcn', attn_type=None, "
        "norm='batch_norm', residual=True, head='conv', attn_input='first')")


@pytest.mark.parametrize('kwargs,match', [
    ({'conv': 'gin'}, r"'conv' must be one of \('gcn', 'gat', 'sage'\), got 'gin'"),
    ({'num_layers': 0}, r"'num_layers' must be an integer >= 1, got 0"),
    ({'hidden_channels': 10, 'conv': 'gat', 'conv_heads': 4},
     r"multiple of conv_heads=4, got 10"),
    ({'attn_type': 'grff'}, r"'attn_type' must be one of .* or None, got 'grff'"),
    ({'norm': 'group'}, r"'norm' must be one of .*, got 'group'"),
    ({'head': 'mlp'}, r"'head' must be one of \('linear', 'conv'\), got 'mlp'"),
    ({'head': 'conv', 'num_layers': 1}, r"needs a hidden one before it: expected num_layers "
                                        r">= 2, got 1"),
    ({'dropout': 1.0}, r"'dropout' must lie in \[0, 1\), got 1.0"),
    ({'attn_input': 'mid'}, r"'attn_input' must be one of \('first', 'last'\), got 'mid'"),
    ({'conv': 'gat', 'conv_kwargs': {'heads': 2}}, r"'conv_kwargs' may not set \['heads'\]"),
    ({'conv_kwargs': {'add_self_loops': False}},
     r"conv='gcn' runs on the model's own normalised adjacency .* may only set 'bias'"),
    ({'conv': 'sage', 'conv_kwargs': {'heads_': 1}},
     r"'conv_kwargs' \{'heads_': 1\} do not fit conv='sage'"),
])
def test_bad_arguments(kwargs, match):
    args = dict(in_channels=5, hidden_channels=8, out_channels=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        GRFNodeModel(**args)


def test_bad_input():
    data = small_graph()
    model = GRFNodeModel(6, 8, 3)
    with pytest.raises(ValueError, match=r"expects data.x of shape \[N, 6\] \(in_channels\), "
                                         r"got \(20, 5\)"):
        model(data)
    model = GRFNodeModel(5, 8, 3, attn_type=None)
    bad = Data(x=data.x, edge_index=data.edge_index.t())
    with pytest.raises(ValueError, match=r"expects data.edge_index of shape \[2, E\], got "
                                         r"\(64, 2\)"):
        model(bad)


def test_adjacency_built_under_inference_mode_is_not_reused_for_training():
    data = small_graph()
    data.y = torch.arange(20) % 3
    model = GRFNodeModel(5, 8, 3, attn_type=None)
    with torch.inference_mode():
        model(data)
    F.cross_entropy(model(data), data.y).backward()  # a fresh adjacency, not the inference one
    assert model.convs[0].lin.weight.grad is not None


def test_attn_type_none_as_a_string():
    # a command line's attn_type=null reaches the model as the string 'None'
    assert GRFNodeModel(5, 8, 3, attn_type='None').attn is None


@pytest.mark.data
def test_docs_example_trains_on_cora(mirror):
    # the example of docs/large_graphs.md, run for 30 epochs: it learns (Cora's largest class
    # is 32 % of the test nodes)
    import re

    from tests.conftest import REPO
    text = (REPO / 'docs' / 'large_graphs.md').read_text()
    section = text.split('### A ready node model', 1)[1]
    code = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    assert 'range(200)' in code
    torch.manual_seed(0)
    scope = {}
    exec(compile(code.replace('range(200)', 'range(30)'), 'docs/large_graphs.md', 'exec'), scope)
    model, data = scope['model'], scope['data']
    model.eval()
    pred = model(data).argmax(-1)
    acc = float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())
    assert acc > 0.6
