r"""``bench/node_step.py``'s count of the mask's size, against a dense count."""
import importlib.util

import torch
from torch_geometric.data import Data

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location('node_step', REPO / 'bench' / 'node_step.py')
node_step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(node_step)


def test_mask_sizes_match_a_dense_count():
    # walk entries (start node, visited node), duplicates included, on 5 nodes
    index = torch.tensor([[0, 0, 0, 1, 1, 2, 3, 4, 4],
                          [0, 1, 1, 1, 2, 2, 3, 4, 3]])
    data = Data(grf_index=index, num_nodes=5)
    phi = torch.zeros(5, 5)
    phi[index[0], index[1]] = 1.0
    per_phi, per_pair = node_step.mask_sizes(data)
    assert per_phi == (phi > 0).sum().item() / 5
    assert per_pair == ((phi @ phi.t()) > 0).sum().item() / 5
