"""Per-type health from the per-minute counters: the run-time buckets'
math, the roll-up filling them from the attempts it reads (both
databases), and the Queues page and ``GET /api/stats/types`` reading them
back without touching attempts."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from jobdeck.maintenance.upkeep import Maintenance
from jobdeck.store import Outcome
from jobdeck.store import durations as d
from jobdeck.store.models import attempts, jobs, stats_minutely
from jobdeck.store.upkeep import type_health

# -- the bucket math ------------------------------------------------------------------


def test_buckets_are_two_per_doubling_from_one_millisecond() -> None:
    assert len(d.EDGES) == d.BUCKETS - 1 and len(d.COLUMNS) == d.BUCKETS
    assert d.EDGES[0] == 0.001 and math.isclose(d.EDGES[2], 0.002)
    assert all(math.isclose(b / a, math.sqrt(2)) for a, b in zip(d.EDGES, d.EDGES[1:], strict=False))
    assert d.bucket_of(0) == 0 and d.bucket_of(-1.0) == 0 and d.bucket_of(0.000999) == 0
    assert d.bucket_of(0.001) == 1 and d.bucket_of(0.0014) == 1 and d.bucket_of(0.00142) == 2
    assert d.bucket_of(d.EDGES[-1]) == d.BUCKETS - 1 and d.bucket_of(1e9) == d.BUCKETS - 1


def test_a_percentile_is_the_bucket_of_its_nearest_rank() -> None:
    counts = [0] * d.BUCKETS
    counts[3], counts[10], counts[20] = 50, 45, 5  # 100 runs
    assert d.percentile_bucket(counts, 0.50) == 3  # the 50th run
    assert d.percentile_bucket(counts, 0.51) == 10
    assert d.percentile_bucket(counts, 0.95) == 10  # the 95th run
    assert d.percentile_bucket(counts, 0.96) == 20
    assert d.percentile_bucket(counts, 1.0) == 20
    assert d.percentile_bucket([0] * d.BUCKETS, 0.5) is None and d.percentile([0] * d.BUCKETS, 0.5) is None
    one = [0] * d.BUCKETS
    one[7] = 1
    assert d.percentile_bucket(one, 0.01) == d.percentile_bucket(one, 0.99) == 7


@pytest.mark.parametrize("seconds", [0.0013, 0.0042, 0.027, 0.15, 0.9, 3.3, 47.0, 610.0, 5000.0])
def test_the_reported_percentile_is_within_19_percent_of_the_run(seconds: float) -> None:
    counts = [0] * d.BUCKETS
    counts[d.bucket_of(seconds)] = 1
    reported = d.percentile(counts, 0.5)
    assert reported is not None and 2**-0.25 <= reported / seconds <= 2**0.25


def test_the_open_ended_buckets_are_shown_as_bounds() -> None:
    counts = [0] * d.BUCKETS
    counts[0] = 1
    assert d.shown(counts, 0.5) == "< 1 ms" and d.percentile(counts, 0.5) == 0.0005
    counts = [0] * d.BUCKETS
    counts[-1] = 1
    assert d.shown(counts, 0.5) == "> 2.3 h" and d.percentile(counts, 0.5) == d.EDGES[-1]
    counts[-1], counts[d.bucket_of(0.25)] = 0, 1
    assert d.shown(counts, 0.5) == "≈ 215 ms"
    assert d.shown([0] * d.BUCKETS, 0.5) == "—"


# -- the roll-up fills the buckets (both databases) ----------------------------------------

RUNS = [0.0004, 0.0031, 0.021, 0.25, 0.25, 0.25, 1.9, 14.0, 130.0, 9000.0]
"""Run times, each well inside its bucket (SQLite's julianday is exact to the millisecond)."""


def _run(deck, clock, seconds: float, ok: bool = True) -> None:
    job, _ = deck.enqueue("demo.noop" if ok else "demo.fail", max_retries=0)
    start = clock.now
    [claimed] = deck.store.claim("w1", start, limit=1, types=[job.type])
    end = start + timedelta(seconds=seconds)
    outcome = Outcome(job.id, "w1", attempt=claimed.attempt, started_at=start, error=None if ok else "boom")
    if ok:
        deck.store.complete_many([outcome], end)
    else:
        deck.store.fail_many([outcome], end)


@pytest.mark.backends
def test_the_roll_up_counts_run_times_per_minute_and_type(deck, clock) -> None:
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    m.rollup_once(clock.now)  # the watermark, an hour back
    start = clock.now
    for seconds in RUNS:
        _run(deck, clock, seconds)
    _run(deck, clock, 0.06, ok=False)
    stalled, _ = deck.enqueue("demo.fail", max_retries=0)
    deck.store.claim("w1", start, limit=1, types=["demo.fail"])
    deck.store.rescue_stalled(start + timedelta(seconds=120), stall_timeout=60)  # counted failed, not timed
    clock.now = start + timedelta(hours=4)
    assert m.rollup_once(clock.now) > 0

    noop = [0] * d.BUCKETS
    for seconds in RUNS:
        noop[d.bucket_of(seconds)] += 1
    [health_fail, health_noop] = type_health(deck.store, clock.now, timedelta(hours=24))
    assert (health_noop.type, health_noop.completed, health_noop.failed, health_noop.dead) == ("demo.noop", 10, 0, 0)
    assert list(health_noop.durations) == noop
    assert health_noop.shown(0.5) == "≈ 215 ms" and health_noop.p95 == d.EDGES[-1]  # the 10th of 10 runs
    assert (health_fail.completed, health_fail.failed, health_fail.dead) == (0, 2, 2)
    assert health_fail.failure_rate == 1.0 and sum(health_fail.durations) == 1  # the stalled one has no run time
    assert health_fail.durations[d.bucket_of(0.06)] == 1
    assert type_health(deck.store, clock.now, timedelta(hours=1)) == []  # all before the last hour


@pytest.mark.backends
def test_health_is_read_from_the_counters_not_from_attempts(deck, clock) -> None:
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    m.rollup_once(clock.now)
    for seconds in (0.2, 0.2, 3.0):
        _run(deck, clock, seconds)
    clock.advance(180)
    m.rollup_once(clock.now)
    with deck.store.write() as conn:  # retention deleted the jobs and their attempts
        conn.execute(attempts.delete())
        conn.execute(jobs.delete())
    [h] = type_health(deck.store, clock.now, timedelta(hours=1))
    assert (h.completed, h.failure_rate, h.shown(0.5), h.shown(0.95)) == (3, 0.0, "≈ 215 ms", "≈ 3.44 s")


def test_rows_rolled_up_before_durations_count_without_percentiles(deck, clock) -> None:
    with deck.store.write() as conn:
        conn.execute(stats_minutely.insert().values(minute=clock.now - timedelta(minutes=5), type="demo.noop",
                                                    completed=4, failed=1, dead=0))  # fmt: skip
    [h] = type_health(deck.store, clock.now, timedelta(hours=1))
    assert (h.completed, h.failed, h.failure_rate, h.p50, h.shown(0.95)) == (4, 1, 0.2, None, "—")


# -- the Queues page and the API ------------------------------------------------------


def _seed(deck, clock) -> None:
    """Ten minutes of counters as the roll-up writes them: 90 fast runs and 10 slow ones."""
    fast, slow = d.bucket_of(0.05), d.bucket_of(2.0)
    rows = []
    for i in range(10):
        row = {"minute": clock.now.replace(second=0) - timedelta(minutes=i + 1), "type": "demo.send-email",
               "completed": 9, "failed": 1, "dead": 1 if i == 0 else 0}  # fmt: skip
        row.update({c: 0 for c in d.COLUMNS})
        row[d.COLUMNS[fast]], row[d.COLUMNS[slow]] = 9, 1
        rows.append(row)
    rows[0]["minute"] = clock.now - timedelta(hours=5)  # in the day, not the hour
    with deck.store.write() as conn:
        conn.execute(stats_minutely.insert(), rows)


def test_the_queues_page_shows_each_types_health_for_the_hour_and_the_day(dash, deck, clock) -> None:
    _seed(deck, clock)
    html = dash.get("/queues").get_data(as_text=True)
    assert 'id="type-health"' in html and "Last 1 h" in html and "Last 24 h" in html
    hour, day = html.split('data-window="1 h"')[1].split('data-window="24 h"')
    assert '<td class="num secondary" data-label="Completed">81</td>' in hour
    assert '<td class="num pct" data-label="Failure rate">10.0%</td>' in hour
    assert '<td class="num p50" data-label="p50">≈ 53.8 ms</td>' in hour
    assert '<td class="num p95" data-label="p95">≈ 1.72 s</td>' in hour
    assert '<td class="num secondary" data-label="Completed">90</td>' in day
    assert '<td class="num secondary" data-label="Dead">1</td>' in day
    fragment = dash.get("/fragments/queues", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.count('id="type-health"') == 1 and fragment.rstrip().endswith("</div>")


def test_the_queues_page_says_when_nothing_finished(dash) -> None:
    html = dash.get("/queues").get_data(as_text=True)
    assert "No job finished in the last 1 h" in html and "No job finished in the last 24 h" in html


def test_the_api_gives_the_same_numbers(client, deck, clock) -> None:
    _seed(deck, clock)
    body = client.get("/api/stats/types").get_json()
    hour, day = body["windows"]
    assert (hour["window"], hour["seconds"], day["window"], day["seconds"]) == ("1 h", 3600, "24 h", 86400)
    [t] = hour["types"]
    assert (t["type"], t["completed"], t["failed"], t["dead"], t["failure_rate"]) == ("demo.send-email", 81, 9, 0, 0.1)
    assert math.isclose(t["p50_seconds"], d.middle(d.bucket_of(0.05)))
    assert math.isclose(t["p95_seconds"], d.middle(d.bucket_of(2.0)))
    assert day["types"][0]["completed"] == 90 and day["types"][0]["dead"] == 1
