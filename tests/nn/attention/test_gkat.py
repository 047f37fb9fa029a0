import math

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_undirected

from pyg_grf.features import rwgnk_kernel
from pyg_grf.nn import GKATAttention
from pyg_grf.nn.attention.gkat import RWGNKPlan, choose_backend, costs
from pyg_grf.transforms import AddRWGNKFeatures


def make_batch(seed=0):
    torch.manual_seed(seed)
    graphs = []
    for n, edges in [(5, [[0, 1, 2, 3], [1, 2, 3, 4]]),
                     (4, [[0, 1, 2, 3], [1, 2, 3, 0]]),
                     (6, [[0, 0, 1, 3, 4, 2], [1, 2, 3, 4, 5, 5]])]:
        ei = to_undirected(torch.tensor(edges), num_nodes=n)
        graphs.append(Data(x=torch.randn(n, 8, dtype=torch.float64), edge_index=ei, num_nodes=n))
    transform = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, seed=seed)
    batch = Batch.from_data_list([transform(g) for g in graphs])
    batch.rwgnk_value = batch.rwgnk_value.double()
    return batch


def dense_kernel(batch):
    N = batch.num_nodes
    psi = torch.zeros(N, N, dtype=torch.float64)
    psi.index_put_(tuple(batch.rwgnk_index), batch.rwgnk_value, accumulate=True)
    return psi @ psi.t()


def reference(layer, x, kernel):
    """Independent dense implementation of every mode, with the layer's weights."""
    N, H, C = x.size(0), layer.heads, layer.head_channels
    v = (x @ layer.to_v.weight.t()).view(N, H, C)
    if layer.mode == 'linear':
        q = F.elu((x @ layer.to_q.weight.t()).view(N, H, C)) + 1
        k = F.elu((x @ layer.to_k.weight.t()).view(N, H, C)) + 1
        att = torch.einsum('ihc,jhc->hij', q, k) * kernel
        out = torch.einsum('hij,jhc->ihc', att, v) / (att.sum(-1).t().unsqueeze(-1) + layer.eps)
    else:
        if layer.score == 'gat':
            s = (v * layer.att_src).sum(-1)
            d = (v * layer.att_dst).sum(-1)
            e = F.leaky_relu(d.t()[:, :, None] + s.t()[:, None, :], layer.negative_slope)
        else:
            q = (x @ layer.to_q.weight.t()).view(N, H, C)
            k = (x @ layer.to_k.weight.t()).view(N, H, C)
            e = torch.einsum('ihc,jhc->hij', q, k) / math.sqrt(C)
        weight = kernel if layer.kernel_weighting else (kernel != 0).double()
        att = weight * torch.exp(e - e.amax(-1, keepdim=True))
        att = att / att.sum(-1, keepdim=True)
        out = torch.einsum('hij,jhc->ihc', att, v)
    out = out.reshape(N, H * C) if layer.concat else out.mean(1)
    if layer.project:
        return out @ layer.to_out.weight.t() + layer.to_out.bias
    return out + layer.bias


@pytest.mark.parametrize('mode,score', [('linear', 'gat'), ('softmax', 'gat'),
                                        ('softmax', 'dot'), ('dense', 'gat'), ('dense', 'dot')])
@pytest.mark.parametrize('concat', [True, False])
@pytest.mark.parametrize('project', [True, False])
def test_matches_dense_reference(mode, score, concat, project):
    batch = make_batch()
    torch.manual_seed(1)
    layer = GKATAttention(8, heads=2, mode=mode, score=score, concat=concat, head_channels=3,
                          project=project)
    layer = layer.double()
    torch.nn.init.normal_(layer.to_out.bias if project else layer.bias)
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
    out = layer(batch.x, batch.batch, rwgnk=plan)
    assert out.shape == (batch.num_nodes, 8 if project else 6 if concat else 3)
    assert layer.out_channels == out.size(1)
    ref = reference(layer, batch.x, dense_kernel(batch))
    assert torch.allclose(out, ref, atol=1e-6, rtol=0)


def test_unweighted_support_ablation():
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode='softmax', kernel_weighting=False).double()
    out = layer(batch.x, rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value))
    assert torch.allclose(out, reference(layer, batch.x, dense_kernel(batch)), atol=1e-6)


@pytest.mark.parametrize('mode', ['linear', 'softmax', 'dense'])
def test_no_cross_graph_attention(mode):
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode).double()
    rwgnk = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
    out = layer(batch.x, batch.batch, rwgnk=rwgnk)
    x = batch.x.clone()
    x[batch.batch == 2] += torch.randn_like(x[batch.batch == 2])
    out2 = layer(x, batch.batch, rwgnk=rwgnk)
    keep = batch.batch != 2
    assert torch.equal(out[keep], out2[keep])
    assert not torch.allclose(out[~keep], out2[~keep])
    # Each graph alone gives the same result as inside the batch.
    data = batch.get_example(1)
    alone = layer(data.x, rwgnk=RWGNKPlan.from_tensors(data.rwgnk_index, data.rwgnk_value))
    assert torch.allclose(alone, out[batch.batch == 1], atol=1e-12)


@pytest.mark.parametrize('mode', ['linear', 'softmax', 'dense'])
def test_gradcheck(mode):
    batch = make_batch()
    data = batch.get_example(0)
    layer = GKATAttention(8, heads=2, mode=mode, head_channels=2).double()
    x = data.x.clone().requires_grad_()
    plan = RWGNKPlan.from_tensors(data.rwgnk_index, data.rwgnk_value.double())
    assert torch.autograd.gradcheck(lambda x: layer(x, rwgnk=plan), (x, ))
    # Gradients reach every parameter.
    layer(x, rwgnk=plan).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_dropout():
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode='softmax', dropout=0.5).double()
    rwgnk = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
    layer.eval()
    out = layer(batch.x, rwgnk=rwgnk)
    # no dropout in eval
    assert torch.equal(out, layer(batch.x, rwgnk=rwgnk))
    layer.train()
    assert not torch.allclose(layer(batch.x, rwgnk=rwgnk), out)


def test_repr_and_defaults():
    layer = GKATAttention(16, heads=4)
    assert str(layer) == "GKATAttention(16, heads=4, mode='linear', feature_map='elu')"
    assert str(GKATAttention(16, heads=2, mode='softmax', dropout=0.6, project=False)) == (
        "GKATAttention(16, heads=2, mode='softmax', score='gat', project=False, dropout=0.6)")
    assert layer.att_src is None and layer.to_q is not None
    x = torch.randn(3, 16)
    plan = RWGNKPlan.from_tensors(torch.tensor([[0, 1, 2], [0, 1, 2]]), torch.ones(3))
    out = layer(x, rwgnk=plan)
    assert out.shape == (3, 16)


def test_bad_input():
    with pytest.raises(ValueError, match="'mode' must be one of"):
        GKATAttention(8, mode='sparse')
    with pytest.raises(ValueError, match="'score' must be one of"):
        GKATAttention(8, mode='softmax', score='cosine')
    with pytest.raises(ValueError, match='divisible'):
        GKATAttention(10, heads=3)
    layer = GKATAttention(8, heads=2)
    idx = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"'x' must have shape \[N, 8\]"):
        layer(torch.randn(2, 5), rwgnk=RWGNKPlan.from_tensors(idx, torch.ones(2)))
    with pytest.raises(ValueError, match="'rwgnk_value' must have shape"):
        layer(torch.randn(2, 8), rwgnk=RWGNKPlan.from_tensors(idx, torch.ones(3)))
    with pytest.raises(ValueError, match="'rwgnk_index' must have shape"):
        layer(torch.randn(2, 8), rwgnk=RWGNKPlan.from_tensors(idx[0], torch.ones(2)))
    with pytest.raises(ValueError, match=r"must hold node ids in \[0, 1\).*refers to node 1"):
        RWGNKPlan.from_tensors(idx, torch.ones(2), num_nodes=1)
    # item 6 of issue 31: a row-count mismatch is an error (extra rows used to get the bias)
    with pytest.raises(ValueError, match=r"'x' has 3 rows but the RWGNK plan is of 2 nodes"):
        layer(torch.randn(3, 8), rwgnk=RWGNKPlan.from_tensors(idx, torch.ones(2)))
    with pytest.raises(TypeError, match=r"needs rwgnk=RWGNKPlan.*got tuple"):
        layer(torch.randn(2, 8), rwgnk=(idx, torch.ones(2)))
    with pytest.raises(ValueError, match=r"'backend' must be 'auto' or one of \('pairs', "
                                         r"'dense'\) for mode='softmax', got 'sparse'"):
        GKATAttention(8, mode='softmax', backend='sparse')


@pytest.mark.parametrize('mode', ['softmax', 'dense'])
def test_threshold_drops_small_kernel_entries(mode):
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode, threshold=0.2).double()
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
    out = layer(batch.x, batch.batch, rwgnk=plan)
    kernel = dense_kernel(batch)
    assert bool(((kernel > 0) & (kernel <= 0.2)).any())  # the threshold matters here
    kernel = torch.where(kernel > 0.2, kernel, torch.zeros_like(kernel))
    assert torch.allclose(out, reference(layer, batch.x, kernel), atol=1e-6)
    assert 'threshold=0.2' in str(layer)
    with pytest.raises(ValueError, match="'threshold' must be >= 0"):
        GKATAttention(8, mode=mode, threshold=-1.0)


@pytest.mark.parametrize('stored,layer_threshold', [(0.0, 0.0), (0.1, 0.0), (0.0, 0.2)])
def test_precomputed_kernel_pairs(stored, layer_threshold):
    # AddRWGNKFeatures(kernel_threshold=...) stores the pairs of K = Psi Psi^T above it; batched,
    # they are the block-diagonal dense K, and the softmax layer fed with them equals the dense
    # reference with K thresholded at the larger of the two thresholds.
    torch.manual_seed(0)
    graphs = []
    for n, edges in [(5, [[0, 1, 2, 3], [1, 2, 3, 4]]),
                     (6, [[0, 0, 1, 3, 4, 2], [1, 2, 3, 4, 5, 5]])]:
        ei = to_undirected(torch.tensor(edges), num_nodes=n)
        graphs.append(Data(x=torch.randn(n, 8, dtype=torch.float64), edge_index=ei, num_nodes=n))
    transform = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, seed=3,
                                 kernel_threshold=stored)
    assert f'kernel_threshold={stored}' in repr(transform)
    batch = Batch.from_data_list([transform(g) for g in graphs])
    batch.rwgnk_value = batch.rwgnk_value.double()
    kernel = dense_kernel(batch)
    stored_dense = torch.zeros_like(kernel)
    stored_dense[tuple(batch.rwgnk_kernel_index)] = batch.rwgnk_kernel_value.double()
    expected = torch.where(kernel > stored, kernel, torch.zeros_like(kernel))
    assert torch.allclose(stored_dense, expected, atol=1e-6)
    layer = GKATAttention(8, heads=2, mode='softmax', threshold=layer_threshold).double()
    out = layer(batch.x, batch.batch,
                rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value.double(), None,
                                             batch.rwgnk_kernel_index,
                                             batch.rwgnk_kernel_value.double()))
    cut = max(stored, layer_threshold)
    ref_kernel = torch.where(kernel > cut, kernel, torch.zeros_like(kernel))
    assert torch.allclose(out, reference(layer, batch.x, ref_kernel), atol=1e-6)
    with pytest.raises(ValueError, match=r"kernel pairs must be \(index \[2, P\], value \[P\]\)"):
        layer(batch.x, rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index,
                                                    batch.rwgnk_value.double(), None,
                                                    batch.rwgnk_kernel_index,
                                                    batch.rwgnk_kernel_value[:-1]))
    with pytest.raises(ValueError, match="'kernel_threshold' must be None or >= 0"):
        AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, kernel_threshold=-1.0)


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'auto'])
@pytest.mark.parametrize('with_kernel', [False, True])
def test_linear_backends_equal_dense_reference(backend, with_kernel):
    batch = make_batch()
    torch.manual_seed(1)
    layer = GKATAttention(8, heads=2, mode='linear', head_channels=3, backend=backend).double()
    torch.nn.init.normal_(layer.to_out.bias)
    kernel = rwgnk_kernel(batch.rwgnk_index, batch.rwgnk_value, batch.num_nodes) \
        if with_kernel else (None, None)
    x = batch.x.clone().requires_grad_()
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, None, *kernel)
    if with_kernel and backend == 'sparse':  # stored pairs are the mask: not Psi Psi^T's
        with pytest.raises(ValueError, match="backend='sparse' computes the exact kernel"):
            layer(x, batch.batch, rwgnk=plan)
        return
    out = layer(x, batch.batch, rwgnk=plan)
    ref = reference(layer, batch.x, dense_kernel(batch))
    assert torch.allclose(out, ref, atol=1e-9, rtol=0)
    out.sum().backward()
    assert layer.to_q.weight.grad is not None and x.grad is not None


def test_linear_backend_repr_and_bad_value():
    assert 'backend=' not in str(GKATAttention(8, heads=2))
    assert "backend='pairs'" in str(GKATAttention(8, heads=2, backend='pairs'))
    with pytest.raises(ValueError, match="'backend' must be 'auto' or one of"):
        GKATAttention(8, backend='gather')


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('mode', ['softmax', 'linear'])
def test_half_precision_module(dtype, mode):
    # issue #15 item 8: softmax mode raised '"sparse_matmul" not implemented' in bf16 / fp16
    from torch_geometric.utils import erdos_renyi_graph
    torch.manual_seed(0)
    d = AddRWGNKFeatures(num_walks=4, max_length=3, lam=0.8, alpha=1.0, seed=0)(
        Data(edge_index=to_undirected(erdos_renyi_graph(20, 0.3)), num_nodes=20))
    x = torch.randn(20, 16, dtype=torch.float64)
    layer = GKATAttention(16, heads=2, mode=mode).double()
    ref = layer(x, rwgnk=RWGNKPlan.from_tensors(d.rwgnk_index, d.rwgnk_value.double()))
    plan = RWGNKPlan.from_tensors(d.rwgnk_index, d.rwgnk_value.to(dtype))
    out = layer.to(dtype)(x.to(dtype), rwgnk=plan)
    assert out.dtype == dtype
    # half-precision rounding of inputs, weights and sums: a few units of its epsilon
    tol = 40 * torch.finfo(dtype).eps * float(ref.abs().max())
    assert float((out.double() - ref).abs().max()) < tol


def test_softmax_kernel_memory_is_checked_first(monkeypatch):
    # issue #15 item 7: the kernel Psi Psi^T of a star is N^2; estimated before the product
    N = 3000
    ei = torch.stack([torch.zeros(N - 1, dtype=torch.long), torch.arange(1, N)])
    star = AddRWGNKFeatures(num_walks=2, max_length=2, lam=0.8, alpha=1.0, seed=0)(
        Data(edge_index=torch.cat([ei, ei.flip(0)], 1), num_nodes=N))
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '50M')
    with pytest.raises(MemoryError,
                       match=r"GKATAttention\(mode='softmax', backend='(pairs|dense)'\).*"
                                          r"more than \$PYG_GRF_MEMORY_LIMIT.*mode='linear'"):
        GKATAttention(8, heads=2, mode='softmax')(torch.randn(N, 8),
                                                 rwgnk=RWGNKPlan.build(star))
    out = GKATAttention(8, heads=2, mode='linear')(torch.randn(N, 8),
                                                  rwgnk=RWGNKPlan.build(star))
    assert torch.isfinite(out).all()


def test_dense_mode_memory_is_checked_first(monkeypatch):
    # the adversarial review of issue #15 item 7: mode='dense' on a 20k-node star tried to
    # allocate 6.4 GB and failed inside the allocator; now estimated before the first [N, N]
    N = 3000
    path = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    g = AddRWGNKFeatures(num_walks=2, max_length=2, lam=0.8, alpha=1.0, seed=0)(
        Data(edge_index=torch.cat([path, path.flip(0)], 1), num_nodes=N))
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '100M')
    with pytest.raises(MemoryError, match=r"GKATAttention\(mode='dense', backend='dense'\) on "
                                          r"3000 nodes .*more than \$PYG_GRF_MEMORY_LIMIT.*"
                                          r"mode='linear'"):
        GKATAttention(8, heads=2, mode='dense')(torch.randn(N, 8), rwgnk=RWGNKPlan.build(g))
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '4G')  # (6 + 4 H) N^2 floats fit: it runs
    small = GKATAttention(8, heads=2, mode='dense')(torch.randn(N, 8),
                                                    rwgnk=RWGNKPlan.build(g))
    assert torch.isfinite(small).all()


@pytest.mark.parametrize('mode', ['linear', 'softmax', 'dense'])
def test_samples_on_one_shared_graph_equal_a_batch_of_copies(mode):
    # x [B, n, C] with the features of one graph equals the PyG batch of B copies (issue #17:
    # every mask family on a shared grid without glue)
    from torch_geometric.data import Batch, Data

    from pyg_grf.datasets import grid_edge_index
    from pyg_grf.transforms import AddRWGNKFeatures
    torch.manual_seed(0)
    g = AddRWGNKFeatures(num_walks=8, lam=0.5, alpha=1.0, max_length=3, p_halt=0.3, seed=0,
                         kernel_threshold=0.0)(Data(edge_index=grid_edge_index(3, 4),
                                                    num_nodes=12))
    layer = GKATAttention(8, heads=2, mode=mode).double().eval()
    x = torch.randn(3, 12, 8, dtype=torch.float64)
    out = layer(x, rwgnk=RWGNKPlan.build(g))
    copies = Batch.from_data_list([Data(x=x[b], edge_index=g.edge_index, num_nodes=12,
                                        rwgnk_index=g.rwgnk_index, rwgnk_value=g.rwgnk_value,
                                        rwgnk_kernel_index=g.rwgnk_kernel_index,
                                        rwgnk_kernel_value=g.rwgnk_kernel_value)
                                   for b in range(3)])
    ref = layer(copies.x, copies.batch, rwgnk=RWGNKPlan.build(copies))
    assert out.shape == (3, 12, 8)
    torch.testing.assert_close(out.reshape(36, 8), ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="'batch' is not used"):
        layer(x, copies.batch, rwgnk=RWGNKPlan.build(g))
    with pytest.raises(ValueError, match='the plan is of a graph of 12 nodes'):
        layer(x[:, :5], rwgnk=RWGNKPlan.build(g))


# The plan (issue 31 items 1-3) ###############################################################

CASES = [('linear', 'sparse'), ('linear', 'pairs'), ('linear', 'dense'), ('softmax', 'pairs'),
         ('softmax', 'dense'), ('dense', 'dense')]


@pytest.mark.parametrize('mode,backend', CASES)
def test_plan_built_once_for_all_layers(mode, backend, monkeypatch):
    # plan_payload builds what every layer's backend needs once (the kernel pairs at most once);
    # every layer then equals its float64 dense reference
    import pyg_grf.nn.attention.gkat.plan as plan_module
    b = make_batch()
    b.rwgnk_value = b.rwgnk_value.double()
    layers = [GKATAttention(8, heads=2, mode=mode, backend=backend).double() for _ in range(3)]
    builds = []
    real = plan_module.rwgnk_kernel
    monkeypatch.setattr(plan_module, 'rwgnk_kernel',
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    payload = GKATAttention.plan_payload(b, layers)
    assert set(payload) == {'rwgnk'} and isinstance(payload['rwgnk'], RWGNKPlan)
    outs = [layer(b.x, b.batch, **payload) for layer in layers]
    assert len(builds) == (1 if backend == 'pairs' else 0)
    kernel = dense_kernel(b)
    for layer, out in zip(layers, outs):
        assert torch.allclose(out, reference(layer, b.x, kernel), atol=1e-10)


@pytest.mark.parametrize('mode,backend', CASES)
def test_plan_owns_its_tensors_moves_and_pickles(mode, backend):
    import pickle
    b = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode, backend=backend).double().eval()
    plan = layer.payload(b)['rwgnk']
    out = layer(b.x, b.batch, rwgnk=plan)
    # an edit of the data after the plan was built (even through .data) does not change it
    with torch.no_grad():
        b.rwgnk_value.data.mul_(torch.linspace(0.2, 3.0, b.rwgnk_value.numel()))
    b.rwgnk_index.data[0, 0] = b.num_nodes + 3
    assert torch.equal(layer(b.x, b.batch, rwgnk=plan), out)
    # .to() and a pickling round trip give equal outputs; pickles are compact (int32 indices)
    assert torch.equal(layer(b.x, b.batch, rwgnk=plan.to('cpu')), out)
    again = pickle.loads(pickle.dumps(plan))
    assert torch.equal(layer(b.x, b.batch, rwgnk=again), out)
    assert plan.psi_index.dtype == torch.int32 and plan.psi_value.dtype == torch.float64
    assert RWGNKPlan.build(make_batch()).psi_value.dtype == torch.float64  # kept for float64
    b = make_batch()
    b.rwgnk_value = b.rwgnk_value.float()
    assert RWGNKPlan.build(b).psi_value.dtype == torch.float32
    with pytest.raises(Exception):  # immutable
        plan.num_nodes = 3


def test_auto_is_a_pure_function_of_sizes():
    # the same answer on a fresh and on a used plan, and for the same sizes whatever ran before
    b = make_batch()
    for mode in ('linear', 'softmax'):
        layer = GKATAttention(8, heads=2, mode=mode).double()
        fresh = layer.payload(b)['rwgnk']
        first = layer.backend_for(fresh)
        layer(b.x, b.batch, rwgnk=fresh)
        layer(b.x, b.batch, rwgnk=fresh)
        assert layer.backend_for(fresh) == first == layer.backend_for(layer.payload(b)['rwgnk'])
    sizes = dict(num_nodes=19717, psi_nnz=279127, pairs=526961, num_graphs=1,
                 max_graph_nodes=19717, heads=8, head_channels=8, feature_dim=8)
    answers = {choose_backend('linear', None, **sizes) for _ in range(8)}
    assert answers == {'pairs'}
    # every backend is costed; 'sparse' only where the mask is the exact kernel
    assert set(costs('linear', **sizes)) == {'sparse', 'pairs', 'dense'}
    assert set(costs('linear', **dict(sizes, exact=False))) == {'pairs', 'dense'}
    assert set(costs('softmax', **sizes)) == {'pairs', 'dense'}
    # a budget rules out what does not fit: dense per graph on one 19717-node graph
    assert choose_backend('softmax', 2**30, **sizes) == 'pairs'


def test_memory_is_checked_before_any_backend_allocates(monkeypatch):
    b = make_batch()
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '1K')
    for mode, backend in CASES:
        layer = GKATAttention(8, heads=2, mode=mode, backend=backend).double()
        plan = RWGNKPlan.build(b)  # no pairs: nothing large built yet
        with pytest.raises(MemoryError, match=r"more than \$PYG_GRF_MEMORY_LIMIT"):
            layer(b.x, b.batch, rwgnk=plan)


def test_stored_pairs_define_the_mask():
    # with the transform's kernel pairs the mask is those pairs: 'sparse' (the exact kernel)
    # refuses, 'auto' runs on them
    b = make_batch()
    b.rwgnk_kernel_index, b.rwgnk_kernel_value = rwgnk_kernel(b.rwgnk_index, b.rwgnk_value,
                                                              b.num_nodes, 0.05)
    plan = RWGNKPlan.build(b)
    assert not plan.exact
    with pytest.raises(ValueError, match="backend='sparse' computes the exact kernel"):
        GKATAttention(8, heads=2, backend='sparse').double()(b.x, b.batch, rwgnk=plan)
    layer = GKATAttention(8, heads=2).double()
    assert layer.backend_for(plan) in ('pairs', 'dense')
    assert torch.isfinite(layer(b.x, b.batch, rwgnk=plan)).all()


@pytest.mark.parametrize('mode,backend,score', [
    ('linear', 'sparse', 'gat'), ('linear', 'pairs', 'gat'), ('linear', 'dense', 'gat'),
    ('softmax', 'pairs', 'gat'), ('softmax', 'pairs', 'dot'), ('softmax', 'dense', 'dot')])
def test_gradcheck_every_backend(mode, backend, score):
    # the hand-written backward passes (per-head kernels of 'sparse' and 'pairs') against
    # finite differences, on a batch of three graphs, inputs and every parameter
    batch = make_batch()
    torch.manual_seed(2)
    layer = GKATAttention(8, heads=3, mode=mode, head_channels=2, backend=backend,
                          score=score).double()
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, ptr=batch.ptr)
    x = batch.x.clone().requires_grad_()
    params = [p for p in layer.parameters()]
    assert torch.autograd.gradcheck(lambda x, *ps: layer(x, batch.batch, rwgnk=plan),
                                    (x, *params))


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
def test_backends_agree_in_float64_with_gradients(mode):
    batch = make_batch()
    torch.manual_seed(3)
    layer = GKATAttention(8, heads=2, mode=mode, head_channels=3, backend='dense').double()
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, ptr=batch.ptr)
    grads = {}
    for backend in ('sparse', 'pairs', 'dense') if mode == 'linear' else ('pairs', 'dense'):
        layer.backend = backend
        layer.zero_grad()
        x = batch.x.clone().requires_grad_()
        out = layer(x, batch.batch, rwgnk=plan)
        out.square().sum().backward()
        grads[backend] = (out, x.grad, layer.to_v.weight.grad)
    ref = grads.pop('dense')
    for backend, got in grads.items():
        for a, b in zip(got, ref):
            assert torch.allclose(a, b, atol=1e-11, rtol=0), backend


def test_per_head_kernels_equal_dense_products():
    from pyg_grf.nn.attention.gkat.pairs import head_sddmm, head_spmm
    from pyg_grf.ops import SparsePattern
    torch.manual_seed(4)
    N, H, D, P = 7, 3, 4, 20
    index = torch.unique(torch.randint(0, N, (2, P)), dim=1)  # row-major, no duplicates
    index = index.contiguous()  # (SparsePattern reads strided index rows wrongly)
    pattern = SparsePattern(index, (N, N))
    w = torch.randn(H, index.size(1), dtype=torch.float64, requires_grad=True)
    x = torch.randn(H, N, D, dtype=torch.float64, requires_grad=True)
    dense = torch.zeros(H, N, N, dtype=torch.float64)
    dense[:, index[0], index[1]] = w.detach()
    assert torch.allclose(head_spmm(pattern, w, x), dense @ x.detach(), atol=1e-12)
    a = torch.randn(H, N, D, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(head_sddmm(pattern, a, x),
                          (a.detach()[:, index[0]] * x.detach()[:, index[1]]).sum(-1),
                          atol=1e-12)
    assert torch.autograd.gradcheck(lambda w, x: head_spmm(pattern, w, x), (w, x))
    assert torch.autograd.gradcheck(lambda a, x: head_sddmm(pattern, a, x), (a, x))
    empty = SparsePattern(torch.zeros(2, 0, dtype=torch.long), (N, N))
    out = head_spmm(empty, w[:, :0], x)
    assert out.shape == (H, N, D) and not out.any()
    out.sum().backward()  # still differentiable


def test_softmax_row_without_pairs_gives_zeros():
    # stored pairs that leave node 0 without any pair: its output is zero (no NaN), as a
    # node without edges in PyG's softmax
    batch = make_batch()
    index, value = rwgnk_kernel(batch.rwgnk_index, batch.rwgnk_value, batch.num_nodes)
    keep = index[0] != 0
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, batch.num_nodes,
                                  index[:, keep], value[keep])
    layer = GKATAttention(8, heads=2, mode='softmax', backend='pairs', project=False,
                          bias=False).double()
    out = layer(batch.x, rwgnk=plan)
    assert torch.isfinite(out).all() and not out[0].any() and out[1:].abs().sum() > 0


def test_one_projection_for_queries_keys_values():
    # one product with the stacked weights, the parameters (and state dict) of three
    layer = GKATAttention(8, heads=2, mode='linear').double()
    assert {'to_q.weight', 'to_k.weight', 'to_v.weight'} <= set(layer.state_dict())
    x = torch.randn(5, 8, dtype=torch.float64)
    q, k, v = layer._project(x)
    for got, lin in ((q, layer.to_q), (k, layer.to_k), (v, layer.to_v)):
        assert torch.allclose(got.reshape(5, -1), lin(x), atol=1e-14)


def test_plan_of_a_strided_index_equals_the_contiguous_one():
    batch = make_batch()
    strided = batch.rwgnk_index.t().contiguous().t()   # same values, rows with stride 2
    assert not strided.is_contiguous()
    layer = GKATAttention(8, heads=2, mode='linear', backend='sparse').double()
    a = layer(batch.x, rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value))
    b = layer(batch.x, rwgnk=RWGNKPlan.from_tensors(strided, batch.rwgnk_value))
    assert torch.allclose(a, b, atol=1e-13)
