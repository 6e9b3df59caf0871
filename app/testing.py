"""Test your handlers against the real thing, cheaply: ``HandlerTest`` runs
them through a real worker pool, with a real context, on a throwaway SQLite
file and a clock you move by hand::

    from jobdeck.testing import HandlerTest

    with HandlerTest() as jobs:
        run = jobs.run(charge, order_id=7)
        assert run.status == "completed" and run.result == {"charged": 7}
        assert run.logs == ["charging order 7"] and "charge:7" in run.effects

Nothing is faked: the job is enqueued, claimed, run and acknowledged as in
production, so what a handler's ``ctx`` does (effects, logs, snooze,
progress, artifacts, a cancel) is in the database for the test to read. The
clock is the deck's injected clock: it stands still until ``clock.advance``,
so a snoozed job, or a failed one waiting for its retry, waits until the test
moves time past it, and never runs again by itself. A handle's ``.enqueue``
inside the block goes to this deck (``jobdeck.use_deck``)."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobdeck.core.config import load
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.jobs.handlers import registry as default_registry
from jobdeck.jobs.handles import Handle, use_deck
from jobdeck.runtime import pool_for
from jobdeck.store import JobRecord
from jobdeck.store.artifacts import artifacts_of, get_artifact
from jobdeck.store.effect_records import EffectRecord
from jobdeck.store.joblogs import lines_of
from jobdeck.store.records import AttemptRecord
from jobdeck.worker.pool import WorkerPool

__all__ = ["HandlerTest", "Run", "TestClock"]

START = datetime(2030, 1, 1, tzinfo=UTC)
"""Where a test's clock starts unless told otherwise: a fixed time, so a
test reads the same on any day."""


class TestClock:
    """A UTC clock that moves only when told (the deck's injected clock)."""

    __test__ = False  # not a test class, whatever pytest's collector thinks of its name

    def __init__(self, now: datetime = START) -> None:
        if now.tzinfo is None:
            raise ValueError("the clock's time must be timezone-aware (UTC)")
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float = 0, **units: float) -> datetime:
        """Move forward by ``seconds`` and any ``timedelta`` units (``minutes=5``)."""
        self.now += timedelta(seconds=seconds, **units)
        return self.now


@dataclass(frozen=True)
class Run:
    """A job as its last attempt left it, with what the handler did."""

    job: JobRecord
    attempts: list[AttemptRecord]
    logs: list[str]
    """The job's log lines (``ctx.log``, and captured logging), every attempt's, in order."""
    effects: dict[str, EffectRecord]
    """The effects its attempts recorded (``ctx.effect``), by key."""
    artifacts: dict[str, bytes]
    """What its attempts kept with ``ctx.artifact``, by name."""

    @property
    def status(self) -> State:
        return self.job.status

    @property
    def result(self) -> Any:
        return self.job.result

    @property
    def error(self) -> str | None:
        return self.job.error

    @property
    def snoozed(self) -> float | None:
        """Seconds the last attempt snoozed for (None: it did not snooze)."""
        last = self.attempts[-1] if self.attempts else None
        return last.snooze_seconds if last is not None and last.outcome is AttemptOutcome.SNOOZED else None


class HandlerTest:
    """A throwaway deck and a worker pool for handler tests; a context
    manager, cleaned up (pool stopped, file deleted) when it ends.

    ``registry``: the handlers it runs (default: those ``@handler``
    registered); ``now``: where the clock starts; ``threads``: the pool's
    threads; ``config``: config keys, as in ``jobdeck.toml``
    (``types={"t": {...}}``, ``max_result_bytes=...``)."""

    __test__ = False

    def __init__(
        self, registry: Registry | None = None, *, now: datetime = START, threads: int = 2, **config: Any
    ) -> None:
        self.clock = TestClock(now)
        self._folder = Path(tempfile.mkdtemp(prefix="jobdeck-test-"))
        values = {
            "database_url": f"sqlite:///{self._folder / 'jobdeck.db'}",
            "instance_path": str(self._folder / "instance"),
            "poll_interval": 0.02,
            "secret_key": "handler-test",
            **config,
        }
        try:
            self.deck = Jobdeck(
                load(path=None, env={}, overrides=values), registry or default_registry, clock=self.clock
            )
            self.deck.init_db()
        except BaseException:  # a refused config key: no folder left behind
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self.threads = threads
        self._pool: WorkerPool | None = None
        self._before = use_deck(self.deck)

    def __enter__(self) -> HandlerTest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pool (a running job is released), close the database and delete its file."""
        if self._pool is not None:
            self._pool.stop(grace=2.0)
            self._pool = None
        use_deck(self._before)
        self.deck.store.engine.dispose()
        shutil.rmtree(self._folder, ignore_errors=True)

    @property
    def pool(self) -> WorkerPool:
        """The worker pool, started by the first job."""
        if self._pool is None:
            self._pool = pool_for(self.deck, self.threads)
            self._pool.start()
        return self._pool

    def start(self, target: Handle[..., Any] | str, payload: Any = None, /, **options: Any) -> JobRecord:
        """Enqueue a job of ``target`` (a handle, or a type's name) and let
        the pool take it; ``options`` are the handle's ``enqueue`` options and
        payload fields, or ``deck.enqueue``'s options for a type's name."""
        if isinstance(target, Handle):
            job = target.enqueue(payload, deck=self.deck, **options).job
        else:
            job = self.deck.enqueue(target, payload, **options).job
        self.pool  # noqa: B018  # started, to run it
        return job

    def run(self, target: Handle[..., Any] | str, payload: Any = None, /, **options: Any) -> Run:
        """Enqueue a job and wait until its attempt ends (``start``, then ``wait``)."""
        return self.wait(self.start(target, payload, **options))

    def wait(self, job: JobRecord | int, timeout: float = 10.0) -> Run:
        """Wait until the job is neither running nor due at the clock's time
        (its attempt ended: completed, failed or snoozed until later, dead,
        cancelled), then read what it left. Raises ``TimeoutError`` when
        it is still running or due after ``timeout`` seconds."""
        job_id = job if isinstance(job, int) else job.id
        self.pool  # noqa: B018
        deadline = time.monotonic() + timeout
        while not self._settled(record := self.deck.store.get(job_id)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} ({record.type}) is still {record.status.value} after {timeout:g} s")
            time.sleep(0.01)
        return self.read(job_id)

    def wait_running(self, job: JobRecord | int, timeout: float = 10.0) -> JobRecord:
        """Wait until a worker runs the job: to cancel it while it runs."""
        job_id = job if isinstance(job, int) else job.id
        deadline = time.monotonic() + timeout
        while (record := self.deck.store.get(job_id)).status is not State.RUNNING:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} ({record.type}) is {record.status.value}, not running")
            time.sleep(0.01)
        return record

    def cancel(self, job: JobRecord | int) -> JobRecord:
        """Cancel the job as an operator would: a running one has its ``ctx.cancelled`` set."""
        return self.deck.cancel(job if isinstance(job, int) else job.id, "a test")

    def read(self, job_id: int) -> Run:
        """The job as it is now, and what its attempts left."""
        store = self.deck.store
        effects = {record.key: record for record in store.ledger.of_job(job_id)}
        artifacts = {a.name: get_artifact(store, job_id, a.name).data for a in artifacts_of(store, job_id)}
        logs = [line.message for line in lines_of(store, job_id)]
        return Run(store.get(job_id), store.attempts_of(job_id), logs, effects, artifacts)

    def _settled(self, job: JobRecord) -> bool:
        if job.status is State.RUNNING:
            return False
        due = job.status in (State.PENDING, State.FAILED) and job.available_at <= self.clock()
        return not due
