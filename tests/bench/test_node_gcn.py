r"""``bench/node_gcn.py`` runs, and its PyG stacks compute what GRFNodeModel computes (the
bench asserts it before timing), with outputs and gradients equal to PyG's message passing."""
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.utils import grid, remove_self_loops

from pyg_grf.nn import GRFNodeModel

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('node_gcn', REPO / 'bench' / 'node_gcn.py')
node_gcn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(node_gcn)


def test_runs_and_prints_every_variant(capsys):
    node_gcn.main(['--side', '6', '--layers', '2', '--rounds', '1', '--steps', '1'])
    out = capsys.readouterr().out
    for name in ('GCNConv(cached=True)', 'GRFNodeModel', 'GCNConv on a CSR adjacency'):
        assert f'| {name} |' in out


def test_pyg_stack_shares_the_weights_and_gradients():
    edge_index = remove_self_loops(grid(5, 5)[0])[0]
    x = torch.randn(25, 7, dtype=torch.float64)
    model = GRFNodeModel(7, 8, 1, num_layers=3, attn_type=None, norm='batch_norm',
                         residual=True).double().eval()
    out = model(Data(x=x, edge_index=edge_index))
    ref = node_gcn.pyg_stack(model, cached=True)(x, edge_index, None)
    assert torch.allclose(out, ref, atol=1e-12)
    weight = model.convs[1].lin.weight
    g1, = torch.autograd.grad(F.softplus(out).sum(), weight)
    g2, = torch.autograd.grad(F.softplus(ref).sum(), weight)
    assert torch.allclose(g1, g2, atol=1e-12)
