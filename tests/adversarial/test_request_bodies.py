"""Request bodies as each ``http_server`` hands them to the app, on a real
``jobdeck serve``: granian's bodies are read before the WSGI call
(``jobdeck.web.buffered_wsgi``), waitress's by waitress. Chunked bodies arrive
whole, a declared body over the limit is refused without being read, a
chunked one over it is refused once it passes the limit, and the path and
query reach the app decoded as they did before.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
from jobdeck.core.config import HTTP_SERVERS
from jobdeck.core.validation import max_body_bytes

from tests.adversarial.cli_process import JobdeckProcess, write_config

STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
LIMIT = max_body_bytes(65536)
"""The raw body limit of the default ``max_payload_bytes``."""


def _exchange(port: int, request: bytes, body_chunks: list[bytes] = ()) -> tuple[int, dict[str, object], float]:  # type: ignore[assignment]
    """Send ``request`` then each chunk; (status, JSON body, seconds to the answer)."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        try:
            for chunk in body_chunks:
                s.sendall(chunk)
        except OSError:  # the server answered and closed before the whole body was sent
            pass
        received = b""
        while b"\r\n\r\n" not in received or not _complete(received):
            chunk = s.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    match = STATUS_LINE.match(head)
    assert match, received[:300]
    try:
        answer = json.loads(body) if body.strip() else {}
    except ValueError:  # waitress refuses an oversized body itself, in text
        answer = {"error": body.decode(errors="replace")}
    return int(match.group(1)), answer, time.monotonic() - began


def _complete(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    return length is not None and len(body) >= int(length.group(1))


def _post(path: str, extra: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n".encode()
        + extra
        + b"\r\n"
    )


def _chunked(data: bytes, size: int = 1000) -> list[bytes]:
    parts = [b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size]) for i in range(0, len(data), size)]
    return [*parts, b"0\r\n\r\n"]


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_bodies_paths_and_limits_reach_the_app_as_they_should(tmp_path: Path, http_server: str) -> None:
    server = JobdeckProcess(tmp_path, write_config(tmp_path, http_server=http_server, workers=0))
    try:
        server.wait_serving()
        job = json.dumps({"type": "demo.noop", "payload": {"text": "€" * 100}}).encode()

        status, answer, _ = _exchange(server.port, _post("/api/jobs", b"Transfer-Encoding: chunked\r\n"), _chunked(job))
        assert status == 201, answer
        assert answer["payload"] == {"text": "€" * 100}
        job_id = answer["id"]

        declared = _post("/api/jobs", b"Content-Length: %d\r\n" % (LIMIT + 1))
        status, answer, seconds = _exchange(server.port, declared)  # the body is never sent
        assert status == 413, answer
        assert seconds < 5, f"a declared body over the limit took {seconds:.1f} s to refuse"

        huge = b'{"type": "demo.noop", "payload": {"x": "' + b"a" * (LIMIT + 10) + b'"}}'
        status, answer, _ = _exchange(
            server.port, _post("/api/jobs", b"Transfer-Encoding: chunked\r\n"), _chunked(huge, 65536)
        )
        assert status == 413, answer

        status, answer, _ = _exchange(
            server.port,
            b"GET /api/jobs/%%%02x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % (ord(str(job_id)),),
        )
        assert status == 200 and answer["id"] == job_id, answer
        status, answer, _ = _exchange(
            server.port, b"GET /api/jobs?q=%E2%82%AC&limit=5 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        assert status == 200 and [j["id"] for j in answer["jobs"]] == [job_id], answer  # type: ignore[index]
        server.alive()
    finally:
        server.kill()
