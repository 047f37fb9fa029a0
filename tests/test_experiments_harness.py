"""experiments/harness.py (the experiments' shared seeds-and-variants runner over the product's
training stack): resume from the JSONL file, paired differences against hand computation."""
import importlib.util
import json
import math
import os.path as osp
import sys

import pytest

HERE = osp.dirname(osp.dirname(osp.abspath(__file__)))
spec = importlib.util.spec_from_file_location('harness', osp.join(HERE, 'experiments',
                                                                  'harness.py'))
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)


def fake_run(variant, spec, seed, root):
    assert osp.isdir(root)  # a fresh temporary root per run
    acc = {'grf': 0.8, 'linear': 0.7}[variant] + 0.01 * seed + (0.02 if seed == 1 else 0)
    return {'test/acc': acc, 'best_val': acc - 0.05, 'params': 10, 'fit_s': 1.0}


def test_run_grid_resumes_and_summarises(tmp_path):
    calls = []

    def run(*args):
        calls.append(args[:1] + args[2:3])
        return fake_run(*args)
    variants = {'grf': [], 'linear': ['--x=1']}
    rows = harness.run_grid(variants, [0, 1], str(tmp_path), run, key={'epochs': 3},
                            log=lambda s: None)
    assert len(rows) == 4 and len(calls) == 4
    # a second call with one more seed runs only the new pairs; another key runs everything
    rows = harness.run_grid(variants, [0, 1, 2], str(tmp_path), run, key={'epochs': 3},
                            log=lambda s: None)
    assert len(rows) == 6 and len(calls) == 6
    assert len(harness.run_grid(variants, [0], str(tmp_path), run, key={'epochs': 4},
                                log=lambda s: None)) == 2
    with open(tmp_path / 'runs.jsonl') as f:
        assert len([json.loads(line) for line in f]) == 8
    p = harness.paired(rows, 'grf', 'linear', 'test/acc')
    assert p['seeds'] == 3 and p['better'] == 3
    assert p['mean'] == pytest.approx(10.0) and p['se'] == pytest.approx(0.0, abs=1e-9)
    table = harness.summary_table(rows, 'test/acc', control='linear')
    line = [ln for ln in table.splitlines() if ln.startswith('| grf ')][0]
    accs = [80.0, 83.0, 82.0]
    mean = sum(accs) / 3
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / 2)
    assert f'{mean:.1f} ± {std:.1f}' in line and '+10.0 ± 0.0 (3/3 seeds better)' in line
    # an error metric: a seed is better with a lower value, and the worst seed is the highest
    assert harness.paired(rows, 'grf', 'linear', 'test/acc', lower_is_better=True)['better'] == 0
    table = harness.summary_table(rows, 'test/acc', control='linear', lower_is_better=True)
    line = [ln for ln in table.splitlines() if ln.startswith('| grf ')][0]
    assert '(0/3 seeds better) | 83.0 |' in line and '| max seed |' in table


def test_paired_needs_two_seeds():
    rows = [{'variant': 'grf', 'seed': 0, 'test/acc': 0.5},
            {'variant': 'linear', 'seed': 0, 'test/acc': 0.4}]
    assert harness.paired(rows, 'grf', 'linear', 'test/acc') is None
    assert harness.read_rows('/nonexistent/runs.jsonl') == []


def test_coordinate_search_against_exhaustive_search():
    # on a separable score the coordinate search finds the exhaustive argmax, scoring each
    # distinct candidate once; ties keep the earlier value
    import itertools
    space = {'a': [3, 1, 2, 4], 'b': [0.8, 0.5, 1.0], 'c': ['gat', 'none']}
    gain = {'a': {3: 0.1, 1: 0.0, 2: 0.4, 4: 0.3}, 'b': {0.8: 0.2, 0.5: 0.2, 1.0: 0.0},
            'c': {'gat': 0.0, 'none': 0.5}}
    seen = []

    def score(cfg):
        seen.append(json.dumps(cfg, sort_keys=True))
        return sum(gain[k][v] for k, v in cfg.items())
    chosen, tried = harness.coordinate_search(space, score, log=lambda s: None)
    best = max(itertools.product(*space.values()),
               key=lambda vs: sum(gain[k][v] for k, v in zip(space, vs)))
    assert chosen['a'] == best[0] == 2 and chosen['c'] == best[2] == 'none'
    assert chosen['b'] == 0.8  # tied with 0.5: the earlier value
    assert len(seen) == len(set(seen)) == len(tried) == 4 + 2 + 1
    assert all(t['score'] == pytest.approx(score(dict((k, t[k]) for k in space)))
               for t in tried)


def _paper_models():
    # imported as the experiments import it (the configs name its classes 'paper_models.X')
    if 'paper_models' not in sys.modules:
        spec = importlib.util.spec_from_file_location('paper_models', osp.join(
            HERE, 'experiments', 'paper_models.py'))
        module = importlib.util.module_from_spec(spec)
        sys.modules['paper_models'] = module
        spec.loader.exec_module(module)
    return sys.modules['paper_models']


@pytest.mark.parametrize('config,overrides,params', [
    # parameter counts of the networks of the earlier, hand-written experiment loops (their
    # committed result tables): the ported configs build the same networks
    ('citation_gat.yaml', {}, 92373),
    ('citation_grf_gps.yaml', {}, 125605),
    ('citation_grf_gps.yaml', {'attn_type': 'linear', 'attn_kwargs': {}}, 125589),
    ('tu_attention.yaml', {}, 3496),                       # PROTEINS, GKAT (Table 7 row)
    ('tu_attention.yaml', {'kind': 'gat'}, 3496),
    ('tu_gin.yaml', {}, 25349),
    ('motifs.yaml', {}, 560),                               # GKAT 2 x 9
    ('motifs.yaml', {'kind': 'grf', 'hidden_channels': 4}, 658),
    ('motifs.yaml', {'kind': 'linear', 'hidden_channels': 4}, 642),
    ('motifs.yaml', {'kind': 'gcn', 'hidden_channels': 20}, 582),
])
def test_paper_configs_build_the_networks_of_the_earlier_tables(config, overrides, params,
                                                                tmp_path):
    # every key of the config checked and every class built by the CLI class (no data loaded)
    from pyg_grf.lightning.cli import GRFLightningCLI
    _paper_models()
    args = ['--config', osp.join(HERE, 'experiments', 'configs', 'paper', config),
            f'--trainer.default_root_dir={tmp_path}']
    args += [f'--model.init_args.model.init_args.{k}='
             + (v if isinstance(v, str) else json.dumps(v)) for k, v in overrides.items()]
    cli = GRFLightningCLI(args=args, run=False)
    assert sum(p.numel() for p in cli.model.model.parameters()) == params
    assert cli.model.hparams.optimizer == 'adam'


def test_paper_models_reject_bad_options():
    pm = _paper_models()
    with pytest.raises(ValueError, match="kind must be one of .*got 'gin'"):
        pm.MotifNet(5, kind='gin')
    with pytest.raises(ValueError,
                       match=r"init must be one of \('torch', 'glorot', 'mha'\), got 'xavier'"):
        pm.MotifNet(5, kind='grf', init='xavier')
    with pytest.raises(ValueError, match="kind must be 'gkat' or 'gat', got 'gcn'"):
        pm.TUAttentionClassifier(3, 2, kind='gcn')
    with pytest.raises(ValueError, match="local must be 'none' or 'gat', got 'gcn'"):
        pm.CitationGRFGPS(8, 3, local='gcn')


@pytest.mark.parametrize('kind', ['grf', 'linear'])
def test_motif_net_glorot_init_is_glorot_uniform(kind):
    # Glorot-uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)), so std a / sqrt(3); torch's
    # default (Kaiming-uniform, a = sqrt(5)) draws from U(-1 / sqrt(fan_in), 1 / sqrt(fan_in))
    import torch
    pm = _paper_models()
    torch.manual_seed(0)
    net = pm.MotifNet(5, kind=kind, hidden_channels=16, init='glorot')
    default = pm.MotifNet(5, kind=kind, hidden_channels=16)
    maps = [(net.conv1.to_qkv, default.conv1.to_qkv), (net.conv2.to_out, default.conv2.to_out),
            (net.lin, default.lin)]
    for lin, lin0 in maps:
        fan_out, fan_in = lin.weight.shape
        a = math.sqrt(6 / (fan_in + fan_out))
        w = lin.weight.detach()
        assert w.abs().max() <= a and w.abs().max() > 0.9 * a
        assert abs(w.std().item() - a / math.sqrt(3)) < 0.15 * a / math.sqrt(3)
        assert torch.count_nonzero(lin.bias) == 0
        assert lin0.weight.detach().abs().max() <= 1 / math.sqrt(fan_in)  # torch's default
        assert torch.count_nonzero(lin0.bias) > 0
    assert net.head.weight.abs().max() <= 1 / math.sqrt(net.head.weight.size(1))  # untouched


def test_paper_config_fits_and_tests_through_the_harness(tmp_path, monkeypatch):
    # a paper network through the product's CLI class (tiny motif dataset, one epoch): the
    # config, the registered network, the fit and the test of the best checkpoint are wired
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    _paper_models()
    row = harness.fit_and_test(
        osp.join(HERE, 'experiments', 'configs', 'paper', 'motifs.yaml'),
        ['--data.init_args.num_graphs=48', '--trainer.enable_checkpointing=true',
         '--trainer.logger=false'], seed=0, root=str(tmp_path / 'run'), epochs=1)
    assert row['params'] == 560 and row['epochs_run'] == 1
    assert 0.0 <= row['test/acc'] <= 1.0 and 0.0 <= row['best_val'] <= 1.0


def test_select_on_validation_and_the_shared_command_line(tmp_path):
    # the candidate with the best mean validation score over the selection seeds, each fitted
    # once per seed under its own key (a stopped search resumes from runs.jsonl)
    fitted = []

    def run(candidate, seeds, key):
        def fit(variant, spec, seed, root):
            fitted.append((candidate['lr'], seed))
            return {'best_val': {0.1: 0.5, 0.01: 0.7}[candidate['lr']] + 0.01 * seed,
                    'test/acc': 0.0, 'params': 1, 'fit_s': 0.0}
        return harness.run_grid({'m': None}, seeds, str(tmp_path), fit, key=key,
                                log=lambda s: None)
    chosen = harness.select_on_validation({'lr': [0.1, 0.01]}, run, seeds=(100, 101),
                                          log=lambda s: None)
    assert chosen == {'lr': 0.01} and sorted(fitted) == [(0.01, 100), (0.01, 101),
                                                          (0.1, 100), (0.1, 101)]
    assert harness.select_on_validation({'lr': [0.1, 0.01]}, run, seeds=(100, 101),
                                        log=lambda s: None) == chosen
    assert len(fitted) == 4  # resumed: nothing fitted again
    # the command line: --table-only rebuilds the table without running; another --out runs
    # without touching the committed table
    calls = []
    table = lambda: calls.append('table') or 'T'  # noqa: E731
    harness.experiment_main('doc', str(tmp_path), lambda a: calls.append(a.seeds), table,
                            lambda p: p.add_argument('--seeds', type=int, default=2),
                            ['--table-only'])
    harness.experiment_main('doc', str(tmp_path), lambda a: calls.append(a.seeds), table,
                            lambda p: p.add_argument('--seeds', type=int, default=2),
                            ['--seeds', '3', '--out', str(tmp_path / 'other')])
    assert calls == ['table', 3]
    # --set: an override for every run, refused on the committed folder or without '='
    seen = []
    harness.experiment_main('doc', str(tmp_path), lambda a: seen.append(
        list(harness.EXTRA_OVERRIDES)), table, argv=['--out', str(tmp_path / 'o'),
                                                      '--set', 'trainer.gradient_clip_val=0'])
    assert seen == [['--trainer.gradient_clip_val=0']]
    harness.EXTRA_OVERRIDES.clear()
    for bad in (['--set', 'a=1'], ['--out', str(tmp_path / 'o'), '--set', 'noequals']):
        with pytest.raises(SystemExit):
            harness.experiment_main('doc', str(tmp_path), lambda a: None, table, argv=bad)
    notes = tmp_path / 'notes.md'
    notes.write_text('hand-written\n')
    text = harness.write_markdown(str(tmp_path / 't.md'), ['# t', ''], str(notes), ['cmd'])
    assert text == '# t\n\nhand-written\n\nCommands:\n\n```\ncmd\n```\n'
    assert (tmp_path / 't.md').read_text() == text


def test_point_cloud_variants_match_parameters_and_run_through_the_harness(tmp_path,
                                                                            monkeypatch):
    # the scale experiment's variants are GraphTransformers built by the product's CLI from
    # one config (the GAT one through a second config file: attn_type None), parameter counts
    # matched to the GRF model's; one tiny cloud fit and tested, its steps timed
    from pyg_grf.lightning.cli import GRFLightningCLI
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    if 'point_cloud_scale' not in sys.modules:
        spec = importlib.util.spec_from_file_location('point_cloud_scale', osp.join(
            HERE, 'experiments', 'point_cloud_scale.py'))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules['point_cloud_scale'] = module
    pcs = sys.modules['point_cloud_scale']
    counts, kinds = {}, {}
    for variant in pcs.VARIANTS:
        cli = GRFLightningCLI(args=['--config', pcs.CONFIG, *pcs.overrides(variant, 128),
                                    f'--trainer.default_root_dir={tmp_path}'], run=False)
        model = cli.model.model
        counts[variant] = sum(p.numel() for p in model.parameters())
        kinds[variant] = (model.attn_type, type(model.blocks[0].conv).__name__)
    assert kinds == {'grf': ('grf', 'NoneType'), 'linear': ('linear', 'NoneType'),
                     'favor': ('favor', 'NoneType'), 'gat': (None, 'GATConv')}
    assert all(abs(n - counts['grf']) <= 0.01 * counts['grf'] for n in counts.values())
    timer = pcs.StepTimer()
    row = harness.fit_and_test(pcs.CONFIG, [*pcs.overrides('grf', 128), '--trainer.logger=false'],
                               seed=0, root=str(tmp_path / 'run'), epochs=1, callbacks=[timer])
    assert len(timer.times) == 10 and timer.median() > 0  # 10 training clouds, one step each
    assert row['test/mse'] > 0 and row['params'] == counts['grf']


def test_full_graph_epoch_scores_the_evaluation_graph():
    import torch
    from torch_geometric.data import Data
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    masks = dict(train_mask=torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
                 val_mask=torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool),
                 test_mask=torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool))
    train = Data(x=x, y=torch.zeros(6, dtype=torch.long), **masks)
    model = torch.nn.Linear(3, 2)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model

        def forward(self, data):
            return self.lin(data.x)

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)  # no update: predictions are fixed
    pred = model(x).argmax(-1)
    # the evaluation graph's labels: the model's predictions on val, their opposite on test
    y = pred.clone()
    y[4:] = 1 - pred[4:]
    assert harness.full_graph_epoch(net, opt, train, Data(x=x, y=y, **masks)) == (1.0, 0.0)
    # without one, the training graph is scored (its labels: all class 0)
    expect = tuple((pred[m] == 0).float().mean().item()
                   for m in (masks['val_mask'], masks['test_mask']))
    assert harness.full_graph_epoch(net, opt, train) == expect
