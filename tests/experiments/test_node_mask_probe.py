r"""experiments/node_mask_probe.py: its masks are the power series they name (dense references),
and the GRF estimates average to them."""
import copy

import torch
from torch_geometric.data import Data
from torch_geometric.utils import grid

from tests.experiments import experiment_module

probe = experiment_module('node_mask_probe')


def _graph():
    ei, _ = grid(4, 5)
    ei = ei[:, ei[0] != ei[1]]
    N = 20
    deg = torch.zeros(N).index_add_(0, ei[0], torch.ones(ei.size(1)))
    w = deg[ei[0]].pow(-0.5) * deg[ei[1]].pow(-0.5)
    data = Data(x=torch.randn(N, 3), edge_index=ei, y=torch.arange(N) % 2)
    data.W = torch.sparse_coo_tensor(ei, w, (N, N), check_invariants=False).coalesce()
    return data, data.W.to_dense().double()


def _reference(W, c, y):
    M = sum(ck * torch.linalg.matrix_power(W, k) for k, ck in enumerate(c))
    return (M @ y) / (M.sum(1, keepdim=True) + 1e-6)


def test_exact_masks_are_the_row_normalised_power_series():
    data, W = _graph()
    y = torch.randn(20, 4)
    f = torch.tensor([0.9, 0.6, 0.3, 0.2])
    for mask in ('exact_sym', 'exact_asym'):
        model = probe.PropagatedGCN(data, mask, 3, learn_f=False, f0=0.5)
        model.f.data.copy_(f)
        c = f.tolist() if mask == 'exact_asym' else \
            torch.nn.functional.conv1d(f.view(1, 1, -1), f.flip(0).view(1, 1, -1),
                                       padding=3).flatten().tolist()
        ref = _reference(W, torch.tensor(c).double(), y.double())
        torch.testing.assert_close(model.propagate(data, y).double(), ref, atol=1e-5, rtol=1e-5)


def test_grf_mask_estimates_the_exact_one():
    # the GRF numerator and normaliser are unbiased for the exact ones: over many walks the
    # propagated logits approach the exact mask's (asymmetric: Sum_l f_l W^l)
    from pyg_grf.transforms import AddGraphRandomFeatures
    data, _ = _graph()
    y = torch.randn(20, 4)
    exact = probe.PropagatedGCN(data, 'exact_asym', 3, learn_f=False, f0=0.7).propagate(data, y)
    d = AddGraphRandomFeatures(num_walks=4000, p_halt=0.25, max_length=3, seed=0)(
        copy.copy(data))
    grf = probe.PropagatedGCN(d, 'grf_asym', 3, learn_f=False, f0=0.7).propagate(d, y)
    few = AddGraphRandomFeatures(num_walks=4, p_halt=0.25, max_length=3, seed=0)(
        copy.copy(data))
    noisy = probe.PropagatedGCN(few, 'grf_asym', 3, learn_f=False, f0=0.7).propagate(few, y)
    # the ratio estimate's error shrinks like 1/sqrt(walks): 1000x the walks, ~30x smaller
    err, err_few = (grf - exact).abs().max(), (noisy - exact).abs().max()
    assert err < 0.1 and err < err_few / 5, (err, err_few)
