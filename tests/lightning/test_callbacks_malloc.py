r"""MallocTrim: the resident memory of a run under the tuned allocator stays bounded."""
import sys

import pytest

from pyg_grf.lightning.callbacks import MallocTrim


def test_trims_every_n_steps_and_after_validation(monkeypatch):
    import pyg_grf.utils as utils
    calls = []
    monkeypatch.setattr(utils, 'trim_malloc', lambda: calls.append(1) or True)
    cb = MallocTrim(every_n_steps=3)
    for i in range(10):
        cb.on_train_batch_end(None, None, None, None, i)
    assert len(calls) == 3  # after steps 3, 6, 9
    cb.on_validation_epoch_end(None, None)
    assert len(calls) == 4 and cb.trims == 4


def test_bad_every_n_steps():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="'every_n_steps' must be an integer >= 1"):
            MallocTrim(every_n_steps=bad)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc only')
def test_trim_returns_freed_heap_memory():
    # under tune_malloc's settings a freed large block stays resident; trim_malloc gives it back
    import ctypes

    from pyg_grf.utils import trim_malloc

    def rss_mib():
        with open('/proc/self/status') as f:
            return int(f.read().split('VmRSS:')[1].split()[0]) // 1024
    libc = ctypes.CDLL('libc.so.6')
    libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: large blocks from the heap
    libc.mallopt(-1, 2 ** 31 - 1)  # M_TRIM_THRESHOLD: no automatic trim
    try:
        blocks = [ctypes.create_string_buffer(4 << 20) for _ in range(64)]  # 256 MiB
        keep = ctypes.create_string_buffer(1 << 10)  # allocated last: pins the heap top
        del blocks
        before = rss_mib()
        assert trim_malloc()
        after = rss_mib()
        assert before - after > 128, (before, after)
        del keep
    finally:  # glibc's defaults (mmap threshold 128 KiB dynamic, trim threshold 128 KiB)
        libc.mallopt(-4, 65536)
        libc.mallopt(-1, 128 * 1024)


def test_cli_adds_it_when_the_allocator_is_tuned(tmp_path, monkeypatch):
    import pyg_grf.lightning.cli as cli
    monkeypatch.setattr(cli, 'malloc_tuned', lambda: True)
    trainer_callbacks = []
    orig = cli.LightningCLI._instantiate_trainer

    def spy(self, config, callbacks):
        trainer_callbacks.extend(callbacks)
        return orig(self, config, callbacks)
    monkeypatch.setattr(cli.LightningCLI, '_instantiate_trainer', spy)
    cli.GRFLightningCLI(args=['--config', 'experiments/configs/motifs_grf.yaml',
                              '--trainer.fast_dev_run=true', '--plot=false',
                              f'--trainer.default_root_dir={tmp_path}'], run=False)
    assert any(isinstance(c, MallocTrim) for c in trainer_callbacks)
