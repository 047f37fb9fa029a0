r"""PyG datasets with an offline-mirror ``download()`` and a crash-safe, verified ``processed/``
(``docs/reliability.md``): :class:`SafeCacheMixin` keys the cache folder by the full
pre-processing state (:func:`describe`), writes it atomically with a ``MANIFEST.json`` of SHA-256
sums under one writer's lock, verifies it on every open and reads it with :func:`safe_load`."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import os.path as osp
import shutil
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from filelock import FileLock
from torch_geometric.data.dataset import files_exist

from pyg_grf.datasets.compact import compact_collated, restore_collated
from pyg_grf.datasets.mirror import (
    DatasetNotFoundError,
    check_not_in_mirror,
    fetch_from_mirror,
    file_digest,
    files_under,
    is_offline,
    not_found_message,
)

MANIFEST = 'MANIFEST.json'
#: Format of the processed caches (part of the folder hash): 2 = compact (:mod:`.compact`).
CACHE_VERSION = 2


class DatasetCacheError(RuntimeError):
    r"""A processed cache does not match its manifest, or holds more than tensors and plain data."""


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    with contextlib.suppress(OSError):  # directories on some file systems
        os.fsync(fd)
    os.close(fd)


def _fsync_tree(path: str) -> None:
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            _fsync(osp.join(dirpath, name))
        _fsync(dirpath)


def file_lock(path: str, timeout: Optional[float] = None) -> FileLock:
    r"""An exclusive lock on the file :obj:`path` (:class:`filelock.FileLock`, a dependency of
    torch), released on exit and by the kernel when the process dies; waits up to :obj:`timeout`
    seconds (:obj:`None`: forever), then raises :class:`TimeoutError`."""
    if osp.isdir(path):
        raise DatasetCacheError(f"The lock file '{path}' is a directory; expected a plain file "
                                f"(pyg_grf creates it). Remove the directory and load again.")
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    return FileLock(path, timeout=-1 if timeout is None else timeout)


def describe(obj: Any, _depth: int = 0) -> Any:
    r"""A JSON-able description of a transform's (or filter's) full configuration: its class and
    every public attribute, recursively (tensors by content). A ``repr`` is not enough: PyG's
    ``AddRandomWalkPE`` prints no ``walk_length``. Private attributes (``_...``, e.g. a generator's
    advancing state) are left out."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [describe(o, _depth + 1) for o in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v, _depth + 1) for k, v in sorted(obj.items(), key=str)}
    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu().contiguous()
        raw = data.numpy().tobytes() if data.numel() else b''
        return {'tensor': list(data.shape), 'dtype': str(data.dtype),
                'sha256': hashlib.sha256(raw).hexdigest()[:16]}
    if isinstance(obj, torch.Generator):
        return 'torch.Generator'
    name = f'{type(obj).__module__}.{type(obj).__qualname__}'
    state = getattr(obj, '__dict__', None)
    if state is None or _depth > 8:
        return {'class': name, 'repr': repr(obj)}
    return {'class': name, 'attrs': {k: describe(v, _depth + 1) for k, v in sorted(state.items())
                                     if not k.startswith('_')}}


def cache_folder_name(key: Dict[str, Any], pre_transform: Any, pre_filter: Any) -> str:
    r"""``processed_<16 hex digits>``: a hash of :obj:`key` and of the repr and :func:`describe` of
    :obj:`pre_transform` and :obj:`pre_filter`."""
    text = json.dumps({'v': CACHE_VERSION, 'key': key, 'pre_transform': repr(pre_transform),
                       'pre_filter': repr(pre_filter), 'pre_transform_config':
                       describe(pre_transform), 'pre_filter_config': describe(pre_filter)},
                      sort_keys=True, default=str)
    return 'processed_' + hashlib.sha256(text.encode()).hexdigest()[:16]


def safe_load(path: str) -> Any:
    r"""``torch.load(path, weights_only=True)`` with PyG's ``Data`` / ``HeteroData`` classes
    allowed, never arbitrary code; anything else raises :class:`DatasetCacheError`."""
    import pickle

    from torch_geometric.data import Data, HeteroData

    # only the classes not allowed already: torch's context removes on exit what it was given,
    # and PyG allows Data for good when imported (its own loaders would fall back to an unsafe
    # full unpickle after that)
    allowed = torch.serialization.get_safe_globals()
    try:
        with torch.serialization.safe_globals([c for c in (Data, HeteroData) if c not in allowed]):
            return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DatasetCacheError(f"'{path}' holds objects other than tensors and plain data "
                                f"(refused, nothing of it was run): {str(exc).splitlines()[0]}; "
                                f"delete it, or rebuild the dataset with force_reload=True"
                                ) from None


def write_manifest(folder: str, info: Dict[str, Any]) -> None:
    r"""Writes ``<folder>/MANIFEST.json`` with the SHA-256 of every file under :obj:`folder`."""
    files = {rel: file_digest(path) for rel, path in files_under(folder, MANIFEST).items()}
    with open(osp.join(folder, MANIFEST), 'w') as f:
        json.dump(dict(info, version=CACHE_VERSION, files=files), f, indent=1, sort_keys=True)


def verify_manifest(folder: str, required: Sequence[str] = ()) -> None:
    r"""Checks that ``<folder>/MANIFEST.json`` lists exactly the files of :obj:`folder` (a
    manifest edited to list fewer hides none), the :obj:`required` ones among them, each with
    its SHA-256; else raises :class:`DatasetCacheError` naming the first mismatch."""
    path = osp.join(folder, MANIFEST)
    hint = f"Delete '{folder}' (it is re-created on the next load) or pass force_reload=True."
    try:
        with open(path) as f:
            files = json.load(f)['files']
        if not isinstance(files, dict):
            raise TypeError('files is not a dict')
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetCacheError(f"The dataset cache manifest '{path}' is unreadable "
                                f"({type(exc).__name__}: {exc}). {hint}") from None
    present = files_under(folder, MANIFEST)
    for rel in sorted(set(present) - set(files)):
        raise DatasetCacheError(f"The dataset cache file '{present[rel]}' is not listed in "
                                f"'{path}': the folder or its manifest was modified. {hint}")
    for rel in sorted(set(files) | set(required)):
        full = osp.join(folder, rel)
        if rel not in present or rel not in files:
            raise DatasetCacheError(f"The dataset cache file '{full}' is missing from the folder "
                                    f"or from '{path}'. {hint}")
        got = file_digest(full)
        if got != files[rel]:
            raise DatasetCacheError(
                f"The dataset cache file '{full}' has SHA-256 {got}, but its manifest lists "
                f"{files[rel]}: it was modified or damaged after it was written. {hint}")


class SafeCacheMixin:
    r"""Mixin for PyG datasets (listed before the PyG dataset class). Subclasses set
    :attr:`mirror_folder` (``TUDataset``, ``Planetoid``, ``LRGB``) or :meth:`mirror_sources`,
    and may extend :meth:`cache_key`, :meth:`download_from_source` and :attr:`not_found_hint`."""

    _staging_dir: Optional[str] = None
    mirror_folder: str = ''
    not_found_hint: str = ''

    def mirror_sources(self) -> List[Tuple[str, str]]:
        r"""``(path in the mirror, folder to copy it into)`` of the raw files: by default
        ``<mirror_folder>/<name>/raw`` into :attr:`raw_dir` (PyG's layout)."""
        return [(f'{self.mirror_folder}/{self.name}/raw', self.raw_dir)]  # type: ignore

    @property
    def has_download(self) -> bool:
        return len(self.raw_file_names) > 0  # type: ignore[attr-defined]

    def _download(self) -> None:
        check_not_in_mirror(self.root)  # type: ignore[attr-defined]
        super()._download()  # type: ignore[misc]

    def download(self) -> None:
        r"""Copies the raw files from the mirror; what is still missing is downloaded by
        :meth:`download_from_source` unless ``$PYG_GRF_OFFLINE`` is set."""
        sources = self.mirror_sources()
        for rel, dest in sources:
            fetch_from_mirror(rel, dest)
        raw_paths = self.raw_paths  # type: ignore[attr-defined]
        if files_exist(raw_paths):
            return
        missing = [osp.basename(p) for p in raw_paths if not osp.exists(p)]
        msg = not_found_message(self.name, osp.dirname(sources[0][0]),  # type: ignore
                                missing, self.not_found_hint)
        if is_offline():
            raise DatasetNotFoundError(msg)
        try:
            self.download_from_source()
        except Exception as exc:
            raise DatasetNotFoundError(f'{msg} (The download failed: {type(exc).__name__}: '
                                       f'{exc}.)') from exc

    def download_from_source(self) -> None:
        r"""The dataset's own download (PyG's ``download()`` by default)."""
        super().download()  # type: ignore[misc]

    def cache_key(self) -> Dict[str, Any]:
        r"""Settings that change the processed files, besides PyG's folder and file names."""
        return {}

    @property
    def cache_parent(self) -> str:
        r"""The folder holding ``processed_<hash>``: that of PyG's ``processed_dir``."""
        return osp.dirname(super().processed_dir)  # type: ignore[misc]

    @property
    def processed_dir(self) -> str:
        r"""``processed_<hash>`` beside PyG's folder, the hash covering PyG's folder and file
        names, :meth:`cache_key` and :func:`describe` of ``pre_transform`` and ``pre_filter``."""
        if self._staging_dir is not None:
            return self._staging_dir
        key = dict(self.cache_key(), cls=f'{type(self).__module__}.{type(self).__qualname__}',
                   pyg_dir=osp.basename(super().processed_dir),  # type: ignore[misc]
                   files=list(self.processed_file_names))  # type: ignore[attr-defined]
        return osp.join(self.cache_parent, cache_folder_name(
            key, getattr(self, 'pre_transform', None), getattr(self, 'pre_filter', None)))

    def pre_process(self, data_list: List[Any]) -> List[Any]:
        r""":obj:`data_list` through ``pre_filter`` and ``pre_transform``, as in PyG."""
        pre_filter, pre_transform = self.pre_filter, self.pre_transform  # type: ignore
        data_list = [d for d in data_list if pre_filter is None or pre_filter(d)]
        return data_list if pre_transform is None else [pre_transform(d) for d in data_list]

    @classmethod
    def save(cls, data_list: Sequence[Any], path: str) -> None:
        r""":meth:`InMemoryDataset.save` in the compact form ``(mapping, slices, data_cls, spec)``
        (:func:`~.compact.compact_collated`), restored bit for bit by :meth:`load`."""
        from torch_geometric.io import fs
        data, slices = cls.collate(data_list)  # type: ignore[attr-defined]
        mapping, spec = compact_collated(data, slices)
        fs.torch_save((mapping, slices, data.__class__, spec), path)

    def load(self, path: str, data_cls: Any = None) -> None:
        r""":meth:`InMemoryDataset.load` of a file written by :meth:`save`, through
        :func:`safe_load`."""
        out = safe_load(path)
        hint = f"delete '{osp.dirname(path)}' or pass force_reload=True."
        if not isinstance(out, tuple) or len(out) != 4 or not isinstance(out[0], dict):
            got = type(out).__name__ + (f' of {len(out)}' if isinstance(out, tuple) else '')
            raise DatasetCacheError(f"'{path}' is not a pyg_grf dataset cache (expected a tuple "
                                    f"(mapping, slices, class, spec), got {got}); {hint}")
        try:
            data = restore_collated(out[0], out[1], out[3])
            if not hasattr(out[2], 'from_dict'):
                raise TypeError(f"the class entry is a {type(out[2]).__name__}, not a Data class")
            self.data = out[2].from_dict(data)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            # what loads with weights_only but is not the structure save() writes
            detail = exc if isinstance(exc, ValueError) else f'{type(exc).__name__}: {exc}'
            raise DatasetCacheError(f"'{path}' is not a readable compact cache: {detail}; "
                                    f"{hint}") from None
        self.slices = out[1]

    def _process(self) -> None:
        final = self.processed_dir
        parent, base = osp.split(final)
        check_not_in_mirror(final)
        os.makedirs(parent, exist_ok=True)
        with file_lock(final + '.lock'):
            names = self.processed_file_names  # type: ignore[attr-defined]
            if osp.isfile(osp.join(final, MANIFEST)) and not self.force_reload:  # type: ignore
                verify_manifest(final, [names] if isinstance(names, str) else names)
                return
            for name in os.listdir(parent):  # leftovers of killed processes (we hold the lock)
                if name.startswith((base + '.tmp-', base + '.old-')):
                    shutil.rmtree(osp.join(parent, name), ignore_errors=True)
            staging = osp.join(parent, f'{base}.tmp-{uuid.uuid4().hex}')
            os.makedirs(staging)
            self._staging_dir = staging
            try:
                self.process()  # type: ignore[attr-defined]
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            finally:
                self._staging_dir = None
            write_manifest(staging, {'pre_transform': repr(getattr(self, 'pre_transform', None)),
                                     'pre_filter': repr(getattr(self, 'pre_filter', None))})
            _fsync_tree(staging)
            old = osp.join(parent, f'{base}.old-{uuid.uuid4().hex}')
            if osp.lexists(final):  # force_reload, or a folder without manifest
                os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
            _fsync(parent)

