import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from pyg_grf.transforms.graph_bridge import AddGraphBridgeTokens
from tests.utils import cached_dataset


def test_add_graph_bridge_tokens():
    transform = AddGraphBridgeTokens()
    assert str(transform) == ("AddGraphBridgeTokens(attr_name='token_type', "
                              "num_tokens_attr='num_tokens', pe_dim=None, seed=None, "
                              "pe_attr='bridge_noise')")
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    data = Data(x=torch.randn(3, 2), edge_index=edge_index)
    out = transform(data)
    assert out.token_type.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert out.num_tokens == 7
    assert 'token_type' not in data  # the input is not modified


def test_add_graph_bridge_tokens_functional_and_options():
    transform = AddGraphBridgeTokens(attr_name='gb_type', num_tokens_attr=None)
    assert str(transform) == ("AddGraphBridgeTokens(attr_name='gb_type', num_tokens_attr=None, "
                              "pe_dim=None, seed=None, pe_attr='bridge_noise')")
    out = transform(Data(num_nodes=4, edge_index=torch.empty(2, 0, dtype=torch.long)))
    assert out.gb_type.tolist() == [0, 0, 0, 0] and 'num_tokens' not in out
    with pytest.raises(ValueError, match="must not contain 'index'"):
        AddGraphBridgeTokens(attr_name='token_index')


def test_add_graph_bridge_tokens_batching():
    transform = AddGraphBridgeTokens()
    sizes = [(3, 4), (1, 0), (5, 7)]
    data_list = [transform(Data(x=torch.randn(n, 2), edge_index=torch.randint(0, n, (2, e))))
                 for n, e in sizes]
    batch = Batch.from_data_list(data_list)
    expected = sum(([0] * n + [1] * e for n, e in sizes), [])
    assert batch.token_type.tolist() == expected  # graph by graph, no offsets
    assert batch.num_tokens.tolist() == [7, 1, 12]
    loader = DataLoader(data_list, batch_size=2)
    assert [b.token_type.numel() for b in loader] == [8, 12]


def graphs():
    gen = torch.Generator().manual_seed(0)
    return [Data(x=torch.randn(n, 2, generator=gen),
                 edge_index=torch.randint(0, n, (2, e), generator=gen))
            for n, e in [(3, 4), (5, 7), (4, 0)]]


def test_noise_is_off_by_default():
    out = AddGraphBridgeTokens()(graphs()[0])
    assert 'bridge_noise' not in out


def test_noise_seeded_stream():
    transform = AddGraphBridgeTokens(pe_dim=6, seed=5)
    assert str(transform) == ("AddGraphBridgeTokens(attr_name='token_type', "
                              "num_tokens_attr='num_tokens', pe_dim=6, seed=5, "
                              "pe_attr='bridge_noise')")
    outs = [transform(d) for d in graphs()]
    # independent recomputation: one generator seeded once, drawn graph after graph
    gen = torch.Generator().manual_seed(5)
    for d, out in zip(graphs(), outs):
        assert out.bridge_noise.shape == (d.num_nodes, 6)
        assert out.bridge_noise.dtype == torch.float32
        assert torch.equal(out.bridge_noise, torch.randn(d.num_nodes, 6, generator=gen))
        assert 'bridge_noise' not in d  # input untouched
    # a new transform with the same seed reproduces it; another seed does not
    same = AddGraphBridgeTokens(pe_dim=6, seed=5)
    again = [same(d) for d in graphs()]
    assert all(torch.equal(a.bridge_noise, b.bridge_noise) for a, b in zip(outs, again))
    other = AddGraphBridgeTokens(pe_dim=6, seed=6)(graphs()[0])
    assert not torch.equal(other.bridge_noise, outs[0].bridge_noise)


def test_noise_global_rng_and_statistics():
    torch.manual_seed(1)
    out = AddGraphBridgeTokens(pe_dim=4, pe_attr='eps')(Data(num_nodes=2000,
                                                            edge_index=torch.empty(2, 0).long()))
    torch.manual_seed(1)
    assert torch.equal(out.eps, torch.randn(2000, 4))
    # standard normal: mean within 4 standard errors (1 / sqrt(8000)), variance near 1
    assert abs(float(out.eps.mean())) < 4 / 8000 ** 0.5
    assert abs(float(out.eps.var()) - 1) < 4 * (2 / 8000) ** 0.5


def test_noise_batches_with_the_nodes():
    data = [AddGraphBridgeTokens(pe_dim=4, seed=0)(d) for d in graphs()]
    batch = Batch.from_data_list(data)
    assert torch.equal(batch.bridge_noise, torch.cat([d.bridge_noise for d in data]))
    assert torch.equal(batch.bridge_noise[batch.batch == 1], data[1].bridge_noise)


def test_noise_is_cached_as_pre_transform(tmp_path):
    ds = cached_dataset(tmp_path, graphs, pre_transform=AddGraphBridgeTokens(pe_dim=4, seed=3))
    gen = torch.Generator().manual_seed(3)
    for g in range(3):
        assert torch.equal(ds[g].bridge_noise, torch.randn(ds[g].num_nodes, 4, generator=gen))
    first = ds[1].bridge_noise.clone()
    assert torch.equal(ds[1].bridge_noise, first)  # the same noise at every access
    # reloaded from processed/ (same repr): the cached noise, not a new draw
    reloaded = cached_dataset(tmp_path, graphs,
                              pre_transform=AddGraphBridgeTokens(pe_dim=4, seed=3))
    assert torch.equal(reloaded[1].bridge_noise, first)


@pytest.mark.parametrize('kwargs,match', [
    (dict(pe_dim=0), r"'pe_dim' must be a positive integer or None \(got 0\)"),
    (dict(pe_dim=2.5), r"'pe_dim' must be a positive integer or None \(got 2.5\)"),
    (dict(pe_dim=True), r"'pe_dim' must be a positive integer or None \(got True\)"),
    (dict(seed='a'), r"'seed' must be an integer or None \(got 'a'\)"),
    (dict(pe_attr='noise_index'), r"'pe_attr' must not contain 'index'"),
    (dict(pe_attr='token_type'), r"'pe_attr' must differ from 'attr_name'"),
])
def test_noise_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AddGraphBridgeTokens(**kwargs)
