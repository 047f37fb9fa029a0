r"""A graceful stop of ``pyg-grf`` on SIGTERM (a scheduler, ``kill``, ``docker stop``) or SIGINT
(Ctrl-C).

What a stopped ``fit`` leaves on disk is what a killed one leaves: the ``last.ckpt`` of the last
finished epoch (written atomically, and once before the first step, by
:class:`~pyg_grf.lightning.callbacks.AtomicModelCheckpoint`), from which ``--ckpt_path last``
runs the interrupted epoch again and ends where an uninterrupted run ends. No state of the
interrupted epoch is kept, so there is nothing to finish before exiting: the signal raises
:class:`StopSignal` in the main thread at once (Lightning itself only stops at the end of the
current training step, which can take long: the first step compiles the GRF join), the
trainer's ``on_exception`` hooks and teardown run (loggers flushed), and the ``pyg-grf`` command
ends the way the signal would have (:func:`exit_by_signal`; status 143 for SIGTERM, 130 for
SIGINT in a shell). A second signal ends the process at once.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Dict, Iterator, List, Sequence

from lightning.pytorch.utilities.exceptions import SIGTERMException

#: The signals that :func:`stop_on_signals` turns into :class:`StopSignal`.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: The handlers before each open :func:`stop_on_signals` block of this process (outermost first)
_OPEN_BLOCKS: List[Dict[int, Any]] = []


def _restore_in_child() -> None:
    # A process forked inside a block (a DataLoader worker, a multiprocessing pool's worker)
    # gets the handlers of before the outermost block at the C level, before it runs any Python:
    # with a Python-level handler installed, a SIGTERM that lands just before the worker blocks
    # in a lock is only noted, and the worker waits forever (Pool.terminate() then hangs joining
    # it; seen processing Peptides-func under `pyg-grf fit`). This also drops the handlers that
    # Lightning's trainer stacked on top of ours inside the block.
    if not _OPEN_BLOCKS:
        return
    for signum, old in _OPEN_BLOCKS[0].items():
        with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to undo
            signal.signal(signum, old if old is not None else signal.SIG_DFL)
    _OPEN_BLOCKS.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_restore_in_child)


class StopSignal(SIGTERMException):
    r"""Raised by :func:`stop_on_signals` when the process gets a stop signal. A
    :class:`SystemExit` (as Lightning's :class:`SIGTERMException`, which it subclasses), so that
    ``except Exception`` blocks let it through; its exit status is ``128 + signum``."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(128 + self.signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def __str__(self) -> str:
        return f'stopped by {self.signal_name}'


def _default_action(handler, signum: int, frame) -> None:
    # what the process would have done without stop_on_signals
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def stop_on_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    r"""Inside the block, the first of :obj:`signals` raises :class:`StopSignal` in the main
    thread; a second one takes the signal's default action (for SIGTERM and SIGINT: the process
    ends at once). Processes forked inside the block (DataLoader and pool workers) start with
    the handlers of before the block (set at fork, so a worker that waits on a lock still dies
    by SIGTERM). Does nothing outside the main thread (Python handles signals only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    previous = {signum: signal.getsignal(signum) for signum in signals}
    stopping = []

    def handler(signum, frame):
        if os.getpid() != owner:  # a forked worker: what it did before
            return _default_action(previous[signum], signum, frame)
        if stopping:  # the second signal
            return _default_action(signal.SIG_DFL, signum, frame)
        stopping.append(signum)
        raise StopSignal(signum)

    for signum in signals:
        signal.signal(signum, handler)
    _OPEN_BLOCKS.append(previous)
    try:
        yield
    finally:
        del _OPEN_BLOCKS[next(i for i, b in enumerate(_OPEN_BLOCKS) if b is previous)]
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


def exit_by_signal(signum: int) -> None:
    r"""Ends the process as the signal :obj:`signum` would have (its parent sees it killed by
    the signal: status ``128 + signum`` in a shell), once a :class:`StopSignal` has been
    handled: logs and standard streams are flushed, and the child processes (DataLoader
    workers) are killed first, as a busy one (building a batch, compiling the GRF join) holds
    torch's shutdown of the loader for 5 s. Skips the interpreter's own shutdown (2-4 s with
    torch and Lightning loaded on a 2-core machine)."""
    import logging
    import multiprocessing
    import sys
    for child in multiprocessing.active_children():
        child.kill()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # pragma: no cover - only where the signal did not end the process


__all__ = ['STOP_SIGNALS', 'StopSignal', 'exit_by_signal', 'stop_on_signals']
