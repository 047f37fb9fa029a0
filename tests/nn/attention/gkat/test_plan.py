r"""RWGNKPlan (:mod:`pyg_grf.nn.attention.gkat.plan`): node ids are checked when the plan is
built, once per plan, and in every call for inference tensors."""
import pytest
import torch
from torch_geometric.data import Data

from pyg_grf import _validation
from pyg_grf.nn import GKATAttention
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.transforms import AddRWGNKFeatures


def _rwgnk_inputs(N=5):
    ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]])
    data = AddRWGNKFeatures(4, 0.8, 1.0, 3, seed=0)(Data(edge_index=ei, num_nodes=N))
    return torch.randn(N, 8), data.rwgnk_index, data.rwgnk_value


@pytest.mark.parametrize('mode', ['linear', 'softmax'])
@pytest.mark.parametrize('bad', [-1, 5])
def test_rwgnk_index_out_of_range_is_refused(mode, bad):
    x, index, value = _rwgnk_inputs()
    index = index.clone()
    index[1, 0] = bad  # used to abort the process ('softmax') or wrap to node 4
    layer = GKATAttention(8, heads=2, mode=mode)
    # a plan built from the tensors alone takes its node count from them: the id 5 then shows
    # as a plan of 6 nodes for 5 rows
    with pytest.raises(ValueError, match=rf"'rwgnk_index' must hold node ids in \[0, 5\).*refers "
                                         rf"to node {bad}|the RWGNK plan covers 6 nodes but "
                                         rf"'x' has 5 rows"):
        layer(x, rwgnk=RWGNKPlan.from_tensors(index, value))


def test_index_range_checked_once_per_plan(monkeypatch):
    # The range check (a reduction + host read) runs when a plan is built, not in every layer.
    calls = []
    orig = _validation.torch_aminmax
    monkeypatch.setattr(_validation, 'torch_aminmax', lambda t: calls.append(1) or orig(t))
    # With one plan built for the layers that share it (as GraphTransformer and .payload()
    # do), the index is checked when the plan is built; the layers read the plan and check
    # nothing more.
    x, index, value = _rwgnk_inputs()
    layers = [GKATAttention(8, heads=2, mode=m) for m in ('linear', 'softmax', 'softmax')]
    rwgnk = RWGNKPlan.from_tensors(index, value, layers=layers)
    built = len(calls)
    assert built >= 1
    for _ in range(2):
        for layer in layers:
            layer(x, rwgnk=rwgnk)
    assert len(calls) == built  # the layers read the plan
    RWGNKPlan.from_tensors(index, value, layers=layers)  # a new plan: checked again
    assert len(calls) == 2 * built


def test_inference_tensors_are_checked_every_time():
    # Lightning's test loop builds its batches under torch.inference_mode: plans of inference
    # tensors work and check their index like any other.
    x, index, value = _rwgnk_inputs()
    layer = GKATAttention(8, heads=2, mode='softmax')
    expected = layer(x, rwgnk=RWGNKPlan.from_tensors(index, value))
    with torch.inference_mode():
        x_i, index_i, value_i = x.clone(), index.clone(), value.clone()
        assert index_i.is_inference()
        for _ in range(2):
            out = layer(x_i, rwgnk=RWGNKPlan.from_tensors(index_i, value_i))
            assert torch.allclose(out, expected)
        index_i[1, 0] = -1
        with pytest.raises(ValueError, match=r"'rwgnk_index' must hold node ids in \[0, 5\)"):
            layer(x_i, rwgnk=RWGNKPlan.from_tensors(index_i, value_i))
