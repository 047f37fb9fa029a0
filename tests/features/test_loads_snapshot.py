r"""GRFLoads snapshot semantics (issue #15 items 3, 6): in-place edits never serve stale
structures, and a payload first used under inference mode still trains."""
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import erdos_renyi_graph, to_undirected

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.transforms import AddGraphRandomFeatures

D = torch.float64


def make_batch():
    t = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=0)
    graphs = []
    for i, n in enumerate((9, 14, 6)):
        torch.manual_seed(i)
        graphs.append(t(Data(edge_index=to_undirected(erdos_renyi_graph(n, 0.4)), num_nodes=n)))
    return Batch.from_data_list(graphs)


@pytest.mark.parametrize('via_data', [False, True])
@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_inplace_edit_of_the_payload_drops_its_caches(backend, via_data):
    # via_data: writes through .data, which do not bump the version counters (the adversarial
    # review of issue #15 item 3 found them stale on every backend); refresh() compares exactly
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, backend=backend, global_beta=0.2).to(D)
    x = torch.randn(b.num_nodes, 8, dtype=D)
    grf = GRFLoads.from_data(b)

    def raw(t):
        return t.data if via_data else t
    layer(x, grf=grf)  # builds and caches the structures
    raw(grf.load).mul_(torch.linspace(0.2, 3.0, grf.nnz))  # an in-place edit after first use
    edited = b.clone()
    edited.__dict__.pop('_grf_kept', None)
    edited.grf_load = grf.load.clone()
    ref = GRFLoads.from_data(edited)
    assert torch.allclose(layer(x, grf=grf), layer(x, grf=ref), atol=1e-12)
    # an edit of the index too (a permutation of the nodes inside graph 0)
    index = raw(grf.index)
    index[index == 0] = -7
    index[index == 1] = 0
    index[index == -7] = 1
    edited.grf_index = grf.index.clone()
    assert torch.allclose(layer(x, grf=grf), layer(x, grf=GRFLoads.from_data(edited)),
                          atol=1e-12)
    # and of the batch vector (graphs 0 and 1 merged: the global term spans both)
    raw(grf.batch)[grf.batch == 1] = 0
    raw(grf.batch)[grf.batch == 2] = 1
    edited.batch = grf.batch.clone()
    assert torch.allclose(layer(x, grf=grf), layer(x, grf=GRFLoads.from_data(edited)),
                          atol=1e-12)


def test_edits_of_the_data_never_reach_a_built_payload():
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3).to(D)
    x = torch.randn(b.num_nodes, 8, dtype=D)
    grf = GRFLoads.from_data(b)
    before = layer(x, grf=grf)
    b.grf_load.data.mul_(5.0)  # through .data: no version bump on the data's tensor
    b.batch.data.zero_()
    assert torch.equal(layer(x, grf=grf), before)  # the payload is a snapshot


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
@pytest.mark.parametrize('built_inside', [True, False])
def test_payload_first_used_under_inference_mode_still_trains(mode, backend, built_inside):
    # every structure cached on first use (on the loads and on their sparse patterns: per-head
    # repeats, transposes, CSR indices) is built outside inference mode
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, backend=backend,
                         global_beta=0.1 if mode != 'sparse_softmax' else None)
    x = torch.randn(b.num_nodes, 8)
    grf = None if built_inside else GRFLoads.from_data(b)
    with torch.inference_mode():
        if built_inside:
            grf = GRFLoads.from_data(b)  # built and first used under inference mode
        layer(x, grf=grf)
    out = layer(x, grf=grf)
    out.square().sum().backward()  # used to fail: inference tensors saved for backward
    assert layer.f.grad is not None and torch.isfinite(layer.f.grad).all()


def test_full_graph_reuse_for_a_plain_data(monkeypatch):
    # issue 21 item 2: one full graph seen at every step, through a loop of one's own calling
    # conv.payload(data): the loads (and the pair join) are built once; an edited graph, in
    # place or through .data, gets fresh loads; copies and pickles of the data carry nothing
    import copy
    import pickle
    from torch_geometric.nn import GINConv
    from pyg_grf.features.blocks import BlockStructures
    from pyg_grf.nn import GRFGPSConv
    torch.manual_seed(0)
    data = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=0)(
        Data(x=torch.randn(40, 8, dtype=D),
             edge_index=to_undirected(erdos_renyi_graph(40, 0.15)), num_nodes=40))
    joins = []
    real = BlockStructures._build_terms
    monkeypatch.setattr(BlockStructures, '_build_terms',
                        lambda self, *a: joins.append(1) or real(self, *a))
    conv = GRFGPSConv(8, GINConv(torch.nn.Linear(8, 8)), heads=2, attn_type='grf',
                      attn_kwargs={'max_length': 3, 'backend': 'pairs'}).to(D)
    outs = [conv(data.x, data.edge_index, **conv.payload(data)) for _ in range(3)]
    assert len(joins) == 1 and GRFLoads.from_data(data) is conv.payload(data)['grf']
    assert torch.equal(outs[0], outs[2])

    def fresh(d):
        clean = Data(x=d.x, edge_index=d.edge_index, num_nodes=d.num_nodes,
                     grf_index=d.grf_index.clone(), grf_length=d.grf_length.clone(),
                     grf_load=d.grf_load.clone())
        return conv(clean.x, clean.edge_index, grf=GRFLoads(
            clean.grf_index, clean.grf_length, clean.grf_load, clean.num_nodes))
    for edit in (lambda t: t.mul_(torch.linspace(0.2, 3.0, t.numel())),
                 lambda t: t.data.mul_(torch.linspace(3.0, 0.5, t.numel()))):
        edit(data.grf_load)
        out = conv(data.x, data.edge_index, **conv.payload(data))
        assert torch.allclose(out, fresh(data), atol=1e-12)
    assert not torch.allclose(out, outs[0])
    # the kept loads never travel with a deep copy or a pickle of the data (a shallow copy or
    # data.clone() may reuse them: only while its tensors hold exactly the same entries)
    for other in (copy.deepcopy(data), pickle.loads(pickle.dumps(data))):
        assert not other.__dict__.get('_grf_kept')
    other = data.clone()
    other.grf_load[:5] = 0.5
    assert GRFLoads.from_data(other) is not GRFLoads.from_data(data)


def test_a_batch_vector_beside_the_payload_must_match_it():
    # the adversarial review of issue #15 item 2: an explicit batch that disagreed with the
    # payload's was silently ignored
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, global_beta=0.1).to(D)
    x = torch.randn(b.num_nodes, 8, dtype=D)
    grf = GRFLoads.from_data(b)
    same = layer(x, b.batch.clone(), grf=grf)  # equal values, another tensor: fine
    assert torch.equal(same, layer(x, grf=grf))
    merged = b.batch.clone()
    merged[merged == 1] = 0
    with pytest.raises(ValueError, match="'batch' differs from the batch vector the GRF loads "
                                         "were built with"):
        layer(x, merged, grf=grf)


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric', 'sparse_softmax'])
def test_entries_edited_out_of_range_after_use_are_refused(mode, backend):
    # the adversarial re-check: an out-of-range id written into a used payload (through .data:
    # no version bump) reached the unchecked sparse kernels, silently or worse
    b = make_batch()
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, backend=backend)
    x = torch.randn(b.num_nodes, 8)
    grf = GRFLoads.from_data(b)
    layer(x, grf=grf)
    grf.index.data[1, 0] = b.num_nodes + 3
    with pytest.raises(ValueError, match=r"edited in place after they were built and are no "
                                         r"longer valid: 'grf_index' must hold node ids"):
        layer(x, grf=grf)
    grf.index.data[1, 0] = 0  # valid again: runs
    assert torch.isfinite(layer(x, grf=grf)).all()
    grf.load.data[0] = float('nan')
    with pytest.raises(ValueError, match="no longer valid: 'grf_load' holds non-finite"):
        layer(x, grf=grf)


def test_kept_loads_still_check_max_length():
    b = make_batch()
    GRFLoads.from_data(b)  # kept on b
    with pytest.raises(ValueError, match="hop counts up to 3 but 'max_length' is 1"):
        GRFLoads.from_data(b, max_length=1)
