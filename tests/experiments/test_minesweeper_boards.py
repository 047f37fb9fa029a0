r"""experiments/minesweeper_boards.py: held-out boards drawn by the published board's rule. The
rule is checked part by part against the published file (data tests) and each drawn board
against an independent construction (a 3 x 3 convolution of the mine grid, PyG's ``grid``)."""
import os.path as osp

import numpy as np
import pytest
import torch
from torch_geometric.utils import grid

from tests.experiments import experiment_module

mb = experiment_module('minesweeper_boards')


def neighbour_mines(labels: np.ndarray, side: int) -> np.ndarray:
    r"""Mines among the 8 neighbours of every cell, by a 3 x 3 convolution of the mine grid."""
    g = torch.as_tensor(labels, dtype=torch.float32).view(1, 1, side, side)
    kernel = torch.ones(1, 1, 3, 3)
    kernel[0, 0, 1, 1] = 0
    return torch.nn.functional.conv2d(g, kernel, padding=1).view(-1).round().long().numpy()


def check_rule(b: dict, side: int, cap: int = 5):
    n = side * side
    labels, x = b['node_labels'], b['node_features']
    assert labels.sum() == round(0.2 * n)
    hidden = x[:, 0] == 1
    assert hidden.sum() == n // 2 and (x.sum(1) == 1).all()
    count = np.minimum(neighbour_mines(labels, side), cap)
    assert (x[~hidden].argmax(1) - 1 == count[~hidden]).all()
    for s in range(b['train_masks'].shape[0]):
        tr, va, te = (b[f'{k}_masks'][s] for k in ('train', 'val', 'test'))
        assert (tr.astype(int) + va + te == 1).all()  # a partition
        assert (tr.sum(), va.sum(), te.sum()) == (n // 2, n // 4, n - n // 2 - n // 4)


def test_king_edges_are_pygs_grid_without_self_loops():
    for side in (2, 3, 7):
        (row, col), _ = grid(side, side)
        ref = {(int(i), int(j)) for i, j in zip(row, col) if i < j}
        e = mb.king_edges(side)
        assert {tuple(p) for p in e.tolist()} == ref and len(e) == len(ref)


@pytest.mark.parametrize('side', [10, 100])
def test_a_board_follows_the_rule(side):
    b = mb.board(3, side=side)
    check_rule(b, side)
    assert (b['edges'] == mb.king_edges(side)).all()
    other = mb.board(4, side=side)
    assert not (other['node_labels'] == b['node_labels']).all()
    again = mb.board(3, side=side)
    assert all((again[k] == b[k]).all() for k in b)


@pytest.mark.parametrize('kwargs, match', [
    (dict(side=1), 'side must be an integer >= 2, got 1'),
    (dict(side=4.0), 'side must be an integer >= 2, got 4.0'),
    (dict(mines=0.0), r'mines must be a fraction in \(0, 1\), got 0.0'),
    (dict(unknown=1.5), r'unknown must be a fraction in \(0, 1\), got 1.5'),
    (dict(cap=0), 'cap must be an integer >= 1, got 0'),
])
def test_bad_board_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mb.board(0, **kwargs)


@pytest.mark.data
def test_the_published_board_follows_the_same_rule(mirror):
    z = np.load(osp.join(mirror, 'HeterophilousGraphDataset', 'minesweeper', 'raw',
                         'minesweeper.npz'))
    published = {k: z[k] for k in z.files}
    assert sorted(published) == sorted(mb.board(0))
    assert (published['edges'] == mb.king_edges(100)).all()
    check_rule(published, 100)


def test_the_datamodule_reads_the_written_board(tmp_path):
    from pyg_grf.lightning.datamodules import HeterophilousDataModule
    root = mb.write_board(str(tmp_path / 'board'), 5)
    dm = HeterophilousDataModule(split=5, root=root)
    dm.setup()
    b = mb.board(5)
    data = dm.graph
    assert torch.equal(data.x, torch.as_tensor(b['node_features']))
    assert torch.equal(data.y, torch.as_tensor(b['node_labels']))
    assert torch.equal(data.train_mask, torch.as_tensor(b['train_masks'][5]))
    assert data.edge_index.size(1) == 2 * len(b['edges'])


def test_table_pairs_grf_with_its_controls_by_board(tmp_path):
    import json
    auroc = {'grf': [0.975, 0.980], 'none': [0.970, 0.978], 'linear': [0.976, 0.975]}
    with open(tmp_path / 'runs.jsonl', 'w') as f:
        for v, values in auroc.items():
            for board, a in zip((1, 2), values):
                f.write(json.dumps({'variant': v, 'seed': board, 'board': board,
                                    'test/auroc': a, 'best_val': a, 'params': 1,
                                    'fit_s': 1.0}) + '\n')
    text = mb.write_table(str(tmp_path), str(tmp_path / 'table.md'))
    assert (tmp_path / 'table.md').read_text() == text
    # grf - none per board: +0.5, +0.2 -> mean +0.35, SE 0.15, 2 of 2 better
    assert 'GRF minus the GCN alone, paired: +0.35 ± 0.15 (2/2 boards better).' in text
    # grf - linear: -0.1, +0.5 -> +0.20 ± 0.30, 1 of 2
    assert 'GRF minus unmasked linear, paired: +0.20 ± 0.30 (1/2 boards better).' in text
    assert 'grf 1: 97.50, 2: 98.00; none 1: 97.00, 2: 97.80' in text
