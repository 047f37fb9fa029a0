"""The one attention contract, checked on every attention layer:
constructor vocabulary, output projection, dropout on the coefficients only (unbiased), reset
and repr."""
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_undirected

from pyg_grf.features import GRFLoads
from pyg_grf.nn import (
    GKATAttention,
    GRFAttention,
    LinearAttention,
    MaskedLinearAttention,
    PowerSeriesAttention,
    SAMSAAttention,
    SoftmaxAttention,
)
from pyg_grf.nn.attention.base import key_dropout
from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures
from tests.nn.attention.grf.helpers import dense_grf_attention

D = torch.float64


def make_batch(channels=12, seed=0):
    torch.manual_seed(seed)
    graphs = []
    for n, edges in [(7, [[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]]),
                     (5, [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]),
                     (6, [[0, 0, 1, 3, 4, 2], [1, 2, 3, 4, 5, 5]])]:
        ei = to_undirected(torch.tensor(edges), num_nodes=n)
        graphs.append(Data(x=torch.randn(n, channels, dtype=D), edge_index=ei, num_nodes=n))
    grf = AddGraphRandomFeatures(num_walks=6, p_halt=0.3, max_length=3, seed=seed)
    rwgnk = AddRWGNKFeatures(num_walks=4, lam=0.7, alpha=1.0, max_length=3, seed=seed)
    batch = Batch.from_data_list([rwgnk(grf(g)) for g in graphs])
    batch.rwgnk_value = batch.rwgnk_value.double()
    return batch


# name -> (constructor, extra constructor kwargs); every layer is called the same way (run)
LAYERS = {
    'grf_symmetric': (GRFAttention, dict(max_length=3, feature_map='elu')),
    'grf_asymmetric': (GRFAttention, dict(max_length=3, mode='asymmetric', feature_map='elu')),
    'grf_global': (GRFAttention, dict(max_length=3, feature_map='elu', global_beta=0.5)),
    'grf_sparse_softmax': (GRFAttention, dict(max_length=3, mode='sparse_softmax')),
    'gkat_linear': (GKATAttention, dict(mode='linear')),
    'gkat_softmax': (GKATAttention, dict(mode='softmax')),
    'masked_linear': (MaskedLinearAttention, {}),
    'linear': (LinearAttention, dict(feature_map='elu')),
    'power_series': (PowerSeriesAttention, dict(max_length=3, feature_map='elu')),
    'softmax': (SoftmaxAttention, {}),
    'samsa': (SAMSAAttention, dict(num_samples=4)),
}


def build(name, **kwargs):
    cls, extra = LAYERS[name]
    torch.manual_seed(3)
    return cls(12, **{**dict(heads=3, head_channels=5), **extra, **kwargs}).double()


def run(name, layer, batch):
    # the one call shape of every attention layer
    return layer(batch.x, batch.batch, **layer.payload(batch))


@pytest.mark.parametrize('name', list(LAYERS))
def test_vocabulary_projection_and_repr(name):
    batch = make_batch()
    layer = build(name, dropout=0.25, bias=False)
    assert (layer.channels, layer.heads, layer.head_channels, layer.dropout) == (12, 3, 5, 0.25)
    # the same output projection: the 3 x 5 head outputs back to the 12 input channels
    assert isinstance(layer.to_out, torch.nn.Linear)
    assert (layer.to_out.in_features, layer.to_out.out_features) == (15, 12)
    assert layer.to_out.bias is None
    assert run(name, layer.eval(), batch).shape == (batch.num_nodes, 12)
    cls = LAYERS[name][0].__name__
    text = repr(layer)
    assert text.startswith(f'{cls}(12, heads=3, head_channels=5') and \
        text.endswith(', dropout=0.25)'), text
    # the defaults: head_channels = channels // heads, nothing about dropout in the repr
    default = LAYERS[name][0](12, heads=3, **LAYERS[name][1])
    assert default.head_channels == 4 and default.to_out.bias is not None
    assert repr(default).startswith(f'{cls}(12, heads=3') and 'dropout' not in repr(default)
    assert 'head_channels' not in repr(default)


@pytest.mark.parametrize('name', list(LAYERS))
def test_reset_parameters_reinitialises_everything(name):
    layer = build(name)
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(0.123)
    layer.reset_parameters()
    for pname, p in layer.named_parameters():
        assert not torch.all(p == 0.123), pname
        assert torch.isfinite(p).all(), pname


@pytest.mark.parametrize('name', list(LAYERS))
def test_bad_dropout_and_heads(name):
    cls, extra = LAYERS[name]
    with pytest.raises(ValueError, match='dropout'):
        cls(12, heads=3, dropout=1.0, **extra)
    with pytest.raises(ValueError, match='divisible'):
        cls(10, heads=3, **extra)


# SAMSA is left out: in training mode it also perturbs its top-k selection with Gumbel noise,
# so its training output is not the evaluation output plus dropout noise.
UNBIASED = [n for n in LAYERS if n != 'samsa']


@pytest.mark.parametrize('name', UNBIASED)
def test_dropout_is_unbiased_and_off_in_eval(name):
    """E[output with dropout] = output without dropout: the statistic over R draws lies within
    5 standard errors of the evaluation output, entry by entry (the sample variance gives the
    tolerance); in evaluation mode the dropout layer equals the same layer with dropout 0."""
    batch = make_batch()
    layer = build(name, dropout=0.3)
    plain = build(name, dropout=0.0)
    plain.load_state_dict(layer.state_dict())
    layer.eval()
    plain.eval()
    with torch.no_grad():
        ref = run(name, plain, batch)
        assert torch.equal(run(name, layer, batch), ref)
        layer.train()
        torch.manual_seed(0)
        R = 600
        draws = torch.stack([run(name, layer, batch) for _ in range(R)])
    assert not torch.allclose(draws[0], ref)  # dropout is active in training mode
    mean, se = draws.mean(0), draws.std(0) / R ** 0.5
    assert torch.all((mean - ref).abs() <= 5 * se + 1e-9), float(((mean - ref) / se).abs().max())


@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_linear_dropout_is_column_coefficient_dropout(mode):
    """In the linear modes, dropout zeroes whole key columns of the coefficient matrix (one draw
    per key and head) and leaves the normaliser alone: equal to a dense reimplementation that
    forms the coefficients and drops the same columns."""
    batch = make_batch()
    p = 0.4
    layer = GRFAttention(12, heads=3, max_length=3, mode=mode, feature_map='elu', eps=0.0,
                         dropout=p).double().train()
    torch.manual_seed(11)
    out = layer(batch.x, grf=GRFLoads(batch.grf_index, batch.grf_length, batch.grf_load,
                                      batch.x.size(0)))
    torch.manual_seed(11)  # the ELU feature map draws nothing: the first draw is the mask
    keep = torch.empty(batch.num_nodes, 3, 1, dtype=D).bernoulli_(1 - p)
    ref = dense_grf_attention(layer, batch.x, batch.grf_index, batch.grf_length,
                              batch.grf_load, key_scale=keep[..., 0] / (1 - p))
    assert 0 < int(keep.sum()) < keep.numel()
    assert torch.allclose(out, ref, atol=1e-9, rtol=0)


def test_key_dropout_function():
    v = torch.ones(1000, 2, 3, dtype=D)
    assert key_dropout(v, 0.5, training=False) is v
    assert key_dropout(v, 0.0, training=True) is v
    torch.manual_seed(0)
    out = key_dropout(v, 0.5, training=True)
    # one draw per key and head, shared by its channels; kept values scaled by 1 / (1 - p)
    assert torch.equal(out.amin(-1), out.amax(-1))
    assert set(out.unique().tolist()) == {0.0, 2.0}
    frac = float((out[..., 0] > 0).to(D).mean())
    assert abs(frac - 0.5) < 5 * (0.25 / 2000) ** 0.5


@pytest.mark.parametrize('cls_path', ['pyg_grf.nn.attention.reference:SoftmaxAttention',
                                      'pyg_grf.nn.attention.padded:PaddedMultiheadAttention',
                                      'pyg_grf.nn.attention.padded:PaddedPerformerAttention'])
def test_padding_attentions_refuse_an_unsorted_batch(cls_path):
    # the layers that pad per graph refuse an unsorted batch vector with a clear error (not a
    # torch size mismatch)
    import importlib
    module, name = cls_path.split(':')
    layer = getattr(importlib.import_module(module), name)(8, heads=2)
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        layer(x, torch.tensor([0, 1, 0, 1, 1, 0]))
    assert layer(x, torch.tensor([0, 0, 0, 1, 1, 1])).shape == (6, 8)
