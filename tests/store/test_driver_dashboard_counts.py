"""Two dashboard reads on both databases: the tab badges of a filtered list
(``reads.badge_counts``, below its window) count, per state, exactly the rows
each tab lists under the same filter; and the overview's dead-letter card
(``reads.last_dead``) reads the jobs in the order they died, not by id."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from jobdeck.core.fingerprint import fingerprint
from jobdeck.core.states import State
from jobdeck.store import JobFilter, JobRecord, NewJob
from jobdeck.store.reads import badge_counts, last_dead
from jobdeck.web.dashboard.tabs import TABS

from tests.store.driver import BUILDERS, DAY, Driver

pytestmark = pytest.mark.backends

_serial = itertools.count(1)
REPORT, NOOP = "demo.report", "demo.noop"


def _job(drv: Driver, state: State, job_type: str, *, later: bool = False, note: str = "") -> JobRecord:
    """A job of ``job_type`` in ``state`` (``later``: pending, due tomorrow),
    in a queue of its own so the claim that builds the state picks it."""
    new = NewJob(
        job_type, {"note": note}, queue=f"counts{next(_serial)}", available_at=drv.now + DAY if later else None
    )
    job, _ = drv.store.enqueue(new, drv.now)
    if state is not State.PENDING:
        worker = f"w{job.id}"
        drv.claim_one(job, worker)
        BUILDERS[state](drv, job.id, worker)
    return drv.store.get(job.id)


def _mix(drv: Driver) -> dict[str, JobRecord]:
    """One report in every state, two scheduled; and noops that outnumber
    them in completed and dead (the tester's "Dead letter 5" over nothing)."""
    made = {state.value: _job(drv, state, REPORT, note="needle") for state in State}
    made["scheduled"] = _job(drv, State.PENDING, REPORT, later=True)
    _job(drv, State.PENDING, REPORT, later=True)
    for state in (State.COMPLETED, State.COMPLETED, State.COMPLETED, State.DEAD, State.DEAD, State.PENDING):
        _job(drv, state, NOOP)
    return made


def _counts(drv: Driver, f: JobFilter, now: datetime) -> dict[str, int]:
    """The badges under ``f``; with fewer jobs than the window, all exact."""
    badges = badge_counts(drv.store, f, now)
    assert all(b.exact for b in badges.values()), badges
    return {slug: b.n for slug, b in badges.items()}


def _listed(drv: Driver, f: JobFilter) -> dict[str, int]:
    """What each tab's list shows under ``f``."""
    return {
        t.slug: len(drv.store.list_jobs(replace(f, status=t.state, scheduled=t.scheduled, limit=1000), drv.now))
        for t in TABS
    }


def test_the_counts_of_a_type_are_that_types_jobs_per_state(drv: Driver) -> None:
    _mix(drv)
    reports = _counts(drv, JobFilter(type=REPORT), drv.now)
    assert reports == {s.value: 1 for s in State} | {"scheduled": 2}
    noops = _counts(drv, JobFilter(type=NOOP), drv.now)
    assert noops == {s.value: 0 for s in State} | {"pending": 1, "completed": 3, "dead": 2, "scheduled": 0}


def test_the_filters_state_and_paging_are_ignored_and_no_filter_is_counts(drv: Driver) -> None:
    _mix(drv)
    narrowed = JobFilter(status=State.DEAD, scheduled=True, type=REPORT, before_id=1, after_id=1, limit=1)
    assert _counts(drv, narrowed, drv.now) == _counts(drv, JobFilter(type=REPORT), drv.now)
    assert _counts(drv, JobFilter(), drv.now) == drv.store.counts(drv.now)


def test_each_badge_counts_the_rows_its_tab_lists_under_every_filter(drv: Driver) -> None:
    made = _mix(drv)
    fatal = fingerprint("fatal")
    filters = [
        JobFilter(type=REPORT),
        JobFilter(queue=made["running"].queue),
        JobFilter(search="needle"),
        JobFilter(search=f"#{made['failed'].id}"),
        JobFilter(type=NOOP, error_fingerprint=fatal),
        JobFilter(type=REPORT, queue="nowhere"),
    ]
    for f in filters:
        counts = _counts(drv, f, drv.now)
        assert {slug: counts[slug] for slug in _listed(drv, f)} == _listed(drv, f), f
    assert _counts(drv, JobFilter(type=NOOP, error_fingerprint=fatal), drv.now)["dead"] == 2
    assert sum(_counts(drv, filters[-1], drv.now).values()) == 0


def test_the_scheduled_count_moves_to_pending_when_its_time_comes(drv: Driver) -> None:
    made = _mix(drv)
    later = made["scheduled"].available_at + timedelta(seconds=1)
    counts = _counts(drv, JobFilter(type=REPORT), later)
    assert (counts["pending"], counts["scheduled"]) == (3, 0)


def test_the_last_dead_come_in_the_order_they_died(drv: Driver) -> None:
    old = drv.claim_one(drv.enqueue(), "w-old")
    newer_ids = [drv.in_state(State.DEAD).id for _ in range(2)]
    drv.clock.advance(60)
    drv.store.fail(old.id, "w-old", "fatal", drv.now, retryable=False)
    assert [j.id for j in last_dead(drv.store, 10)] == [old.id, *sorted(newer_ids, reverse=True)]
    assert [j.id for j in last_dead(drv.store, 1)] == [old.id]
    drv.in_state(State.COMPLETED)
    assert all(j.status is State.DEAD for j in last_dead(drv.store, 10))


def test_the_last_dead_are_read_in_order_from_their_index(make_deck, backend) -> None:
    """The overview asks on every poll: the order comes from the partial
    index of dead jobs, never from a sort of the whole dead letter."""
    from jobdeck.store.reads import last_dead_statement
    from sqlalchemy import text

    deck = make_deck()
    with deck.store.read() as conn:
        sql = str(last_dead_statement(50).compile(conn, compile_kwargs={"literal_binds": True}))
        if backend == "sqlite":
            plan = " | ".join(row[-1] for row in conn.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
            assert "ix_jobs_dead_finished" in plan and "TEMP B-TREE" not in plan, plan
        else:
            conn.execute(text("SET LOCAL enable_seqscan = off"))  # an empty table: make the planner show its choice
            plan = " | ".join(r[0] for r in conn.execute(text(f"EXPLAIN {sql}")))
            assert "ix_jobs_dead_finished" in plan and "Sort" not in plan, plan
