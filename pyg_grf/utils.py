r"""Process-level allocator settings for linear attention on large graphs.

Such layers allocate and free tensors of hundreds of MiB in every pass (the ``[N, H, m*d + m]``
key-value products and their gradients). glibc's ``malloc`` serves every block above its mmap
threshold with a fresh ``mmap`` and returns it on free, so each temporary pays its page faults
again (``experiments/results/bench_grf.md``). :func:`tune_malloc` keeps freed memory in the
process instead (as ``MALLOC_MMAP_MAX_=0`` with a large ``MALLOC_TRIM_THRESHOLD_``, or preloading
jemalloc/tcmalloc, as the PyTorch CPU performance guide suggests). The ``pyg-grf`` command calls
it at start; a library never changes the allocator on import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any, Optional

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

#: Environment variable: set to ``default`` to leave the allocator alone in ``pyg-grf``.
ENV = 'PYG_GRF_MALLOC'
_tuned = False


def _libc_function(name: str, *argtypes: Any) -> Optional[Any]:
    # glibc's `name` with its argument types; None off Linux or in a libc without it (musl)
    if not sys.platform.startswith('linux'):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6'), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def tune_malloc() -> bool:
    r"""Keeps freed memory of large tensors in the process (glibc only): no ``mmap`` for large
    blocks (``M_MMAP_MAX = 0``) and no trimming of the heap below 2 GiB of free memory at its top
    (``M_TRIM_THRESHOLD``). The price is a higher peak resident memory, as blocks of different
    sizes fragment the heap; set ``PYG_GRF_MALLOC=default`` where memory is the limit.

    Returns :obj:`True` if the settings were applied, :obj:`False` where they do not apply (not
    Linux/glibc, or ``PYG_GRF_MALLOC=default`` in the environment).
    """
    if os.environ.get(ENV, '').lower() == 'default':
        return False
    mallopt = _libc_function('mallopt', ctypes.c_int, ctypes.c_int)
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1) == 1 and ok
    global _tuned
    _tuned = _tuned or ok
    return ok


def malloc_tuned() -> bool:
    r"""Whether :func:`tune_malloc` has changed this process's allocator settings."""
    return _tuned


def trim_malloc() -> bool:
    r"""Returns the heap's free pages to the system (glibc's ``malloc_trim(0)``, which also
    releases free pages in the middle of the heap). With :func:`tune_malloc`'s settings,
    mini-batch training, whose tensors change shape at every step, fragments the heap and its
    resident size grows without bound; the ``pyg-grf`` command trims every 50 steps
    (:class:`~pyg_grf.lightning.callbacks.MallocTrim`, ``docs/reliability.md``). Returns
    :obj:`False` where there is no glibc."""
    trim = _libc_function('malloc_trim', ctypes.c_size_t)
    if trim is None:
        return False
    trim(0)
    return True
