r"""``bench/gpu_check.py``, the prepared GPU run, in its CPU quick mode: every section
runs the code it runs on a GPU, at tiny sizes, and writes numbers, so the script cannot rot while
no GPU is at hand."""
import importlib.util
import json
import math

import pytest
import torch
from torch_geometric.utils import to_undirected

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location('gpu_check', REPO / 'bench' / 'gpu_check.py')
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

MEASURED = ('gps_step', 'knn', 'gkat', 'sync', 'profile', 'backends', 'op_count', 'pair_kernel')


def positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp('gpu_check')
    # every section must run to the end: the sections' time caps (sized for a GPU) ten times
    # over, as a CPU shared with other jobs (or the other pytest-xdist worker) can need; the
    # cap itself is tested by test_budget_and_bad_arguments
    with pytest.MonkeyPatch.context() as mp:
        caps = {name: 10 * cap for name, cap in gpu_check.CAPS.items()}
        mp.setattr(gpu_check, 'CAPS', caps)
        gpu_check.main(['--out', str(out), '--device', 'cpu', '--quick',
                        '--budget', str(sum(caps.values()))])
    return out, json.loads((out / 'gpu_check.json').read_text())


def test_every_section_ran(quick):
    out, R = quick
    assert R['sections_run'] == list(gpu_check.SECTIONS)
    for name in ('nvidia_smi', 'cuda_tests'):  # need a GPU
        assert R['sections'][name]['status'] == 'skipped'
        assert 'CUDA' in R['sections'][name]['reason']
    for name in MEASURED:
        s = R['sections'][name]
        assert s['status'] == 'ok', (name, s.get('error'), s.get('traceback'))
        assert s['rows'] and not any('error' in r for r in s['rows']), (name, s['rows'])
        assert json.loads((out / 'sections' / f'{name}.json').read_text()) == s
    md = (out / 'gpu_check.md').read_text()
    for heading in ('## Whole GPS training step', '## One attention layer on kNN graphs',
                    '## GKAT against GATConv', '## Host synchronisations inside one layer',
                    '## Where the device time goes', '## GRF backends',
                    '## Operators per training step', '## The pair kernel'):
        assert heading in md


def test_gps_step_columns_and_ratios(quick):
    rows = quick[1]['sections']['gps_step']['rows']
    cases = {(r['workload'], r['dtype'], r['column']) for r in rows}
    assert cases == {(w, d, c) for w in ('molecule', 'tu') for d in ('fp32', 'bf16 autocast')
                     for c in (gpu_check.MHA, gpu_check.PERF, gpu_check.GRF,
                               gpu_check.GRF_LOADER)}
    for r in rows:
        assert 'error' not in r, r
        assert positive(r['ms']) and r['ms_q1'] <= r['ms'] <= r['ms_q3'], r
        assert positive(r['ratio_vs_multihead']) and positive(r['ratio_vs_performer']), r
        if r['column'] == gpu_check.MHA:
            assert r['ratio_vs_multihead'] == 1.0


def test_knn_sizes_methods_and_ratios(quick):
    s = quick[1]['sections']['knn']
    assert {(r['nodes'], r['method']) for r in s['rows']} == {
        (n, m) for n in (64, 256) for m in ('performer', 'linear', 'grf')}
    for r in s['rows']:
        assert 'error' not in r, r
        assert positive(r['ms']) and positive(r['first_ms']), r
        assert positive(r['ratio_vs_performer']) and positive(r['ratio_vs_linear']), r
        assert r['peak_bytes'] is None  # torch.cuda.max_memory_allocated: CUDA only
    grf = [r for r in s['rows'] if r['method'] == 'grf']
    assert all(r['grf_entries'] > r['nodes'] for r in grf)
    assert s['largest_fit'] == {'performer': 256, 'linear': 256, 'grf': 256}
    assert s['stopped'] == {}


def test_gkat_against_gat(quick):
    rows = quick[1]['sections']['gkat']['rows']
    assert [r['layer'] for r in rows] == ['GATConv 8x8', 'GKAT softmax 8x8', 'GKAT linear 8x8']
    assert not any('error' in r for r in rows), rows
    assert all(positive(r['ms']) and positive(r['ratio_vs_gat']) for r in rows)
    assert rows[0]['ratio_vs_gat'] == 1.0


def test_sync_counts(quick):
    rows = quick[1]['sections']['sync']['rows']
    assert len(rows) == 9
    assert not any('dense' in r['layer'] for r in rows)
    for r in rows:
        assert 'error' not in r, r
        for call in ('first', 'second'):
            assert r[f'{call}_total'] == 0  # no CUDA: sync debug mode inactive, nothing warns
            assert r[f'{call}_forward'] == {'count': 0, 'where': {}}


def test_knn_graph_is_exact_away_from_the_border():
    side, k = 20, 8
    n = side * side
    ei = gpu_check.knn_graph(side, torch.device('cpu'), k=k)
    gen = torch.Generator().manual_seed(0)  # the same points, brute force
    ij = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing='ij'),
                     -1).reshape(n, 2)
    pos = ij.float() + (torch.rand(n, 2, generator=gen) - 0.5) * 0.6
    dist = torch.cdist(pos, pos).fill_diagonal_(float('inf'))
    nearest = dist.topk(k, largest=False).indices
    inner = ((ij >= 2) & (ij < side - 2)).all(1).nonzero().view(-1)
    ref = to_undirected(torch.stack([inner.repeat_interleave(k), nearest[inner].reshape(-1)]),
                        num_nodes=n)
    got = ei.edge_index[:, torch.isin(ei.edge_index[0], inner)]
    # every true neighbour of an inner point is found, and nothing else comes from inner rows
    got_pairs = set(map(tuple, got.t().tolist()))
    ref_pairs = {p for p in map(tuple, ref.t().tolist()) if p[0] in set(inner.tolist())}
    assert ref_pairs <= got_pairs
    assert ei.edge_index.size(1) == to_undirected(ei.edge_index, num_nodes=n).size(1)


def test_one_section_in_its_own_process(tmp_path, capsys):
    # a section run alone gets the whole budget (its child imports torch and may compile the
    # join on a loaded CPU), not its share of a full run
    gpu_check.main(['--out', str(tmp_path), '--device', 'cpu', '--quick', '--only', 'gkat',
                    '--isolation', 'process', '--budget', '200'])
    assert '[gpu_check] gkat: up to 200 s' in capsys.readouterr().out
    s = json.loads((tmp_path / 'gpu_check.json').read_text())['sections']['gkat']
    assert s['status'] == 'ok', s.get('error')
    assert all(positive(r['ratio_vs_gat']) for r in s['rows'])
    assert (tmp_path / 'logs' / 'gkat.log').exists()


def test_budget_and_bad_arguments(tmp_path):
    gpu_check.main(['--out', str(tmp_path), '--device', 'cpu', '--quick', '--budget', '0'])
    R = json.loads((tmp_path / 'gpu_check.json').read_text())
    assert {s['status'] for s in R['sections'].values()} == {'skipped'}
    with pytest.raises(SystemExit, match="unknown sections \\['gpu'\\]"):
        gpu_check.main(['--out', str(tmp_path), '--device', 'cpu', '--only', 'gpu'])


def test_profile_rows(quick):
    # every GRF backend on the kNN graph and both training steps, each with its top operators
    rows = quick[1]['sections']['profile']['rows']
    assert [r['what'] for r in rows] == ["GRFAttention 'auto'", "GRFAttention 'sparse'",
                                         "GRFAttention 'pairs'", f'training step {gpu_check.MHA}',
                                         f'training step {gpu_check.GRF}']
    assert [r.get('backend') for r in rows[:3]][1:] == ['sparse', 'pairs']
    for r in rows:
        assert positive(r['wall_ms']) and positive(r['device_ms']), r
        assert r['ops'] and all(positive(o['ms']) and 0 < o['share'] <= 1 for o in r['ops']), r


def test_backend_rows_measure_the_rule(quick):
    # 'pairs' against the 'sparse' path on both kNN sizes and a power-law graph (plan time,
    # layer time), and which backend 'auto' picks: the engine on the kNN graphs, the low-rank
    # path on the power-law graph, whose mask has ~50x the walks' pairs (counted here from the
    # rows: the mask's cells against the walk entries, an upper bound of the pairs)
    s = quick[1]['sections']['backends']
    rows = s['rows']
    assert [(r['graph'], r['nodes'], r['backend']) for r in rows] == [
        (g, n, b) for g, n in (('knn', 256), ('knn', 1024), ('power-law', 2000))
        for b in ('pairs', 'sparse', 'auto')]
    for r in rows:
        assert 'error' not in r, r
        assert r['plan_s'] > 0 and r['plan_bytes'] > 0, r
        expected = 'pairs' if r['graph'] == 'knn' else 'sparse'
        assert r['runs'] == ([expected] if r['backend'] == 'auto' else [r['backend']]), r
        assert not any('model' in k for k in r), r  # no cost-model estimate left
        if r['backend'] == 'auto':
            assert 'ms' not in r
        else:
            assert positive(r['ms']) and positive(r['first_ms']), r
            assert r['call_peak_bytes'] is None  # CUDA only
    assert all(r['mask_cells'] > r['nodes'] for r in rows if r['runs'] == ['pairs'])
    law = next(r for r in rows if r['graph'] == 'power-law' and r['backend'] == 'pairs')
    assert law['mask_cells'] > 20 * law['grf_entries']
    assert set(s['rule']) == {'knn 256', 'knn 1024', 'power-law 2000'}
    for key, rule in s['rule'].items():
        assert rule['auto_picks'] == (['sparse'] if key.startswith('power') else ['pairs'])
        assert rule['faster'] in ('pairs', 'sparse')
        assert positive(rule['pairs_over_sparse'])
        assert rule['auto_picks_faster'] == (rule['auto_picks'] == [rule['faster']])


def test_op_count_runs_the_script(quick):
    out, R = quick
    s = R['sections']['op_count']
    assert s['command'].startswith('python bench/op_count.py --graphs 4')
    assert s['rc'] == 0
    assert [r['column'] for r in s['rows']] == [
        gpu_check.MHA, gpu_check.PERF, f'{gpu_check.GRF} (plan in the loader)',
        f'{gpu_check.GRF} (plan in the step)']
    assert all(positive(r['dispatched']) and positive(r['expanded']) for r in s['rows'])
    assert (out / 'op_count.json').exists() and (out / 'op_count.txt').exists()


def test_pair_kernel_gathers_agree_with_the_engine(quick):
    # the gather formulation is an independent computation of the engine's sums: in float32
    # they agree to rounding; in bfloat16 the gathers accumulate in bfloat16 (the engine in
    # float32), so to a few of bfloat16's 2^-8 steps
    rows = quick[1]['sections']['pair_kernel']['rows']
    assert {(r['workload'], r['dtype'], r['kernel']) for r in rows} == {
        (w, d, k) for w in ('molecule', 'knn') for d in ('float32', 'bfloat16')
        for k in ('engine', 'gather + index_add', 'gather + segment')}
    for r in rows:
        assert 'error' not in r, r
        assert positive(r['ms']) and positive(r['ratio_vs_engine']) and r['cells'] > 0, r
        if r['kernel'] == 'engine':
            assert r['ratio_vs_engine'] == 1.0 and 'max_rel_diff_out' not in r
            continue
        tol = 1e-5 if r['dtype'] == 'float32' else 0.1
        assert r['max_rel_diff_out'] < tol and r['max_rel_diff_grads'] < tol, r


def test_edge_sums_is_the_masked_sum():
    # edge_sums against a dense loop-free reference: o = (W * (q k^T)) v on a random support
    g = torch.Generator().manual_seed(0)
    R, m, c = 7, 3, 4
    dense = (torch.rand(R, R, generator=g) < 0.4).float() * torch.rand(R, R, generator=g)
    row, col = dense.nonzero().t()
    crow = torch.ops.aten._convert_indices_from_coo_to_csr(row, R)
    w = dense[row, col]
    q, k, v = (torch.randn(R, d, generator=g, dtype=torch.float64) for d in (m, m, c))
    ref = (dense.double() * (q @ k.t())) @ v
    for reduce in ('index_add', 'segment'):
        out = gpu_check.edge_sums(q, k, v, w.double(), torch.arange(w.numel()), row, col, crow,
                                  reduce)
        torch.testing.assert_close(out, ref)
