r"""The dense-block backend (:mod:`pyg_grf.nn.attention.grf.dense`)."""

import pytest
import torch

from pyg_grf.features import GRFLoads
from tests.nn.attention.grf.helpers import make_batch, make_layer


def test_dense_backend_rejects_unsorted_or_mismatched_batch():
    b = make_batch()
    layer = make_layer('symmetric', 'dense')
    perm_batch = b.batch.flip(0)
    with pytest.raises(ValueError, match='sorted'):
        layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes,
                                batch=perm_batch))
    wrong = torch.zeros_like(b.batch)
    wrong[12:] = 1  # splits the first graphs' nodes differently from the loads
    with pytest.raises(ValueError, match='different graphs'):
        layer(b.x, grf=GRFLoads(b.grf_index, b.grf_length, b.grf_load, b.num_nodes,
                                batch=wrong))
