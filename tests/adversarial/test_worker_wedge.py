"""The worker pool never wedges: an outcome the database refuses, a handler
raising SystemExit or KeyboardInterrupt, a stop while the database is down,
and hung handlers past their timeout. Real worker threads on real databases;
every wait has a deadline."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.store import NewJob
from jobdeck.worker.leasing import BEATS_IN_FLIGHT
from jobdeck.worker.pool import STOP_MARGIN, WorkerPool

from tests.adversarial.outages import Outage
from tests.conftest import wait_for

pytestmark = pytest.mark.backends

ROOT = Path(__file__).resolve().parents[2]


def _status(deck: Jobdeck, job_id: int) -> State:
    return deck.store.get(job_id).status


@pytest.fixture
def pools() -> Iterator[Callable[..., WorkerPool]]:
    """Start pools; each is stopped at teardown (a failed test leaves no threads claiming)."""
    started: list[WorkerPool] = []

    def start(deck: Jobdeck, threads: int = 2, **kw: Any) -> WorkerPool:
        pool = pool_for(deck, threads, **kw)
        pool.start()
        started.append(pool)
        return pool

    yield start
    for pool in started:
        pool.stop(grace=0)


def test_nul_in_a_handler_error_fails_that_job_and_the_pool_goes_on(
    make_deck: Callable[..., Jobdeck], registry: Registry, pools: Callable[..., WorkerPool]
) -> None:
    """On PostgreSQL the NUL made every acknowledgement retry forever: the
    later jobs stayed running, heart-beated, never rescued."""

    @registry.handler("test.nul", max_retries=0)
    def nul(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.progress(0.5, "reading bad\x00name")
        raise RuntimeError("bad\x00byte \udcff from a decoded file name")

    deck = make_deck()
    bad, _ = deck.enqueue("test.nul")
    pool = pools(deck)
    wait_for(lambda: _status(deck, bad.id) is State.DEAD, timeout=15, message="the NUL job dead-lettered")
    later = [deck.enqueue("demo.noop", {"n": i})[0] for i in range(20)]
    wait_for(
        lambda: all(_status(deck, j.id) is State.COMPLETED for j in later), timeout=15, message="later jobs complete"
    )
    job = deck.store.get(bad.id)
    assert job.error is not None and "bad\\x00byte" in job.error and "\\udcff" in job.error
    assert job.progress_message == "reading bad\\x00name"
    (attempt,) = deck.store.attempts_of(bad.id)
    assert attempt.outcome == "failed" and attempt.traceback and "bad\\x00byte" in attempt.traceback
    assert pool.running_jobs() == []


@pytest.mark.backends
def test_a_result_strict_json_cannot_hold_fails_and_is_never_served(
    make_deck: Callable[..., Jobdeck], registry: Registry, pools: Callable[..., WorkerPool]
) -> None:
    """NaN and Infinity in a handler's result were stored and served back as
    invalid JSON, later as a repr string; now the attempt fails, not retried."""

    @registry.handler("test.nan")
    def nan(payload: dict[str, Any], ctx: JobContext) -> dict[str, float]:
        return {"ratio": float("nan"), "cap": float("inf")}

    deck = make_deck()
    job, _ = deck.enqueue("test.nan")
    pools(deck)
    wait_for(lambda: _status(deck, job.id) is State.DEAD, timeout=15, message="the NaN job dead-lettered")
    client = create_app(deck=deck).test_client()
    body = client.get(f"/api/jobs/{job.id}").get_data(as_text=True)
    import json

    served = json.loads(body, parse_constant=lambda name: pytest.fail(f"served {name} as JSON"))
    assert served["result"] is None
    assert served["error"].startswith('ResultNotJSON: result["ratio"]: float nan is not JSON'), served["error"]


def test_a_batch_the_database_refuses_is_acknowledged_one_by_one(
    make_deck: Callable[..., Jobdeck], registry: Registry, pools: Callable[..., WorkerPool]
) -> None:
    """A result no driver can encode (a lone surrogate) fails the batch it is
    in; the other outcomes of that batch complete, and that job fails."""
    gate = threading.Event()

    @registry.handler("test.unstorable", max_retries=0)
    def unstorable(payload: dict[str, Any], ctx: JobContext) -> dict[str, str]:
        gate.wait(10)
        return {"name": "caf\udce9"}

    @registry.handler("test.gated")
    def gated(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
        gate.wait(10)
        return {"n": payload["n"]}

    deck = make_deck()
    bad, _ = deck.enqueue("test.unstorable")
    good = [deck.enqueue("test.gated", {"n": i})[0] for i in range(5)]
    pool = pools(deck, threads=6)
    wait_for(lambda: len(pool.running_jobs()) == 6, timeout=10, message="all six running")
    gate.set()  # all six outcomes reach the acker together
    wait_for(lambda: _status(deck, bad.id) is State.DEAD, timeout=15, message="the unstorable job fails")
    wait_for(lambda: all(_status(deck, j.id) is State.COMPLETED for j in good), timeout=15)
    assert [deck.store.get(j.id).result for j in good] == [{"n": i} for i in range(5)]
    error = deck.store.get(bad.id).error
    assert error is not None and "could not be stored" in error and "UnicodeEncodeError" in error
    assert pool.running_jobs() == []


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_system_exit_or_keyboard_interrupt_in_a_handler_fails_the_job_and_keeps_the_thread(
    exc: BaseException, make_deck: Callable[..., Jobdeck], registry: Registry, pools: Callable[..., WorkerPool]
) -> None:
    @registry.handler("test.exit", max_retries=0)
    def exits(payload: dict[str, Any], ctx: JobContext) -> None:
        raise exc

    deck = make_deck()
    doomed = [deck.enqueue("test.exit", {"n": i})[0] for i in range(3)]
    pool = pools(deck, threads=2)
    wait_for(lambda: all(_status(deck, j.id) is State.DEAD for j in doomed), timeout=15, message="exits dead")
    later = [deck.enqueue("demo.noop", {"n": i})[0] for i in range(10)]
    wait_for(lambda: all(_status(deck, j.id) is State.COMPLETED for j in later), timeout=15)
    assert deck.store.get(doomed[0].id).error == type(exc).__name__ + (": 3" if isinstance(exc, SystemExit) else "")
    assert len(pool.executors.threads) == 2 and all(t.is_alive() for t in pool.executors.threads)


def test_stop_ends_when_the_database_is_down(
    backend: str, db_url: str, make_deck: Callable[..., Jobdeck], registry: Registry, pools: Callable[..., WorkerPool]
) -> None:
    """The acker retries outages forever while running (nothing is dropped
    for a blip), but stop gives up after shutdown_grace + STOP_MARGIN."""
    entered = threading.Event()
    gate = threading.Event()

    @registry.handler("test.gated")
    def gated(payload: dict[str, Any], ctx: JobContext) -> None:
        entered.set()
        gate.wait(10)

    outage = Outage(backend, db_url)
    try:
        busy = 0.3
        deck = make_deck(database_url=outage.url, sqlite_busy_timeout=busy)
        job, _ = deck.enqueue("test.gated")
        unstarted, _ = deck.enqueue("test.gated")
        pool = pool_for(deck, 1)
        pool.holdings.avg_duration = 0.001  # fast jobs so far: it prefetches, so one job waits unstarted
        pool.start()
        assert entered.wait(10)
        wait_for(lambda: pool.inflight == 2, timeout=10, message="the second job prefetched")
        outage.down()
        grace = 0.5
        t0 = time.monotonic()
        raised: list[BaseException] = []

        def stop() -> None:
            try:
                pool.stop(grace)
            except BaseException as exc:
                raised.append(exc)

        stopper = threading.Thread(target=stop, daemon=True)
        stopper.start()
        wait_for(pool.holdings.work.empty, timeout=5, message="stop took the unstarted job off the queue")
        gate.set()  # the running job's outcome now waits for a database that is not there
        bound = grace + STOP_MARGIN + busy + 3.0  # plus one blocked statement, plus a loaded machine
        stopper.join(timeout=bound + 10)
        took = time.monotonic() - t0
        assert not stopper.is_alive(), f"stop still running after {took:.1f}s with the database down"
        assert took < bound, f"stop took {took:.1f}s; the bound is {bound:.1f}s"
        assert not raised, f"stop raised {raised!r}"
        assert pool._stopped.is_set()
        outage.up()
        # What stop could not write is still running under the stopped pool,
        # for the stalled sweep to rescue (a write blocked in busy_timeout
        # may land once the lock is gone). Nothing was lost.
        assert _status(deck, job.id) in {State.RUNNING, State.COMPLETED}
        assert _status(deck, unstarted.id) in {State.RUNNING, State.PENDING}
    finally:
        outage.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_abandoned_threads_are_bounded_and_the_process_reports_unhealthy(
    make_deck: Callable[..., Jobdeck], registry: Registry, pools: Callable[..., WorkerPool]
) -> None:
    """Each timed-out handler keeps its thread (Python cannot kill one):
    40 hung handlers took a process from 22 to 62 threads. Past
    max_abandoned_threads the pool claims nothing, says so in /api/health
    and the Workers page (of any process on the database), and recovers
    when the hung handlers end."""
    from dashboard_support import make_dash_app

    release = threading.Event()
    entered: list[int] = []

    @registry.handler("test.hang", timeout=0.2, max_retries=0)
    def hang(payload: dict[str, Any], ctx: JobContext) -> None:
        entered.append(payload["n"])
        release.wait(30)

    deck = make_deck(max_abandoned_threads=3)
    api = create_app(deck=deck).test_client()
    assert api.get("/api/health").get_json() == {"ok": True}
    hung = [deck.enqueue("test.hang", {"n": i})[0] for i in range(12)]
    baseline = threading.active_count()
    pool = pools(deck, threads=2)
    try:
        wait_for(lambda: pool.unhealthy_reason() is not None, timeout=15, message="unhealthy")
        # Every attempt that started has timed out and been recorded.
        wait_for(lambda: pool.running_jobs() == [] and pool.inflight == 0, timeout=15, message="timeouts recorded")
        assert pool.fetch_once() == 0, "an unhealthy pool claimed"
        ran = len(entered)
        # 2 threads run, 3 abandoned make it unhealthy: at most one more round.
        assert ran <= 3 + 2, f"{ran} hung handlers started; the bound is 3 abandoned threads"
        assert sum(_status(deck, j.id) is State.PENDING for j in hung) == 12 - ran
        # fetcher, acker, monitor, heartbeat and lease watch, and the beats in flight (at most
        # BEATS_IN_FLIGHT); the threads that ran a hung handler; two idle executors
        assert threading.active_count() <= baseline + 5 + BEATS_IN_FLIGHT + ran + 2

        response = api.get("/api/health")
        assert response.status_code == 503
        body = response.get_json()
        assert body["ok"] is False and "max_abandoned_threads = 3" in body["error"] and body["reasons"]

        other = make_deck()  # another process on the same database sees it too
        wait_for(lambda: other.store.list_workers()[0]["unhealthy"], timeout=10, message="health written")
        page = make_dash_app(other).test_client().get("/workers").get_data(as_text=True)
        assert "unhealthy" in page and "max_abandoned_threads = 3" in page
        assert other.store.list_workers()[0]["abandoned_threads"] >= 3
    finally:
        release.set()
    wait_for(lambda: pool.unhealthy_reason() is None, timeout=15, message="healthy once the hung handlers end")
    assert api.get("/api/health").status_code == 200
    wait_for(lambda: all(_status(deck, j.id) is not State.PENDING for j in hung), timeout=20, message="claims resume")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("command", ["worker", "serve"])
def test_exit_when_unhealthy_makes_the_process_exit_non_zero(tmp_path: Path, db_url: str, command: str) -> None:
    """`jobdeck worker` and `jobdeck serve` with exit_when_unhealthy stop
    and exit 3, so a supervisor restarts them (and frees the abandoned threads)."""
    (tmp_path / "hangmod.py").write_text(
        "import threading\n"
        "from jobdeck.jobs.handlers import registry\n\n"
        "@registry.handler('test.hang', timeout=0.2, max_retries=0)\n"
        "def hang(payload, ctx):\n"
        "    threading.Event().wait()\n"
    )
    deck = Jobdeck(_config(tmp_path, db_url), Registry())
    deck.init_db()
    for i in range(3):
        deck.store.enqueue(NewJob(type="test.hang", payload={"n": i}, max_retries=0), deck.clock())
    deck.store.engine.dispose()
    env = _cli_env(tmp_path, db_url)
    args = ["worker"] if command == "worker" else ["serve", "--bind", f"127.0.0.1:{_free_port()}"]
    proc = subprocess.run(
        [sys.executable, "-m", "jobdeck.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "exit_when_unhealthy" in proc.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, db_url: str) -> Any:
    from jobdeck.core.config import load

    return load(path=None, env={}, overrides={"database_url": db_url, "instance_path": str(tmp_path / "instance")})


def _cli_env(tmp_path: Path, db_url: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
        JOBDECK_DATABASE_URL=db_url,
        JOBDECK_INSTANCE_PATH=str(tmp_path / "instance"),
        JOBDECK_HANDLER_MODULES="hangmod",
        JOBDECK_WORKERS="2",
        JOBDECK_POLL_INTERVAL="0.1",
        JOBDECK_MAX_ABANDONED_THREADS="1",
        JOBDECK_EXIT_WHEN_UNHEALTHY="1",
        JOBDECK_SHUTDOWN_GRACE="0.5",
    )
    return env


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_unhealthy_pool_gives_back_the_jobs_it_has_not_started(
    make_deck: Callable[..., Jobdeck], registry: Registry
) -> None:
    """Prefetched jobs are new jobs too: run here, each could hang and cost
    another thread. The pool (driven through its *_once bodies, with real
    hung threads) releases them for a healthy process."""
    deck = make_deck(max_abandoned_threads=2)
    ids = [deck.enqueue("demo.noop", {"n": i})[0].id for i in range(5)]
    pool = pool_for(deck, 2)
    pool.holdings.avg_duration = 0.001  # fast jobs so far: the pool prefetches beyond its threads
    assert pool.fetch_once() == 5
    release = threading.Event()
    hung = [threading.Thread(target=release.wait, args=(30,), daemon=True) for _ in range(2)]
    for t in hung:
        t.start()
    try:
        pool.monitor.abandoned.extend(hung)  # as check_timeouts_once records timed-out handlers' threads
        assert pool.health_once() is not None
        assert [_status(deck, i) for i in ids] == [State.PENDING] * 5
        assert pool.inflight == 0 and pool.holdings.work.empty()
        assert pool.fetch_once() == 0
    finally:
        release.set()
    for t in hung:
        t.join(5)
    assert pool.health_once() is None and pool.fetch_once() == 5
