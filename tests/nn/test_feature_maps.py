import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.nn.feature_maps import FAVORPlus, feature_map_resolver
from pyg_grf.transforms import AddGraphRandomFeatures


@pytest.mark.parametrize('shape', [(0, 4), (0, 2, 4)])
@pytest.mark.parametrize('with_batch', [False, True])
def test_favor_plus_keys_of_an_empty_batch_give_empty_features(shape, with_batch):
    fmap = FAVORPlus(4, num_features=6)
    x = torch.randn(*shape, requires_grad=True)
    batch = torch.zeros(0, dtype=torch.long) if with_batch else None
    keys = fmap(x, is_query=False, batch=batch)
    assert keys.shape == (*shape[:-1], 6)
    assert fmap(x, is_query=True).shape == (*shape[:-1], 6)
    keys.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize('feature_map', ['favor+', 'performer', 'relu', 'elu'])
def test_grf_attention_on_an_empty_graph_for_every_feature_map(feature_map):
    # docs/reliability.md: empty batches give empty outputs (and gradients) for every attention
    d = Data(x=torch.zeros(0, 4), edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=0)
    b = Batch.from_data_list([AddGraphRandomFeatures(num_walks=2, max_length=2, seed=0)(d)])
    layer = GRFAttention(4, heads=2, max_length=2, feature_map=feature_map)
    x = b.x.requires_grad_()
    out = layer(x, grf=GRFLoads.from_data(b), batch=b.batch)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert x.grad.shape == (0, 4)


def test_favor_plus_of_a_nonempty_batch_is_unchanged_by_the_empty_case():
    # the per-graph key shift still applies: one graph's features do not depend on another's
    torch.manual_seed(0)
    fmap = feature_map_resolver('favor+', 4, num_features=8)
    x = torch.randn(5, 4)
    batch = torch.tensor([0, 0, 0, 1, 1])
    both = fmap(x, batch=batch)
    alone = fmap(x[:3])
    assert torch.allclose(both[:3], alone, atol=1e-6)
