import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_undirected

from pyg_grf.features import rwgnk_kernel
from pyg_grf.loader import prepare_payload
from pyg_grf.nn import GKATAttention
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.nn.attention.grf import BackendMemoryError
from pyg_grf.nn.attention.grf.pairs import PairsStructures
from pyg_grf.nn.attention.grf.sparse import SparseStructures
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
    psi.index_put_(tuple(batch.rwgnk_index), batch.rwgnk_value.double(), accumulate=True)
    return psi @ psi.t()


def cut(kernel, threshold):
    return torch.where(kernel > threshold, kernel, torch.zeros_like(kernel))


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
    return out if layer.bias is None else out + layer.bias


def star(n, seed=0):
    ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    torch.manual_seed(seed)
    g = AddRWGNKFeatures(num_walks=2, max_length=2, lam=0.8, alpha=1.0, seed=seed)(
        Data(x=torch.randn(n, 8, dtype=torch.float64), edge_index=torch.cat([ei, ei.flip(0)], 1),
             num_nodes=n))
    g.rwgnk_value = g.rwgnk_value.double()
    return g


# Every mode against the dense float64 reference #############################################

@pytest.mark.parametrize('mode,score', [('linear', 'gat'), ('softmax', 'gat'),
                                        ('softmax', 'dot')])
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
    assert torch.allclose(out, ref, atol=1e-9, rtol=0)


def test_unweighted_support_ablation():
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode='softmax', kernel_weighting=False).double()
    out = layer(batch.x, rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value))
    assert torch.allclose(out, reference(layer, batch.x, dense_kernel(batch)), atol=1e-9)


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
def test_no_cross_graph_attention(mode):
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode).double()
    rwgnk = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
    out = layer(batch.x, batch.batch, rwgnk=rwgnk)
    x = batch.x.clone()
    x[batch.batch == 2] += torch.randn_like(x[batch.batch == 2])
    out2 = layer(x, batch.batch, rwgnk=rwgnk)
    keep = batch.batch != 2
    assert torch.allclose(out[keep], out2[keep], atol=1e-12, rtol=0)
    assert not torch.allclose(out[~keep], out2[~keep])
    assert torch.allclose(out2, reference(layer, x, dense_kernel(batch)), atol=1e-9)
    # Each graph alone gives the same result as inside the batch.
    data = batch.get_example(1)
    alone = layer(data.x, rwgnk=RWGNKPlan.from_tensors(data.rwgnk_index, data.rwgnk_value))
    assert torch.allclose(alone, out[batch.batch == 1], atol=1e-12)


def auto_choice(batch, layer):
    # GRF's rule for the exact kernel, counted from Psi's dense support: the engine's
    # multiply-adds (per cell and head a score, a weighted sum of [v, 1] and one mask value)
    # against the low-rank path's (two products over Psi's pairs at width m (d + 1), the outer
    # products and the contraction)
    N = batch.num_nodes
    psi = torch.zeros(N, N, dtype=torch.float64).index_put(
        (batch.rwgnk_index[0], batch.rwgnk_index[1]),
        torch.ones(batch.rwgnk_index.size(1), dtype=torch.float64), accumulate=True) != 0
    cells = int(((psi.double() @ psi.double().t()) != 0).sum())
    H, m, d = layer.heads, layer.feature_dim, layer.head_channels
    engine = H * cells * (m + d + 2)
    low = H * (2 * int(psi.sum()) + 2 * N) * m * (d + 1)
    assert max(engine, low) > 1.2 * min(engine, low)  # a clear case, whatever the details
    return 'sparse' if low < engine else 'pairs'


@pytest.mark.parametrize('mode,backend,score', [
    ('linear', 'pairs', 'gat'), ('linear', 'sparse', 'gat'), ('linear', 'auto', 'gat'),
    ('softmax', 'auto', 'gat'), ('softmax', 'auto', 'dot')])
def test_gradcheck_every_backend(mode, backend, score):
    # the hand-written backward passes (the GRF engine's operator, the low-rank path, the
    # softmax mode's CSR products) against finite differences, on a batch of three graphs,
    # inputs and every parameter
    batch = make_batch()
    torch.manual_seed(2)
    layer = GKATAttention(8, heads=3, mode=mode, head_channels=2, backend=backend,
                          score=score).double()
    plan = RWGNKPlan.build(batch, [layer])
    if mode == 'linear':
        part = plan.linear_part(layer.spec(True), 0.0)
        # 'auto': the computation with fewer multiply-adds
        assert part.backend == (auto_choice(batch, layer) if backend == 'auto' else backend)
    x = batch.x.clone().requires_grad_()
    params = list(layer.parameters())
    assert torch.autograd.gradcheck(lambda x, *ps: layer(x, batch.batch, rwgnk=plan),
                                    (x, *params))
    # Gradients reach every parameter.
    layer.zero_grad()
    layer(x, batch.batch, rwgnk=plan).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
def test_backends_agree_with_the_reference_in_float64_with_gradients(mode):
    # outputs and gradients of every backend equal those of the dense reference (autograd)
    batch = make_batch()
    torch.manual_seed(3)
    layer = GKATAttention(8, heads=2, mode=mode, head_channels=3).double()
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, ptr=batch.ptr)
    x = batch.x.clone().requires_grad_()
    ref = reference(layer, x, dense_kernel(batch))
    ref.square().sum().backward()
    expected = (ref.detach(), x.grad.clone(), layer.to_v.weight.grad.clone())
    for backend in ('pairs', 'sparse', 'auto'):  # (the softmax mode: pairs whatever it says)
        layer.backend = backend
        layer.zero_grad()
        x = batch.x.clone().requires_grad_()
        out = layer(x, batch.batch, rwgnk=plan)
        out.square().sum().backward()
        for a, b in zip((out, x.grad, layer.to_v.weight.grad), expected):
            assert torch.allclose(a, b, atol=1e-10, rtol=0), backend


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
def test_dropout(mode):
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode, dropout=0.5).double()
    rwgnk = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value)
    layer.eval()
    out = layer(batch.x, rwgnk=rwgnk)
    # no dropout in eval: the reference
    assert torch.allclose(out, reference(layer, batch.x, dense_kernel(batch)), atol=1e-9)
    assert torch.equal(out, layer(batch.x, rwgnk=rwgnk))
    layer.train()
    torch.manual_seed(0)
    dropped = layer(batch.x, rwgnk=rwgnk)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, out)


def test_repr_and_defaults():
    layer = GKATAttention(16, heads=4)
    assert str(layer) == "GKATAttention(16, heads=4, mode='linear', feature_map='elu')"
    assert str(GKATAttention(16, heads=2, mode='softmax', dropout=0.6, project=False)) == (
        "GKATAttention(16, heads=2, mode='softmax', score='gat', project=False, dropout=0.6)")
    assert str(GKATAttention(16, heads=2, threshold=0.25, backend='pairs', concat=False)) == (
        "GKATAttention(16, heads=2, head_channels=16, mode='linear', feature_map='elu', "
        "threshold=0.25, backend='pairs', concat=False)")
    assert 'backend=' not in str(GKATAttention(8, heads=2))
    assert layer.att_src is None and layer.to_q is not None and layer.backend == 'auto'
    soft = GKATAttention(16, heads=2, mode='softmax')
    assert soft.to_q is None and soft.att_src is not None and soft.feature_map is None
    x = torch.randn(3, 16, dtype=torch.float64)
    plan = RWGNKPlan.from_tensors(torch.tensor([[0, 1, 2], [0, 1, 2]]),
                                  torch.ones(3, dtype=torch.float64))
    out = layer.double()(x, rwgnk=plan)
    assert out.shape == (3, 16)
    # the kernel is the identity: every node attends to itself only
    assert torch.allclose(out, reference(layer, x, torch.eye(3, dtype=torch.float64)),
                          atol=1e-12)


def test_bad_input():
    with pytest.raises(ValueError, match=r"'mode' must be one of \('linear', 'softmax'\), "
                                         r"got 'dense'"):
        GKATAttention(8, mode='dense')
    with pytest.raises(ValueError, match="'mode' must be one of"):
        GKATAttention(8, mode='sparse')
    with pytest.raises(ValueError, match=r"'backend' must be one of \('auto', 'pairs', "
                                         r"'sparse'\), got 'dense'"):
        GKATAttention(8, backend='dense')
    with pytest.raises(ValueError, match="'backend' must be one of"):
        GKATAttention(8, mode='softmax', backend='gather')
    with pytest.raises(ValueError, match="'score' must be one of"):
        GKATAttention(8, mode='softmax', score='cosine')
    with pytest.raises(ValueError, match="'threshold' must be >= 0"):
        GKATAttention(8, threshold=-1.0)
    with pytest.raises(ValueError, match='divisible'):
        GKATAttention(10, heads=3)
    layer = GKATAttention(8, heads=2)
    idx = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"expects x of shape \[N, 8\]"):
        layer(torch.randn(2, 5), rwgnk=RWGNKPlan.from_tensors(idx, torch.ones(2)))
    with pytest.raises(ValueError, match=r"Expected 'rwgnk_value' of shape \[2\] \(got \[3\]\)"):
        layer(torch.randn(2, 8), rwgnk=RWGNKPlan.from_tensors(idx, torch.ones(3)))
    with pytest.raises(ValueError, match=r"Expected 'rwgnk_index' of shape \[2, nnz\]"):
        layer(torch.randn(2, 8), rwgnk=RWGNKPlan.from_tensors(idx[0], torch.ones(2)))
    with pytest.raises(ValueError, match=r"must hold node ids in \[0, 1\).*refers to node 1"):
        RWGNKPlan.from_tensors(idx, torch.ones(2), num_nodes=1)
    with pytest.raises(ValueError, match="the kernel pairs need both"):
        RWGNKPlan.from_tensors(idx, torch.ones(2), kernel_index=idx)
    # a row-count mismatch is an error (extra rows used to get the bias)
    with pytest.raises(ValueError, match=r"the RWGNK plan covers 2 nodes but 'x' has 3 rows"):
        layer(torch.randn(3, 8), rwgnk=RWGNKPlan.from_tensors(idx, torch.ones(2)))
    with pytest.raises(TypeError, match=r"needs rwgnk=RWGNKPlan.*got tuple"):
        layer(torch.randn(2, 8), rwgnk=(idx, torch.ones(2)))
    with pytest.raises(ValueError, match=r"needs rwgnk=RWGNKPlan.*got NoneType"):
        layer(torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"no RWGNK features \['rwgnk_index', 'rwgnk_value'\]"):
        layer.payload(Data(x=torch.randn(2, 8), num_nodes=2))


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
def test_threshold_drops_small_kernel_entries(mode):
    batch = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode, threshold=0.2).double()
    plan = RWGNKPlan.build(batch, [layer])
    out = layer(batch.x, batch.batch, rwgnk=plan)
    kernel = dense_kernel(batch)
    assert bool(((kernel > 0) & (kernel <= 0.2)).any())  # the threshold matters here
    assert torch.allclose(out, reference(layer, batch.x, cut(kernel, 0.2)), atol=1e-9)
    assert not torch.allclose(out, reference(layer, batch.x, kernel), atol=1e-3)
    assert 'threshold=0.2' in str(layer)
    if mode == 'linear':  # a cut kernel: the kernel pairs as an asymmetric mask
        part = plan.linear_part(layer.spec(False), 0.2)
        assert layer.spec(False).mode == 'asymmetric' and part.backend == 'pairs'
        layer.backend = 'sparse'
        with pytest.raises(ValueError, match=r"backend='sparse' computes the exact kernel.*"
                                             r"threshold > 0"):
            layer(batch.x, batch.batch, rwgnk=plan)


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
@pytest.mark.parametrize('stored,layer_threshold', [(0.0, 0.0), (0.1, 0.0), (0.0, 0.2)])
def test_precomputed_kernel_pairs(mode, stored, layer_threshold):
    # AddRWGNKFeatures(kernel_threshold=...) stores the pairs of K = Psi Psi^T above it; batched,
    # they are the block-diagonal dense K, and the layer fed with them equals the dense
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
    batch.rwgnk_kernel_value = batch.rwgnk_kernel_value.double()
    kernel = dense_kernel(batch)
    stored_dense = torch.zeros_like(kernel)
    stored_dense[tuple(batch.rwgnk_kernel_index)] = batch.rwgnk_kernel_value
    assert torch.allclose(stored_dense, cut(kernel, stored), atol=1e-6)
    layer = GKATAttention(8, heads=2, mode=mode, threshold=layer_threshold).double()
    plan = RWGNKPlan.build(batch, [layer])
    assert not plan.exact
    out = layer(batch.x, batch.batch, rwgnk=plan)
    # the stored values define the mask (float32 kernel values of the transform)
    ref_kernel = cut(stored_dense, layer_threshold)
    assert torch.allclose(out, reference(layer, batch.x, ref_kernel), atol=1e-9)
    assert torch.allclose(out, reference(layer, batch.x, cut(kernel, max(stored,
                                                                           layer_threshold))),
                          atol=1e-5)
    with pytest.raises(ValueError, match=r"Expected 'rwgnk_kernel_(index|value)' of shape"):
        layer(batch.x, rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, None,
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
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, None, *kernel,
                                  ptr=batch.ptr)
    if with_kernel and backend == 'sparse':  # stored pairs are the mask: not Psi Psi^T's
        with pytest.raises(ValueError, match="backend='sparse' computes the exact kernel"):
            layer(x, batch.batch, rwgnk=plan)
        return
    exact = not with_kernel
    part = plan.linear_part(layer.spec(exact), 0.0)
    # 'auto': the exact kernel by the multiply-add count, a cut kernel on its pairs
    low_rank = backend == 'sparse' or (backend == 'auto' and exact
                                       and auto_choice(batch, layer) == 'sparse')
    assert part.backend == ('sparse' if low_rank else 'pairs')
    assert isinstance(part.structures, SparseStructures if low_rank else PairsStructures)
    assert layer.spec(exact).mode == ('symmetric' if exact else 'asymmetric')
    out = layer(x, batch.batch, rwgnk=plan)
    ref = reference(layer, batch.x, dense_kernel(batch))
    assert torch.allclose(out, ref, atol=1e-9, rtol=0)
    out.sum().backward()
    assert layer.to_q.weight.grad is not None and x.grad is not None


def test_softmax_ignores_the_linear_backend():
    # the softmax mode always runs on the kernel pairs, whatever 'backend' says
    batch = make_batch()
    ref = None
    for backend in ('auto', 'pairs', 'sparse'):
        torch.manual_seed(0)
        layer = GKATAttention(8, heads=2, mode='softmax', backend=backend).double()
        plan = layer.payload(batch)['rwgnk']
        assert plan.grf is None and plan.pairs is not None
        out = layer(batch.x, batch.batch, rwgnk=plan)
        ref = reference(layer, batch.x, dense_kernel(batch))
        assert torch.allclose(out, ref, atol=1e-9), backend


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('mode,backend', [('softmax', 'auto'), ('linear', 'pairs'),
                                          ('linear', 'sparse')])
def test_half_precision_module(dtype, mode, backend):
    # issue #15 item 8: softmax mode raised '"sparse_matmul" not implemented' in bf16 / fp16
    from torch_geometric.utils import erdos_renyi_graph
    torch.manual_seed(0)
    d = AddRWGNKFeatures(num_walks=4, max_length=3, lam=0.8, alpha=1.0, seed=0)(
        Data(edge_index=to_undirected(erdos_renyi_graph(20, 0.3)), num_nodes=20))
    d.rwgnk_value = d.rwgnk_value.double()
    x = torch.randn(20, 16, dtype=torch.float64)
    layer = GKATAttention(16, heads=2, mode=mode, backend=backend).double()
    ref = reference(layer, x, dense_kernel(d)).detach()
    plan = RWGNKPlan.from_tensors(d.rwgnk_index, d.rwgnk_value.to(dtype))
    xh = x.to(dtype).requires_grad_()
    out = layer.to(dtype)(xh, rwgnk=plan)
    assert out.dtype == dtype
    # half-precision rounding of inputs, weights and sums: a few units of its epsilon
    tol = 40 * torch.finfo(dtype).eps * float(ref.abs().max())
    assert float((out.detach().double() - ref).abs().max()) < tol
    # finite gradients in half precision
    out.float().square().sum().backward()
    assert xh.grad.dtype == dtype and torch.isfinite(xh.grad).all() and xh.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# Memory: 'auto' falls back to the low-rank path #############################################

def test_auto_falls_back_to_sparse_when_pairs_do_not_fit(monkeypatch):
    # the kernel of a star is dense: its pairs structures need far more than the low-rank path
    from pyg_grf.nn.attention.grf import pairs, sparse
    n = 400
    g = star(n)
    layer = GKATAttention(8, heads=2, mode='linear').double()
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', 'off')
    on_pairs = GKATAttention(8, heads=2, mode='linear', backend='pairs').double()
    full = RWGNKPlan.build(g, [on_pairs])
    part = full.linear_part(on_pairs.spec(True), 0.0)
    assert part.backend == 'pairs' and part.structures.nnz > n * n // 2  # most pairs
    # with no budget, 'auto' runs the low rank path here by the multiply-add count alone
    unbounded = RWGNKPlan.build(g, [layer]).linear_part(layer.spec(True), 0.0)
    assert unbounded.backend == auto_choice(g, layer) == 'sparse'
    loads = full.grf_loads(0.0)
    need_sparse = sparse.memory(n, loads.pairs()[0].size(1), 2, layer.feature_dim,
                                layer.head_channels, 8)
    need_pairs = pairs.memory(part.structures.nnz, part.structures.stats.size(1), 2, 8)
    assert need_sparse < need_pairs
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', str((need_sparse + need_pairs) // 2))
    ref = reference(layer, g.x, dense_kernel(g))
    for _ in range(2):  # the same answer every time: a function of sizes and the budget
        plan = layer.payload(g)['rwgnk']
        part = plan.linear_part(layer.spec(True), 0.0)
        assert part.backend == 'sparse' and type(part.structures) is SparseStructures
        assert torch.allclose(layer(g.x, rwgnk=plan), ref, atol=1e-9)
    # also a part built per call (a plan without the layer's part)
    assert torch.allclose(layer(g.x, rwgnk=RWGNKPlan.build(g)), ref, atol=1e-9)
    with pytest.raises(BackendMemoryError, match=r"backend='pairs'.*\$PYG_GRF_MEMORY_LIMIT.*"
                                                  r"Use backend='auto'"):
        RWGNKPlan.build(g, [GKATAttention(8, heads=2, backend='pairs').double()])
    with pytest.raises(BackendMemoryError, match=r"backend='pairs'"):
        GKATAttention(8, heads=2, backend='pairs').double()(g.x, rwgnk=RWGNKPlan.build(g))


def test_memory_is_checked_before_any_backend_allocates(monkeypatch):
    b = make_batch()
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '1K')
    for backend in ('auto', 'pairs', 'sparse'):  # neither path fits: refused, not attempted
        layer = GKATAttention(8, heads=2, mode='linear', backend=backend).double()
        with pytest.raises(BackendMemoryError, match=rf"backend={backend!r}.*does not fit "
                                                      r"\$PYG_GRF_MEMORY_LIMIT"):
            RWGNKPlan.build(b, [layer])
        plan = RWGNKPlan.build(b)  # no layers: nothing large built yet
        with pytest.raises(BackendMemoryError, match=rf"backend={backend!r}"):
            layer(b.x, b.batch, rwgnk=plan)
    layer = GKATAttention(8, heads=2, mode='softmax').double()
    with pytest.raises(MemoryError, match=r"GKAT kernel Psi Psi\^T of 15 nodes.*more than "
                                          r"\$PYG_GRF_MEMORY_LIMIT.*mode='linear'"):
        layer(b.x, b.batch, rwgnk=RWGNKPlan.build(b))


def test_softmax_kernel_memory_is_checked_first(monkeypatch):
    # issue #15 item 7: the kernel Psi Psi^T of a star is N^2; estimated before the product,
    # while the linear mode falls back to the low-rank path
    g = star(3000)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '50M')
    with pytest.raises(MemoryError, match=r"GKAT kernel Psi Psi\^T of 3000 nodes.*"
                                          r"more than \$PYG_GRF_MEMORY_LIMIT.*mode='linear'"):
        GKATAttention(8, heads=2, mode='softmax')(g.x.float(), rwgnk=RWGNKPlan.build(g))
    layer = GKATAttention(8, heads=2, mode='linear').double()
    plan = layer.payload(g)['rwgnk']
    assert plan.linear_part(layer.spec(True), 0.0).backend == 'sparse'
    out = layer(g.x, rwgnk=plan)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', 'off')
    assert torch.allclose(out, reference(layer, g.x, dense_kernel(g)), atol=1e-9)


# Samples on one shared graph ################################################################

@pytest.mark.parametrize('mode,backend,stored', [
    ('linear', 'pairs', None), ('linear', 'sparse', None), ('linear', 'auto', 0.0),
    ('softmax', 'auto', None), ('softmax', 'auto', 0.0)])
def test_samples_on_one_shared_graph_equal_a_batch_of_copies(mode, backend, stored):
    # x [B, n, C] with the features of one graph equals the PyG batch of B copies (issue #17:
    # every mask family on a shared grid without glue), and the dense reference
    from pyg_grf.datasets import grid_edge_index
    torch.manual_seed(0)
    g = AddRWGNKFeatures(num_walks=8, lam=0.5, alpha=1.0, max_length=3, p_halt=0.3, seed=0,
                         kernel_threshold=stored)(Data(edge_index=grid_edge_index(3, 4),
                                                       num_nodes=12))
    g.rwgnk_value = g.rwgnk_value.double()
    layer = GKATAttention(8, heads=2, mode=mode, backend=backend).double().eval()
    x = torch.randn(3, 12, 8, dtype=torch.float64)
    plan = RWGNKPlan.build(g, [layer])
    out = layer(x, rwgnk=plan)
    kernel = dense_kernel(g)
    if stored is not None:
        kernel = torch.zeros_like(kernel)
        kernel[tuple(g.rwgnk_kernel_index)] = g.rwgnk_kernel_value.double()
    for b in range(3):
        assert torch.allclose(out[b], reference(layer, x[b], kernel), atol=1e-9)
    extra = {} if stored is None else dict(rwgnk_kernel_index=g.rwgnk_kernel_index,
                                           rwgnk_kernel_value=g.rwgnk_kernel_value)
    copies = Batch.from_data_list([Data(x=x[b], edge_index=g.edge_index, num_nodes=12,
                                        rwgnk_index=g.rwgnk_index, rwgnk_value=g.rwgnk_value,
                                        **extra)
                                   for b in range(3)])
    ref = layer(copies.x, copies.batch, rwgnk=RWGNKPlan.build(copies, [layer]))
    assert out.shape == (3, 12, 8)
    torch.testing.assert_close(out.reshape(36, 8), ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="'batch' is not used"):
        layer(x, copies.batch, rwgnk=plan)
    with pytest.raises(ValueError, match='samples of 5 nodes, but the RWGNK plan covers 12 nodes'):
        layer(x[:, :5], rwgnk=plan)
    with pytest.raises(ValueError, match='the RWGNK plan covers a batch of 3 graphs'):
        layer(x.repeat(1, 3, 1), rwgnk=RWGNKPlan.build(copies))


# The plan ###################################################################################

CASES = [('linear', 'sparse'), ('linear', 'pairs'), ('linear', 'auto'), ('softmax', 'auto')]


@pytest.mark.parametrize('mode,backend', CASES)
def test_plan_built_once_for_all_layers(mode, backend, monkeypatch):
    # plan_payload builds what every layer needs once (the kernel pairs at most once, only
    # for the softmax mode); every layer then equals its float64 dense reference
    import pyg_grf.nn.attention.gkat.plan as plan_module
    import pyg_grf.nn.attention.grf.plan as grf_plan
    b = make_batch()
    layers = [GKATAttention(8, heads=2, mode=mode, backend=backend).double() for _ in range(3)]
    builds, parts = [], []
    real, real_part = plan_module.rwgnk_kernel, grf_plan.build_part
    monkeypatch.setattr(plan_module, 'rwgnk_kernel',
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    monkeypatch.setattr(plan_module, 'build_part',
                        lambda *a, **k: parts.append(1) or real_part(*a, **k))
    payload = GKATAttention.plan_payload(b, layers)
    assert set(payload) == {'rwgnk'} and isinstance(payload['rwgnk'], RWGNKPlan)
    plan = payload['rwgnk']
    assert plan.covers(layers)
    outs = [layer(b.x, b.batch, **payload) for layer in layers]
    assert len(builds) == (1 if mode == 'softmax' else 0)
    assert len(parts) == (1 if mode == 'linear' else 0)  # one part for the three layers
    kernel = dense_kernel(b)
    for layer, out in zip(layers, outs):
        assert torch.allclose(out, reference(layer, b.x, kernel), atol=1e-10)
    # the layers' payload is the plan they built last while it matches the data
    assert layers[0].payload(b)['rwgnk'] is plan


def test_plan_covers_what_it_was_built_for():
    # a plan holds the structures of the layers it was built for; a layer it does not cover
    # (another mode, threshold or configuration) builds its part for the call, and every
    # layer equals its reference either way
    b = make_batch()
    lin = GKATAttention(8, heads=2).double()
    soft = GKATAttention(8, heads=2, mode='softmax').double()
    cut_lin = GKATAttention(8, heads=2, threshold=0.2).double()
    wide = GKATAttention(8, heads=4, head_channels=2).double()
    plan = RWGNKPlan.build(b, [lin])
    assert plan.covers([lin]) and plan.matches(b) and plan.pairs is None
    assert not plan.covers([soft]) and not plan.covers([cut_lin]) and not plan.covers([wide])
    assert RWGNKPlan.build(b, [lin, soft]).covers([lin, soft])
    assert RWGNKPlan.build(b, [soft]).covers([soft])
    assert not RWGNKPlan.build(b).covers([lin]) and RWGNKPlan.build(b).covers([])
    kernel = dense_kernel(b)
    for layer, k in ((lin, kernel), (soft, kernel), (cut_lin, cut(kernel, 0.2)),
                     (wide, kernel)):
        assert torch.allclose(layer(b.x, b.batch, rwgnk=plan), reference(layer, b.x, k),
                              atol=1e-9)
    assert plan.covers([lin]) and not plan.covers([wide])  # nothing kept from those calls


@pytest.mark.parametrize('mode,backend', CASES)
def test_plan_owns_its_tensors_moves_and_pickles(mode, backend):
    b = make_batch()
    layer = GKATAttention(8, heads=2, mode=mode, backend=backend).double().eval()
    plan = layer.payload(b)['rwgnk']
    out = layer(b.x, b.batch, rwgnk=plan)
    assert torch.allclose(out, reference(layer, b.x, dense_kernel(b)), atol=1e-10)
    # .to() and a pickling round trip give equal outputs
    assert plan.to('cpu') is plan
    assert torch.equal(layer(b.x, b.batch, rwgnk=plan.to('cpu', non_blocking=True)), out)
    again = pickle.loads(pickle.dumps(plan))
    assert isinstance(again, RWGNKPlan) and again.covers([layer]) and again.matches(b)
    assert torch.equal(layer(b.x, b.batch, rwgnk=again), out)
    # an edit of the data after the plan was built (even through .data) does not change it;
    # an in-place edit makes the plan no longer match the data
    with torch.no_grad():
        b.rwgnk_value.mul_(torch.linspace(0.2, 3.0, b.rwgnk_value.numel(),
                                          dtype=torch.float64))
    assert not plan.matches(b) and not again.matches(b)
    assert layer.payload(b)['rwgnk'] is not plan
    b.rwgnk_index.data[0, 0] = b.num_nodes + 3
    assert torch.equal(layer(b.x, b.batch, rwgnk=plan), out)
    # compact: int32 indices, float64 values kept for float64 features
    assert plan.psi_index.dtype == torch.int32 and plan.psi_value.dtype == torch.float64
    b = make_batch()
    b.rwgnk_value = b.rwgnk_value.float()
    assert RWGNKPlan.build(b).psi_value.dtype == torch.float32
    with pytest.raises(Exception, match='cannot assign'):  # immutable
        plan.num_nodes = 3


def test_stored_pairs_define_the_mask():
    # with the transform's kernel pairs the mask is those pairs: 'sparse' (the exact kernel)
    # refuses, 'auto' runs on them (asymmetric mask of the pairs as hop-0 loads)
    b = make_batch()
    b.rwgnk_kernel_index, b.rwgnk_kernel_value = rwgnk_kernel(b.rwgnk_index, b.rwgnk_value,
                                                              b.num_nodes, 0.05)
    plan = RWGNKPlan.build(b)
    assert not plan.exact
    with pytest.raises(ValueError, match="backend='sparse' computes the exact kernel"):
        GKATAttention(8, heads=2, backend='sparse').double()(b.x, b.batch, rwgnk=plan)
    layer = GKATAttention(8, heads=2).double()
    part = plan.linear_part(layer.spec(False), 0.0)
    assert part.backend == 'pairs' and layer.spec(False).mode == 'asymmetric'
    out = layer(b.x, b.batch, rwgnk=plan)
    kernel = dense_kernel(b)
    assert bool(((kernel > 0) & (kernel <= 0.05)).any())  # the stored cut matters
    assert torch.allclose(out, reference(layer, b.x, cut(kernel, 0.05)), atol=1e-9)


def test_softmax_row_without_pairs_gives_zeros():
    # stored pairs that leave node 0 without any pair: its output is zero (no NaN), as a
    # node without edges in PyG's softmax; the other rows are the reference's
    batch = make_batch()
    index, value = rwgnk_kernel(batch.rwgnk_index, batch.rwgnk_value, batch.num_nodes)
    keep = index[0] != 0
    plan = RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value, batch.num_nodes,
                                  index[:, keep], value[keep])
    layer = GKATAttention(8, heads=2, mode='softmax', project=False, bias=False).double()
    out = layer(batch.x, rwgnk=plan)
    assert torch.isfinite(out).all() and not out[0].any()
    kernel = dense_kernel(batch)
    kernel[0] = 0
    ref = reference(layer, batch.x, kernel)
    assert torch.allclose(out[1:], ref[1:], atol=1e-9)


def test_one_projection_for_queries_keys_values():
    # one product with the stacked weights, the parameters (and state dict) of three
    layer = GKATAttention(8, heads=2, mode='linear').double()
    assert {'to_q.weight', 'to_k.weight', 'to_v.weight'} <= set(layer.state_dict())
    x = torch.randn(5, 8, dtype=torch.float64)
    q, k, v = layer._project(x)
    for got, lin in ((q, layer.to_q), (k, layer.to_k), (v, layer.to_v)):
        assert torch.allclose(got.reshape(5, -1), lin(x), atol=1e-14)
    heads = layer._project(x, head_major=True)  # [H, N, C]
    for got, lin in zip(heads, (layer.to_q, layer.to_k, layer.to_v)):
        assert torch.allclose(got.transpose(0, 1).reshape(5, -1), lin(x), atol=1e-14)


@pytest.mark.parametrize('backend', ['pairs', 'sparse'])
def test_plan_of_a_strided_index_equals_the_contiguous_one(backend):
    batch = make_batch()
    strided = batch.rwgnk_index.t().contiguous().t()   # same values, rows with stride 2
    assert not strided.is_contiguous()
    layer = GKATAttention(8, heads=2, mode='linear', backend=backend).double()
    out = layer(batch.x, rwgnk=RWGNKPlan.from_tensors(strided, batch.rwgnk_value))
    assert torch.allclose(out, reference(layer, batch.x, dense_kernel(batch)), atol=1e-9)


@pytest.mark.parametrize('mode,backend', CASES)
def test_plan_built_in_inference_mode_serves_training(mode, backend):
    # Lightning's validation / test loops run under torch.inference_mode: a plan built there
    # (and kept by the layer) still serves a training step, with finite gradients
    b = make_batch()
    torch.manual_seed(0)
    layer = GKATAttention(8, heads=2, mode=mode, backend=backend).double()
    with torch.inference_mode():
        plan = layer.payload(b)['rwgnk']
        evaluated = layer(b.x, b.batch, rwgnk=plan)
    assert layer.payload(b)['rwgnk'] is plan  # kept, and served outside inference mode
    x = b.x.clone().requires_grad_()
    out = layer(x, b.batch, rwgnk=plan)
    assert torch.allclose(out, reference(layer, b.x, dense_kernel(b)), atol=1e-10)
    assert torch.equal(out.detach(), evaluated)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize('mode,backend', CASES)
def test_prepared_plan_is_not_served_to_redrawn_features(mode, backend):
    # prepare_payload leaves the plan on the data (data.rwgnk_plan); a copy of the data whose
    # RWGNK features were redrawn carries that plan along, but must not be served it
    torch.manual_seed(0)
    layer = GKATAttention(8, heads=2, mode=mode, backend=backend).double()
    data = make_batch()
    prepare_payload(layer, data)
    carried = data.rwgnk_plan
    assert isinstance(carried, RWGNKPlan) and layer.payload(data)['rwgnk'] is carried
    transform = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, seed=7)
    new = transform(copy.copy(data))
    new.rwgnk_value = new.rwgnk_value.double()
    assert new.rwgnk_plan is carried  # carried along by the copy
    plan = layer.payload(new)['rwgnk']
    assert plan is not carried and not carried.matches(new) and plan.matches(new)
    out = layer(new.x, new.batch, rwgnk=plan)
    kernel = dense_kernel(new)
    assert not torch.allclose(kernel, dense_kernel(data))
    assert torch.allclose(out, reference(layer, new.x, kernel), atol=1e-10)
    # the original data is still served its own plan
    assert layer.payload(data)['rwgnk'] is carried
