r"""Process-level performance settings.

Linear attention on a large graph allocates and frees tensors of hundreds of MiB in every
forward and backward pass (the ``[N, H, m*d + m]`` key-value products and their gradients).
glibc's ``malloc`` serves every block above its mmap threshold (32 MiB at most) with a fresh
``mmap`` and returns it with ``munmap`` on free, so each such temporary pays its page faults
again on first touch. On the 2-core CPU machines we measure on, that is about half of the time of
a GRF attention layer at N = 262k (``experiments/results/bench_grf.md``: forward+backward
14.5 s with the default settings, 5.1 s with the tuned ones, 2 threads).

:func:`tune_malloc` keeps freed memory in the process instead (the same effect as setting
``MALLOC_MMAP_MAX_=0`` and a large ``MALLOC_TRIM_THRESHOLD_`` in the environment, or preloading
jemalloc/tcmalloc, as the PyTorch CPU performance guide suggests). The ``pyg-grf`` command calls it
at start; a library never changes the allocator on import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

#: Environment variable: set to ``default`` to leave the allocator alone in ``pyg-grf``.
ENV = 'PYG_GRF_MALLOC'
_tuned = False


def tune_malloc() -> bool:
    r"""Keeps freed memory of large tensors in the process (glibc only): no ``mmap`` for large
    blocks (``M_MMAP_MAX = 0``) and no trimming of the heap below 2 GiB of free memory at its top
    (``M_TRIM_THRESHOLD``). Memory freed by one pass is reused by the next instead of being
    returned to the system and faulted in again. The price is a higher peak resident memory, as
    blocks of different sizes fragment the heap: measured at N = 262k, 10.3 GiB instead of
    7.4 GiB for the GRF layer above; set ``PYG_GRF_MALLOC=default`` where memory is the limit.

    Returns :obj:`True` if the settings were applied, :obj:`False` where they do not apply (not
    Linux/glibc, or ``PYG_GRF_MALLOC=default`` in the environment).
    """
    if os.environ.get(ENV, '').lower() == 'default' or not sys.platform.startswith('linux'):
        return False
    name = ctypes.util.find_library('c') or 'libc.so.6'
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
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
    releases free pages in the middle of the heap). With :func:`tune_malloc`'s settings, mini-batch
    training, whose tensors change shape at every step, fragments the heap and its resident size
    grows without bound (measured: +1.24 GiB in 200 Peptides-sized steps, 8.3 GiB after 1360
    steps of the Peptides-func recipe, which the OOM killer ended); a trim every 50 steps keeps
    the growth at 48 MiB for 0.1 s per trim (``docs/reliability.md``). The ``pyg-grf`` command
    does this (:class:`~pyg_grf.lightning.callbacks.MallocTrim`). Returns :obj:`False` where
    there is no glibc."""
    if not sys.platform.startswith('linux'):
        return False
    name = ctypes.util.find_library('c') or 'libc.so.6'
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
