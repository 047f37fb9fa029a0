r"""Shared tiny settings of the Lightning tests (fast on 2 CPU cores)."""
import os
import signal

import torch
import yaml
from lightning.pytorch.callbacks import Callback

from pyg_grf.lightning.datamodules import SyntheticDataModule
from pyg_grf.lightning.link_metrics import LinkRankingMetrics, filtered_link_candidates, link_ranks


def tiny_config(root_dir, attn_type='grf', num_graphs=48, max_epochs=1, **trainer):
    r"""A complete `pyg-grf fit` config: a 1-layer GRF transformer on a small motif task."""
    trainer_cfg = dict(max_epochs=max_epochs, accelerator='cpu', devices=1,
                       default_root_dir=str(root_dir), enable_progress_bar=False,
                       enable_model_summary=False, num_sanity_val_steps=0)
    trainer_cfg.update(trainer)
    model = dict(in_channels=5, hidden_channels=8, out_channels=2, num_layers=1, heads=1,
                 attn_type=attn_type)
    if attn_type == 'grf':
        model['attn_kwargs'] = {'max_length': 2}
    return {
        'seed_everything': 0,
        'trainer': trainer_cfg,
        'model': {
            'class_path': 'pyg_grf.lightning.tasks.GraphLevelTask',
            'init_args': {
                'task': 'multiclass', 'num_classes': 2, 'lr': 0.01,
                'model': {'class_path': 'pyg_grf.nn.models.graph_transformer.GraphTransformer',
                          'init_args': model},
            },
        },
        'data': {
            'class_path': 'pyg_grf.lightning.datamodules.SyntheticDataModule',
            'init_args': {
                'task': 'motifs', 'num_graphs': num_graphs, 'cache': False, 'batch_size': 8,
                'dataset_kwargs': {'num_nodes': 10, 'motif': 'grid'},
                'pre_transform': {
                    'class_path': 'pyg_grf.transforms.AddGraphRandomFeatures',
                    'init_args': {'num_walks': 4, 'p_halt': 0.5, 'max_length': 2, 'seed': 0},
                },
            },
        },
    }


def write_config(path, config):
    with open(path, 'w') as f:
        yaml.safe_dump(config, f)
    return str(path)



class KillAt(Callback):
    """Kills its own process with SIGKILL at the point named by $PYG_GRF_TEST_KILL:
    'batch:E:B' (start of batch B of epoch E), 'valend:E' (end of validation in epoch E) or
    'trainend:E' (end of training epoch E, before that epoch's checkpoint is written)."""

    def _kill(self, point):
        if os.environ.get('PYG_GRF_TEST_KILL') == point:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._kill(f'batch:{trainer.current_epoch}:{batch_idx}')

    def on_validation_end(self, trainer, pl_module):
        self._kill(f'valend:{trainer.current_epoch}')

    def on_train_epoch_end(self, trainer, pl_module):
        self._kill(f'trainend:{trainer.current_epoch}')


class SignalAt(Callback):
    """Sends its own process `signum` (default SIGTERM) at the start of training batch `batch`
    of epoch `epoch`."""

    def __init__(self, epoch: int = 0, batch: int = 0, signum: int = int(signal.SIGTERM)):
        self.epoch, self.batch, self.signum = epoch, batch, signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            os.kill(os.getpid(), self.signum)


class StepFile(Callback):
    """Writes 'epoch batch' of the training batch about to run to the file named by
    $PYG_GRF_TEST_STEP_FILE (rewritten at every batch), so that a test can signal a `pyg-grf fit`
    subprocess at a known point."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        path = os.environ.get('PYG_GRF_TEST_STEP_FILE')
        if path:
            with open(path + '.tmp', 'w') as f:
                f.write(f'{trainer.current_epoch} {batch_idx}')
            os.replace(path + '.tmp', path)


class FoldedSyntheticDataModule(SyntheticDataModule):
    """The synthetic motif task with `fold` / `num_folds`, so that `pyg-grf cv` runs on it
    without data: fold k tests on every num_folds-th graph from k, validates on those of k+1."""

    def __init__(self, fold: int = 0, num_folds: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.fold = fold
        self.num_folds = num_folds

    def split(self, dataset):
        idx = torch.arange(len(dataset))
        test = idx % self.num_folds == self.fold
        val = idx % self.num_folds == (self.fold + 1) % self.num_folds
        return dataset[idx[~test & ~val]], dataset[idx[val]], dataset[idx[test]]


def monitored_config(tmp_path, max_epochs, **trainer):
    """A tiny run that monitors val/acc and saves last.ckpt: (config path, config)."""
    cfg = tiny_config(tmp_path / 'run', max_epochs=max_epochs, limit_train_batches=3,
                      limit_val_batches=2, log_every_n_steps=1, **trainer)
    cfg['checkpoint'] = {'monitor': 'val/acc', 'mode': 'max', 'save_last': True}
    return write_config(tmp_path / 'c.yaml', cfg), cfg


def filtered_link_ranks(scores, edge_label_index, edge_label, batch=None, exclude_self=False):
    r"""Filtered ranks ``[P]`` of the positive pairs and their graphs from dense per-graph scores
    ``[B, N_max, N_max]`` (``[N, N]`` for one graph), through the package's pieces."""
    if scores.dim() == 2:
        scores = scores.unsqueeze(0)
    cand = filtered_link_candidates(edge_label_index, edge_label, batch,
                                    scores.size(1) if batch is None else None,
                                    exclude_self=exclude_self)
    rows = scores[cand.graph, cand.src_local]  # [P, N_max]
    pos = rows.gather(1, cand.dst_local.unsqueeze(1)).squeeze(1)
    return link_ranks(pos, rows, cand.mask), cand.graph


def link_ranking_metrics(ranks, graph=None, ks=(1, 3, 10), reduction='graph'):
    r"""MRR and Hits@k of one set of ranks (:class:`LinkRankingMetrics` on one update)."""
    metric = LinkRankingMetrics(ks, reduction)
    metric.update(ranks, graph)
    return metric.compute()
