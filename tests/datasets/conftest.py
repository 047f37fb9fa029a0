import os

import pytest


def listing(path):
    """Every file under `path` with its size and modification time, to prove a folder unchanged."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            st = os.stat(full)
            out.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return out


@pytest.fixture
def offline_mirror(mirror, monkeypatch):
    """The `mirror` fixture with downloads forbidden ($PYG_GRF_OFFLINE=1); checks after the test
    that nothing under the mirror changed."""
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    before = listing(mirror)
    yield mirror
    assert listing(mirror) == before, 'the test wrote into the dataset mirror'
