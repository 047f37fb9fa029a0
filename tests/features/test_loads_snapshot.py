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


@pytest.mark.parametrize('backend', ['sparse', 'pairs', 'dense'])
def test_inplace_edit_of_the_payload_drops_its_caches(backend):
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, backend=backend).to(D)
    x = torch.randn(b.num_nodes, 8, dtype=D)
    grf = GRFLoads.from_data(b)
    layer(x, grf=grf)  # builds and caches the structures
    grf.load.mul_(torch.linspace(0.2, 3.0, grf.nnz))  # an in-place edit after first use
    edited = b.clone()
    edited.grf_load = grf.load.clone()
    ref = GRFLoads.from_data(edited)
    assert torch.allclose(layer(x, grf=grf), layer(x, grf=ref), atol=1e-12)
    # an edit of the index too (a permutation of the nodes inside graph 0)
    grf.index[grf.index == 0] = -7
    grf.index[grf.index == 1] = 0
    grf.index[grf.index == -7] = 1
    edited.grf_index = grf.index.clone()
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


def test_payload_first_used_under_inference_mode_still_trains():
    b = make_batch()
    torch.manual_seed(0)
    layer = GRFAttention(8, heads=2, max_length=3, backend='pairs')
    x = torch.randn(b.num_nodes, 8)
    with torch.inference_mode():
        grf = GRFLoads.from_data(b)  # built and first used under inference mode
        layer(x, grf=grf)
    out = layer(x, grf=grf)
    out.square().sum().backward()  # used to fail: inference tensors saved for backward
    assert layer.f.grad is not None and torch.isfinite(layer.f.grad).all()
