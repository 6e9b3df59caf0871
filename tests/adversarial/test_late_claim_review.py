"""Review of the limited claim that stamps the time after its wait for the claim lock (ff47531).

``flow.after_waiting`` measures the wait from when ``claim_flow`` / ``claim_due``
began (``entered``). A wait that happens before that point is not measured.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from datetime import timedelta
from typing import Any

from jobdeck.jobs.flow import START_SLACK
from jobdeck.store.models import jobs
from sqlalchemy import select

from tests.conftest import Clock, wait_for


def _in_thread(target: Any) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    answers: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            answers.append(target())
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="late-claim")
    thread.start()
    return thread, answers, errors


def _write_locked(deck: Any) -> sqlite3.Connection:
    """Another process's writer: the SQLite file's write lock, held until commit."""
    other = sqlite3.connect(deck.store.engine.url.database, isolation_level=None, timeout=30)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_sqlite_acker_refill_that_waited_for_the_write_lock_logs_rate_starts_when_they_happened(make_deck: Any) -> None:
    """The pool's acker refills with ``complete_and_claim``: on SQLite its own
    ``write()`` takes the file's write lock (BEGIN IMMEDIATE) *before* the
    flow claim begins, so ``claim_flow``'s ``entered`` is taken after the
    wait and ``after_waiting`` sees none: the starts are logged at the time
    read before the wait, and a claim a window after that read (less than a
    period after the jobs started) takes a second full batch."""
    rate, period, waited = 4, 3.0, 2.0
    deck = make_deck(types={"demo.noop": {"rate": f"{rate}/{period:g}s"}})
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(3 * rate)])

    with closing(_write_locked(deck)) as other:
        read = deck.clock()  # the acker read its time, then waits for the file's write lock
        thread, answers, errors = _in_thread(lambda: deck.store.complete_and_claim([], "host-a", read, limit=3 * rate))
        wait_for(lambda: deck.clock() > read + timedelta(seconds=waited), timeout=30, message="the refill waited")
        released = deck.clock()  # the refill's jobs start after this
        other.execute("COMMIT")
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    [(_, first)] = answers
    assert len(first) == rate

    window = timedelta(seconds=period + START_SLACK + 0.05)
    wait_for(lambda: deck.clock() > read + window, timeout=30, message="a window from the read")
    second = deck.store.claim("host-b", deck.clock(), limit=3 * rate)
    after = deck.clock()
    assert after < released + timedelta(seconds=period), "the test was too slow to tell"
    print(f"claimed {len(first)} (claimed_at {first[0].claimed_at}), then {len(second)} "
          f"{(after - released).total_seconds():.2f} s after the first batch started")  # fmt: skip
    assert second == [], "a second batch within one window of the first's starts"


def test_fixed_clock_rate_limited_claim_logs_its_start_at_the_injected_time(make_deck: Any) -> None:
    """An injected clock: the claim reads T, waits (another writer holds
    SQLite's lock longer than WAITED, real time), and logs its start at T
    plus the real wait. In the injected time line the next window opens at
    T + period + slack, yet a claim there finds the start still in it."""
    clock = Clock()
    t = clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"rate": "1/1s"}})
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(2)])

    with closing(_write_locked(deck)) as other:
        thread, answers, errors = _in_thread(lambda: deck.store.claim("host-a", t, limit=2))
        began = time.monotonic()
        wait_for(lambda: time.monotonic() > began + 0.6, timeout=30, message="longer than WAITED, real time")
        other.execute("COMMIT")
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    [[first]] = answers
    with deck.store.read() as conn:
        claimed_at = conn.execute(select(jobs.c.claimed_at).where(jobs.c.id == first.id)).scalar_one()
    print(f"injected clock {t.isoformat()}, claimed_at {claimed_at.isoformat()}")

    clock.advance(1 + START_SLACK + 0.01)  # one window of the injected clock later
    second = deck.store.claim("host-a", clock(), limit=2)
    assert len(second) == 1, "a window after the first start (injected time), the rate refused"
    assert claimed_at == t, "the claim stamped the injected time plus real elapsed time"


def test_fixed_clock_concurrency_limited_claim_takes_a_job_not_due_on_the_injected_clock(make_deck: Any) -> None:
    """``controls.claim_due``: ``waited`` replaces the claim's ``now``, and
    ``picked`` / ``tried`` read the due jobs with it (the commit says the
    reads keep the earlier time). With an injected clock at T, a job due at
    T + 0.3 s is claimed at T because the claim waited 0.6 s of real time."""
    clock = Clock()
    t = clock()
    deck = make_deck(clock=clock, types={"demo.noop": {"concurrency": 2}})
    later = deck.enqueue("demo.noop", {}, delay_seconds=0.3).job.id

    with closing(_write_locked(deck)) as other:
        thread, answers, errors = _in_thread(lambda: deck.store.claim("host-a", t, limit=1))
        began = time.monotonic()
        wait_for(lambda: time.monotonic() > began + 0.6, timeout=30, message="longer than WAITED, real time")
        other.execute("COMMIT")
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    [claimed] = answers
    print(f"injected clock {t.isoformat()}, job {later} due at +0.3 s; claimed {[j.id for j in claimed]}")
    assert claimed == [], "a job not yet due on the claim's clock was claimed"
