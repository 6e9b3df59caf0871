"""How ``jobdeck serve`` and ``jobdeck worker`` stop on SIGTERM or Ctrl-C.

The signal handler only counts: it never raises. An exception raised from a
handler surfaces wherever the main thread happens to be, and waitress runs
its loop under bare ``except:`` clauses that caught it: SIGTERM during
traffic was sometimes swallowed (the server kept running, once with its
trigger channel closed), and a second Ctrl-C printed a traceback from
inside the shutdown and stranded the running job until the stall rescue.

Instead the main thread waits on a socket that Python's signal wake-up fd
writes to, and then stops things itself, in order:

1. the first signal: stop taking work (the HTTP server), then
   ``Runtime.stop(grace)``: running jobs get up to ``shutdown_grace`` to
   finish, what is left is released;
2. a second signal during that: ``Runtime.hurry()``: what still runs is
   released at once (each such job keeps an attempt row "interrupted by
   shutdown"; no retry is counted), and the process exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from select import POLLIN, poll
from types import FrameType

from jobdeck.runtime import Runtime
from jobdeck.worker.writes import STOP_MARGIN

log = logging.getLogger("jobdeck.shutdown")


class ShutdownSignals:
    """SIGTERM and SIGINT, counted in ``received`` and never raised.

    ``install`` must run in the main thread (Python delivers signals there).
    ``wait_until`` blocks on the wake-up socket, so a signal, or ``wake``
    from another thread, ends the wait at once."""

    def __init__(self) -> None:
        self.received = 0
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._readable = poll()  # not the select call: it refuses a descriptor above 1023
        self._readable.register(self._r, POLLIN)

    def install(self) -> None:
        signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._count)
        signal.signal(signal.SIGINT, self._count)

    def _count(self, signum: int, _frame: FrameType | None) -> None:
        self.received += 1

    def wake(self) -> None:
        """End a ``wait_until`` now so it looks at its condition again."""
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            self._w.send(b"\0")

    def wait_until(self, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``done()`` is true (re-checked on every signal and
        ``wake``); False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._readable.poll(None if remaining is None else remaining * 1000)
            try:
                while self._r.recv(4096):
                    pass
            except BlockingIOError:
                pass
        return True


def run_until_signalled(
    runtime: Runtime,
    signals: ShutdownSignals,
    grace: float,
    *,
    stop_taking_work: Callable[[float], None] | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Wait for the first signal, then stop: ``stop_taking_work(seconds)``
    (the HTTP server, given its share of the grace), then the runtime. A
    second signal hurries the runtime. Returns once everything stopped;
    raises RuntimeError if stopping failed (the caller exits non-zero)."""
    signals.wait_until(lambda: signals.received >= 1)
    say("shutting down: finishing running jobs (signal again to release them now)")
    deadline = time.monotonic() + grace
    failure: list[BaseException] = []
    stopped = threading.Event()

    def stop() -> None:
        try:
            if stop_taking_work is not None:
                stop_taking_work(min(2.0, grace / 4))
            runtime.stop(max(0.0, deadline - time.monotonic()))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            stopped.set()
            signals.wake()

    threading.Thread(target=stop, name="jobdeck-shutdown", daemon=True).start()
    signals.wait_until(lambda: stopped.is_set() or signals.received >= 2)
    if not stopped.is_set():
        say("second signal: releasing running jobs now")
        runtime.hurry()
        if not signals.wait_until(stopped.is_set, timeout=grace + STOP_MARGIN + STUCK_MARGIN):
            log.error(
                "the runtime did not stop within shutdown_grace + %g s; exiting anyway", STOP_MARGIN + STUCK_MARGIN
            )
    if failure:
        log.error("shutdown failed", exc_info=failure[0])
        raise RuntimeError(f"shutdown failed: {failure[0]}")


STUCK_MARGIN = 2.0
"""Seconds past the pool's own deadline that a stop waits for the threads
left (a maintenance loop stuck on a connection the network dropped), before
``exit_promptly`` leaves them behind."""


def leave_stuck_threads(status: int = 0) -> None:
    """Once the runtime has stopped, do not wait on a thread stuck in the
    database driver. Python joins every non-daemon thread at exit (the
    scheduler's executor threads among them), and one blocked on a
    connection whose peer went silent held a stopped process for 15-20 s
    more: they get ``STUCK_MARGIN`` seconds; if any is still running the
    process exits now with ``status``, else this returns."""
    deadline = time.monotonic() + STUCK_MARGIN
    for thread in _joined_at_exit():
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in _joined_at_exit() if t.is_alive()]
    if not stuck:
        return
    log.warning("exiting with %d threads still waiting on the database: %s", len(stuck), ", ".join(stuck))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _joined_at_exit() -> list[threading.Thread]:
    """The threads Python waits for before the process exits: the non-daemon
    ones, and every ``concurrent.futures`` worker, daemon or not (its exit
    hook joins them all; APScheduler's executor threads are such workers)."""
    from concurrent.futures import thread as futures_threads

    me = threading.current_thread()
    workers = set(getattr(futures_threads, "_threads_queues", {}))  # CPython's registry of them
    return [t for t in threading.enumerate() if t is not me and (not t.daemon or t in workers)]
