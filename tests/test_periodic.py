"""Schedules from config: validation, fire times and misfires with an injected
clock, exactly one job per fire time across three schedulers, pause/run now,
history that outlives the config."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from jobdeck.core.config import ConfigError
from jobdeck.deck import Jobdeck
from jobdeck.maintenance.cron import Periodic, fire_key, parse_schedules
from jobdeck.store.models import jobs, schedule_runs
from sqlalchemy import func, select


def every_minute(**extra):
    return {"name": "tick", "cron": "* * * * *", "type": "demo.noop", "payload": {"n": 1}, **extra}


def nightly(**extra):
    return {"name": "sales-report", "cron": "0 2 * * *", "type": "demo.report", "payload": {"name": "sales"}, **extra}


def periodic(deck, *entries) -> Periodic:
    targets = deck.schedules.targets
    return Periodic(deck.store, parse_schedules(list(entries), targets), targets, deck.config.poll_interval,
                    health=deck.schedule_health.view)  # fmt: skip


def job_count(deck) -> int:
    with deck.store.read() as conn:
        return conn.execute(select(func.count()).select_from(jobs)).scalar_one()


@pytest.mark.parametrize(
    "entry, message",
    [
        (nightly(cron="0 25 * * *"), "schedule 'sales-report': invalid cron expression '0 25 * * *'"),
        (nightly(cron="0 2 * *"), "schedule 'sales-report': invalid cron expression"),
        (nightly(timezone="Mars/Olympus"), "schedule 'sales-report': unknown timezone 'Mars/Olympus'"),
        (nightly(type="reports.sales"), "schedule 'sales-report': unknown job type 'reports.sales'"),
        (nightly(misfire="later"), "schedule 'sales-report': misfire: must be one of"),
        (nightly(payload=[1]), "schedule 'sales-report': payload: must be a JSON object"),
    ],
)
def test_a_bad_schedule_stops_startup_naming_it(make_config, registry, entry, message):
    with pytest.raises(ConfigError) as err:  # the deck checks its schedules when it is built
        Jobdeck(make_config(schedules=[entry]), registry)
    assert message in str(err.value)


def test_fires_each_minute_once_with_the_fire_time_key(deck, clock):
    p = periodic(deck, every_minute())
    clock.now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    assert p.enqueue_due_once(clock.now) == []  # first sight: starts from now
    clock.now = datetime(2026, 1, 1, 12, 1, 2, tzinfo=UTC)
    [job_id] = p.enqueue_due_once(clock.now)
    job = deck.store.get(job_id)
    assert job.idempotency_key == "schedule:tick:2026-01-01T12:01:00+00:00"
    assert (job.type, job.payload) == ("demo.noop", {"n": 1})
    assert p.enqueue_due_once(clock.now + timedelta(seconds=5)) == []
    assert job_count(deck) == 1


def test_misfire_run_once_runs_the_latest_missed_fire_within_grace(deck, clock):
    p = periodic(deck, nightly(misfire="run_once", misfire_grace=4 * 3600))
    p.enqueue_due_once(datetime(2026, 1, 1, 1, 59, tzinfo=UTC))
    # Down from 01:59 to 05:00: 02:00 was missed, 3 h ago, inside the grace.
    [job_id] = p.enqueue_due_once(datetime(2026, 1, 1, 5, 0, tzinfo=UTC))
    assert deck.store.get(job_id).idempotency_key == fire_key("sales-report", datetime(2026, 1, 1, 2, tzinfo=UTC))


def test_misfire_outside_grace_or_skip_runs_nothing(deck):
    p = periodic(deck, nightly(misfire="run_once", misfire_grace=3600), nightly(name="skipper", misfire="skip"))
    p.enqueue_due_once(datetime(2026, 1, 1, 1, 59, tzinfo=UTC))
    assert p.enqueue_due_once(datetime(2026, 1, 1, 5, 0, tzinfo=UTC)) == []
    assert p.enqueue_due_once(datetime(2026, 1, 2, 2, 0, 3, tzinfo=UTC)) != []  # on time again: both fire
    assert job_count(deck) == 2


def test_many_missed_minutes_collapse_into_one_run(deck):
    p = periodic(deck, every_minute(misfire="run_once"))
    p.enqueue_due_once(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC))
    ids = p.enqueue_due_once(datetime(2026, 1, 1, 12, 20, 30, tzinfo=UTC))
    assert len(ids) == 1
    assert deck.store.get(ids[0]).idempotency_key.endswith("12:20:00+00:00")


def test_timezone_seconds_field_and_crontab_weekdays(deck):
    paris, secs, monday = parse_schedules(
        [nightly(name="paris", timezone="Europe/Paris"),
         every_minute(name="secs", cron="*/20 * * * * *"),
         every_minute(name="monday", cron="0 9 * * 1")],
        deck.schedules.targets,
    )  # fmt: skip
    start = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)  # a Thursday, winter time in Paris
    assert paris.next_fire(start) == datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
    assert secs.fire_times(start, start + timedelta(minutes=1)) == [start + timedelta(seconds=s) for s in (20, 40, 60)]
    assert monday.next_fire(start) == datetime(2026, 1, 5, 9, 0, tzinfo=UTC)  # crontab 1 = Monday
    assert paris.describe() == "every day at 02:00 Europe/Paris"
    assert secs.describe() == "every 20 seconds (UTC)"


def test_three_schedulers_on_one_database_make_one_job_per_fire_time(make_config, registry):
    config = make_config(schedules=[every_minute(), every_minute(name="tock", cron="*/2 * * * *")])
    decks = [Jobdeck(config, registry) for _ in range(3)]
    decks[0].init_db()
    schedulers = [d.schedules for d in decks]
    start = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    schedulers[0].enqueue_due_once(start)
    for minute in range(1, 7):
        now = start + timedelta(minutes=minute)
        barrier = threading.Barrier(3)
        errors: list[Exception] = []

        def run(p: Periodic, now: datetime = now, barrier: threading.Barrier = barrier, errors: list = errors) -> None:
            try:
                barrier.wait()
                p.enqueue_due_once(now)
            except Exception as exc:  # noqa: BLE001 -- surfaced by the assert below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(p,)) for p in schedulers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
    with decks[0].store.read() as conn:
        keys = sorted(conn.execute(select(jobs.c.idempotency_key)).scalars())
        runs = conn.execute(select(func.count()).select_from(schedule_runs)).scalar_one()
    expected = sorted(
        [fire_key("tick", datetime(2026, 1, 1, 12, m, tzinfo=UTC)) for m in range(1, 7)]
        + [fire_key("tock", datetime(2026, 1, 1, 12, m, tzinfo=UTC)) for m in (2, 4, 6)]
    )
    assert keys == expected
    assert runs == len(expected)
    for d in decks:
        d.store.engine.dispose()


def test_pause_resume_run_now_and_history_after_removal(deck, clock):
    p = periodic(deck, every_minute(), nightly())
    p.enqueue_due_once(clock.now)
    p.set_paused("tick", True, clock.now, "alice")
    assert p.enqueue_due_once(clock.advance(120)) == []
    job = p.run_now("tick", clock.now, "alice")
    assert job.status.value == "pending" and job.idempotency_key.startswith("schedule:tick:manual:")
    p.set_paused("tick", False, clock.now, "alice")
    assert len(p.enqueue_due_once(clock.advance(60))) == 1  # resumes without replaying the paused minutes
    overview = {s["name"]: s for s in p.overview(clock.now)}
    assert overview["tick"]["paused"] is False and len(overview["tick"]["runs"]) == 2
    assert overview["tick"]["runs"][1]["manual"] is True
    assert overview["sales-report"]["next_run"] == datetime(2026, 1, 2, 2, 0, tzinfo=UTC)

    later = periodic(deck, nightly())  # "tick" removed from the config
    assert later.enqueue_due_once(clock.advance(600)) == []
    removed = {s["name"]: s for s in later.overview(clock.now)}["tick"]
    assert removed["configured"] is False and len(removed["runs"]) == 2
