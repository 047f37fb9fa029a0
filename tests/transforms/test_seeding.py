r"""Seeding of the random transforms (:mod:`pyg_grf.transforms._seeding`): fresh walks at every
access, different walks in every DataLoader worker, the whole run reproducible."""
import copy
import pickle

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from pyg_grf.transforms import AddGraphRandomFeatures, AddRWGNKFeatures
from pyg_grf.transforms._seeding import TransformRNG


class _SameGraph(torch.utils.data.Dataset):
    def __init__(self, transform, n=4):
        ei = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 0, 0, 2], [1, 0, 2, 1, 3, 2, 0, 3, 2, 0]])
        self.data, self.transform, self.n = Data(edge_index=ei, num_nodes=4), transform, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(self.data)


def _walk_signatures(transform, attr, num_workers, epochs=1):
    torch.manual_seed(0)
    loader = DataLoader(_SameGraph(transform), batch_size=1, num_workers=num_workers)
    return [tuple(getattr(b, attr).tolist()) for _ in range(epochs) for b in loader]


def _check_seed_semantics(make, attr):
    # Main process: fresh walks at every access, same sequence for the same seed.
    a = _walk_signatures(make(), attr, 0, epochs=2)
    assert len(set(a)) == len(a)  # 8 accesses of one graph: all different walks
    assert a == _walk_signatures(make(), attr, 0, epochs=2)
    # Two workers: they do not repeat each other's walks (they used to: one stream copied into
    # every worker), every epoch is new, and the whole run is reproducible.
    b = _walk_signatures(make(), attr, 2, epochs=2)
    assert len(set(b)) == len(b)
    assert b == _walk_signatures(make(), attr, 2, epochs=2)


def test_rwgnk_fresh_walks_per_access_and_per_worker():
    _check_seed_semantics(lambda: AddRWGNKFeatures(4, 0.8, 1.0, 3, p_halt=0.3, seed=5),
                          'rwgnk_value')


def test_grf_fresh_walks_per_access_and_per_worker():
    _check_seed_semantics(lambda: AddGraphRandomFeatures(num_walks=4, max_length=3, seed=5),
                          'grf_load')


def test_transform_rng_advances_and_travels_with_copies():
    assert TransformRNG(None).generator() is None
    rng = TransformRNG(3)
    first = torch.rand(4, generator=rng.generator())
    assert torch.equal(first, torch.rand(4, generator=torch.Generator().manual_seed(3)))
    second = torch.rand(4, generator=rng.generator())  # advances, no re-seeding
    assert not torch.equal(first, second)
    clone = pickle.loads(pickle.dumps(rng))  # the state travels with a copy
    assert torch.equal(torch.rand(4, generator=clone.generator()),
                       torch.rand(4, generator=copy.deepcopy(rng).generator()))
    with pytest.raises(ValueError, match="'seed' must be an integer or None"):
        TransformRNG('7')
