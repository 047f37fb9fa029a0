r"""How ``pyg-grf`` writes the files of a run: never through a symbolic link, and only into the
run's folder. The files the package writes itself go through :func:`atomic_write`; those that
Lightning writes (``metrics.csv``, ``hparams.yaml``, ``config.yaml``, checkpoints) following
links are guarded by :func:`check_run_folder` before anything is written."""
from __future__ import annotations

import contextlib
import errno
import os
import os.path as osp
import re
import uuid
from typing import IO, Iterable, Iterator, Optional, Union


class RunFolderError(ValueError):
    r"""A run folder that ``pyg-grf`` refuses to write into: it holds a symbolic link where the
    run writes a file, or it is reached through one."""


@contextlib.contextmanager
def atomic_write(path: str, mode: str = 'w', **open_kwargs) -> Iterator[IO]:
    r"""Opens a new temporary file beside :obj:`path` (``O_EXCL | O_NOFOLLOW``: a link planted
    under that name is refused, mode ``0o644`` before the umask) and, when the block ends
    without an error, syncs it and renames it over :obj:`path`: atomic on POSIX file systems,
    and a link at :obj:`path` is replaced, never written through. On an error the temporary
    file is removed and :obj:`path` is left as it was. :obj:`mode` is ``'w'`` (text, with
    :obj:`open_kwargs`) or ``'wb'``."""
    if mode not in ('w', 'wb'):
        raise ValueError(f"atomic_write writes whole files: mode must be 'w' or 'wb', got "
                         f"{mode!r}")
    folder = osp.dirname(osp.abspath(path))
    tmp = osp.join(folder, f'.{osp.basename(path)}.{uuid.uuid4().hex[:12]}.part')
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0) \
        | getattr(os, 'O_CLOEXEC', 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_bytes(path: str, data: Union[bytes, str]) -> None:
    r"""Writes :obj:`data` to :obj:`path` with :func:`atomic_write`."""
    with atomic_write(path, 'wb') as f:
        f.write(data.encode() if isinstance(data, str) else data)


def read_text_nofollow(path: str) -> Optional[str]:
    r"""The text of :obj:`path` (UTF-8, undecodable bytes kept as surrogates, so that writing it
    back with ``errors='surrogateescape'`` restores them), read without following a link
    (:class:`RunFolderError` for a link); :obj:`None` when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunFolderError(f"'{path}' is a symbolic link; pyg-grf reads and writes only "
                                 f"regular files in a run folder (remove the link)") from None
        raise
    with os.fdopen(fd, encoding='utf-8', errors='surrogateescape', newline='') as f:
        return f.read()


def version_number(path: str) -> int:
    r"""``N`` of a ``version_<N>`` log folder :obj:`path`; ``-1`` for another path."""
    match = re.search(r'version_(\d+)$', osp.normpath(path))
    return int(match.group(1)) if match else -1


def check_run_folder(folder: str, root: Optional[str] = None,
                     names: Optional[Iterable[str]] = ()) -> None:
    r"""Refuses to write into :obj:`folder` when a component of it below :obj:`root` (e.g. the
    logger's ``save_dir``) is a symbolic link, so the files would land outside the run, or
    when it holds a link among :obj:`names` (:obj:`None`: any entry; Lightning follows links
    when it writes ``metrics.csv``, ``hparams.yaml`` or ``config.yaml``): raises
    :class:`RunFolderError` naming the link. A folder that does not exist yet passes."""
    folder = osp.abspath(folder)
    if root is not None:
        root = osp.abspath(root)
        part = folder
        while part != root and osp.dirname(part) != part and \
                osp.commonpath([root, part]) == root:
            if osp.islink(part):
                raise RunFolderError(f"'{part}' is a symbolic link; pyg-grf writes a run only "
                                     f"into real folders below '{root}' (remove the link)")
            part = osp.dirname(part)
    if not osp.isdir(folder):
        return
    if names is None:
        with os.scandir(folder) as entries:
            links = [entry.path for entry in entries if entry.is_symlink()]
    else:
        links = [osp.join(folder, name) for name in names if osp.islink(osp.join(folder, name))]
    if links:
        raise RunFolderError(f"'{links[0]}' is a symbolic link; pyg-grf writes only regular "
                             f"files into a run folder (remove the link)")


__all__ = ['RunFolderError', 'atomic_write', 'write_bytes', 'read_text_nofollow',
           'version_number', 'check_run_folder']
