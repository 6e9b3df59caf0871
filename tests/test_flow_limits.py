"""Flow limits across real processes (``jobdeck.jobs.flow``): a rate never exceeded
in any window of the attempts' start times, a concurrency of one per key
never two at once while other keys flow, on one SQLite file and on
PostgreSQL; plus the API and page figures and the handler's 429."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.flow import START_SLACK, RateLimited
from jobdeck.jobs.handlers import JobContext
from jobdeck.store.models import attempts, jobs, workers
from sqlalchemy import func, select

from tests.conftest import Clock, wait_for
from tests.worker_processes import start_workers, stop, write_config

pytestmark = pytest.mark.backends
ROOT = Path(__file__).parents[1]


def _workers(db_url: str, tmp_path: Path, toml: str, n: int = 3) -> list[subprocess.Popen[bytes]]:
    """``n`` ``python -m jobdeck.cli worker`` processes on one database and config."""
    settings = (
        'secret_key = "s"\ndemo = true\nworkers = 4\npoll_interval = 0.05\nheartbeat_interval = 0.5\n'
        "stall_timeout = 10\nshutdown_grace = 5.0\n" + toml
    )
    return start_workers(write_config(db_url, tmp_path, settings), n)


def _attempt_outcomes(deck: Jobdeck) -> list[tuple[Any, ...]]:
    with deck.store.read() as conn:
        stmt = select(attempts.c.job_id, attempts.c.attempt, attempts.c.outcome, attempts.c.error)
        return [tuple(r) for r in conn.execute(stmt.where(attempts.c.outcome != "completed"))]


def _wait_started(deck: Jobdeck, procs: list[subprocess.Popen[bytes]]) -> None:
    """Until every process's pool heart-beats: a process still starting up
    runs what it claimed late, which would bunch the attempts' start times."""

    def up() -> bool:
        for p in procs:
            assert p.poll() is None, f"worker {p.pid} exited with {p.returncode}"
        with deck.store.read() as conn:
            live = conn.execute(select(func.count()).where(workers.c.stopped_at.is_(None))).scalar_one()
        return live >= len(procs)

    wait_for(up, timeout=60, interval=0.1, message="the worker processes up")


MARK = "flow-test"
"""In the payload of the tests' jobs: ``demo = true`` also runs the demo's
schedules, whose jobs are not the tests' to count."""


def _finished(deck: Jobdeck, n: int) -> bool:
    return len(_intervals(deck)) >= n


def _intervals(deck: Jobdeck) -> list[tuple[Any, Any, dict[str, Any]]]:
    """(start, finish, payload) of the tests' completed attempts."""
    stmt = select(attempts.c.started_at, attempts.c.finished_at, jobs.c.payload).join(
        jobs, jobs.c.id == attempts.c.job_id
    )
    stmt = stmt.where(attempts.c.outcome == "completed")
    with deck.store.read() as conn:
        found = [(s, f, json.loads(p)) for s, f, p in conn.execute(stmt)]
    return [i for i in found if i[2].get("mark") == MARK]


@pytest.mark.slow
@pytest.mark.alone  # starts per second are counted
def test_a_rate_of_20_per_second_is_never_exceeded_across_three_processes(db_url, tmp_path, make_deck):
    deck = make_deck(**{"types": {"demo.noop": {"rate": "20/1s"}}})
    procs = _workers(db_url, tmp_path, '[types."demo.noop"]\nrate = "20/1s"\n')
    try:
        _wait_started(deck, procs)
        deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i, "mark": MARK}} for i in range(90)])
        wait_for(lambda: _finished(deck, 90), timeout=60, message="90 rate-limited jobs done")
    finally:
        stop(procs)
    times = _claims_and_starts(deck)
    assert len(times) == 90, _attempt_outcomes(deck)
    claims = sorted(c for c, _ in times)
    starts = sorted(s for _, s in times)
    worst_claims, worst_starts = _most_in_a_second(claims), _most_in_a_second(starts)
    lag = max((s - c).total_seconds() for c, s in times)
    took = (starts[-1] - starts[0]).total_seconds()
    print(f"max in any 1 s window: {worst_claims} claims, {worst_starts} starts (a start at most {lag:.3f} s "
          f"after its claim); 90 starts over {took:.2f} s")  # fmt: skip

    assert worst_claims <= 20  # the guarantee (docs/flow-control.md)
    if lag <= START_SLACK:  # the window's slack covers the handlers' starts too, when none trails its claim by more
        assert worst_starts <= 20
    assert worst_claims >= 10, "the limit should let about 20 a second through"
    assert took >= 3.5, "90 jobs at 20/s take at least 4 windows"


def _claims_and_starts(deck: Jobdeck) -> list[tuple[Any, Any]]:
    """(claimed, started) of the tests' completed attempts: the time of the
    claim the rate limits (the job's last, whose attempt completed) and its
    handler's start."""
    stmt = select(jobs.c.claimed_at, attempts.c.started_at, jobs.c.payload).join(
        attempts, attempts.c.job_id == jobs.c.id
    )
    stmt = stmt.where(attempts.c.outcome == "completed")
    with deck.store.read() as conn:
        return [(c, s) for c, s, p in conn.execute(stmt) if json.loads(p).get("mark") == MARK]


def _most_in_a_second(times: list[Any]) -> int:
    return max(sum(1 for t in times[i:] if t - s < timedelta(seconds=1)) for i, s in enumerate(times))


@pytest.mark.slow
def test_one_running_job_per_key_across_three_processes_while_other_keys_flow(db_url, tmp_path, make_deck):
    option = {"concurrency": 1, "concurrency_key": "payload.customer"}
    deck = make_deck(**{"types": {"demo.sleep": option}})
    keys = [f"c{i}" for i in range(6)]
    deck.enqueue_many(
        [{"type": "demo.sleep", "payload": {"customer": k, "seconds": 0.05, "mark": MARK}} for k in keys * 8]
    )
    toml = '[types."demo.sleep"]\nconcurrency = 1\nconcurrency_key = "payload.customer"\n'
    procs = _workers(db_url, tmp_path, toml)
    try:
        _wait_started(deck, procs)
        wait_for(lambda: _finished(deck, 48), timeout=90, message="48 keyed jobs done")
    finally:
        stop(procs)
    by_key: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    spans = _intervals(deck)
    for s, f, payload in spans:
        by_key[payload["customer"]].append((s, f))
    for key, runs in by_key.items():
        runs.sort()
        for (_, end), (start, _) in zip(runs, runs[1:]):
            assert start >= end, f"two jobs of {key} ran at once"
    # Other keys flowed meanwhile: at some start, jobs of several keys were running.
    overlap = max(sum(1 for s2, f2, _ in spans if s2 <= s < f2) for s, _, _ in spans)
    print(f"most keys running at once: {overlap}")
    assert overlap >= 2


def test_the_api_and_the_page_show_each_limit_with_its_use(make_deck):
    clock = Clock()
    flow = {
        "types": {"demo.noop": {"rate": "2/60s"}, "demo.sleep": {"concurrency": 1, "concurrency_key": "payload.c"}},
        "queues": {"mail": {"rate": "5/1m", "rate_key": "payload.account"}},
    }
    deck = make_deck(clock, **flow)
    for i in range(3):
        deck.enqueue("demo.noop", {"i": i})
    for c in ("a", "a", "b"):
        deck.enqueue("demo.sleep", {"c": c, "seconds": 1})
    claimed = deck.store.claim("w1", clock.now, limit=10)
    assert sorted(j.type for j in claimed) == ["demo.noop"] * 2 + ["demo.sleep"] * 2

    from jobdeck import create_app

    app = create_app(deck=deck)
    body = app.test_client().get("/api/queues").get_json()
    limits = {(f["scope"], f["name"]): f for f in body["limits"]}
    assert limits[("type", "demo.noop")]["rate"]["text"] == "2 of 2 in the last 60 s"
    assert limits[("type", "demo.sleep")]["concurrency_per_key"]["text"] == "2 keys at their limit of 1 running"
    assert limits[("queue", "mail")]["rate"]["text"] == "0 keys at their limit of 5 per 60 s"
    mail = next(q for q in body["queues"] if q["name"] == "mail")
    assert mail["limits"][0]["rate"]["key"] == "payload.account"

    from jobdeck.jobs.waiting import for_deck

    reasons = for_deck(deck, clock.now)
    held = [j for j in _pending(deck)]
    messages = sorted(reasons.of(j)["message"] for j in held)
    assert messages == [
        "Concurrency limit of type demo.sleep: 1 running for key a",
        "Rate limit of type demo.noop: 2/60s reached",
    ]

    from dashboard_support import make_dash_app

    page = make_dash_app(deck).test_client().get("/queues").get_data(as_text=True)
    assert "2 of 2 in the last 60 s" in page
    assert "2 keys at their limit of 1 running" in page


def _pending(deck: Jobdeck) -> list[Any]:
    from jobdeck.store.records import JobRecord

    with deck.store.read() as conn:
        rows = conn.execute(select(jobs).where(jobs.c.status == State.PENDING.value).order_by(jobs.c.id)).all()
    return [JobRecord.from_row(r) for r in rows]


def test_a_handler_429_closes_the_limit_for_every_process_until_its_time(make_deck):
    clock = Clock()
    flow = {"types": {"demo.noop": {"rate": "100/1s", "rate_key": "payload.account"}}}
    deck = make_deck(clock, **flow)
    other = make_deck(clock, **flow)  # another process on the same database
    for account in ("a", "a", "b"):
        deck.enqueue("demo.noop", {"account": account})
    (first,) = deck.store.claim("w1", clock.now, limit=1)
    ctx = JobContext(deck.store, first.id, first.attempt, "w1", first.type, clock)
    with pytest.raises(RateLimited) as raised:
        ctx.rate_limited(30)
    assert raised.value.seconds == 30
    claimed = other.store.claim("w2", clock.now, limit=10)
    assert [j.payload["account"] for j in claimed] == ["b"]  # account a is closed, b flows
    body = create_app_client(other).get("/api/queues").get_json()
    (limit,) = body["limits"]
    assert limit["closed_until"] == (clock.now + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    assert "rate limited by handler" in limit["closed_text"]
    reason = other_reason(other, clock)
    assert reason["code"] == "flow_limit" and reason["limit_kind"] == "closed" and reason["key"] == "a"
    clock.advance(29)
    assert other.store.claim("w2", clock.now, limit=10) == []
    clock.advance(2)
    assert [j.payload["account"] for j in other.store.claim("w2", clock.now, limit=10)] == ["a"]


def create_app_client(deck: Jobdeck) -> Any:
    from jobdeck import create_app

    return create_app(deck=deck).test_client()


def other_reason(deck: Jobdeck, clock: Clock) -> Any:
    from jobdeck.jobs.waiting import for_deck

    (job,) = _pending(deck)
    return for_deck(deck, clock.now).of(job)


def test_rate_limited_refuses_a_bad_duration(deck):
    job, _ = deck.enqueue("demo.noop")
    ctx = JobContext(deck.store, job.id, 1, "w", job.type)
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="seconds"):
            ctx.rate_limited(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"types": {"t": {"rate": "100"}}}, 'types.t.rate: expected "COUNT/WINDOW"'),
        ({"types": {"t": {"rate": "0/1s"}}}, "types.t.rate: the count must be between 1"),
        ({"types": {"t": {"rate": "-5/1s"}}}, 'types.t.rate: expected "COUNT/WINDOW"'),
        ({"types": {"t": {"rate": "5/0s"}}}, "types.t.rate: the window must be between"),
        ({"types": {"t": {"rate": "5/1d"}}}, 'types.t.rate: expected "COUNT/WINDOW"'),
        ({"types": {"t": {"rate": "5/200h"}}}, "types.t.rate: the window must be between"),
        ({"types": {"t": {"rate": 100}}}, 'types.t.rate: expected "COUNT/WINDOW"'),
        (
            {"queues": {"q": {"rate": "1/1s", "rate_key": "account_id"}}},
            'queues.q.rate_key: expected "payload.<field>"',
        ),
        ({"queues": {"q": {"rate": "1/1s", "rate_key": "payload."}}}, "queues.q.rate_key"),
        ({"queues": {"q": {"rate": "1/1s", "rate_key": "payload..a"}}}, "queues.q.rate_key"),
        ({"queues": {"q": {"rate": "1/1s", "rate_key": "payload.a\x00"}}}, "queues.q.rate_key"),
        ({"queues": {"q": {"rate": "1/1s", "rate_key": "payload" + ".a" * 9}}}, "queues.q.rate_key"),
        ({"queues": {"q": {"rate": "1/1s", "rate_key": ["payload.a"]}}}, "queues.q.rate_key"),
        ({"queues": {"q": {"rate_key": "payload.a"}}}, "queues.q.rate_key: needs a rate"),
        ({"types": {"t": {"concurrency_key": "payload.c"}}}, "types.t.concurrency_key: needs a concurrency"),
        ({"types": {"t": {"concurrency": 0, "concurrency_key": "payload.c"}}}, "types.t.concurrency: must be"),
        ({"types": {"t": {"concurrency": True, "concurrency_key": "payload.c"}}}, "types.t.concurrency: must be"),
        ({"types": {"t": {"concurrency": 1, "concurrency_key": "c"}}}, "types.t.concurrency_key: expected"),
    ],
)
def test_every_bad_flow_option_is_a_config_error_naming_its_key(make_config, registry, table, message):
    from jobdeck.core.config import ConfigError

    with pytest.raises(ConfigError) as info:
        Jobdeck(make_config(**table), registry)
    assert message in str(info.value)


def test_the_rate_syntax_accepts_seconds_minutes_and_hours():
    from jobdeck.jobs.flow import parse_rate

    assert [(r.count, r.window) for r in map(lambda v: parse_rate(v, "x"), ["100/60s", "10/1s", "5/1m", "100/1h", "3/s"])] == [
        (100, 60.0), (10, 1.0), (5, 60.0), (100, 3600.0), (3, 1.0),
    ]  # fmt: skip


def test_a_handler_that_gets_a_429_holds_its_key_in_a_real_pool(make_config, registry):
    """A real pool and handler: the first call for account a answers 429, so
    the handler closes the key for 60 s; account b's jobs keep flowing, a's
    wait, the 429'd one too (snoozed until the key reopens, no retry used)."""
    from jobdeck.runtime import pool_for

    seen: list[str] = []

    @registry.handler("flow.call", max_retries=0)
    def call(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append(payload["account"])
        if payload["account"] == "a":
            ctx.rate_limited(60)

    deck = Jobdeck(make_config(types={"flow.call": {"rate": "1000/1s", "rate_key": "payload.account"}}), registry)
    deck.init_db()
    first, _ = deck.enqueue("flow.call", {"account": "a"})
    pool = pool_for(deck, 2)
    pool.start()
    try:
        wait_for(lambda: deck.store.attempts_of(first.id), message="the 429'd attempt ends")
        assert deck.store.get(first.id).status is State.PENDING, "snoozed, not dead (max_retries = 0)"
        later = [deck.enqueue("flow.call", {"account": k})[0] for k in ("a", "b", "b", "a", "b")]
        wait_for(lambda: sum(deck.store.get(j.id).status is State.COMPLETED for j in later) == 3, message="b flows")
        assert [deck.store.get(j.id).status for j in later if j.payload["account"] == "a"] == [State.PENDING] * 2
        assert seen.count("a") == 1
        limit = create_app_client(deck).get("/api/queues").get_json()["limits"][0]
        assert "rate limited by handler" in limit["closed_text"]
    finally:
        pool.stop(grace=5)
        deck.store.engine.dispose()


def test_a_handler_429_in_the_pool_snoozes_its_job_until_the_limit_reopens(make_deck, registry):
    """``ctx.rate_limited`` is a snooze: the job waits as long as the limit is
    closed, without using up a retry, and its attempt says why."""
    from jobdeck.core.states import AttemptOutcome
    from jobdeck.runtime import pool_for

    registry.handler("t.throttled")(lambda payload, ctx: ctx.rate_limited(30))
    clock = Clock()
    deck = make_deck(clock, types={"t.throttled": {"rate": "100/1s", "rate_key": "payload.account"}})
    job, _ = deck.enqueue("t.throttled", {"account": "a"}, max_retries=0)
    pool = pool_for(deck, 1)
    assert pool.fetch_once() == 1
    pool.run_job(pool.holdings.work.get_nowait())
    assert pool.flush_acks_once() == 1
    after = deck.store.get(job.id)
    assert (after.status, after.retry_count) == (State.PENDING, 0), "max_retries = 0, yet not dead: no retry used"
    assert after.available_at == clock.now + timedelta(seconds=30)
    (row,) = deck.store.attempts_of(job.id)
    assert row.outcome is AttemptOutcome.SNOOZED and row.error == "snoozed for 30 s: rate limited by the handler"
