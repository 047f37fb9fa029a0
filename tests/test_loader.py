"""pyg_grf.loader: the attention plans built ahead of the step (in the collate function, also
in DataLoader workers) give the layers exactly what they compute themselves, leave nothing to
build in the step, and are kept per graph for full-graph training."""
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader as PyGDataLoader

from pyg_grf.loader import DataLoader, PayloadCollater, attention_layers, prepare_payload
from pyg_grf.nn import GraphTransformer, GRFAttention
from pyg_grf.nn.attention.base import PAYLOAD_ATTR, prepared_payload
from pyg_grf.nn.attention.grf import GRFPlan
from pyg_grf.nn.attention.grf import plan as plan_module
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import dense_reference, make_layer
from tests.utils import er_graph, grid_graph, path_graph

D = torch.float64


def graphs(num_draws=1, key=False, channels=8):
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=0,
                               num_draws=num_draws)
    tk = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=100,
                                attr_prefix='grf_key', num_draws=num_draws)
    gen = torch.Generator().manual_seed(0)
    out = []
    for n, ei in [(9, grid_graph(3, 3)), (5, path_graph(5)), (11, er_graph(11, 0.3, seed=2)),
                  (7, er_graph(7, 0.5, seed=3))]:
        g = t(Data(x=torch.randn(n, channels, generator=gen, dtype=D), edge_index=ei,
                   y=torch.tensor([n % 2])))
        out.append(tk(g) if key else g)
    return out


def count_builds(monkeypatch):
    calls = []
    real = plan_module._build_part
    monkeypatch.setattr(plan_module, '_build_part',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense', 'auto'])
def test_prepared_plan_equals_dense_reference_and_builds_nothing_in_the_step(
        mode, backend, monkeypatch):
    b = Batch.from_data_list(graphs())
    layers = [make_layer(mode, backend), make_layer(mode, backend, seed=1)]
    prepare_payload(layers, b)
    calls = count_builds(monkeypatch)
    for layer in layers:
        payload = layer.payload(b)
        assert payload['grf'] is b.__dict__[PAYLOAD_ATTR]['grf']
        out = layer(b.x, b.batch, **payload)
        out.sum().backward()
        assert torch.allclose(out, dense_reference(layer, b), atol=1e-9, rtol=0)
    assert calls == []


def test_prepared_plan_with_draws_key_loads_and_global_term(monkeypatch):
    b = Batch.from_data_list(graphs(num_draws=4, key=True))
    layers = [GRFAttention(8, heads=2, max_length=3, layer_index=i, global_beta=0.2).double()
              for i in range(2)]
    want = [layer(b.x, b.batch, grf=GRFPlan.build(b, [layer])) for layer in layers]
    prepare_payload(layers, b)
    calls = count_builds(monkeypatch)
    for layer, w in zip(layers, want):
        assert torch.allclose(layer(b.x, b.batch, **layer.payload(b)), w, atol=1e-12)
    assert calls == []


# the way workers start: Linux's default, macOS' and Windows' default, and Python 3.14's on Linux
# (the collate function and its plans must pickle for the last two)
@pytest.mark.parametrize('context', [
    'fork', pytest.param('spawn', marks=pytest.mark.slow),
    pytest.param('forkserver', marks=pytest.mark.slow)])
def test_data_loader_workers_prepare_the_plan_for_a_graph_transformer(monkeypatch, context):
    import multiprocessing
    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no '{context}' start method on this platform")
    data = graphs(channels=8)
    model = GraphTransformer(8, 16, 2, num_layers=2, heads=2,
                             attn_kwargs={'max_length': 3, 'global_beta': 0.1}).double()
    model.eval()
    plain = [model(batch) for batch in PyGDataLoader(data, batch_size=2)]
    loader = DataLoader(data, batch_size=2, num_workers=1, model=model,
                        multiprocessing_context=context)
    assert isinstance(loader.collate_fn, PayloadCollater)
    calls = count_builds(monkeypatch)  # patched here, in the main process only
    outs = []
    for batch in loader:
        assert isinstance(batch.__dict__[PAYLOAD_ATTR]['grf'], GRFPlan)
        outs.append(model(batch))
    assert calls == []  # the worker built everything
    for a, b in zip(outs, plain):
        assert torch.allclose(a, b, atol=1e-12)


def test_a_prepared_payload_follows_its_batch_to_another_device_once():
    # a worker's plan is built on the CPU and Batch.to() leaves it there: the first read after
    # the batch moved moves it and keeps it on the batch, so that the layers of a step do not
    # copy it each (a device stand-in: 'meta' for the plan, the batch's tensors on the CPU)
    class Plan:
        moves = 0

        def __init__(self, device):
            self.device = torch.device(device)

        def to(self, device):
            Plan.moves += 1
            return Plan(device)
    b = Batch.from_data_list(graphs())
    plan = Plan('meta')
    b.__dict__[PAYLOAD_ATTR] = {'grf': plan, 'other': 3}
    first = prepared_payload(b)
    assert first['grf'].device == torch.device('cpu') and first['other'] == 3
    assert prepared_payload(b)['grf'] is first['grf'] and Plan.moves == 1
    b.__dict__[PAYLOAD_ATTR] = {'grf': Plan('cpu')}  # already there: nothing moves
    assert prepared_payload(b)['grf'].device == torch.device('cpu') and Plan.moves == 1
    # and a real plan on its batch's device stays the same object
    del b.__dict__[PAYLOAD_ATTR]
    prepare_payload(make_layer('symmetric', 'auto'), b)
    built = b.__dict__[PAYLOAD_ATTR]['grf']
    assert isinstance(built, GRFPlan) and prepared_payload(b)['grf'] is built


def test_data_loader_without_model_is_pygs_loader():
    data = graphs()
    a = next(iter(DataLoader(data, batch_size=4)))
    assert PAYLOAD_ATTR not in a.__dict__
    assert torch.equal(a.x, next(iter(PyGDataLoader(data, batch_size=4))).x)
    # a model without attention layers: nothing prepared, nothing fails
    b = next(iter(DataLoader(data, batch_size=4, model=torch.nn.Linear(2, 2))))
    assert PAYLOAD_ATTR not in b.__dict__


def test_bad_input():
    b = Batch.from_data_list(graphs())
    with pytest.raises(TypeError, match="sequence of attention layers, got a sequence "
                                        "holding \\['Linear'\\]"):
        prepare_payload([torch.nn.Linear(2, 2)], b)
    with pytest.raises(ValueError, match="hop counts up to 3 but GRFAttention\\(max_length=2\\)"):
        GRFAttention(8, max_length=2).double()(b.x, b.batch, **GRFAttention(8).payload(b))
    with pytest.raises(ValueError, match="no GRF loads"):
        prepare_payload([GRFAttention(8, max_length=3)], Data(x=torch.randn(3, 8)))
    assert attention_layers(torch.nn.Sequential(GRFAttention(8), torch.nn.Linear(8, 8)))[0] \
        .channels == 8


@pytest.mark.parametrize('fresh_walks', [False, True])
def test_one_graph_loader_plans_each_graph_once(fresh_walks, monkeypatch):
    # full-graph training through a loader (PlanetoidDataModule): every epoch collates a new
    # Batch of the one graph; the loader keeps the plans of the graphs it has seen (keyed by
    # their walk entries), so a graph is planned once, and fresh walks get a fresh plan
    from torch_geometric.data import InMemoryDataset

    class OneGraph(InMemoryDataset):
        def __init__(self, data, transform=None):
            super().__init__(None, transform)
            self.data, self.slices = self.collate([data])

    torch.manual_seed(0)
    g = Data(x=torch.randn(30, 8, dtype=torch.float64), edge_index=er_graph(30, 0.2, seed=1))
    walks = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=None if fresh_walks else 0)
    dataset = (OneGraph(g, transform=walks) if fresh_walks else OneGraph(walks(g)))
    layer = make_layer('symmetric', 'pairs')
    loader = DataLoader(dataset, batch_size=1, model=[layer])
    calls = count_builds(monkeypatch)
    for _ in range(3):
        (batch,) = list(loader)
        out = layer(batch.x, batch.batch, **layer.payload(batch))
        torch.testing.assert_close(out, dense_reference(layer, batch), atol=1e-10, rtol=0)
    assert len(calls) == (3 if fresh_walks else 1)
    # no room in the cache: planned every epoch
    calls.clear()
    loader = DataLoader(dataset, batch_size=1, model=[layer], plan_cache_bytes=0)
    for _ in range(2):
        (batch,) = list(loader)
    assert len(calls) == 2


def _entries(index, hop, load, ids=None):
    ids = torch.arange(int(index.max()) + 1) if ids is None else ids
    return sorted((int(ids[a]), int(ids[b]), int(h), round(float(w), 12))
                  for (a, b), h, w in zip(index.t().tolist(), hop, load))


def test_node_part_loader_restrict_against_filtering_the_full_entries():
    from pyg_grf.loader import NodePartLoader
    torch.manual_seed(0)
    g = Data(x=torch.randn(40, 3), edge_index=er_graph(40, 0.15, seed=4),
             y=torch.arange(40) % 3)
    full = AddGraphRandomFeatures(num_walks=6, max_length=3, seed=0)(g)
    parts = list(NodePartLoader(full, num_parts=3))
    ids = torch.cat([p.n_id for p in parts])
    assert sorted(ids.tolist()) == list(range(40))  # the parts partition the nodes
    for p in parts:
        inside = torch.zeros(40, dtype=torch.bool)
        inside[p.n_id] = True
        keep = inside[full.grf_index[0]] & inside[full.grf_index[1]]
        expected = _entries(full.grf_index[:, keep], full.grf_length[keep], full.grf_load[keep],
                            torch.arange(40))
        assert _entries(p.grf_index, p.grf_length, p.grf_load, p.n_id) == expected
        assert torch.equal(p.y, full.y[p.n_id]) and torch.equal(p.x, full.x[p.n_id])


def test_node_part_loader_recompute_draws_walks_on_each_part():
    from pyg_grf.loader import NodePartLoader
    calls = []
    walks = AddGraphRandomFeatures(num_walks=6, max_length=3, seed=0)
    g = Data(x=torch.randn(40, 3), edge_index=er_graph(40, 0.15, seed=4))
    loader = NodePartLoader(lambda: g, num_parts=4, walks='recompute',
                            transform=lambda d: calls.append(d.num_nodes) or walks(d))
    assert len(loader) == 4
    parts = list(loader)
    assert calls == [p.num_nodes for p in parts] and sum(calls) == 40
    for p in parts:  # walks drawn on the part: one hop is one of the part's own edges
        assert int(p.grf_index.max()) < p.num_nodes
        one = p.grf_index[:, p.grf_length == 1]
        edges = set(map(tuple, p.edge_index.t().tolist()))
        assert one.size(1) > 0 and set(map(tuple, one.t().tolist())) <= edges


def test_node_part_loader_bad_input():
    from pyg_grf.loader import NodePartLoader
    g = Data(x=torch.randn(5, 2), edge_index=path_graph(5))
    with pytest.raises(ValueError, match="'num_parts' must be an integer >= 1, got 0"):
        NodePartLoader(g, 0)
    with pytest.raises(ValueError, match="'walks' must be one of .*got 'fresh'"):
        NodePartLoader(g, 2, walks='fresh')
    with pytest.raises(ValueError, match="walks='recompute' draws the walks of every part"):
        NodePartLoader(g, 2, walks='recompute')
    with pytest.raises(ValueError, match='the data holds no GRF loads'):
        list(NodePartLoader(g, 2))
    with pytest.raises(TypeError, match='expects a torch_geometric.data.Data, got list'):
        list(NodePartLoader(lambda: [g], 2))
