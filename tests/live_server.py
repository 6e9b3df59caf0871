"""A real waitress server around a real app, for the tests that need a
live deployment (browser, fuzzing, web attacks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from jobdeck.deck import Jobdeck
from jobdeck.runtime import Runtime
from waitress import create_server, wasyncore


@contextmanager
def served(app: Any, host: str = "127.0.0.1", threads: int = 4) -> Iterator[str]:
    """Serve ``app`` with waitress on ``host`` (a free port) in a thread;
    yields the base URL and stops the server on exit.

    The stop runs inside the server's own loop (a trigger thunk closes every
    socket it holds, so the loop ends): closing sockets from this thread
    while the loop selects on them raised EBADF in the loop under load, and
    keep-alive connections left open kept the loop running."""
    sockets: dict[int, Any] = {}
    server = create_server(app, map=sockets, host=host, port=0, threads=threads, ident="jobdeck-test")
    thread = threading.Thread(target=server.run, name="test-waitress", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.effective_port}"
    finally:
        with suppress(OSError):  # EBADF: the loop already ended and closed its trigger; nothing left to wake
            server.trigger.pull_trigger(lambda: wasyncore.close_all(sockets))
        thread.join(timeout=10)
        server.task_dispatcher.shutdown()
        assert not thread.is_alive(), "the waitress loop did not stop"


@contextmanager
def running(deck: Jobdeck, app: Any, workers: int) -> Iterator[str]:
    """``app`` served with a worker pool of ``workers`` threads on ``deck``
    (no scheduler); yields the base URL, then stops both and closes the
    deck's connections."""
    runtime = Runtime(deck, workers=workers, services=False)
    try:
        with served(app) as url:
            runtime.start()
            try:
                yield url
            finally:
                runtime.stop(grace=2)
    finally:
        deck.store.engine.dispose()
