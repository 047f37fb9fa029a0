import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.nn.attention.gkat import RWGNKPlan
from pyg_grf.nn.feature_maps import ELUFeatureMap, FAVORPlus, feature_map_resolver
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


def _two_graph_batch():
    from pyg_grf.transforms import AddRWGNKFeatures
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    t = AddRWGNKFeatures(8, 0.8, 1.0, 3, seed=0)
    torch.manual_seed(0)
    a = t(Data(x=torch.randn(4, 128), edge_index=ei))
    b = t(Data(x=torch.randn(4, 128), edge_index=ei))
    return a, b


def _layers_favor():
    from pyg_grf.nn import GKATAttention
    from pyg_grf.nn.attention.masked import MaskedLinearAttention
    from pyg_grf.nn.attention.reference import LinearAttention
    torch.manual_seed(0)
    return {
        'gkat': GKATAttention(128, heads=2, mode='linear', feature_map='favor+'),
        'performer': LinearAttention(128, heads=2, feature_map='favor+'),
        'masked': MaskedLinearAttention(128, heads=2, feature_map='favor+'),
    }


@pytest.mark.parametrize('kind', ['gkat', 'performer', 'masked'])
def test_favor_output_independent_of_other_graphs(kind):
    from torch_geometric.data import Batch
    a, b = _two_graph_batch()
    layer = _layers_favor()[kind]
    # Graph B's keys sit on FAVOR+ projection directions: the largest logits a key can have
    # (|w|^2 / 2, ~32 here), far above graph A's.
    fm = layer.feature_map
    if kind == 'gkat':
        wk, bk = layer.to_k.weight, 0
    else:  # the key rows of the stacked projection
        wk, bk = layer.to_qkv.weight[128:256], layer.to_qkv.bias[128:256]
    C = fm.dim
    target = (C ** 0.25 * fm.projection[:4]).repeat(1, 2)  # [4, H * C]
    b.x = torch.linalg.lstsq(wk, (target - bk).t()).solution.t().detach()
    batch = Batch.from_data_list([a, b])
    if kind == 'gkat':
        alone = layer(a.x, rwgnk=RWGNKPlan.from_tensors(a.rwgnk_index, a.rwgnk_value))
        together = layer(batch.x, batch.batch,
                         rwgnk=RWGNKPlan.from_tensors(batch.rwgnk_index, batch.rwgnk_value))
    else:
        alone = layer(a.x)
        together = layer(batch.x, batch=batch.batch)
    # The keys used to be shifted by the batch's maximum: graph A's key features fell far below
    # the normaliser's eps and its output collapsed (changed by 9.15 of 9.2 in the report).
    assert torch.allclose(together[:4], alone, rtol=1e-5, atol=1e-5)


def test_favor_key_features_are_stabilised_per_graph():
    from pyg_grf.nn.feature_maps import FAVORPlus
    torch.manual_seed(0)
    fm = FAVORPlus(8, num_features=16).double()
    k_a = torch.randn(5, 2, 8, dtype=torch.float64)
    k_b = 30 * torch.randn(5, 2, 8, dtype=torch.float64)
    batch = torch.tensor([0] * 5 + [1] * 5)
    x = k_a * 8 ** -0.25
    exact = torch.exp(x @ fm.projection.t() - 0.5 * x.pow(2).sum(-1, keepdim=True)) / 4
    phi = fm(torch.cat([k_a, k_b]), batch=batch)[:5]
    # Graph A's key features are the exact ones up to one factor per head, the same as alone.
    ratio = phi / exact
    assert torch.allclose(ratio, ratio[:1, :, :1].expand_as(ratio), rtol=1e-10)
    assert torch.allclose(phi, fm(k_a), rtol=1e-12)


def test_favor_plus_estimates_softmax_kernel():
    D = torch.float64
    torch.manual_seed(0)
    q, k = torch.randn(5, 4, dtype=D) * 0.5, torch.randn(6, 4, dtype=D) * 0.5
    exact = torch.exp(q @ k.T / 4 ** 0.5)
    for orthogonal in (False, True):
        fm = FAVORPlus(4, num_features=4096, stabilize=False, orthogonal=orthogonal).double()
        errs = []
        for _ in range(20):
            fm.redraw()
            errs.append(fm(q) @ fm(k).T / exact - 1)
        errs = torch.stack(errs)
        # unbiased: mean relative error within 5 standard errors; spread ~ 0.02 at m = 4096
        assert float(errs.mean().abs()) < 5 * float(errs.std()) / (errs.numel() ** 0.5)
        assert float(errs.std()) < 0.05
    # stabilised features give the same attention weights (the shift cancels)
    fm = FAVORPlus(4, num_features=64).double()
    a = fm(q, is_query=True) @ fm(k).T
    fm.stabilize = False
    b = fm(q) @ fm(k).T
    assert torch.allclose(a / a.sum(1, keepdim=True), b / b.sum(1, keepdim=True))


def test_elu_feature_map_and_its_gradients_equal_torchs_elu_plus_one():
    # the map's own backward (from its output) against autograd through F.elu, with a strided
    # incoming gradient as the head-major kernels give, and its second derivative (off the kink)
    torch.manual_seed(0)
    x = torch.randn(40, 3, 5, dtype=torch.float64)
    x[0, 0, :3] = torch.tensor([0.0, -30.0, 30.0])  # the kink and both tails
    grad = torch.randn(3, 40, 5, dtype=torch.float64).transpose(0, 1)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ELUFeatureMap()(a)
    ref = torch.nn.functional.elu(b) + 1.0
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-15)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-15)
    assert torch.autograd.gradgradcheck(ELUFeatureMap(), (x[1:5].clone().requires_grad_(),))

