r"""experiments/node_branch_probe.py: the hidden placement against PyG layers and the dense GRF
reference, the zero-initialised branch starting at the GCN alone, and the table's means and
paired differences against values computed by hand from synthetic rows."""
import json

import torch
import torch.nn.functional as F

from tests.experiments import experiment_module
from tests.nn.models.test_node import dense_grf_reference, pyg_gcn, small_graph

probe = experiment_module('node_branch_probe')


def small_model():
    from pyg_grf.nn import GRFNodeModel
    torch.manual_seed(0)
    data = small_graph()
    data.x = data.x.double()
    model = GRFNodeModel(5, 8, 3, num_layers=2, head='conv', attn_type='grf', heads=2,
                         gate_init=0.5, attn_kwargs={'max_length': 3}).double().eval()
    return model, data


def test_hidden_placement_is_attention_added_before_the_second_convolution():
    model, data = small_model()
    h = F.relu(pyg_gcn(model.convs[0], data.x, data.edge_index))
    z = dense_grf_reference(model.attn, h, data)
    ref = pyg_gcn(model.head, h + 0.5 * z, data.edge_index)
    with torch.no_grad():
        out = probe.hidden_forward(model, data)
    assert torch.allclose(out, ref, atol=1e-10)
    # and not the default placement (attention mapped to the logits)
    assert not torch.allclose(model(data), ref, atol=1e-3)


def test_table_means_and_paired_differences(tmp_path):
    acc = {'grf': [0.80, 0.78], 'linear': [0.81, 0.80], 'none': [0.83, 0.82],
           'grf_decay': [0.82, 0.81]}
    with open(tmp_path / 'runs.jsonl', 'w') as f:
        for v, values in acc.items():
            for seed, a in enumerate(values):
                f.write(json.dumps({'variant': v, 'seed': seed, 'fit_s': 10.0, 'test/acc': a,
                                    'best_val': 0.80 + seed / 100,
                                    'gate': None if v == 'none' else -0.5}) + '\n')
    text = probe.write_table(str(tmp_path))
    assert (tmp_path / 'table.md').read_text() == text
    assert '| grf | 2 | 79.0 ± 1.4 | 80.5 | 0.50 | 10 |' in text
    assert '| none | 2 | 82.5 ± 0.7 | 80.5 |  | 10 |' in text
    # grf - none per seed: -3, -4 -> mean -3.5, SE 0.5, 0 of 2 better; equal validation
    assert '| grf - none | -3.5 ± 0.5 (0/2) | +0.0 ± 0.0 |' in text
    # grf_decay - grf: +2, +3 -> +2.5 ± 0.5, 2 of 2
    assert '| grf_decay - grf | +2.5 ± 0.5 (2/2) |' in text
    assert 'grf_hidden -' not in text  # no rows of it: no line
