"""The crash matrix's ``ack`` point (``jobdeck.core.crashpoints``) for workflows and
batches, on SQLite and PostgreSQL: a worker process SIGKILLs itself inside
the acknowledgement's transaction, after the handler ran and the promotion
(or the batch's firing) was written, before the commit.

Nothing of that transaction may survive: the dependent stays blocked with
its count unchanged and the dependency stays running, held by the dead
process; the batch has not fired. Then a clean process rescues the stalled
attempt and run it again, and only that completion promotes the dependent
(or fires the batch), once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.store import Outcome
from jobdeck.store.models import attempts, jobs
from sqlalchemy import func, select

from tests import workflow_handlers
from tests.conftest import wait_for
from tests.worker_processes import stop, write_config
from tests.workflow_handlers import CALLBACK, STEP, read_log

pytestmark = pytest.mark.backends
ROOT = Path(__file__).parents[2]
SETTINGS = (
    'secret_key = "s"\nworkers = 2\npoll_interval = 0.05\nheartbeat_interval = 0.3\nstall_timeout = 2.0\n'
    "sweep_interval = 0.3\nbackoff_base = 0.05\nbackoff_cap = 0.5\nshutdown_grace = 1.0\n"
    'handler_modules = ["tests.workflow_handlers"]\n'
)


@pytest.fixture
def wdeck(make_deck: Callable[..., Jobdeck], registry: Registry) -> Jobdeck:
    workflow_handlers.register(registry)
    return make_deck()


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Callable[[str | None], subprocess.Popen[bytes]]]:
    """Start ``python -m jobdeck.cli worker`` processes, armed with a crash point or not; all stopped at teardown."""
    config = write_config(db_url, tmp_path, SETTINGS)
    started: list[subprocess.Popen[bytes]] = []

    def start(crash_at: str | None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        env |= {"PYTHONPATH": str(ROOT), "JOBDECK_CONFIG": str(config)}
        if crash_at:
            env["JOBDECK_TEST_CRASH_AT"] = crash_at
        with (tmp_path / f"worker{len(started)}-{crash_at or 'plain'}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobdeck.cli", "worker", "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    stop(started)


def _died_at_its_crash_point(proc: subprocess.Popen[bytes]) -> None:
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the armed worker never reached its ack crash point in 60 s") from None
    assert code == -signal.SIGKILL, f"the armed worker exited with {code}, not by its crash point"


def _outcomes(deck: Jobdeck, job_id: int) -> list[str]:
    with deck.store.read() as conn:
        stmt = select(attempts.c.outcome).where(attempts.c.job_id == job_id).order_by(attempts.c.id)
        return list(conn.execute(stmt).scalars())


def _finish_here(deck: Jobdeck, complete: set[int]) -> None:
    """Claim what is due in this process; complete the jobs in ``complete``, give the rest back."""
    claimed = deck.store.claim("setup", deck.clock(), limit=100)
    deck.store.complete_many(
        [Outcome(j.id, "setup", attempt=j.attempt) for j in claimed if j.id in complete], deck.clock()
    )
    deck.store.release("setup", [(j.id, j.attempt) for j in claimed if j.id not in complete], deck.clock())


def _alive_until(procs: list[subprocess.Popen[bytes]], done: Callable[[], bool]) -> Callable[[], bool]:
    def check() -> bool:
        for p in procs:
            assert p.poll() is None, f"worker {p.pid} exited with {p.returncode}"
        return done()

    return check


def test_a_kill_inside_b_s_acknowledgement_leaves_d_blocked_until_b_runs_again(
    wdeck: Jobdeck, spawn: Callable[[str | None], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"

    def payload(step: str) -> dict[str, Any]:
        return {"log": str(log), "step": step, "wf": 0}

    wf = (
        wdeck.workflow("diamond")
        .add("a", STEP, payload("a"))
        .add("b", STEP, payload("b"), depends_on=["a"], max_retries=3)
        .add("c", STEP, payload("c"), depends_on=["a"])
        .add("d", STEP, payload("d"), depends_on=["b", "c"])
        .enqueue()
    )
    ids = wf.jobs
    _finish_here(wdeck, {ids["a"]})
    _finish_here(wdeck, {ids["c"]})  # b given back: the only job left to run, the one the armed worker takes
    assert (wdeck.store.get(ids["d"]).status, wdeck.store.get(ids["d"]).deps_left) == (State.BLOCKED, 1)

    _died_at_its_crash_point(spawn("ack"))
    b, d = wdeck.store.get(ids["b"]), wdeck.store.get(ids["d"])
    assert b.status is State.RUNNING and b.worker_id is not None, "b's completion outlived the kill"
    assert (d.status, d.deps_left, d.attempt) == (State.BLOCKED, 1, 0), "d promoted without b completed"
    assert [r["step"] for r in read_log(log)] == ["b"], "the armed worker did not run b before its ack"

    survivors = [spawn(None)]
    wait_for(
        _alive_until(survivors, lambda: wdeck.store.get(ids["d"]).status is State.COMPLETED),
        timeout=60, interval=0.1, message="b rescued and run again, then d",
    )  # fmt: skip
    assert _outcomes(wdeck, ids["b"]) == ["stalled", "completed"]
    assert _outcomes(wdeck, ids["d"]) == ["completed"]
    runs = read_log(log)
    assert [(r["step"], r["attempt"]) for r in runs] == [("b", b.attempt), ("b", b.attempt + 1), ("d", 1)]
    assert runs[2]["start"] >= runs[1]["end"]
    assert runs[2]["deps"] == {"b": {"step": "b", "pid": runs[1]["pid"]}, "c": None}
    assert wdeck.store.workflow(wf.id).workflow.state == "completed"


def test_a_kill_inside_the_last_acknowledgement_of_a_batch_fires_it_once_after_the_rescue(
    wdeck: Jobdeck, spawn: Callable[[str | None], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"
    batch = wdeck.batch(on_complete={"type": CALLBACK, "payload": {"log": str(log)}})
    first, second, last = batch.add_many(
        [{"type": STEP, "payload": {"log": str(log), "step": f"n{i}"}, "max_retries": 3} for i in range(3)]
    )
    batch.close()
    _finish_here(wdeck, {first, second})
    assert wdeck.store.batch(batch.id).counts == {"completed": 2, "pending": 1}

    _died_at_its_crash_point(spawn("ack"))
    assert wdeck.store.get(last).status is State.RUNNING
    record = wdeck.store.batch(batch.id)
    assert (record.fired_at, record.state) == (None, "running"), "the batch fired in a transaction that died"

    def callbacks() -> int:
        with wdeck.store.read() as conn:
            return int(conn.execute(select(func.count()).where(jobs.c.type == CALLBACK)).scalar_one())

    assert callbacks() == 0
    survivors = [spawn(None)]
    wait_for(
        _alive_until(survivors, lambda: any(r["step"] is None for r in read_log(log))),
        timeout=60, interval=0.1, message="the last job rescued and run again, then the callback",
    )  # fmt: skip
    assert _outcomes(wdeck, last) == ["stalled", "completed"]
    (callback,) = [r for r in read_log(log) if r["step"] is None]
    assert callback["batch"]["counts"] == {"completed": 3}
    assert callback["batch"]["job_ids"] == [first, second, last]
    assert callbacks() == 1
    assert (wdeck.store.batch(batch.id).outcome or {}).get("counts") == {"completed": 3}
