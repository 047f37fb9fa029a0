import json
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch

from pyg_grf.datasets import MotifDataset, load_tu
from pyg_grf.datasets.cache import MANIFEST, DatasetCacheError, file_lock, verify_manifest
from tests.conftest import REPO
from tests.datasets.conftest import toy_mirror


def cached(root, **kwargs):
    return MotifDataset(str(root), motif='circle', num_graphs=4, num_nodes=12, **kwargs)


def cache_folder(root):
    (folder, ) = [p for p in (root / 'MotifDataset').glob('processed_*') if p.is_dir()]
    return folder


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_cache_is_written_once_and_reused(tmp_path):
    first = cached(tmp_path)
    folder = cache_folder(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, first.processed_file_names[0]]
    mtime = os.stat(first.processed_paths[0]).st_mtime_ns
    again = cached(tmp_path)
    assert os.stat(again.processed_paths[0]).st_mtime_ns == mtime
    assert torch.equal(first._data.x, again._data.x)


def test_flipped_byte_is_refused(tmp_path):
    dataset = cached(tmp_path)
    flip_a_byte(tmp_path / dataset.processed_paths[0])
    with pytest.raises(DatasetCacheError, match=r"has SHA-256 .* but its manifest lists .*: it "
                                                r"was modified .* force_reload=True"):
        cached(tmp_path)
    assert torch.equal(cached(tmp_path, force_reload=True)._data.x, dataset._data.x)


def test_manifest_edited_to_list_no_files_does_not_hide_a_flipped_byte(tmp_path):
    # the check compares the folder with the manifest, not only the manifest's own list
    dataset = cached(tmp_path)
    folder = cache_folder(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps(dict(manifest, files={})))
    flip_a_byte(tmp_path / dataset.processed_paths[0])
    with pytest.raises(DatasetCacheError, match=r"\.pt' is not listed in .*MANIFEST\.json'"):
        cached(tmp_path)


def test_manifest_must_list_the_processed_files(tmp_path):
    dataset = cached(tmp_path)
    folder = cache_folder(tmp_path)
    os.remove(dataset.processed_paths[0])
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps(dict(manifest, files={})))
    with pytest.raises(DatasetCacheError, match=r"\.pt' is missing from the folder or from"):
        verify_manifest(str(folder), dataset.processed_file_names)
    (folder / 'extra.pt').write_bytes(b'x')
    with pytest.raises(DatasetCacheError, match=r"extra\.pt' is not listed in"):
        verify_manifest(str(folder))


def test_unreadable_manifest_is_refused(tmp_path):
    cached(tmp_path)
    (cache_folder(tmp_path) / MANIFEST).write_text('{not json')
    with pytest.raises(DatasetCacheError, match=r"manifest .* is unreadable \(JSONDecodeError"):
        cached(tmp_path)


def test_lock_that_is_a_directory_is_a_clear_error(tmp_path):
    name = os.path.basename(cached(tmp_path / 'probe').processed_dir)  # the same in every root
    lock = tmp_path / 'data' / 'MotifDataset' / f'{name}.lock'
    lock.mkdir(parents=True)
    with pytest.raises(DatasetCacheError, match=r"lock file .*\.lock' is a directory; expected a "
                                                r"plain file .* Remove the directory"):
        cached(tmp_path / 'data')
    with pytest.raises(DatasetCacheError, match='is a directory'):
        with file_lock(str(lock)):
            pass


def test_lock_timeout(tmp_path):
    path = str(tmp_path / 'x.lock')
    with file_lock(path):
        pid = os.fork()
        if pid == 0:  # the child cannot take the lock
            try:
                with file_lock(path, timeout=0.1):
                    os._exit(1)
            except TimeoutError:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_interrupted_processing_leaves_no_cache(tmp_path, monkeypatch):
    def killed(self):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(MotifDataset, 'process', killed)
        with pytest.raises(KeyboardInterrupt):
            cached(tmp_path)
    assert [p.name for p in (tmp_path / 'MotifDataset').iterdir() if p.is_dir()] == []
    assert len(cached(tmp_path)) == 4


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


def test_changed_pre_transform_gets_its_own_cache(tmp_path):
    a = MotifDataset(tmp_path, num_graphs=4, pre_transform=_AddConst(1))
    b = MotifDataset(tmp_path, num_graphs=4, pre_transform=_AddConst(2))  # was: stale cache
    assert a[0].c.unique().tolist() == [1.0] and b[0].c.unique().tolist() == [2.0]
    assert a.processed_dir != b.processed_dir


def test_load_tu_with_a_changed_pre_transform_gets_its_own_cache(tmp_path, monkeypatch):
    toy_mirror(tmp_path, monkeypatch)
    assert load_tu('TOY', pre_transform=_AddConst(1))[0].c[0].item() == 1.0
    assert load_tu('TOY', pre_transform=_AddConst(2))[0].c[0].item() == 2.0


def test_flipped_bytes_in_the_cache_are_detected(tmp_path):
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
def test_kill_during_write_leaves_no_partial_cache(tmp_path, point):
    script = tmp_path / 'kill.py'
    script.write_text(_KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / 'root'), point], env=env,
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # The next load processes again (no partial file, no error) and gets the right data.
    ds = MotifDataset(tmp_path / 'root', num_graphs=8)
    ref = MotifDataset(num_graphs=8)
    assert all(torch.equal(ds[i].edge_index, ref[i].edge_index) for i in range(8))
    leftovers = [n for n in os.listdir(tmp_path / 'root' / 'MotifDataset') if '.tmp-' in n]
    assert leftovers == []


@pytest.mark.slow
def test_reader_waits_for_the_writer(tmp_path):
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
    script = ('import sys; from pyg_grf.datasets import MotifDataset; print("ready", flush=True); '
              'print(len(MotifDataset(sys.argv[1], num_graphs=8)))')
    with file_lock(lock):
        reader = subprocess.Popen([sys.executable, '-c', script, str(tmp_path)],
                                  env=dict(os.environ, PYTHONPATH=str(REPO)),
                                  stdout=subprocess.PIPE)
        assert reader.stdout.readline().decode().strip() == 'ready'
        import time
        time.sleep(1.0)
        assert reader.poll() is None, 'the reader did not wait for the writer'
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0 and out.decode().strip() == '8'


def test_safe_load_leaves_pyg_allowed_classes_allowed(tmp_path):
    # torch's safe_globals context removes on exit what it was given: PyG allows Data for good
    # when imported, and its own loaders must not fall back to a full unpickle after ours ran
    from torch_geometric.data import Data

    from pyg_grf.datasets.cache import safe_load
    torch.save(Data(x=torch.ones(2, 1)).to_dict(), tmp_path / 'd.pt')
    assert Data in torch.serialization.get_safe_globals()
    safe_load(str(tmp_path / 'd.pt'))
    assert Data in torch.serialization.get_safe_globals()


@pytest.mark.parametrize('payload', [
    ({}, {}, 'not a class', {}),                       # a class entry that is no Data class
    ({'x': torch.zeros(2)}, {'x': torch.tensor([0])}, None, {'x': 'bad-spec'}),
    ({'x': [1, 2]}, {}, None, {}),                      # loads with weights_only, wrong shape
])
def test_a_cache_of_the_wrong_structure_is_a_cache_error(tmp_path, payload):
    # issue 39: what torch.load(weights_only=True) reads but save() never wrote raises
    # DatasetCacheError (with the fix), not a TypeError / IndexError from deep inside
    from torch_geometric.data import Data
    path = str(tmp_path / 'data.pt')
    mapping, slices, cls, spec = payload
    torch.save((mapping, slices, Data if cls is None else cls, spec), path)
    ds = MotifDataset.__new__(MotifDataset)
    with pytest.raises(DatasetCacheError, match=r"is not a readable compact cache: .*"
                                                r"force_reload=True"):
        ds.load(path)
