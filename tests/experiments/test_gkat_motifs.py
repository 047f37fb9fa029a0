r"""experiments/gkat_motifs.py: the initialisation probe (``--init-scale``) against the logit
spread and gradient norm computed by hand for one network, and the init override reaching
the network the config builds."""
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch

from tests.experiments import experiment_module

motifs = experiment_module('gkat_motifs')


def test_init_scale_matches_a_hand_computation(tmp_path, monkeypatch):
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path))
    import pyg_grf.transforms as T
    from pyg_grf.datasets import MotifDataset
    got = motifs.init_scale('caveman', ['gcn', 'grf'], [0, 1], num_graphs=8)
    assert set(got) == {('gcn', 'torch'), ('grf', 'torch'), ('grf', 'glorot'), ('grf', 'mha')}
    # the GRF network at Glorot init, seed 1, by hand (walks as the config draws them)
    walks = [T.AddRWGNKFeatures(num_walks=8, lam=0.8, alpha=1.0, max_length=3,
                                kernel_threshold=0.05, seed=0),
             T.AddGraphRandomFeatures(num_walks=16, p_halt=0.25, max_length=3, seed=0)]
    batch = Batch.from_data_list([walks[1](walks[0](g))
                                  for g in MotifDataset(motif='caveman', num_graphs=8)])
    torch.manual_seed(1)
    net = motifs.MotifNet(5, 2, 'grf', motifs.matched_hidden('grf'), init='glorot')
    logits = net(batch)
    F.cross_entropy(logits, batch.y).backward()
    grad = torch.cat([p.grad.flatten() for p in net.parameters()]).norm()
    spread, norm = got[('grf', 'glorot')][1]
    assert spread == pytest.approx((logits[:, 1] - logits[:, 0]).std().item(), rel=1e-5)
    assert norm == pytest.approx(grad.item(), rel=1e-5)
    assert got[('grf', 'torch')][1] != got[('grf', 'glorot')][1]


def test_mha_init_touches_only_the_attention_layers():
    # nn.MultiheadAttention's convention on the attention layers; every other map as torch's
    torch.manual_seed(3)
    ref = motifs.MotifNet(5, 2, 'grf', 4)
    torch.manual_seed(3)
    net = motifs.MotifNet(5, 2, 'grf', 4, init='mha')
    for name, p in net.named_parameters():
        if 'to_qkv' in name or name.endswith('to_out.bias'):
            continue
        assert torch.equal(p, dict(ref.named_parameters())[name]), name
    for conv in (net.conv1, net.conv2):
        w = conv.to_qkv.weight
        bound = (6 / sum(w.shape)) ** 0.5  # Glorot-uniform
        assert w.abs().max() <= bound and w.abs().max() > 1 / w.size(1) ** 0.5
        assert not conv.to_qkv.bias.any() and not conv.to_out.bias.any()
    with pytest.raises(ValueError, match="init must be one of"):
        motifs.MotifNet(5, 2, 'grf', 4, init='xavier')


def test_init_override_reaches_the_network():
    over = motifs.overrides('caveman', 'grf', 64, init='glorot')
    assert '--model.init_args.model.init_args.init=glorot' in over
    assert '--model.init_args.model.init_args.hidden_channels=4' in over
