"""The process executor, on both databases, with real child processes: a
handler in a child completes, fails, snoozes, performs an effect once, is
cancelled, times out and crashes, and each time the job says why and the
pool carries on with a fresh child (``jobdeck.worker.process_run``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.config import ConfigError
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for
from jobdeck.store.artifacts import get_artifact
from jobdeck.store.joblogs import lines_of
from jobdeck.worker import process_run
from jobdeck.worker.pool import WorkerPool

from tests import process_handlers
from tests.adversarial.cli_process import exited
from tests.conftest import wait_for

pytestmark = [pytest.mark.backends, pytest.mark.slow]  # child interpreters: left out of the quick tier


@pytest.fixture
def proc_deck(make_config: Callable[..., Any]) -> Iterator[Callable[..., Jobdeck]]:
    made: list[Jobdeck] = []

    def make(options: dict[str, dict[str, Any]] | None = None, **config: Any) -> Jobdeck:
        registry = Registry()
        process_handlers.register(registry, **(options or {}))
        deck = Jobdeck(make_config(**{"process_workers": 2, **config}), registry)
        deck.init_db()
        made.append(deck)
        return deck

    yield make
    for deck in made:
        deck.store.engine.dispose()


@contextmanager
def running(deck: Jobdeck, threads: int = 2) -> Iterator[WorkerPool]:
    pool = pool_for(deck, threads)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop(2.0)
    children = pool.executors.children
    assert children is not None and children.pids() == [], "a stopped pool keeps no child"


def ends(deck: Jobdeck, job_id: int, *states: State, timeout: float = 60.0) -> Any:
    return wait_for(
        lambda: (job := deck.store.get(job_id)).status in states and job,
        timeout=timeout,
        message=f"job {job_id} ends {'/'.join(s.value for s in states)}",
    )


def pid_in(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text(), timeout=60, message=f"{path.name} is written"))


def test_a_handler_runs_in_a_child_and_its_result_logs_and_progress_reach_the_job(proc_deck) -> None:
    deck = proc_deck()
    ok = deck.enqueue("proc.echo", {"value": [1, "two"]}).job
    bad = deck.enqueue("proc.fails", {"message": "no such customer"}).job
    with running(deck):
        done = ends(deck, ok.id, State.COMPLETED)
        dead = ends(deck, bad.id, State.DEAD)
    assert done.result["echo"] == [1, "two"]
    assert done.result["pid"] != os.getpid(), "the handler ran in another process"
    assert any(f"running in {done.result['pid']}" in line.message for line in lines_of(deck.store, ok.id))
    assert done.progress_message == "half way", "the progress the child reported was written"
    assert dead.error.startswith("ValueError: no such customer")
    assert "Traceback" in (deck.store.attempts_of(bad.id)[-1].traceback or "")
    assert [a.executor for a in deck.store.attempts_of(ok.id) + deck.store.attempts_of(bad.id)] == ["process"] * 2


def test_an_async_handler_in_a_child_runs_on_a_loop_of_its_own(proc_deck) -> None:
    deck = proc_deck()
    job = deck.enqueue("proc.awaits", {}).job
    with running(deck) as pool:
        done = ends(deck, job.id, State.COMPLETED)
        assert pool.executors.loop is None, "the pool's own loop never started"
    assert done.result["pid"] != os.getpid()


def test_the_config_chooses_the_executor_by_type_or_queue(proc_deck) -> None:
    deck = proc_deck(types={"plain.by-type": {"executor": "process"}}, queues={"isolated": {"executor": "process"}})
    deck.registry.handler("plain.by-type")(process_handlers.plain)
    deck.registry.handler("plain.by-queue", queue="isolated")(process_handlers.plain)
    deck.registry.handler("plain.here")(process_handlers.plain)
    jobs = {name: deck.enqueue(name, {}).job for name in ("plain.by-type", "plain.by-queue", "plain.here")}
    with running(deck):
        pids = {name: ends(deck, job.id, State.COMPLETED).result for name, job in jobs.items()}
    assert pids["plain.by-type"] != os.getpid() and pids["plain.by-queue"] != os.getpid()
    assert pids["plain.here"] == os.getpid()
    executors = {name: deck.store.attempts_of(job.id)[0].executor for name, job in jobs.items()}
    assert executors == {"plain.by-type": "process", "plain.by-queue": "process", "plain.here": "thread"}


def test_max_jobs_per_child_replaces_a_child_after_so_many_jobs(proc_deck) -> None:
    deck = proc_deck(process_workers=1, max_jobs_per_child=2)
    ids = [deck.enqueue("proc.echo", {"value": n}).job.id for n in range(4)]
    with running(deck, threads=1) as pool:
        pids = [ends(deck, i, State.COMPLETED).result["pid"] for i in ids]
        assert pool.executors.children.restarts["recycled"] == 2
    assert pids[0] == pids[1] != pids[2] == pids[3]


def test_a_thread_left_behind_by_a_handler_never_writes_into_the_next_job(proc_deck) -> None:
    deck = proc_deck(process_workers=1)
    first = deck.enqueue("proc.leaves", {}).job
    then = [deck.enqueue("proc.sleeps", {"seconds": 0.2}).job for _ in range(3)]
    with running(deck, threads=1):
        for job in then:
            ends(deck, job.id, State.COMPLETED)
    assert deck.store.get(first.id).status is State.COMPLETED
    for job in then:
        assert not [line for line in lines_of(deck.store, job.id) if "left behind" in line.message]
        assert deck.store.get(job.id).progress_message is None


def test_artifacts_from_a_child_are_kept_by_the_parent_and_a_bad_name_is_not_retried(proc_deck, tmp_path) -> None:
    deck = proc_deck({"proc.files": {"max_retries": 2}})
    good = deck.enqueue("proc.files", {"dir": str(tmp_path)}).job
    bad = deck.enqueue("proc.files", {"dir": str(tmp_path), "bad_name": True}).job
    with running(deck):
        ends(deck, good.id, State.COMPLETED)
        refused = ends(deck, bad.id, State.DEAD)
    assert get_artifact(deck.store, good.id, "report.csv").data == b"a,b\n1,2\n"
    assert get_artifact(deck.store, good.id, "chart.bin").data == bytes(range(256))
    assert refused.retry_count == 0 and "escape.txt" in refused.error


def test_a_result_that_is_not_json_fails_the_attempt_as_on_a_thread(proc_deck) -> None:
    deck = proc_deck({"proc.set": {"max_retries": 2}})
    job = deck.enqueue("proc.set", {}).job
    with running(deck):
        dead = ends(deck, job.id, State.DEAD)
    assert 'result["tags"]: set is not JSON' in dead.error and dead.retry_count == 0


def test_non_retryable_by_class_name_holds_for_an_error_raised_in_a_child(proc_deck) -> None:
    deck = proc_deck({"proc.fails": {"max_retries": 3}}, types={"proc.fails": {"non_retryable": ["ValueError"]}})
    job = deck.enqueue("proc.fails", {}).job
    with running(deck):
        dead = ends(deck, job.id, State.DEAD)
    assert dead.retry_count == 0 and "not retried: ValueError is non-retryable" in dead.error


def test_past_its_timeout_the_child_is_killed_and_a_fresh_one_runs_the_next_job(proc_deck, tmp_path: Path) -> None:
    deck = proc_deck({"proc.sleeps": {"timeout": 1}})
    job = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "sleeper"), "ignore_cancel": True}).job
    with running(deck) as pool:
        child = pid_in(tmp_path / "sleeper")
        failed = ends(deck, job.id, State.DEAD)
        assert failed.error == "timed out after 1 s; worker process killed"
        assert deck.store.attempts_of(job.id)[0].executor == "process"
        wait_for(lambda: exited(child), timeout=5, message="the timed-out child is gone")
        after = deck.enqueue("proc.echo", {"value": 1}).job
        assert ends(deck, after.id, State.COMPLETED).result["pid"] != child
        assert pool.executors.children.restarts["timeout"] == 1
        assert pool.monitor.abandoned_threads() == 0, "no thread is left behind"


def test_a_child_that_crashes_fails_its_job_with_how_it_ended(proc_deck) -> None:
    deck = proc_deck()
    segv = deck.enqueue("proc.segfaults", {}).job
    exit7 = deck.enqueue("proc.exits", {"code": 7}).job
    with running(deck) as pool:
        assert ends(deck, segv.id, State.DEAD).error == "worker process exited with signal 11 (SIGSEGV)"
        assert ends(deck, exit7.id, State.DEAD).error == "worker process exited with exit code 7"
        after = deck.enqueue("proc.echo", {"value": 2}).job
        assert ends(deck, after.id, State.COMPLETED).result["echo"] == 2
        assert pool.executors.children.restarts["crash"] == 2


class Garbled:
    """Pickles here; unpickling it in the child calls ``int("garbled")``, which raises there."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, ("garbled",))


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda call_id: ("reply", call_id, True, Garbled()), "ValueError: invalid literal for int()"),
        (lambda call_id: 42, "TypeError: 'int' object is not subscriptable"),
    ],
    ids=["unpicklable", "malformed"],
)
def test_a_message_the_child_cannot_read_fails_the_job_at_once(proc_deck, tmp_path, monkeypatch, answer, why) -> None:
    """Its pipe reader used to die on it, and the handler waited for the lost
    answer until its timeout: now the job fails at once, saying why, and the
    child is replaced."""
    deck = proc_deck({"proc.charges": {"timeout": 600}})
    answered = process_run._call

    def garbles(child: Any, ctx: Any, call_id: int, name: str, args: tuple[Any, ...]) -> None:
        if name != "effect_begin":
            return answered(child, ctx, call_id, name, args)
        child.conn.send(answer(call_id))

    monkeypatch.setattr(process_run, "_call", garbles)
    mark = tmp_path / "charges"
    job = deck.enqueue("proc.charges", {"order": 7, "mark": str(mark)}).job
    with running(deck) as pool:
        failed = ends(deck, job.id, State.DEAD, timeout=60)  # long before its 600 s timeout
        assert pool.executors.children.restarts["crash"] == 1
        after = deck.enqueue("proc.echo", {"value": 3}).job
        assert ends(deck, after.id, State.COMPLETED).result["echo"] == 3
    assert failed.error.startswith("the worker process could not read a message from the pool (" + why)
    assert not mark.exists(), "the effect was never performed"


def test_a_snooze_in_a_child_snoozes_the_job(proc_deck) -> None:
    deck = proc_deck()
    job = deck.enqueue("proc.snoozes", {}).job
    with running(deck):
        wait_for(lambda: deck.store.attempts_of(job.id), timeout=60, message="the attempt is recorded")
    snoozed = deck.store.get(job.id)
    assert snoozed.status is State.PENDING and snoozed.available_at > deck.clock()
    assert snoozed.retry_count == 0
    assert deck.store.attempts_of(job.id)[0].snooze_seconds == 30


def test_an_effect_in_a_child_is_recorded_by_the_parent_and_performed_once(proc_deck, tmp_path: Path) -> None:
    deck = proc_deck({"proc.charges": {"max_retries": 1, "backoff_base": 0.01, "backoff_cap": 0.01}})
    mark = tmp_path / "charges"
    first = deck.enqueue("proc.charges", {"order": 42, "mark": str(mark), "then_fail": True}).job
    with running(deck):
        ends(deck, first.id, State.DEAD)
    assert mark.read_text() == "charged\n", "the retry found the effect done and skipped it"
    assert [a.error for a in deck.store.attempts_of(first.id)] == ["ConnectionError: the reply was lost"] * 2


def test_cancel_sets_ctx_cancelled_in_the_child_and_a_deaf_handler_is_killed(proc_deck, tmp_path: Path) -> None:
    deck = proc_deck(cancel_grace=0.5)
    polite = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "polite")}).job
    deaf = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "deaf"), "ignore_cancel": True}).job
    with running(deck) as pool:
        pid_in(tmp_path / "polite")
        deaf_pid = pid_in(tmp_path / "deaf")
        deck.cancel(polite.id, "test")
        deck.cancel(deaf.id, "test")
        ends(deck, polite.id, State.CANCELLED)
        ends(deck, deaf.id, State.CANCELLED)
        wait_for(lambda: exited(deaf_pid), timeout=5, message="the deaf handler's child is killed")
        assert pool.executors.children.restarts["cancel"] == 1


def test_at_the_end_of_the_grace_a_stop_releases_the_job_and_kills_its_child(proc_deck, tmp_path: Path) -> None:
    deck = proc_deck()
    job = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "long"), "ignore_cancel": True}).job
    pool = pool_for(deck, 2)
    pool.start()
    child = pid_in(tmp_path / "long")
    pool.stop(0.2)
    assert deck.store.get(job.id).status is State.PENDING
    wait_for(lambda: exited(child), timeout=5, message="the released job's child is gone")


def test_a_handler_the_child_cannot_import_by_name_fails_and_says_why(proc_deck) -> None:
    deck = proc_deck()
    process_handlers.local_handler_type(deck.registry)
    job = deck.enqueue("proc.local", {}).job
    with running(deck):
        dead = ends(deck, job.id, State.DEAD)
    assert "not importable by name" in dead.error and "handler_modules" in dead.error


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"types": {"t": {"executor": "processes"}}}, 'types.t.executor: expected "thread" or "process"'),
        ({"queues": {"q": {"memory_limit": "1 MiB"}}}, "queues.q.memory_limit: expected a size of at least 32 MiB"),
        ({"types": {"t": {"executor": "thread", "memory_limit": "1 GiB"}}}, 'set executor = "process"'),
    ],
)
def test_bad_process_options_are_refused_at_load(make_config, table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        make_config(**table)


def test_an_unknown_executor_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="executor must be one of thread, process"):
        Registry().handler("t", executor="fork")
