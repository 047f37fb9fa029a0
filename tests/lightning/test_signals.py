"""pyg_grf.lightning.signals: SIGTERM / SIGINT become StopSignal in the main thread, forked
workers keep their own handlers, and the command ends as the signal would have; a `fit` stopped
in its first epoch leaves a last.ckpt from which it resumes to the uninterrupted run."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from pyg_grf.lightning.signals import StopSignal, stop_on_signals
from tests.conftest import REPO
from tests.lightning.helpers import tiny_config, write_config

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def test_stop_signal_is_a_system_exit_with_the_shell_status():
    exc = StopSignal(signal.SIGTERM)
    assert isinstance(exc, SIGTERMException) and isinstance(exc, SystemExit)
    assert not isinstance(exc, Exception)  # `except Exception` lets it through
    assert (exc.code, exc.signum, str(exc)) == (143, 15, 'stopped by SIGTERM')
    assert StopSignal(signal.SIGINT).code == 130


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_raises_and_the_handlers_come_back(signum):
    before = signal.getsignal(signum)
    with pytest.raises(StopSignal) as info:
        with stop_on_signals():
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # the handler runs between two bytecodes
                pass
    assert info.value.signum == signum
    assert signal.getsignal(signum) is before


def test_a_forked_worker_keeps_its_previous_handler():
    # a DataLoader worker forked inside the block: SIGTERM ends it by the signal (its handler
    # before the block, SIG_DFL), it does not raise StopSignal (which would exit with 143)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with stop_on_signals():
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10 ** 6):
                    pass
            finally:
                os._exit(7)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, \
        f'expected the child killed by SIGTERM, got wait status {status}'


def test_a_worker_waiting_on_a_lock_dies_by_sigterm():
    # Lightning's trainer stacks a handler that only logs ("Bypassing SIGTERM") on top of ours;
    # a worker forked then, waiting on a lock, got SIGTERM from Pool.terminate() and waited on
    # (the Python handler ran and returned): `pyg-grf fit` hung after processing Peptides-func.
    # Forked workers must start with the handler of before the block (SIG_DFL).
    import multiprocessing
    lock = multiprocessing.get_context('fork').Lock()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with stop_on_signals():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the stacked handler
        lock.acquire()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
                lock.acquire()  # blocks: the parent holds it
            finally:
                os._exit(7)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail('the forked worker survived SIGTERM while waiting on a lock')
        lock.release()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the block restored it
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, \
        f'expected the child killed by SIGTERM, got wait status {status}'


@pytest.mark.slow  # a fresh interpreter importing Lightning: ~10 s on 2 cores
@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='reads /proc')
def test_the_command_ends_by_the_signal_and_kills_its_workers(tmp_path):
    # what console_main does on a stop, with a multiprocessing child standing in for a busy
    # loader worker: the parent ends by SIGTERM at once, the child does not outlive it
    script = textwrap.dedent(f"""
        import multiprocessing, os, signal, sys, time
        from pyg_grf.lightning.signals import StopSignal, exit_by_signal, stop_on_signals
        child = multiprocessing.get_context('fork').Process(target=time.sleep, args=(60,),
                                                            daemon=True)
        try:
            with stop_on_signals():
                child.start()
                open({str(tmp_path / 'child')!r}, 'w').write(str(child.pid))
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(60)
        except StopSignal as exc:
            exit_by_signal(exc.signum)
        sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    child = int((tmp_path / 'child').read_text())
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child), f'the child {child} outlived its parent'


def _running(pid):
    # a process that has not ended (a zombie has: it waits only to be reaped)
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except FileNotFoundError:
        return False


def test_a_stop_in_the_first_epoch_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    from pyg_grf.lightning.cli import main
    monkeypatch.setenv('PYG_GRF_TRUSTED_CLASSES', 'tests.lightning.helpers.SignalAt')
    cfg = tiny_config(tmp_path / 'straight', max_epochs=2, limit_train_batches=3,
                      limit_val_batches=2, num_sanity_val_steps=2)
    cfg['model']['init_args']['model']['init_args']['dropout'] = 0.2
    cfg['checkpoint'] = {'monitor': 'val/acc', 'mode': 'max', 'save_last': True}
    cfg['data']['init_args']['num_workers'] = 0  # (workers: the slow test_graceful_stop.py)
    cfg['plot'] = False
    straight = main(['fit', '--config', write_config(tmp_path / 'a.yaml', cfg)])

    cfg['trainer']['default_root_dir'] = str(tmp_path / 'stopped')
    stopped = write_config(tmp_path / 'b.yaml', cfg)
    cfg['trainer']['callbacks'] = [{'class_path': 'tests.lightning.helpers.SignalAt',
                                    'init_args': {'epoch': 0, 'batch': 1}}]
    with pytest.raises(StopSignal):
        with stop_on_signals():
            main(['fit', '--config', write_config(tmp_path / 'c.yaml', cfg)])
    folder = tmp_path / 'stopped' / 'lightning_logs' / 'version_0' / 'checkpoints'
    assert os.listdir(folder) == ['last.ckpt']  # written before the first step; no litter
    assert torch.load(folder / 'last.ckpt', weights_only=True)['global_step'] == 0
    resumed = main(['fit', '--config', stopped, '--ckpt_path=last'])

    assert resumed.trainer.global_step == straight.trainer.global_step == 6
    assert sorted(os.listdir(folder)) == sorted(os.listdir(
        tmp_path / 'straight' / 'lightning_logs' / 'version_0' / 'checkpoints'))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
