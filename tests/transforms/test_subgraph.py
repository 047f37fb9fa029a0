import pytest
import torch
import torch_geometric.typing
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import ClusterData, ClusterLoader, NodeLoader, RandomNodeLoader
from torch_geometric.sampler import BaseSampler, SamplerOutput
from torch_geometric.utils import subgraph

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.transforms import (
    AddGraphRandomFeatures,
    RestrictGraphRandomFeatures,
    grf_prefixes,
    subgraph_grf,
)
from tests.nn.attention.grf.helpers import layer_mask
from tests.utils import er_graph

N = 24


def full_graph(num_walks=6, max_length=3):
    edge_index = er_graph(N, 0.15, seed=3)
    data = Data(x=torch.randn(N, 5), y=torch.arange(N) % 3, edge_index=edge_index,
                edge_attr=torch.randn(edge_index.size(1), 2))
    data = AddGraphRandomFeatures(num_walks=num_walks, max_length=max_length, seed=0)(data)
    return AddGraphRandomFeatures(num_walks=num_walks, max_length=max_length, seed=1,
                                  attr_prefix='grf_key')(data)


def as_dict(index, hop, load):
    return {(int(i), int(q), int(l)): float(w)
            for (i, q), l, w in zip(index.t().tolist(), hop.tolist(), load.tolist())}


def reference(data, prefix, kept):
    r"""The entries of the full loads with both ends in `kept`, renumbered by position: plain
    Python, independent of the vectorised code."""
    pos = {int(v): k for k, v in enumerate(kept)}
    full = as_dict(data[f'{prefix}_index'], data[f'{prefix}_length'], data[f'{prefix}_load'])
    return {(pos[i], pos[q], l): w for (i, q, l), w in full.items() if i in pos and q in pos}


def assert_restricted(out, data, kept, prefixes=('grf', 'grf_key')):
    for p in prefixes:
        index, hop, load = out[f'{p}_index'], out[f'{p}_length'], out[f'{p}_load']
        # integer ids and hops (a GRFLoads stores them narrowed: int32 ids, uint8 hops)
        assert not index.is_floating_point() and not hop.is_floating_point()
        assert as_dict(index, hop, load) == reference(data, p, kept)
        # sorted by (start, visited, hop), as the transform stores them
        key = (index[0].long() * len(kept) + index[1].long()) * 16 + hop.long()
        assert bool((key[1:] > key[:-1]).all())


def check_batch(batch, data, kept):
    assert_restricted(batch, data, kept)
    assert torch.equal(batch.x, data.x[kept])
    grf = GRFLoads.from_data(batch, key_prefix='grf_key')  # validates the node ids
    assert grf.num_nodes == len(kept)


def test_grf_prefixes():
    assert grf_prefixes(full_graph()) == ['grf', 'grf_key']
    assert grf_prefixes(Data(edge_index=er_graph(4, 0.5, seed=0))) == []


@pytest.mark.parametrize('kind', ['sorted', 'shuffled', 'mask'])
def test_subgraph_grf_matches_reference(kind):
    data = full_graph()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(N, generator=gen)[:15]
    if kind == 'sorted':
        subset = kept = ids.sort().values
    elif kind == 'shuffled':
        subset = kept = ids
    else:
        subset = torch.zeros(N, dtype=torch.bool)
        subset[ids] = True
        kept = subset.nonzero().view(-1)
    out = subgraph_grf(data, subset)
    assert_restricted(out, data, kept.tolist())
    # everything else is sliced exactly as Data.subgraph does it
    ref = data.subgraph(subset)
    for key in ('x', 'y', 'edge_index', 'edge_attr'):
        assert torch.equal(out[key], ref[key])
    assert out.num_nodes == 15
    assert 'grf_index' in data and data.grf_index.max() >= 15  # input untouched


def dense_phi(data, f):
    r"""[H, N, N] features phi[h, i, q] = sum_l f[h, l] load(i, q, l), from a Python loop."""
    phi = torch.zeros(f.size(0), N, N)
    for (i, q, l), w in as_dict(data.grf_index, data.grf_length, data.grf_load).items():
        phi[:, i, q] += f[:, l] * w
    return phi


@pytest.mark.parametrize('f_mode', ['abs', 'free'])
@pytest.mark.parametrize('mode', ['symmetric', 'asymmetric'])
def test_restricted_mask(mode, f_mode):
    data = full_graph()
    kept = torch.tensor([20, 3, 7, 11, 0, 15, 9, 22, 5])
    out = subgraph_grf(data, kept)
    layer = GRFAttention(8, heads=2, max_length=3, mode=mode, f_mode=f_mode)
    with torch.no_grad():
        layer.f.copy_(torch.tensor([[1., .5, .3, .2], [.8, -.4, .2, .1]]))
        sub = layer_mask(layer, GRFLoads(out.grf_index, out.grf_length, out.grf_load,
                                         len(kept))).to_dense()
        full = layer_mask(layer, GRFLoads(data.grf_index, data.grf_length, data.grf_load,
                                          N)).to_dense()
    f = layer.coefficients().detach()  # the mask's coefficients
    phi_ss = dense_phi(data, f)[:, kept][:, :, kept]
    if mode == 'asymmetric':
        # exactly the principal submatrix of the full graph's mask
        assert torch.allclose(sub, full[:, kept][:, :, kept], atol=1e-6)
        assert torch.allclose(sub, phi_ss, atol=1e-6)
    else:
        # the meeting points outside the subset are dropped
        assert torch.allclose(sub, phi_ss @ phi_ss.transpose(1, 2), atol=1e-5)
        assert not torch.allclose(sub, full[:, kept][:, :, kept], atol=1e-3)


def test_subgraph_grf_on_grfloads_with_key_and_batch():
    data = full_graph()
    batch = (torch.arange(N) >= 10).long()
    grf = GRFLoads(data.grf_index, data.grf_length, data.grf_load, N, batch=batch,
                   max_length=3, key=GRFLoads.from_data(data, 'grf_key'))
    kept = [1, 4, 8, 9, 12, 13, 20]
    out = subgraph_grf(grf, torch.tensor(kept))
    assert isinstance(out, GRFLoads) and out.num_nodes == 7 and out.max_length == 3
    assert as_dict(out.index, out.hop, out.load) == reference(data, 'grf', kept)
    assert as_dict(out.key.index, out.key.hop, out.key.load) == reference(data, 'grf_key', kept)
    assert out.batch.tolist() == [0, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="reorders the graphs"):
        subgraph_grf(grf, torch.tensor([12, 1]))


def test_subgraph_grf_loads_of_node_or_edge_length():
    # When nnz equals the number of nodes, Data.subgraph takes the loads for node attributes and
    # slices them; subgraph_grf keeps them out of PyG's slicing.
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    index = torch.tensor([[0, 0, 1, 3], [0, 1, 2, 3]], dtype=torch.int32)
    data = Data(x=torch.randn(4, 2), edge_index=edge_index, grf_index=index,
                grf_length=torch.tensor([0, 1, 1, 0], dtype=torch.int8),
                grf_load=torch.tensor([1., 2., 3., 4.]))
    out = subgraph_grf(data, torch.tensor([0, 1, 3]))
    assert as_dict(out.grf_index, out.grf_length, out.grf_load) == {
        (0, 0, 0): 1., (0, 1, 1): 2., (2, 2, 0): 4.}


def test_subgraph_grf_without_node_attributes():
    data = AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)(
        Data(edge_index=er_graph(10, 0.3, seed=2), num_nodes=10))
    del data.num_nodes
    data.num_nodes = 10
    out = subgraph_grf(data, torch.tensor([2, 5, 6]))
    assert out.num_nodes == 3
    assert_restricted(out, data, [2, 5, 6], prefixes=('grf', ))


def test_random_node_loader():
    data = full_graph()
    data.n_id = torch.arange(N)
    restrict = RestrictGraphRandomFeatures(data)
    torch.manual_seed(0)
    seen = []
    for batch in RandomNodeLoader(data, num_parts=3, shuffle=True):
        batch = restrict(batch)
        check_batch(batch, data, batch.n_id.tolist())
        seen.append(batch.n_id)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(N))


def _fake_metis(num_parts):
    def metis(self, edge_index, num_nodes):
        perm = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(0))
        return perm % num_parts
    return metis


def _cluster_batches(data):
    cluster = ClusterData(data, num_parts=4, log=False)
    return list(ClusterLoader(cluster, batch_size=2, shuffle=True))


@pytest.mark.skipif(not (torch_geometric.typing.WITH_METIS
                         or torch_geometric.typing.WITH_TORCH_SPARSE),
                    reason="ClusterData needs METIS from 'pyg-lib' or 'torch-sparse', neither "
                           "is installed")
def test_cluster_loader_with_metis():
    data = full_graph()
    data.n_id = torch.arange(N)
    restrict = RestrictGraphRandomFeatures(data)
    for batch in _cluster_batches(data):
        check_batch(restrict(batch), data, batch.n_id.tolist())


def test_cluster_loader_with_a_given_partition(monkeypatch):
    # The loader's slicing and renumbering, with the METIS call replaced by a fixed partition
    # (runs without pyg-lib / torch-sparse).
    monkeypatch.setattr(ClusterData, '_metis', _fake_metis(4))
    data = full_graph()
    data.n_id = torch.arange(N)
    restrict = RestrictGraphRandomFeatures(data)
    torch.manual_seed(0)
    batches = _cluster_batches(data)
    assert len(batches) == 2
    for batch in batches:
        assert batch.num_nodes == N // 2
        check_batch(restrict(batch), data, batch.n_id.tolist())


@pytest.mark.skipif(not (torch_geometric.typing.WITH_PYG_LIB
                         or torch_geometric.typing.WITH_TORCH_SPARSE),
                    reason="NeighborLoader needs 'pyg-lib' or 'torch-sparse', neither is "
                           "installed")
def test_neighbor_loader():
    from torch_geometric.loader import NeighborLoader
    data = full_graph()
    restrict = RestrictGraphRandomFeatures(data)
    loader = NeighborLoader(data, num_neighbors=[3, 2], batch_size=4, transform=restrict)
    for batch in loader:
        check_batch(batch, data, batch.n_id.tolist())


class OneHopSampler(BaseSampler):
    r"""Seeds plus all their in-neighbours, with the induced edges (pure torch)."""
    def __init__(self, edge_index, num_nodes):
        self.edge_index, self.num_nodes = edge_index, num_nodes

    def sample_from_nodes(self, index, **kwargs):
        seeds = index.node
        hit = torch.zeros(self.num_nodes, dtype=torch.bool)
        hit[self.edge_index[0][torch.isin(self.edge_index[1], seeds)]] = True
        hit[seeds] = False
        node = torch.cat([seeds, hit.nonzero().view(-1)])
        (row, col), _, edge_mask = subgraph(node, self.edge_index, relabel_nodes=True,
                                            num_nodes=self.num_nodes, return_edge_mask=True)
        return SamplerOutput(node=node, row=row, col=col, edge=edge_mask.nonzero().view(-1),
                             metadata=(index.input_id, None))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError


def test_node_loader_transform_uses_n_id():
    # NodeLoader is NeighborLoader's base: it stores 'n_id' and applies 'transform='.
    data = full_graph()
    restrict = RestrictGraphRandomFeatures(data)
    loader = NodeLoader(data, OneHopSampler(data.edge_index, N), batch_size=5, shuffle=True,
                        transform=restrict)
    torch.manual_seed(0)
    for batch in loader:
        check_batch(batch, data, batch.n_id.tolist())
        assert torch.equal(batch.y[:batch.batch_size], data.y[batch.input_id])


def test_restrict_from_grfloads_and_layer_runs():
    data = full_graph()
    grf = GRFLoads.from_data(data, key_prefix='grf_key')
    restrict = RestrictGraphRandomFeatures(grf)
    assert restrict.attr_prefixes == ['grf', 'grf_key']
    batch = Data(x=data.x[[3, 1, 8]], n_id=torch.tensor([3, 1, 8]))
    out = restrict(batch)
    assert 'grf_index' not in batch  # input untouched
    assert_restricted(out, data, [3, 1, 8])
    layer = GRFAttention(5, heads=1, max_length=3)
    assert layer(out.x, grf=GRFLoads.from_data(out, key_prefix='grf_key')).shape == (3, 5)


def test_restrict_from_unsorted_loads_and_after_an_error():
    data = full_graph()
    gen = torch.Generator().manual_seed(1)
    shuffled = data.clone()
    for p in ('grf', 'grf_key'):
        perm = torch.randperm(data[f'{p}_index'].size(1), generator=gen)
        shuffled[f'{p}_index'] = data[f'{p}_index'][:, perm]
        shuffled[f'{p}_length'] = data[f'{p}_length'][perm]
        shuffled[f'{p}_load'] = data[f'{p}_load'][perm]
    restrict = RestrictGraphRandomFeatures(shuffled)
    with pytest.raises(ValueError, match="must not repeat a node id"):
        restrict(Data(x=torch.randn(3, 5), n_id=torch.tensor([4, 9, 4])))
    for kept in ([4, 9, 17, 2], [0, 1, 2, 3, 5, 8, 13, 21], list(range(N))):
        out = restrict(Data(x=data.x[kept], n_id=torch.tensor(kept)))
        # the same entries as from the sorted loads; sorted again by (start, visited, hop)
        assert_restricted(out, data, kept)


def test_repr():
    data = full_graph()
    assert str(RestrictGraphRandomFeatures(data, attr_prefixes=['grf'])) == (
        "RestrictGraphRandomFeatures(num_nodes=24, attr_prefixes=['grf'], node_id_attr='n_id')")


def test_bad_input():
    data = full_graph()
    with pytest.raises(ValueError, match="must not repeat a node id"):
        subgraph_grf(data, torch.tensor([1, 2, 1]))
    with pytest.raises(ValueError,
                       match=r"node ids of the full graph in \[0, 24\), got ids in \[0, 30\]"):
        subgraph_grf(data, torch.tensor([0, 30]))
    with pytest.raises(ValueError, match=r"one entry per node \(24\), got 5"):
        subgraph_grf(data, torch.ones(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="integer node ids or be a boolean mask, got "
                                        "torch.float32"):
        subgraph_grf(data, torch.tensor([0., 1.]))
    with pytest.raises(ValueError, match=r"must be 1-D .* got shape \(1, 2\)"):
        subgraph_grf(data, torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match="tensor of node ids or a boolean mask, got list"):
        subgraph_grf(data, [0, 1])
    with pytest.raises(TypeError, match="Data or a GRFLoads, got dict"):
        subgraph_grf({}, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"no GRF loads with prefix \['rw'\]"):
        subgraph_grf(data, torch.tensor([0]), attr_prefixes=['rw'])
    with pytest.raises(ValueError, match="'num_nodes' is 30 but the graph has 24 nodes"):
        subgraph_grf(data, torch.tensor([0]), num_nodes=30)
    # loads that were already restricted (or belong to another graph)
    small = subgraph_grf(data, torch.arange(12))
    with pytest.raises(ValueError, match="already restricted, or from another graph"):
        subgraph_grf(Data(num_nodes=6, grf_index=small.grf_index, grf_length=small.grf_length,
                          grf_load=small.grf_load), torch.tensor([0]))

    restrict = RestrictGraphRandomFeatures(data)
    with pytest.raises(TypeError, match="expects a torch_geometric.data.Data .*got HeteroData"):
        restrict(HeteroData())
    with pytest.raises(ValueError, match="has no 'n_id'.*torch.arange"):
        restrict(Data(x=torch.randn(3, 5)))
    with pytest.raises(ValueError, match=r"one id per node of the subgraph \(3\), got 2"):
        restrict(Data(x=torch.randn(3, 5), n_id=torch.tensor([0, 1])))
    with pytest.raises(ValueError, match=r"'n_id' must hold node ids of the full graph in "
                                         r"\[0, 24\), got ids in \[0, 24\]"):
        restrict(Data(x=torch.randn(2, 5), n_id=torch.tensor([0, 24])))
    with pytest.raises(TypeError, match="'n_id' must hold integer node ids, got torch.float32"):
        restrict(Data(x=torch.randn(2, 5), n_id=torch.tensor([0., 1.])))
    with pytest.raises(ValueError, match=r"must hold node ids in \[0, 6\), got ids in"):
        RestrictGraphRandomFeatures(Data(num_nodes=6, grf_index=data.grf_index,
                                         grf_length=data.grf_length, grf_load=data.grf_load))
    with pytest.raises(ValueError, match="holds no GRF loads"):
        RestrictGraphRandomFeatures(Data(x=torch.randn(3, 5)))
    with pytest.raises(TypeError, match="Data or a GRFLoads, got Tensor"):
        RestrictGraphRandomFeatures(torch.zeros(3))
    with pytest.raises(ValueError, match="for a GRFLoads use 'attr_prefix'"):
        RestrictGraphRandomFeatures(GRFLoads.from_data(data), attr_prefixes=['grf'])


@pytest.mark.slow
@pytest.mark.data
def test_cora_through_random_node_loader_matches_full_graph(mirror, tmp_path):
    # experiments/cora_subgraph.py's setting at 30 epochs, one seed, through pyg_grf.lightning:
    # the GRF GraphTransformer trained on 4 random node parts with the restricted full-graph
    # walks (PlanetoidDataModule(num_parts=4)) lands in the accuracy band of full-graph training
    # (3 seeds x 100-400 epochs: experiments/results/cora_subgraph.md)
    import importlib.util
    import os.path as osp
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        'harness', osp.join(root, 'experiments', 'harness.py'))
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    config = osp.join(root, 'experiments', 'configs', 'cora_grf.yaml')
    runs = {name: harness.fit_and_test(config, extra + ['--trainer.logger=false'], 0,
                                       str(tmp_path / name), epochs=30)
            for name, extra in [('full', []), ('parts', ['--data.init_args.num_parts=4'])]}
    full, sub = runs['full']['test/acc'], runs['parts']['test/acc']
    assert full > 0.70 and sub > 0.70
    assert abs(full - sub) < 0.06
