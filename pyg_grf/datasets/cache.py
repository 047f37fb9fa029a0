r"""Crash-safe, verified ``processed/`` caches for PyG datasets.

PyG writes a dataset's ``processed/`` files in place, compares the ``pre_transform`` only by a
warning, and reads ``pre_transform.pt`` with ``torch.load(weights_only=False)``. The
:class:`SafeCacheMixin` (put it before the PyG dataset class) replaces that step:

* **keyed by the whole pre-processing state**: the folder is ``processed_<hash>``, the hash of the
  class's :meth:`cache_key` (dataset settings) and the reprs of ``pre_transform`` and
  ``pre_filter`` (reprs must show every setting, as PyG's ``pre_transform`` check assumes); a
  changed transform gets its own cache, never a stale one;
* **atomic**: processing writes into a temporary sibling folder that is renamed into place only
  after every file and a ``MANIFEST.json`` (SHA-256 of every file) are written and synced; a
  process killed at any point leaves either no cache (the next run processes again) or a complete
  one, never a partial file;
* **verified**: opening a cache checks every file against the manifest before PyG loads it; a
  mismatch raises :class:`DatasetCacheError` that names the folder to delete (or
  ``force_reload=True``);
* **one writer**: processing holds an exclusive lock (``<folder>.lock``), so a process opening
  the dataset while another one writes it waits and then reads the finished cache;
* **compact**: :meth:`SafeCacheMixin.save` stores the collated tensors in the lossless compact
  form of :mod:`pyg_grf.datasets.compact` (narrow integer dtypes, sorted index rows as counts),
  and :meth:`SafeCacheMixin.load` restores them, so the dataset in memory is bit-identical to
  the uncompacted one. The format is versioned (:data:`CACHE_VERSION`, part of the folder hash
  and of the manifest): a cache written in an older format is rebuilt, never misread.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import os.path as osp
import shutil
import time
import uuid
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Sequence

import torch

from pyg_grf.datasets.compact import COMPACT_FORMAT, compact_collated, restore_collated
from pyg_grf.datasets.mirror import file_digest

MANIFEST = 'MANIFEST.json'
#: Format of the processed caches: 1 as PyG writes them, 2 compact (:mod:`.compact`).
CACHE_VERSION = 2


class DatasetCacheError(RuntimeError):
    r"""Raised when a dataset's processed cache does not match its manifest (modified, truncated
    or foreign files)."""


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover (platforms without directory fds)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            with open(osp.join(dirpath, name), 'rb+') as f:
                os.fsync(f.fileno())
        _fsync_dir(dirpath)


@contextmanager
def file_lock(path: str, timeout: Optional[float] = None) -> Iterator[None]:
    r"""An exclusive advisory lock on the file :obj:`path` (created if needed), released on exit
    and by the kernel when the process dies. Waits up to :obj:`timeout` seconds (forever when
    :obj:`None`)."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # pragma: no cover (Windows: no locking)
            yield
            return
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if timeout is not None and time.monotonic() - start > timeout:
                    raise TimeoutError(f"Could not lock '{path}' within {timeout} s; another "
                                       f"process is processing this dataset") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _repr(obj: Any) -> str:
    return 'None' if obj is None else repr(obj)


def describe(obj: Any, _depth: int = 0) -> Any:
    r"""A JSON-able description of a transform's (or filter's) full configuration: its class and
    every public attribute, recursively (nested transforms, lists, dicts, tensors by content).
    A ``repr`` is not enough: PyG's ``AddRandomWalkPE`` prints no ``walk_length``, so a cache
    keyed on it served 8-dimensional PEs to a request for 4. Private attributes (``_...``, e.g.
    a generator's advancing state) are left out."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [describe(o, _depth + 1) for o in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v, _depth + 1) for k, v in sorted(obj.items(), key=str)}
    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu().contiguous()
        return {'tensor': list(data.shape), 'dtype': str(data.dtype),
                'sha256': hashlib.sha256(data.numpy().tobytes() if data.numel() else b'')
                .hexdigest()[:16]}
    if isinstance(obj, torch.Generator):
        return 'torch.Generator'
    name = f'{type(obj).__module__}.{type(obj).__qualname__}'
    state = getattr(obj, '__dict__', None)
    if state is None or _depth > 8:
        return {'class': name, 'repr': repr(obj)}
    return {'class': name, 'attrs': {k: describe(v, _depth + 1) for k, v in sorted(state.items())
                                     if not k.startswith('_')}}


def cache_folder_name(key: Dict[str, Any], pre_transform: Any, pre_filter: Any) -> str:
    r"""``processed_<16 hex digits>``: a hash of the dataset settings :obj:`key` and the full
    configuration (:func:`describe`) and reprs of :obj:`pre_transform` and :obj:`pre_filter`."""
    text = json.dumps({'v': CACHE_VERSION, 'key': key, 'pre_transform': _repr(pre_transform),
                       'pre_filter': _repr(pre_filter),
                       'pre_transform_config': describe(pre_transform),
                       'pre_filter_config': describe(pre_filter)}, sort_keys=True, default=str)
    return 'processed_' + hashlib.sha256(text.encode()).hexdigest()[:16]


def safe_load(path: str) -> Any:
    r"""``torch.load(path, weights_only=True)`` with PyG's data classes allowed: tensors, plain
    containers and :class:`~torch_geometric.data.Data` / ``HeteroData`` classes, never
    arbitrary code. The one loader of every processed cache and raw pickle of the package; a file
    that needs more raises :class:`DatasetCacheError` (nothing of it is run)."""
    import pickle
    from torch_geometric.data import Data, HeteroData
    try:
        with torch.serialization.safe_globals([Data, HeteroData]):
            return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DatasetCacheError(f"'{path}' holds objects other than tensors and plain data "
                                f"(refused, nothing of it was run): {str(exc).splitlines()[0]}; "
                                f"delete it, or rebuild the dataset with force_reload=True"
                                ) from None


def write_manifest(folder: str, info: Dict[str, Any]) -> None:
    r"""Writes ``<folder>/MANIFEST.json`` with the SHA-256 of every file under :obj:`folder`."""
    files = {}
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            full = osp.join(dirpath, name)
            rel = osp.relpath(full, folder).replace(os.sep, '/')
            if rel != MANIFEST:
                files[rel] = file_digest(full)
    with open(osp.join(folder, MANIFEST), 'w') as f:
        json.dump(dict(info, version=CACHE_VERSION, files=files), f, indent=1, sort_keys=True)


def manifest_version(folder: str) -> Optional[int]:
    r"""The cache format version that ``<folder>/MANIFEST.json`` records (:obj:`None` when the
    manifest is missing or unreadable, or names no version)."""
    try:
        with open(osp.join(folder, MANIFEST)) as f:
            version = json.load(f).get('version')
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, int) else None


def verify_manifest(folder: str) -> None:
    r"""Checks every file of :obj:`folder` against its ``MANIFEST.json``.

    Raises:
        DatasetCacheError: if the manifest is unreadable, or a listed file is missing or has
            another SHA-256.
    """
    path = osp.join(folder, MANIFEST)
    hint = (f"Delete '{folder}' (it is re-created on the next load) or pass "
            f"force_reload=True.")
    try:
        with open(path) as f:
            manifest = json.load(f)
        files = manifest['files']
        if not isinstance(files, dict):
            raise TypeError('files is not a dict')
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetCacheError(f"The dataset cache manifest '{path}' is unreadable "
                                f"({type(exc).__name__}: {exc}). {hint}") from None
    for rel, expected in sorted(files.items()):
        full = osp.join(folder, rel)
        if not osp.isfile(full):
            raise DatasetCacheError(f"The dataset cache file '{full}' listed in '{path}' is "
                                    f"missing. {hint}")
        got = file_digest(full)
        if got != expected:
            raise DatasetCacheError(
                f"The dataset cache file '{full}' has SHA-256 {got}, but its manifest lists "
                f"{expected}: it was modified or damaged after it was written. {hint}")


class SafeCacheMixin:
    r"""Mixin for PyG :class:`~torch_geometric.data.Dataset` subclasses (list it first) that makes
    the processed cache keyed by the whole pre-processing state, atomic, verified and
    single-writer (see the module docstring). Subclasses may extend :meth:`cache_key` with their
    own settings and set :attr:`cache_parent` (the folder that holds ``processed_<hash>``)."""

    _staging_dir: Optional[str] = None

    def cache_key(self) -> Dict[str, Any]:
        r"""The dataset settings that change the processed files (besides the transforms)."""
        return {'class': f'{type(self).__module__}.{type(self).__qualname__}'}

    @property
    def cache_parent(self) -> str:
        r"""The folder that holds ``processed_<hash>``: the parent of PyG's ``processed_dir``
        by default."""
        return osp.dirname(self._pyg_processed_dir())

    def _pyg_processed_dir(self) -> str:
        return super().processed_dir  # type: ignore[misc]

    @property
    def processed_dir(self) -> str:
        if self._staging_dir is not None:
            return self._staging_dir
        return osp.join(self.cache_parent, self.cache_folder)

    @property
    def cache_folder(self) -> str:
        return cache_folder_name(self.cache_key(), getattr(self, 'pre_transform', None),
                                 getattr(self, 'pre_filter', None))

    @classmethod
    def save(cls, data_list: Sequence[Any], path: str) -> None:
        r""":meth:`InMemoryDataset.save` in the compact format: ``(mapping, slices, data_cls,
        spec)`` with the tensors of :func:`~pyg_grf.datasets.compact.compact_collated`, which
        :meth:`load` restores bit for bit."""
        from torch_geometric.io import fs  # PyG's writer (fsspec paths), as InMemoryDataset's
        data, slices = cls.collate(data_list)  # type: ignore[attr-defined]
        mapping, spec = compact_collated(data, slices)
        fs.torch_save((mapping, slices, data.__class__, spec), path)

    def load(self, path: str, data_cls=None) -> None:
        r""":meth:`InMemoryDataset.load` with ``torch.load(weights_only=True)`` only (PyG falls
        back to ``weights_only=False`` when that fails). Reads PyG's format (2 or 3 items) and
        the compact one of :meth:`save` (4 items), restored to the original tensors."""
        from torch_geometric.data import Data
        out = safe_load(path)
        hint = f"delete '{osp.dirname(path)}' or pass force_reload=True."
        if not isinstance(out, tuple) or len(out) not in (2, 3, 4):
            got = type(out).__name__ + (f' of {len(out)}' if isinstance(out, tuple) else '')
            raise DatasetCacheError(f"'{path}' is not a PyG dataset cache (expected a tuple of "
                                    f"2 to 4 items, got {got}); {hint}")
        data, self.slices = out[0], out[1]
        data_cls = out[2] if len(out) >= 3 else (data_cls or Data)
        if len(out) == 4:
            if not isinstance(data, dict):
                raise DatasetCacheError(f"'{path}' is a compact cache without a tensor mapping "
                                        f"(got {type(data).__name__}); {hint}")
            try:
                data = restore_collated(data, self.slices, out[3])
            except ValueError as exc:
                raise DatasetCacheError(f"'{path}' is not a readable '{COMPACT_FORMAT}' cache: "
                                        f"{exc}; {hint}") from None
        self.data = data_cls.from_dict(data) if isinstance(data, dict) else data

    def _process(self) -> None:
        final = self.processed_dir
        parent = osp.dirname(final)
        os.makedirs(parent, exist_ok=True)
        with file_lock(final + '.lock'):
            # A cache whose manifest names another format version is rebuilt (the version is in
            # the folder hash too; this covers a folder copied or renamed by hand). An
            # unreadable manifest is an error of verify_manifest, as before.
            version = manifest_version(final)
            done = (osp.isfile(osp.join(final, MANIFEST))
                    and (version is None or version == CACHE_VERSION))
            if done and not self.force_reload:
                verify_manifest(final)
                return
            # Leftovers of processes killed while writing (we hold the lock: none is running).
            base = osp.basename(final)
            for name in os.listdir(parent):
                if name.startswith(base + '.tmp-') or name.startswith(base + '.old-'):
                    shutil.rmtree(osp.join(parent, name), ignore_errors=True)
            staging = osp.join(parent, f'{base}.tmp-{uuid.uuid4().hex}')
            os.makedirs(staging)
            self._staging_dir = staging
            try:
                self.process()
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            finally:
                self._staging_dir = None
            write_manifest(staging, {'dataset': self.cache_key(),
                                     'pre_transform': _repr(getattr(self, 'pre_transform', None)),
                                     'pre_filter': _repr(getattr(self, 'pre_filter', None))})
            _fsync_tree(staging)
            if osp.lexists(final):  # force_reload, or an incomplete cache without manifest
                old = osp.join(parent, f'{base}.old-{uuid.uuid4().hex}')
                os.replace(final, old)
                os.replace(staging, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, final)
            _fsync_dir(parent)


__all__ = ['SafeCacheMixin', 'DatasetCacheError', 'file_lock', 'verify_manifest',
           'write_manifest', 'manifest_version', 'cache_folder_name', 'safe_load',
           'CACHE_VERSION']
