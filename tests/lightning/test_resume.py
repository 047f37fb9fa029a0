import json
import os
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from pyg_grf.lightning.datamodules import SyntheticDataModule
from pyg_grf.lightning.tasks import GraphLevelTask
from tests.conftest import REPO
from tests.lightning.helpers import monitored_config


class StepRecorder(Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # (epoch, global step, batch index, the graphs' labels: identifies the batch)
        self.steps.append((trainer.current_epoch, trainer.global_step, batch_idx,
                           tuple(batch.y.tolist())))


def _run(root, max_epochs, ckpt_path=None, num_workers=1):
    from pyg_grf.transforms import AddGraphRandomFeatures
    pl.seed_everything(0)
    dm = SyntheticDataModule(num_graphs=32, split=(0.75, 0.25, 0.0), cache=False, batch_size=8,
                             num_workers=num_workers,
                             dataset_kwargs={'num_nodes': 8, 'motif': 'grid'},
                             pre_transform=AddGraphRandomFeatures(num_walks=4, p_halt=0.5,
                                                                  max_length=2, seed=0))
    # Dropout on: the random state must resume too (saved in the checkpoint by the task).
    task = GraphLevelTask(dict(in_channels=5, hidden_channels=8, out_channels=2, num_layers=1,
                               attn_type='grf', attn_kwargs={'max_length': 2},
                               dropout=0.2),
                          task='multiclass', num_classes=2, lr=0.01, warmup_epochs=1,
                          max_epochs=4)
    recorder = StepRecorder()
    trainer = pl.Trainer(max_epochs=max_epochs, accelerator='cpu', default_root_dir=root,
                         callbacks=[recorder, ModelCheckpoint(dirpath=root / 'ckpt',
                                                              save_last=True)],
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, gradient_clip_val=2.0, deterministic=True)
    trainer.fit(task, dm, ckpt_path=ckpt_path)
    return recorder.steps, task.state_dict(), trainer


@pytest.mark.slow
@pytest.mark.parametrize('num_workers', [0, 1])
def test_resume_from_last_checkpoint(tmp_path, num_workers):
    # num_workers=1: Lightning makes the training iterator before it sets the sampler's epoch,
    # and a resumed run trains its first epoch on it (the loader starts workers lazily)
    straight_steps, straight_state, _ = _run(tmp_path / 'straight', 4, num_workers=num_workers)
    first_steps, _, _ = _run(tmp_path / 'resumed', 2, num_workers=num_workers)
    assert (tmp_path / 'resumed' / 'ckpt' / 'last.ckpt').exists()
    second_steps, resumed_state, trainer = _run(tmp_path / 'resumed', 4, ckpt_path='last',
                                                num_workers=num_workers)
    assert trainer.current_epoch == 4
    # No lost or repeated epochs / steps, and the same batches in the same order.
    assert [s[:3] for s in first_steps + second_steps] == [s[:3] for s in straight_steps]
    assert first_steps + second_steps == straight_steps
    # The same final weights.
    assert straight_state.keys() == resumed_state.keys()
    for key in straight_state:
        assert torch.allclose(straight_state[key], resumed_state[key], atol=1e-6), key


def _fit_subprocess(config, root, kill=None, resume=False):
    # the test-only callback of the config is outside the CLI's allow-lists: trusted explicitly
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1',
               PYG_GRF_TEST_KILL=kill or 'never',
               PYG_GRF_TRUSTED_CLASSES='tests.lightning.helpers.KillAt')
    args = [sys.executable, '-m', 'pyg_grf.lightning.cli', 'fit', '--config', config,
            f'--trainer.default_root_dir={root}']
    if resume:
        args.append('--ckpt_path=last')
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    assert proc.returncode == (-9 if kill else 0), proc.stderr[-3000:]


@pytest.mark.slow
def test_kill_9_and_resume_equals_uninterrupted_run(tmp_path):
    import yaml
    _, cfg = monitored_config(tmp_path, 5)
    cfg['trainer']['callbacks'] = [{'class_path': 'tests.lightning.helpers.KillAt'}]
    config = str(tmp_path / 'kill.yaml')
    yaml.safe_dump(cfg, open(config, 'w'))

    straight = tmp_path / 'straight'
    _fit_subprocess(config, straight)
    resumed = tmp_path / 'resumed'
    # Killed: inside epoch 1, after epoch 2's training (before its checkpoint), at the end of
    # epoch 3's validation; each time resumed with --ckpt_path=last.
    _fit_subprocess(config, resumed, kill='batch:1:1')
    _fit_subprocess(config, resumed, kill='trainend:2', resume=True)
    _fit_subprocess(config, resumed, kill='valend:3', resume=True)
    _fit_subprocess(config, resumed, resume=True)

    def run_dir(root):
        versions = sorted(os.listdir(root / 'lightning_logs'))
        assert versions == ['version_0']  # one folder: best tracking continues
        return root / 'lightning_logs' / 'version_0'

    a, b = run_dir(straight), run_dir(resumed)
    rows_a = [json.loads(line) for line in open(a / 'epoch_metrics.jsonl')]
    rows_b = [json.loads(line) for line in open(b / 'epoch_metrics.jsonl')]
    assert [r['epoch'] for r in rows_b] == [0, 1, 2, 3, 4]  # none lost, none repeated
    assert rows_a == rows_b  # the same metrics, epoch by epoch
    assert sorted(os.listdir(a / 'checkpoints')) == sorted(os.listdir(b / 'checkpoints'))
    last_a = torch.load(a / 'checkpoints' / 'last.ckpt', weights_only=True)
    last_b = torch.load(b / 'checkpoints' / 'last.ckpt', weights_only=True)
    key = next(k for k in last_a['callbacks'] if k.startswith('AtomicModelCheckpoint'))
    assert last_a['callbacks'][key]['best_model_score'] == \
        last_b['callbacks'][key]['best_model_score']
    for name, value in last_a['state_dict'].items():
        assert torch.allclose(value, last_b['state_dict'][name], atol=1e-6), name
