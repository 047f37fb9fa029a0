r"""Data root and offline mirror.

Every loader in :mod:`pyg_grf.datasets` keeps its files under one *data root*, laid out like
PyG's own roots (``TUDataset/<NAME>/raw``, ``Planetoid/<Name>/raw``,
``LRGB/peptides-functional/raw``, ...):

* :func:`data_root`: ``$PYG_GRF_DATA``, else ``./datasets``.
* :func:`mirror_root`: ``$PYG_GRF_MIRROR`` (or :obj:`None`), a read-only folder with the same
  layout, for machines without network access. Loaders copy the raw files they need from the
  mirror into the data root (:func:`fetch_from_mirror`) *before* PyG would download them, so PyG's
  ``processed/`` folder is always written beside the copy and never into the mirror.
* :func:`is_offline`: ``$PYG_GRF_OFFLINE`` set to ``1``/``true``/``yes``; then a dataset missing
  from both the data root and the mirror raises :class:`DatasetNotFoundError` at once instead of
  trying to download.

Mirror integrity: the mirror ships ``SHA256SUMS`` (``sha256sum -c`` format, paths relative to the
mirror). Every file copied from the mirror (a symlink: its target's content) must be listed there
with the same SHA-256, checked on the bytes actually copied; an unlisted or mismatching file raises
:class:`MirrorIntegrityError` and nothing is left behind. A mirror without ``SHA256SUMS`` is refused
unless ``$PYG_GRF_MIRROR_UNVERIFIED=1`` (:func:`write_checksums` creates the file for a mirror of
your own). Folders named ``processed*`` (PyG caches, which PyG may unpickle) are never copied.
``SHA256SUMS`` lives in the mirror it checks, so the files of the project's datasets are also
checked against hashes pinned in the package (:data:`pyg_grf.datasets.pinned.PINNED_SHA256`),
and a file that its loader unpickles (Planetoid's ``ind.*``, ``*.pickle``) is copied only with
a pinned hash: a tampered mirror with a regenerated ``SHA256SUMS`` cannot run code.
"""
import hashlib
import os
import os.path as osp
import re
import uuid
import warnings
from typing import Callable, Dict, Iterable, List, Optional, Sequence, TypeVar

from pyg_grf.datasets.pinned import PINNED_SHA256

DATA_ENV = 'PYG_GRF_DATA'
MIRROR_ENV = 'PYG_GRF_MIRROR'
OFFLINE_ENV = 'PYG_GRF_OFFLINE'
UNVERIFIED_ENV = 'PYG_GRF_MIRROR_UNVERIFIED'
CHECKSUM_FILE = 'SHA256SUMS'
_CHUNK = 1 << 20


class DatasetNotFoundError(FileNotFoundError):
    r"""Raised when a dataset is neither in the data root nor in the mirror, and cannot (or may
    not) be downloaded."""


class MirrorIntegrityError(RuntimeError):
    r"""Raised when a mirror file is missing from, or does not match, the mirror's
    ``SHA256SUMS``, or when the mirror has no ``SHA256SUMS``."""


def safe_relpath(rel: str, what: str = 'path') -> str:
    r"""Checks that :obj:`rel` is a relative path that stays inside the folder it is joined to
    (no absolute path, no ``..`` component, no empty or hidden-dot component) and returns it
    normalised with ``/`` separators.

    Raises:
        ValueError: otherwise.
    """
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"Expected a non-empty relative {what} (got {rel!r})")
    parts = rel.replace('\\', '/').split('/')
    if osp.isabs(rel) or rel.startswith(('/', '\\')) or any(
            p in ('', '.', '..') for p in parts) or '\0' in rel:
        raise ValueError(f"Expected a relative {what} without '..', '.', empty or absolute "
                         f"components, e.g. 'TUDataset/MUTAG' (got {rel!r})")
    return '/'.join(parts)


def file_digest(path: str, algorithm: str = 'sha256') -> str:
    r"""The hex digest (:mod:`hashlib`'s :obj:`algorithm`) of the file at :obj:`path`, read in
    chunks: the mirror's ``SHA256SUMS``, the manifests of :mod:`pyg_grf.datasets.cache` and the
    md5 sums of the LRGB release (:func:`pyg_grf.datasets.lrgb.dataset.file_md5`)."""
    h = hashlib.new(algorithm)
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(_CHUNK), b''):
            h.update(chunk)
    return h.hexdigest()


_SUM_LINE = re.compile(r'^([0-9a-fA-F]{64}) [ *](.+)$')


def read_checksums(mirror: str) -> Optional[Dict[str, str]]:
    r"""The ``SHA256SUMS`` of :obj:`mirror` as ``{relative path: sha256}``, or :obj:`None` when
    the mirror has no such file.

    Raises:
        MirrorIntegrityError: if a line is not ``<64 hex digits>  <relative path>``.
    """
    path = osp.join(mirror, CHECKSUM_FILE)
    if not osp.isfile(path):
        return None
    sums: Dict[str, str] = {}
    with open(path, encoding='utf-8') as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip('\n').rstrip('\r')
            if not line.strip() or line.startswith('#'):
                continue
            match = _SUM_LINE.match(line)
            if match is None:
                raise MirrorIntegrityError(
                    f"'{path}' line {lineno} is not '<sha256>  <relative path>' (got {line!r})")
            rel = match.group(2)
            rel = rel[2:] if rel.startswith('./') else rel
            try:
                rel = safe_relpath(rel, 'path in SHA256SUMS')
            except ValueError as exc:
                raise MirrorIntegrityError(f"'{path}' line {lineno}: {exc}") from None
            sums[rel] = match.group(1).lower()
    return sums


def write_checksums(mirror: str) -> str:
    r"""Writes ``<mirror>/SHA256SUMS`` for every file under :obj:`mirror` (except
    ``SHA256SUMS`` itself and ``processed*`` folders), for a mirror of your own. Returns the
    path written."""
    lines = []
    for dirpath, dirnames, filenames in os.walk(mirror):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith('processed'))
        for name in sorted(filenames):
            full = osp.join(dirpath, name)
            rel = osp.relpath(full, mirror).replace(os.sep, '/')
            if rel != CHECKSUM_FILE:
                lines.append(f'{file_digest(full)}  {rel}\n')
    out = osp.join(mirror, CHECKSUM_FILE)
    tmp = f'{out}.{uuid.uuid4().hex}.part'
    with open(tmp, 'w', encoding='utf-8') as f:
        f.writelines(lines)
    os.replace(tmp, out)
    return out


def _allow_unverified() -> bool:
    return os.environ.get(UNVERIFIED_ENV, '').strip().lower() in {'1', 'true', 'yes', 'on'}


def data_root() -> str:
    r"""The default data root: ``$PYG_GRF_DATA``, else ``./datasets`` (absolute path)."""
    return osp.abspath(osp.expanduser(os.environ.get(DATA_ENV) or 'datasets'))


def mirror_root() -> Optional[str]:
    r"""The offline mirror ``$PYG_GRF_MIRROR`` (absolute path), or :obj:`None` when unset.

    Raises:
        DatasetNotFoundError: if ``$PYG_GRF_MIRROR`` is set but is not a directory.
    """
    path = os.environ.get(MIRROR_ENV)
    if not path:
        return None
    path = osp.abspath(osp.expanduser(path))
    if not osp.isdir(path):
        raise DatasetNotFoundError(
            f"${MIRROR_ENV} is set to '{path}', which is not a directory; expected a folder laid "
            f"out like the data root (e.g. 'TUDataset/MUTAG/raw/'). Unset it or fix the path.")
    return path


def is_offline() -> bool:
    r"""Whether downloads are forbidden (``$PYG_GRF_OFFLINE`` is ``1``, ``true`` or ``yes``)."""
    return os.environ.get(OFFLINE_ENV, '').strip().lower() in {'1', 'true', 'yes', 'on'}


def _is_within(path: str, parent: str) -> bool:
    path, parent = osp.realpath(path), osp.realpath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def check_not_in_mirror(path: str) -> None:
    r"""Raises :class:`ValueError` if :obj:`path` lies inside the mirror: PyG would write
    ``processed/`` there."""
    mirror = mirror_root()
    if mirror is not None and _is_within(path, mirror):
        raise ValueError(
            f"The dataset folder '{path}' lies inside the read-only mirror '{mirror}' "
            f"(${MIRROR_ENV}); PyG would write 'processed/' into it. Point ${DATA_ENV} (or "
            f"'root') at a writable folder outside the mirror.")


def fetch_from_mirror(rel_dir: str, dest_dir: Optional[str] = None) -> Optional[List[str]]:
    r"""Copies the files of ``<mirror>/<rel_dir>`` (recursively) into :obj:`dest_dir`, verifying
    each against the mirror's ``SHA256SUMS``.

    Files already present in :obj:`dest_dir` are kept (not overwritten); folders whose name starts
    with ``processed`` (PyG caches) are never copied. Each file is copied to a temporary name,
    hashed while copying, and renamed only when its SHA-256 matches, so an interrupted copy or a
    tampered file never leaves a raw file behind. The mirror is only read.

    Args:
        rel_dir (str): The folder relative to the mirror (and to the data root), e.g.
            :obj:`"TUDataset/MUTAG"`; absolute paths and ``..`` are refused.
        dest_dir (str, optional): Where to copy to. (default: ``<data_root()>/<rel_dir>``)

    Returns:
        The list of files copied (possibly empty), or :obj:`None` when no mirror is set or the
        mirror has no :obj:`rel_dir`.

    Raises:
        MirrorIntegrityError: if the mirror has no ``SHA256SUMS`` (and
            ``$PYG_GRF_MIRROR_UNVERIFIED`` is not set), or a file to copy is not listed there
            or does not match, or a symlink points outside the mirror.
    """
    rel_dir = safe_relpath(rel_dir, 'dataset folder')
    mirror = mirror_root()
    if dest_dir is None:
        dest_dir = osp.join(data_root(), rel_dir)
    if mirror is None:
        return None
    src_dir = osp.join(mirror, rel_dir)
    if not osp.isdir(src_dir) or not _is_within(src_dir, mirror):
        return None
    check_not_in_mirror(dest_dir)
    sums = read_checksums(mirror)
    if sums is None:
        if not _allow_unverified():
            raise MirrorIntegrityError(
                f"The mirror '{mirror}' (${MIRROR_ENV}) has no {CHECKSUM_FILE}, so its files "
                f"cannot be verified; expected '{osp.join(mirror, CHECKSUM_FILE)}' in "
                f"'sha256sum' format. Create it with "
                f"pyg_grf.datasets.mirror.write_checksums('{mirror}') if you trust the mirror, "
                f"or set ${UNVERIFIED_ENV}=1 to copy unverified files.")
        warnings.warn(f"Copying unverified files from the mirror '{mirror}' "
                      f"(${UNVERIFIED_ENV} is set and it has no {CHECKSUM_FILE})", stacklevel=2)

    copied = []
    for dirpath, dirnames, filenames in os.walk(src_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith('processed'))
        rel = osp.relpath(dirpath, src_dir)
        out_dir = osp.normpath(osp.join(dest_dir, rel))
        for filename in sorted(filenames):
            dst = osp.join(out_dir, filename)
            if osp.exists(dst):
                continue
            src = osp.join(dirpath, filename)
            key = osp.relpath(src, mirror).replace(os.sep, '/')
            if not _is_within(src, mirror):
                raise MirrorIntegrityError(
                    f"'{src}' is a link to '{osp.realpath(src)}', outside the mirror "
                    f"'{mirror}'; refusing to copy it")
            expected = None
            pinned = PINNED_SHA256.get(key)
            if pinned is None and _unpickled(key):
                raise MirrorIntegrityError(
                    f"'{key}' is unpickled by its loader, and pyg_grf pins no SHA-256 for it "
                    f"(pyg_grf.datasets.pinned.PINNED_SHA256): refusing to copy a file whose "
                    f"only check would be the mirror's own {CHECKSUM_FILE}. Place the file in "
                    f"'{dest_dir}' yourself if you trust it.")
            if sums is not None:
                expected = sums.get(key)
                if pinned is not None and expected is not None and expected != pinned:
                    raise MirrorIntegrityError(
                        f"'{key}': the mirror's {CHECKSUM_FILE} lists {expected} but pyg_grf "
                        f"pins {pinned} for this file: the mirror was modified; nothing was "
                        f"copied.")
                expected = pinned if pinned is not None else expected
                if expected is None:
                    raise MirrorIntegrityError(
                        f"'{key}' is in the mirror '{mirror}' but not in its {CHECKSUM_FILE}; "
                        f"refusing to copy an unverified file. Add its checksum "
                        f"(sha256sum {key} >> {CHECKSUM_FILE}, in the mirror) or remove it.")
            os.makedirs(out_dir, exist_ok=True)
            tmp = f'{dst}.{uuid.uuid4().hex}.part'
            try:
                h = hashlib.sha256()
                with open(src, 'rb') as fin, open(tmp, 'wb') as fout:
                    for chunk in iter(lambda: fin.read(_CHUNK), b''):
                        h.update(chunk)
                        fout.write(chunk)
                got = h.hexdigest()
                if expected is None:  # unverified mirror ($PYG_GRF_MIRROR_UNVERIFIED)
                    expected = pinned
                if expected is not None and got != expected:
                    raise MirrorIntegrityError(
                        f"'{key}' in the mirror '{mirror}' has SHA-256 {got}, but "
                        f"{'pyg_grf pins' if expected == pinned else CHECKSUM_FILE + ' lists'} "
                        f"{expected}: the file is corrupt or was modified. "
                        f"Restore it from the original source; nothing was copied.")
                os.replace(tmp, dst)
            finally:
                if osp.exists(tmp):
                    os.remove(tmp)
            copied.append(dst)
    return copied


def _unpickled(key: str) -> bool:
    # raw files whose loader unpickles them (PyG's Planetoid reads ind.* with pickle)
    name = key.rsplit('/', 1)[-1]
    return name.endswith('.pickle') or name.endswith('.pkl') or (
        key.startswith('Planetoid/') and name.startswith('ind.') and
        not name.endswith('.test.index'))


def missing_files(paths: Iterable[str]) -> List[str]:
    r"""The paths among :obj:`paths` that do not exist."""
    return [p for p in paths if not osp.exists(p)]


def ensure_raw_files(
    rel_dir: str,
    dest_dir: str,
    raw_paths: Sequence[str],
    dataset: str,
    hint: str = '',
) -> List[str]:
    r"""Makes sure a dataset's raw files exist under :obj:`dest_dir`, copying them from the mirror
    when they do not.

    Returns the raw paths still missing afterwards (empty when all are present). Those are left to
    the dataset's own ``download()`` when online; when offline (:func:`is_offline`) a
    :class:`DatasetNotFoundError` says what is missing and which environment variable to set.

    Args:
        rel_dir (str): The dataset folder relative to the mirror, e.g. :obj:`"TUDataset/MUTAG"`.
        dest_dir (str): The matching folder in the data root.
        raw_paths (list of str): The files the dataset needs (absolute paths under
            :obj:`dest_dir`).
        dataset (str): The dataset name, for messages.
        hint (str, optional): Extra sentence appended to the error message.
    """
    check_not_in_mirror(dest_dir)
    missing = missing_files(raw_paths)
    if not missing:
        return []
    fetch_from_mirror(rel_dir, dest_dir)
    missing = missing_files(raw_paths)
    if missing and is_offline():
        raise DatasetNotFoundError(not_found_message(rel_dir, dest_dir, missing, dataset, hint))
    return missing


def not_found_message(rel_dir: str, dest_dir: str, missing: Sequence[str], dataset: str,
                      hint: str = '') -> str:
    mirror = mirror_root()
    names = ', '.join(osp.relpath(p, dest_dir) for p in missing)
    where = (f"the mirror ${MIRROR_ENV}='{mirror}' has no complete '{rel_dir}'" if mirror else
             f"${MIRROR_ENV} is not set")
    msg = (f"Dataset '{dataset}' not found: expected the raw file(s) [{names}] under '{dest_dir}' "
           f"(data root ${DATA_ENV}='{data_root()}'), and {where}. Set ${MIRROR_ENV} to a folder "
           f"containing '{rel_dir}/...' (laid out like the data root) or put the files under "
           f"${DATA_ENV}")
    msg += f"; or unset ${OFFLINE_ENV} to download." if is_offline() else " to avoid a download."
    if hint:
        msg += ' ' + hint
    return msg


def download_failed(exc: BaseException, rel_dir: str, dest_dir: str, missing: Sequence[str],
                    dataset: str, hint: str = '') -> DatasetNotFoundError:
    r"""Wraps a network error raised by a PyG download into a :class:`DatasetNotFoundError` that
    says how to load the dataset offline."""
    msg = not_found_message(rel_dir, dest_dir, missing, dataset, hint)
    return DatasetNotFoundError(f'{msg} (The download failed: {type(exc).__name__}: {exc}.)')


def resolve_root(root: Optional[str], folder: str) -> str:
    r"""A loader's root directory: :obj:`root` made absolute, or ``<data_root()>/<folder>`` when
    :obj:`root` is :obj:`None`."""
    return osp.abspath(root) if root is not None else osp.join(data_root(), folder)


_T = TypeVar('_T')


def build_with_mirror(build: Callable[[], _T], rel_dir: str, dest_dir: str,
                      raw_paths: Sequence[str], dataset: str, hint: str = '') -> _T:
    r"""Returns ``build()`` (a PyG dataset constructor, which downloads the raw files it still
    lacks) after :func:`ensure_raw_files` has copied them from the mirror where it can. If
    ``build()`` fails while raw files are still missing (the download failed), raises
    :func:`download_failed`'s :class:`DatasetNotFoundError` instead, which says how to load the
    dataset offline; any other error propagates as it is. The arguments after :obj:`build` are
    those of :func:`ensure_raw_files`."""
    missing = ensure_raw_files(rel_dir, dest_dir, raw_paths, dataset, hint)
    try:
        return build()
    except Exception as exc:
        if missing and missing_files(raw_paths):  # the download failed
            raise download_failed(exc, rel_dir, dest_dir, missing, dataset, hint) from exc
        raise


__all__ = [
    'DatasetNotFoundError',
    'MirrorIntegrityError',
    'read_checksums',
    'write_checksums',
    'safe_relpath',
    'data_root',
    'mirror_root',
    'is_offline',
    'fetch_from_mirror',
    'ensure_raw_files',
    'build_with_mirror',
    'resolve_root',
    'check_not_in_mirror',
    'file_digest',
]
