"""Per-job logs on both backends: ``ctx.log`` kept per attempt by a real
worker pool (batched, complete before the outcome), the caps and their one
``truncated`` marker, ``logging`` captured on the right attempt with several
handler threads at once, HTTP workers' heartbeat lines, the API, and
retention deleting the lines with their jobs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.config import ConfigError
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.joblogs import TRUNCATED, LogLimits, LogLine
from jobdeck.runtime import pool_for
from jobdeck.store.joblogs import append_lines, count_lines, lines_of
from jobdeck.store.models import job_logs
from jobdeck.store.upkeep import prune_finished
from jobdeck.worker.pool import WorkerPool
from openapi_check import check
from sqlalchemy import event, func, select

from tests.conftest import wait_for

pytestmark = pytest.mark.backends

TOKEN = "logs-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _messages(deck: Jobdeck, job_id: int, attempt: int | None = None) -> list[tuple[int, str, str]]:
    return [(x.attempt, x.level, x.message) for x in lines_of(deck.store, job_id, attempt=attempt)]


@contextmanager
def _pool(deck: Jobdeck, threads: int = 2) -> Iterator[WorkerPool]:
    pool = pool_for(deck, threads)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop(grace=5)


@contextmanager
def _statements(deck: Jobdeck) -> Iterator[list[str]]:
    """Every SQL statement the deck's engine runs meanwhile."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(deck.store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(deck.store.engine, "before_cursor_execute", record)


def _done(deck: Jobdeck, job_id: int, state: State = State.COMPLETED) -> None:
    wait_for(lambda: deck.store.get(job_id).status is state, timeout=15, message=f"job {job_id} {state.value}")


# -- ctx.log in a real pool ------------------------------------------------------------


def test_ctx_log_lines_are_kept_per_attempt_before_the_outcome(make_deck, registry) -> None:
    @registry.handler("t.chatty", max_retries=2)
    def chatty(payload, ctx):
        ctx.log("starting attempt %d", ctx.attempt)
        ctx.log("careful", level="warning")
        ctx.log.error("boom %s", "soon")
        ctx.log.debug("a detail")
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        ctx.log.info("done")

    deck = make_deck(backoff_base=0.05, backoff_cap=0.1)
    job, _ = deck.enqueue("t.chatty", {})
    with _pool(deck):
        _done(deck, job.id)
        # Read at once: the lines were written before the completion.
        got = _messages(deck, job.id)
    first = [(1, "info", "starting attempt 1"), (1, "warning", "careful"), (1, "error", "boom soon")]
    first.append((1, "debug", "a detail"))
    second = [(2, m[1], m[2].replace("attempt 1", "attempt 2")) for m in first] + [(2, "info", "done")]
    assert got == first + second
    assert _messages(deck, job.id, attempt=2) == second
    assert count_lines(deck.store, job.id) == {1: 4, 2: 5}
    seqs = [x.seq for x in lines_of(deck.store, job.id, attempt=2)]
    assert seqs == [1, 2, 3, 4, 5]


def test_a_handler_that_logs_nothing_costs_no_log_statement(make_deck, registry) -> None:
    deck = make_deck()
    ids = [deck.enqueue("demo.noop", {})[0].id for _ in range(20)]
    with _statements(deck) as seen, _pool(deck):
        for job_id in ids:
            _done(deck, job_id)
    assert not [s for s in seen if "job_logs" in s]


def test_a_chatty_handler_is_written_in_batches_not_per_line(make_deck, registry) -> None:
    @registry.handler("t.flood")
    def flood(payload, ctx):
        for i in range(3000):
            ctx.log("line %d", i)

    deck = make_deck(logs={"max_lines_per_attempt": 5000, "flush_interval": 60})
    job, _ = deck.enqueue("t.flood", {})
    with _statements(deck) as seen, _pool(deck):
        _done(deck, job.id)
    inserts = [s for s in seen if s.lstrip().upper().startswith("INSERT INTO JOB_LOGS")]
    assert len(inserts) == 1, inserts  # 3,000 lines, one executemany at the attempt's end
    lines = lines_of(deck.store, job.id, limit=5000)
    assert [x.message for x in lines] == [f"line {i}" for i in range(3000)]


def test_lines_stream_while_the_attempt_runs(make_deck, registry) -> None:
    go = threading.Event()

    @registry.handler("t.waits")
    def waits(payload, ctx):
        ctx.log("before the wait")
        assert go.wait(15)
        ctx.log("after the wait")

    deck = make_deck(logs={"flush_interval": 0.1})
    job, _ = deck.enqueue("t.waits", {})
    with _pool(deck):
        wait_for(lambda: _messages(deck, job.id), message="the first line is flushed while the job runs")
        assert deck.store.get(job.id).status is State.RUNNING
        go.set()
        _done(deck, job.id)
    assert [m[2] for m in _messages(deck, job.id)] == ["before the wait", "after the wait"]


def test_a_timed_out_attempt_keeps_what_it_logged(make_deck, registry) -> None:
    stuck = threading.Event()

    @registry.handler("t.hangs", timeout=0.5, max_retries=0)
    def hangs(payload, ctx):
        ctx.log("about to hang")
        stuck.wait(10)

    deck = make_deck(logs={"flush_interval": 30})  # only the timeout's flush writes it
    job, _ = deck.enqueue("t.hangs", {})
    try:
        with _pool(deck):
            _done(deck, job.id, State.DEAD)
            assert _messages(deck, job.id) == [(1, "info", "about to hang")]
    finally:
        stuck.set()


# -- caps --------------------------------------------------------------------------------


def test_past_max_lines_an_attempt_keeps_one_truncated_marker(make_deck, registry) -> None:
    @registry.handler("t.many", max_retries=1)
    def many(payload, ctx):
        for i in range(50):
            ctx.log("n%d", i)
        if ctx.attempt == 1:
            raise RuntimeError("again")

    deck = make_deck(backoff_base=0.05, backoff_cap=0.1, logs={"max_lines_per_attempt": 5})
    job, _ = deck.enqueue("t.many", {})
    with _pool(deck):
        _done(deck, job.id)
    for attempt in (1, 2):
        lines = lines_of(deck.store, job.id, attempt=attempt)
        assert [x.message for x in lines[:5]] == [f"n{i}" for i in range(5)]
        assert len(lines) == 6 and lines[5].level == TRUNCATED
        assert "more than 5 lines" in lines[5].message and "max_lines_per_attempt" in lines[5].message


def test_log_config_is_checked(make_config) -> None:
    for bad, key in (
        ({"max_lines_per_attempt": 0}, "logs.max_lines_per_attempt"),
        ({"max_lines_per_attempt": True}, "logs.max_lines_per_attempt"),
        ({"max_bytes_per_job": "lots"}, "logs.max_bytes_per_job"),
        ({"flush_interval": 0}, "logs.flush_interval"),
        ({"capture_logging": "yes"}, "logs.capture_logging"),
        ({"max_lines": 3}, "logs.max_lines"),
    ):
        with pytest.raises(ConfigError, match=key):
            make_config(logs=bad)
    with pytest.raises(ConfigError, match="types.t.capture_logging"):
        make_config(types={"t": {"capture_logging": 1}})
    with pytest.raises(ConfigError, match="logs: expected a table"):
        make_config(logs=3)


# -- logging capture ------------------------------------------------------------------


def test_logging_calls_are_captured_on_the_attempt_that_made_them(make_deck, registry) -> None:
    applog = logging.getLogger("tests.joblogs.app")
    applog.setLevel(logging.INFO)
    threads = 4
    together = threading.Barrier(threads, timeout=10)

    @registry.handler("t.capture")
    def capture(payload, ctx):
        n = payload["n"]
        together.wait()  # every handler thread logs at the same time
        for i in range(30):
            applog.info("job %s line %d", n, i)
        ctx.log("through ctx %s", n)  # kept once, not twice
        try:
            raise ValueError(f"oops {n}")
        except ValueError:
            applog.exception("caught")

    deck = make_deck(logs={"capture_logging": True, "flush_interval": 0.05})
    jobs = [deck.enqueue("t.capture", {"n": n})[0] for n in range(threads)]
    with _pool(deck, threads=threads):
        applog.warning("not in any job: logged by the test's thread")
        for job in jobs:
            _done(deck, job.id)
    for n, job in enumerate(jobs):
        got = _messages(deck, job.id)
        assert [m[2] for m in got[:31]] == [f"job {n} line {i}" for i in range(30)] + [f"through ctx {n}"]
        assert got[31][1] == "error" and got[31][2].startswith("caught\nTraceback") and f"oops {n}" in got[31][2]
        assert len(got) == 32


def test_capture_can_be_on_for_one_type_only(make_deck, registry) -> None:
    applog = logging.getLogger("tests.joblogs.types")

    @registry.handler("t.loud")
    def loud(payload, ctx):
        applog.warning("loud line")

    @registry.handler("t.quiet")
    def quiet(payload, ctx):
        applog.warning("quiet line")

    deck = make_deck(types={"t.loud": {"capture_logging": True}})
    loud_job, _ = deck.enqueue("t.loud", {})
    quiet_job, _ = deck.enqueue("t.quiet", {})
    with _pool(deck):
        _done(deck, loud_job.id)
        _done(deck, quiet_job.id)
    assert _messages(deck, loud_job.id) == [(1, "warning", "loud line")]
    assert _messages(deck, quiet_job.id) == []


# -- HTTP workers, the API, retention ---------------------------------------------------


@pytest.fixture
def api(make_deck):
    deck = make_deck(api_token=TOKEN, logs={"max_lines_per_attempt": 4})
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    return deck, app.test_client()


def _claimed(deck: Jobdeck, client: Any, priority: int = 0) -> int:
    deck.enqueue("demo.noop", {}, priority=priority)
    r = client.post("/api/jobs/claim", json={"worker_id": "http-w"}, headers=AUTH)
    assert r.status_code == 200, r.get_json()
    return int(r.get_json()["id"])


def test_http_workers_send_lines_with_the_heartbeat(api) -> None:
    deck, client = api
    job_id = _claimed(deck, client)
    logs = [{"level": "info", "message": "fetched"}, {"level": "WARN", "message": "slow", "at": "2026-12-01T10:00:00Z"}]
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "http-w", "logs": logs}, headers=AUTH)
    assert r.status_code == 200, r.get_json()
    check(r, "/api/jobs/{job_id}/heartbeat", "post")
    assert r.get_json()["logs_kept"] == 2
    more = [{"level": "error", "message": f"m{i}"} for i in range(5)]
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "http-w", "logs": more}, headers=AUTH)
    assert r.get_json()["logs_kept"] == 2  # the attempt's cap is 4
    got = lines_of(deck.store, job_id)
    assert [(x.level, x.message) for x in got[:4]] == [("info", "fetched"), ("warning", "slow"), ("error", "m0"),
                                                       ("error", "m1")]  # fmt: skip
    assert got[1].at.isoformat() == "2026-12-01T10:00:00+00:00"
    assert got[4].level == TRUNCATED and len(got) == 5
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "http-w"}, headers=AUTH)
    assert r.status_code == 200 and "logs_kept" not in r.get_json()


def test_http_workers_send_their_last_lines_with_complete_or_fail(api) -> None:
    deck, client = api
    done = _claimed(deck, client)
    body = {"worker_id": "http-w", "result": 1, "logs": [{"message": "the end"}]}
    assert client.post(f"/api/jobs/{done}/complete", json=body, headers=AUTH).status_code == 200
    failed = _claimed(deck, client)
    body = {"worker_id": "http-w", "error": "boom", "logs": [{"level": "error", "message": "it broke"}]}
    assert client.post(f"/api/jobs/{failed}/fail", json=body, headers=AUTH).status_code == 200
    assert _messages(deck, done) == [(1, "info", "the end")]
    assert _messages(deck, failed) == [(1, "error", "it broke")]
    # Ahead of the failed job's retry, which is due again once its backoff has passed.
    stranger = _claimed(deck, client, priority=10)
    assert stranger not in (done, failed)
    body = {"worker_id": "not-the-holder", "logs": [{"message": "mine?"}]}
    r = client.post(f"/api/jobs/{stranger}/complete", json=body, headers=AUTH)
    assert r.status_code == 409 and "held by worker" in r.get_json()["error"], r.get_json()
    assert _messages(deck, stranger) == []
    late = {"worker_id": "http-w", "error": "late", "logs": [{"message": "too late"}]}
    r = client.post(f"/api/jobs/{done}/fail", json=late, headers=AUTH)
    assert r.status_code == 409 and "completed; only running jobs can be failed" in r.get_json()["error"], r.get_json()
    assert _messages(deck, done) == [(1, "info", "the end")]


def test_http_workers_send_their_last_lines_with_a_snooze(api) -> None:
    deck, client = api
    job_id = _claimed(deck, client)
    body = {"worker_id": "http-w", "seconds": 100, "logs": [{"message": "429, later"}]}
    r = client.post(f"/api/jobs/{job_id}/snooze", json=body, headers=AUTH)
    assert r.status_code == 200, r.get_json()
    check(r, "/api/jobs/{job_id}/snooze", "post")
    assert _messages(deck, job_id) == [(1, "info", "429, later")]


@pytest.mark.parametrize(
    ("logs", "why"),
    [
        ("text", "logs"),
        ([{"level": "loud", "message": "x"}], "logs[0].level"),
        ([{"message": 3}], "logs[0].message"),
        ([{"message": "x", "at": "yesterday"}], "logs[0].at"),
        ([{"message": "x", "extra": 1}], "logs[0]"),
        (["x"], "logs[0]"),
        ([{"message": "x"}] * 1001, "logs"),
    ],
)
def test_heartbeat_lines_are_validated(api, logs, why) -> None:
    deck, client = api
    job_id = _claimed(deck, client)
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json={"worker_id": "http-w", "logs": logs}, headers=AUTH)
    assert r.status_code == 422, r.get_json()
    assert why in r.get_json()["error"]
    assert lines_of(deck.store, job_id) == []


def test_a_refused_heartbeat_keeps_no_lines(api) -> None:
    deck, client = api
    job_id = _claimed(deck, client)
    body = {"worker_id": "someone-else", "logs": [{"message": "not mine"}]}
    r = client.post(f"/api/jobs/{job_id}/heartbeat", json=body, headers=AUTH)
    assert r.status_code == 409
    assert lines_of(deck.store, job_id) == []


def test_the_api_gives_the_logs_paged_and_by_attempt(api) -> None:
    deck, client = api
    job, _ = deck.enqueue("demo.noop", {})
    limits = LogLimits()
    now = deck.clock()
    append_lines(deck.store, job.id, 1, [LogLine("info", f"a{i}", now) for i in range(3)], 0, limits)
    append_lines(deck.store, job.id, 2, [LogLine("error", "<b>b0</b>", now)], 0, limits)
    r = client.get(f"/api/jobs/{job.id}/logs", headers=AUTH)
    assert r.status_code == 200
    check(r, "/api/jobs/{job_id}/logs", "get")
    body = r.get_json()
    assert [x["message"] for x in body["logs"]] == ["a0", "a1", "a2", "<b>b0</b>"]
    assert body["logs"][3] == {**body["logs"][3], "attempt": 2, "seq": 1, "level": "error"}
    assert body["logs"][0]["at"].endswith("Z") and body["next_after"] is None
    r = client.get(f"/api/jobs/{job.id}/logs?limit=2", headers=AUTH)
    page = r.get_json()
    assert [x["message"] for x in page["logs"]] == ["a0", "a1"] and page["next_after"] == page["logs"][1]["id"]
    rest = client.get(f"/api/jobs/{job.id}/logs?limit=2&after={page['next_after']}", headers=AUTH).get_json()
    assert [x["message"] for x in rest["logs"]] == ["a2", "<b>b0</b>"]
    only = client.get(f"/api/jobs/{job.id}/logs?attempt=2", headers=AUTH).get_json()
    assert [x["message"] for x in only["logs"]] == ["<b>b0</b>"]
    shown = client.get(f"/api/jobs/{job.id}", headers=AUTH)
    check(shown, "/api/jobs/{job_id}", "get")
    assert shown.get_json()["logs"] == {"lines": 4, "url": f"/api/jobs/{job.id}/logs"}


@pytest.mark.parametrize(
    "query", ["attempt=0", "attempt=x", "after=-1", "limit=0", "limit=1001", "after=99999999999999999999"]
)
def test_the_logs_api_refuses_bad_queries(api, query) -> None:
    deck, client = api
    job, _ = deck.enqueue("demo.noop", {})
    r = client.get(f"/api/jobs/{job.id}/logs?{query}", headers=AUTH)
    assert r.status_code == 422 and "error" in r.get_json()


def test_the_logs_api_needs_the_token_and_a_job(api) -> None:
    deck, client = api
    job, _ = deck.enqueue("demo.noop", {})
    assert client.get(f"/api/jobs/{job.id}/logs").status_code == 401
    r = client.get("/api/jobs/999999/logs", headers=AUTH)
    assert r.status_code == 404 and "999999" in r.get_json()["error"]


def test_retention_deletes_the_lines_with_their_job(make_deck, clock) -> None:
    deck = make_deck(clock=clock)
    gone, _ = deck.enqueue("demo.noop", {})
    kept, _ = deck.enqueue("demo.noop", {})
    for job in (gone, kept):
        append_lines(deck.store, job.id, 1, [LogLine("info", "x", clock())], 0, LogLimits())
    (claimed,) = deck.store.claim("w1", clock(), limit=1, types=["demo.noop"])
    assert claimed.id == gone.id
    deck.store.complete(gone.id, "w1", clock())
    clock.advance(7200)
    assert prune_finished(deck.store, [State.COMPLETED], clock() - timedelta(hours=1)) == 1
    with deck.store.read() as conn:
        left = conn.execute(select(job_logs.c.job_id, func.count()).group_by(job_logs.c.job_id)).all()
    assert [tuple(r) for r in left] == [(kept.id, 1)]
