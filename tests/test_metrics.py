"""``GET /metrics``: parsed by prometheus_client's own parser, its values
match what the API answers (both databases), its counters never go down
(pruning, a second process), no read scans the jobs table, and it is
guarded like the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.store import Outcome
from jobdeck.store.upkeep import prune_stats
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from tests.dashboard_support import make_dash_app

pytestmark = pytest.mark.backends

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Any, **kwargs: Any) -> Samples:
    response = client.get("/metrics", **kwargs)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.content_type.startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def of(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def fill(deck, clock) -> None:
    """Jobs in every state over two queues: completed, retried, dead,
    running, scheduled and waiting, rolled up into the counters."""
    for _ in range(4):
        deck.enqueue("demo.noop", queue="mail")
    deck.enqueue("demo.noop", queue="reports", delay_seconds=3600)
    deck.enqueue("demo.fail", queue="reports", max_retries=0)
    deck.enqueue("demo.fail", queue="mail", max_retries=2)
    deck.enqueue("demo.noop")  # default
    claimed = deck.store.claim("w1", clock.now, limit=6, queues=["mail", "reports"])
    clock.advance(2)
    noops = [j for j in claimed if j.type == "demo.noop"]
    for j in noops[:2]:
        deck.store.complete(j.id, "w1", clock.now)
    deck.store.fail_many(
        [Outcome(j.id, "w1", attempt=j.attempt, error="RuntimeError: broke") for j in claimed if j.type == "demo.fail"],
        clock.now,
    )
    deck.enqueue("demo.noop", queue="mail")
    clock.advance(120)
    deck.maintenance.rollup_once(clock.now)  # first call sets the watermark an hour back
    deck.maintenance.rollup_once(clock.now)


def test_values_match_the_api_counts(make_deck, clock):
    deck = make_deck(clock=clock, dashboard={"counts_cache_seconds": 0})
    fill(deck, clock)
    client = create_app(deck=deck).test_client()
    m = scrape(client)

    counts = client.get("/api/stats").get_json()["counts"]
    jobs = of(m, "jobdeck_jobs")
    per_state: dict[str, float] = {}
    for labels, n in jobs.items():
        state = dict(labels)["state"]
        per_state[state] = per_state.get(state, 0) + n
    assert per_state == {state: float(n) for state, n in counts.items()}
    assert (counts["running"], counts["failed"], counts["dead"], counts["scheduled"]) == (2, 1, 1, 1)

    for q in client.get("/api/queues").get_json()["queues"]:
        name = q["name"]
        waiting = sum(value(m, "jobdeck_jobs", state=s, queue=name) for s in ("pending", "scheduled", "failed"))
        assert waiting == q["waiting"], name
        assert value(m, "jobdeck_jobs", state="running", queue=name) == q["running"]
        assert value(m, "jobdeck_queue_paused", queue=name) == (1 if q["paused"] else 0)

    [day] = [w for w in client.get("/api/stats/types").get_json()["windows"] if w["window"] == "24 h"]
    for t in day["types"]:
        for outcome in ("completed", "failed", "dead"):
            assert value(m, "jobdeck_job_runs_total", type=t["type"], outcome=outcome) == t[outcome]
        runs = value(m, "jobdeck_job_duration_seconds_count", type=t["type"])
        assert runs == t["completed"] + t["failed"]
        assert value(m, "jobdeck_job_duration_seconds_bucket", type=t["type"], le="+Inf") == runs
    assert value(m, "jobdeck_job_runs_total", type="demo.noop", outcome="completed") == 2
    assert value(m, "jobdeck_job_runs_total", type="demo.fail", outcome="dead") == 1

    # The mail queue's head (the job enqueued after the claim) has waited 120 s; reports' only due job runs.
    assert value(m, "jobdeck_queue_latency_seconds", queue="mail") == pytest.approx(120)
    assert ("jobdeck_queue_latency_seconds", (("queue", "reports"),)) not in m


def test_the_histogram_buckets_hold_the_run_times(make_deck, clock):
    deck = make_deck(clock=clock)
    deck.enqueue("demo.noop")
    [job] = deck.store.claim("w1", clock.now)
    clock.advance(3)  # a 3 s run: above the 2.83 s edge, below 4.1 s
    deck.store.complete(job.id, "w1", clock.now)
    clock.advance(120)
    deck.maintenance.rollup_once(clock.now)
    deck.maintenance.rollup_once(clock.now)
    m = scrape(create_app(deck=deck).test_client())
    buckets = {dict(k)["le"]: v for k, v in of(m, "jobdeck_job_duration_seconds_bucket").items()}
    ordered = sorted(((float(le), n) for le, n in buckets.items()), key=lambda p: p[0])
    assert [n for _, n in ordered] == sorted(n for _, n in ordered)  # cumulative
    assert [le for le, _ in ordered[:3]] == [0.001, 0.002, 0.004] and ordered[-2][0] == pytest.approx(8388.608)
    assert all(n == 0 for le, n in ordered if le < 3) and all(n == 1 for le, n in ordered if le >= 4.1)
    assert 3 * 2**-0.25 <= value(m, "jobdeck_job_duration_seconds_sum", type="demo.noop") <= 3 * 2**0.25


def test_counters_never_go_down_when_minutes_are_pruned_and_agree_across_processes(make_deck, clock):
    first = make_deck(clock=clock)
    fill(first, clock)
    before = of(scrape(create_app(deck=first).test_client()), "jobdeck_job_runs_total")
    assert before
    assert prune_stats(first.store, clock.now + timedelta(days=1)) > 0  # every minute gone
    second = make_deck(clock=clock)
    after_first = of(scrape(create_app(deck=first).test_client()), "jobdeck_job_runs_total")
    after_second = of(scrape(create_app(deck=second).test_client()), "jobdeck_job_runs_total")
    assert after_first == after_second == before

    deck = second
    job, _ = deck.enqueue("demo.noop")
    [job] = deck.store.claim("w2", clock.now)
    deck.store.complete(job.id, "w2", clock.now)
    clock.advance(120)
    first.maintenance.rollup_once(clock.now)
    second.maintenance.rollup_once(clock.now)  # loses the watermark: the minute is added once
    later = of(scrape(create_app(deck=second).test_client()), "jobdeck_job_runs_total")
    key = (("outcome", "completed"), ("type", "demo.noop"))
    assert later[key] == before[key] + 1
    assert all(later[k] >= v for k, v in before.items())


def test_workers_and_schedules(make_deck, clock):
    schedule = {"name": "nightly", "cron": "* * * * *", "type": "demo.noop"}
    deck = make_deck(clock=clock, schedules=[schedule])
    deck.store.register_worker("pool-all", "h", 1, 4, clock.now)
    deck.store.register_worker("pool-mail", "h", 2, 4, clock.now, queues=["mail"])
    deck.store.register_worker("pool-stopped", "h", 3, 4, clock.now)
    deck.store.stop_worker("pool-stopped", clock.now)
    deck.enqueue("demo.noop", queue="mail")
    client = create_app(deck=deck).test_client()
    m = scrape(client)
    assert value(m, "jobdeck_workers_live") == 2
    assert value(m, "jobdeck_queue_workers_live", queue="mail") == 2
    assert value(m, "jobdeck_queue_workers_live", queue="default") == 1
    assert of(m, "jobdeck_schedule_last_success_timestamp_seconds") == {}

    deck.schedules.enqueue_due_once(clock.now)
    clock.advance(61)
    [fired] = deck.schedules.enqueue_due_once(clock.now)
    [job] = deck.store.claim("pool-all", clock.now, types=["demo.noop"], queues=["default"])
    assert job.id == fired
    clock.advance(1)
    deck.store.complete(job.id, "pool-all", clock.now)
    m = scrape(client)
    assert value(m, "jobdeck_schedule_last_success_timestamp_seconds", schedule="nightly") == clock.now.timestamp()
    clock.advance(deck.config.stall_timeout + 1)  # silent pools are not live, before any sweep
    assert value(scrape(client), "jobdeck_workers_live") == 0


def test_a_scrape_never_scans_the_jobs_table(make_deck, clock, backend):
    """SQLite: no plan step is a bare ``SCAN jobs``. PostgreSQL, with
    sequential scans priced out (``enable_seqscan = off``; a table this small
    would be read whole anyway): an index serves every statement."""
    deck = make_deck(clock=clock)
    fill(deck, clock)
    statements: list[tuple[str, Any]] = []

    @event.listens_for(deck.store.engine, "before_cursor_execute")
    def seen(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    scrape(create_app(deck=deck).test_client())
    event.remove(deck.store.engine, "before_cursor_execute", seen)
    assert statements
    raw = deck.store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        if backend == "postgres":
            cursor.execute("SET enable_seqscan = off")
        for statement, parameters in statements:
            if backend == "postgres":
                cursor.execute(f"EXPLAIN {statement}", parameters)
                plan = [row[0] for row in cursor.fetchall()]
                assert not any("Seq Scan on jobs" in step for step in plan), f"{statement}\n{plan}"
                continue
            plan = [row[3] for row in cursor.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)]
            assert "SCAN jobs" not in [step.strip() for step in plan], f"{statement}\n{plan}"
            if "GROUP BY jobs.status" in statement and "jobs.queue" not in statement:
                assert any("COVERING INDEX ix_jobs_status_id" in step for step in plan), plan  # the snapshot's
    finally:
        raw.close()


def test_guarded_like_the_api(make_deck, clock):
    with_token = make_deck(clock=clock, api_token="s3cret")
    client = create_app(deck=with_token).test_client()
    refused = client.get("/metrics")
    assert refused.status_code == 401 and "bearer token" in refused.get_json()["error"]
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert scrape(client, headers={"Authorization": "Bearer s3cret"})

    open_deck = make_deck(clock=clock)
    client = create_app(deck=open_deck).test_client()
    assert scrape(client)  # the test client comes from 127.0.0.1
    remote = client.get("/metrics", environ_base={"REMOTE_ADDR": "10.0.0.9"})
    assert remote.status_code == 403 and "only clients on this machine" in remote.get_json()["error"]
    rebound = client.get("/metrics", headers={"Host": "evil.example"})
    assert rebound.status_code == 403


def test_with_users_a_viewer_session_may_scrape(deck):
    from tests.test_dashboard_auth import USERS, login

    deck.config.api_token = "s3cret"
    client = make_dash_app(deck, users=USERS).test_client()
    assert scrape(client, headers={"Authorization": "Bearer s3cret"})  # the token, past the dashboard's login
    refused = client.get("/metrics")
    assert refused.status_code == 401 and "sign in" in refused.get_json()["error"]
    assert login(client, "victor", "victor-secret").status_code == 302
    assert value(scrape(client), "jobdeck_workers_live") == 0


def test_revision_0019_fills_the_totals_from_the_minutes_kept(empty_db_url, clock):
    from jobdeck.store import Store, migrate
    from jobdeck.store.engine import make_engine
    from jobdeck.store.metrics import type_totals
    from jobdeck.store.models import stats_minutely
    from sqlalchemy import select

    engine = make_engine(empty_db_url, pool_size=2)
    try:
        migrate.upgrade(engine, "0013")
        store = Store(engine)
        rows = [{"minute": clock.now + timedelta(minutes=i), "type": t, "completed": c, "failed": f, "dead": d,
                 "dur_05": c} for i, (t, c, f, d) in enumerate([("a", 3, 1, 0), ("a", 2, 0, 1), ("b", 7, 0, 0)])]  # fmt: skip
        with store.write() as conn:
            conn.execute(stats_minutely.insert(), rows)
        migrate.upgrade(engine)
        totals = {t.type: (t.completed, t.failed, t.dead, t.durations[5]) for t in type_totals(store)}
        assert totals == {"a": (5, 1, 1, 5), "b": (7, 0, 0, 7)}
        with store.read() as conn:
            assert len(conn.execute(select(stats_minutely)).all()) == 3
    finally:
        engine.dispose()
