"""A test hook: SIGKILL this process at a named point of the queue's work,
so the crash matrix (tests/adversarial/test_crash_matrix.py) can prove what
survives a crash exactly there, instead of hoping a timed kill lands in it.

Off unless ``JOBDECK_TEST_CRASH_AT`` is set, and read once at import: then
``crash_point`` is one string comparison. ``claim`` kills right after a
claimed batch is held and before any of it starts; ``ack`` inside an
acknowledgement's transaction, before its commit (just before the statement
where the acknowledgement is one statement in autocommit: PostgreSQL's
completions, ``attempt_statements.complete_recorded``); ``sweep`` inside the
stalled-job sweep's transaction, before its commit. ``ack@3`` kills at the
third time the point is reached.
"""

from __future__ import annotations

import os
import signal
import threading

_POINT, _, _NTH = os.environ.get("JOBDECK_TEST_CRASH_AT", "").partition("@")
_left = int(_NTH or 1)
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Die here, without cleanup of any kind, if the hook names this point."""
    global _left
    if name != _POINT:
        return
    with _lock:
        _left -= 1
        if _left > 0:
            return
    os.kill(os.getpid(), signal.SIGKILL)
