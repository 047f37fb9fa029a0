"""SIGTERM / Ctrl-C during `pyg-grf fit` (the README's main job, small): the process ends within
seconds, leaves a last.ckpt, and `--ckpt_path last` resumes to the end of an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from tests.conftest import REPO

#: The budget the issue sets for a stop (the stop itself takes well under a second).
STOP_BUDGET_S = 10.0


def _config(tmp_path):
    # the main job, small: 160 graphs (4 training batches of 32), 3 epochs, dropout on so that
    # the random state must resume too; a test-only callback reports the step
    with open(REPO / 'experiments' / 'configs' / 'motifs_grf.yaml') as f:
        cfg = yaml.safe_load(f)
    cfg['trainer'].update(max_epochs=3, enable_progress_bar=False,
                          callbacks=[{'class_path': 'tests.lightning.helpers.StepFile'}])
    cfg['model']['init_args']['model']['init_args']['dropout'] = 0.1
    cfg['data']['init_args'].update(num_graphs=160, root=str(tmp_path / 'data'))
    cfg['plot'] = False
    path = tmp_path / 'main_job_small.yaml'
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _start(config, root, step_file, resume=False):
    # the test-only callback is outside the CLI's allow-lists: trusted explicitly
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1',
               PYG_GRF_TEST_STEP_FILE=str(step_file),
               PYG_GRF_TRUSTED_CLASSES='tests.lightning.helpers.StepFile')
    args = [sys.executable, '-m', 'pyg_grf.lightning.cli', 'fit', '--config', config,
            f'--trainer.default_root_dir={root}'] + (['--ckpt_path=last'] if resume else [])
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _stop_at(proc, step_file, step, signum):
    # signal the run when it is about to train (epoch, batch) = step; seconds until it ended
    deadline = time.monotonic() + 300
    while not (step_file.exists() and step_file.read_text() == f'{step[0]} {step[1]}'):
        assert proc.poll() is None, f'the run ended before step {step}: ' + proc.stderr.read()
        assert time.monotonic() < deadline, f'step {step} not reached in 300 s'
        time.sleep(0.02)
    proc.send_signal(signum)
    sent = time.monotonic()
    try:
        out, err = proc.communicate(timeout=STOP_BUDGET_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f'{signal.Signals(signum).name} at step {step}: the run did not end within '
                    f'{STOP_BUDGET_S} s; its log:\n{err[-3000:]}')
    return time.monotonic() - sent, proc.returncode, err


def _run_dir(root):
    versions = sorted(os.listdir(root / 'lightning_logs'))
    assert versions == ['version_0'], f'expected one log version (resumed in place), got {versions}'
    return root / 'lightning_logs' / 'version_0'


@pytest.mark.slow
def test_sigterm_and_ctrl_c_stop_fit_in_seconds_and_resume_to_the_uninterrupted_run(tmp_path):
    config = _config(tmp_path)
    straight, stopped = tmp_path / 'straight', tmp_path / 'stopped'
    step_file = tmp_path / 'step'

    proc = _start(config, straight, tmp_path / 'step_straight')
    out_straight, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]

    # SIGTERM inside the first epoch: last.ckpt is the one written before the first step
    proc = _start(config, stopped, step_file)
    took, code, err = _stop_at(proc, step_file, (0, 2), signal.SIGTERM)
    assert code == -signal.SIGTERM, f'expected death by SIGTERM, got status {code}:\n{err[-3000:]}'
    assert took < STOP_BUDGET_S
    last = _run_dir(stopped) / 'checkpoints' / 'last.ckpt'
    assert last.is_file(), f'no last.ckpt after SIGTERM: {os.listdir(last.parent)}'
    assert torch.load(last, weights_only=True)['global_step'] == 0
    assert 'pyg-grf: stopped by SIGTERM' in err and f"resumes from '{last}'" in err
    # Ctrl-C (SIGINT) inside the second epoch of the resumed run
    proc = _start(config, stopped, step_file, resume=True)
    took_int, code, err = _stop_at(proc, step_file, (1, 1), signal.SIGINT)
    assert code == -signal.SIGINT, f'expected death by SIGINT, got status {code}:\n{err[-3000:]}'
    assert took_int < STOP_BUDGET_S
    assert torch.load(last, weights_only=True)['epoch'] == 0  # the end of epoch 0
    assert not [f for f in os.listdir(last.parent) if f.endswith('.part')]
    proc = _start(config, stopped, step_file, resume=True)
    out_resumed, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]

    a, b = _run_dir(straight), _run_dir(stopped)
    rows_a = [json.loads(line) for line in open(a / 'epoch_metrics.jsonl')]
    rows_b = [json.loads(line) for line in open(b / 'epoch_metrics.jsonl')]
    assert [r['epoch'] for r in rows_b] == [0, 1, 2]  # none lost, none repeated
    assert rows_a == rows_b  # the same metrics, epoch by epoch
    assert sorted(os.listdir(a / 'checkpoints')) == sorted(os.listdir(b / 'checkpoints'))
    state_a = torch.load(a / 'checkpoints' / 'last.ckpt', weights_only=True)['state_dict']
    state_b = torch.load(b / 'checkpoints' / 'last.ckpt', weights_only=True)['state_dict']
    assert state_a.keys() == state_b.keys()
    for name, value in state_a.items():
        assert torch.equal(value, state_b[name]), name
    # the test after fit (best checkpoint) prints the same metrics
    test_a = [line for line in out_straight.splitlines() if 'test/' in line]
    test_b = [line for line in out_resumed.splitlines() if 'test/' in line]
    assert test_a and test_a == test_b
    # every step logged once in metrics.csv (the interrupted epochs' rows dropped on resume)
    steps_a = (a / 'metrics.csv').read_text().splitlines()
    steps_b = (b / 'metrics.csv').read_text().splitlines()
    assert steps_a == steps_b
    print(f'stop times: SIGTERM {took:.2f} s, SIGINT {took_int:.2f} s')
