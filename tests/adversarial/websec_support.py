"""Helpers for the web-attack tests: a real waitress server around a real
app, users with real password hashes, and the login form's CSRF token."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from waitress import create_server, wasyncore
from werkzeug.security import generate_password_hash

USERS = {
    "alice": {"password_hash": generate_password_hash("alice-secret"), "role": "operator"},
    "victor": {"password_hash": generate_password_hash("victor-secret"), "role": "viewer"},
}


def form_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the form"
    return match.group(1)


@contextmanager
def served(app: Any, host: str = "127.0.0.1", threads: int = 4) -> Iterator[str]:
    """Serve ``app`` with waitress on ``host`` (a free port) in a thread;
    yields the base URL and stops the server on exit.

    The stop runs inside the server's own loop (a trigger thunk closes every
    socket it holds, so the loop ends): closing sockets from this thread
    while the loop selects on them raised EBADF in the loop under load, and
    keep-alive connections left open kept the loop running."""
    sockets: dict[int, Any] = {}
    server = create_server(app, map=sockets, host=host, port=0, threads=threads, ident="jobdeck-websec")
    thread = threading.Thread(target=server.run, name="websec-waitress", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.effective_port}"
    finally:
        server.trigger.pull_trigger(lambda: wasyncore.close_all(sockets))
        thread.join(timeout=10)
        server.task_dispatcher.shutdown()
        assert not thread.is_alive(), "the waitress loop did not stop"
