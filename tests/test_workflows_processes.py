"""Workflows and batches across two real ``python -m jobdeck.cli worker``
processes on one database, SQLite and PostgreSQL: the promotion happens
exactly once and only after every dependency completed, a dead dependency
cancels or holds its dependents, and a batch acknowledged by both processes
at once fires its callback exactly once. The handlers
(``tests.workflow_handlers``) record every run with its process and times;
the attempts table must agree with them."""

from __future__ import annotations

import subprocess
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import AttemptOutcome, State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.store.models import attempts, job_dependencies, jobs, workers, workflows
from sqlalchemy import func, select

from tests import workflow_handlers
from tests.conftest import wait_for
from tests.worker_processes import start_workers, stop, write_config
from tests.workflow_handlers import CALLBACK, STEP, read_log

pytestmark = [pytest.mark.backends, pytest.mark.slow]

DIAMONDS = 50
BATCH = 1000


@pytest.fixture
def wdeck(make_deck: Callable[..., Jobdeck], registry: Registry) -> Jobdeck:
    """A Jobdeck on the test database, on real time (the workers' clock),
    that knows the recording job types."""
    workflow_handlers.register(registry)
    return make_deck()


def _workers(db_url: str, tmp_path: Path, deck: Jobdeck) -> list[subprocess.Popen[bytes]]:
    """Two worker processes of four threads each, up and heart-beating. A
    claim takes at most 10 jobs, so that one process cannot take a whole
    batch in a claim or two while the other waits."""
    settings = (
        'secret_key = "s"\nworkers = 4\nclaim_batch = 10\npoll_interval = 0.05\nheartbeat_interval = 0.5\n'
        'stall_timeout = 10\nshutdown_grace = 5.0\nhandler_modules = ["tests.workflow_handlers"]\n'
    )
    procs = start_workers(write_config(db_url, tmp_path, settings), 2)

    def up() -> bool:
        _alive(procs)
        with deck.store.read() as conn:
            return conn.execute(select(func.count()).where(workers.c.stopped_at.is_(None))).scalar_one() >= 2

    try:
        wait_for(up, timeout=60, interval=0.1, message="both worker processes up")
    except BaseException:
        stop(procs)
        raise
    return procs


def _alive(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        assert p.poll() is None, f"worker {p.pid} exited with {p.returncode}"


def _statuses(deck: Jobdeck, ids: list[int]) -> dict[int, State]:
    with deck.store.read() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(ids))).all()
    return {job_id: State(status) for job_id, status in rows}


def _attempts(deck: Jobdeck, ids: list[int]) -> dict[int, list[Any]]:
    """Each job's attempt rows, in order."""
    stmt = select(attempts).where(attempts.c.job_id.in_(ids)).order_by(attempts.c.id)
    found: dict[int, list[Any]] = defaultdict(list)
    with deck.store.read() as conn:
        for row in conn.execute(stmt):
            found[row.job_id].append(row)
    return found


def _diamond(deck: Jobdeck, log: Path, wf: int, *, fail_b: bool = False, **kw: Any) -> Any:
    def payload(step: str, **more: Any) -> dict[str, Any]:
        return {"log": str(log), "wf": wf, "step": step, **more}

    return (
        deck.workflow(f"diamond-{wf}", **kw)
        .add("a", STEP, payload("a"))
        .add("b", STEP, payload("b", seconds=0.02, fail=fail_b), depends_on=["a"])
        .add("c", STEP, payload("c", seconds=0.02), depends_on=["a"])
        .add("d", STEP, payload("d"), depends_on=["b", "c"])
        .enqueue()
    )


def _ended(deck: Jobdeck, ids: list[int], procs: list[subprocess.Popen[bytes]], want: dict[int, State]) -> bool:
    _alive(procs)
    now = _statuses(deck, ids)
    return all(now.get(job_id) is state for job_id, state in want.items())


def test_fifty_diamonds_drained_by_two_processes_run_each_join_once_after_both_sides(
    db_url: str, tmp_path: Path, wdeck: Jobdeck
) -> None:
    log = tmp_path / "runs.jsonl"
    procs = _workers(db_url, tmp_path, wdeck)
    try:
        made = [_diamond(wdeck, log, i) for i in range(DIAMONDS)]
        ids = [job_id for wf in made for job_id in wf.jobs.values()]
        want = dict.fromkeys(ids, State.COMPLETED)
        wait_for(lambda: _ended(wdeck, ids, procs, want), timeout=60, interval=0.1, message="200 jobs completed")
    finally:
        stop(procs)

    runs = read_log(log)
    by_step = Counter((r["wf"], r["step"]) for r in runs)
    assert by_step == Counter({(i, s): 1 for i in range(DIAMONDS) for s in "abcd"}), "a step ran twice or never"
    ran = {(r["wf"], r["step"]): r for r in runs}
    tried = _attempts(wdeck, ids)
    crossed = 0
    for i, wf in enumerate(made):
        a, b, c, d = (ran[(i, s)] for s in "abcd")
        assert min(b["start"], c["start"]) >= a["end"], f"workflow {i}: b or c started before a finished"
        assert d["start"] >= max(b["end"], c["end"]), f"workflow {i}: d started before b and c finished"
        assert set(d["deps"]) == {"b", "c"} and d["deps"]["b"]["step"] == "b", d["deps"]
        rows = {s: tried[wf.jobs[s]] for s in "abcd"}
        for s, attempts_of in rows.items():
            assert [r.outcome for r in attempts_of] == [AttemptOutcome.COMPLETED.value], f"workflow {i} {s}"
        (b_row,), (c_row,), (d_row,) = rows["b"], rows["c"], rows["d"]
        assert d_row.started_at >= max(b_row.finished_at, c_row.finished_at), f"workflow {i}: d claimed early"
        assert wdeck.store.workflow(wf.id).workflow.state == "completed"
        crossed += b["pid"] != c["pid"] or d["pid"] != b["pid"]
    pids = Counter(r["pid"] for r in runs)
    print(f"runs per process: {sorted(pids.values())}; {crossed} of {DIAMONDS} workflows crossed processes")


def test_a_dead_dependency_cancels_by_default_and_holds_until_retried_under_hold(
    db_url: str, tmp_path: Path, wdeck: Jobdeck
) -> None:
    log = tmp_path / "runs.jsonl"
    procs = _workers(db_url, tmp_path, wdeck)
    try:
        cancel = _diamond(wdeck, log, 0, fail_b=True)
        hold = _diamond(wdeck, log, 1, fail_b=True, on_dependency_failure="hold")
        ids = [*cancel.jobs.values(), *hold.jobs.values()]
        want = {
            cancel.jobs["b"]: State.DEAD, cancel.jobs["c"]: State.COMPLETED, cancel.jobs["d"]: State.CANCELLED,
            hold.jobs["b"]: State.DEAD, hold.jobs["c"]: State.COMPLETED,
        }  # fmt: skip
        wait_for(lambda: _ended(wdeck, ids, procs, want), timeout=30, interval=0.05, message="b dead on both")

        d = wdeck.store.get(cancel.jobs["d"])
        assert (d.status, d.error) == (State.CANCELLED, "dependency b is dead")
        assert wdeck.store.workflow(cancel.id).workflow.state == "dead"
        held = wdeck.store.get(hold.jobs["d"])
        assert (held.status, held.deps_left) == (State.BLOCKED, 1)
        assert wdeck.store.workflow(hold.id).workflow.state == "held"
        assert not any(r["step"] == "d" for r in read_log(log)), "a d ran with its b dead"

        b = wdeck.store.get(hold.jobs["b"])
        wdeck.store.retry(b.id, wdeck.clock(), {**b.payload, "fail": False})
        wait_for(
            lambda: _ended(wdeck, ids, procs, {hold.jobs["d"]: State.COMPLETED}),
            timeout=30, interval=0.05, message="the held d completed after b's retry",
        )  # fmt: skip
    finally:
        stop(procs)
    runs = {(r["wf"], r["step"]): r for r in read_log(log)}
    assert (0, "d") not in runs
    assert runs[(1, "d")]["start"] >= runs[(1, "b")]["end"]
    tried = _attempts(wdeck, [hold.jobs["b"], hold.jobs["d"]])
    assert [r.outcome for r in tried[hold.jobs["b"]]] == ["failed", "completed"]
    assert [r.outcome for r in tried[hold.jobs["d"]]] == ["completed"]
    assert tried[hold.jobs["d"]][0].started_at >= tried[hold.jobs["b"]][1].finished_at
    assert wdeck.store.workflow(hold.id).workflow.state == "completed"


def test_a_batch_of_a_thousand_acknowledged_by_two_processes_fires_once(
    db_url: str, tmp_path: Path, wdeck: Jobdeck
) -> None:
    log = tmp_path / "runs.jsonl"
    procs = _workers(db_url, tmp_path, wdeck)
    try:
        batch = wdeck.batch(on_complete={"type": CALLBACK, "payload": {"log": str(log)}}, name="thousand")
        # Due together once both processes poll, so both acknowledge at once;
        # the close comes before any of them is due, so an ack fires the batch.
        items = [{"type": STEP, "payload": {"log": str(log), "step": "n"}, "delay_seconds": 2} for _ in range(BATCH)]
        ids = batch.add_many(items)
        closed = batch.close()
        assert closed.fired_at is None

        def callback_runs() -> list[dict[str, Any]]:
            _alive(procs)
            return [r for r in read_log(log) if r["step"] is None]

        fired = wait_for(callback_runs, timeout=60, interval=0.1, message="the batch's callback run")
    finally:
        stop(procs)
    (callback,) = fired
    assert callback["batch"]["counts"] == {"completed": BATCH}
    assert callback["batch"]["job_ids"] == sorted(ids)
    assert callback["batch"]["callback"] == "on_complete"
    with wdeck.store.read() as conn:
        callbacks = conn.execute(select(func.count()).where(jobs.c.type == CALLBACK)).scalar_one()
    assert callbacks == 1, "the batch fired more than once"
    record = wdeck.store.batch(batch.id)
    assert record.state == "fired" and record.counts == {"completed": BATCH}
    tried = _attempts(wdeck, ids)
    assert all([r.outcome for r in tried[i]] == ["completed"] for i in ids)
    pids = Counter(r["pid"] for r in read_log(log) if r["step"] == "n")
    assert sum(pids.values()) == BATCH
    print(f"acknowledged per process: {sorted(pids.values())}")
    assert len(pids) == 2, "one process ran the whole batch: the acknowledgements never raced"
    # Fired in one of the acknowledgements' transactions (not by the close):
    # its time is one of theirs. Not always the latest: an ack that waited
    # for the other's lock commits last with the earlier time.
    assert record.fired_at in {tried[i][0].finished_at for i in ids}, "not fired by an acknowledgement"


def _count(deck: Jobdeck, table: Any) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_a_cycle_is_refused_with_nothing_inserted(wdeck: Jobdeck) -> None:
    with pytest.raises(InvalidField, match="cycle"):
        (
            wdeck.workflow("loop")
            .add("a", STEP, {"log": "-"})
            .add("b", STEP, {"log": "-"}, depends_on=["a", "c"])
            .add("c", STEP, {"log": "-"}, depends_on=["b"])
            .enqueue()
        )
    long_loop = [{"name": f"s{i}", "type": STEP, "depends_on": [f"s{(i + 1) % 6}"]} for i in range(6)]
    with pytest.raises(InvalidField, match="cycle"):
        wdeck.enqueue_workflow({"name": "ring", "jobs": long_loop})
    assert (_count(wdeck, jobs), _count(wdeck, workflows), _count(wdeck, job_dependencies)) == (0, 0, 0)
