"""Hosts whose clocks disagree, on one PostgreSQL database.

A host 90 s ahead used to rescue jobs that were alive on another host a
second after they were claimed, and run them again at the same time; a
rate limit, a unique period and cron fire times broke the same way. Every
process now runs on the database's clock (``jobdeck.core.clock.DatabaseClock``). The
skew is injected: ``tests/skewed_host.py`` runs the real ``jobdeck worker``
with its host clock moved, and the in-process tests build a deck on a
``DatabaseClock`` over a moved host clock. Each in-process test also runs
the control, a deck on the moved host clock itself (what every host ran on
before), and shows the defect there: the harness can see what it guards.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.clock import DatabaseClock
from jobdeck.deck import Jobdeck
from jobdeck.store.models import attempts, jobs, schedule_runs, workers
from jobdeck.store.timekeeping import database_time
from sqlalchemy import select

from tests import skew_handlers
from tests.conftest import wait_for
from tests.worker_processes import stop

ROOT = Path(__file__).parents[2]
SKEW = 90.0
ON_POSTGRES = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def moved(seconds: float) -> Callable[[], datetime]:
    return lambda: datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.fixture
def skewed(make_deck: Callable[..., Jobdeck]) -> Callable[..., Jobdeck]:
    """A deck on a host whose clock is ``seconds`` off: on the database's
    clock (``control=False``), or on the moved host clock itself."""

    def make(seconds: float, control: bool = False, **config: Any) -> Jobdeck:
        clock: Callable[[], datetime] = moved(seconds) if control else DatabaseClock(moved(seconds))
        return make_deck(clock=clock, **config)

    return make


# -- real processes ----------------------------------------------------------------------------


def _start(config: Path, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(PYTHONPATH=str(ROOT), JOBDECK_CONFIG=str(config))
    with log.open("wb") as fh:
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


@ON_POSTGRES
@pytest.mark.slow
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_worker_whose_clock_is_90_s_off_rescues_no_live_job(db_url, tmp_path, make_deck, registry, skew):
    skew_handlers.register(registry)
    deck = make_deck()
    config = tmp_path / "jobdeck.toml"
    config.write_text(
        f"database_url = {json.dumps(db_url)}\ninstance_path = {json.dumps(str(tmp_path / 'instance'))}\n"
        "workers = 3\npoll_interval = 0.1\nheartbeat_interval = 0.5\nstall_timeout = 3.0\nsweep_interval = 0.5\n"
        'backoff_base = 0.05\nshutdown_grace = 2.0\nhandler_modules = ["tests.skew_handlers"]\n'
    )
    logs = [tmp_path / "normal.log", tmp_path / "skewed.log"]
    procs = [
        _start(config, ["-m", "jobdeck.cli", "worker", "--log-level", "info"], logs[0]),
        _start(config, ["tests/skewed_host.py", str(skew), "worker", "--log-level", "info"], logs[1]),
    ]
    runs = tmp_path / "runs.jsonl"
    try:
        wait_for(lambda: _live_workers(deck) == 2, timeout=60, message="both workers started")
        deck.enqueue_many(
            [{"type": skew_handlers.HOLD, "payload": {"seconds": 4.5, "log": str(runs), "i": i}} for i in range(6)]
        )
        wait_for(
            lambda: sum(r["event"] == "done" for r in skew_handlers.read(runs)) >= 6,
            timeout=90,
            message="six jobs of 4.5 s done",
        )
        offsets = _offsets(deck)
    finally:
        stop(procs)
    text = [log.read_text(errors="replace") for log in logs]
    starts = [r for r in skew_handlers.read(runs) if r["event"] == "start"]
    per_job: dict[int, int] = {}
    for r in starts:
        per_job[r["job"]] = per_job.get(r["job"], 0) + 1
    with deck.store.read() as conn:
        outcomes = [o for (o,) in conn.execute(select(attempts.c.outcome))]
    pids = {r["pid"] for r in starts}
    print(
        f"skew {skew:+g} s: {len(starts)} starts of 6 jobs on {len(pids)} processes; "
        f"attempt outcomes {sorted(outcomes)}; measured offsets {sorted(offsets.values())}"
    )
    assert all(n == 1 for n in per_job.values()) and len(per_job) == 6, f"a job ran twice: {per_job}\n{text[1]}"
    assert outcomes == ["completed"] * 6
    assert len(pids) == 2, "both hosts ran jobs"
    assert not any("rescued job" in t or "marked gone" in t for t in text), text
    assert sorted(offsets.values(), key=abs)[0] == pytest.approx(0, abs=0.5)
    assert sorted(offsets.values(), key=abs)[1] == pytest.approx(-skew, abs=0.5)
    assert "this host's clock is" in text[1] and ("ahead of" if skew > 0 else "behind") in text[1]


def _live_workers(deck: Jobdeck) -> int:
    with deck.store.read() as conn:
        return len(conn.execute(select(workers.c.id).where(workers.c.stopped_at.is_(None))).all())


def _offsets(deck: Jobdeck) -> dict[str, float]:
    with deck.store.read() as conn:
        return {
            r.id: r.clock_offset
            for r in conn.execute(select(workers.c.id, workers.c.clock_offset).where(workers.c.stopped_at.is_(None)))
            if r.clock_offset is not None
        }


# -- limits on one time line -------------------------------------------------------------------


@ON_POSTGRES
@pytest.mark.parametrize("control", [False, True], ids=["database-clock", "control-host-clock"])
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_rate_limit_holds_between_hosts_whose_clocks_disagree(make_deck, skewed, skew, control):
    limits = {"types": {"demo.noop": {"rate": "4/10s"}}}
    normal = make_deck(**limits)
    other = skewed(skew, control=control, **limits)
    first, second = (other, normal) if skew < 0 else (normal, other)
    first.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(12)])
    a = first.store.claim("host-a", first.clock(), limit=12, types=["demo.noop"])
    b = second.store.claim("host-b", second.clock(), limit=12, types=["demo.noop"])
    print(f"skew {skew:+g} s, {'control' if control else 'database clock'}: claimed {len(a)} then {len(b)}")
    assert len(a) == 4
    if control:  # the defect, as it was: the window of one host misses the other's starts
        assert len(b) == 4
    else:
        assert b == []


@ON_POSTGRES
@pytest.mark.parametrize("control", [False, True], ids=["database-clock", "control-host-clock"])
def test_a_unique_period_holds_on_a_host_whose_clock_is_ahead(make_deck, skewed, control):
    normal = make_deck()
    other = skewed(SKEW, control=control)
    once = {"by": ["type", "payload.order"], "period": 60}
    kept = normal.enqueue("demo.noop", {"order": 7}, unique=once)
    again = other.enqueue("demo.noop", {"order": 7}, unique=once)
    assert kept.created
    if control:
        assert again.created, "the control host's clock is past the period: the defect"
    else:
        assert not again.created and again.job.id == kept.job.id


@ON_POSTGRES
@pytest.mark.parametrize("control", [False, True], ids=["database-clock", "control-host-clock"])
def test_cron_fires_on_the_database_clock_not_early(skewed, control):
    deck = skewed(SKEW, control=control, schedules=[
        {"name": "every-second", "cron": "* * * * * *", "type": "demo.noop"},
    ])  # fmt: skip
    deck.schedules.enqueue_due_once(deck.clock())  # starts the schedule's watermark
    wait_for(lambda: deck.schedules.enqueue_due_once(deck.clock()), timeout=10, message="a fire")
    db_now = database_time(deck.store)
    with deck.store.read() as conn:
        fired = [f for (f,) in conn.execute(select(schedule_runs.c.fire_time))]
    created = _created(deck)
    early = max(fired) - db_now
    print(f"{'control' if control else 'database clock'}: latest fire time {early.total_seconds():+.3f} s from now")
    if control:
        assert early > timedelta(seconds=SKEW - 5), "the control fires 90 s early: the defect"
    else:
        assert early <= timedelta(seconds=0.5)
        assert max(created) <= db_now + timedelta(seconds=0.5), "created_at is not in the future"


def _created(deck: Jobdeck) -> list[datetime]:
    with deck.store.read() as conn:
        return [c for (c,) in conn.execute(select(jobs.c.created_at))]


# -- the sweeper's check, the warning, and where the offset shows -------------------------------


@ON_POSTGRES
def test_a_sweeper_whose_clock_drifted_rescues_nothing_until_it_agrees(make_deck, skewed, caplog):
    deck = skewed(0.0, stall_timeout=8.0, heartbeat_interval=1.0)
    clock = deck.clock
    assert isinstance(clock, DatabaseClock) and clock.reading is not None
    live = deck.enqueue("demo.noop").job
    deck.store.register_worker("live-pool", "elsewhere", 1, 1, clock())
    assert [j.id for j in deck.store.claim("live-pool", clock(), limit=1, types=["demo.noop"])] == [live.id]
    # The reading goes 90 s wrong (a process suspended, a monotonic clock that stopped):
    clock.reading = replace(clock.reading, database=clock.reading.database + timedelta(seconds=SKEW))
    ahead = clock()
    with caplog.at_level(logging.WARNING, "jobdeck.maintenance"):
        assert deck.maintenance.sweep_once(ahead) == []
    assert "this sweep rescues nothing" in caplog.text
    assert deck.store.get(live.id).status.value == "running"
    assert clock() < ahead - timedelta(seconds=SKEW - 5), "the fresh reading was taken up"
    assert deck.maintenance.sweep_once(clock()) == [], "the live job is not stalled on the database's clock"
    # What the check prevented: the same cutoff, unchecked, rescues the live job.
    assert [j.id for j in deck.store.rescue_stalled(ahead, 8.0)] == [live.id]


@ON_POSTGRES
def test_the_offset_is_measured_warned_about_and_shown_on_the_workers_page_and_metrics(skewed, caplog):
    with caplog.at_level(logging.WARNING, "jobdeck.clock"):
        deck = skewed(SKEW)
    # The offset is measured over a round trip, so it reads 89.999 as well as 90.001.
    warned = re.search(r"this host's clock is ([0-9.]+) s ahead of the database's", caplog.text)
    assert warned and float(warned[1]) == pytest.approx(SKEW, abs=0.5), caplog.text
    assert deck.clock.offset == pytest.approx(-SKEW, abs=0.5)  # type: ignore[attr-defined]
    assert abs(deck.clock() - database_time(deck.store)) < timedelta(seconds=0.5)
    runtime = deck.start(workers=1, scheduler=False)
    try:
        wait_for(lambda: _offsets(deck), timeout=10, message="the pool's offset recorded")
        from jobdeck import create_app

        from tests.dashboard_support import make_dash_app

        page = make_dash_app(deck).test_client().get("/workers").get_data(as_text=True)
        metrics = create_app(deck=deck).test_client().get("/metrics").get_data(as_text=True)
    finally:
        runtime.stop(1.0)
    assert "Host clock" in page and "clock-skewed" in page and "ahead of the database" in page
    mine = re.search(r"^jobdeck_clock_offset_seconds (\S+)$", metrics, re.M)
    pool = re.search(r"^jobdeck_worker_clock_offset_seconds\{worker=\"[^\"]+\"\} (\S+)$", metrics, re.M)
    assert mine and pool, metrics
    assert float(mine[1]) == pytest.approx(-SKEW, abs=0.5) and float(pool[1]) == pytest.approx(-SKEW, abs=0.5)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_on_sqlite_every_process_shares_the_host_clock(make_deck):
    from jobdeck.core.clock import HostClock

    deck = make_deck()
    assert isinstance(deck.clock, HostClock) and abs(deck.clock() - datetime.now(UTC)) < timedelta(seconds=1)


# -- clocks that step ----------------------------------------------------------------------------


class Movable:
    """A clock that a test steps: ``base`` plus ``shift`` seconds."""

    def __init__(self, base: Callable[[], datetime]) -> None:
        self.base = base
        self.shift = 0.0

    def __call__(self) -> datetime:
        return self.base() + timedelta(seconds=self.shift)


def _live_pool_and_sweeper(make_deck, sweeper_clock, pool_clock, tmp_path):
    """A pool running three long jobs, and a second deck whose sweeper judges them."""
    from jobdeck.runtime import pool_for

    settings = {"stall_timeout": 4.0, "heartbeat_interval": 0.5}
    pool_deck = make_deck(clock=pool_clock, **settings)
    sweeper = make_deck(clock=sweeper_clock, **settings)
    runs = tmp_path / "runs.jsonl"
    ids = pool_deck.enqueue_many([{"type": skew_handlers.HOLD, "payload": {"seconds": 30, "log": str(runs)}}] * 3)
    pool = pool_for(pool_deck, 3)
    pool.start()
    wait_for(lambda: len(skew_handlers.read(runs)) == 3, timeout=20, message="three jobs running")
    return pool, sweeper, ids


def _sweep_for(sweeper: Jobdeck, seconds: float) -> list[int]:
    rescued: list[int] = []
    deadline = datetime.now(UTC) + timedelta(seconds=seconds)
    while datetime.now(UTC) < deadline:
        rescued += sweeper.maintenance.sweep_once(sweeper.clock())
        time.sleep(0.2)  # the sweeper's own interval, shortened
    return rescued


@ON_POSTGRES
@pytest.mark.parametrize("control", [False, True], ids=["hold-off", "control-no-hold-off"])
def test_a_step_of_the_database_clock_rescues_no_live_job(make_deck, registry, tmp_path, control):
    """The database's clock steps 60 s forward. Every process reads it
    through ``database_time``; here that read is moved, the same for both.
    The sweeper notices first and rescues nothing for a stall_timeout; the
    pool follows at its next beat. The control sweeps on a clock that jumps
    with the database but has no hold-off: it rescues the live jobs."""
    skew_handlers.register(registry)
    shift = [0.0]

    def stepping(clock: DatabaseClock) -> DatabaseClock:
        original = clock.read
        assert original is not None
        clock.read = lambda: original() + timedelta(seconds=shift[0])
        return clock

    pool_clock = DatabaseClock()
    sweeper_clock: Any = DatabaseClock()
    pool, sweeper, ids = _live_pool_and_sweeper(make_deck, sweeper_clock, pool_clock, tmp_path)
    stepping(pool_clock), stepping(sweeper_clock)
    if control:
        sweeper.clock = lambda: database_time(sweeper.store) + timedelta(seconds=shift[0])
        sweeper.maintenance.rescue.clock = sweeper.clock  # the sweeper judges on the clock it was given
    try:
        shift[0] = 60.0
        rescued = _sweep_for(sweeper, 2 * 4.0)
    finally:
        pool.stop(1.0)
    print(f"{'control' if control else 'hold-off'}: rescued {len(rescued)} of 3 live jobs after a 60 s step")
    if control:
        assert sorted(rescued) == sorted(ids), "the control rescues the live jobs: the defect"
    else:
        assert rescued == []
        assert pool_clock.reading is not None and pool_clock.stepped_within(10), "the pool followed the step"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("control", [False, True], ids=["hold-off", "control-no-hold-off"])
def test_a_step_of_the_host_clock_rescues_no_live_job_on_sqlite(make_deck, registry, tmp_path, control):
    """One host, one clock: stepped 90 s forward, every heartbeat written before
    the step looks 90 s old. The sweeper sees the step against the boot clock
    and rescues nothing for a stall_timeout, while the pool beats on the new time."""
    from jobdeck.core.clock import HostClock

    skew_handlers.register(registry)
    host = Movable(lambda: datetime.now(UTC))
    pool, sweeper, ids = _live_pool_and_sweeper(make_deck, host if control else HostClock(host), host, tmp_path)
    try:
        sweeper.maintenance.sweep_once(sweeper.clock())  # the sweeper's first look at the clock
        host.shift = SKEW
        rescued = _sweep_for(sweeper, 2 * 4.0)
    finally:
        pool.stop(1.0)
    print(f"{'control' if control else 'hold-off'}: rescued {len(rescued)} of 3 live jobs after a 90 s step")
    if control:
        assert sorted(rescued) == sorted(ids), "the control rescues the live jobs: the defect"
    else:
        assert rescued == []


@ON_POSTGRES
def test_a_producer_that_never_ran_init_db_enqueues_on_the_database_clock(db_url, make_config, registry, make_deck):
    make_deck()  # the schema
    producer = Jobdeck(make_config(), registry, clock=DatabaseClock(moved(3600)))
    try:
        job = producer.enqueue("demo.noop", delay_seconds=30).job
        due_in = (job.available_at - database_time(producer.store)).total_seconds()
    finally:
        producer.store.engine.dispose()
    print(f"a host 1 h ahead, delay_seconds=30: due in {due_in:.1f} s on the database's clock")
    assert 25 < due_in <= 30.5
