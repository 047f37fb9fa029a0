"""The join behind the symmetric mask statistics: the half join of the entries with themselves
(each unordered pair once, then mirrored) against the full join of two sides, on a batch and on
one big graph (whose N^2 cells take the sorting path), and against Phi Phi^T formed densely."""
import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.features.blocks import (block_coords, join_terms, self_join_terms,
                                     symmetric_ids)
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import er_graph, path_graph

D = torch.float64


def both_joins(grf):
    lay = grf.layout()
    prow, _ = block_coords(lay, grf.index)
    hop, load = grf.hop.long(), grf.load.to(D)
    K = grf.max_hop + 1
    full = join_terms(lay, prow, grf.index[1], hop, load, prow, grf.index[1], hop, load, K,
                      grf.num_nodes)
    half = self_join_terms(lay, prow, grf.index[1], hop, load, K, grf.num_nodes)
    return lay, full, half


@pytest.mark.parametrize('big', [False, True])
def test_half_join_equals_full_join(big):
    t = AddGraphRandomFeatures(num_walks=3, p_halt=0.5, max_length=3, seed=0)
    if big:  # 4100^2 cells > 2^24: the unique/sort path of the coalescing and the mirror
        b = Batch.from_data_list([t(Data(edge_index=path_graph(4100), num_nodes=4100))])
    else:
        b = Batch.from_data_list([t(Data(edge_index=er_graph(n, 0.4, seed=n), num_nodes=n))
                                  for n in (6, 13, 1, 9)])
    lay, full, half = both_joins(GRFLoads.from_data(b))
    assert half.src is not None and half.stats.size(0) < full.stats.size(0)
    assert torch.equal(full.cell, half.cell)
    assert torch.allclose(full.cell_stats(), half.cell_stats(), atol=1e-13)
    coef = torch.rand(2, full.num_coef, dtype=D)
    assert torch.allclose(full.values(coef), half.values(coef), atol=1e-13)


def test_statistics_give_phi_phi_t_with_folded_hop_ids():
    # M_ij = sum_{l <= l'} f_l f_l' S_ij^{(l, l')} against a dense Phi Phi^T
    t = AddGraphRandomFeatures(num_walks=4, p_halt=0.3, max_length=2, seed=3)
    g = t(Data(edge_index=er_graph(8, 0.5, seed=1), num_nodes=8))
    grf = GRFLoads.from_data(g)
    f = torch.tensor([0.7, -0.4, 1.3], dtype=D)
    idx = g.grf_index.long()
    phi = torch.zeros(8, 8, dtype=D).index_put((idx[0], idx[1]),
                                               f[g.grf_length.long()] * g.grf_load.to(D),
                                               accumulate=True)
    terms = grf.block_terms(True)
    K = 3
    iu = torch.triu_indices(K, K)
    M = torch.zeros(64, dtype=D)
    M[terms.cell] = terms.values((f[iu[0]] * f[iu[1]]).unsqueeze(0))[0]
    assert torch.allclose(M.view(8, 8), phi @ phi.T, atol=1e-12)
    ids = symmetric_ids(K)
    assert torch.equal(ids, ids.T) and sorted(ids.unique().tolist()) == list(range(6))
