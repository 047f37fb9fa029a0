import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def mirror_path():
    """The offline dataset mirror: $PYG_GRF_MIRROR, else ../shared/datasets beside the repo."""
    env = os.environ.get('PYG_GRF_MIRROR')
    if env:
        return Path(env)
    return REPO.parent / 'shared' / 'datasets'


@pytest.fixture
def mirror(monkeypatch, tmp_path):
    """Points PYG_GRF_MIRROR at the mirror and PYG_GRF_DATA at a fresh temporary data root, so a
    data test never writes into the mirror or the repo. Skips when no mirror exists."""
    path = mirror_path()
    if not path.is_dir():
        pytest.skip(f'dataset mirror not found at {path} (set PYG_GRF_MIRROR)')
    monkeypatch.setenv('PYG_GRF_MIRROR', str(path))
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    return path


@pytest.fixture(autouse=True, scope='session')
def _one_thread():
    # Test inputs are tiny: intra-op threads only wait on each other (a sparse product on a
    # 30-node graph took ~10 ms with 2 threads and ~0.05 ms with 1 on a loaded 2-core machine).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(12345)
    yield


@pytest.fixture(autouse=True)
def _restore_deterministic_algorithms():
    # `pyg-grf fit` turns torch's deterministic algorithms on (trainer.deterministic: warn), a
    # process-wide switch: one test's run must not change the next test's kernels.
    flags = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
