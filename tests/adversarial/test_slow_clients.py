"""Slow request bodies cannot take the server (issue 29, defect 4).

More connections than ``http_threads`` each send a POST body at one byte a
second to a real ``jobdeck serve`` on each ``http_server`` (granian, the
default, and waitress). While they drip, ``/api/health`` and enqueues from
another client keep answering within a bound, every enqueue answered is
stored, and each dripping connection is answered 408 (or closed) once its
body has taken longer than ``http_body_timeout``, having stored nothing.

Before the fix, on granian, 16 drippers (= ``http_threads``) made health and
every enqueue time out for as long as they dripped (granian's WSGI reads the
body on the thread that runs the request); waitress answered, but kept each
dripper's connection open for as long as it dripped.
"""

from __future__ import annotations

import json
import select
import socket
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from jobdeck.core.config import HTTP_SERVERS

from tests.adversarial.cli_process import JobdeckProcess, write_config

pytestmark = pytest.mark.slow

THREADS = 16
"""The default ``http_threads``."""
DRIPPERS = 40
BODY_TIMEOUT = 4.0
ANSWER_BOUND = 2.0
"""Seconds within which health and an enqueue must answer while the drippers drip."""
CUT_SLACK = 4.0
"""Seconds past the body timeout by which each dripper must have been cut."""


class Dripper:
    """A POST whose declared body arrives one byte a second."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.started = time.monotonic()
        self.sock.sendall(
            b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        self.sock.setblocking(False)
        self.answer = b""
        self.cut_after: float | None = None
        """Seconds from the first byte until the server answered or closed."""

    def drip(self) -> None:
        if self.cut_after is not None:
            return
        try:
            self.sock.send(b" ")
        except OSError:
            self.cut_after = time.monotonic() - self.started

    def read(self) -> None:
        if self.cut_after is not None:
            return
        try:
            chunk = self.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self.answer += chunk
        if not chunk or b"\r\n\r\n" in self.answer:
            self.cut_after = time.monotonic() - self.started


def _drip(drippers: list[Dripper], stop: threading.Event) -> None:
    """One byte a second on every dripping connection; reads whatever the server answers."""
    next_byte = time.monotonic() + 1.0
    while not stop.is_set():
        waiting = [d for d in drippers if d.cut_after is None]
        if not waiting:
            return
        readable, _, _ = select.select([d.sock for d in waiting], [], [], max(0.0, next_byte - time.monotonic()))
        for d in waiting:
            if d.sock in readable:
                d.read()
        if time.monotonic() >= next_byte:
            for d in waiting:
                d.drip()
            next_byte += 1.0


def _timed(request: urllib.request.Request) -> tuple[int, float, bytes]:
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, time.monotonic() - began, response.read()
    except OSError as exc:  # a timeout, a refused or reset connection
        return -1, time.monotonic() - began, repr(exc).encode()


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_slow_bodies_are_cut_and_take_no_thread_from_other_clients(tmp_path: Path, http_server: str) -> None:
    server = JobdeckProcess(
        tmp_path,
        write_config(tmp_path, http_server=http_server, http_threads=THREADS, http_body_timeout=BODY_TIMEOUT),
    )
    stop = threading.Event()
    drippers: list[Dripper] = []
    try:
        server.wait_serving()
        drippers = [Dripper(server.port) for _ in range(DRIPPERS)]
        dripping = threading.Thread(target=_drip, args=(drippers, stop), daemon=True)
        dripping.start()

        health_times, enqueue_times, failures, enqueued = [], [], [], []
        until = time.monotonic() + BODY_TIMEOUT + CUT_SLACK
        while time.monotonic() < until:
            status, seconds, body = _timed(urllib.request.Request(f"{server.url}/api/health"))
            health_times.append(seconds)
            if status != 200:
                failures.append(f"health: {status} {body[:200]!r}")
            enqueue = urllib.request.Request(
                f"{server.url}/api/jobs",
                data=json.dumps({"type": "demo.noop", "payload": {"probe": len(enqueue_times)}}).encode(),
                headers={"Content-Type": "application/json"},
            )
            status, seconds, body = _timed(enqueue)
            enqueue_times.append(seconds)
            if status == 201:
                enqueued.append(json.loads(body)["id"])
            else:
                failures.append(f"enqueue: {status} {body[:200]!r}")
        stop.set()
        dripping.join(timeout=5)
        server.alive()

        cuts = sorted(d.cut_after for d in drippers if d.cut_after is not None)
        statuses = sorted({d.answer.split(b"\r\n", 1)[0].decode(errors="replace") or "closed" for d in drippers})
        print(
            f"\n{http_server}: {DRIPPERS} drippers on {THREADS} threads, body timeout {BODY_TIMEOUT} s: "
            f"health worst {max(health_times) * 1000:.0f} ms of {len(health_times)}, "
            f"enqueue worst {max(enqueue_times) * 1000:.0f} ms of {len(enqueue_times)}; "
            f"drippers cut after {cuts[0] if cuts else 0:.1f}-{cuts[-1] if cuts else 0:.1f} s ({statuses})"
        )
        assert not failures, f"{len(failures)} requests failed while the drippers dripped: {failures[:5]}"
        assert max(health_times) < ANSWER_BOUND, f"health took {max(health_times):.2f} s"
        assert max(enqueue_times) < ANSWER_BOUND, f"an enqueue took {max(enqueue_times):.2f} s"
        assert len(cuts) == DRIPPERS, f"{DRIPPERS - len(cuts)} drippers were still dripping at the deadline"
        assert cuts[0] >= BODY_TIMEOUT - 1, f"a dripper was cut after {cuts[0]:.1f} s, before the body timeout"
        for d in drippers:
            assert d.answer == b"" or d.answer.startswith(b"HTTP/1.1 408"), d.answer[:300]
        with sqlite3.connect(tmp_path / "jobdeck.db") as db:
            stored = {row[0] for row in db.execute("SELECT id FROM jobs WHERE payload LIKE '%probe%'")}
        assert stored == set(enqueued), "the stored jobs are not exactly those whose enqueue was answered"
    finally:
        stop.set()
        for d in drippers:
            d.sock.close()
        server.kill()
