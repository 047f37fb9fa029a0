r"""experiments/regenerate.py: the drift check passes inside the committed tolerance and fails
beyond it (or without a committed value), every result carries command, commit and machine, the
full budget names commands whose scripts exist, and unknown names are refused."""
import json
import shlex
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from tests.experiments import experiment_module

regenerate = experiment_module('regenerate')


@pytest.fixture
def fake_quick(monkeypatch):
    value = {'x': 10.0}
    monkeypatch.setitem(regenerate.QUICK, 'fake', dict(
        run=lambda out: {'value': value['x'], 'unit': 'points'}, tolerance=1.0,
        command='fake command', why='test'))
    return value


def _commit(folder, value, tolerance):
    folder.mkdir(exist_ok=True)
    (folder / 'fake.json').write_text(json.dumps({'value': value, 'tolerance': tolerance,
                                                  'notes': 'seed spread'}))


# committed 9.5 ± 1.5: [8.0, 11.0] passes
@pytest.mark.parametrize('new, status', [(10.0, 0), (10.9, 0), (8.1, 0), (11.2, 1), (7.9, 1)])
def test_check_fails_beyond_the_committed_tolerance(tmp_path, fake_quick, new, status):
    _commit(tmp_path / 'committed', 9.5, 1.5)
    fake_quick['x'] = new
    assert regenerate.run_quick(['fake'], str(tmp_path / 'out'), check=True,
                                committed=str(tmp_path / 'committed')) == status
    record = json.loads((tmp_path / 'out' / 'fake.json').read_text())
    assert record['value'] == new and record['tolerance'] == 1.0
    assert record['notes'] == 'seed spread'  # the committed notes are kept
    for key in ('command', 'commit', 'machine', 'torch', 'cpu_capability', 'date'):
        assert key in record, key


def test_check_without_a_committed_value_fails(tmp_path, fake_quick):
    assert regenerate.run_quick(['fake'], str(tmp_path / 'out'), check=True,
                                committed=str(tmp_path / 'none')) == 1
    assert regenerate.run_quick(['fake'], str(tmp_path / 'out'), check=False,
                                committed=str(tmp_path / 'none')) == 0


def test_committed_quick_figures_exist_with_their_provenance():
    for name in regenerate.QUICK:
        record = json.loads((REPO / 'experiments' / 'results' / 'quick' /
                             f'{name}.json').read_text())
        assert record['tolerance'] == regenerate.QUICK[name]['tolerance']
        for key in ('value', 'command', 'commit', 'machine', 'tolerance_why'):
            assert record[key] not in (None, ''), (name, key)


def test_full_commands_name_existing_scripts_and_log_provenance(tmp_path):
    for name, spec in regenerate.FULL.items():
        for command in spec['commands']:
            script = shlex.split(command)[1]
            assert (REPO / script).is_file(), (name, script)
    calls = []

    def runner(args, cwd):
        calls.append(args)
        return SimpleNamespace(returncode=0)
    log = tmp_path / 'log.jsonl'
    assert regenerate.run_full(['grf_variance'], dry_run=False, log=str(log), runner=runner) == 0
    assert calls == [['python', 'experiments/grf_variance.py', '--repeats', '300']]
    row = json.loads(log.read_text())
    assert row['name'] == 'grf_variance' and row['returncode'] == 0
    assert row['commit'] and row['machine']


def test_every_committed_run_file_belongs_to_a_table():
    # a runs.jsonl no table lists would survive a full regeneration and be read back as is
    listed = {f for spec in regenerate.FULL.values() for f in spec['files']}
    results = REPO / 'experiments' / 'results'
    for path in results.glob('*/runs.jsonl'):
        assert str(path.relative_to(results)) in listed, path


def test_full_recomputes_the_runs_it_would_otherwise_read_back(tmp_path):
    # the experiments skip every (variant, seed) already in runs.jsonl: a regeneration that kept
    # the committed file would rerun nothing. It is moved aside unless --resume.
    runs = tmp_path / 'cora_grf_gps' / 'runs.jsonl'
    runs.parent.mkdir()
    runs.write_text('{"variant": "grf_gps", "seed": 0}\n')
    seen = []

    def runner(args, cwd):
        seen.append(runs.exists())
        return SimpleNamespace(returncode=0)
    log = str(tmp_path / 'log.jsonl')
    regenerate.run_full(['cora_grf_gps'], dry_run=False, log=log, runner=runner,
                        resume=True, results=str(tmp_path))
    assert seen == [True]
    regenerate.run_full(['cora_grf_gps'], dry_run=False, log=log, runner=runner,
                        results=str(tmp_path))
    assert seen == [True, False]
    assert (tmp_path / 'cora_grf_gps' / 'runs.jsonl.previous').read_text().startswith('{"variant"')


def test_unknown_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        regenerate.main(['--budget', 'quick', '--only', 'nope'])
    assert "unknown quick figure(s) ['nope']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(regenerate.QUICK))
def test_quick_figure_within_the_committed_tolerance(tmp_path, name):
    # CI's drift check (README, Tests): the quick figure recomputed from this checkout lies
    # within the tolerance of the committed experiments/results/quick/<name>.json
    assert regenerate.run_quick([name], str(tmp_path), check=True) == 0
