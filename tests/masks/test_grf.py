import pytest
import torch

from pyg_grf.features import GRFLoads, grf_loads
from pyg_grf.masks import GRFMask
from tests.nn.attention.grf.helpers import make_batch
from tests.utils import er_graph, grid_graph

D = torch.float64


def dense_phi(index, length, load, f, N):
    """Independent dense build: Phi[i, q] = sum_l f[l] * load(i, q, l)."""
    out = torch.zeros(N, N, dtype=D)
    keep = length < f.numel()
    value = f[length[keep].long()] * load[keep].to(D)
    return out.index_put((index[0, keep], index[1, keep]), value, accumulate=True)


@pytest.fixture
def loads():
    ei = er_graph(15, 0.25, seed=0)
    g = torch.Generator().manual_seed(0)
    return grf_loads(ei, 15, 5, 0.4, 4, generator=g, dtype=D) + (15,)


def test_from_loads_symmetric_asymmetric_per_head(loads):
    index, length, load, N = loads
    f = torch.randn(3, 5, dtype=D)
    x = torch.randn(N, 3, 4, dtype=D)
    phis = [dense_phi(index, length, load, f[h], N) for h in range(3)]
    sym = GRFMask.from_loads(index, length, load, f, N)
    asym = GRFMask.from_loads(index, length, load, f, N, asymmetric=True)
    for h in range(3):
        assert torch.allclose(sym.to_dense()[h], phis[h] @ phis[h].T)
        assert torch.allclose(asym.to_dense()[h], phis[h])
        assert torch.allclose(sym.matmul(x)[:, h], phis[h] @ phis[h].T @ x[:, h])
        assert torch.allclose(asym.matmul(x)[:, h], phis[h] @ x[:, h])


def test_shorter_f_than_the_loads_raises(loads):
    # Entries with hop counts beyond f would silently vanish from the mask: refuse instead.
    index, length, load, N = loads
    f = torch.tensor([1.0, 0.5], dtype=D)
    with pytest.raises(ValueError, match='hop counts up to 4 but f has coefficients only up '
                                         'to hop 1'):
        GRFMask.from_loads(index, length, load, f, N)


def test_from_sparse_and_independent_keys(loads):
    index, length, load, N = loads
    f = torch.tensor([1.0, 0.4, 0.3, 0.2, 0.1], dtype=D)
    phi = dense_phi(index, length, load, f, N)
    key = torch.rand(N, N, dtype=D) * (torch.rand(N, N) < 0.2)
    x = torch.randn(N, 6, dtype=D)
    m = GRFMask(phi.to_sparse(), key_phi=key.to_sparse_csr())
    assert torch.allclose(m.matmul(x), phi @ key.T @ x)
    heads = GRFMask([phi.to_sparse(), key.to_sparse()])
    xh = torch.randn(N, 2, 3, dtype=D)
    assert torch.allclose(heads.matmul(xh)[:, 1], key @ key.T @ xh[:, 1])
    assert torch.allclose(heads.to_dense()[0], phi @ phi.T)


def test_gradients_reach_f(loads):
    index, length, load, N = loads
    f = torch.rand(2, 5, dtype=D, requires_grad=True)
    x = torch.randn(N, 2, 3, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda f, x: GRFMask.from_loads(index, length, load, f, N).matmul(x), (f, x))


def test_block_diagonal_on_disconnected_graphs():
    # two components: walks never cross, so the mask is exactly zero across them
    ei = torch.cat([grid_graph(2, 3), grid_graph(3, 2) + 6], 1)
    index, length, load = grf_loads(ei, 12, 8, 0.3, 4, generator=torch.Generator().manual_seed(1))
    M = GRFMask.from_loads(index, length, load, torch.ones(5), 12).to_dense()
    assert bool((M[:6, 6:] == 0).all()) and bool((M[6:, :6] == 0).all())


def test_bad_input(loads):
    index, length, load, N = loads
    f = torch.ones(5)
    with pytest.raises(ValueError, match='one per entry'):
        GRFMask.from_loads(index, length[:-1], load, f, N)
    with pytest.raises(ValueError, match=r'node ids in \[0, 3\), got ids in \[0, 14\]'):
        GRFMask.from_loads(index, length, load, f, 3)
    with pytest.raises(ValueError, match='square'):
        GRFMask(torch.zeros(3, 4).to_sparse())
    with pytest.raises(ValueError, match='one-hot key'):
        GRFMask(torch.eye(3).to_sparse(), key_phi=torch.eye(3).to_sparse(), asymmetric=True)
    with pytest.raises(ValueError, match='covers 15 nodes'):
        GRFMask.from_loads(index, length, load, f, N).matmul(torch.randn(4, 2))


def test_grf_mask_operator_per_head_equals_dense():
    from pyg_grf.masks import GRFMask
    b = make_batch(key=True)
    f = torch.rand(3, 4, dtype=D) + 0.1
    grf = GRFLoads.from_data(b, key_prefix='grf_key')
    M = GRFMask.from_loads(grf, f=f)
    x = torch.randn(b.num_nodes, 3, 5, dtype=D)
    dense = torch.stack([dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], b.num_nodes)
                         @ dense_phi(b.grf_key_index, b.grf_key_length, b.grf_key_load, f[h],
                                     b.num_nodes).T for h in range(3)])
    assert torch.allclose(M.to_dense(), dense)
    assert torch.allclose(M.matmul(x), torch.einsum('hij,jhc->ihc', dense, x))
