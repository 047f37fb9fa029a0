import pytest
import torch

from pyg_grf.ops import SparsePattern, csr_mm, head_spmm


@pytest.mark.parametrize('sorted_index', [True, False])
@pytest.mark.parametrize('transpose', [False, True])
def test_head_spmm_equals_dense_per_head(sorted_index, transpose):
    gen = torch.Generator().manual_seed(0)
    R, S, H, C = 5, 4, 3, 2
    index = torch.tensor([[0, 0, 1, 3, 3, 4, 4], [1, 3, 0, 2, 2, 0, 3]])  # a duplicate (3, 2)
    if not sorted_index:
        index = index[:, torch.randperm(index.size(1), generator=gen)]
    values = torch.randn(H, index.size(1), generator=gen, dtype=torch.float64,
                         requires_grad=True)
    x = torch.randn(R if transpose else S, H, C, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    out = head_spmm(SparsePattern(index, (R, S)), values, x, transpose=transpose)
    # independent reference: a dense [R, S] matrix per head (duplicates summed)
    dense = torch.zeros(H, R, S, dtype=torch.float64).index_put(
        (torch.arange(H).view(-1, 1), index[0].view(1, -1), index[1].view(1, -1)), values,
        accumulate=True)
    if transpose:
        dense = dense.transpose(1, 2)
    expected = torch.einsum('hrs,shc->rhc', dense, x)
    assert out.shape == expected.shape
    assert torch.allclose(out, expected)
    g_out = torch.autograd.grad(out.square().sum(), (values, x))
    g_ref = torch.autograd.grad(expected.square().sum(), (values, x))
    assert all(torch.allclose(a, b) for a, b in zip(g_out, g_ref))


def test_head_spmm_bad_shape():
    pattern = SparsePattern(torch.tensor([[0, 1], [1, 0]]), (2, 2))
    with pytest.raises(ValueError, match=r"'x' must have shape \[rows, 3, C\]"):
        head_spmm(pattern, torch.ones(3, 2), torch.ones(2, 2, 4))


def test_repeat_transpose_equals_direct_sort():
    # The repeat's transpose is derived from the block's (one small sort); it must equal the
    # transpose computed by sorting the repeated pattern's own keys.
    gen = torch.Generator().manual_seed(1)
    R, S, H = 6, 5, 4
    index = torch.stack([torch.randint(R, (20, ), generator=gen),
                         torch.randint(S, (20, ), generator=gen)])  # duplicates included
    rep = SparsePattern(index, (R, S)).repeat(H)
    direct = SparsePattern(torch.stack([rep.row, rep.col]), rep.size)
    assert direct._block_of is None
    for a, b in zip(rep._transpose(), direct._transpose()):
        assert torch.equal(a, b)


def test_pattern_from_a_strided_index_equals_the_dense_matrix():
    # torch's COO -> CSR conversion misreads a strided row vector: the pattern copies it first
    from pyg_grf.ops import SparsePattern, spmm
    index = torch.tensor([[0, 0, 1, 2, 2], [1, 2, 0, 0, 2]])
    strided = index.t().contiguous().t()
    assert not strided[0].is_contiguous()
    values = torch.arange(1., 6., dtype=torch.float64)
    dense = torch.zeros(3, 3, dtype=torch.float64).index_put((index[0], index[1]), values)
    pattern = SparsePattern(strided, (3, 3))
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(spmm(pattern, values, x), dense @ x)
    assert torch.allclose(spmm(pattern, values, x, transpose=True), dense.t() @ x)


DEVICES = ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='no CUDA device')])]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('index_dtype', [torch.int32, torch.int64])
@pytest.mark.parametrize('density', [0.0, 0.05, 0.5])
def test_beta_zero_addmm_never_reads_its_result(device, index_dtype, density):
    # what csr_mm relies on: a CSR addmm with beta=0 into a NaN-filled result equals the dense
    # product (the result's old contents never reach it), for empty and non-empty matrices
    gen = torch.Generator().manual_seed(1)
    dense = torch.rand(40, 30, generator=gen) * (torch.rand(40, 30, generator=gen) < density)
    x = torch.randn(30, 9, generator=gen)
    csr = dense.to_sparse_csr()
    a = torch.sparse_csr_tensor(csr.crow_indices().to(index_dtype),
                                csr.col_indices().to(index_dtype), csr.values(), (40, 30))
    a, x, dense = a.to(device), x.to(device), dense.to(device)
    out = torch.full((40, 9), float('nan'), device=device)
    torch.addmm(out, a, x, beta=0.0, out=out)
    torch.testing.assert_close(out, dense @ x)


@pytest.mark.parametrize('device', DEVICES)
def test_csr_mm_equals_dense(device):
    gen = torch.Generator().manual_seed(2)
    dense = torch.randn(50, 20, generator=gen) * (torch.rand(50, 20, generator=gen) < 0.2)
    x = torch.randn(20, 7, generator=gen, dtype=torch.float64)
    a, x = dense.double().to_sparse_csr().to(device), x.to(device)
    torch.testing.assert_close(csr_mm(a, x), dense.double().to(device) @ x)
    torch.testing.assert_close(csr_mm(a, x.t().contiguous().t()), dense.double().to(device) @ x)


def test_pattern_refuses_bad_indices():
    with pytest.raises(ValueError, match=r"Expected 'index' of shape \[2, nnz\]"):
        SparsePattern(torch.tensor([0, 1]), (2, 2))
    with pytest.raises(ValueError, match=r"row indices of 'index' must hold node ids in \[0, 2\)"):
        SparsePattern(torch.tensor([[0, 2], [1, 0]]), (2, 3))
    with pytest.raises(ValueError, match=r"column indices .* refers to node -1"):
        SparsePattern(torch.tensor([[0, 1], [-1, 0]]), (2, 2))
