"""The SQLite hot path (driver-level claim, batched completions, bulk
inserts) and the group commit keep every guarantee of the Core versions."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from datetime import timedelta as td
from datetime import timezone

import pytest
from jobdeck.core.states import State
from jobdeck.store import NewJob, Outcome, Store
from jobdeck.store import enqueue as enqueue_module
from jobdeck.store.engine import make_engine
from jobdeck.store.sqlite import db_time
from sqlalchemy.exc import IntegrityError

from tests.conftest import wait_for


def _db_path(deck) -> str:  # type: ignore[no-untyped-def]
    return str(deck.store.engine.url.database)


def test_fifty_concurrent_enqueues_are_each_committed_and_their_own(deck) -> None:  # type: ignore[no-untyped-def]
    results: dict[int, object] = {}
    seen_committed: dict[int, bool] = {}
    start = threading.Barrier(50)

    def produce(i: int) -> None:
        start.wait()
        job, created = deck.enqueue("demo.noop", {"i": i})
        assert created
        results[i] = job
        # Durable on return: a separate connection sees the row at once.
        with closing(sqlite3.connect(_db_path(deck))) as other:
            seen_committed[i] = other.execute("SELECT payload FROM jobs WHERE id = ?", (job.id,)).fetchone() == (
                f'{{"i":{i}}}',
            )

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(50))
    assert all(seen_committed.values()) and len(seen_committed) == 50
    assert all(job.payload == {"i": i} and job.status is State.PENDING for i, job in results.items())  # type: ignore[attr-defined]
    assert len({job.id for job in results.values()}) == 50  # type: ignore[attr-defined]
    assert deck.store.counts(deck.clock())["pending"] == 50
    assert deck.store._enqueuer.batches <= 50


def test_a_bad_job_in_a_group_fails_only_its_own_caller(deck, clock) -> None:  # type: ignore[no-untyped-def]
    errors: dict[int, BaseException] = {}
    ids: dict[int, int] = {}
    start = threading.Barrier(20)

    def produce(i: int) -> None:
        start.wait()
        try:
            # max_retries -1 violates the CHECK constraint: that insert fails.
            job, _ = deck.store.enqueue(NewJob("demo.noop", {"i": i}, max_retries=-1 if i == 7 else 3), clock())
            ids[i] = job.id
        except IntegrityError as exc:
            errors[i] = exc

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(errors) == [7]
    assert sorted(ids) == [i for i in range(20) if i != 7]
    assert deck.store.counts(clock())["pending"] == 19


@pytest.mark.parametrize("rows_per_statement", [1000, 2], ids=["one-statement", "chunked"])
def test_a_group_commit_batch_is_all_or_nothing(deck, clock, monkeypatch, rows_per_statement) -> None:  # type: ignore[no-untyped-def]
    """The batch the group commit writes is one multi-row INSERT in
    autocommit, or, past one statement's rows (forced here with 2), its
    statements in one transaction: either way a bad row inserts none of the
    batch, so the one-by-one retry that follows inserts no job twice."""
    from jobdeck.store.sqlite import as_stored

    monkeypatch.setattr(enqueue_module, "_ROWS_PER_STATEMENT", rows_per_statement)
    store, now = deck.store, clock()

    def rows(*max_retries: int) -> list[tuple[object, ...]]:
        news = [NewJob("demo.noop", {"n": n}, max_retries=m) for n, m in enumerate(max_retries)]
        return [tuple(as_stored(v, now, db_time(now)) for v in store._row(new, now, now, False)) for new in news]

    ids = store._insert_batch_sqlite(rows(1, 2, 3, 4, 5))
    assert ids == list(range(ids[0], ids[0] + 5))
    assert [store.get(i).max_retries for i in ids] == [1, 2, 3, 4, 5]
    with pytest.raises(IntegrityError):
        store._insert_batch_sqlite(rows(1, 2, 3, 4, -1))  # the last row breaks the CHECK constraint
    assert deck.store.counts(now)["pending"] == 5


def test_an_interrupt_after_the_batch_was_written_stores_no_job_twice() -> None:
    """The leader's KeyboardInterrupt arrives when the call into the database
    returns, so its batch may be committed: the committer must not retry it
    row by row (every job stored twice). The leader gets its interrupt, the
    others ``InterruptedCommit``; a later batch commits as usual."""
    from jobdeck.store.group_commit import GroupCommitter, InterruptedCommit

    stored: list[str] = []
    interrupt = threading.Event()
    entered, release = threading.Event(), threading.Event()

    def write_batch(items: list[str]) -> list[int]:
        if items == ["hold"]:
            entered.set()
            release.wait(10)
        stored.extend(items)
        if interrupt.is_set() and items != ["hold"]:
            interrupt.clear()
            raise KeyboardInterrupt  # after the rows were written, as a signal handler would
        return list(range(len(items)))

    committer: GroupCommitter[int] = GroupCommitter(threading.Lock(), write_batch)
    outcomes: dict[str, object] = {}

    def submit(item: str) -> None:
        try:
            outcomes[item] = committer.submit(item)
        except BaseException as exc:  # noqa: BLE001 - the interrupt is what is tested
            outcomes[item] = exc

    holder = threading.Thread(target=submit, args=("hold",))
    holder.start()
    assert entered.wait(10)
    waiting = [threading.Thread(target=submit, args=(f"j{i}",)) for i in range(5)]
    for t in waiting:
        t.start()
    wait_for(lambda: len(committer._queue) == 5, timeout=10, message="five requests queued behind the holder")
    interrupt.set()
    release.set()
    for t in [holder, *waiting]:
        t.join(10)
    assert sorted(stored) == ["hold", "j0", "j1", "j2", "j3", "j4"], "a batch was retried after it was written"
    errors = [outcomes[f"j{i}"] for i in range(5)]
    assert sum(isinstance(e, KeyboardInterrupt) for e in errors) == 1  # the next batch's leader
    assert sum(isinstance(e, InterruptedCommit) for e in errors) == 4
    assert committer.submit("after") == 0 and stored[-1] == "after"


def test_enqueue_many_returns_the_ids_of_its_own_rows_under_concurrent_writers(deck, clock) -> None:  # type: ignore[no-untyped-def]
    other = Store(make_engine(str(deck.store.engine.url)))  # a second "process" on the same file
    stop = threading.Event()

    def interfere() -> None:
        while not stop.is_set():
            other.enqueue(NewJob("demo.noop", {"other": True}), clock())

    t = threading.Thread(target=interfere)
    t.start()
    try:
        batches = [
            deck.enqueue_many([{"type": "demo.noop", "payload": {"b": b, "i": i}} for i in range(200)])
            for b in range(5)
        ]
    finally:
        stop.set()
        t.join()
        other.engine.dispose()
    for b, ids in enumerate(batches):
        assert len(set(ids)) == 200
        for i, job_id in enumerate(ids):
            assert deck.store.get(job_id).payload == {"b": b, "i": i}


def test_no_job_is_claimed_twice_by_concurrent_claimers(deck, clock) -> None:  # type: ignore[no-untyped-def]
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(2000)])
    stores = [deck.store, Store(make_engine(str(deck.store.engine.url)))]
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        store = stores[n % 2]
        while True:
            got = store.claim(f"w{n}", clock(), limit=37, types=["demo.noop"])
            if not got:
                return
            with lock:
                claimed.extend(j.id for j in got)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stores[1].engine.dispose()
    assert len(claimed) == 2000 and len(set(claimed)) == 2000


def test_claim_order_filters_and_decoded_fields(deck, clock) -> None:  # type: ignore[no-untyped-def]
    now = clock()
    low, _ = deck.enqueue("demo.noop", {"n": "low"}, priority=0)
    high, _ = deck.enqueue("demo.noop", {"n": "high"}, priority="high")
    other_q, _ = deck.enqueue("demo.noop", queue="other")
    later, _ = deck.enqueue("demo.noop", run_at=(now + td(seconds=30)).astimezone(timezone(td(hours=-5))))
    other_type, _ = deck.enqueue("demo.sleep")
    got = deck.store.claim("w", now, limit=10, types=["demo.noop"], queues=["default"])
    assert [j.id for j in got] == [high.id, low.id]
    job = got[0]
    assert job.status is State.RUNNING and job.attempt == 1 and job.worker_id == "w"
    assert job.payload == {"n": "high"} and job.claimed_at == now and job.available_at.tzinfo is not None
    assert job == deck.store.get(high.id)  # the fast decoder agrees with the Core one
    assert deck.store.claim("w", now + td(seconds=29), limit=10, types=["demo.noop"], queues=["default"]) == []
    assert [j.id for j in deck.store.claim("w", now + td(seconds=30), limit=10, types=["demo.noop"])] == [
        other_q.id, later.id,
    ]  # fmt: skip
    assert deck.store.get(other_type.id).status is State.PENDING


def test_batched_completion_is_fenced_and_records_each_attempt(deck, clock) -> None:  # type: ignore[no-untyped-def]
    deck.enqueue_many([{"type": "demo.noop", "max_retries": 2} for _ in range(3)])
    a, b, c = deck.store.claim("w1", clock(), limit=3)
    # b's attempt 1 fails and is claimed again as attempt 2: a late result of attempt 1 is refused.
    deck.store.fail_many([Outcome(b.id, "w1", attempt=1, error="boom")], clock())
    clock.advance(3600)
    (b2,) = deck.store.claim("w2", clock(), limit=1)
    assert b2.id == b.id and b2.attempt == 2
    accepted = deck.store.complete_many(
        [
            Outcome(a.id, "w1", attempt=1, started_at=clock()),
            Outcome(b.id, "w1", attempt=1, started_at=clock()),  # stale attempt
            Outcome(c.id, "intruder", attempt=1, started_at=clock()),  # not its holder
        ],
        clock(),
    )
    assert accepted == [a.id]
    assert deck.store.complete_many([Outcome(b.id, "w2", attempt=2, started_at=clock())], clock()) == [b.id]
    assert deck.store.get(a.id).status is State.COMPLETED and deck.store.get(c.id).status is State.RUNNING
    assert [(x.attempt, x.outcome) for x in deck.store.attempts_of(b.id)] == [(1, "failed"), (2, "completed")]
    assert [(x.attempt, x.outcome, x.worker_id) for x in deck.store.attempts_of(a.id)] == [(1, "completed", "w1")]
    assert deck.store.attempts_of(a.id)[0].started_at == clock()


@pytest.mark.parametrize("count", [1, 3, 256, 257, 600])
def test_a_completed_batch_writes_every_attempt_row_by_multi_row_inserts(deck, clock, count) -> None:  # type: ignore[no-untyped-def]
    """SQLite writes a batch's attempt rows as a few INSERTs of many rows
    (power-of-two chunks of at most 256): each job gets its own row, with
    its own values, whatever the batch's size."""
    deck.enqueue_many([{"type": "demo.noop", "payload": {"i": i}} for i in range(count)])
    claimed = deck.store.claim("w1", clock(), limit=count)
    started = {j.id: clock() - td(milliseconds=j.id) for j in claimed}
    accepted = deck.store.complete_many(
        [Outcome(j.id, "w1", attempt=j.attempt, started_at=started[j.id]) for j in claimed], clock()
    )
    assert sorted(accepted) == sorted(started)
    for job_id, at in started.items():
        (row,) = deck.store.attempts_of(job_id)
        assert (row.attempt, row.outcome, row.worker_id, row.started_at) == (1, "completed", "w1", at)


def test_a_multi_row_insert_that_fails_writes_none_of_its_rows(deck, clock) -> None:  # type: ignore[no-untyped-def]
    """The chunks run in the batch's transaction: a row the database refuses
    fails the batch (the acker then writes one by one) with nothing written."""
    from jobdeck.store import attempt_statements

    deck.enqueue_many([{"type": "demo.noop"} for _ in range(5)])
    claimed = deck.store.claim("w1", clock(), limit=5)
    t = db_time(clock())
    rows = [(j.id, 1, "w1", t, t, "completed", "thread") for j in claimed]
    rows[3] = (claimed[3].id, 1, "w1", t, t, None, "thread")  # outcome is NOT NULL
    with pytest.raises(IntegrityError), deck.store.write() as conn:
        deck.store._run_many(conn, attempt_statements.attempt(with_error=False), rows)
    assert all(deck.store.attempts_of(j.id) == [] for j in claimed)


def test_the_after_step_runs_outside_the_lock_for_the_committed_requests_before_they_wake() -> None:
    """``GroupCommitter.after``: once per batch, with the lock free (the next
    batch may commit meanwhile), for the requests that committed only, and
    its results are what their callers get."""
    from jobdeck.store.group_commit import GroupCommitter

    lock = threading.Lock()
    entered, release = threading.Event(), threading.Event()
    seen: list[tuple[list[str], bool]] = []

    def write_batch(items: list[str]) -> list[int]:
        if items == ["hold"]:
            entered.set()
            release.wait(10)
        if "bad" in items:
            raise ValueError("bad row")
        return [len(item) for item in items]

    def after(items: list[str], results: list[int]) -> list[int]:
        free = lock.acquire(timeout=5)  # held by this thread (a plain Lock), it never would be
        if free:
            lock.release()
        seen.append((sorted(items), free))
        return [r * 100 for r in results]

    committer: GroupCommitter[int] = GroupCommitter(lock, write_batch, after)
    outcomes: dict[str, object] = {}

    def submit(item: str) -> None:
        try:
            outcomes[item] = committer.submit(item)
        except ValueError as exc:
            outcomes[item] = exc

    holder = threading.Thread(target=submit, args=("hold",))
    holder.start()
    assert entered.wait(10)
    queued = [threading.Thread(target=submit, args=(item,)) for item in ("a", "bb", "bad")]
    for t in queued:
        t.start()
    wait_for(lambda: len(committer._queue) == 3, timeout=10, message="three requests queued behind the holder")
    release.set()
    for t in [holder, *queued]:
        t.join(10)
    assert outcomes["hold"] == 400 and outcomes["a"] == 100 and outcomes["bb"] == 200
    assert isinstance(outcomes["bad"], ValueError), "a failed request is its caller's error, untouched by after"
    # The failed batch was retried row by row; after runs once for what it committed.
    assert seen == [(["hold"], True), (["a", "bb"], True)], "once per batch, for its committed requests, lock free"
