"""experiments/harness.py (the experiments' shared seeds-and-variants runner over the product's
training stack): resume from the JSONL file, paired differences against hand computation."""
import importlib.util
import json
import math
import os.path as osp

import pytest

HERE = osp.dirname(osp.dirname(osp.abspath(__file__)))
spec = importlib.util.spec_from_file_location('harness', osp.join(HERE, 'experiments',
                                                                  'harness.py'))
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)


def fake_run(variant, spec, seed, root):
    assert osp.isdir(root)  # a fresh temporary root per run
    acc = {'grf': 0.8, 'linear': 0.7}[variant] + 0.01 * seed + (0.02 if seed == 1 else 0)
    return {'test/acc': acc, 'best_val': acc - 0.05, 'params': 10, 'fit_s': 1.0}


def test_run_grid_resumes_and_summarises(tmp_path):
    calls = []

    def run(*args):
        calls.append(args[:1] + args[2:3])
        return fake_run(*args)
    variants = {'grf': [], 'linear': ['--x=1']}
    rows = harness.run_grid(variants, [0, 1], str(tmp_path), run, key={'epochs': 3},
                            log=lambda s: None)
    assert len(rows) == 4 and len(calls) == 4
    # a second call with one more seed runs only the new pairs; another key runs everything
    rows = harness.run_grid(variants, [0, 1, 2], str(tmp_path), run, key={'epochs': 3},
                            log=lambda s: None)
    assert len(rows) == 6 and len(calls) == 6
    assert len(harness.run_grid(variants, [0], str(tmp_path), run, key={'epochs': 4},
                                log=lambda s: None)) == 2
    with open(tmp_path / 'runs.jsonl') as f:
        assert len([json.loads(line) for line in f]) == 8
    p = harness.paired(rows, 'grf', 'linear', 'test/acc')
    assert p['seeds'] == 3 and p['better'] == 3
    assert p['mean'] == pytest.approx(10.0) and p['se'] == pytest.approx(0.0, abs=1e-9)
    table = harness.summary_table(rows, 'test/acc', control='linear')
    line = [ln for ln in table.splitlines() if ln.startswith('| grf ')][0]
    accs = [80.0, 83.0, 82.0]
    mean = sum(accs) / 3
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / 2)
    assert f'{mean:.1f} ± {std:.1f}' in line and '+10.0 ± 0.0 (3/3 seeds better)' in line


def test_paired_needs_two_seeds():
    rows = [{'variant': 'grf', 'seed': 0, 'test/acc': 0.5},
            {'variant': 'linear', 'seed': 0, 'test/acc': 0.4}]
    assert harness.paired(rows, 'grf', 'linear', 'test/acc') is None
    assert harness.read_rows('/nonexistent/runs.jsonl') == []
