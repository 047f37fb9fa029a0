r"""Every GRF backend and mode, GKAT, the unmasked control and the GRF-GPS block on a device and
in a low precision, against the float64 CPU computation of the same weights.

The ``cuda`` cases are marked ``cuda`` and skipped without a GPU (run them with
``pytest -m cuda`` on a machine with one); the same tests run on the CPU in float32, bfloat16
and float16 by default, so their logic is exercised everywhere (float16 flushes small constants
to zero: a padded row once divided 0 / 0). Tolerances: float32 1e-4 relative to the output's
scale; bfloat16 / float16 (8 / 11 bits of mantissa, a few products deep) 5e-2 / 1e-2.
"""
import copy

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GKATAttention, GRFAttention, GRFGPSConv, LinearAttention
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures
from tests.utils import er_graph, grid_graph, path_graph

HAS_CUDA = torch.cuda.is_available()
TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}
CASES = [('cpu', torch.float32), ('cpu', torch.bfloat16), ('cpu', torch.float16)] + [
    pytest.param('cuda', dt, marks=[pytest.mark.cuda, pytest.mark.skipif(
        not HAS_CUDA, reason='no CUDA device')])
    for dt in (torch.float32, torch.bfloat16, torch.float16)]


def make_batch(seed=0):
    torch.manual_seed(seed)
    t = AddGraphRandomFeatures(num_walks=6, p_halt=0.3, max_length=3, seed=seed)
    r = AddRWGNKFeatures(num_walks=6, lam=0.5, alpha=1.0, max_length=3, p_halt=0.3, seed=seed,
                         kernel_threshold=0.0)
    graphs = [Data(x=torch.randn(n, 16, dtype=torch.float64), edge_index=ei,
                   edge_attr=torch.randn(ei.size(1), 16, dtype=torch.float64))
              for n, ei in [(9, grid_graph(3, 3)), (7, path_graph(7)),
                            (12, er_graph(12, 0.3, seed=1))]]
    return Batch.from_data_list([r(t(g)) for g in graphs])


def run(module, make_args, device, dtype):
    # the float64 CPU output, and the output of a copy on (device, dtype), with its gradient
    b = make_batch()
    ref = module.double()(*make_args(b, "cpu", torch.float64)).detach()
    dev = copy.deepcopy(module).to(device=device, dtype=dtype)
    args = make_args(b, device, dtype)
    out = dev(*args)
    assert out.dtype == dtype and out.device.type == device
    out.float().square().sum().backward()
    assert all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in dev.parameters())
    scale = float(ref.abs().max())
    err = float((out.double().cpu() - ref).abs().max())
    assert err <= TOL[dtype] * scale, f'max error {err:.3g} for output scale {scale:.3g}'


def grf_args(b, device, dtype):
    x = b.x.to(device, dtype).requires_grad_()
    return x, b.batch.to(device)


class WithLoads(torch.nn.Module):
    # the layer with its payload built from the batch on the layer's device
    def __init__(self, layer, kind):
        super().__init__()
        self.layer, self.kind = layer, kind

    def forward(self, x, batch):
        b = make_batch().to(str(x.device))
        if self.kind == 'grf':
            return self.layer(x, batch, grf=GRFLoads.from_data(b))
        if self.kind == 'rwgnk':
            return self.layer(x, batch, rwgnk=RWGNKPlan.build(b))
        return self.layer(x, batch)


@pytest.mark.parametrize('device,dtype', CASES)
@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
def test_grf_attention(device, dtype, backend, mode):
    torch.manual_seed(0)
    layer = GRFAttention(16, heads=2, max_length=3, mode=mode, backend=backend,
                         global_beta=0.1 if mode != 'sparse_softmax' else None)
    run(WithLoads(layer, 'grf'), grf_args, device, dtype)


class OneGraph(torch.nn.Module):
    # the layer on one graph without a batch vector (full-graph training), its plan built from
    # a Data on the layer's device (the plan's block layout must follow it there)
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, batch):
        g = make_batch()
        data = Data(num_nodes=g.num_nodes, **{k: g[k] for k in g.keys() if k.startswith('grf')})
        data = data.to(str(x.device))
        return self.layer(x, **self.layer.payload(data))


@pytest.mark.parametrize('device,dtype', CASES)
@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
def test_grf_attention_one_graph(device, dtype, backend):
    torch.manual_seed(0)
    run(OneGraph(GRFAttention(16, heads=2, max_length=3, backend=backend)), grf_args, device,
        dtype)


@pytest.mark.parametrize('device,dtype', CASES)
def test_grf_attention_heads_one_after_another(device, dtype, monkeypatch):
    # the path of one huge graph (no per-head index kept, scores computed again in the
    # backward): the heads run one after another inside one operator call, writing into rows
    # of the results
    from pyg_grf.nn.attention.grf import pairs
    monkeypatch.setattr(pairs, 'KERNEL_INDEX_BYTES', 0)
    monkeypatch.setattr(pairs, 'KEEP_SCORES_BYTES', 0)
    torch.manual_seed(0)
    layer = GRFAttention(16, heads=4, max_length=3, backend='pairs')
    with torch.no_grad():  # heads with coefficients of their own (they start equal)
        layer.f.uniform_(0.2, 1.0)
    run(OneGraph(layer), grf_args, device, dtype)


@pytest.mark.parametrize('device,dtype', CASES)
@pytest.mark.parametrize('mode', ['linear', 'softmax'])
def test_gkat_attention(device, dtype, mode):
    torch.manual_seed(0)
    run(WithLoads(GKATAttention(16, heads=2, mode=mode), 'rwgnk'), grf_args, device, dtype)


@pytest.mark.parametrize('device,dtype', CASES)
@pytest.mark.parametrize('feature_map', ['relu', 'favor+'])
def test_linear_attention(device, dtype, feature_map):
    torch.manual_seed(0)
    run(WithLoads(LinearAttention(16, heads=2, feature_map=feature_map), None), grf_args,
        device, dtype)


@pytest.mark.parametrize('device,dtype', CASES)
@pytest.mark.parametrize('layout', ['post_norm', 'pre_norm'])
def test_grf_gps_block(device, dtype, layout):
    from torch_geometric.nn import GINEConv
    torch.manual_seed(0)
    conv = GRFGPSConv(16, GINEConv(torch.nn.Linear(16, 16), edge_dim=16), heads=2,
                      attn_kwargs={'max_length': 3, 'global_beta': 0.1}, norm='layer_norm',
                      layout=layout).eval()  # eval: batch statistics would differ by dtype

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, batch):
            b = make_batch().to(str(x.device))
            return self.conv(x, b.edge_index, batch, **self.conv.payload(b),
                             edge_attr=b.edge_attr.to(x.dtype))
    run(Block(), grf_args, device, dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason='no CUDA device')
def test_a_loader_plan_moves_to_the_device_once_per_batch():
    # pyg_grf.loader.DataLoader builds the plan on the CPU (as its workers do); after
    # batch.to('cuda') the first read moves it, the layers then share the moved plan
    from pyg_grf.loader import DataLoader
    from pyg_grf.nn.attention.base import prepared_payload
    torch.manual_seed(0)
    layer = GRFAttention(16, heads=2, max_length=3)
    b = make_batch()
    data = [b.get_example(i) for i in range(b.num_graphs)]
    batch = next(iter(DataLoader(data, batch_size=len(data), model=layer)))
    ref = layer.double()(batch.x, batch.batch, **layer.payload(batch)).detach()
    assert prepared_payload(batch)['grf'].device.type == 'cpu'
    batch = batch.to('cuda')
    dev = copy.deepcopy(layer).cuda()
    payload = dev.payload(batch)
    assert payload['grf'].device.type == 'cuda'
    assert dev.payload(batch)['grf'] is payload['grf']  # moved once
    out = dev(batch.x, batch.batch, **payload)
    assert float((out.cpu() - ref).abs().max()) <= 1e-10 * float(ref.abs().max())

