"""The join behind the symmetric mask statistics: the half join of the entries with themselves
(each unordered pair once, then mirrored) against the full join of two sides, on a batch and on
one big graph (whose N^2 cells take the sorting path), and against Phi Phi^T formed densely."""
import os
import warnings

import pytest
import torch
from torch_geometric.data import Batch, Data

from pyg_grf.features import GRFLoads
from pyg_grf.features.blocks import (
    block_coords,
    block_layout,
    join_terms,
    mask_statistics,
    self_join_terms,
    symmetric_ids,
)
from pyg_grf.features.join import compiled_join, compiled_join_available
from pyg_grf.transforms import AddGraphRandomFeatures
from tests.nn.attention.grf.helpers import dense_phi
from tests.utils import er_graph, path_graph

D = torch.float64


def both_joins(grf):
    lay = block_layout(grf.batch, grf.num_nodes)
    prow, _ = block_coords(lay, grf.index)
    hop, load = grf.hop.long(), grf.load.to(D)
    K = grf.max_hop + 1
    full = join_terms(lay, prow, grf.index[1], hop, load, prow, grf.index[1], hop, load, K,
                      grf.num_nodes)
    half = self_join_terms(lay, prow, grf.index[1], hop, load, K, grf.num_nodes)
    return lay, full, half


def cell_stats(terms):  # [P, num_coef]: the statistics of every cell
    return terms.stats if terms.src is None else terms.stats[terms.src]


def cell_values(terms, coef):  # [h, P]: the mask values of coefficient rows coef on the cells
    return coef @ cell_stats(terms).t()


def _stats(loads, dtype=D):  # the symmetric statistics, with the block cells of every cell
    lay = block_layout(loads.batch, loads.num_nodes)
    terms = mask_statistics(loads, lay, True, dtype)
    if terms.index is None:  # the torch join
        return terms
    return terms._replace(cell=cells_of(lay, *(i.long() for i in terms.index)))  # compiled


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
    assert torch.allclose(cell_stats(full), cell_stats(half), atol=1e-13)
    # the half join's mirror: the transpose's order of the cells
    n = lay.n
    b, r, c = half.cell // (n * n), (half.cell // n) % n, half.cell % n
    assert torch.equal(half.mirror, torch.argsort((b * n + c) * n + r))
    coef = torch.rand(2, full.stats.size(1), dtype=D)
    assert torch.allclose(cell_values(full, coef), cell_values(half, coef), atol=1e-13)


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
    terms = _stats(grf)
    K = 3
    iu = torch.triu_indices(K, K)
    M = torch.zeros(64, dtype=D)
    M[terms.cell] = cell_values(terms, (f[iu[0]] * f[iu[1]]).unsqueeze(0))[0]
    assert torch.allclose(M.view(8, 8), phi @ phi.T, atol=1e-12)
    ids = symmetric_ids(K)
    assert torch.equal(ids, ids.T) and sorted(ids.unique().tolist()) == list(range(6))


# The compiled join (features/join.py, numba) against the torch join ##########################

needs_numba = pytest.mark.skipif(not compiled_join_available(),
                                 reason='numba is not installed (or PYG_GRF_NUMBA=0)')


def batch_of(seed, sizes=(6, 13, 1, 9), **kw):
    t = AddGraphRandomFeatures(num_walks=3, p_halt=0.5, max_length=3, seed=seed, **kw)
    return Batch.from_data_list([t(Data(edge_index=er_graph(n, 0.4, seed=n), num_nodes=n))
                                 for n in sizes])


def cells_of(lay, row, col):
    return lay.pos[row] * lay.n + lay.pos[col] % lay.n


@needs_numba
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('graph', ['batch', 'big', 'hub'])
def test_compiled_self_join_equals_torch_join(dtype, graph):
    t = AddGraphRandomFeatures(num_walks=3, p_halt=0.5, max_length=3, seed=0)
    if graph == 'big':  # one graph whose N^2 cells would need the torch path's sort
        b = Batch.from_data_list([t(Data(edge_index=path_graph(4100), num_nodes=4100))])
    elif graph == 'hub':  # a star: rows of ~100 cells (the long-row sort), beside a batch
        leaves = torch.arange(1, 101)
        star = torch.stack([torch.cat([leaves * 0, leaves]), torch.cat([leaves, leaves * 0])])
        b = Batch.from_data_list([t(Data(edge_index=star, num_nodes=101)),
                                  t(Data(edge_index=er_graph(9, 0.4, seed=9), num_nodes=9))])
    else:
        b = batch_of(0)
    grf = GRFLoads.from_data(b)
    lay, full, _ = both_joins(grf)
    K = grf.max_hop + 1
    row, col, stats, src, mirror = compiled_join(grf.index, grf.hop, grf.load.to(dtype), None,
                                                 None, None, K, grf.num_nodes)
    assert stats.dtype == dtype and src is not None and stats.size(0) < src.numel()
    assert torch.equal(cells_of(lay, row, col), full.cell)  # same cells, row-major
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(stats[src].to(D), cell_stats(full), atol=tol)
    # mirror: the position of (j, i), i.e. the transpose's order (a sort of the keys)
    assert torch.equal(mirror, torch.argsort(col * grf.num_nodes + row))


@needs_numba
def test_compiled_join_of_two_walk_sets_and_unsorted_entries():
    b, bk = batch_of(1), batch_of(2)
    q, k = GRFLoads.from_data(b), GRFLoads.from_data(bk)
    lay = block_layout(q.batch, q.num_nodes)
    K = max(q.max_hop, k.max_hop) + 1
    full = join_terms(lay, block_coords(lay, q.index)[0], q.index[1], q.hop.long(),
                      q.load.to(D), block_coords(lay, k.index)[0], k.index[1], k.hop.long(),
                      k.load.to(D), K, q.num_nodes)
    perm = torch.randperm(q.nnz, generator=torch.Generator().manual_seed(0))  # any order
    kperm = torch.randperm(k.nnz, generator=torch.Generator().manual_seed(1))
    row, col, stats, src, mirror = compiled_join(
        q.index[:, perm], q.hop[perm], q.load.to(D)[perm], k.index[:, kperm], k.hop[kperm],
        k.load.to(D)[kperm], K, q.num_nodes)
    assert src is None and mirror is None
    assert torch.equal(cells_of(lay, row, col), full.cell)
    assert torch.allclose(stats, cell_stats(full), atol=1e-12)
    # the self join is also order-free
    _, self_full, _ = both_joins(q)
    row, col, stats, src, _ = compiled_join(q.index[:, perm], q.hop[perm],
                                            q.load.to(D)[perm], None, None, None,
                                            q.max_hop + 1, q.num_nodes)
    assert torch.equal(cells_of(lay, row, col), self_full.cell)
    assert torch.allclose(stats[src], cell_stats(self_full), atol=1e-12)


@needs_numba
def test_block_terms_take_the_compiled_join_unless_disabled(monkeypatch):
    b = batch_of(3)
    with_numba = _stats(GRFLoads.from_data(b))
    assert with_numba.src is not None
    from pyg_grf.nn.attention.grf import pairs
    pattern = pairs.build(GRFLoads.from_data(b), 'symmetric', D)
    monkeypatch.setenv('PYG_GRF_NUMBA', '0')
    assert not compiled_join_available()
    torch_loads = GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes, batch=b.batch)
    torch_terms = _stats(torch_loads)
    assert with_numba.index is not None and torch_terms.index is None
    torch_pattern = pairs.build(torch_loads, 'symmetric', D)
    for name in ('crow', 'col', 'tperm', 'src'):  # the engine's CSR and its mirror
        assert torch.equal(getattr(pattern, name), getattr(torch_pattern, name)), name
    # the mirror is the transpose's order, as a sort of the transposed keys gives it
    row = torch.repeat_interleave(torch.arange(pattern.num_nodes), pattern.crow.long().diff())
    col = pattern.col.long()
    order = torch.argsort(col * pattern.num_nodes + row)
    assert torch.equal(pattern.tperm.long(), order)
    assert torch.equal(with_numba.cell, torch_terms.cell)
    assert torch.equal(with_numba.mirror, torch_terms.mirror)
    assert torch.allclose(cell_stats(with_numba), cell_stats(torch_terms), atol=1e-12)
    assert not compiled_join_available(torch.device('meta'))


@needs_numba
def test_compiled_join_stops_at_max_cells():
    from pyg_grf.features.join import JoinMemoryError
    grf = GRFLoads.from_data(batch_of(4))
    full = compiled_join(grf.index, grf.hop, grf.load.to(D), None, None, None,
                         grf.max_hop + 1, grf.num_nodes)
    P = full.stats.size(0)  # stored (upper-triangle) cells
    exact = compiled_join(grf.index, grf.hop, grf.load.to(D), None, None, None,
                          grf.max_hop + 1, grf.num_nodes, max_cells=P)
    assert torch.equal(exact.stats, full.stats)
    for cap in (P - 1, 0):
        with pytest.raises(JoinMemoryError, match=f'more than max_cells={cap} cells'):
            compiled_join(grf.index, grf.hop, grf.load.to(D), None, None, None,
                          grf.max_hop + 1, grf.num_nodes, max_cells=cap)


@needs_numba
def test_a_compiled_join_that_cannot_run_falls_back_to_the_torch_join(monkeypatch):
    # e.g. a numba that does not match numpy: warned once, then the torch join, same result
    from pyg_grf.features import join
    b = batch_of(5)
    expected = _stats(GRFLoads.from_data(b))  # compiled, works
    monkeypatch.setattr(join, '_state', {'ran': False, 'broken': None})

    def broken(*args):
        raise RuntimeError('LLVM ERROR: cannot select')
    monkeypatch.setattr(join, '_join', broken)
    fresh = lambda: GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes,  # noqa: E731
                             batch=b.batch)
    with pytest.warns(RuntimeWarning, match='cannot run here .*LLVM ERROR'):
        got = _stats(fresh())
    assert torch.equal(got.cell, expected.cell)
    assert torch.allclose(cell_stats(got), cell_stats(expected), atol=1e-12)
    assert not compiled_join_available()
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # warned once only: the torch join from now on
        assert torch.equal(_stats(fresh()).cell, expected.cell)
    # once the kernels have run, an error is a real one and propagates
    monkeypatch.setattr(join, '_state', {'ran': True, 'broken': None})
    with pytest.raises(RuntimeError, match='LLVM ERROR'):
        _stats(fresh())


# Bad input, memory and the first compilation ##################################################

def _entries():
    index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 2]])
    return index, torch.tensor([0, 1, 1, 2]), torch.tensor([1., 0.5, 0.25, 2.], dtype=D)


@needs_numba
@pytest.mark.parametrize('side', ['query', 'key'])
@pytest.mark.parametrize('edit, match', [
    (lambda i, h, w: (i.index_put((torch.tensor(1), torch.tensor(0)), torch.tensor(3)), h, w),
     r"'{}index' must hold node ids in \[0, 3\), got ids in \[0, 3\]"),
    (lambda i, h, w: (i.index_put((torch.tensor(0), torch.tensor(2)), torch.tensor(-1)), h, w),
     r"'{}index' must hold node ids in \[0, 3\), got ids in \[-1, 2\]"),
    (lambda i, h, w: (i, h + 1, w), r"'{}hop' must hold hop counts in \[0, 3\) \(K=3\), got "
                                    r"\[1, 3\]"),
    (lambda i, h, w: (i, h[:3], w), r"'{}hop' and '{}load' need one value per entry"),
    (lambda i, h, w: (i[:1], h, w), r"'{}index' must be \[2, nnz\], got \[1, 4\]"),
])
def test_compiled_join_refuses_entries_it_would_read_out_of_bounds(side, edit, match):
    # the kernels index arrays by these ids unchecked: without the check, a segfault
    good = _entries()
    bad = edit(*_entries())
    prefix = '' if side == 'query' else 'key_'
    args = (*bad, None, None, None) if side == 'query' else (*good, *bad)
    with pytest.raises(ValueError, match=match.format(prefix, prefix)):
        compiled_join(*args, 3, 3)
    assert compiled_join_available()  # a bad input is not a broken numba


@needs_numba
def test_compiled_join_checks_num_nodes_and_k():
    with pytest.raises(ValueError, match="'num_nodes' must be a non-negative int, got -1"):
        compiled_join(*_entries(), None, None, None, 3, -1)
    with pytest.raises(ValueError, match="'K' must be a positive int, got 0"):
        compiled_join(*_entries(), None, None, None, 0, 3)


@needs_numba
def test_running_out_of_memory_in_the_join_is_a_memory_error_and_keeps_it_on(monkeypatch):
    from pyg_grf.features import join
    from pyg_grf.features.join import JoinMemoryError
    monkeypatch.setattr(join, '_state', {'ran': False, 'broken': None, 'uncached': None,
                                         'said': True})

    def oom(*args):
        raise MemoryError('Allocation failed (probably too large).')
    monkeypatch.setattr(join, '_join', oom)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no "cannot run here" warning
        with pytest.raises(JoinMemoryError, match=r'ran out of memory \(Allocation failed.*on 4 '
                                                  r"entries of 3 nodes; use another backend"):
            compiled_join(*_entries(), None, None, None, 3, 3)
    assert compiled_join_available()  # not switched off for the process


@needs_numba
def test_the_first_compilation_is_announced_once(monkeypatch, caplog):
    import logging

    from pyg_grf.features import join
    monkeypatch.setattr(join, '_state', {'ran': False, 'broken': None, 'uncached': None})
    monkeypatch.setattr(join, '_cached_on_disk', lambda: False)  # a fresh install
    with caplog.at_level(logging.INFO, logger='pyg_grf.features.join'):
        first = compiled_join(*_entries(), None, None, None, 3, 3)
        compiled_join(*_entries(), None, None, None, 3, 3)
    lines = [r.getMessage() for r in caplog.records if r.name == 'pyg_grf.features.join']
    assert len(lines) == 1, lines
    assert lines[0].startswith('Compiling the GRF join with numba (first use') \
        and 'for later runs' in lines[0]
    assert torch.equal(first.row, torch.tensor([0, 1, 1, 2, 2]))  # pairs sharing a node


def test_the_numba_cache_folder_is_the_users_never_the_package(monkeypatch, tmp_path):
    import types

    from pyg_grf.features import join
    # $NUMBA_CACHE_DIR (numba reads it into numba.config at import) first
    numba = types.SimpleNamespace(config=types.SimpleNamespace(CACHE_DIR=str(tmp_path / 'n')))
    monkeypatch.setattr(join, 'numba', numba)
    assert join.numba_cache_dir() == str(tmp_path / 'n')
    # then the XDG user cache, then ~/.cache
    numba.config.CACHE_DIR = ''
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert join.numba_cache_dir() == str(tmp_path / 'xdg' / 'pyg_grf' / 'numba')
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert join.numba_cache_dir() == str(tmp_path / 'home' / '.cache' / 'pyg_grf' / 'numba')


@needs_numba
def test_kernels_are_cached_in_the_user_folder(monkeypatch, caplog, tmp_path):
    # the folder of numba_cache_dir() at import (this process's $NUMBA_CACHE_DIR or user cache),
    # not the package's __pycache__; where it is not writable, the kernels compile uncached
    # (numba would fall back to the package) and the line says so
    import logging

    import pyg_grf
    from pyg_grf.features import join
    package = os.path.dirname(os.path.abspath(pyg_grf.__file__))
    for kernel in (join._counting_sort, join._join, join._gustavson, join._mirror):
        path = os.path.abspath(kernel._cache._cache_path)
        assert path.startswith(os.path.abspath(join.numba_cache_dir()) + os.sep), path
        assert not path.startswith(package + os.sep), path
        assert os.access(path, os.W_OK)

    blocked = tmp_path / 'a file'
    blocked.write_text('')  # a folder below a file cannot be made, even by root
    monkeypatch.setattr(join, 'numba_cache_dir', lambda: str(blocked / 'numba'))
    state = {'ran': False, 'broken': None, 'uncached': None}
    monkeypatch.setattr(join, '_state', state)
    kernel = join._jit(lambda x: x + 1)
    assert kernel(1) == 2 and kernel._cache.__class__.__name__ == 'NullCache'
    assert str(blocked / 'numba') in state['uncached']

    monkeypatch.setattr(join, 'numba_cache_dir', lambda: str(tmp_path / 'writable'))

    class NoCacheNumba:
        config = join.numba.config

        @staticmethod
        def njit(cache=False, **kwargs):
            if cache:
                raise RuntimeError("cannot cache function '_f': no locator available")
            return lambda f: f
    monkeypatch.setattr(join, 'numba', NoCacheNumba)
    state = {'ran': False, 'broken': None, 'uncached': None}
    monkeypatch.setattr(join, '_state', state)
    assert join._jit(len) is len
    assert 'no locator available' in state['uncached']
    monkeypatch.setattr(join, '_cached_on_disk', lambda: False)
    with caplog.at_level(logging.INFO, logger='pyg_grf.features.join'):
        join._say_if_compiling()
    assert 'not cached: no writable cache folder' in caplog.text
    assert 'set NUMBA_CACHE_DIR' in caplog.text


@needs_numba
@pytest.mark.slow
def test_a_second_process_loads_the_compiled_join_from_the_cache(tmp_path):
    import subprocess
    import sys
    code = ('import logging, torch; logging.basicConfig(level=logging.INFO); '
            'from pyg_grf.features.join import compiled_join; '
            'compiled_join(torch.tensor([[0, 1], [1, 0]]), torch.tensor([0, 1]), '
            'torch.ones(2, dtype=torch.float64), None, None, None, 2, 2)')
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert 'Compiling the GRF join' in runs[0].stderr
    assert 'Compiling the GRF join' not in runs[1].stderr
    assert list(tmp_path.rglob('*.nbi'))


def blocks_from_values(values, cell, layout):
    r"""Dense ``[B, H, n, n]`` blocks (zero elsewhere) holding ``values`` ``[H, P]`` on the
    flat cells ``cell`` ``[P]`` of the ``[B, n, n]`` layout; differentiable in ``values``."""
    B, n = layout.num_graphs, layout.n
    H = values.size(0)
    out = values.new_zeros(B, n * n, H)
    out = out.index_put((cell // (n * n), cell % (n * n)), values.t())
    return out.permute(0, 2, 1).reshape(B, H, n, n)


@pytest.mark.parametrize('shuffle', [False, True])
def test_symmetric_mask_statistics_equal_dense_phi_phi_t(shuffle):
    # the join behind the mask statistics against Phi Phi^T formed densely, also for entries
    # in arbitrary order
    t = AddGraphRandomFeatures(num_walks=6, p_halt=0.3, max_length=3, seed=1)
    b = Batch.from_data_list([t(Data(edge_index=er_graph(n, 0.3, seed=n), num_nodes=n))
                              for n in (7, 12, 3, 9)])
    idx, hop, load = b.grf_index, b.grf_length, b.grf_load
    if shuffle:
        perm = torch.randperm(idx.size(1), generator=torch.Generator().manual_seed(0))
        idx, hop, load = idx[:, perm], hop[perm], load[perm]
    from pyg_grf.nn.attention.grf.pairs import coefficient_pairs
    grf = GRFLoads(idx, hop, load, b.num_nodes, batch=b.batch)
    f = torch.rand(3, 4, dtype=D) + 0.1
    lay = block_layout(grf.batch, grf.num_nodes)
    terms = _stats(grf)
    assert terms.stats.size(1) == 10  # K (K + 1) / 2 for K = 4: (l, l') and (l', l) summed
    vals = cell_values(terms, coefficient_pairs(f, 10, True))  # [H, P]
    M = blocks_from_values(vals, terms.cell, lay)  # [B, H, n, n]
    N = b.num_nodes
    for h in range(3):
        phi = dense_phi(b.grf_index, b.grf_length, b.grf_load, f[h], N)
        dense = phi @ phi.T
        for g in range(4):
            nodes = (b.batch == g).nonzero().view(-1)
            k = nodes.numel()
            assert torch.allclose(M[g, h, :k, :k], dense[nodes][:, nodes], atol=1e-12)
            assert float(M[g, h, k:].abs().sum() + M[g, h, :, k:].abs().sum()) == 0


@needs_numba
@pytest.mark.parametrize('exact_above', [0, 2 ** 40])
def test_compiled_join_sized_exactly_or_grown_gives_the_same_statistics(exact_above,
                                                                        monkeypatch):
    # big inputs run a symbolic pass that sizes the output exactly; small ones start from a
    # guess and grow: both equal the torch join
    from pyg_grf.features import join
    monkeypatch.setattr(join, 'EXACT_ABOVE', exact_above)
    b = batch_of(3)
    loads = GRFLoads.from_data(b)
    with_numba = _stats(loads)
    monkeypatch.setenv('PYG_GRF_NUMBA', '0')
    torch_terms = _stats(GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes,
                                  batch=b.batch))
    assert torch.equal(with_numba.cell, torch_terms.cell)
    assert torch.allclose(cell_stats(with_numba), cell_stats(torch_terms), atol=1e-12)
    # max_cells stops the exact pass before it allocates
    with pytest.raises(join.JoinMemoryError):
        join.compiled_join(loads.index, loads.hop.long(), loads.load.double(), None, None, None,
                           loads.max_hop + 1, loads.num_nodes, max_cells=3)


@pytest.mark.parametrize('num_cells', [50, 10 ** 7])
def test_distinct_cells_by_marks_or_by_a_sort_equal_unique(num_cells):
    # a cell range small against the terms is marked and counted, a large one sorted: both
    # give torch.unique's sorted distinct cells and the slot of every term
    from pyg_grf.features.blocks import _distinct
    cell = torch.randint(0, num_cells, (400,), generator=torch.Generator().manual_seed(0))
    cells, slot = _distinct(cell, num_cells, cell.numel())
    ref, inv = torch.unique(cell, sorted=True, return_inverse=True)
    assert torch.equal(cells, ref) and torch.equal(slot, inv)
