"""packed_linear_attention (unmasked linear attention per graph by batched products on padded
blocks) and the packing layout behind it, against per-graph dense attention written with
explicit loops in float64."""
import pytest
import torch

from pyg_grf.masks import PackingMask
from pyg_grf.masks.packing import packing_layout
from pyg_grf.nn.functional import masked_linear_attention, packed_linear_attention

D = torch.float64


def loop_reference(phi_q, phi_k, v, batch, eps=1e-6):
    """out_i = sum_{j in g(i)} (phi_q_i . phi_k_j) v_j / (sum_{j in g(i)} phi_q_i . phi_k_j + eps),
    one graph and one head at a time, with the attention matrix formed explicitly."""
    N, H, _ = phi_q.shape
    out = torch.zeros(N, H, v.size(-1), dtype=v.dtype)
    for g in batch.unique().tolist():
        idx = (batch == g).nonzero().view(-1)
        for h in range(H):
            A = phi_q[idx, h] @ phi_k[idx, h].t()                       # [n, n]
            out[idx, h] = (A @ v[idx, h]) / (A.sum(-1, keepdim=True) + eps)
    return out


def inputs(N, H=2, m=3, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    phi_q = torch.rand(N, H, m, generator=gen, dtype=D)
    phi_k = torch.rand(N, H, m, generator=gen, dtype=D)
    v = torch.randn(N, H, d, generator=gen, dtype=D)
    return phi_q, phi_k, v


# sorted (PyG), unsorted, a graph id without nodes, one graph, and uneven sizes (buckets)
BATCHES = {
    'sorted': torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3]),
    'unsorted': torch.tensor([2, 0, 1, 2, 0, 3, 2, 1, 0, 2]),
    'gap': torch.tensor([0, 0, 2, 2, 2, 5, 5, 5, 5, 5]),
    'one_graph': torch.zeros(10, dtype=torch.long),
    'uneven': torch.cat([torch.zeros(40, dtype=torch.long),
                         torch.arange(1, 21).repeat_interleave(2)]),
    'uneven_unsorted': torch.cat([torch.zeros(40, dtype=torch.long),
                                  torch.arange(1, 21).repeat_interleave(2)])[
        torch.randperm(80, generator=torch.Generator().manual_seed(0))],
}


@pytest.mark.parametrize('name', list(BATCHES))
@pytest.mark.parametrize('eps', [1e-6, 0.5])
def test_equals_per_graph_loops(name, eps):
    batch = BATCHES[name]
    phi_q, phi_k, v = inputs(batch.numel())
    ref = loop_reference(phi_q, phi_k, v, batch, eps)
    out = packed_linear_attention(phi_q, phi_k, v, batch, eps=eps)
    assert out.shape == v.shape
    assert torch.allclose(out, ref, atol=1e-12, rtol=1e-10)
    # the same as the mask-operator path it replaces
    assert torch.allclose(out, masked_linear_attention(phi_q, phi_k, v, PackingMask(batch), eps),
                          atol=1e-12, rtol=1e-10)
    # the sums: numerator, then the normaliser
    sums = packed_linear_attention(phi_q, phi_k, v, batch, return_sums=True)
    assert sums.shape == (batch.numel(), 2, 5)
    assert torch.allclose(sums[..., :-1] / (sums[..., -1:] + eps), ref, atol=1e-12, rtol=1e-10)


def test_no_batch_is_one_graph_and_layout_can_be_passed():
    phi_q, phi_k, v = inputs(7)
    zeros = torch.zeros(7, dtype=torch.long)
    ref = loop_reference(phi_q, phi_k, v, zeros)
    assert torch.allclose(packed_linear_attention(phi_q, phi_k, v), ref, atol=1e-12)
    batch = BATCHES['unsorted']
    phi_q, phi_k, v = inputs(10, seed=1)
    lay = PackingMask(batch).layout()
    assert torch.equal(packed_linear_attention(phi_q, phi_k, v, layout=lay),
                       packed_linear_attention(phi_q, phi_k, v, batch))


def test_permutation_equivariant():
    batch = BATCHES['sorted']
    phi_q, phi_k, v = inputs(10, seed=2)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    out = packed_linear_attention(phi_q, phi_k, v, batch)
    out_p = packed_linear_attention(phi_q[perm], phi_k[perm], v[perm], batch[perm])
    assert torch.allclose(out_p, out[perm], atol=1e-12)


@pytest.mark.parametrize('name', ['unsorted', 'uneven_unsorted'])
def test_gradcheck(name):
    batch = BATCHES[name]
    if name == 'uneven_unsorted':  # a small instance of the bucketed layout
        batch = torch.tensor([0, 1, 0, 0, 2, 0, 0, 3, 0, 0])
        assert len(packing_layout(batch).buckets) > 1
    phi_q, phi_k, v = (t.requires_grad_() for t in inputs(batch.numel(), m=2, d=2, seed=4))
    assert torch.autograd.gradcheck(
        lambda a, b, c: packed_linear_attention(a, b, c, batch), (phi_q, phi_k, v))


def test_empty():
    out = packed_linear_attention(*inputs(0), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 2, 4)
    assert packed_linear_attention(*inputs(0)).shape == (0, 2, 4)


def test_bad_input():
    phi_q, phi_k, v = inputs(5)
    with pytest.raises(ValueError, match=r"'batch' must have shape \[5\]"):
        packed_linear_attention(phi_q, phi_k, v, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match='non-negative'):
        packed_linear_attention(phi_q, phi_k, v, torch.tensor([0, 0, -1, 1, 1]))
    with pytest.raises(TypeError, match='integer graph ids'):
        packing_layout(torch.zeros(5))
    with pytest.raises(ValueError, match='the same shape'):
        packed_linear_attention(phi_q, phi_k[:, :, :2], v)
    with pytest.raises(ValueError, match=r'\[N, H, d\]'):
        packed_linear_attention(phi_q, phi_k, v[:4])
    with pytest.raises(ValueError, match='places 10 nodes'):
        packed_linear_attention(phi_q, phi_k, v, layout=packing_layout(BATCHES['sorted']))


def test_layout_padding_is_bounded():
    # PyG batch of similar graphs: one bucket, padded to the largest (to_dense_batch's layout)
    lay = packing_layout(BATCHES['sorted'])
    assert lay.buckets == ((0, 4, 4),) and lay.num_rows == 16
    assert torch.equal(lay.pos, torch.tensor([0, 1, 2, 4, 5, 8, 9, 10, 11, 12]))
    # one big graph among many small ones: buckets by size, fewer than 2N rows, not B * n_max
    sizes = torch.tensor([1000] + [3] * 200 + [17, 33, 600])
    batch = torch.arange(sizes.numel()).repeat_interleave(sizes)
    lay = packing_layout(batch)
    N = batch.numel()
    assert lay.num_rows < 2 * N < sizes.numel() * 1000
    assert len(lay.buckets) == 4  # sizes 3, 17, 33, and 600 with 1000 (both in (512, 1024])
    assert lay.pos.unique().numel() == N and int(lay.pos.max()) < lay.num_rows
    # every graph's nodes sit in one block of its bucket
    for off, B, n in lay.buckets:
        inside = (lay.pos >= off) & (lay.pos < off + B * n)
        block = (lay.pos[inside] - off) // n
        graphs = batch[inside]
        assert all(graphs[block == b].unique().numel() == 1 for b in block.unique())
    phi_q, phi_k, v = inputs(N, H=1, m=2, d=2, seed=5)
    assert torch.allclose(packed_linear_attention(phi_q, phi_k, v, batch, layout=lay),
                          loop_reference(phi_q, phi_k, v, batch), atol=1e-12)


def test_packing_mask_matmul_and_layout():
    batch = BATCHES['gap']
    mask = PackingMask(batch)
    x = torch.randn(10, 3, dtype=D)
    assert torch.allclose(mask.matmul(x), mask.to_dense().to(D) @ x)
    assert mask.layout() is mask.layout()  # computed once
