"""A handler module for tests/adversarial/test_signals.py: the first process
that ``jobdeck serve`` forks (granian's worker) waits right after the fork,
before it builds the app, until the test lets it go. It writes
``forked.<pid>`` next to the config when it starts waiting, and goes on when
``go`` appears there (or after a minute)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_HERE = Path(os.environ["JOBDECK_CONFIG"]).parent
_SERVE = os.getpid()


def _gate() -> None:
    if os.getppid() != _SERVE:
        return
    (_HERE / f"forked.{os.getpid()}").write_text("")
    deadline = time.monotonic() + 60
    while not (_HERE / "go").exists() and time.monotonic() < deadline:
        # A poll with a deadline: the sign comes from another process, as a file, and this
        # child, just forked inside ``jobdeck serve``, cannot import tests.conftest.wait_for.
        time.sleep(0.01)


os.register_at_fork(after_in_child=_gate)
