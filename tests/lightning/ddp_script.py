r"""Run by tests/lightning/test_ddp.py as ``python -m tests.lightning.ddp_script OUT.json``:
trains on 2 CPU processes (DDP, gloo), tests with metrics reduced across the ranks, and (rank 0)
writes them beside a single-process evaluation of the same weights on the whole test set."""
import json
import sys

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch_geometric.loader import DataLoader

from pyg_grf.lightning.datamodules import SyntheticDataModule
from pyg_grf.lightning.tasks import GraphLevelTask
from pyg_grf.transforms import AddGraphRandomFeatures


def main(out: str) -> None:
    pl.seed_everything(0)
    # 16 test graphs: 8 per rank, so DDP's sampler adds no padding duplicates.
    dm = SyntheticDataModule(num_graphs=40, split=(0.5, 0.1, 0.4), cache=False, batch_size=4,
                             dataset_kwargs={'num_nodes': 8, 'motif': 'grid'},
                             pre_transform=AddGraphRandomFeatures(num_walks=4, p_halt=0.5,
                                                                  max_length=2, seed=0))
    task = GraphLevelTask(dict(in_channels=5, hidden_channels=8, out_channels=2, num_layers=1,
                               attn_type='grf', attn_kwargs={'max_length': 2}),
                          task='multiclass', num_classes=2, lr=0.01)
    trainer = pl.Trainer(strategy='ddp', accelerator='cpu', devices=2, max_epochs=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    synced = trainer.test(task, dm, verbose=False)[0]
    # Each rank saw only its half of the test set:
    local = len(trainer.test_dataloaders.sampler) if hasattr(trainer.test_dataloaders,
                                                              'sampler') else None
    if trainer.global_rank != 0:
        return
    # Single-process reference on the whole test set with the trained weights.
    task.eval()
    loader = DataLoader(dm.test_dataset, batch_size=len(dm.test_dataset))
    with torch.no_grad():
        batch = next(iter(loader))
        logits = task(batch)
    ref = {'test/loss': float(F.cross_entropy(logits, batch.y)),
           'test/acc': float((logits.argmax(-1) == batch.y).float().mean())}
    with open(out, 'w') as f:
        json.dump({'ddp': {k: float(v) for k, v in synced.items()}, 'single': ref,
                   'world_size': trainer.world_size, 'local_test_size': local,
                   'test_size': len(dm.test_dataset)}, f)


if __name__ == '__main__':
    main(sys.argv[1])
