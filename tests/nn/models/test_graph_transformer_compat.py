r"""The GraphTransformer made of GRFGPSConv blocks computes the same function as the one before
(separate pre-norm blocks and attention adapters): float64 outputs on saved weights, for every
attention type and both layouts (fixtures/graph_transformer_v1.pt, written by
fixtures/make_graph_transformer_v1.py on the old code)."""
import os
import warnings

import pytest
import torch
from torch_geometric.data import Batch

from pyg_grf.nn import GraphTransformer
from pyg_grf.nn.models.options import RENAMED_ARGS

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'graph_transformer_v1.pt')
SAVED = torch.load(FIXTURE, weights_only=True)


def _batch() -> Batch:
    fields = dict(SAVED['batch'])
    data = Batch(**fields)
    data._num_graphs = fields['ptr'].numel() - 1
    for key in ('x', 'edge_attr', 'random_walk_pe'):
        data[key] = data[key].double()
    return data


@pytest.mark.parametrize('name', sorted(SAVED['cases']))
@pytest.mark.parametrize('names', ['old', 'new'])
def test_same_outputs_on_saved_weights(name, names):
    # The fixture's arguments use the old names (attention, attention_kwargs, local_mp); under
    # PyG's names (attn_type, attn_kwargs, conv) they build the same model.
    case = SAVED['cases'][name]
    kwargs = dict(case['kwargs'])
    if names == 'new':
        kwargs = {RENAMED_ARGS.get(key, key): value for key, value in kwargs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)  # old argument and attention names
        model = GraphTransformer(**kwargs).double()
    model.load_state_dict(case['state_dict'], strict=True)
    model.eval()
    with torch.no_grad():
        out = model(_batch())
    assert out.shape == case['out'].shape
    torch.testing.assert_close(out, case['out'], rtol=1e-10, atol=1e-12)


def test_fixture_covers_every_attention_and_layout():
    # every attention of the old registry, both layouts, and an attention-free model
    kinds = {(c['kwargs'].get('attention'), c['kwargs'].get('block', 'pre_norm'))
             for c in SAVED['cases'].values()}
    for attention in ('grf', 'linear', 'performer', 'softmax', 'power_series', 'gkat',
                      'samsa', None):
        assert any(a == attention for a, _ in kinds), attention
    for attention in ('grf', 'linear', 'performer', 'softmax', 'gkat'):
        assert (attention, 'gps') in kinds, attention
