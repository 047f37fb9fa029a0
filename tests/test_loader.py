"""pyg_grf.loader: the attention plans built ahead of the step (in the collate function, also
in DataLoader workers) give the layers exactly what they compute themselves, leave nothing to
build in the step, and are kept per graph for full-graph training."""
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader as PyGDataLoader

from pyg_grf.loader import DataLoader, PayloadCollater, attention_layers, prepare_payload
from pyg_grf.nn import GraphTransformer, GRFAttention
from pyg_grf.nn.attention.base import prepared_payload
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
    real = plan_module.build_part
    monkeypatch.setattr(plan_module, 'build_part',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'auto'])
def test_prepared_plan_equals_dense_reference_and_builds_nothing_in_the_step(
        mode, backend, monkeypatch):
    b = Batch.from_data_list(graphs())
    layers = [make_layer(mode, backend), make_layer(mode, backend, seed=1)]
    prepare_payload(layers, b)
    calls = count_builds(monkeypatch)
    for layer in layers:
        payload = layer.payload(b)
        assert payload['grf'] is b.grf_plan
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
        assert isinstance(batch.grf_plan, GRFPlan)
        outs.append(model(batch))
    assert calls == []  # the worker built everything
    for a, b in zip(outs, plain):
        assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize('num_workers', [0, 1])
def test_a_loader_with_workers_loads_the_compiled_join_before_forking(monkeypatch, num_workers):
    # workers are forked every epoch: the loader loads the join's kernels into the training
    # process first (once), so that no worker loads them again; without workers it does not
    from pyg_grf.features import join
    if not join.compiled_join_available():
        pytest.skip('no compiled join here (numba missing or PYG_GRF_NUMBA=0)')
    calls = []
    monkeypatch.setattr(join, '_state', dict(join._state, ran=False))
    monkeypatch.setattr(join, 'compiled_join', lambda *a, **k: calls.append(a))
    model = GraphTransformer(8, 16, 2, num_layers=1, heads=2, attn_kwargs={'max_length': 3})
    DataLoader(graphs(channels=8), batch_size=2, num_workers=num_workers, model=model)
    assert len(calls) == num_workers
    DataLoader(graphs(channels=8), batch_size=2, num_workers=1)  # no model: nothing to plan
    assert len(calls) == num_workers


def test_a_prepared_plan_is_a_field_that_moves_with_its_batch(monkeypatch):
    # the plan is an ordinary field: Batch.to() hands it to GRFPlan.to (a device move of the
    # batch moves its plan once, not once per layer), copies and collation keep it a field
    b = Batch.from_data_list(graphs())
    layer = make_layer('symmetric', 'auto')
    prepare_payload(layer, b)
    plan = b.grf_plan
    assert isinstance(plan, GRFPlan) and 'grf_plan' in b.keys()
    moves = []
    real = GRFPlan.to
    monkeypatch.setattr(GRFPlan, 'to', lambda self, *a, **k: moves.append(a) or real(self, *a,
                                                                                       **k))
    moved = b.to('cpu')
    assert len(moves) == 1 and moved.grf_plan is plan  # already there: the same plan
    assert prepared_payload(moved)['grf'] is plan and layer.payload(moved)['grf'] is plan


def test_a_copy_with_redrawn_walks_never_reads_the_old_plan():
    # issue 39: prepare_payload, then a transform that redraws the walks on a copy: PyG's copy
    # carries the plan field along, but the plan matches only the walks it was built from
    data = graphs()[2]
    layer = make_layer('symmetric', 'pairs')
    prepare_payload(layer, data)
    old = data.grf_plan
    new = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=2)(data.clone())
    assert new.grf_plan is old  # carried by the copy ...
    assert not torch.equal(new.grf_load, data.grf_load)
    plan = layer.payload(new)['grf']
    assert plan is not old  # ... and not used
    torch.testing.assert_close(layer(new.x, grf=plan), dense_reference(layer, new), atol=1e-10,
                               rtol=0)
    assert layer.payload(data)['grf'] is old  # the original still reads its own


@pytest.mark.parametrize('edit', ['in_place', 'subgraph', 'num_nodes'])
def test_an_edited_graph_never_reads_its_old_plan(edit):
    data = graphs()[2]
    layer = make_layer('symmetric', 'pairs')
    prepare_payload(layer, data)
    old = data.grf_plan
    if edit == 'in_place':  # same tensor object, new values: its version counter moved
        data.grf_load.mul_(2.0)
    elif edit == 'subgraph':  # PyG keeps the (non node-level) walk tensors and the plan
        data = data.subgraph(torch.arange(8))
        assert data.grf_plan is old
    else:
        data.num_nodes = data.num_nodes + 1
    if edit == 'subgraph':  # walks to nodes outside the subgraph: refused, not misread
        with pytest.raises(ValueError, match='grf_index'):
            layer.payload(data)
        return
    if edit == 'num_nodes':  # a node without walks: a new plan of one more node
        plan = layer.payload(data)['grf']
        assert plan is not old and plan.num_nodes == old.num_nodes + 1
        return
    plan = layer.payload(data)['grf']
    assert plan is not old
    torch.testing.assert_close(layer(data.x, grf=plan), dense_reference(layer, data),
                               atol=1e-10, rtol=0)


def test_a_batch_of_prepared_graphs_gets_its_own_plan():
    # graphs that carry their own plans collate into a batch whose plan field is a list of
    # them: the batch's layers build the batch's plan
    data = graphs()
    layer = make_layer('symmetric', 'pairs')
    for d in data:
        prepare_payload(layer, d)
    b = Batch.from_data_list(data)
    plan = layer.payload(b)['grf']
    assert isinstance(plan, GRFPlan) and plan.num_nodes == b.num_nodes
    torch.testing.assert_close(layer(b.x, b.batch, grf=plan), dense_reference(layer, b),
                               atol=1e-10, rtol=0)


def test_the_plan_cache_key_covers_any_attr_prefix(monkeypatch):
    # issue 39: with attr_prefix='walks' two different graphs of the same size shared one plan
    t = AddGraphRandomFeatures(num_walks=5, max_length=3, seed=0, attr_prefix='walks')
    gen = torch.Generator().manual_seed(0)
    a = t(Data(x=torch.randn(9, 8, generator=gen, dtype=D), edge_index=grid_graph(3, 3)))
    b = t(Data(x=a.x.clone(), edge_index=path_graph(9)))
    layer = GRFAttention(8, heads=2, max_length=3, attr_prefix='walks').double()
    loader = DataLoader([a, b], batch_size=1, model=[layer])
    plans = [batch.grf_plan for batch in loader]
    assert plans[0] is not plans[1]
    for batch, plan in zip(DataLoader([a, b], batch_size=1), plans):
        want = layer(batch.x, grf=GRFPlan.build(batch, [layer]))
        torch.testing.assert_close(layer(batch.x, grf=plan), want, atol=1e-12, rtol=0)


def test_a_plan_built_in_a_loop_over_one_graph_is_built_once(monkeypatch):
    # the README's loop: attn(x, None, **attn.payload(data)) every epoch on one fixed graph
    data = graphs()[2]
    layer = make_layer('symmetric', 'pairs')
    calls = count_builds(monkeypatch)
    outs = [layer(data.x, None, **layer.payload(data)) for _ in range(3)]
    assert len(calls) == 1 and all(torch.equal(o, outs[0]) for o in outs)
    import copy
    assert '_plan_cache' not in copy.deepcopy(layer).__dict__  # a copy leaves it behind


def test_data_loader_without_model_is_pygs_loader():
    data = graphs()
    a = next(iter(DataLoader(data, batch_size=4)))
    assert 'grf_plan' not in a.keys()
    assert torch.equal(a.x, next(iter(PyGDataLoader(data, batch_size=4))).x)
    # a model without attention layers: nothing prepared, nothing fails
    b = next(iter(DataLoader(data, batch_size=4, model=torch.nn.Linear(2, 2))))
    assert 'grf_plan' not in b.keys()


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
    # no room in the loader's cache: the collater's layers keep the one plan they built last
    # while it matches (the same graph every epoch)
    calls.clear()
    loader = DataLoader(dataset, batch_size=1, model=[layer], plan_cache_bytes=0)
    for _ in range(2):
        (batch,) = list(loader)
    assert len(calls) == (2 if fresh_walks else 1)


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
