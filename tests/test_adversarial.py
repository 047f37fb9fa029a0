r"""Issue #13: every crash, silent-wrong-answer, lost-work and code-from-data case, one test (or
more) per item. Run ``python -m pytest -q tests/test_adversarial.py`` to see them all; the
kill -9 resume test is ``-m slow``."""
import hashlib
import json
import os
import os.path as osp
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from pyg_grf.datasets import MotifDataset, load_tu
from pyg_grf.datasets.cache import DatasetCacheError
from pyg_grf.datasets.mirror import (
    MirrorIntegrityError,
    fetch_from_mirror,
    write_checksums,
)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Helpers


def _toy_mirror(root, monkeypatch, checksums=True):
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


class _AddConst:
    """A pre_transform whose repr shows its setting."""

    def __init__(self, value):
        self.value = value

    def __call__(self, data):
        data = data.clone()
        data.c = torch.full((data.num_nodes, 1), float(self.value))
        return data

    def __repr__(self):
        return f'_AddConst(value={self.value})'


# ---------------------------------------------------------------------------------------------
# 11. Dataset caches: atomic, verified, keyed by the transform state, one writer


def test_11_changed_pre_transform_gets_its_own_cache(tmp_path):
    a = MotifDataset(tmp_path, num_graphs=4, pre_transform=_AddConst(1))
    b = MotifDataset(tmp_path, num_graphs=4, pre_transform=_AddConst(2))  # was: stale cache
    assert a[0].c.unique().tolist() == [1.0] and b[0].c.unique().tolist() == [2.0]
    assert a.processed_dir != b.processed_dir


def test_11_changed_pre_transform_load_tu(tmp_path, monkeypatch):
    _toy_mirror(tmp_path, monkeypatch)
    assert load_tu('TOY', pre_transform=_AddConst(1))[0].c[0].item() == 1.0
    assert load_tu('TOY', pre_transform=_AddConst(2))[0].c[0].item() == 2.0


def test_11_flipped_bytes_are_detected(tmp_path):
    ds = MotifDataset(tmp_path, num_graphs=4)
    path = ds.processed_paths[0]
    raw = bytearray(open(path, 'rb').read())
    raw[len(raw) // 2] ^= 0xFF
    open(path, 'wb').write(bytes(raw))
    with pytest.raises(DatasetCacheError, match=r"SHA-256 .* modified or damaged.*Delete '.*"
                                                r"processed_.*' .* or pass force_reload=True"):
        MotifDataset(tmp_path, num_graphs=4)
    fresh = MotifDataset(tmp_path, num_graphs=4, force_reload=True)
    assert torch.equal(fresh[0].edge_index, MotifDataset(num_graphs=4)[0].edge_index)
    MotifDataset(tmp_path, num_graphs=4)  # the rewritten cache verifies


_KILL_SCRIPT = textwrap.dedent('''
    import os, signal, sys
    from pyg_grf.datasets import MotifDataset
    from pyg_grf.datasets import cache
    point = sys.argv[2]
    if point == 'save':  # die in the middle of writing the data file
        import torch_geometric.io.fs as fs
        orig = fs.torch_save
        def torch_save(data, path):
            with open(path, 'wb') as f:
                f.write(b'partial')
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        fs.torch_save = torch_save
    elif point == 'manifest':  # die after the data file, before the manifest
        def write_manifest(folder, info):
            os.kill(os.getpid(), signal.SIGKILL)
        cache.write_manifest = write_manifest
    elif point == 'replace':  # die just before the rename into place
        orig_fsync = cache._fsync_tree
        def _fsync_tree(path):
            orig_fsync(path)
            os.kill(os.getpid(), signal.SIGKILL)
        cache._fsync_tree = _fsync_tree
    MotifDataset(sys.argv[1], num_graphs=8)
''')


@pytest.mark.parametrize('point', ['save', pytest.param('manifest', marks=pytest.mark.slow),
                                   pytest.param('replace', marks=pytest.mark.slow)])
def test_11_kill_during_write_leaves_no_partial_cache(tmp_path, point):
    script = tmp_path / 'kill.py'
    script.write_text(_KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / 'root'), point], env=env,
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # The next load processes again (no partial file, no error) and gets the right data.
    ds = MotifDataset(tmp_path / 'root', num_graphs=8)
    ref = MotifDataset(num_graphs=8)
    assert all(torch.equal(ds[i].edge_index, ref[i].edge_index) for i in range(8))
    leftovers = [n for n in os.listdir(tmp_path / 'root' / 'MotifDataset') if '.tmp-' in n]
    assert leftovers == []


def test_11_reader_waits_for_writer(tmp_path):
    # A process that opens the root while another one holds the writer's lock waits for it and
    # then reads the finished cache (it used to fail on the half-written file).
    from pyg_grf.datasets.cache import file_lock
    ds = MotifDataset.__new__(MotifDataset)
    ds.motif, ds.num_graphs, ds.seed, ds.num_nodes_er, ds.num_join_edges = \
        'caveman', 8, 0, 100, 3
    ds.features, ds.root, ds.pre_transform, ds.pre_filter = 'neighbor_degrees', str(tmp_path), \
        None, None
    lock = ds.processed_dir + '.lock'
    os.makedirs(osp.dirname(lock), exist_ok=True)
    script = ('import sys; from pyg_grf.datasets import MotifDataset; '
              'print(len(MotifDataset(sys.argv[1], num_graphs=8)))')
    with file_lock(lock):
        reader = subprocess.Popen([sys.executable, '-c', script, str(tmp_path)],
                                  env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE)
        try:
            reader.wait(timeout=3)
            pytest.fail('the reader did not wait for the lock')
        except subprocess.TimeoutExpired:
            pass
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0 and out.decode().strip() == '8'
