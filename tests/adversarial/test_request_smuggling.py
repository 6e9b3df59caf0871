"""A request carrying both ``Content-Length`` and ``Transfer-Encoding`` is
refused, so the request smuggled in its body is never answered (issue 29).

A proxy that frames a request by its ``Content-Length`` passes the whole
thing on as one request; a server that frames it by ``Transfer-Encoding:
chunked`` reads an empty chunked body and then a second request, which the
proxy never saw (and never checked). Before the fix waitress answered both:
the enqueue below was stored. Each ``http_server`` must answer 400 and close
the connection instead.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import time
from pathlib import Path

import pytest
from jobdeck.core.config import HTTP_SERVERS

from tests.adversarial.cli_process import JobdeckProcess, write_config

STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def _enqueue(marker: str) -> bytes:
    body = json.dumps({"type": "demo.noop", "payload": {marker: True}}).encode()
    return (
        b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def _both_framings(order: str) -> bytes:
    body = b"0\r\n\r\n" + _enqueue("smuggled")
    framing = [b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked"]
    if order == "te-first":
        framing.reverse()
    head = b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return head + b"\r\n".join(framing) + b"\r\n\r\n" + body


def _everything_answered(port: int, request: bytes) -> bytes:
    """What the server sends on one connection until it closes it (or goes quiet for 3 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(request)
        received = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        return received


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_a_request_with_two_framings_smuggles_nothing(tmp_path: Path, http_server: str) -> None:
    server = JobdeckProcess(tmp_path, write_config(tmp_path, http_server=http_server, workers=0))
    try:
        server.wait_serving()
        for order in ("cl-first", "te-first"):
            answered = _everything_answered(server.port, _both_framings(order))
            statuses = [int(code) for code in STATUS_LINE.findall(answered)]
            print(f"\n{http_server}, {order}: answered {statuses}")
            assert len(statuses) == 1, f"the smuggled request was answered too: {answered[:1000]!r}"
            if http_server == "waitress":
                assert statuses == [400], answered[:500]
        # The same request alone on a connection is answered: what refused it above was the framing.
        assert STATUS_LINE.findall(_everything_answered(server.port, _enqueue("control"))) == [b"201"]
        server.alive()
        with sqlite3.connect(tmp_path / "jobdeck.db") as db:
            payloads = [row[0] for row in db.execute("SELECT payload FROM jobs WHERE type = 'demo.noop'")]
        assert not [p for p in payloads if "smuggled" in p], f"the smuggled enqueue was stored: {payloads}"
        assert [p for p in payloads if "control" in p], "the control enqueue was not stored"
    finally:
        server.kill()
