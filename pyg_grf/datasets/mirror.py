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
"""
import os
import os.path as osp
import shutil
import uuid
from typing import Iterable, List, Optional, Sequence

DATA_ENV = 'PYG_GRF_DATA'
MIRROR_ENV = 'PYG_GRF_MIRROR'
OFFLINE_ENV = 'PYG_GRF_OFFLINE'


class DatasetNotFoundError(FileNotFoundError):
    r"""Raised when a dataset is neither in the data root nor in the mirror, and cannot (or may
    not) be downloaded."""


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
    r"""Copies the files of ``<mirror>/<rel_dir>`` (recursively) into :obj:`dest_dir`.

    Files already present in :obj:`dest_dir` are kept (not overwritten); ``processed/`` folders in
    the mirror are skipped. Each file is copied to a temporary name and renamed, so an interrupted
    copy never leaves a truncated raw file. The mirror is only read.

    Args:
        rel_dir (str): The folder relative to the mirror (and to the data root), e.g.
            :obj:`"TUDataset/MUTAG"`.
        dest_dir (str, optional): Where to copy to. (default: ``<data_root()>/<rel_dir>``)

    Returns:
        The list of files copied (possibly empty), or :obj:`None` when no mirror is set or the
        mirror has no :obj:`rel_dir`.
    """
    mirror = mirror_root()
    if dest_dir is None:
        dest_dir = osp.join(data_root(), rel_dir)
    if mirror is None:
        return None
    src_dir = osp.join(mirror, rel_dir)
    if not osp.isdir(src_dir):
        return None
    check_not_in_mirror(dest_dir)

    copied = []
    for dirpath, dirnames, filenames in os.walk(src_dir):
        dirnames[:] = sorted(d for d in dirnames if d != 'processed')
        rel = osp.relpath(dirpath, src_dir)
        out_dir = osp.normpath(osp.join(dest_dir, rel))
        for filename in sorted(filenames):
            dst = osp.join(out_dir, filename)
            if osp.exists(dst):
                continue
            os.makedirs(out_dir, exist_ok=True)
            tmp = f'{dst}.{uuid.uuid4().hex}.part'
            try:
                shutil.copyfile(osp.join(dirpath, filename), tmp)
                os.replace(tmp, dst)
            finally:
                if osp.exists(tmp):
                    os.remove(tmp)
            copied.append(dst)
    return copied


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


__all__ = [
    'DatasetNotFoundError',
    'data_root',
    'mirror_root',
    'is_offline',
    'fetch_from_mirror',
    'ensure_raw_files',
    'check_not_in_mirror',
]
