import csv
import json
import os
import sys

import pytest

from pyg_grf.lightning.cli import main
from pyg_grf.lightning.plot import learning_curve_panels, plot_learning_curves, plot_run
from tests.conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _csv_epoch_series(path):
    # The per-epoch values a CSVLogger wrote, read independently of pyg_grf.lightning.plot.
    series = {}
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            for key in ('train/loss_epoch', 'train/acc', 'val/loss', 'val/acc'):
                if row.get(key):
                    series.setdefault(key, []).append((int(row['epoch']), float(row[key])))
    return series


def _assert_matches_csv(panels, csv_series):
    assert list(panels) == ['loss', 'acc']
    assert {split: len(s) for split, s in panels['loss'].items()} == {'train': 2, 'val': 2}
    expected = {('loss', 'train'): 'train/loss_epoch', ('loss', 'val'): 'val/loss',
                ('acc', 'train'): 'train/acc', ('acc', 'val'): 'val/acc'}
    for (panel, split), key in expected.items():
        got = panels[panel][split]
        assert [e for e, _ in got] == [e for e, _ in csv_series[key]] == [0, 1]
        assert [v for _, v in got] == pytest.approx([v for _, v in csv_series[key]], rel=1e-6)


def test_main_job_writes_learning_curves(tmp_path, capsys):
    # The README's main job (shortened): `fit` writes learning_curves.png into the run's log
    # folder, and `pyg-grf plot RUN_DIR` writes it again from the run; its panels are the loss and
    # the monitored metric (val/acc), each with the train and val series of metrics.csv.
    config = REPO / 'experiments' / 'configs' / 'motifs_grf.yaml'
    run = tmp_path / 'runs' / 'motifs_grf'
    cli = main(['fit', '--config', str(config), f'--trainer.default_root_dir={run}',
                '--trainer.max_epochs=2', '--trainer.enable_progress_bar=false',
                '--data.init_args.num_graphs=64', f'--data.init_args.root={tmp_path / "data"}',
                '--test_after_fit=false'])
    log_dir = run / 'lightning_logs' / 'version_0'
    assert cli.trainer.log_dir == str(log_dir)
    png = log_dir / 'learning_curves.png'
    assert png.read_bytes()[:8] == PNG_MAGIC
    png.unlink()
    result = main(['plot', str(run)])
    assert result['kind'] == 'fit' and result['path'] == str(png)
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    assert str(png) in capsys.readouterr().out
    _assert_matches_csv(result['data'], _csv_epoch_series(log_dir / 'metrics.csv'))
    # Without epoch_metrics.jsonl the plot reads metrics.csv: the same panels.
    (log_dir / 'epoch_metrics.jsonl').unlink()
    out = tmp_path / 'from_csv.png'
    path, panels = plot_learning_curves(str(log_dir), str(out))
    assert path == str(out) and out.read_bytes()[:8] == PNG_MAGIC
    _assert_matches_csv(panels, _csv_epoch_series(log_dir / 'metrics.csv'))


def _write_rows(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / 'epoch_metrics.jsonl', 'w') as f:
        for row in rows:
            f.write(json.dumps(row) + '\n')


ROWS = [{'epoch': 0, 'step': 4, 'train/loss': 0.9, 'train/ap': 0.3, 'val/loss': 0.8,
         'val/ap': 0.35, 'val/mae': 2.0},
        {'epoch': 1, 'step': 8, 'train/loss': 0.7, 'train/ap': 0.4, 'val/loss': 0.75,
         'val/ap': 0.45, 'val/mae': 1.5}]


def test_panels_follow_the_monitor():
    panels = learning_curve_panels(ROWS, monitor='val/ap')
    assert panels == {'loss': {'train': [(0, 0.9), (1, 0.7)], 'val': [(0, 0.8), (1, 0.75)]},
                      'ap': {'train': [(0, 0.3), (1, 0.4)], 'val': [(0, 0.35), (1, 0.45)]}}
    assert list(learning_curve_panels(ROWS, monitor='mae')) == ['loss', 'mae']
    assert learning_curve_panels(ROWS, monitor='mae')['mae'] == {'val': [(0, 2.0), (1, 1.5)]}
    # Monitoring the loss (or nothing): the first logged validation metric.
    assert list(learning_curve_panels(ROWS, monitor='val/loss')) == ['loss', 'ap']


def test_plot_finds_the_newest_version(tmp_path):
    _write_rows(tmp_path / 'lightning_logs' / 'version_2', ROWS)
    _write_rows(tmp_path / 'lightning_logs' / 'version_10', ROWS[:1])
    result = plot_run(str(tmp_path), monitor='val/ap')
    assert result['path'] == str(tmp_path / 'lightning_logs' / 'version_10' /
                                 'learning_curves.png')
    assert result['data']['loss']['train'] == [(0, 0.9)]


def test_cv_plot(tmp_path, capsys):
    folds = [{'fold': 0, 'test/acc': 0.5, 'test/loss': 0.7},
             {'fold': 1, 'test/acc': 0.7, 'test/loss': 0.6}]
    (tmp_path / 'cv_results.json').write_text(json.dumps({'folds': folds}))
    result = main(['plot', str(tmp_path)])
    assert result['kind'] == 'cv' and result['path'] == str(tmp_path / 'cv_results.png')
    assert result['data'] == {'test/acc': [(0, 0.5), (1, 0.7)],
                              'test/loss': [(0, 0.7), (1, 0.6)]}
    assert (tmp_path / 'cv_results.png').read_bytes()[:8] == PNG_MAGIC
    assert 'per-fold results: test/acc, test/loss' in capsys.readouterr().out


def test_plot_errors(tmp_path, capsys, monkeypatch):
    def error_of(*args):
        with pytest.raises(SystemExit) as exc:
            main(['plot', *map(str, args)])
        assert exc.value.code == 2
        return capsys.readouterr().err

    assert 'does not exist' in error_of(tmp_path / 'nothing')
    assert "no training metrics under" in error_of(tmp_path)
    assert 'unrecognized arguments: --folds' in error_of(tmp_path, '--folds', '1')
    _write_rows(tmp_path / 'run', [])
    assert 'no epoch-level loss or metric' in error_of(tmp_path / 'run')
    # Without matplotlib: one line that says what to install.
    _write_rows(tmp_path / 'run', ROWS)
    for name in ('matplotlib', 'matplotlib.figure', 'matplotlib.backends.backend_agg'):
        monkeypatch.setitem(sys.modules, name, None)
    assert ('Plotting needs matplotlib, which is not installed: pip install matplotlib'
            in error_of(tmp_path / 'run'))


def test_plot_after_test_uses_the_fit_version(tmp_path):
    # `pyg-grf test` adds a newer version with test metrics only
    _write_rows(tmp_path / 'lightning_logs' / 'version_0', ROWS)
    test_only = tmp_path / 'lightning_logs' / 'version_1'
    test_only.mkdir(parents=True)
    (test_only / 'metrics.csv').write_text('epoch,step,test/acc,test/loss\n0,8,0.5,0.7\n')
    result = plot_run(str(tmp_path), monitor='val/ap')
    assert result['path'] == str(tmp_path / 'lightning_logs' / 'version_0' /
                                 'learning_curves.png')


def test_plot_survives_odd_files(tmp_path, capsys):
    # inf / null / missing epochs are skipped; malformed files are one-line
    # errors with status 2, never tracebacks
    run = tmp_path / 'run'
    _write_rows(run, ROWS)
    with open(run / 'epoch_metrics.jsonl', 'a') as f:
        f.write('null\n{"epoch": Infinity, "train/loss": 0.1}\n{"train/loss": 0.2}\n')
    result = main(['plot', str(run), '--monitor', 'val/ap'])
    assert result['data']['loss']['train'] == [(0, 0.9), (1, 0.7)]

    def error_of(path):
        with pytest.raises(SystemExit) as exc:
            main(['plot', str(path)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert 'Traceback' not in err
        return err

    cv = tmp_path / 'cv'
    cv.mkdir()
    bad = tmp_path / 'bad'
    bad.mkdir()
    cases = [  # (folder, file, content, the expected one-line error)
        (run, 'config.yaml', 'checkpoint: [unclosed\n', 'is not valid YAML'),
        (run, 'config.yaml', '- just a list\n', 'must hold a mapping'),
        (cv, 'cv_results.json', '[]', "must hold {'folds': [...]}"),
        (cv, 'cv_results.json', '{"folds": [{"test/acc": 0.5}, {"fold": 0}]}',
         'no finished fold'),
        (cv, 'cv_results.json', '{"folds": ', 'is not valid JSON'),
        (bad, 'epoch_metrics.jsonl', '{"epoch": 0,\n', 'line 1 is not JSON'),
    ]
    for folder, name, content, expected in cases:
        (folder / name).write_text(content)
        assert expected in error_of(folder)


def test_plot_odd_monitors_and_huge_numbers(tmp_path, capsys):
    # Adversarial review p10: a non-string checkpoint.monitor (AttributeError on .split) and
    # integers too large for a float (OverflowError in the conversion) gave tracebacks.
    huge = '1' + '0' * 400

    def error_of(path):
        with pytest.raises(SystemExit) as exc:
            main(['plot', str(path)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and 'Traceback' not in err and len(err.splitlines()) <= 2
        return err.splitlines()[-1]

    for monitor, shown in (('5', 'int 5'), ('[val/acc]', "list ['val/acc']"),
                           ('{a: 1}', "dict {'a': 1}")):
        run = tmp_path / f'monitor_{len(shown)}'
        _write_rows(run, ROWS)
        (run / 'config.yaml').write_text(f'checkpoint:\n  monitor: {monitor}\n')
        assert (f"config.yaml': checkpoint.monitor must be a metric name such as 'val/acc', "
                f"got {shown}") in error_of(run)

    # Huge numbers as an epoch or a value: the row or the value is skipped.
    run = tmp_path / 'huge'
    _write_rows(run, ROWS)
    with open(run / 'epoch_metrics.jsonl', 'a') as f:
        f.write(f'{{"epoch": {huge}, "train/loss": 0.3}}\n{{"epoch": 2, "train/loss": {huge}}}\n')
    result = main(['plot', str(run), '--monitor', 'val/ap'])
    assert result['data']['loss']['train'] == [(0, 0.9), (1, 0.7)]
    cv = tmp_path / 'cv'
    cv.mkdir()
    (cv / 'cv_results.json').write_text(
        f'{{"folds": [{{"fold": 0, "acc": {huge}}}, {{"fold": {huge}, "acc": 0.4}}, '
        f'{{"fold": 1, "acc": 0.5}}]}}')
    assert main(['plot', str(cv)])['data'] == {'acc': [(1, 0.5)]}
    # Finite values too large to draw (or to square for the std): one line that says so.
    (cv / 'cv_results.json').write_text('{"folds": [{"fold": 0, "acc": 1.7e308}, '
                                        '{"fold": 1, "acc": -1e200}]}')
    assert 'matplotlib could not draw the values of' in error_of(cv)
    # metrics.csv: fields beyond the header, and bytes that are not UTF-8.
    csv_run = tmp_path / 'csv'
    csv_run.mkdir()
    (csv_run / 'metrics.csv').write_text('epoch,step,train/loss\n0,1,1.0,5,6\n1,2\n')
    assert main(['plot', str(csv_run)])['data']['loss']['train'] == [(0, 1.0)]
    (csv_run / 'metrics.csv').write_bytes(b'epoch,step,train/loss\n0,1,\xff\n')
    assert "metrics.csv' is not UTF-8 text (byte 26: b'\\xff')" in error_of(csv_run)


# Nothing is written outside the run folder -------------------------------------------------

class _FakeFigure:
    def savefig(self, f, format, dpi):
        f.write(PNG_MAGIC + b'fake')


def test_png_is_saved_beside_a_planted_link_not_through_it(tmp_path):
    # without matplotlib: the writer itself
    from pyg_grf.lightning.plot import _save_png
    target = tmp_path / 'victim'
    target.write_bytes(b'keep me')
    (tmp_path / 'learning_curves.png').symlink_to(target)
    _save_png(_FakeFigure(), str(tmp_path / 'learning_curves.png'))
    assert target.read_bytes() == b'keep me'
    png = tmp_path / 'learning_curves.png'
    assert not png.is_symlink() and png.read_bytes() == PNG_MAGIC + b'fake'


@pytest.mark.parametrize('kind', ['fit', 'cv'])
def test_plot_never_writes_through_a_link_in_the_run_folder(tmp_path, kind):
    pytest.importorskip('matplotlib')
    victim = tmp_path / 'victim.txt'
    victim.write_text('keep me')
    run = tmp_path / 'run'
    if kind == 'fit':
        _write_rows(run, ROWS)
        png = run / 'learning_curves.png'
    else:
        run.mkdir()
        (run / 'cv_results.json').write_text(json.dumps({'folds': [{'fold': 0, 'acc': 0.5}]}))
        png = run / 'cv_results.png'
    png.symlink_to(victim)
    assert main(['plot', str(run)])['path'] == str(png)
    assert victim.read_text() == 'keep me'
    assert not png.is_symlink() and png.read_bytes()[:8] == PNG_MAGIC


def test_plot_refuses_a_version_folder_that_is_a_link(tmp_path, capsys):
    elsewhere = tmp_path / 'elsewhere'
    _write_rows(elsewhere, ROWS)
    (tmp_path / 'run' / 'lightning_logs').mkdir(parents=True)
    (tmp_path / 'run' / 'lightning_logs' / 'version_0').symlink_to(elsewhere)
    with pytest.raises(SystemExit) as exc:
        main(['plot', str(tmp_path / 'run')])
    assert exc.value.code == 2
    assert "version_0' is a symbolic link" in capsys.readouterr().err
    assert sorted(os.listdir(elsewhere)) == ['epoch_metrics.jsonl']
