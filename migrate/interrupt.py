"""Ctrl-C for glm-migrate: stop at once, say so in one line, leave nothing half-done.

Under ``handling()`` (the command line's), the first SIGINT raises KeyboardInterrupt and every
later one is ignored, so the clean-up the first one starts (worker processes terminated, a
partly built output removed) is not itself cut short, however often Ctrl-C is pressed. Inside
``deferred()`` (steps that must not stop half-way: starting the worker pool, the final renames)
a SIGINT is held and raised when the step ends. Worker processes call ``ignore()`` first thing:
the parent stops them.

Kept free of heavy imports, so the command line can install the handler before it loads libcst.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

_deferring = 0
_pending = False


def _on_sigint(signum, frame) -> None:
    global _pending
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # from now on Ctrl-C is ignored: the clean-up runs whole
    if _deferring:
        _pending = True
    else:
        raise KeyboardInterrupt


@contextmanager
def handling(restore: bool = True):
    """SIGINT as described above for the duration; ``restore=False`` leaves it ignored after an
    interrupt (a process about to exit: a late Ctrl-C must not print a traceback)."""
    global _pending
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    _pending = False
    previous = signal.signal(signal.SIGINT, _on_sigint)
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if restore or not interrupted:
            signal.signal(signal.SIGINT, previous)


@contextmanager
def deferred():
    """Hold a SIGINT that arrives inside this block; KeyboardInterrupt is raised when it ends."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _pending and not _deferring:
        _pending = False
        raise KeyboardInterrupt


def ignore() -> None:
    """For worker processes: Ctrl-C reaches the whole process group, and only the parent acts on it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
