"""A held lock makes requests fail fast, never commit late (issue 29).

On PostgreSQL, another connection holds ``LOCK TABLE jobs`` for longer than
``request_lock_timeout`` while a client enqueues through a real ``jobdeck
serve`` (the default server, its worker pool running). The enqueue must be
answered 503, with ``Retry-After`` and a JSON message, soon after the lock
timeout (well before a client's usual 20 s timeout), and must have stored
nothing: once the lock is released the job does not appear, and the
client's retry without an idempotency key stores it once. The dashboard's
pages fail the same way instead of hanging.

Before the fix the enqueue waited for the lock and was committed when it
was released: a client that had given up and retried stored the job twice.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.adversarial.cli_process import JobdeckProcess, write_config
from tests.conftest import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LOCK_TIMEOUT = 1.0
HELD = 6.0
"""Seconds the lock is held: longer than the lock timeout, shorter than the client's patience."""


def _request(url: str, data: dict[str, Any] | None = None) -> tuple[int, Any, bytes, float]:
    body = json.dumps(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=HELD + 10) as response:
            return response.status, response.headers, response.read(), time.monotonic() - began
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read(), time.monotonic() - began


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_an_enqueue_blocked_by_a_held_lock_answers_503_and_stores_nothing(tmp_path: Path, db_url: str) -> None:
    config = write_config(tmp_path, database_url=db_url, request_lock_timeout=LOCK_TIMEOUT)
    server = JobdeckProcess(tmp_path, config)
    engine = create_engine(db_url, pool_size=2)
    try:
        server.wait_serving()

        def count(marker: str) -> int:
            with engine.connect() as conn:
                return int(
                    conn.execute(
                        text("SELECT count(*) FROM jobs WHERE payload::text LIKE :m"), {"m": f"%{marker}%"}
                    ).scalar_one()
                )

        assert _request(f"{server.url}/api/jobs", {"type": "demo.noop", "payload": {"warm": 1}})[0] == 201
        locked = threading.Event()
        release = threading.Event()

        def hold_the_lock() -> None:
            with engine.connect() as conn, conn.begin():
                conn.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
                locked.set()
                release.wait(HELD)

        holder = threading.Thread(target=hold_the_lock, daemon=True)
        holder.start()
        assert locked.wait(10), "the lock was not taken"
        held_since = time.monotonic()

        status, headers, body, seconds = _request(
            f"{server.url}/api/jobs", {"type": "demo.noop", "payload": {"blocked": 1}}
        )
        page_status, _, page, page_seconds = _request(f"{server.url}/jobs")
        health_status = _request(f"{server.url}/api/health")[0]
        still_held = time.monotonic() - held_since < HELD
        release.set()
        holder.join(10)
        print(
            f"\nLOCK TABLE jobs held {HELD:.0f} s, request_lock_timeout {LOCK_TIMEOUT:.0f} s: enqueue answered "
            f"{status} in {seconds:.2f} s (Retry-After {headers.get('Retry-After')}), the jobs page {page_status} "
            f"in {page_seconds:.2f} s"
        )
        assert status == 503, body[:300]
        assert still_held, "the lock was released before the answers came: they say nothing"
        assert seconds < LOCK_TIMEOUT + 2, f"the blocked enqueue took {seconds:.2f} s to answer"
        assert headers.get("Retry-After"), dict(headers)
        assert json.loads(body)["cause"] == "lock_timeout" and "request_lock_timeout" in json.loads(body)["error"], body
        assert health_status == 200, "a lock held past a request's patience turned the process unhealthy"
        assert page_status == 503 and page_seconds < LOCK_TIMEOUT + 2, (page_status, page_seconds, page[:300])

        assert _request(f"{server.url}/api/jobs", {"type": "demo.noop", "payload": {"after": 1}})[0] == 201
        wait_for(lambda: count("after") == 1, 10, message="the enqueue after the release to be stored")
        assert count("blocked") == 0, "the enqueue answered 503 was stored when the lock was released"
        assert _request(f"{server.url}/api/jobs", {"type": "demo.noop", "payload": {"blocked": 1}})[0] == 201
        assert count("blocked") == 1, "the client's retry without a key stored the job twice"
        server.alive()
    finally:
        server.kill()
        engine.dispose()
