import json
import os

import pytest
import torch

from pyg_grf.datasets import MotifDataset
from pyg_grf.datasets.cache import MANIFEST, DatasetCacheError, file_lock, verify_manifest


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
