r"""Checkpoint paths, checkpoint files and resumed run folders of the ``pyg-grf`` command
(pyg_grf/lightning/checkpoints.py): bad inputs are one line and status 2, a resume never writes
through a link and never loses metrics.csv."""
import csv
import os

import pytest
import torch

from pyg_grf.lightning.checkpoints import (
    CheckpointError,
    CommandLineError,
    best_checkpoint_of,
    check_checkpoint_file,
    check_local_dirs,
)
from pyg_grf.lightning.cli import GRFLightningCLI, main
from tests.lightning.helpers import monitored_config, tiny_config, write_config

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

VERSION = '2.6.6'


def _crafted(tmp_path):
    text = tmp_path / 'notes.ckpt'
    text.write_text('hello, this is not a checkpoint\n')
    files = {'a text file': (text, r"is not a checkpoint torch\.load can read with "
                                   r"weights_only=True \(\w+Error")}
    for name, content, match in [
            ('empty dict', {}, r"is not a Lightning checkpoint: it lacks "
                               r"\['pytorch-lightning_version', 'state_dict'"),
            ('a list', [1, 2], r"must hold a Lightning checkpoint \(a dict\), got list"),
            ('hyper_parameters as a list',
             {'pytorch-lightning_version': VERSION, 'state_dict': {}, 'hyper_parameters': [1, 2]},
             r"'hyper_parameters' must be a dict, got list \[1, 2\]"),
            ('state_dict as a string',
             {'pytorch-lightning_version': VERSION, 'state_dict': 'weights'},
             r"'state_dict' must be a dict, got str 'weights'"),
            ('callbacks as a number',
             {'pytorch-lightning_version': VERSION, 'state_dict': {}, 'callbacks': 3},
             r"'callbacks' must be a dict, got int 3")]:
        path = tmp_path / f"{name.replace(' ', '_')}.ckpt"
        torch.save(content, path)
        files[name] = (path, match)
    return files


def test_crafted_checkpoint_files_are_refused_with_what_was_expected(tmp_path):
    for name, (path, match) in _crafted(tmp_path).items():
        with pytest.raises(CheckpointError, match=match):
            check_checkpoint_file(str(path))
    weights_only = tmp_path / 'weights.ckpt'
    torch.save({'pytorch-lightning_version': VERSION, 'state_dict': {}, 'epoch': 0}, weights_only)
    check_checkpoint_file(str(weights_only))  # fine to test
    with pytest.raises(CheckpointError, match=r"not a Lightning checkpoint to resume `fit` from "
                                              r"\(saved with save_weights_only\?\): it lacks "
                                              r"\['global_step', 'optimizer_states'"):
        check_checkpoint_file(str(weights_only), resume=True)


@pytest.mark.parametrize('subcommand', ['fit', 'test'])
def test_crafted_checkpoint_is_one_line_and_status_2_before_anything_runs(tmp_path, capsys,
                                                                          monkeypatch, subcommand):
    def nothing_built(*args, **kwargs):
        raise AssertionError('classes were built')
    monkeypatch.setattr(GRFLightningCLI, 'instantiate_classes', nothing_built)
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    for name, (path, match) in _crafted(tmp_path).items():
        with pytest.raises(SystemExit) as exc:
            main([subcommand, '--config', config, f'--ckpt_path={path}'])
        assert exc.value.code == 2, name
        assert isinstance(exc.value, CommandLineError) and isinstance(exc.value, ValueError)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --ckpt_path '{path}'"), (name, err)


def test_refused_remote_checkpoint_is_one_line_and_status_2(tmp_path, capsys):
    config = write_config(tmp_path / 'tiny.yaml', tiny_config(tmp_path / 'run'))
    with pytest.raises(SystemExit) as exc:
        main(['test', '--config', config, '--ckpt_path=https://127.0.0.1:9/x.ckpt'])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'remote checkpoints are refused' in err[0]


def test_console_script_turns_a_missing_best_checkpoint_into_status_2(monkeypatch, capsys):
    from pyg_grf.lightning import cli
    from pyg_grf.lightning.checkpoints import CheckpointNotFoundError

    def no_best(*args):
        raise CheckpointNotFoundError('--ckpt_path best: no best checkpoint found')
    monkeypatch.setattr(cli, 'main', no_best)
    assert cli.console_main() == 2
    assert capsys.readouterr().err == 'error: --ckpt_path best: no best checkpoint found\n'


# Every folder a config names is local --------------------------------------------------------

LOGGER = 'lightning.pytorch.loggers.CSVLogger'
CKPT = 'lightning.pytorch.callbacks.ModelCheckpoint'


@pytest.mark.parametrize('url', ['memory://runs', 'file:///tmp/runs', 's3://bucket/runs',
                                 'simplecache::memory://runs'])
@pytest.mark.parametrize('where', ['logger', 'loggers', 'callback'])
def test_urls_as_logger_and_callback_folders_are_refused(url, where):
    if where == 'logger':
        config = {'trainer': {'logger': {'class_path': LOGGER, 'init_args': {'save_dir': url}}}}
        option = 'trainer.logger.init_args.save_dir'
    elif where == 'loggers':
        config = {'trainer': {'logger': [
            {'class_path': LOGGER, 'init_args': {'save_dir': 'runs'}},
            {'class_path': LOGGER, 'init_args': {'save_dir': url}}]}}
        option = r'trainer.logger\[1\].init_args.save_dir'
    else:
        config = {'trainer': {'callbacks': [{'class_path': CKPT, 'init_args': {'dirpath': url}}]}}
        option = 'trainer.callbacks.init_args.dirpath'
    with pytest.raises(ValueError, match=f"--{option} '.*': run folders must be local"):
        check_local_dirs(config)


@pytest.mark.parametrize('override', ['--trainer.logger.init_args.save_dir=memory://runs',
                                      '--trainer.callbacks.init_args.dirpath=file:///tmp/ck'])
def test_a_url_folder_stops_the_command_before_anything_runs(tmp_path, capsys, monkeypatch,
                                                              override):
    def nothing_built(*args, **kwargs):
        raise AssertionError('classes were built')
    monkeypatch.setattr(GRFLightningCLI, 'instantiate_classes', nothing_built)
    cfg = tiny_config(tmp_path / 'run')
    if 'logger' in override:
        cfg['trainer']['logger'] = {'class_path': LOGGER, 'init_args': {'save_dir': 'x'}}
    else:
        cfg['trainer']['callbacks'] = [{'class_path': CKPT, 'init_args': {'dirpath': 'x'}}]
    config = write_config(tmp_path / 'tiny.yaml', cfg)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(SystemExit) as exc:
            main(['fit', '--config', config, override])
    finally:
        os.chdir(cwd)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'run folders must be local' in err[0]
    assert not any(p.name.endswith(':') for p in tmp_path.iterdir())  # no 'memory:' folder


# Resuming ---------------------------------------------------------------------------------------

def _fit(tmp_path, epochs, ckpt_path=None):
    config = write_config(tmp_path / 'tiny.yaml',
                          tiny_config(tmp_path / 'run', limit_train_batches=2,
                                      limit_val_batches=1, log_every_n_steps=1))
    args = ['fit', '--config', config, f'--trainer.max_epochs={epochs}', '--plot=false']
    return main(args + ([f'--ckpt_path={ckpt_path}'] if ckpt_path else []))


def _epochs(path):
    with open(path, newline='') as f:
        return sorted({int(float(r['epoch'])) for r in csv.DictReader(f) if r.get('epoch')})


def test_resume_never_writes_through_a_link_named_like_the_metrics_backup(tmp_path):
    cli = _fit(tmp_path, 1)
    last, log_dir = cli.trainer.checkpoint_callback.last_model_path, cli.trainer.log_dir
    victim = tmp_path / 'victim.txt'
    victim.write_text('keep me')
    os.symlink(victim, os.path.join(log_dir, '.metrics_before_resume.csv'))
    with pytest.raises(SystemExit) as exc:  # a run folder holding a link is refused
        _fit(tmp_path, 2, last)
    assert exc.value.code == 2 and victim.read_text() == 'keep me'
    assert _epochs(os.path.join(log_dir, 'metrics.csv')) == [0]  # nothing lost


@pytest.mark.parametrize('name', ['hparams.yaml', 'config.yaml', 'metrics.csv',
                                  'epoch_metrics.jsonl'])
def test_resume_refuses_a_run_folder_holding_a_link(tmp_path, capsys, name):
    cli = _fit(tmp_path, 1)
    last, log_dir = cli.trainer.checkpoint_callback.last_model_path, cli.trainer.log_dir
    victim = tmp_path / 'victim.txt'
    victim.write_text('keep me')
    os.replace(os.path.join(log_dir, name), tmp_path / 'moved')
    os.symlink(victim, os.path.join(log_dir, name))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        _fit(tmp_path, 2, last)
    assert exc.value.code == 2 and victim.read_text() == 'keep me'
    assert f"{name}' is a symbolic link" in capsys.readouterr().err


def test_resume_skips_and_reports_damaged_metric_rows_and_keeps_the_file(tmp_path):
    cli = _fit(tmp_path, 2)
    last, log_dir = cli.trainer.checkpoint_callback.last_model_path, cli.trainer.log_dir
    metrics = os.path.join(log_dir, 'metrics.csv')
    with open(metrics) as f:
        lines = f.read().splitlines()
    good_rows = len(lines) - 1
    width = lines[0].count(',')
    lines.insert(2, ',' * width)  # an empty row: kept as before (no epoch)
    lines.insert(3, 'garbage' + ',' * width)  # an epoch that is not a number
    lines.insert(4, '1,2,3')  # too few fields
    lines.append('\x00\x01not,csv')
    with open(metrics, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    with pytest.warns(UserWarning, match=r"metrics\.csv': skipped 3 damaged row\(s\) of the run "
                                         r"being resumed \(line\(s\) 4, 5, "):
        cli = _fit(tmp_path, 3, last)
    assert cli.trainer.log_dir == log_dir
    assert _epochs(metrics) == [0, 1, 2]
    assert not os.path.exists(os.path.join(log_dir, '.metrics_before_resume.csv'))
    with open(metrics) as f:
        assert 'garbage' not in f.read()
    # and the next resume runs too (it used to crash the same way every time)
    cli = _fit(tmp_path, 4, cli.trainer.checkpoint_callback.last_model_path)
    assert _epochs(metrics) == [0, 1, 2, 3] and good_rows > 0


def test_resume_with_an_unreadable_metrics_header_keeps_the_old_file(tmp_path):
    cli = _fit(tmp_path, 1)
    last, log_dir = cli.trainer.checkpoint_callback.last_model_path, cli.trainer.log_dir
    with open(os.path.join(log_dir, 'metrics.csv'), 'wb') as f:
        f.write(b'\xff\xfe binary junk\n0,1\n')
    with pytest.warns(UserWarning, match=r"its header is not a CSVLogger's.*this copy of the "
                                         r"old one is kept"):
        _fit(tmp_path, 2, last)
    kept = os.path.join(log_dir, '.metrics_before_resume.csv')
    with open(kept, 'rb') as f:
        assert f.read() == b'\xff\xfe binary junk\n0,1\n'  # byte for byte
    assert _epochs(os.path.join(log_dir, 'metrics.csv')) == [1]


def test_last_ckpt_after_every_epoch_and_test_best(tmp_path):
    config, _ = monitored_config(tmp_path, 3)
    cli = main(['fit', '--config', config])
    last = cli.trainer.checkpoint_callback.dirpath + '/last.ckpt'
    state = torch.load(last, weights_only=True)
    # Lightning's save_last only refreshed last.ckpt when val/acc improved (epoch 0 here).
    assert (state['epoch'], state['global_step']) == (2, 9)
    best = cli.trainer.checkpoint_callback.best_model_path
    # `pyg-grf test --ckpt_path best` in a new process (as the config headers say).
    cli = main(['test', '--config', config, '--ckpt_path', 'best'])
    assert 'test/acc' in cli.trainer.callback_metrics
    assert best_checkpoint_of(last) == best


def test_test_best_without_monitor_fails_clearly(tmp_path):
    config = write_config(tmp_path / 'c.yaml', tiny_config(tmp_path / 'run',
                                                           limit_train_batches=1,
                                                           limit_val_batches=1))
    main(['fit', '--config', config])
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path best: no best checkpoint found.*"
                                                r"checkpoint\.monitor"):
        main(['test', '--config', config, '--ckpt_path', 'best'])
