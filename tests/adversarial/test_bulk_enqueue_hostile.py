"""``POST /api/jobs/bulk`` against what a hostile or broken client sends.

On a real ``jobdeck serve``, on each ``http_server``: a body exactly at
``max_bulk_bytes`` is enqueued whole, declared or chunked; one byte past is
refused with a JSON 413, unread when declared; the larger cap is that path's
alone; and a client killed mid-body (its connection closed, or reset, with
the JSON already whole and only padding missing) leaves nothing inserted.
Through the app: 1,001 jobs, a bad last job of 1,000, and nesting that
Python's parser cannot follow are refused whole. On PostgreSQL, calls that
share idempotency keys in opposite orders wait for each other, never in a
deadlock, and agree on every key's job.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.config import HTTP_SERVERS
from jobdeck.core.validation import max_body_bytes
from jobdeck.deck import Jobdeck

from tests.adversarial.cli_process import JobdeckProcess, write_config
from tests.adversarial.test_request_bodies import _chunked, _exchange, _post

BULK = "/api/jobs/bulk"
CAP = 600_000
"""``max_bulk_bytes`` of the served deployment: past one enqueue's cap (``max_body_bytes(65536)``)."""


def padded(jobs: list[dict[str, Any]], size: int) -> bytes:
    """A bulk body of ``jobs``, white space after the JSON to make it ``size`` bytes."""
    body = json.dumps({"jobs": jobs}).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def pending(server: JobdeckProcess) -> int:
    with urllib.request.urlopen(f"{server.url}/api/stats", timeout=10) as response:
        return int(json.load(response)["counts"]["pending"])


def cut_off(port: int, head: bytes, sent: bytes, how: str) -> None:
    """Send ``head`` and part of a body, then go away as a killed client
    does: ``close`` (FIN) or ``reset`` (RST); with ``close``, wait for the
    server to answer or close too."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(head + sent)
        if how == "reset":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
    finally:
        s.close()


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_bodies_at_the_cap_past_it_and_cut_off_mid_way(tmp_path: Path, http_server: str) -> None:
    server = JobdeckProcess(tmp_path, write_config(tmp_path, http_server=http_server, workers=0, max_bulk_bytes=CAP))
    try:
        server.wait_serving()
        jobs = [{"type": "demo.noop", "payload": {"i": i, "pad": "x" * 400}} for i in range(1000)]
        at_cap = padded(jobs, CAP)
        assert max_body_bytes(65536) < CAP

        status, answer, _ = _exchange(server.port, _post(BULK, b"Content-Length: %d\r\n" % CAP), [at_cap])
        assert status == 201 and len(answer["jobs"]) == 1000, answer  # type: ignore[arg-type]
        status, answer, _ = _exchange(
            server.port, _post(BULK, b"Transfer-Encoding: chunked\r\n"), _chunked(at_cap, 65536)
        )
        assert status == 201 and len(answer["jobs"]) == 1000, answer  # type: ignore[arg-type]

        refusal = {"error": f"request body too large: at most {CAP} bytes (max_bulk_bytes)"}
        status, answer, seconds = _exchange(server.port, _post(BULK, b"Content-Length: %d\r\n" % (CAP + 1)))
        assert (status, answer) == (413, refusal) and seconds < 5, (
            status,
            answer,
            seconds,
        )  # never sent, not waited for
        status, answer, _ = _exchange(
            server.port, _post(BULK, b"Transfer-Encoding: chunked\r\n"), _chunked(at_cap + b" ", 65536)
        )
        assert (status, answer) == (413, refusal)

        single = b'{"type": "demo.noop"}'
        single += b" " * (max_body_bytes(65536) + 1 - len(single))
        status, answer, _ = _exchange(
            server.port, _post("/api/jobs", b"Content-Length: %d\r\n" % len(single)), [single]
        )
        assert status == 413 and "(max_payload_bytes)" in answer["error"], answer  # type: ignore[operator]
        assert pending(server) == 2000

        # Killed mid-body: the JSON is whole, only white space is missing, so a
        # body handed on short would parse, and its jobs would be stored.
        half = at_cap[: CAP - 1000]
        for how in ("close", "reset"):
            cut_off(server.port, _post(BULK, b"Content-Length: %d\r\n" % CAP), half, how)
            cut_off(server.port, _post(BULK, b"Transfer-Encoding: chunked\r\n"), b"".join(_chunked(half)[:-1]), how)
        one = padded([{"type": "demo.noop", "payload": {"after": True}}], 100)
        status, _, _ = _exchange(server.port, _post(BULK, b"Content-Length: 100\r\n"), [one])
        assert status == 201
        assert pending(server) == 2001, "a body cut off mid-way was enqueued"
        server.alive()
    finally:
        server.kill()


def test_too_many_jobs_a_bad_last_one_and_hopeless_nesting_insert_nothing(deck: Jobdeck) -> None:
    client = create_app(deck=deck).test_client()
    jobs = [{"type": "demo.noop", "payload": {"i": i}} for i in range(1001)]
    r = client.post(BULK, json={"jobs": jobs})
    assert (
        r.status_code == 422 and r.get_json()["error"] == "jobs: 1 to 1000 jobs in one call (max_bulk_jobs), not 1001"
    )
    jobs[999] = {"type": "demo.noop", "payload": {"i": 999}, "run_at": "soon"}
    r = client.post(BULK, json={"jobs": jobs[:1000]})
    assert r.status_code == 422 and (r.get_json()["index"], r.get_json()["field"]) == (999, "jobs[999].run_at")
    deep = b'{"jobs": [{"type": "demo.noop", "payload": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001 + b"]}"
    r = client.post(BULK, data=deep, content_type="application/json")
    assert r.status_code == 422 and "nested deeper than 64 levels" in r.get_json()["error"]
    wide = b'{"jobs": [' + b",".join([b'{"type": "demo.noop", "payload": {"a": [[[[[[1]]]]]]}}'] * 1000) + b"]}"
    assert client.post(BULK, data=wide, content_type="application/json").status_code == 201
    assert sum(deck.store.counts(deck.clock()).values()) == 1000


@pytest.mark.backends
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_calls_sharing_keys_in_opposite_orders_never_deadlock(live_deck: Jobdeck) -> None:
    """Each call inserts its keyed jobs in key order, so two calls that share
    keys wait for each other in one order: the database never has to break a
    deadlock (answered 503, and counted by health as an outage)."""
    app = create_app(deck=live_deck)
    keys = [f"order-{n:03}" for n in range(200)]
    calls = [keys, keys[::-1], keys[::2] + keys[1::2], keys[1::2][::-1] + keys[::2]]
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def send(n: int) -> None:
        items = [{"type": "demo.noop", "payload": {"key": k}, "idempotency_key": k} for k in calls[n]]
        client = app.test_client()
        barrier.wait()
        answers[n] = client.post(BULK, json={"jobs": items})

    threads = [threading.Thread(target=send, args=(n,)) for n in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    statuses = [a.status_code if a is not None else None for a in answers]
    assert set(statuses) <= {200, 201}, [(a.status_code, a.get_json()) for a in answers if a is not None]
    ids: dict[str, int] = {}
    for n, answer in enumerate(answers):
        for key, job in zip(calls[n], answer.get_json()["jobs"], strict=True):
            assert ids.setdefault(key, job["id"]) == job["id"], f"two jobs for {key}"
    assert sum(job["created"] for a in answers for job in a.get_json()["jobs"]) == 200
    assert sum(live_deck.store.counts(live_deck.clock()).values()) == 200
    assert app.test_client().get("/api/health").get_json() == {"ok": True}
