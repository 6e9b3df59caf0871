"""Hostile log lines, on SQLite and PostgreSQL (where a NUL in text is a
DataError on every try): NUL bytes and lone surrogates are kept escaped,
huge lines cut, control characters and HTML kept as text and escaped on
the page, broken ``__str__`` and format arguments never raise into the
handler, a flood of lines costs neither memory nor one write per line
(the caps drop it in memory, with one marker), and a worker process that
dies keeps every line flushed before it died."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from dashboard_support import make_dash_app
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.joblogs import MAX_LINE_CHARS, TRUNCATED
from jobdeck.runtime import pool_for
from jobdeck.store.joblogs import lines_of
from jobdeck.worker.pool import WorkerPool

from tests.conftest import wait_for

pytestmark = pytest.mark.backends

TOKEN = "hostile-logs-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


@contextmanager
def _pool(deck: Jobdeck) -> Iterator[WorkerPool]:
    pool = pool_for(deck, 2)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop(grace=5)


def _run(deck: Jobdeck, job_type: str, state: State = State.COMPLETED) -> int:
    job, _ = deck.enqueue(job_type, {}, max_retries=0)
    with _pool(deck):
        wait_for(lambda: deck.store.get(job.id).status is state, timeout=30, message=f"{job_type} {state.value}")
    return job.id


def test_nul_surrogates_huge_and_odd_messages_are_kept_safely(make_deck, registry) -> None:
    @registry.handler("h.odd")
    def odd(payload, ctx):
        ctx.log("nul\x00inside")
        ctx.log("lone \udcff surrogate")
        ctx.log("x" * 1_000_000)
        ctx.log("<script>alert(1)</script>\r\n\x1b[2J\x07\u202e")
        ctx.log(Unprintable())
        ctx.log("%d items", "not a number")  # wrong argument: kept, not raised
        ctx.log.info("%s", Unprintable())
        ctx.log(12345)
        ctx.log("\x00" * MAX_LINE_CHARS)  # escaped, then still cut

    deck = make_deck()
    job_id = _run(deck, "h.odd")
    got = [x.message for x in lines_of(deck.store, job_id)]
    assert got[0] == "nul\\x00inside"
    assert got[1] == "lone \\udcff surrogate"
    assert len(got[2]) == MAX_LINE_CHARS and got[2].endswith("…")
    assert got[3] == "<script>alert(1)</script>\r\n\x1b[2J\x07\u202e"
    assert got[4] == "<unprintable Unprintable>"
    assert got[5].startswith("%d items")
    assert got[6].startswith("<unprintable") or got[6].startswith("%s")
    assert got[7] == "12345"
    assert len(got[8]) == MAX_LINE_CHARS and got[8].startswith("\\x00\\x00")
    html = make_dash_app(deck).test_client().get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_bad_level_fails_the_attempt_with_a_clear_message(make_deck, registry) -> None:
    @registry.handler("h.level")
    def level(payload, ctx):
        ctx.log("x", level="shouting")

    deck = make_deck()
    job_id = _run(deck, "h.level", State.DEAD)
    assert "level must be one of debug, info, warning, error, critical" in (deck.store.get(job_id).error or "")


def test_a_flood_is_dropped_in_memory_with_one_marker(make_deck, registry) -> None:
    flood_lines = 200_000
    peak: list[int] = []

    @registry.handler("h.flood")
    def flood(payload, ctx):
        tracemalloc.start()
        try:
            for i in range(flood_lines):
                ctx.log("flood line %d %s", i, "y" * 100)
            peak.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    deck = make_deck(logs={"max_lines_per_attempt": 500, "flush_interval": 0.2})
    started = time.monotonic()
    job_id = _run(deck, "h.flood")
    took = time.monotonic() - started
    lines = lines_of(deck.store, job_id)
    assert len(lines) == 501 and lines[-1].level == TRUNCATED
    assert [x.message for x in lines[:3]] == [f"flood line {i} {'y' * 100}" for i in range(3)]
    assert peak[0] < 5_000_000, peak  # 500 kept lines, not 200,000
    print(f"{flood_lines} lines logged and capped in {took:.2f} s; peak traced memory {peak[0] / 1e6:.2f} MB")


def test_hostile_heartbeat_lines(make_deck) -> None:
    deck = make_deck(api_token=TOKEN)
    client = create_app(deck=deck).test_client()
    deck.enqueue("demo.noop", {})
    job_id = client.post("/api/jobs/claim", json={"worker_id": "w"}, headers=AUTH).get_json()["id"]
    logs = [
        {"message": "nul\x00"},
        {"message": "z" * 200_000, "level": "error"},
        {"message": "<img src=x onerror=alert(1)>\x1b[31m"},
    ]
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "w", "logs": logs}, headers=AUTH)
    assert r.status_code == 200 and r.get_json()["logs_kept"] == 3
    got = [x.message for x in lines_of(deck.store, job_id)]
    assert got[0] == "nul\\x00" and len(got[1]) == MAX_LINE_CHARS and got[2].startswith("<img")
    deep: object = {"message": "x"}
    for _ in range(200):
        deep = [deep]
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "w", "logs": deep}, headers=AUTH)
    assert r.status_code == 422 and "error" in r.get_json()
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "w", "logs": [{"message": "x", "at": 5}]},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 422 and "logs[0].at" in r.get_json()["error"]
    assert len(lines_of(deck.store, job_id)) == 3


CRASHING_WORKER = """
import os, sys, time
from jobdeck.core.config import load
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for
from jobdeck.store.joblogs import lines_of

url, instance = sys.argv[1], sys.argv[2]
config = load(path=None, env={}, overrides={"database_url": url, "instance_path": instance, "workers": 0,
              "secret_key": "x", "poll_interval": 0.05, "logs": {"flush_interval": 0.1}})
registry = Registry()

@registry.handler("crash.logs")
def crash(payload, ctx):
    ctx.log("kept 1")
    ctx.log.warning("kept 2")
    deadline = time.monotonic() + 20
    while len(lines_of(ctx.store, ctx.job_id)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # the monitor's flush, seen from the handler: a poll with a deadline
    ctx.log("after the last flush")
    os._exit(3)  # the process dies: no end-of-attempt flush

deck = Jobdeck(config, registry)
pool_for(deck, 1).start()
# The handler ends this process (os._exit(3)); the main thread has nothing to
# wait on but that, so this only bounds it. Still alive after it, the script says so.
time.sleep(60)
sys.exit("crash.logs did not end the worker within 60 s")
"""


def test_a_crash_loses_only_the_lines_logged_since_the_last_flush(make_deck, db_url, tmp_path) -> None:
    import subprocess
    import sys

    deck = make_deck(external_types=["crash.logs"])  # the handler lives in the child only
    job, _ = deck.enqueue("crash.logs", {})
    script = tmp_path / "crashing_worker.py"
    script.write_text(CRASHING_WORKER)
    run = subprocess.run(
        [sys.executable, str(script), db_url, str(tmp_path / "instance")], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 3, run.stderr[-3000:]
    got = [(x.level, x.message) for x in lines_of(deck.store, job.id)]
    assert got[:2] == [("info", "kept 1"), ("warning", "kept 2")]
    assert got[2:] in ([], [("info", "after the last flush")])  # unflushed when it died: may be lost
    assert deck.store.get(job.id).status is State.RUNNING  # the stalled sweep rescues it later
