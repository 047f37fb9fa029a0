import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.masks import GRFMask, PackingMask
from pyg_grf.nn.functional import masked_linear_attention
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.utils import er_graph, grid_graph, path_graph

D = torch.float64


def three_graph_batch():
    t = AddGraphRandomFeatures(num_walks=6, p_halt=0.4, max_length=3, seed=0)
    graphs = [Data(edge_index=grid_graph(3, 3), num_nodes=9),
              Data(edge_index=path_graph(5), num_nodes=5),
              Data(edge_index=er_graph(12, 0.3, seed=1), num_nodes=12)]
    return Batch.from_data_list([t(g) for g in graphs])


def dense_reference(phi_q, phi_k, v, M):
    """(phi_q phi_k^T ⊙ M) V, row-normalised, per head; M [H, N, N]."""
    A = torch.einsum('ihm,jhm->hij', phi_q, phi_k) * M
    return torch.einsum('hij,jhd->ihd', A, v) / A.sum(-1).t().unsqueeze(-1)


def test_grf_fast_path_equals_dense_on_a_batch():
    b = three_graph_batch()
    N, H, m, d = b.num_nodes, 2, 4, 3
    f = torch.rand(H, 4, dtype=D) + 0.1
    phi_q, phi_k = torch.rand(N, H, m, dtype=D), torch.rand(N, H, m, dtype=D)
    v = torch.randn(N, H, d, dtype=D)
    mask = GRFMask.from_loads(b.grf_index, b.grf_length, b.grf_load, f, N)
    M = mask.to_dense()
    out = masked_linear_attention(phi_q, phi_k, v, mask, eps=0.0)
    assert torch.allclose(out, dense_reference(phi_q, phi_k, v, M), atol=1e-6, rtol=0)
    # cross-graph entries of the mask are exactly zero ...
    same = b.batch[:, None] == b.batch[None, :]
    assert bool((M[:, ~same] == 0).all())
    # ... so changing another graph's inputs leaves a graph's outputs unchanged
    v2 = v.clone()
    v2[b.batch == 2] += 100.0
    out2 = masked_linear_attention(phi_q, phi_k, v2, mask, eps=0.0)
    assert torch.equal(out[b.batch != 2], out2[b.batch != 2])


def test_unmasked_and_packing():
    N, H = 7, 2
    phi_q, phi_k = torch.rand(N, H, 3, dtype=D), torch.rand(N, H, 3, dtype=D)
    v = torch.randn(N, H, 4, dtype=D)
    out = masked_linear_attention(phi_q, phi_k, v, None, eps=0.0)
    assert torch.allclose(out, dense_reference(phi_q, phi_k, v, torch.ones(H, N, N, dtype=D)))
    batch = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    out = masked_linear_attention(phi_q, phi_k, v, PackingMask(batch), eps=0.0)
    M = (batch[:, None] == batch[None, :]).to(D).expand(H, N, N)
    assert torch.allclose(out, dense_reference(phi_q, phi_k, v, M))


def test_bad_shapes():
    with pytest.raises(ValueError, match='same shape'):
        masked_linear_attention(torch.rand(4, 1, 3), torch.rand(4, 1, 2), torch.rand(4, 1, 2))
    with pytest.raises(ValueError, match=r'\[N, H, m\]'):
        masked_linear_attention(torch.rand(4, 3), torch.rand(4, 3), torch.rand(4, 2))
    with pytest.raises(ValueError, match='covers 3 nodes'):
        masked_linear_attention(torch.rand(4, 1, 3), torch.rand(4, 1, 3), torch.rand(4, 1, 2),
                                PackingMask(torch.zeros(3, dtype=torch.long)))


def test_pair_softmax_equals_dense():
    from pyg_grf.nn.functional import pair_scores, pair_softmax_attention
    from pyg_grf.ops import SparsePattern
    gen = torch.Generator().manual_seed(1)
    N, H, C = 6, 2, 4
    index = torch.tensor([[0, 0, 1, 2, 2, 2, 4, 5], [0, 3, 1, 0, 2, 5, 4, 1]])  # row 3 empty
    weight = torch.rand(H, index.size(1), generator=gen, dtype=torch.float64) + 0.1
    weight[1, 1] = 0.0  # a zero weight drops the pair
    q, k, v = (torch.randn(N, H, C, generator=gen, dtype=torch.float64) for _ in range(3))
    pattern = SparsePattern(index, (N, N))
    out = pair_softmax_attention(pattern, pair_scores(pattern, q, k), v, weight)
    # reference: a_ij = w_ij exp(s_ij) / sum_j' w_ij' exp(s_ij') with dense matrices
    W = torch.zeros(H, N, N, dtype=torch.float64)
    W[:, index[0], index[1]] = weight
    s = torch.einsum('ihc,jhc->hij', q, k) / C ** 0.5
    e = W * torch.exp(s)
    a = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    expected = torch.einsum('hij,jhc->ihc', a, v)
    assert torch.allclose(out, expected)
    assert torch.equal(out[3], torch.zeros(H, C, dtype=torch.float64))
