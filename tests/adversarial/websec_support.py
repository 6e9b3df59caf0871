"""Helpers for the web-attack tests: users with real password hashes, and
the login form's CSRF token (the live server is ``live_server.served``)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers import password_hash

USERS = {
    "alice": {"password_hash": password_hash("alice-secret"), "role": "operator"},
    "victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"},
}


def form_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the form"
    return match.group(1)


@contextmanager
def page_servers() -> Iterator[Callable[[str], int]]:
    """``serve(html)`` starts a plain HTTP server on a fresh 127.0.0.1 port
    that answers every GET with ``html`` (a hostile page on another origin
    than Jobdeck's) and returns the port; all stop on exit."""
    servers: list[ThreadingHTTPServer] = []

    def serve(html: str) -> int:
        page = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, name="hostile-http", daemon=True).start()
        servers.append(server)
        return int(server.server_address[1])

    try:
        yield serve
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
