import os

import pytest

from pyg_grf.datasets.mirror import write_checksums


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


def toy_mirror(root, monkeypatch, checksums=True):
    """A two-graph TU dataset 'TOY' in a mirror under `root` (with its SHA256SUMS unless
    `checksums=False`), the environment pointed at it, offline, verification on."""
    mirror = root / 'mirror'
    raw = mirror / 'TUDataset' / 'TOY' / 'raw'
    raw.mkdir(parents=True)
    (raw / 'TOY_A.txt').write_text('1, 2\n2, 1\n3, 4\n4, 3\n')
    (raw / 'TOY_graph_indicator.txt').write_text('1\n1\n2\n2\n')
    (raw / 'TOY_graph_labels.txt').write_text('0\n1\n')
    if checksums:
        write_checksums(str(mirror))
    monkeypatch.setenv('PYG_GRF_MIRROR', str(mirror))
    monkeypatch.setenv('PYG_GRF_DATA', str(root / 'data'))
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR_UNVERIFIED', raising=False)
    return mirror
