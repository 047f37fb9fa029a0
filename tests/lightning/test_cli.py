import re

import pytest

from pyg_grf.lightning.cli import cv_table, main, run_cv
from tests.conftest import REPO
from tests.lightning.helpers import tiny_config, write_config

# LightningCLI warns when args= is used while pytest has its own sys.argv.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")



def test_fit_fast_dev_run(tmp_path):
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    cli = main(['fit', '--config', config, '--trainer.fast_dev_run=true'])
    assert cli.trainer.state.finished
    # (found by type: the attention's place inside a block is the model's business)
    assert [type(m).__name__ for m in cli.model.model.blocks[0].modules()].count(
        'GRFAttention') == 1
    assert cli.trainer.gradient_clip_val == 2.0  # package default
    assert 'train/loss' in cli.trainer.callback_metrics


def test_fit_resume_and_load_from_checkpoint(tmp_path):
    from pyg_grf.lightning.tasks import GraphLevelTask
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=2,
                                      limit_val_batches=1, log_every_n_steps=1))
    cli = main(['fit', '--config', config, '--test_after_fit=true'])
    assert 'test/acc' in cli.trainer.callback_metrics
    last = cli.trainer.checkpoint_callback.last_model_path
    # The model spec is a hyperparameter: no arguments needed to rebuild the task.
    task = GraphLevelTask.load_from_checkpoint(last)
    assert task.model.attn_type == 'grf' and task.model.hidden_channels == 8
    # Resume for one more epoch.
    cli = main(['fit', '--config', config, '--trainer.max_epochs=2', f'--ckpt_path={last}'])
    assert cli.trainer.current_epoch == 2


def test_resuming_a_checkpoint_with_the_old_schedule_state_is_refused(tmp_path):
    # Checkpoints of pyg_grf 0.1 hold a LambdaLR state, which SequentialLR cannot restore:
    # resuming must stop with a clear error; the weights still load.
    import torch

    from pyg_grf.lightning.tasks import GraphLevelTask
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=1,
                                      limit_val_batches=1))
    cli = main(['fit', '--config', config])
    last = cli.trainer.checkpoint_callback.last_model_path
    ckpt = torch.load(last, weights_only=True)
    assert '_schedulers' in ckpt['lr_schedulers'][0]
    ckpt['lr_schedulers'] = [{'base_lrs': [0.01, 0.01], 'last_epoch': 1, '_step_count': 2,
                              '_last_lr': [0.01, 0.01], 'lr_lambdas': [None, None]}]
    legacy = str(tmp_path / 'legacy.ckpt')
    torch.save(ckpt, legacy)
    with pytest.raises(ValueError, match='LambdaLR schedule of pyg_grf 0.1.*start a new `fit`'):
        main(['fit', '--config', config, '--trainer.max_epochs=2', f'--ckpt_path={legacy}'])
    assert GraphLevelTask.load_from_checkpoint(legacy).model.hidden_channels == 8


def test_bad_key_and_value_errors(tmp_path, capsys):
    base = tiny_config(tmp_path / 'run')
    # A misspelt model key (nested inside the task) is rejected before anything runs.
    bad = tiny_config(tmp_path / 'run')
    bad['model']['init_args']['model']['init_args']['hiden_channels'] = 8
    with pytest.raises(SystemExit):
        main(['fit', '--config', write_config(tmp_path / 'bad_key.yaml', bad)])
    assert 'hiden_channels' in capsys.readouterr().err
    # A value of the wrong type.
    with pytest.raises(SystemExit):
        main(['fit', '--config', write_config(tmp_path / 'base.yaml', base),
              '--model.init_args.lr=fast'])
    assert 'lr' in capsys.readouterr().err
    # An unknown top-level section.
    with pytest.raises(SystemExit):
        main(['fit', '--config', str(tmp_path / 'base.yaml'), '--trainr.max_epochs=1'])
    assert 'trainr' in capsys.readouterr().err


def test_cv_table():
    table = cv_table([{'fold': 0, 'test/acc': 0.5}, {'fold': 1, 'test/acc': 0.7}])
    assert '| 0 | 0.5000 |' in table
    assert '| mean ± std | 0.6000 ± 0.1000 |' in table


def test_cv_needs_folds(tmp_path):
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    with pytest.raises(ValueError, match="needs a data module with 'fold'"):
        run_cv(['--config', config])


@pytest.mark.data
def test_cv_on_mutag(mirror, tmp_path):
    cfg = tiny_config(tmp_path / 'run', max_epochs=1, limit_train_batches=2)
    cfg['model']['init_args']['model']['init_args']['in_channels'] = 7
    cfg['data'] = {'class_path': 'pyg_grf.lightning.datamodules.TUDataModule',
                   'init_args': {'name': 'MUTAG', 'num_folds': 3, 'batch_size': 16,
                                 'pre_transform': cfg['data']['init_args']['pre_transform']}}
    config = write_config(tmp_path / 'mutag.yaml', cfg)
    results = run_cv(['--config', config, '--folds', '0,2', '--out', str(tmp_path / 'cv')])
    assert [r['fold'] for r in results] == [0, 2]
    table = (tmp_path / 'cv' / 'cv_results.md').read_text()
    assert 'mean ± std' in table and 'test/acc' in table


def test_console_script_exits_zero(tmp_path):
    # The installed `pyg-grf` must exit with status 0 after a successful run (a console script
    # returning a non-None object exits with 1).
    import subprocess
    import sys
    from importlib.metadata import entry_points

    from pyg_grf.lightning.cli import console_main
    (ep,) = [e for e in entry_points(group='console_scripts') if e.name == 'pyg-grf']
    assert ep.load() is console_main
    config = REPO / 'experiments' / 'configs' / 'motifs_grf.yaml'
    proc = subprocess.run(
        [sys.executable, '-m', 'pyg_grf.lightning.cli', 'fit', '--config', str(config),
         f'--trainer.default_root_dir={tmp_path}', '--trainer.fast_dev_run=true',
         '--trainer.enable_progress_bar=false', '--data.init_args.num_graphs=64',
         f'--data.init_args.root={tmp_path / "data"}'],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'test/acc' in proc.stdout


FOREIGN = ('litlogger', 'tensorboardX', 'LeafSpec', 'Loading `train_dataloader`',
           'Sparse CSR tensor support')


def test_main_job_log_is_quiet(tmp_path):
    # The README's main job (shortened) in a fresh process: one model summary, none of the tips
    # and notices about other packages that Lightning prints by default.
    import subprocess
    import sys
    config = REPO / 'experiments' / 'configs' / 'motifs_grf.yaml'
    proc = subprocess.run(
        [sys.executable, '-m', 'pyg_grf.lightning.cli', 'fit', '--config', str(config),
         f'--trainer.default_root_dir={tmp_path}', '--trainer.max_epochs=1',
         '--trainer.limit_train_batches=2', '--trainer.enable_progress_bar=false',
         '--data.init_args.num_graphs=64', f'--data.init_args.root={tmp_path / "data"}'],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'test/acc' in proc.stdout
    assert proc.stderr.count('Total params') == 1
    assert 'Learning curves:' in proc.stderr
    for text in FOREIGN:
        assert text not in proc.stderr, proc.stderr


def test_cv_prints_one_model_summary(tmp_path, capsys, monkeypatch):
    import io
    import logging
    import warnings

    from pyg_grf.lightning.cli import _DropMessages, _lightning_handlers

    # Lightning's log handlers hold the stream they were made with: read what they write.
    log = io.StringIO()
    for handler in _lightning_handlers():
        monkeypatch.setattr(handler, 'stream', log)
    cfg = tiny_config(tmp_path / 'run', enable_model_summary=True, limit_train_batches=2)
    cfg['data']['class_path'] = 'tests.lightning.helpers.FoldedSyntheticDataModule'
    monkeypatch.setenv('PYG_GRF_TRUSTED_CLASSES', cfg['data']['class_path'])  # not in the lists
    config = write_config(tmp_path / 'folds.yaml', cfg)
    with warnings.catch_warnings(record=True) as caught:  # (and what is warned)
        warnings.simplefilter('always')
        results = main(['cv', '--config', config, '--out', str(tmp_path / 'cv')])
    assert [r['fold'] for r in results] == [0, 1, 2]
    out = capsys.readouterr().out
    err = log.getvalue() + '\n'.join(str(w.message) for w in caught)
    assert err.count('Total params') == 1 and err.count('Seed set to 0') == 1
    for text in FOREIGN:
        assert text not in err, err
    for fold in range(3):
        assert f'fold {fold} ({fold + 1}/3): ' in out
        assert (tmp_path / 'cv' / f'fold{fold}' / 'lightning_logs' / 'version_0' /
                'learning_curves.png').is_file()
    assert (tmp_path / 'cv' / 'cv_results.png').is_file()
    # The filters are gone after the command.
    assert not any(isinstance(f, _DropMessages) for h in _lightning_handlers()
                   for f in h.filters)
    logging.getLogger('lightning.pytorch').info('after the command')
    logging.getLogger('lightning.pytorch').info('after the command')
    assert log.getvalue().count('after the command') == 2


@pytest.mark.parametrize('url', ['http://127.0.0.1:9/evil.ckpt', 's3://bucket/x.ckpt',
                                 'file:///tmp/x.ckpt'])
def test_remote_checkpoint_paths_are_refused(tmp_path, url):
    # issue #15 item 13: Lightning reads a URL checkpoint without weights_only; nothing is
    # fetched, the CLI refuses before Lightning sees the path
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    with pytest.raises(ValueError, match="remote checkpoints are refused"):
        main(['test', '--config', config, f'--ckpt_path={url}'])


def test_local_checkpoints_are_read_weights_only(tmp_path, monkeypatch):
    import torch
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=2,
                                      limit_val_batches=1, log_every_n_steps=1))
    cli = main(['fit', '--config', config])
    last = cli.trainer.checkpoint_callback.last_model_path
    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get('weights_only'))
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, 'load', spy)
    main(['test', '--config', config, f'--ckpt_path={last}'])
    assert seen and all(w is True for w in seen)


def test_resume_keeps_the_earlier_epochs_in_metrics_csv(tmp_path):
    # issue #15 item 16: the resumed run reuses the log version, and CSVLogger deleted the
    # earlier metrics.csv, so the learning curves showed only the resumed epochs
    import csv
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=2,
                                      limit_val_batches=1, log_every_n_steps=1))
    cli = main(['fit', '--config', config, '--trainer.max_epochs=2'])
    last = cli.trainer.checkpoint_callback.last_model_path
    log_dir = cli.trainer.log_dir
    cli = main(['fit', '--config', config, '--trainer.max_epochs=4', f'--ckpt_path={last}'])
    assert cli.trainer.log_dir == log_dir  # the same version folder
    with open(f'{log_dir}/metrics.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    epochs = sorted({int(float(r['epoch'])) for r in rows if r.get('epoch')})
    assert epochs == [0, 1, 2, 3]
    # every epoch's validation row once (no duplicates from the resume)
    val = [int(float(r['epoch'])) for r in rows if r.get('val/loss')]
    assert sorted(val) == [0, 1, 2, 3]


# What a user sees --------------------------------------------------------------------------


def test_help_lists_cv_and_plot(capsys):
    with pytest.raises(SystemExit) as exc:
        main(['--help'])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    listed = re.findall(r'^    (\w+) ', out.split('Available subcommands:')[1], re.M)
    assert listed == ['fit', 'validate', 'test', 'predict', 'cv', 'plot']


def test_a_bad_override_prints_the_line_that_matters_first(tmp_path, capsys):
    config = write_config(tmp_path / 'base.yaml', tiny_config(tmp_path / 'run'))
    with pytest.raises(SystemExit) as exc:
        main(['fit', '--config', config, '--model.init_args.lr=fast'])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == 'error: Parser key "lr": Expected a <class \'float\'>. Got value: fast'
    assert err[-1] == 'tip: for the accepted options run: pyg-grf fit --help'
    assert len(err) < 20 and not any(line.startswith('usage:') for line in err)


def test_test_writes_no_new_version_folder_and_no_dirpath_notice(tmp_path):
    import warnings
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=1,
                                      limit_val_batches=1, limit_test_batches=1))
    cli = main(['fit', '--config', config, '--plot=false'])
    last = cli.trainer.checkpoint_callback.last_model_path
    logs = tmp_path / 'run' / 'lightning_logs'
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns)
                    for p in (tmp_path / 'run').rglob('*'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        cli = main(['test', '--config', config, f'--ckpt_path={last}'])
    assert 'test/acc' in cli.trainer.callback_metrics
    assert sorted(p.name for p in logs.iterdir()) == ['version_0']
    after = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns)
                   for p in (tmp_path / 'run').rglob('*'))
    assert after == before  # nothing written into the run either
    assert not [w for w in caught if 'dirpath has changed' in str(w.message)]


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path, capsys):
    import time
    text = (tmp_path / 'base.yaml')
    write_config(text, tiny_config(tmp_path / 'run'))
    lines = ['bomb0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]'] + [
        f"bomb{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    bomb = tmp_path / 'bomb.yaml'
    bomb.write_text(text.read_text() + '\n'.join(lines) + '\n')  # 10^8 leaves, 1.5 KB
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main(['fit', '--config', str(bomb)])
    assert time.perf_counter() - start < 30
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert 'whose aliases (*name) expand it to more than 100000 nodes' in err
    # an alias bomb as a command-line value too: refused by the same count before jsonargparse
    # expands it (it put the 10^8-leaf value into its error message: minutes)
    with pytest.raises(SystemExit):
        aliases = [f'&b{i} [{",".join(["*a" if i == 0 else f"*b{i-1}"] * 10)}],'
                   for i in range(7)]
        main(['fit', '--config', str(text), '--trainer.max_epochs='
              + ' '.join(['[&a [1,1,1,1,1,1,1,1,1,1],'] + aliases + ['0]'])])
    assert 'expand it to more than 100000 nodes (it has 20 as written)' in \
        capsys.readouterr().err


def test_aliases_in_an_ordinary_config_still_work(tmp_path):
    from pyg_grf.lightning.cli import _expanded_yaml_nodes
    # 9 nodes as written (the mappings, keys, list and items); 15 with *x expanded twice
    assert _expanded_yaml_nodes('a: &x [1, 2]\nb: *x\nc: {d: *x}\n', 100) == (9, 15)
    assert _expanded_yaml_nodes('a: 1\n', 100) == (3, 3)
    config = tiny_config(tmp_path / 'run', limit_train_batches=1, limit_val_batches=1)
    text = write_config(tmp_path / 'c.yaml', config)
    with open(text) as f:
        body = f.read()
    assert body.count('max_length: 2') == 2  # the walks' and the model's: one value, named once
    body = body.replace('max_length: 2', 'max_length: &len 2', 1).replace('max_length: 2',
                                                                          'max_length: *len')
    with open(text, 'w') as f:
        f.write(body)
    cli = main(['fit', '--config', text, '--trainer.fast_dev_run=true'])
    model = cli.config.fit.model.init_args.model.init_args
    assert model.attn_kwargs['max_length'] == 2
