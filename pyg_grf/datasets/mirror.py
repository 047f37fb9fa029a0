r"""Data root (``$PYG_GRF_DATA``, laid out like PyG's roots) and the read-only offline mirror
(``$PYG_GRF_MIRROR``, same layout) that ``download()`` copies raw files from, so that
``processed_*/`` is written beside the copy, never into the mirror.

Every file copied must be listed in the mirror's ``SHA256SUMS`` with the SHA-256 of the bytes
copied, and match the hash pinned in the package (:data:`~.pinned.PINNED_SHA256`) when there is
one; a file that its loader unpickles is copied only with a pinned hash, so a tampered mirror
with a regenerated ``SHA256SUMS`` cannot run code. A mirror without ``SHA256SUMS`` is refused
unless ``$PYG_GRF_MIRROR_UNVERIFIED=1``. ``processed*`` folders (PyG caches, which PyG may
unpickle) are never copied.
"""
import hashlib
import os
import os.path as osp
import re
import shutil
import uuid
import warnings
from typing import Dict, List, Optional, Sequence

from pyg_grf.datasets.pinned import PINNED_SHA256

DATA_ENV, MIRROR_ENV = 'PYG_GRF_DATA', 'PYG_GRF_MIRROR'
OFFLINE_ENV, UNVERIFIED_ENV = 'PYG_GRF_OFFLINE', 'PYG_GRF_MIRROR_UNVERIFIED'
CHECKSUM_FILE = 'SHA256SUMS'
_SUM_LINE = re.compile(r'^([0-9a-fA-F]{64}) [ *](.+)$')


class DatasetNotFoundError(FileNotFoundError):
    r"""A dataset is neither in the data root nor in the mirror, and cannot (or may not) be
    downloaded."""


class MirrorIntegrityError(RuntimeError):
    r"""A mirror file is missing from, or does not match, ``SHA256SUMS`` or the pinned hashes."""


def _flag(env: str) -> bool:
    return os.environ.get(env, '').strip().lower() in {'1', 'true', 'yes', 'on'}


def is_offline() -> bool:
    r"""Whether downloads are forbidden (``$PYG_GRF_OFFLINE`` is ``1``, ``true`` or ``yes``)."""
    return _flag(OFFLINE_ENV)


def data_root() -> str:
    r"""The default data root: ``$PYG_GRF_DATA``, else ``./datasets`` (absolute path)."""
    return osp.abspath(osp.expanduser(os.environ.get(DATA_ENV) or 'datasets'))


def mirror_root() -> Optional[str]:
    r"""``$PYG_GRF_MIRROR`` as an absolute path, or :obj:`None` when unset; raises
    :class:`DatasetNotFoundError` if it is set but is not a directory."""
    path = os.environ.get(MIRROR_ENV)
    if not path:
        return None
    path = osp.abspath(osp.expanduser(path))
    if not osp.isdir(path):
        raise DatasetNotFoundError(
            f"${MIRROR_ENV} is set to '{path}', which is not a directory; expected a folder laid "
            f"out like the data root (e.g. 'TUDataset/MUTAG/raw/'). Unset it or fix the path.")
    return path


def safe_relpath(rel: str, what: str = 'path') -> str:
    r""":obj:`rel` with ``/`` separators if it stays inside the folder it is joined to (no
    absolute path, no ``..``, ``.`` or empty component); else :class:`ValueError`."""
    parts = rel.replace('\\', '/').split('/') if isinstance(rel, str) and rel else ['']
    if osp.isabs(rel) or any(p in ('', '.', '..') for p in parts) or '\0' in rel:
        raise ValueError(f"Expected a relative {what} without '..', '.', empty or absolute "
                         f"components, e.g. 'TUDataset/MUTAG' (got {rel!r})")
    return '/'.join(parts)


def file_digest(path: str, algorithm: str = 'sha256') -> str:
    r"""The hex digest (:mod:`hashlib`'s :obj:`algorithm`) of the file :obj:`path`."""
    h = hashlib.new(algorithm)
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


def files_under(folder: str, exclude: str = '', skip_processed: bool = False) -> Dict[str, str]:
    r"""``{path relative to folder, '/'-separated: full path}`` of every file under
    :obj:`folder` but :obj:`exclude`, in sorted order; ``processed*`` folders are left out if
    :obj:`skip_processed`."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames
                             if not (skip_processed and d.startswith('processed')))
        for name in sorted(filenames):
            rel = osp.relpath(osp.join(dirpath, name), folder).replace(os.sep, '/')
            if rel != exclude:
                out[rel] = osp.join(dirpath, name)
    return out


def read_checksums(mirror: str) -> Optional[Dict[str, str]]:
    r"""``<mirror>/SHA256SUMS`` as ``{relative path: sha256}`` (:obj:`None` if there is none);
    raises :class:`MirrorIntegrityError` if a line is not ``<64 hex digits>  <relative path>``."""
    path = osp.join(mirror, CHECKSUM_FILE)
    if not osp.isfile(path):
        return None
    sums = {}
    with open(path, encoding='utf-8') as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip('\r\n')
            if not line.strip() or line.startswith('#'):
                continue
            match = _SUM_LINE.match(line)
            try:
                if match is None:
                    raise ValueError(f"not '<sha256>  <relative path>' (got {line!r})")
                rel = match.group(2)
                rel = safe_relpath(rel[2:] if rel.startswith('./') else rel, 'path')
            except ValueError as exc:
                raise MirrorIntegrityError(f"'{path}' line {lineno}: {exc}") from None
            sums[rel] = match.group(1).lower()
    return sums


def write_checksums(mirror: str) -> str:
    r"""Writes ``<mirror>/SHA256SUMS`` for every file under :obj:`mirror` (except itself and
    ``processed*`` folders), for a mirror of your own. Returns its path."""
    files = files_under(mirror, CHECKSUM_FILE, skip_processed=True)
    out = osp.join(mirror, CHECKSUM_FILE)
    tmp = f'{out}.{uuid.uuid4().hex}.part'
    with open(tmp, 'w', encoding='utf-8') as f:
        f.writelines(f'{file_digest(path)}  {rel}\n' for rel, path in files.items())
    os.replace(tmp, out)
    return out


def _is_within(path: str, parent: str) -> bool:
    path, parent = osp.realpath(path), osp.realpath(parent)
    return osp.commonpath([path, parent]) == parent


def check_not_in_mirror(path: str) -> None:
    r"""Raises :class:`ValueError` if :obj:`path` lies inside the mirror (PyG would write there)."""
    mirror = mirror_root()
    if mirror is not None and _is_within(path, mirror):
        raise ValueError(
            f"The dataset folder '{path}' lies inside the read-only mirror '{mirror}' "
            f"(${MIRROR_ENV}); PyG would write 'processed/' into it. Point ${DATA_ENV} (or "
            f"'root') at a writable folder outside the mirror.")


def _unpickled(key: str) -> bool:
    # raw files whose loader unpickles them (PyG's Planetoid reads ind.* with pickle)
    name = key.rsplit('/', 1)[-1]
    return name.endswith(('.pickle', '.pkl')) or (
        key.startswith('Planetoid/') and name.startswith('ind.') and not name.endswith('.index'))


def _expected_sha(key: str, sums: Optional[Dict[str, str]], mirror: str) -> Optional[str]:
    pinned = PINNED_SHA256.get(key)
    if pinned is None and _unpickled(key):
        raise MirrorIntegrityError(
            f"'{key}' is unpickled by its loader, and pyg_grf pins no SHA-256 for it "
            f"(pyg_grf.datasets.pinned.PINNED_SHA256): refusing to copy a file whose only check "
            f"would be the mirror's own {CHECKSUM_FILE}. Place the file in the data root "
            f"yourself if you trust it.")
    listed = None if sums is None else sums.get(key)
    if pinned is not None and listed is not None and listed != pinned:
        raise MirrorIntegrityError(f"'{key}': the mirror's {CHECKSUM_FILE} lists {listed} but "
                                   f"pyg_grf pins {pinned} for this file: the mirror was "
                                   f"modified; nothing was copied.")
    if sums is not None and pinned is None and listed is None:
        raise MirrorIntegrityError(
            f"'{key}' is in the mirror '{mirror}' but not in its {CHECKSUM_FILE}; refusing to "
            f"copy an unverified file. Add its checksum (sha256sum {key} >> {CHECKSUM_FILE}, in "
            f"the mirror) or remove it.")
    return pinned or listed


def _copy_verified(src: str, dst: str, key: str, expected: Optional[str]) -> None:
    # Copy to a temporary name and hash the copy; rename it into place only when it matches.
    os.makedirs(osp.dirname(dst), exist_ok=True)
    tmp = f'{dst}.{uuid.uuid4().hex}.part'
    try:
        shutil.copyfile(src, tmp)
        got = file_digest(tmp)
        if expected is not None and got != expected:
            who = 'pyg_grf pins' if expected == PINNED_SHA256.get(key) else f'{CHECKSUM_FILE} lists'
            raise MirrorIntegrityError(
                f"'{key}' in the mirror has SHA-256 {got}, but {who} {expected}: the file is "
                f"corrupt or was modified. Restore it from the original source; nothing was "
                f"copied.")
        os.replace(tmp, dst)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def fetch_from_mirror(rel: str, dest_dir: Optional[str] = None) -> Optional[List[str]]:
    r"""Copies ``<mirror>/<rel>`` (e.g. :obj:`"TUDataset/MUTAG"`: a file, or a folder
    recursively, ``processed*`` skipped) into :obj:`dest_dir` (default: ``<data_root()>/<rel>``),
    keeping existing files and renaming a copy into place only once its hash matched. Returns the
    files copied, or :obj:`None` when no mirror is set or it has no :obj:`rel`; raises
    :class:`MirrorIntegrityError` (module docstring; also for links that leave the mirror)."""
    rel = safe_relpath(rel, 'dataset folder')
    mirror = mirror_root()
    dest_dir = dest_dir or osp.join(data_root(), rel)
    src = None if mirror is None else osp.join(mirror, rel)
    if src is None or not osp.exists(src) or not _is_within(src, mirror):
        return None
    check_not_in_mirror(dest_dir)
    sums = read_checksums(mirror)
    if sums is None:
        if not _flag(UNVERIFIED_ENV):
            raise MirrorIntegrityError(
                f"The mirror '{mirror}' (${MIRROR_ENV}) has no {CHECKSUM_FILE}, so its files "
                f"cannot be verified; expected '{osp.join(mirror, CHECKSUM_FILE)}' in 'sha256sum' "
                f"format. Create it with pyg_grf.datasets.mirror.write_checksums('{mirror}') if "
                f"you trust the mirror, or set ${UNVERIFIED_ENV}=1 to copy unverified files.")
        warnings.warn(f"Copying unverified files from the mirror '{mirror}' (${UNVERIFIED_ENV} "
                      f"is set and it has no {CHECKSUM_FILE})", stacklevel=2)
    files = ({osp.basename(src): src} if osp.isfile(src)
             else files_under(src, skip_processed=True))
    copied = []
    for name, file in files.items():
        dst = osp.join(dest_dir, *name.split('/'))
        if osp.exists(dst):
            continue
        key = osp.relpath(file, mirror).replace(os.sep, '/')
        if not _is_within(file, mirror):
            raise MirrorIntegrityError(f"'{file}' is a link to '{osp.realpath(file)}', outside "
                                       f"the mirror '{mirror}'; refusing to copy it")
        _copy_verified(file, dst, key, _expected_sha(key, sums, mirror))
        copied.append(dst)
    return copied


def not_found_message(dataset: str, mirror_dir: str, missing: Sequence[str],
                      hint: str = '') -> str:
    r"""Why :obj:`dataset` could not be found: the :obj:`missing` raw files, the mirror folder
    :obj:`mirror_dir` it was looked for in, and what to set."""
    mirror = mirror_root()
    where = (f"the mirror ${MIRROR_ENV}='{mirror}' has no complete '{mirror_dir}'" if mirror
             else f"${MIRROR_ENV} is not set")
    msg = (f"Dataset '{dataset}' not found: expected the raw file(s) {list(missing)} (data root "
           f"${DATA_ENV}='{data_root()}'), and {where}. Set ${MIRROR_ENV} to a folder containing "
           f"'{mirror_dir}/...' (laid out like the data root) or put the files there")
    msg += f"; or unset ${OFFLINE_ENV} to download." if is_offline() else " to avoid a download."
    return f'{msg} {hint}'.rstrip()
