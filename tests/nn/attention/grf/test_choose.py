r"""What ``backend='auto'`` picks (:mod:`pyg_grf.nn.attention.grf.choose`): a pure function of
the plan's sizes, from a cost model, with the memory budget checked before it picks; an explicit
backend that cannot fit is refused with the one that fits named."""

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import (
    GRFAttention,
)
from pyg_grf.nn.attention.grf import (
    BackendMemoryError,
    GRFPlan,
    PlanSizes,
    backend_costs,
    backend_memory,
    choose_backend,
    plan_sizes,
)
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import make_batch
from tests.utils import er_graph, grid_graph


def test_auto_cost_model_prefers_dense_blocks_for_small_dense_graphs_and_sparse_for_big():
    # small complete-ish graphs with long walks: the mask fills the blocks
    t = AddGraphRandomFeatures(num_walks=8, p_halt=0.2, max_length=4, seed=0)
    small = Batch.from_data_list([t(Data(edge_index=er_graph(20, 0.4, seed=s), num_nodes=20))
                                  for s in range(16)])
    costs = backend_costs(plan_sizes(GRFLoads.from_data(small), 'symmetric'), 'symmetric', 4,
                          16, 16)
    assert min(costs, key=costs.get) == 'dense'
    # one big grid: padded blocks would be N^2
    big = t(Data(edge_index=grid_graph(60, 60), num_nodes=3600))
    costs = backend_costs(plan_sizes(GRFLoads.from_data(big), 'symmetric'), 'symmetric', 4, 16,
                          16)
    assert min(costs, key=costs.get) != 'dense'


@pytest.mark.parametrize('nodes,pairs,terms', [(262144, 2728159, 45355600),
                                               (1048576, 10912632, 181528884)])
def test_auto_on_cuda_follows_the_h200_measurement(nodes, pairs, terms):
    # kNN graphs (k = 8) with the walks of bench/gpu_check.py, 4 heads x 16: on an H200 the plan
    # and one layer cost 38 / 127 ms with 'pairs' and 44 / 161 ms with 'sparse' (262k / 1M
    # nodes; experiments/results/gpu.md); on one CPU core the torch join alone costs seconds
    # (a sort over the T terms), and the compiled join makes 'pairs' the choice again
    # (bench_scale.md)
    sizes = PlanSizes(nodes, 13 * nodes, pairs, terms, nodes * nodes, nodes, 15, False)
    costs = {dev: backend_costs(sizes._replace(device_type=dev), 'symmetric', 4, 16, 16)
             for dev in ('cuda', 'cpu')}
    assert min(costs['cuda'], key=costs['cuda'].get) == 'pairs'
    assert 0.7 < costs['cuda']['pairs'] / costs['cuda']['sparse'] < 1.0  # measured 0.79-0.86
    assert min(costs['cpu'], key=costs['cpu'].get) == 'sparse'
    compiled = backend_costs(sizes._replace(compiled_join=True), 'symmetric', 4, 16, 16)
    assert min(compiled, key=compiled.get) == 'pairs'
    # peak memory on the H200: the 'pairs' plan 3.27 / 12.90 GiB, a 'sparse' layer 6.51 /
    # 25.84 GiB; the estimates must not fall below them
    gib = 2 ** 30
    measured = {'pairs': {262144: 3.27, 1048576: 12.90}, 'sparse': {262144: 6.51,
                                                                      1048576: 25.84}}
    for backend, peak in measured.items():
        need = backend_memory(sizes._replace(device_type='cuda'), backend, 'symmetric', 4, 16,
                              16)
        assert peak[nodes] <= need / gib < 1.3 * peak[nodes], (backend, need / gib)


def test_auto_is_a_pure_function_of_sizes(monkeypatch):
    # the same sizes give the same choice whatever ran before (fresh or used plan), and asking
    # runs no join
    from pyg_grf.features import blocks
    b = make_batch()
    loads = GRFLoads.from_data(b)
    sizes = plan_sizes(loads, 'symmetric')
    calls = []
    real = blocks.mask_statistics
    monkeypatch.setattr(blocks, 'mask_statistics', lambda *a, **k: calls.append(1) or real(*a, **k))
    first = [choose_backend(sizes, 'symmetric', 2, 4, 4) for _ in range(8)]
    assert len(set(first)) == 1 and not calls
    layer = GRFAttention(8, heads=2, max_length=3).double()
    plan = GRFPlan.build(b, [layer])
    for _ in range(3):
        layer(b.x, b.batch, grf=plan).sum().backward()
    again = GRFPlan.build(b, [layer])
    assert [p.backend for p in again.parts.values()] == [p.backend for p in plan.parts.values()]
    assert choose_backend(plan_sizes(loads, 'symmetric'), 'symmetric', 2, 4, 4) == first[0]


def test_auto_checks_memory_before_it_picks(monkeypatch):
    # a budget that only 'sparse' fits: auto takes it; none fits: a clear error before any
    # allocation of the mask
    b = make_batch()
    sizes = plan_sizes(GRFLoads.from_data(b), 'symmetric')
    from pyg_grf.nn.attention.grf import backend_memory
    need = {k: backend_memory(sizes, k, 'symmetric', 2, 4, 4) for k in ('sparse', 'pairs', 'dense')}
    cheapest = min(need, key=need.get)
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', str(need[cheapest] + 1))
    assert choose_backend(sizes, 'symmetric', 2, 4, 4) == cheapest
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', str(need[cheapest] - 1))
    with pytest.raises(BackendMemoryError, match=r"backend='auto'.* more than "
                                                 r"\$PYG_GRF_MEMORY_LIMIT"):
        choose_backend(sizes, 'symmetric', 2, 4, 4)
    with pytest.raises(BackendMemoryError):
        GRFAttention(8, heads=2, max_length=3)(b.x.float(), b.batch, grf=GRFLoads.from_data(b))


def test_auto_skips_the_join_for_hub_graphs():
    # a star: every walk passes the hub, the join is quadratic in its visits
    from pyg_grf.features.loads import GRFLoads as L
    n = 3000
    ei = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])
    ei = torch.cat([ei, ei.flip(0)], 1)
    d = AddGraphRandomFeatures(num_walks=8, p_halt=0.3, max_length=3, seed=0)(
        Data(edge_index=ei, num_nodes=n))
    sizes = plan_sizes(L.from_data(d), 'symmetric')
    costs = backend_costs(sizes, 'symmetric', 4, 16, 16)
    assert min(costs, key=costs.get) == 'sparse'  # the join alone costs more than sparse


def test_explicit_backend_refuses_what_cannot_fit(monkeypatch):
    # 'pairs' / 'dense' on a star would allocate GiBs: the estimate is checked first and the
    # error names the backend that fits
    from pyg_grf.nn.attention.grf import BackendMemoryError, backend_memory, plan_sizes
    N = 3000
    ei = torch.stack([torch.zeros(N - 1, dtype=torch.long), torch.arange(1, N)])
    star = Data(edge_index=torch.cat([ei, ei.flip(0)], 1), num_nodes=N)
    grf = GRFLoads.from_data(AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)(star))
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '100M')
    x = torch.randn(N, 8)
    for backend in ('dense', 'pairs'):
        need = backend_memory(plan_sizes(grf, 'symmetric'), backend, 'symmetric', 2, 4, 4)
        assert need > 100 * 2 ** 20
        with pytest.raises(BackendMemoryError, match=rf"backend='{backend}'.* more than "
                                                      rf"\$PYG_GRF_MEMORY_LIMIT .*Use "
                                                      rf"backend='sparse'"):
            GRFAttention(8, heads=2, max_length=2, backend=backend)(x, grf=grf)
    out = GRFAttention(8, heads=2, max_length=2, backend='sparse')(x, grf=grf)
    assert torch.isfinite(out).all()
