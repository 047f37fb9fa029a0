r"""experiments/node_selection_probe.py: its table's means and paired differences against values
computed by hand from synthetic rows."""
import json

import pytest

from tests.experiments import experiment_module

probe = experiment_module('node_selection_probe')


def test_table_means_and_paired_differences(tmp_path):
    acc = {'grf': [0.80, 0.78], 'linear': [0.81, 0.80], 'none': [0.83, 0.82]}
    with open(tmp_path / 'runs.jsonl', 'w') as f:
        for v, values in acc.items():
            for seed, a in enumerate(values):
                f.write(json.dumps({'variant': v, 'seed': seed, 'epochs': 200, 'fit_s': 10.0,
                                    'test/best_val': a, 'test/last': a - 0.01,
                                    'test/mean': a - 0.02, 'best_val': 0.8,
                                    'val/mean': 0.78}) + '\n')
    text = probe.write_table(str(tmp_path))
    assert (tmp_path / 'table.md').read_text() == text
    assert '| grf | 2 | 79.0 ± 1.4 | 78.0 ± 1.4 | 77.0 ± 1.4 | 80.0 ± 0.0 |' in text
    # grf - none per seed: -3, -4 -> mean -3.5, SE 0.5, 0 of 2 better, in every reading
    assert ('| grf - none | -3.5 ± 0.5 (0/2) | -3.5 ± 0.5 (0/2) | -3.5 ± 0.5 (0/2) |'
            in text)
    assert '| grf - linear | -1.5 ± 0.5 (0/2) |' in text
    assert 'grf_resample -' not in text  # no rows of it: no line


def test_too_few_epochs_for_the_averaged_reading():
    with pytest.raises(ValueError, match='expected more epochs than 100, got 100'):
        probe.fit('none', 0, 100)


def test_resampled_variant_is_paired_against_fixed_draw(tmp_path):
    acc = {'grf': [0.80, 0.78], 'grf_resample': [0.81, 0.80]}
    with open(tmp_path / 'runs.jsonl', 'w') as f:
        for v, values in acc.items():
            for seed, a in enumerate(values):
                f.write(json.dumps({'variant': v, 'seed': seed, 'epochs': 200, 'fit_s': 10.0,
                                    'test/best_val': a, 'test/last': a, 'test/mean': a,
                                    'best_val': 0.8, 'val/mean': 0.78}) + '\n')
    text = probe.write_table(str(tmp_path))
    # per seed +1, +2 -> mean +1.5, SE 0.5, 2 of 2 better
    assert '| grf_resample - grf | +1.5 ± 0.5 (2/2) |' in text
    assert '| grf - none |' not in text  # no control rows: no line


def test_pinned_hop0_stays_zero_while_the_rest_learns():
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import grid

    from pyg_grf.nn import GRFNodeModel
    from pyg_grf.transforms import AddGraphRandomFeatures
    torch.manual_seed(0)
    edge_index, _ = grid(4, 4)
    data = AddGraphRandomFeatures(num_walks=8, max_length=3, seed=0)(
        Data(x=torch.randn(16, 5), edge_index=edge_index))
    model = GRFNodeModel(5, 8, 3, num_layers=2, head='conv', attn_type='grf', heads=2,
                         gate_init=0.5, attn_kwargs={'max_length': 3})
    probe.pin_hop0(model.attn)
    before = model.attn.f.detach().clone()
    assert (before[:, 0] == 0).all() and (before[:, 1:] != 0).all()
    opt = torch.optim.Adam(model.parameters(), lr=0.1, weight_decay=5e-4)
    for _ in range(3):
        opt.zero_grad()
        model(data).square().sum().backward()
        opt.step()
    f = model.attn.f.detach()
    assert (f[:, 0] == 0).all()
    assert not torch.allclose(f[:, 1:], before[:, 1:])
