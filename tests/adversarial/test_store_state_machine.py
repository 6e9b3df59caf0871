"""The store against a model of its state machine (DESIGN, "The job, and its
one state machine"), on a real SQLite file and on PostgreSQL.

Hypothesis drives the real store with every transition, through each path
that exists for it (the HTTP worker's single calls, the pool's batched ones,
``complete_and_claim``, the queue-limited claim and, on SQLite, the
driver-level fast path), with an injected clock it advances as a rule. A
small Python model says what each call must answer: accepted, or refused
with which error. After every step each job's state, attempt, retry_count,
holder, due time and attempt rows must match the model.

Claims are kept as tokens (job, attempt, worker) and any old token may be
played again later: that is how late results arrive, after a rescue, a
timeout, a release, a retry or a fresh claim of the same job by the same
worker. They must be refused.

The second half races duplicate idempotency keys on several threads and
connections: exactly one job per key, every caller gets it (or the 409 for
a different payload), never an IntegrityError.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from jobdeck.core.errors import IdempotencyConflict, JobNotFound, NotHeld, RunNowRefused, TransitionRefused
from jobdeck.core.states import SOURCES, State, Transition
from jobdeck.deck import Jobdeck
from jobdeck.jobs.queues import Limits, QueueControls
from jobdeck.store.models import attempts, jobs
from jobdeck.store.records import Outcome
from sqlalchemy import delete, select

from tests.conftest import T0, Clock

pytestmark = pytest.mark.backends

TYPE = "demo.noop"
WORKERS = ("w1", "w2")
QUEUES = ("default", "limited")
LIMITED = 1
"""Concurrency of the ``limited`` queue under the queue-limited claim."""
STALL = 60.0
BACKOFF_BASE, BACKOFF_CAP = 1.0, 40.0
MISSING = 10**9
"""A job id that never exists."""

PHASES = tuple(Phase) if os.environ.get("JOBDECK_SHRINK") == "1" else tuple(p for p in Phase if p is not Phase.shrink)
"""Shrinking a failure costs minutes here (every step is real SQL); CI
reports the failing sequence as found. JOBDECK_SHRINK=1 shrinks it."""

STEPS = {"sqlite": (150, 40), "postgres": (100, 40)}
"""(max_examples, stateful_step_count) per backend: about 10 s on SQLite and 13 s on
PostgreSQL on the 2-core development machine under load."""


SEEN: collections.Counter[str] = collections.Counter()
"""What the runs went through: the test asserts each case it exists for was reached."""


def saw(label: str) -> None:
    SEEN[label] += 1


# -- the model ------------------------------------------------------------------


@dataclass
class Job:
    id: int
    queue: str
    priority: int
    available_at: datetime
    max_retries: int
    key: str | None
    payload: dict[str, Any]
    status: State = State.PENDING
    attempt: int = 0
    retry_count: int = 0
    worker: str | None = None
    heartbeat_at: datetime | None = None
    attempts: list[tuple[int, str | None, str]] = field(default_factory=list)
    """(attempt, worker, outcome) in the order they were written."""
    cancel_requested: bool = False
    """Cancelled: at once, or (running) when its attempt ends, however it ends."""

    def end_cancelled(self) -> bool:
        """A cancelled job's attempt ended: the job is cancelled, never retried."""
        if self.cancel_requested:
            self.status = State.CANCELLED
        return self.cancel_requested


@dataclass(frozen=True)
class Token:
    """One claim as its holder knows it: what a late result carries."""

    job_id: int
    attempt: int
    worker: str


GHOST = Token(MISSING, 1, WORKERS[0])
"""A claim of a job that does not exist."""


class Model:
    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.keys: dict[str, int] = {}

    def claimable(self, now: datetime, queues: list[str] | None) -> list[Job]:
        due = [
            j
            for j in self.jobs.values()
            if j.status in SOURCES[Transition.CLAIM] and j.available_at <= now and (queues is None or j.queue in queues)
        ]
        return sorted(due, key=lambda j: (-j.priority, j.available_at, j.id))

    def claim_order(self, now: datetime, limit: int, queues: list[str] | None, limited: bool) -> list[Job]:
        room = LIMITED - sum(1 for j in self.jobs.values() if j.status is State.RUNNING and j.queue == "limited")
        chosen: list[Job] = []
        for j in self.claimable(now, queues):
            if len(chosen) == limit:
                break
            if limited and j.queue == "limited":
                if room <= 0:
                    continue
                room -= 1
            chosen.append(j)
        return chosen

    def claim(self, job: Job, worker: str, now: datetime) -> Token:
        job.status, job.worker, job.heartbeat_at = State.RUNNING, worker, now
        job.attempt += 1
        return Token(job.id, job.attempt, worker)

    def holds(self, t: Token) -> bool:
        """The batched paths' fence: the same job, attempt and worker, still running."""
        j = self.jobs.get(t.job_id)
        return j is not None and j.status is State.RUNNING and j.attempt == t.attempt and j.worker == t.worker

    def single_refusal(self, job_id: int, worker: str, transition: Transition) -> type[Exception] | None:
        """The single (HTTP) paths' fence is the job and the worker: the
        error each answers with, or None when the call is accepted."""
        j = self.jobs.get(job_id)
        if j is None:
            return JobNotFound
        if j.status not in SOURCES[transition]:
            return TransitionRefused
        if j.worker != worker:
            return NotHeld
        return None

    def fail(self, job: Job, worker: str, now: datetime, outcome: str, retryable: bool = True) -> None:
        job.attempts.append((job.attempt, worker, State.CANCELLED.value if job.cancel_requested else outcome))
        if job.end_cancelled():
            return
        if retryable and job.retry_count < job.max_retries:
            job.status = State.FAILED
            job.available_at = now  # the store's backoff has jitter: the exact time is read back and bounded
            job.retry_count += 1
        else:
            job.status = State.DEAD

    def snooze(self, job: Job, worker: str, now: datetime, seconds: float) -> None:
        """Back to pending, due later, retry count unchanged (or cancelled)."""
        job.attempts.append((job.attempt, worker, State.CANCELLED.value if job.cancel_requested else "snoozed"))
        job.worker, job.heartbeat_at = None, None
        if not job.end_cancelled():
            job.status, job.available_at = State.PENDING, now + timedelta(seconds=seconds)

    def snoozes_in_a_row(self, job: Job) -> int:
        n = 0
        for _, _, outcome in reversed(job.attempts):
            if outcome != "snoozed":
                break
            n += 1
        return n

    def complete(self, job: Job, worker: str) -> None:
        job.attempts.append((job.attempt, worker, State.CANCELLED.value if job.cancel_requested else "completed"))
        if not job.end_cancelled():
            job.status = State.COMPLETED


def _backoff_bounds(now: datetime, retry_count: int) -> tuple[datetime, datetime]:
    delay = min(BACKOFF_CAP, BACKOFF_BASE * 2**retry_count)
    return now + timedelta(seconds=delay), now + timedelta(seconds=min(BACKOFF_CAP, delay * 1.1) + 1e-6)


# -- the machine ------------------------------------------------------------------

priorities = st.sampled_from([0, 0, 10, -5, 20])
delays = st.sampled_from([None, 0, 2, 30])
payloads = st.sampled_from([{}, {"n": 1}, {"n": 2}])
keys = st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"]))


class StoreMachine(RuleBasedStateMachine):
    """One example: an empty database, the clock at T0, a fresh model."""

    def __init__(self, deck: Jobdeck, clock: Clock) -> None:
        super().__init__()
        self.deck, self.store, self.clock = deck, deck.store, clock
        self.model = Model()
        self.tokens: list[Token] = []
        """Every claim made, for the rules that pick a particular kind of late result."""
        self.failed_at: dict[int, tuple[datetime, int]] = {}
        """Jobs failed with a retry in this step: (now, retry_count before) to bound the backoff."""

    def _token(self, data: st.DataObject) -> Token:
        """Any claim made so far (most are late by now), or one of a job that does not exist.
        Drawn from the machine's own list, not a Bundle: a rule that can
        always run keeps hypothesis from discarding examples that start
        without claims."""
        return data.draw(st.sampled_from([*self.tokens, GHOST]))

    def _tokens(self, data: st.DataObject, min_size: int = 1) -> list[Token]:
        """Up to three claims, repeats allowed: a batch may hold an outcome twice."""
        return data.draw(st.lists(st.sampled_from([*self.tokens, GHOST]), min_size=min_size, max_size=3))

    def _job_id(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from([*self.model.jobs, MISSING]))

    @initialize()
    def empty_database(self) -> None:
        with self.store.write() as conn:
            conn.execute(delete(attempts))
            conn.execute(delete(jobs))
        self.clock.now = T0

    # -- time ---------------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.5, 1, 3, 20, 61, 61]), sweep=st.booleans())
    def advance_clock(self, seconds: float, sweep: bool) -> None:
        """Time passes; the stalled sweep may run then, as it does every few seconds."""
        self.clock.advance(seconds)
        if sweep:
            self.rescue_stalled()

    @rule(past=st.sampled_from([1, 20]))
    def a_worker_stalls(self, past: float) -> None:
        """Heartbeats stop past the stall timeout and the sweep runs: the
        start of most late results."""
        self.advance_clock(STALL + past, sweep=True)

    # -- enqueue ------------------------------------------------------------------

    def _expect_enqueue(self, key: str | None, payload: dict[str, Any]) -> Job | None:
        """The existing job a keyed enqueue must answer with, or None for a new one."""
        if key is not None and key in self.model.keys:
            return self.model.jobs[self.model.keys[key]]
        return None

    def _add(self, job_id: int, queue: str, priority: int, delay: float | None, max_retries: int,
             key: str | None, payload: dict[str, Any]) -> None:  # fmt: skip
        now = self.clock()
        at = now + timedelta(seconds=delay or 0)
        self.model.jobs[job_id] = Job(job_id, queue, priority, at, max_retries, key, payload)
        if key is not None:
            self.model.keys[key] = job_id

    @rule(
        key=keys,
        payload=payloads,
        priority=priorities,
        delay=delays,
        max_retries=st.integers(0, 2),
        queue=st.sampled_from(QUEUES),
    )
    def enqueue(self, key: str | None, payload: dict[str, Any], priority: int, delay: float | None,
                max_retries: int, queue: str) -> None:  # fmt: skip
        existing = self._expect_enqueue(key, payload)
        try:
            job, created = self.deck.enqueue(
                TYPE, payload, priority=priority, delay_seconds=delay, max_retries=max_retries,
                idempotency_key=key, queue=queue,
            )  # fmt: skip
        except IdempotencyConflict as exc:
            assert existing is not None and existing.payload != payload, f"unexpected 409: {exc}"
            saw("enqueue: 409 for a known key with another payload")
            assert exc.existing_id == existing.id
            return
        if existing is not None:
            assert existing.payload == payload, f"key {key!r} reused with another payload was accepted"
            assert (job.id, created) == (existing.id, False)
            return
        assert created and job.status is State.PENDING and job.idempotency_key == key
        self._add(job.id, queue, priority, delay, max_retries, key, payload)

    @rule(
        items=st.lists(st.tuples(keys, payloads, priorities, delays), min_size=1, max_size=4),
    )
    def enqueue_many(self, items: list[tuple[str | None, dict[str, Any], int, float | None]]) -> None:
        """Several jobs in one transaction: a known key's slot holds the existing job's id."""
        body = [
            {"type": TYPE, "payload": p, "priority": pr, "max_retries": 1}
            | ({"idempotency_key": k} if k else {})
            | ({"delay_seconds": d} if d is not None else {})
            for k, p, pr, d in items
        ]
        ids = self.deck.enqueue_many(body)
        assert len(ids) == len(items)
        for job_id, (key, payload, priority, delay) in zip(ids, items):
            existing = self._expect_enqueue(key, payload)
            if existing is not None:
                assert job_id == existing.id, f"key {key!r} answered {job_id}, not {existing.id}"
                continue
            assert job_id not in self.model.jobs
            self._add(job_id, "default", priority, delay, 1, key, payload)

    # -- claim ----------------------------------------------------------------------

    def _claimed(self, got: list[Any], worker: str, expected: list[Job]) -> None:
        assert [j.id for j in got] == [j.id for j in expected], "claim order or selection differs from the model"
        if len(got) > 1:
            saw("claimed several jobs at once")
        now = self.clock()
        tokens = []
        for record, job in zip(got, expected):
            token = self.model.claim(job, worker, now)
            assert (record.status, record.attempt, record.worker_id) == (State.RUNNING, token.attempt, worker)
            tokens.append(token)
        self.tokens.extend(tokens)

    @rule(
        worker=st.sampled_from(WORKERS),
        limit=st.sampled_from([1, 1, 2, 5]),
        queues=st.sampled_from([None, None, ["default"], ["limited"]]),
    )
    def claim(self, worker: str, limit: int, queues: list[str] | None) -> None:
        """The plain claim (SQLite: the fast path's text statement; PostgreSQL: Core with SKIP LOCKED)."""
        expected = self.model.claim_order(self.clock(), limit, queues, limited=False)
        got = self.store.claim(worker, self.clock(), limit=limit, queues=queues, controlled=False)
        self._claimed(got, worker, expected)

    @rule(worker=st.sampled_from(WORKERS), limit=st.sampled_from([1, 3]))
    def claim_limited(self, worker: str, limit: int) -> None:
        """The queue-limited claim (``jobdeck.jobs.queues``: counts running jobs, then ``Store.claim_ids``)."""
        expected = self.model.claim_order(self.clock(), limit, None, limited=True)
        got = self.store.claim(worker, self.clock(), limit=limit)
        self._claimed(got, worker, expected)

    # -- finishing an attempt --------------------------------------------------------

    @rule(data=st.data(), with_result=st.booleans())
    def complete_single(self, data: st.DataObject, with_result: bool) -> None:
        self._complete_single(self._token(data), with_result)

    def _complete_single(self, token: Token, with_result: bool) -> None:
        """The HTTP worker's complete: fenced by job and worker."""
        why = self.model.single_refusal(token.job_id, token.worker, Transition.COMPLETE)
        try:
            record = self.store.complete(
                token.job_id, token.worker, self.clock(), result={"ok": 1} if with_result else None
            )
        except (JobNotFound, TransitionRefused, NotHeld) as exc:
            assert why is type(exc), f"refused with {exc!r}; the model expects {why}"
            saw(f"single call refused: {why.__name__}")
            return
        assert why is None, f"accepted; the model expects {why.__name__}"
        job = self.model.jobs[token.job_id]
        self.model.complete(job, token.worker)
        assert record.status is job.status, f"complete answered a job that is {record.status}"

    @rule(data=st.data(), with_result=st.booleans())
    def complete_batch(self, data: st.DataObject, with_result: bool) -> None:
        self._complete_batch(self._tokens(data), with_result)

    def _complete_batch(self, tokens: list[Token], with_result: bool) -> None:
        """The pool's batched completion (SQLite without a result: the fast path)."""
        outcomes = [Outcome(t.job_id, t.worker, attempt=t.attempt, result={"ok": 1} if with_result else None)
                    for t in tokens]  # fmt: skip
        accepted = self.store.complete_many(outcomes, self.clock())
        self._check_completed(tokens, accepted)

    def _check_completed(self, tokens: list[Token], accepted: list[int]) -> None:
        """A batch may hold an outcome twice, or a late and a current one of a job."""
        expected = list(dict.fromkeys(t for t in tokens if self.model.holds(t)))
        self._late(tokens, expected)
        assert sorted(accepted) == sorted(t.job_id for t in expected)
        for t in expected:
            self.model.complete(self.model.jobs[t.job_id], t.worker)

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), limit=st.sampled_from([0, 1, 2]))
    def complete_and_claim(self, data: st.DataObject, worker: str, limit: int) -> None:
        """The acker's refill: completions and the (queue-limited) claim in one transaction."""
        tokens = self._tokens(data, min_size=0)
        outcomes = [Outcome(t.job_id, t.worker, attempt=t.attempt) for t in tokens]
        accepted, got = self.store.complete_and_claim(outcomes, worker, self.clock(), limit=limit)
        self._check_completed(tokens, accepted)
        expected = self.model.claim_order(self.clock(), limit, None, limited=True) if limit else []
        self._claimed(got, worker, expected)

    @rule(data=st.data(), retryable=st.booleans())
    def fail_single(self, data: st.DataObject, retryable: bool) -> None:
        self._fail_single(self._token(data), retryable)

    def _fail_single(self, token: Token, retryable: bool) -> None:
        """The HTTP worker's fail: fenced by job and worker."""
        why = self.model.single_refusal(token.job_id, token.worker, Transition.FAIL)
        try:
            record = self.store.fail(token.job_id, token.worker, "boom", self.clock(), retryable=retryable)
        except (JobNotFound, TransitionRefused, NotHeld) as exc:
            assert why is type(exc), f"refused with {exc!r}; the model expects {why}"
            saw(f"single call refused: {why.__name__}")
            return
        assert why is None, f"accepted; the model expects {why.__name__}"
        job = self.model.jobs[token.job_id]
        self._fail(job, job.worker or "", "failed", retryable)
        assert record.status is job.status

    def _late(self, tokens: list[Token], current: list[Token]) -> None:
        """Label the late results played."""
        for t in tokens:
            if t not in current:
                job = self.model.jobs.get(t.job_id)
                saw(f"late result refused, job now {job.status.value if job else 'missing'}")

    def _fail(self, job: Job, worker: str, outcome: str, retryable: bool = True) -> None:
        self.failed_at[job.id] = (self.clock(), job.retry_count)
        self.model.fail(job, worker, self.clock(), outcome, retryable)

    @rule(data=st.data(), kind=st.sampled_from(["failed", "timed_out"]), retryable=st.booleans())
    def fail_batch(self, data: st.DataObject, kind: str, retryable: bool) -> None:
        self._fail_batch(self._tokens(data), kind, retryable)

    def _fail_batch(self, tokens: list[Token], kind: str, retryable: bool = True) -> None:
        """The pool's failures (and timeouts), fenced by job, attempt and worker."""
        outcomes = [Outcome(t.job_id, t.worker, attempt=t.attempt, error="boom", kind=kind, retryable=retryable)
                    for t in tokens]  # fmt: skip
        expected = []
        for t in tokens:  # one by one: a duplicate job in the batch is refused the second time
            if self.model.holds(t):
                expected.append(t.job_id)
                self._fail(self.model.jobs[t.job_id], t.worker, kind, retryable)
        self._late(tokens, [t for t in tokens if t.job_id in expected])
        done = self.store.fail_many(outcomes, self.clock())
        assert sorted(j.id for j in done) == sorted(expected)

    @rule(data=st.data(), seconds=st.sampled_from([0, 2, 30]), cap=st.sampled_from([None, None, 1, 2]))
    def snooze_batch(self, data: st.DataObject, seconds: float, cap: int | None) -> None:
        self._snooze_batch(self._tokens(data), seconds, cap)

    def _snooze_batch(self, tokens: list[Token], seconds: float, cap: int | None = None) -> None:
        """The pool's snoozes, fenced by job, attempt and worker; past ``cap``
        snoozes in a row the attempt fails instead."""
        outcomes = [Outcome(t.job_id, t.worker, attempt=t.attempt, snooze=seconds, max_snoozes=cap) for t in tokens]
        expected = []
        for t in tokens:
            if self.model.holds(t):
                expected.append(t.job_id)
                job = self.model.jobs[t.job_id]
                if cap is not None and self.model.snoozes_in_a_row(job) >= cap:
                    saw("snooze past max_snoozes failed the attempt")
                    self._fail(job, t.worker, "failed")
                else:
                    saw("snoozed" if not job.cancel_requested else "snoozed while cancel requested")
                    self.model.snooze(job, t.worker, self.clock(), seconds)
        self._late(tokens, [t for t in tokens if t.job_id in expected])
        ended = self.store.snooze_many(outcomes, self.clock())
        assert sorted(ended) == sorted(expected)

    @rule(data=st.data(), cap=st.sampled_from([1, 2]))
    def snooze_every_time(self, data: st.DataObject, cap: int) -> None:
        """A handler that snoozes on every attempt: claimed and snoozed
        again until the snooze past ``cap`` fails the attempt."""
        token = self._running_token(data)
        for _ in range(cap + 1):
            self._snooze_batch([token], 0, cap)
            self._claim_all_due(token.worker)
            again = [t for t in self.tokens if t.job_id == token.job_id and self.model.holds(t)]
            if not again:
                return
            token = again[0]

    @rule(data=st.data(), seconds=st.sampled_from([0, 30]))
    def snooze_after_cancel(self, data: st.DataObject, seconds: float) -> None:
        """A handler snoozes after its job was cancelled while it ran: the
        job ends cancelled, not due again (reached on purpose: left to the
        draws, whether a run met this case depended on hypothesis's version)."""
        token = self._running_token(data)
        self._cancel(token.job_id)
        self._snooze_batch([token], seconds)

    @rule(data=st.data(), seconds=st.sampled_from([0, 2, 30]))
    def snooze_single(self, data: st.DataObject, seconds: float) -> None:
        self._snooze_single(self._token(data), seconds)

    def _snooze_single(self, token: Token, seconds: float) -> None:
        """The HTTP worker's snooze: fenced by job and worker."""
        why = self.model.single_refusal(token.job_id, token.worker, Transition.SNOOZE)
        try:
            record = self.store.snooze(token.job_id, token.worker, seconds, self.clock())
        except (JobNotFound, TransitionRefused, NotHeld) as exc:
            assert why is type(exc), f"refused with {exc!r}; the model expects {why}"
            saw(f"single call refused: {why.__name__}")
            return
        assert why is None, f"accepted; the model expects {why.__name__}"
        job = self.model.jobs[token.job_id]
        self.model.snooze(job, token.worker, self.clock(), seconds)
        assert record.status is job.status and record.retry_count == job.retry_count

    REPORTS = ("complete", "fail", "heartbeat", "complete_batch", "fail_batch", "release", "snooze", "snooze_batch")

    def _report(self, token: Token, how: str) -> None:
        """``token``'s holder reports, through one of the paths."""
        if how == "complete":
            self._complete_single(token, with_result=False)
        elif how == "fail":
            self._fail_single(token, retryable=True)
        elif how == "heartbeat":
            self._heartbeat(token)
        elif how == "complete_batch":
            self._complete_batch([token], with_result=False)
        elif how == "fail_batch":
            self._fail_batch([token], kind="timed_out")
        elif how == "snooze":
            self._snooze_single(token, 2)
        elif how == "snooze_batch":
            self._snooze_batch([token], 0)
        else:
            self._release([token], token.worker)

    def _claim_all_due(self, worker: str) -> None:
        self._sync_backoff()  # inside a rule that failed jobs: the model learns their retry times first
        now = self.clock()
        expected = self.model.claim_order(now, 100, None, limited=False)
        self._claimed(self.store.claim(worker, now, limit=100, controlled=False), worker, expected)

    def _running_token(self, data: st.DataObject) -> Token:
        """A current claim; with none, a job is enqueued and claimed first."""
        running = [t for t in self.tokens if self.model.holds(t)]
        if not running:
            self.enqueue(None, {}, 0, None, 2, "default")
            self._claim_all_due(data.draw(st.sampled_from(WORKERS)))
            running = [t for t in self.tokens if self.model.holds(t)]
        return data.draw(st.sampled_from(running))

    @rule(data=st.data(), before=st.sampled_from(REPORTS), after=st.sampled_from(REPORTS))
    def handover_after_rescue(self, data: st.DataObject, before: str, after: str) -> None:
        """The case late results exist for: a worker stalls and the sweep
        rescues its job; the worker reports (the job is failed or dead),
        another worker claims it, and the first one reports again."""
        token = self._running_token(data)
        self.advance_clock(STALL + 1, sweep=True)
        self._report(token, before)
        self.advance_clock(BACKOFF_CAP + 1, sweep=False)
        self._claim_all_due(WORKERS[1 - WORKERS.index(token.worker)])
        self._report(token, after)

    @rule(data=st.data(), before=st.sampled_from(REPORTS), after=st.sampled_from(REPORTS))
    def reclaim_after_release(self, data: st.DataObject, before: str, after: str) -> None:
        """A pool releases a job (shutdown, shedding its prefetch) and claims
        it again; the released attempt's result counts neither for the
        pending job nor for its new attempt."""
        token = self._running_token(data)
        self._release([token], token.worker)
        self._report(token, before)
        self._claim_all_due(token.worker)
        self._report(token, after)

    @rule(data=st.data(), how=st.sampled_from(REPORTS))
    def a_late_result(self, data: st.DataObject, how: str) -> None:
        """A claim that is not the job's current one reports (its job moved on)."""
        stale = [t for t in self.tokens if not self.model.holds(t)]
        self._report(data.draw(st.sampled_from([*stale, GHOST])), how)

    # -- while running -------------------------------------------------------------------

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        self._heartbeat(self._token(data))

    def _heartbeat(self, token: Token) -> None:
        why = self.model.single_refusal(token.job_id, token.worker, Transition.HEARTBEAT)
        try:
            self.store.heartbeat(token.job_id, token.worker, self.clock())
        except (JobNotFound, TransitionRefused, NotHeld) as exc:
            assert why is type(exc), f"refused with {exc!r}; the model expects {why}"
            saw(f"single call refused: {why.__name__}")
            return
        assert why is None, f"accepted; the model expects {why.__name__}"
        self.model.jobs[token.job_id].heartbeat_at = self.clock()

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat_worker(self, worker: str) -> None:
        held = [j for j in self.model.jobs.values() if j.status is State.RUNNING and j.worker == worker]
        assert self.store.heartbeat_worker(worker, self.clock()) == len(held)
        for j in held:
            j.heartbeat_at = self.clock()

    def rescue_stalled(self) -> None:
        now = self.clock()
        cutoff = now - timedelta(seconds=STALL)
        stalled = [j for j in self.model.jobs.values()
                   if j.status is State.RUNNING and j.heartbeat_at is not None and j.heartbeat_at < cutoff]  # fmt: skip
        if stalled:
            saw("rescued stalled jobs")
        rescued = self.store.rescue_stalled(now, STALL)
        assert sorted(j.id for j in rescued) == sorted(j.id for j in stalled)
        for j in stalled:
            self._fail(j, j.worker or "", "stalled")

    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def release(self, data: st.DataObject, worker: str) -> None:
        self._release(self._tokens(data), worker)

    def _release(self, tokens: list[Token], worker: str) -> None:
        """Graceful shutdown gives back what ``worker`` holds (only its own current attempts)."""
        expected = list(dict.fromkeys(t for t in tokens if t.worker == worker and self.model.holds(t)))
        released = self.store.release(worker, [(t.job_id, t.attempt) for t in tokens], self.clock())
        assert sorted(released) == sorted(t.job_id for t in expected)
        if expected:
            saw("released running jobs")
        for t in expected:
            j = self.model.jobs[t.job_id]
            j.worker, j.heartbeat_at = None, None
            if not j.end_cancelled():
                j.status = State.PENDING

    # -- operator actions -----------------------------------------------------------------

    def _operator(self, job_id: int, transition: Transition, do: Callable[[], Any]) -> Job | None:
        """Run an operator action; return the model's job when it must be accepted."""
        job = self.model.jobs.get(job_id)
        try:
            do()
        except JobNotFound:
            assert job is None
            return None
        except TransitionRefused as exc:
            assert job is not None and job.status not in SOURCES[transition], f"refused: {exc}"
            assert exc.state is job.status
            return None
        assert job is not None and job.status in SOURCES[transition], f"{transition.value} accepted from {job}"
        return job

    @rule(data=st.data(), payload=st.one_of(st.none(), payloads))
    def retry(self, data: st.DataObject, payload: dict[str, Any] | None) -> None:
        """Retry, or edit the payload and retry (a keyed job's key then names the new payload)."""
        job_id = self._job_id(data)
        job = self._operator(job_id, Transition.RETRY, lambda: self.store.retry(job_id, self.clock(), payload))
        if job is not None:
            job.status, job.available_at, job.retry_count = State.PENDING, self.clock(), 0
            job.payload = job.payload if payload is None else payload

    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        job_id = self._job_id(data)
        job = self._operator(job_id, Transition.DISCARD, lambda: self.store.discard(job_id, self.clock()))
        if job is not None:
            job.status = State.DISCARDED

    @rule(data=st.data(), running=st.booleans())
    def cancel(self, data: st.DataObject, running: bool) -> None:
        """Cancel a job (half the time a running one): at once, or asked of its attempt."""
        self._cancel(self._running_token(data).job_id if running else self._job_id(data))

    def _cancel(self, job_id: int) -> None:
        job = self._operator(job_id, Transition.CANCEL, lambda: self.store.cancel(job_id, self.clock()))
        if job is None:
            return
        job.cancel_requested = True
        if job.status is State.RUNNING:
            saw("cancel requested of a running job")
        else:
            job.status = State.CANCELLED

    @rule(data=st.data(), retry=st.booleans())
    def bulk_action(self, data: st.DataObject, retry: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from([*self.model.jobs, MISSING]), min_size=1, max_size=3, unique=True))
        transition = Transition.RETRY if retry else Transition.DISCARD
        expected = [i for i in ids if i in self.model.jobs and self.model.jobs[i].status in SOURCES[transition]]
        do = self.store.retry_ids if retry else self.store.discard_ids
        assert sorted(do(ids, self.clock())) == sorted(expected)
        for i in expected:
            job = self.model.jobs[i]
            if retry:
                job.status, job.available_at, job.retry_count = State.PENDING, self.clock(), 0
            else:
                job.status = State.DISCARDED

    @rule(data=st.data(), waiting=st.booleans())
    def run_now(self, data: st.DataObject, waiting: bool) -> None:
        """Make a scheduled or retrying job due now (half the time one that is)."""
        now = self.clock()
        scheduled = [
            i for i, j in self.model.jobs.items() if j.status in SOURCES[Transition.CLAIM] and j.available_at > now
        ]
        job_id = data.draw(st.sampled_from(scheduled if waiting and scheduled else [*self.model.jobs, MISSING]))
        job = self.model.jobs.get(job_id)
        try:
            self.store.run_now(job_id, now)
        except JobNotFound:
            assert job is None
            return
        except RunNowRefused:
            assert job is not None
            assert job.status not in SOURCES[Transition.CLAIM] or job.available_at <= now
            return
        assert job is not None and job.status in SOURCES[Transition.CLAIM] and job.available_at > now
        saw("run now accepted")
        job.available_at = now

    def _sync_backoff(self, due: dict[int, datetime] | None = None) -> None:
        """Adopt the retry times the store chose (jittered) once checked
        against the backoff rule; ``due`` is each job's available_at, read
        here when not given."""
        if due is None:
            with self.store.read() as conn:
                due = {r.id: r.available_at for r in conn.execute(select(jobs.c.id, jobs.c.available_at))}
        for job_id, (now, retry_count) in self.failed_at.items():
            job = self.model.jobs[job_id]
            if job.status is State.FAILED:
                low, high = _backoff_bounds(now, retry_count)
                assert low <= due[job_id] <= high, f"job {job_id}: retry at {due[job_id]}, not in backoff"
                job.available_at = due[job_id]
        self.failed_at.clear()

    # -- what must hold after every step ---------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        with self.store.read() as conn:
            rows = {r.id: r for r in conn.execute(select(jobs))}
            rows_of: dict[int, list[tuple[int, str | None, str]]] = {}
            for a in conn.execute(select(attempts).order_by(attempts.c.id)):
                rows_of.setdefault(a.job_id, []).append((a.attempt, a.worker_id, a.outcome))
        assert set(rows) == set(self.model.jobs), "jobs exist that the model does not know, or are missing"
        self._sync_backoff({i: r.available_at for i, r in rows.items()})
        for job in self.model.jobs.values():
            row = rows[job.id]
            seen = (row.status, row.attempt, row.retry_count, row.idempotency_key, json.loads(row.payload))
            want = (job.status.value, job.attempt, job.retry_count, job.key, job.payload)
            assert seen == want, f"job {job.id}: {seen} != {job}"
            if job.status is State.RUNNING:
                assert (row.worker_id, row.heartbeat_at) == (job.worker, job.heartbeat_at), f"job {job.id}"
            assert (row.cancel_requested_at is not None) == job.cancel_requested, f"job {job.id}: cancel request"
            if job.status in SOURCES[Transition.CLAIM]:
                assert row.available_at == job.available_at, f"job {job.id}: due {row.available_at}"
            assert rows_of.get(job.id, []) == job.attempts, f"job {job.id}: attempt rows differ"


@pytest.fixture
def machine_deck(make_deck: Callable[..., Jobdeck]) -> Iterator[tuple[Jobdeck, Clock]]:
    clock = Clock()
    deck = make_deck(clock=clock, backoff_base=BACKOFF_BASE, backoff_cap=BACKOFF_CAP, sqlite_synchronous="NORMAL")
    QueueControls(deck.store, Limits(queues={"limited": LIMITED}, types={})).install()
    yield deck, clock


MUST_SEE = {
    *(f"late result refused, job now {s}" for s in ("failed", "dead", "completed", "pending", "running")),
    *(f"single call refused: {e.__name__}" for e in (JobNotFound, TransitionRefused, NotHeld)),
    "rescued stalled jobs",
    "released running jobs",
    "run now accepted",
    "cancel requested of a running job",
    "late result refused, job now cancelled",
    "enqueue: 409 for a known key with another payload",
    "claimed several jobs at once",
    "snoozed",
    "snoozed while cancel requested",
    "snooze past max_snoozes failed the attempt",
}


def test_store_follows_the_state_machine(machine_deck: tuple[Jobdeck, Clock], backend: str) -> None:
    deck, clock = machine_deck
    examples, steps = STEPS[backend]
    SEEN.clear()
    run_state_machine_as_test(
        lambda: StoreMachine(deck, clock),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,
            database=None,
            phases=PHASES,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    assert not MUST_SEE - set(SEEN), f"never reached: {sorted(MUST_SEE - set(SEEN))}"


# -- racing duplicate idempotency keys ---------------------------------------------------

RACERS = 8
ROUNDS = 25


def test_racing_duplicate_idempotency_keys(make_deck: Callable[..., Jobdeck], backend: str) -> None:
    """Eight threads on two engines (two processes' pools: on PostgreSQL
    eight connections, where SQLite's write lock cannot hide the race) enqueue
    the same key at once, round after round. Exactly one job per key; every
    caller gets it, or the 409 when its payload differs; never anything else."""
    decks = [make_deck(), make_deck()]
    barrier = threading.Barrier(RACERS, timeout=60)
    answers: list[list[tuple[Any, ...]]] = [[] for _ in range(ROUNDS)]
    lock = threading.Lock()

    def racer(i: int) -> None:
        deck = decks[i % 2]
        payload = {"n": 2} if i % 4 == 3 else {"n": 1}  # two of eight disagree
        for r in range(ROUNDS):
            key = f"race-{r}"
            barrier.wait()
            answer: tuple[Any, ...]
            try:
                if i % 3 == 2:
                    (job_id,) = deck.enqueue_many([{"type": TYPE, "payload": payload, "idempotency_key": key}])
                    answer = ("many", job_id, payload)
                else:
                    job, created = deck.enqueue(TYPE, payload, idempotency_key=key)
                    answer = ("one", job.id, payload, created, job.payload)
            except IdempotencyConflict as exc:
                answer = ("409", exc.existing_id, payload)
            except BaseException as exc:  # every other answer is the failure this test reports
                answer = ("error", repr(exc))
            with lock:
                answers[r].append(answer)

    threads = [threading.Thread(target=racer, args=(i,), name=f"racer-{i}") for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a racer hung"
    with decks[0].store.read() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.idempotency_key, jobs.c.payload)).all()
    by_key: dict[str, list[Any]] = {}
    for row in rows:
        by_key.setdefault(row.idempotency_key, []).append(row)
    assert sorted(by_key) == sorted(f"race-{r}" for r in range(ROUNDS))
    for r, got in enumerate(answers):
        (job,) = by_key[f"race-{r}"]
        stored = decks[0].store.get(job.id).payload
        errors = [a for a in got if a[0] == "error"]
        assert not errors, f"round {r}: {errors}"
        assert len(got) == RACERS
        assert sum(1 for a in got if a[0] == "one" and a[3]) <= 1, f"round {r}: two callers created the job"
        for a in got:
            assert a[1] == job.id, f"round {r}: {a} names another job than {job.id}"
            if a[0] == "409":
                assert a[2] != stored, f"round {r}: 409 for the same payload"
            elif a[0] == "one":
                assert a[2] == stored == a[4], f"round {r}: {a} accepted a different payload"
