"""One handler contract, held by every executor on both databases: the
thread executor, the pool's event loop (``async def`` handlers) and the
process executor each complete, fail and retry, dead-letter, time out, are
cancelled, snooze, perform an effect once, keep log lines and artifacts,
give a running job back at shutdown, and never let a late result land. Each
step is written once; the parametrization supplies the executor (the
handlers are ``tests.contract_handlers``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jobdeck.core.states import AttemptOutcome, EffectState, State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for
from jobdeck.store.artifacts import get_artifact
from jobdeck.store.joblogs import lines_of
from jobdeck.worker.pool import WorkerPool

from tests import contract_handlers
from tests.adversarial.cli_process import exited
from tests.conftest import wait_for

pytestmark = pytest.mark.backends

WAIT = 30.0
"""Deadline of each wait: a child's start on a loaded machine takes seconds."""


class Contract:
    """A deck whose contract types run on one executor, and the files its handlers leave."""

    def __init__(self, deck: Jobdeck, executor: str, folder: Path) -> None:
        self.deck, self.executor, self.folder = deck, executor, folder

    def enqueue(self, job_type: str, **payload: Any) -> int:
        return self.deck.enqueue(job_type, {"dir": str(self.folder), **payload}).job.id

    @contextmanager
    def running(self, grace: float = 2.0) -> Iterator[WorkerPool]:
        pool = pool_for(self.deck, 2)
        pool.start()
        try:
            yield pool
        finally:
            pool.stop(grace)
            self.go()  # a thread's handler left running ends
        self.no_child_left(pool)

    def no_child_left(self, pool: WorkerPool) -> None:
        children = pool.executors.children
        assert (children is not None) == (self.executor == "process"), "children only for the process executor"
        assert children is None or children.pids() == [], "a stopped pool keeps no child"

    def ends(self, job_id: int, *states: State) -> Any:
        return wait_for(
            lambda: (job := self.deck.store.get(job_id)).status in states and job,
            timeout=WAIT,
            message=f"job {job_id} ends {'/'.join(s.value for s in states)}",
        )

    def started(self) -> int:
        """The pid of the process the held handler runs in, once it started."""
        mark = self.folder / "started"
        return int(wait_for(lambda: mark.exists() and mark.read_text(), timeout=WAIT, message="the handler starts"))

    def go(self) -> None:
        (self.folder / "go").touch()

    def finished(self) -> bool:
        return (self.folder / "finished").exists()

    def outcomes(self, job_id: int) -> list[AttemptOutcome]:
        """How each attempt ended. Each row of an attempt the pool finished
        names this executor; one released or rescued names none."""
        rows = self.deck.store.attempts_of(job_id)
        unfinished = (AttemptOutcome.STALLED, AttemptOutcome.INTERRUPTED)
        ran_on = [a.executor for a in rows if a.outcome not in unfinished]
        assert ran_on == [self.executor] * len(ran_on), ran_on
        return [a.outcome for a in rows]


@pytest.fixture(params=["thread", "async", pytest.param("process", marks=pytest.mark.slow)])
def contract(request: pytest.FixtureRequest, make_config: Callable[..., Any], tmp_path: Path) -> Iterator[Contract]:
    registry = Registry()
    contract_handlers.register(registry, request.param)
    # A long stall_timeout: no step checks the lease (the rescue step sweeps as of
    # an hour later), and a test process starved of CPU (CI's quick tiers run at
    # the lowest priority) must not lose it and release the job mid-step.
    config = make_config(
        process_workers=1, handler_modules=["tests.contract_handlers"], shutdown_grace=0.2, cancel_grace=0.5,
        stall_timeout=60,
    )  # fmt: skip
    deck = Jobdeck(config, registry)
    deck.init_db()
    folder = tmp_path / "marks"
    folder.mkdir()
    yield Contract(deck, request.param, folder)
    deck.store.engine.dispose()


def test_a_result_is_stored(contract: Contract) -> None:
    job = contract.enqueue("contract.echo", value=[1, "two", {"three": 3}])
    with contract.running():
        done = contract.ends(job, State.COMPLETED)
    assert done.result["echo"] == [1, "two", {"three": 3}]
    assert (done.result["pid"] != os.getpid()) == (contract.executor == "process")
    assert contract.outcomes(job) == [AttemptOutcome.COMPLETED]


def test_a_failure_is_retried_and_its_error_kept(contract: Contract) -> None:
    job = contract.enqueue("contract.flaky", failures=1)
    with contract.running():
        done = contract.ends(job, State.COMPLETED)
    assert (done.result, done.retry_count) == (2, 1)
    assert contract.outcomes(job) == [AttemptOutcome.FAILED, AttemptOutcome.COMPLETED]
    first, _ = contract.deck.store.attempts_of(job)
    assert first.error == "ConnectionError: run 1 lost the connection"
    assert "Traceback" in (first.traceback or "") and "flaky" in (first.traceback or "")


def test_a_dead_letter_is_not_retried(contract: Contract) -> None:
    job = contract.enqueue("contract.refuses", customer=42)
    with contract.running():
        dead = contract.ends(job, State.DEAD)
    assert dead.retry_count == 0, "retries were left, and none was used"
    assert (dead.error or "").startswith("DeadLetter: no such customer 42")
    assert contract.outcomes(job) == [AttemptOutcome.FAILED]


def test_past_its_timeout_the_attempt_fails_and_its_late_result_is_refused(contract: Contract) -> None:
    job = contract.enqueue("contract.hangs", deaf=True)
    with contract.running() as pool:
        pid = contract.started()
        dead = contract.ends(job, State.DEAD)
        assert (dead.error or "").startswith("timed out after 0.5 s")
        if contract.executor == "process":
            assert dead.error == "timed out after 0.5 s; worker process killed"
            wait_for(lambda: exited(pid), timeout=5, message="the timed-out child is gone")
        if contract.executor == "async":
            # The task's cancel runs on the loop's thread, which a starved
            # machine can run after the failure is recorded: "go" written
            # first let the handler finish (seen in CI's quick tier).
            stopped = contract.folder / "stopped"
            wait_for(stopped.exists, timeout=WAIT, message="the timed-out handler's task is cancelled")
        contract.go()
        wait_for(lambda: job not in pool.running_jobs(), timeout=WAIT, message="the attempt is over")
        if contract.executor == "thread":  # a thread cannot be killed: its handler ran on, and its result came late
            wait_for(contract.finished, timeout=WAIT, message="the abandoned handler returns")
        else:
            assert not contract.finished(), "the handler was stopped, not left running"
        after = contract.deck.enqueue("contract.echo", {"value": 1}).job.id
        contract.ends(after, State.COMPLETED)
    final = contract.deck.store.get(job)
    assert final.status is State.DEAD and final.result is None
    assert contract.outcomes(job) == [AttemptOutcome.TIMED_OUT]


def test_a_handler_past_its_timeout_is_stopped_or_told(contract: Contract) -> None:
    job = contract.enqueue("contract.hangs")
    with contract.running():
        pid = contract.started()
        dead = contract.ends(job, State.DEAD)
        if contract.executor == "process":
            wait_for(lambda: exited(pid), timeout=5, message="the timed-out child is gone")
        else:  # a thread cannot be killed: its handler is told, and stops if it listens
            stopped = contract.folder / "stopped"
            told = wait_for(lambda: stopped.exists() and stopped.read_text(), timeout=WAIT, message="it is told")
            assert told == "timed out"
    assert not contract.finished()
    assert (dead.error or "").startswith("timed out after 0.5 s") and dead.result is None
    assert contract.outcomes(job) == [AttemptOutcome.TIMED_OUT]


def test_a_cancel_stops_a_running_handler_and_the_job_ends_cancelled(contract: Contract) -> None:
    job = contract.enqueue("contract.hold")
    with contract.running():
        contract.started()
        contract.deck.cancel(job, "tester")
        cancelled = contract.ends(job, State.CANCELLED)
    assert not contract.finished(), "the handler stopped at the cancel"
    assert (cancelled.retry_count, cancelled.result) == (0, None)
    assert contract.outcomes(job) == [AttemptOutcome.CANCELLED]


def test_a_snooze_puts_the_job_off_without_a_retry_counted(contract: Contract) -> None:
    job = contract.enqueue("contract.snoozes")
    with contract.running():
        done = contract.ends(job, State.COMPLETED)
    assert (done.result, done.retry_count) == (2, 0)
    assert contract.outcomes(job) == [AttemptOutcome.SNOOZED, AttemptOutcome.COMPLETED]
    snoozed, _ = contract.deck.store.attempts_of(job)
    assert snoozed.snooze_seconds == 0.05


def test_an_effect_is_performed_once_and_an_unknown_outcome_is_left_for_a_person(contract: Contract) -> None:
    paid = contract.enqueue("contract.charges", key="charge:1")
    lost = contract.enqueue("contract.charges", key="charge:2", no_answer=True)
    with contract.running():
        done = contract.ends(paid, State.COMPLETED)
        dead = contract.ends(lost, State.DEAD)
    assert sorted((contract.folder / "charges").read_text().split()) == ["charge:1", "charge:2"], "each ran once"
    assert done.result == {"receipt": "charge:1"} and done.retry_count == 1
    assert contract.outcomes(paid) == [AttemptOutcome.FAILED, AttemptOutcome.COMPLETED]
    assert contract.outcomes(lost) == [AttemptOutcome.FAILED, AttemptOutcome.FAILED]
    record = contract.deck.store.ledger.get("charge:1")
    assert (record.state, record.job_id, record.attempt) == (EffectState.DONE, paid, 1)
    assert record.result == {"receipt": "charge:1"} and record.finished_at is not None
    assert "EffectOutcomeUnknown" in (dead.error or "") and dead.retry_count == 1
    unknown = contract.deck.store.ledger.get("charge:2")
    assert (unknown.state, unknown.attempt) == (EffectState.STARTED, 1), "started, never said done"


def test_an_async_effect_is_performed_once_while_the_handler_s_other_tasks_run(contract: Contract) -> None:
    job = contract.enqueue("contract.aeffects", key="charge:async")
    with contract.running():
        done = contract.ends(job, State.COMPLETED)
    assert done.result["first"] == done.result["again"] == {"receipt": "charge:async"}
    assert done.result["ticked"], "the handler's other task ran while the effect was recorded"
    assert (done.result["pid"] != os.getpid()) == (contract.executor == "process")
    assert (contract.folder / "charges").read_text().split() == ["charge:async"], "performed once"
    record = contract.deck.store.ledger.get("charge:async")
    assert (record.state, record.job_id, record.result) == (EffectState.DONE, job, {"receipt": "charge:async"})


def test_ctx_names_its_batch_and_the_deprecated_once_still_holds(contract: Contract) -> None:
    batch = contract.deck.batch()
    inside = batch.add("contract.surface", {"dir": str(contract.folder), "key": "once:in"})
    batch.close()
    with contract.running():  # one at a time: the handler's catch_warnings is process-wide
        found = contract.ends(inside, State.COMPLETED).result
        alone = contract.enqueue("contract.surface", key="once:alone")
        outside = contract.ends(alone, State.COMPLETED).result
    assert found == {"batch_id": batch.id, "once": [True, False], "warned": 2}
    assert outside == {"batch_id": None, "once": [True, False], "warned": 2}
    assert contract.outcomes(inside) == [AttemptOutcome.COMPLETED]
    assert contract.deck.store.ledger.get("once:in").state is EffectState.DONE


def test_log_lines_and_progress_are_kept_with_the_attempt(contract: Contract) -> None:
    job = contract.enqueue("contract.logs", name="report")
    with contract.running():
        done = contract.ends(job, State.COMPLETED)
    assert done.progress_message == "half way"
    lines = [(line.attempt, line.level, line.message) for line in lines_of(contract.deck.store, job)]
    expected = [(1, "info", f"line {n} of report") for n in range(3)] + [(1, "warning", "the last one")]
    assert lines == expected


def test_artifacts_are_kept(contract: Contract) -> None:
    job = contract.enqueue("contract.keeps")
    with contract.running():
        done = contract.ends(job, State.COMPLETED)
    assert done.result == 8
    assert get_artifact(contract.deck.store, job, "report.csv").data == b"a,b\n1,2\n"
    assert get_artifact(contract.deck.store, job, "chart.bin").data == bytes(range(256))


def test_a_running_job_is_given_back_when_the_pool_stops_past_its_grace(contract: Contract) -> None:
    job = contract.enqueue("contract.hold")
    pool = pool_for(contract.deck, 2)
    pool.start()
    try:
        pid = contract.started()
    finally:
        pool.stop()  # shutdown_grace: 0.2 s
    released = contract.deck.store.get(job)
    assert released.status is State.PENDING and (released.retry_count, released.worker_id) == (0, None)
    assert contract.outcomes(job) == [AttemptOutcome.INTERRUPTED]
    contract.no_child_left(pool)
    if contract.executor == "process":
        wait_for(lambda: exited(pid), timeout=5, message="the released job's child is gone")
    else:  # a thread cannot be killed: its handler is told, and stops if it listens
        stopped = contract.folder / "stopped"
        told = wait_for(lambda: stopped.exists() and stopped.read_text(), timeout=WAIT, message="the handler is told")
        assert told == "released at shutdown"
    assert not contract.finished()
    contract.go()
    with contract.running():  # given back, it runs again
        assert contract.ends(job, State.COMPLETED).result == 2, "the attempt after the released one"


def test_a_result_after_the_job_was_rescued_elsewhere_is_refused(contract: Contract) -> None:
    """Rescued by another process's sweep while its handler runs, then retried
    by a person and claimed again by the same pool: the first attempt's result
    must complete neither the job nor the attempt that holds it now."""
    job = contract.enqueue("contract.hold")
    with contract.running():
        contract.started()
        # The sweep of a process that sees the lease long gone. It skips a row
        # a heartbeat holds locked (PostgreSQL): the next sweep takes it.
        later = contract.deck.clock() + timedelta(hours=1)
        sweep = contract.deck.store.rescue_stalled
        rescued = wait_for(lambda: sweep(later, stall_timeout=60), timeout=WAIT, message="the sweep rescues it")
        assert [j.id for j in rescued] == [job]
        contract.deck.store.retry(job, contract.deck.clock())
        wait_for(lambda: contract.deck.store.get(job).attempt == 2, timeout=WAIT, message="claimed again")
        contract.go()  # the first attempt returns 1, then the second returns 2
        done = contract.ends(job, State.COMPLETED)
    assert done.result == 2, "the first attempt's late result did not land"
    assert contract.outcomes(job) == [AttemptOutcome.STALLED, AttemptOutcome.COMPLETED]
    assert contract.deck.store.attempts_of(job)[1].attempt == 2


def test_a_child_s_ctx_offers_what_a_thread_s_and_the_loop_s_ctx_offer() -> None:
    """Every public name of ``JobContext`` and ``AsyncJobContext`` is on the
    child's context too, but ``store``: the child never opens the database."""
    from jobdeck.jobs.async_context import AsyncJobContext
    from jobdeck.worker.child_context import ChildContext

    def public(thing: object) -> set[str]:
        return {name for name in dir(thing) if not name.startswith("_")}

    set_in_init = {"store", "job_id", "attempt", "retries", "worker_id", "type", "log", "cancelled", "trace"}
    wanted = public(AsyncJobContext) | set_in_init
    job = {"id": 1, "attempt": 1, "retries": 0, "type": "t", "worker_id": "w"}
    offered = public(ChildContext(SimpleNamespace(ctx=None), job))  # type: ignore[arg-type]
    assert wanted - offered == {"store"}
