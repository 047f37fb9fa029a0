r"""GRFLoads (:mod:`pyg_grf.features.loads`): node ids, hop counts and finite loads are
checked once per batch; loads that overflow are refused by the transform."""
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.nn import GRFAttention
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import batch_with_draws, make_batch, make_layer
from tests.utils import er_graph


def _grf_batch():
    t = AddGraphRandomFeatures(num_walks=4, p_halt=0.4, max_length=3, seed=0)
    ring = torch.tensor([[0, 1, 2, 3, 1, 2, 3, 0], [1, 2, 3, 0, 0, 1, 2, 3]])
    return Batch.from_data_list([t(Data(x=torch.randn(4, 8), edge_index=ring))
                                 for _ in range(2)])


@pytest.mark.parametrize('backend', ['sparse', 'pairs'])
def test_negative_grf_index_is_refused(backend):
    b = _grf_batch()
    bad = b.grf_index.clone()
    bad[1, 2] = -1  # used to become the mask entry (r - 1, N - 1)
    layer = GRFAttention(8, heads=2, max_length=3, backend=backend)
    with pytest.raises(ValueError, match=r"node ids in \[0, 8\), got ids in \[-1, 7\]"):
        layer(b.x, b.batch, grf=GRFLoads(bad, b.grf_length, b.grf_load, b.x.size(0),
                                         batch=b.batch))


def test_overflowing_loads_are_refused():
    d = Data(edge_index=er_graph(60, 0.9, seed=0), num_nodes=60)
    with pytest.raises(ValueError, match='overflowed float32'):
        AddGraphRandomFeatures(num_walks=4, p_halt=0.01, max_length=60, normalization=None,
                               seed=0)(d)
    b = _grf_batch()
    load = b.grf_load.clone()
    load[0] = float('inf')  # 0 * inf used to give NaN where f or truncation should give 0
    with pytest.raises(ValueError, match='non-finite'):
        GRFLoads(b.grf_index, b.grf_length, load, b.num_nodes)


def test_bad_loads_and_layer_inputs_are_refused():
    b = make_batch()
    idx, hop, load, N = b.grf_index, b.grf_length, b.grf_load, b.num_nodes
    bad = idx.clone()
    bad[1, 3] = -1
    with pytest.raises(ValueError, match=r'node ids in \[0, 26\), got ids in \[-1, 25\]'):
        GRFLoads(bad, hop, load, N)
    with pytest.raises(ValueError, match=r'\(hop counts\) must be >= 0, got -1'):
        GRFLoads(idx, hop - 1, load, N)
    inf = load.clone()
    inf[0] = float('inf')
    with pytest.raises(ValueError, match='non-finite'):
        GRFLoads(idx, hop, inf, N)
    with pytest.raises(TypeError, match='integer'):
        GRFLoads(idx.float(), hop, load, N)
    with pytest.raises(ValueError, match="'batch' must have one entry per node"):
        GRFLoads(idx, hop, load, N, batch=b.batch[:-1])
    with pytest.raises(ValueError, match="hop counts up to 3 but 'max_length' is 2"):
        GRFLoads(idx, hop, load, N, max_length=2)
    with pytest.raises(ValueError, match='no GRF loads'):
        GRFLoads.from_data(Data(num_nodes=3))
    # a layer shorter than the transform refuses instead of dropping hops silently
    layer = GRFAttention(8, heads=2, max_length=2).double()
    with pytest.raises(ValueError, match=r'hop counts up to 3 but GRFAttention\(max_length=2\)'):
        layer(b.x, grf=GRFLoads.from_data(b))
    with pytest.raises(TypeError, match='positional'):
        make_layer('symmetric', 'sparse')(b.x, b.batch, b.grf_index)
    with pytest.raises(ValueError, match='the GRF plan covers 26 nodes but .x. has 25 rows'):
        make_layer('symmetric', 'sparse')(b.x[:-1], grf=GRFLoads.from_data(b))
    with pytest.raises(ValueError, match='backend'):
        GRFAttention(8, backend='gpu')


def test_fold_and_draw_errors():
    b = batch_with_draws(3)
    grf = GRFLoads.from_data(b)
    with pytest.raises(ValueError, match=r"draw ids in \[0, 3\)"):
        grf.fold((0, 3))
    # fewer draws than heads x layers: an error, never a silent reuse of the same walks
    with pytest.raises(ValueError, match=r"needs walk draws up to 3 .* the loads hold 3"):
        GRFAttention(8, heads=2, max_length=3, layer_index=1)(b.x, b.batch, grf=grf)
    with pytest.raises(ValueError, match=r"needs walk draws up to 3 .* the loads hold 3"):
        GRFAttention(8, heads=4, max_length=3).draws(3)
    with pytest.raises(ValueError, match="'grf_draw' .* must be >= 0"):
        GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, draw=-b.grf_draw.long() - 1)
    with pytest.raises(ValueError, match="one draw id per entry"):
        GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, draw=b.grf_draw[:-1])
    one = GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes)
    with pytest.raises(ValueError, match="key-side loads hold 1 walk draws"):
        GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, draw=b.grf_draw, key=one)
    with pytest.raises(ValueError, match="'num_draws' must be an integer"):
        AddGraphRandomFeatures(num_draws=0)
    with pytest.raises(ValueError, match="'layer_index' must be an integer"):
        GRFAttention(8, layer_index=-1)


def test_a_batch_mixing_walk_draws_is_refused_in_either_order():
    # graphs given walks with num_draws=3 and num_draws=1: PyG's collation drops grf_draw
    # silently when the one-draw graph comes first, and fails with a bare KeyError otherwise
    from torch_geometric.data import Batch, Data

    from pyg_grf.loader import DataLoader
    from pyg_grf.nn import GRFAttention
    from pyg_grf.transforms import AddGraphRandomFeatures
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    one = AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0)(Data(edge_index=ei,
                                                                        num_nodes=4))
    three = AddGraphRandomFeatures(num_walks=4, max_length=2, seed=0, num_draws=3)(
        Data(edge_index=ei, num_nodes=4))
    assert int(one.grf_num_draws) == 1 and int(three.grf_num_draws) == 3
    mixed = Batch.from_data_list([one, three])
    assert 'grf_draw' not in mixed  # what PyG does: the draw ids are gone
    with pytest.raises(ValueError, match=r"different num_draws \(1 and 3\)"):
        GRFLoads.from_data(mixed)
    layer = GRFAttention(8, heads=1, max_length=2)
    with pytest.raises(ValueError, match=r"different num_draws \('grf_draw' is on some"):
        next(iter(DataLoader([three, one], batch_size=2, model=[layer])))
    # the same draws everywhere: fine
    same = Batch.from_data_list([three, three])
    assert GRFLoads.from_data(same).num_draws == 3


@pytest.mark.parametrize('order', ['transform', 'shuffled'])
def test_num_pairs_counts_the_distinct_start_visited_pairs(order):
    # against a set of Python tuples, on the transform's sorted entries and on shuffled ones
    # (the unique path)
    loads = GRFLoads.from_data(make_batch())
    if order == 'shuffled':
        perm = torch.randperm(loads.nnz, generator=torch.Generator().manual_seed(0))
        loads = GRFLoads(loads.index[:, perm], loads.hop[perm], loads.load[perm],
                         loads.num_nodes, batch=loads.batch)
    expected = len(set(map(tuple, loads.index.t().tolist())))
    assert expected < loads.nnz  # some pairs are visited at several hops
    assert loads.num_pairs() == expected == loads.pairs()[0].size(1)
    empty = GRFLoads(torch.empty(2, 0, dtype=torch.long), torch.empty(0, dtype=torch.long),
                     torch.empty(0), 3)
    assert empty.num_pairs() == 0
