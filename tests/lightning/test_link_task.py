r"""The link-prediction task (LRGB PCQM-Contact): steps, negatives, errors, and training through
the public CLI on stand-in files in PyG's raw format."""
import math

import pytest
import torch
from torch_geometric.data import Batch
from torch_geometric.loader import DataLoader

from pyg_grf.datasets import lrgb_standin
from pyg_grf.datasets.lrgb import write_lrgb_raw_standin
from pyg_grf.lightning.link import LinkLevelTask, structured_negatives
from pyg_grf.nn.models.link_decoder import LinkDecoder
from tests.conftest import REPO
from tests.lightning.helpers import filtered_link_ranks, link_ranking_metrics

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

ENCODER = dict(in_channels=None, hidden_channels=16, out_channels=8, num_layers=1, heads=2,
               attn_type='linear', node_encoder='atom', pooling=None)


def _batch(num_graphs=4, seed=0):
    return Batch.from_data_list(list(lrgb_standin('PCQM-Contact', num_graphs, seed=seed)))


def _silent(module):
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, (value, kw))
    return logged


@pytest.mark.parametrize('decoder', ['dot', 'hadamard_mlp'])
@pytest.mark.parametrize('exclude_self', [False, True])
def test_eval_ranks_equal_dense_reference(decoder, exclude_self):
    # The task scores each positive's source against its graph in [P, N_max] rows; the same
    # metric from full per-graph score matrices built here, pair by pair, must agree.
    module = LinkLevelTask(dict(ENCODER), decoder=decoder, exclude_self=exclude_self,
                           decoder_kwargs={'chunk_size': 64} if decoder != 'dot' else None)
    module.eval()
    batch = _batch()
    with torch.no_grad():
        z = module(batch)
        ranks, graph = module.rank(z, batch.edge_label_index, batch.edge_label, batch.batch)
        sizes = torch.bincount(batch.batch).tolist()
        n = max(sizes)
        dense = torch.zeros(len(sizes), n, n)
        for g, (lo, size) in enumerate(zip(batch.ptr[:-1].tolist(), sizes)):
            for i in range(size):
                for j in range(size):
                    dense[g, i, j] = module.decoder(z[lo + i], z[lo + j])
    ref, ref_graph = filtered_link_ranks(dense, batch.edge_label_index, batch.edge_label,
                                         batch.batch, exclude_self=exclude_self)
    assert torch.equal(graph, ref_graph) and torch.allclose(ranks, ref)


def test_steps_log_loss_and_ranking_metrics():
    module = LinkLevelTask(dict(ENCODER), num_negatives=2)
    assert module.hparams.num_negatives == 2 and module.metric_name == 'mrr'
    assert str(module.decoder) == "LinkDecoder(8, decoder='dot')"
    logged = _silent(module)
    batch = _batch()
    loss = module.training_step(batch, 0)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert logged['train/loss'][1]['batch_size'] == 4
    module.validation_step(batch, 0)
    module.validation_step(_batch(seed=1), 1)
    metric = module.metrics['val_metric']
    expected = metric.compute()
    module.on_validation_epoch_end()
    assert {'val/loss', 'val/mrr', 'val/hits@1', 'val/hits@3', 'val/hits@10'} <= set(logged)
    assert logged['val/mrr'][0] == expected['mrr'] and 0 < float(expected['mrr']) <= 1
    # The logged MRR is the mean over the graphs of both batches (reset after logging).
    with torch.no_grad():
        per_graph = []
        for b in (_batch(), _batch(seed=1)):
            ranks, graph = module.rank(module(b), b.edge_label_index, b.edge_label, b.batch)
            per_graph.append(link_ranking_metrics(ranks, graph)['mrr'] * 4)
    assert float(expected['mrr']) == pytest.approx(float(sum(per_graph) / 8), rel=1e-5)
    assert metric.count == 0


def test_structured_negatives():
    batch = _batch(num_graphs=6)
    index, label = batch.edge_label_index, batch.edge_label
    new_index, new_label = structured_negatives(index, label, batch.batch, num_negatives=3,
                                                generator=torch.Generator().manual_seed(0))
    pos = index[:, label == 1]
    P = pos.size(1)
    assert torch.equal(new_index[:, :P], pos) and new_label.dtype == label.dtype
    assert torch.equal(new_label, torch.cat([torch.ones(P), torch.zeros(3 * P)]).long())
    neg = new_index[:, P:].view(2, P, 3)
    # Same source, same graph, never a positive pair of that source, distinct per positive.
    assert torch.equal(neg[0], pos[0].view(-1, 1).expand(-1, 3))
    assert torch.equal(batch.batch[neg[1]], batch.batch[pos[0]].view(-1, 1).expand(-1, 3))
    positive = set(map(tuple, pos.t().tolist()))
    assert not any((s, t) in positive for s, t in new_index[:, P:].t().tolist())
    assert all(len(set(row)) == 3 for row in neg[1].tolist())
    # Every allowed candidate of a source gets drawn (uniform over them), nothing else.
    source = int(pos[0, 0])
    drawn = set()
    for seed in range(200):
        idx, _ = structured_negatives(index, label, batch.batch, num_negatives=1,
                                      generator=torch.Generator().manual_seed(seed))
        drawn |= set(idx[1, P:][idx[0, P:] == source].tolist())
    nodes = (batch.batch == batch.batch[source]).nonzero().view(-1).tolist()
    assert drawn == {v for v in nodes if (source, v) not in positive}
    with pytest.raises(ValueError, match='num_negatives must be >= 1'):
        structured_negatives(index, label, batch.batch, num_negatives=0)


def test_link_decoder():
    dec = LinkDecoder(4, 'hadamard_mlp', hidden_channels=6, num_layers=2, chunk_size=8)
    assert str(dec) == "LinkDecoder(4, decoder='hadamard_mlp', hidden_channels=6, num_layers=2)"
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    assert torch.allclose(dec(a, b), dec(b, a))  # symmetric
    cand = torch.randn(5, 3, 4)
    expected = torch.stack([dec(a, cand[:, k]) for k in range(3)], 1)
    assert torch.allclose(dec.score_candidates(a, cand), expected, atol=1e-6)
    dot = LinkDecoder(4)
    assert torch.allclose(dot.score_candidates(a, cand), (a.unsqueeze(1) * cand).sum(-1),
                          atol=1e-6)
    with pytest.raises(ValueError, match="decoder must be one of"):
        LinkDecoder(4, 'cosine')
    with pytest.raises(ValueError, match=r"4 channels in the last dimension, got shape \(5, 3\)"):
        dot(a, torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"z_src \[P, C\] and z_cand \[P, K, C\]"):
        dot.score_candidates(a, torch.randn(4, 3, 4))


def test_bad_input():
    with pytest.raises(ValueError, match="pooling=None"):
        LinkLevelTask(dict(ENCODER, pooling='mean'))
    with pytest.raises(ValueError, match="num_negatives must be None or >= 1"):
        LinkLevelTask(dict(ENCODER), num_negatives=0)
    module = LinkLevelTask(dict(ENCODER))
    _silent(module)
    # A graph-level dataset: no labelled pairs.
    graph_batch = next(iter(DataLoader(lrgb_standin('Peptides-func', 4), batch_size=4)))
    with pytest.raises(ValueError, match=r"expects labelled node pairs.*'edge_label_index' "
                                         r"\[2, L\] and 'edge_label' \[L\].*got a batch with "
                                         r"attributes \[.*'y'.*GraphLevelTask"):
        module.training_step(graph_batch, 0)
    batch = _batch()
    batch.edge_label = batch.edge_label[:-1]
    with pytest.raises(ValueError, match=r"edge_label_index \[2, L\] and edge_label \[L\], got "
                                         r"\(2, \d+\) and \(\d+,\)"):
        module.validation_step(batch, 0)
    batch = _batch()
    batch.edge_label = batch.edge_label * 2
    for step in (module.training_step, module.validation_step):
        with pytest.raises(ValueError, match=r"edge_label in \{0, 1\} \(1 = link\), got values "
                                             r"such as \[2, 2, 2\]"):
            step(batch, 0)
    wrong = LinkLevelTask(dict(ENCODER))
    wrong.model.forward = lambda data: torch.zeros(3, 8)
    with pytest.raises(ValueError, match=r"node embeddings \[N=\d+, C\].*got \(3, 8\)"):
        wrong.training_step(_batch(), 0)


def _fit(tmp_path, monkeypatch, *extra):
    from pyg_grf.lightning.cli import main
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')  # any download attempt fails
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    path = REPO / 'experiments' / 'configs' / 'pcqm_contact_grf.yaml'
    return main(['fit', '--config', str(path), f'--trainer.default_root_dir={tmp_path / "run"}',
                 '--trainer.accelerator=cpu', '--trainer.enable_progress_bar=false',
                 '--trainer.enable_model_summary=false', '--data.init_args.batch_size=8',
                 '--test_after_fit=true', *extra])


def test_pcqm_contact_trains_on_raw_standin_files(tmp_path, monkeypatch):
    # Stand-in files in PyG's raw PCQM-Contact format: the real loading path (PyG's
    # LRGBDataset.process, our cache, GRF pre_transform) and the config, through `pyg-grf fit`.
    paths = write_lrgb_raw_standin('PCQM-Contact', root=str(tmp_path / 'data' / 'LRGB'),
                                   num_graphs=16)
    assert [p.split('pcqm-contact/')[1] for p in paths] == ['raw/train.pt', 'raw/val.pt',
                                                            'raw/test.pt']
    cli = _fit(tmp_path, monkeypatch, '--trainer.max_epochs=2',
               '--model.init_args.model.init_args.num_layers=1')
    assert isinstance(cli.model, LinkLevelTask)
    assert cli.datamodule.train_dataset[0].edge_label_index.size(0) == 2
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert {'test/mrr', 'test/hits@1', 'test/hits@3', 'test/hits@10', 'test/loss'} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    assert 0 < metrics['test/mrr'] <= 1
    assert metrics['test/hits@1'] <= metrics['test/hits@3'] <= metrics['test/hits@10']
    folder = tmp_path / 'data' / 'LRGB' / 'pcqm-contact'
    assert any(p.name.startswith('processed_') for p in folder.iterdir())
    ckpt = cli.trainer.checkpoint_callback
    assert ckpt.monitor == 'val/mrr' and ckpt.best_model_path
    reloaded = LinkLevelTask.load_from_checkpoint(ckpt.best_model_path)
    assert reloaded.hparams.num_negatives == 2


def test_pcqm_contact_config_on_standin(tmp_path, monkeypatch):
    cli = _fit(tmp_path, monkeypatch, '--trainer.fast_dev_run=true',
               '--data.init_args.standin=8')
    assert {'test/mrr', 'test/loss'} <= set(cli.trainer.callback_metrics)
    model = cli.model.model
    assert model.pooling is None and model.attn_type == 'grf'
    assert model.attn_kwargs['max_length'] == cli.datamodule.pre_transform.max_length


@pytest.mark.slow
def test_pcqm_contact_standin_learns(tmp_path, monkeypatch):
    # The stand-in's contacts follow a rule (atoms >= 3 bonds apart with the same chirality
    # tag), so training must lift the validation MRR well above the untrained model's.
    from pyg_grf.lightning.cli import GRFLightningCLI
    write_lrgb_raw_standin('PCQM-Contact', root=str(tmp_path / 'data' / 'LRGB'), num_graphs=64)
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    path = REPO / 'experiments' / 'configs' / 'pcqm_contact_grf.yaml'
    cli = GRFLightningCLI(args=['--config', str(path), f'--trainer.default_root_dir={tmp_path}',
                                '--trainer.accelerator=cpu', '--trainer.max_epochs=30',
                                '--trainer.enable_progress_bar=false',
                                '--data.init_args.batch_size=16', '--model.init_args.lr=0.002',
                                '--model.init_args.warmup_epochs=1'], run=False)
    before = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    after = cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path='best',
                                 verbose=False)[0]
    print(f"val MRR untrained {before['val/mrr']:.3f}, trained {after['val/mrr']:.3f}")
    assert after['val/mrr'] > before['val/mrr'] + 0.1


@pytest.mark.parametrize('step', ['training_step', 'validation_step', 'predict_step'])
def test_every_step_refuses_bad_pairs(step):
    # training and predict refuse pairs with -1 or pairs across graphs (PyG would index node
    # -1 = the last node) instead of returning a loss / logits
    module = LinkLevelTask(dict(ENCODER), num_negatives=None)
    _silent(module)
    batch = _batch()
    batch.edge_label_index[0, 0] = -1
    with pytest.raises(ValueError, match=r"node ids outside \[0, \d+\) \(got -1\.\."):
        getattr(module, step)(batch, 0)
    batch = _batch()
    first = int((batch.batch == 0).sum())
    batch.edge_label_index[:, 0] = torch.tensor([0, first])  # graph 0 -> graph 1
    with pytest.raises(ValueError, match="pair 0 joins graphs 0 and 1"):
        getattr(module, step)(batch, 0)


@pytest.mark.parametrize('step', ['training_step', 'validation_step', 'test_step',
                                  'predict_step'])
def test_every_step_refuses_non_integer_pairs(step):
    # Adversarial review p04: a float edge_label_index was truncated by .long() (0.6 -> node 0,
    # -0.5 -> node 0, in range and so accepted) instead of refused.
    module = LinkLevelTask(dict(ENCODER), num_negatives=1)
    _silent(module)
    for make, dtype in ((lambda i: i.float() + 0.6, 'torch.float32'),
                        (lambda i: torch.where(torch.arange(i.numel()).view_as(i) == 0,
                                               torch.tensor(-0.5, dtype=torch.float64),
                                               i.double()), 'torch.float64'),
                        (lambda i: i > 0, 'torch.bool')):
        batch = _batch()
        batch.edge_label_index = make(batch.edge_label_index)
        with pytest.raises(TypeError, match=rf"expected an integer edge_label_index \(node ids, "
                                            rf"torch\.long\), got {dtype} with values such as"):
            getattr(module, step)(batch, 0)
    batch = _batch()  # other integer types are fine
    batch.edge_label_index = batch.edge_label_index.int()
    getattr(module, step)(batch, 0)
