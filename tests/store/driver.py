"""The driver suite's shared pieces: a ``Driver`` over one test database
(the store bare, behind the queue policy, and behind the HTTP API), a job
built in any state through the public Store API only, and the paths of each
transition (batched, single, HTTP) as functions answering "applied?".

The suite speaks only the public surface (``jobdeck.store``, ``jobdeck.core.states``,
``jobdeck.core.errors``, the deck and the HTTP API): the store's internals change
under it, and that is what it is for.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobdeck import create_app
from jobdeck.core.errors import JobNotFound, NotHeld, TransitionRefused
from jobdeck.core.states import State, Transition
from jobdeck.deck import Jobdeck
from jobdeck.store import AttemptRecord, JobRecord, NewJob, Outcome, Store
from jobdeck.store.lifecycle import JobChanges
from jobdeck.store.models import job_dependencies, jobs
from sqlalchemy import event, insert, update

DAY = timedelta(days=1)
STALL = 60.0
"""The stall timeout the suite's sweeps use."""

REFUSALS = (TransitionRefused, NotHeld, JobNotFound)
"""What a single (HTTP worker's or operator's) call raises when it is refused."""

_serial = itertools.count(1)


@dataclass
class Driver:
    """One test database seen three ways: ``store`` has no claim policy,
    ``policy`` has the queue controls installed (pause), ``limited`` also has
    a concurrency limit (``[queues.limited] concurrency``), and ``client``
    is the HTTP API on ``policy``'s deck."""

    deck: Jobdeck
    clock: Any
    make_deck: Callable[..., Jobdeck]
    _policy: Jobdeck | None = None
    _limited: Jobdeck | None = None
    _client: Any = None
    limits: dict[str, int] = field(default_factory=lambda: {"limited": 2})

    @property
    def store(self) -> Store:
        return self.deck.store

    @property
    def now(self) -> datetime:
        return self.clock()

    def policy_deck(self) -> Jobdeck:
        if self._policy is None:
            self._policy = self.make_deck(clock=self.clock)
            app = create_app(deck=self._policy)
            app.config["TESTING"] = True
            self._client = app.test_client()
        return self._policy

    @property
    def policy(self) -> Store:
        return self.policy_deck().store

    @property
    def limited(self) -> Store:
        if self._limited is None:
            queues = {name: {"concurrency": n} for name, n in self.limits.items()}
            self._limited = self.make_deck(clock=self.clock, queues=queues)
            create_app(deck=self._limited)
        return self._limited.store

    @property
    def client(self) -> Any:
        self.policy_deck()
        return self._client

    # -- jobs -----------------------------------------------------------------

    def enqueue(self, *, queue: str | None = None, priority: int = 0, max_retries: int = 3, **kw: Any) -> JobRecord:
        """A pending job in a queue of its own (so a claim can name it)."""
        new = NewJob("demo.noop", queue=queue or f"q{next(_serial)}", priority=priority, max_retries=max_retries, **kw)
        job, created = self.store.enqueue(new, self.now)
        assert created
        return job

    def claim_one(self, job: JobRecord, worker: str, now: datetime | None = None) -> JobRecord:
        (claimed,) = self.store.claim(worker, now or self.now, queues=[job.queue], controlled=False)
        assert claimed.id == job.id and claimed.status is State.RUNNING
        return claimed

    def in_state(self, state: State) -> JobRecord:
        """A job in ``state`` that worker ``w<n>`` ran as attempt 1, so a
        late call of that worker names a real (job, attempt, worker) and only
        the state guard stands in its way. Due now (``available_at`` <= now)
        unless the state's own rule says otherwise (failed: backoff)."""
        job = self.enqueue()
        worker = f"w{job.id}"
        self.claim_one(job, worker)
        build = BUILDERS.get(state)
        if build is None:
            raise AssertionError(f"no builder for state {state.value}: add one to tests/store/driver.py BUILDERS")
        build(self, job.id, worker)
        got = self.store.get(job.id)
        assert got.status is state, (got.status, state)
        return got

    def snapshot(self, job_id: int) -> tuple[JobRecord, list[AttemptRecord]]:
        return self.store.get(job_id), self.store.attempts_of(job_id)


def _pending(d: Driver, job_id: int, worker: str) -> None:
    d.store.fail(job_id, worker, "boom", d.now)
    d.store.retry(job_id, d.now)


def _running(d: Driver, job_id: int, worker: str) -> None:
    pass


def _failed(d: Driver, job_id: int, worker: str) -> None:
    d.store.fail(job_id, worker, "boom", d.now)


def _dead(d: Driver, job_id: int, worker: str) -> None:
    d.store.fail(job_id, worker, "fatal", d.now, retryable=False)


def _completed(d: Driver, job_id: int, worker: str) -> None:
    d.store.complete(job_id, worker, d.now)


def _discarded(d: Driver, job_id: int, worker: str) -> None:
    d.store.fail(job_id, worker, "boom", d.now)
    d.store.discard(job_id, d.now)


def _cancelled(d: Driver, job_id: int, worker: str) -> None:
    d.store.cancel(job_id, d.now)
    d.store.complete(job_id, worker, d.now)


def _depends_on_new_job(d: Driver, job_id: int) -> JobRecord:
    """A new job of the same (made-up) workflow that ``job_id`` waits for.
    Only the new job and the edge are written: the waiting job is untouched."""
    dep = d.enqueue()
    with d.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == dep.id).values(workflow_id=job_id))
        conn.execute(insert(job_dependencies).values(job_id=job_id, depends_on=dep.id))
    return dep


def _blocked(d: Driver, job_id: int, worker: str) -> None:
    """Released, then blocked on one dependency not completed (the edge is
    left out: a job of its own would show in the counts of each state)."""
    d.store.release(worker, [(job_id, 1)], d.now)
    with d.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(status=State.BLOCKED.value, deps_left=1))


BUILDERS: dict[State, Callable[[Driver, int, str], None]] = {
    State.PENDING: _pending,
    State.RUNNING: _running,
    State.FAILED: _failed,
    State.DEAD: _dead,
    State.COMPLETED: _completed,
    State.DISCARDED: _discarded,
    State.CANCELLED: _cancelled,
    State.BLOCKED: _blocked,
}
"""From a job claimed as attempt 1 by its worker, into each state. A new
state without a builder fails the guard tests by name."""


# -- paths ---------------------------------------------------------------------

Path = Callable[[Driver, JobRecord, str, int, datetime], bool]
"""(driver, job, worker, attempt, now) -> was it applied."""


def _refused(call: Callable[[], Any]) -> bool:
    try:
        call()
    except REFUSALS:
        return False
    return True


def _http(d: Driver, url: str, body: dict[str, Any]) -> bool:
    r = d.client.post(url, json=body)
    assert r.status_code in (200, 404, 409), (url, r.status_code, r.get_data(as_text=True))
    return bool(r.status_code == 200)


def complete_many(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.complete_many([Outcome(job.id, worker, attempt=attempt)], now)


def complete_many_result(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.complete_many([Outcome(job.id, worker, attempt=attempt, result={"r": 1})], now)


def complete_and_claim(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    accepted, _ = d.store.complete_and_claim([Outcome(job.id, worker, attempt=attempt)], worker, now, limit=0)
    return job.id in accepted


def complete(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.complete(job.id, worker, now, result={"r": 1}))


def http_complete(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    return _http(d, f"/api/jobs/{job.id}/complete", {"worker_id": worker, "result": {"r": 1}})


def fail_many(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    done = d.store.fail_many([Outcome(job.id, worker, attempt=attempt, error="late")], now)
    return job.id in [j.id for j in done]


def fail(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.fail(job.id, worker, "late", now))


def http_fail(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    return _http(d, f"/api/jobs/{job.id}/fail", {"worker_id": worker, "error": "late"})


def heartbeat(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.heartbeat(job.id, worker, now))


def http_heartbeat(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    return _http(d, f"/api/jobs/{job.id}/heartbeat", {"worker_id": worker})


def heartbeat_worker(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return d.store.heartbeat_worker(worker, now) > 0


def set_progress(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return d.store.set_progress(job.id, attempt, worker, 0.5, "late", now)


def release(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.release(worker, [(job.id, attempt)], now, interrupted={job.id: now})


def rescue(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in [j.id for j in d.store.rescue_stalled(now + DAY, STALL)]


def retry(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.retry(job.id, now))


def retry_ids(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.retry_ids([job.id], now)


def http_retry(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    return _http(d, f"/api/jobs/{job.id}/retry", {})


def discard(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.discard(job.id, now))


def discard_ids(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.discard_ids([job.id], now)


def http_discard(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    return _http(d, f"/api/jobs/{job.id}/discard", {})


def snooze_many(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.snooze_many([Outcome(job.id, worker, attempt=attempt, snooze=30.0)], now)


def snooze(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.snooze(job.id, worker, 30.0, now))


def http_snooze(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    return _http(d, f"/api/jobs/{job.id}/snooze", {"worker_id": worker, "seconds": 30})


def cancel(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.cancel(job.id, now))


def cancel_ids(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in d.store.cancel_ids([job.id], now)


def http_cancel(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    """200 with the job cancelled, or 202 with a running job's cancel requested."""
    d.clock.now = now
    r = d.client.post(f"/api/jobs/{job.id}/cancel", json={})
    assert r.status_code in (200, 202, 404, 409), (r.status_code, r.get_data(as_text=True))
    return bool(r.status_code in (200, 202))


def run_now(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    """At a moment the job is not yet due: run now moves only a job waiting
    for its time (a due job is the claim's already)."""
    return _refused(lambda: d.store.run_now(job.id, min(now, job.available_at) - timedelta(seconds=1)))


def edit(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return _refused(lambda: d.store.edit(job.id, now, JobChanges(priority=job.priority + 1)))


def http_edit(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    d.clock.now = now
    r = d.client.patch(f"/api/jobs/{job.id}", json={"priority": job.priority + 1})
    assert r.status_code in (200, 404, 409), (r.status_code, r.get_data(as_text=True))
    return bool(r.status_code == 200)


def claim(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in [j.id for j in d.store.claim("claimer", now, limit=100)]


def claim_policy(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in [j.id for j in d.policy.claim("claimer", now, limit=100)]


def claim_limited(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    return job.id in [j.id for j in d.limited.claim("claimer", now, limit=100)]


def claim_ids(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    with d.store.write() as conn:
        return job.id in [j.id for j in d.store.claim_ids(conn, "claimer", now, [job.id])]


def claim_after_complete(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
    _, claimed = d.store.complete_and_claim([], "claimer", now, limit=100)
    return job.id in [j.id for j in claimed]


def _promoting(complete: Callable[[Driver, JobRecord, datetime], object]) -> Path:
    """Promote's paths: the job gets one more dependency, which is then
    completed (so a blocked job's last unfinished one is done)."""

    def path(d: Driver, job: JobRecord, worker: str, attempt: int, now: datetime) -> bool:
        dep = _depends_on_new_job(d, job.id)
        complete(d, d.claim_one(dep, "promoter", now), now)
        return d.store.get(job.id).status is not job.status

    return path


def _ack(d: Driver, dep: JobRecord, now: datetime) -> object:
    return d.store.complete_and_claim([Outcome(dep.id, "promoter", attempt=dep.attempt)], "promoter", now, limit=0)


PATHS: dict[Transition, dict[str, Path]] = {
    Transition.CLAIM: {
        "claim": claim, "claim_policy": claim_policy, "claim_limited": claim_limited, "claim_ids": claim_ids,
        "complete_and_claim": claim_after_complete,
    },
    Transition.COMPLETE: {
        "complete_many": complete_many, "complete_many_result": complete_many_result,
        "complete_and_claim": complete_and_claim, "complete": complete, "http_complete": http_complete,
    },
    Transition.FAIL: {"fail_many": fail_many, "fail": fail, "http_fail": http_fail},
    Transition.HEARTBEAT: {
        "heartbeat": heartbeat, "http_heartbeat": http_heartbeat, "heartbeat_worker": heartbeat_worker,
        "set_progress": set_progress,
    },
    Transition.RELEASE: {"release": release},
    Transition.RESCUE: {"rescue_stalled": rescue},
    Transition.RETRY: {"retry": retry, "retry_ids": retry_ids, "http_retry": http_retry},
    Transition.DISCARD: {"discard": discard, "discard_ids": discard_ids, "http_discard": http_discard},
    Transition.RUN_NOW: {"run_now": run_now},
    Transition.CANCEL: {"cancel": cancel, "cancel_ids": cancel_ids, "http_cancel": http_cancel},
    Transition.EDIT: {"edit": edit, "http_edit": http_edit},
    Transition.SNOOZE: {"snooze_many": snooze_many, "snooze": snooze, "http_snooze": http_snooze},
    Transition.PROMOTE: {
        "complete_dependency": _promoting(lambda d, dep, now: d.store.complete(dep.id, "promoter", now)),
        "ack_dependency": _promoting(_ack),
    },
}  # fmt: skip
"""Every path of every transition: batched, single and HTTP where each exists."""

FENCED = {"complete_many", "complete_many_result", "complete_and_claim", "fail_many", "set_progress", "snooze_many"}
"""Paths that name the attempt: they can tell a late result from the same
worker's next attempt. The others (the HTTP worker's protocol) name only the
worker, so their late-result cases have another worker claim the job."""

LATE: dict[str, Path] = {
    name: path
    for t in (Transition.COMPLETE, Transition.FAIL, Transition.HEARTBEAT, Transition.SNOOZE)
    for name, path in PATHS[t].items()
    if name != "heartbeat_worker"
}
"""The paths by which a worker reports on an attempt it ran."""


def race(n: int, call: Callable[[int], Any]) -> list[Any]:
    """``call(i)`` on ``n`` threads released at once; any exception fails the test."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = call(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a racing thread never returned"
    assert not errors, f"{len(errors)} of {n} racing callers failed: {errors[0]!r}"
    return results


# -- interleaving ----------------------------------------------------------------------


@contextmanager
def competitor_after_first_statement(
    stores: list[Store], competitor: Callable[[], Any], wait: float
) -> Iterator[list[Any]]:
    """Run ``competitor`` on another thread right after the first statement
    this thread sends inside its next transaction (a check, usually), and
    give it ``wait`` seconds to finish before this thread goes on. A check
    that locks what it read makes the competitor wait (or skip the row); a
    check that does not lets it win the race in between, every time.

    If this thread sends no statement through SQLAlchemy (a driver-level
    path), the competitor runs after the call, which is the sequential case."""
    me = threading.get_ident()
    ran: list[Any] = []
    worker: list[threading.Thread] = []

    def run() -> None:
        try:
            ran.append(competitor())
        except Exception as exc:  # the competitor lost: that is an outcome too
            ran.append(exc)

    def after(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() != me or worker or statement.lstrip().upper().startswith(("BEGIN", "PRAGMA")):
            return
        t = threading.Thread(target=run, daemon=True)
        worker.append(t)
        t.start()
        t.join(wait)

    engines = {id(e): e for e in _engines(stores)}.values()
    for engine in engines:
        event.listen(engine, "after_cursor_execute", after)
    try:
        yield ran
    finally:
        for engine in engines:
            event.remove(engine, "after_cursor_execute", after)
        if not worker:
            run()
        else:
            worker[0].join(30)
            assert not worker[0].is_alive(), "the competitor never finished"


def _engines(stores: list[Store]) -> list[Any]:
    """The engines of ``stores``: each store's, and on PostgreSQL the one
    its HTTP requests use (``Transactions.bound_requests``)."""
    found = []
    for s in stores:
        found.append(s.engine)
        requests = getattr(s, "_for_requests", None)
        if requests is not None:
            found.append(requests[0])
    return found


def _pools(stores: list[Store]) -> list[Any]:
    return [engine.pool for engine in _engines(stores)]


@contextmanager
def competitor_after_first_transaction(stores: list[Store], competitor: Callable[[], Any]) -> Iterator[list[Any]]:
    """Run ``competitor`` on this thread as soon as this thread's next
    transaction has ended (its connection is back in the pool): a call that
    checks in one transaction and writes in another loses the race every
    time; a call that is one transaction has already finished."""
    me = threading.get_ident()
    ran: list[Any] = []

    def on_checkin(*_: Any) -> None:
        if threading.get_ident() != me or ran:
            return
        ran.append(None)
        try:
            ran[0] = competitor()
        except Exception as exc:  # the competitor lost: that is an outcome too
            ran[0] = exc

    pools = {id(p): p for p in _pools(stores)}.values()
    for pool in pools:
        event.listen(pool, "checkin", on_checkin)
    try:
        yield ran
    finally:
        for pool in pools:
            event.remove(pool, "checkin", on_checkin)
