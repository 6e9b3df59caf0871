"""The stalled-job sweeper (with an injected clock, then with a real worker
process killed by SIGKILL), retention and the per-minute counters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.maintenance.upkeep import Maintenance, Retention
from jobdeck.store import Outcome
from jobdeck.store.models import workers
from sqlalchemy import select

from tests.conftest import wait_for
from tests.helpers import STARVED, STARVED_SAID

ROOT = Path(__file__).resolve().parents[1]


def test_sweep_rescues_stalled_jobs_by_the_fail_rule_and_marks_the_worker_gone(deck, clock):
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    deck.store.register_worker("w1", "host", 1, 2, clock.now)
    retry, _ = deck.enqueue("demo.sleep", max_retries=1)
    last, _ = deck.enqueue("demo.sleep", max_retries=0)
    claimed = deck.store.claim("w1", clock.now, limit=2)
    assert len(claimed) == 2
    beat = clock.now
    assert m.sweep_once(clock.advance(4)) == []  # inside stall_timeout (5 s)
    assert sorted(m.sweep_once(clock.advance(2))) == [retry.id, last.id]
    assert deck.store.get(retry.id).status is State.FAILED
    assert deck.store.get(last.id).status is State.DEAD  # no retries left: dead, never running forever
    [attempt] = deck.store.attempts_of(last.id)
    assert attempt.outcome == "stalled"
    assert attempt.error == f"stalled: worker w1 stopped heart-beating at {beat.isoformat()}"
    with deck.store.read() as conn:
        assert conn.execute(select(workers.c.gone_at).where(workers.c.id == "w1")).scalar() == clock.now
    assert m.sweep_once(clock.now) == []  # a job is rescued once


@pytest.mark.slow
def test_a_killed_worker_process_job_is_rescued_and_completed_by_another(make_config, registry, tmp_path):
    deck = Jobdeck(make_config(), registry)
    deck.init_db()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBDECK_DATABASE_URL": deck.config.database_url,
        "JOBDECK_INSTANCE_PATH": str(tmp_path / "instance"),
        "JOBDECK_WORKERS": "1",
        "JOBDECK_HEARTBEAT_INTERVAL": "0.2",
        "JOBDECK_STALL_TIMEOUT": "1",
        "JOBDECK_SWEEP_INTERVAL": "0.2",
        "JOBDECK_POLL_INTERVAL": "0.1",
    }
    env.pop("JOBDECK_CONFIG", None)
    job, _ = deck.enqueue("demo.sleep", {"seconds": 1.0})

    def start() -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "jobdeck.cli", "worker", "--demo", "--log-level", "warning"]
        with open(tmp_path / "worker.log", "ab") as log:  # read it when this test fails
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)

    first = start()
    try:
        running = wait_for(lambda: (j := deck.store.get(job.id)).status is State.RUNNING and j, timeout=20)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        second = start()
        try:
            done = wait_for(lambda: (j := deck.store.get(job.id)).status is State.COMPLETED and j, timeout=30)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=20)
    finally:
        if first.poll() is None:
            first.kill()
    assert done.worker_id != running.worker_id
    stalled, *between, completed = deck.store.attempts_of(job.id)
    # Starved of CPU, the second worker can itself beat late past the 1 s
    # stall_timeout and have its attempt rescued or given back (seen beside a
    # CPU hog). Such an attempt is excused only where that worker said so.
    said = (tmp_path / "worker.log").read_text()
    assert not between or any(s in said for s in STARVED_SAID), (between, said)
    assert all(a.outcome in STARVED for a in between), between
    assert stalled.outcome == "stalled" and stalled.worker_id == running.worker_id
    assert stalled.error.startswith(f"stalled: worker {running.worker_id} stopped heart-beating at ")
    assert completed.outcome == "completed" and completed.worker_id == done.worker_id
    with deck.store.read() as conn:
        gone = conn.execute(select(workers.c.gone_at).where(workers.c.id == running.worker_id)).scalar()
    assert gone is not None
    deck.store.engine.dispose()


def _finish(deck, clock, job_id, ok=True):
    [j] = deck.store.claim("w", clock.now, limit=1)
    assert j.id == job_id
    if ok:
        deck.store.complete_many([Outcome(job_id, "w", attempt=j.attempt, started_at=clock.now)], clock.now)
    else:
        deck.store.fail_many([Outcome(job_id, "w", attempt=j.attempt, error="boom")], clock.now)


def test_retention_prunes_old_finished_jobs_in_batches_and_frees_their_keys(deck, clock):
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout, Retention(completed_days=7, batch=2))
    old = [deck.enqueue("demo.noop", idempotency_key=f"k{i}")[0].id for i in range(5)]
    for job_id in old:
        _finish(deck, clock, job_id)
    dead, _ = deck.enqueue("demo.fail", max_retries=0)
    _finish(deck, clock, dead.id, ok=False)
    clock.advance(3 * 86400)
    recent, _ = deck.enqueue("demo.noop")
    _finish(deck, clock, recent.id)
    discarded, _ = deck.enqueue("demo.noop")
    deck.store.discard(discarded.id, clock.now)

    assert m.prune_once(clock.advance(6 * 86400))["jobs"] == 5  # 9 days after the first five, 6 after the rest
    ids = {j.id for j in deck.store.list_jobs(_all(), clock.now)}
    assert ids == {dead.id, recent.id, discarded.id}  # dead waits for a person
    assert deck.store.attempts_of(old[0]) == []
    again, created = deck.enqueue("demo.noop", idempotency_key="k0")
    assert created and again.id not in old  # the key was remembered only while its job existed
    assert m.prune_once(clock.advance(2 * 86400))["jobs"] == 2


def test_retention_prunes_cancelled_jobs_like_completed_ones(deck, clock):
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout, Retention(completed_days=7))
    at_once, _ = deck.enqueue("demo.noop")
    deck.cancel(at_once.id, actor="t")
    running, _ = deck.enqueue("demo.noop")
    [j] = deck.store.claim("w", clock.now, limit=1)
    deck.cancel(running.id, actor="t")
    assert m.prune_once(clock.advance(8 * 86400))["jobs"] == 1  # the running one is not finished yet
    assert {j.id for j in deck.store.list_jobs(_all(), clock.now)} == {running.id}
    deck.store.complete_many([Outcome(running.id, "w", attempt=j.attempt)], clock.now)
    assert m.prune_once(clock.advance(8 * 86400))["jobs"] == 1
    assert deck.store.attempts_of(running.id) == []


def _all():
    from jobdeck.store import JobFilter

    return JobFilter(limit=100)


def test_rollup_counts_per_minute_and_type_once(deck, clock):
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    assert m.rollup_once(clock.now) == 0  # sets the watermark an hour back
    for _ in range(3):
        _finish(deck, clock, deck.enqueue("demo.noop")[0].id)
    flaky, _ = deck.enqueue("demo.flaky", max_retries=0)
    _finish(deck, clock, flaky.id, ok=False)
    minute = clock.now.replace(second=0, microsecond=0)
    assert m.rollup_once(clock.advance(20)) == 60  # the current minute is not closed yet
    assert m.rollup_once(clock.advance(70)) == 2  # closes 11:59 and 12:00
    assert m.rollup_once(clock.now) == 0
    rows = {(r["type"], r["minute"]): r for r in m.stats(minute - timedelta(hours=2))}
    assert rows[("demo.noop", minute)]["completed"] == 3
    assert (rows[("demo.flaky", minute)]["failed"], rows[("demo.flaky", minute)]["dead"]) == (1, 1)
    assert len(rows) == 2


def test_rollup_counts_a_cancelled_attempt_as_neither_done_nor_failed(deck, clock):
    """A person's cancel is not a failure: the failure rate and the alerts
    read these counters, so a cancelled run must not raise them."""
    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    m.rollup_once(clock.now)
    job, _ = deck.enqueue("demo.sleep", {"seconds": 60})
    deck.store.claim("w1", clock.now, limit=1)
    deck.cancel(job.id, actor="test")
    deck.store.complete_many([Outcome(job.id, "w1")], clock.now)
    assert deck.store.get(job.id).status is State.CANCELLED
    minute = clock.now.replace(second=0, microsecond=0)
    m.rollup_once(clock.advance(120))
    rows = {(r["type"], r["minute"]): r for r in m.stats(minute - timedelta(hours=2))}
    counts = rows.get(("demo.sleep", minute), {"completed": 0, "failed": 0, "dead": 0})
    assert (counts["completed"], counts["failed"], counts["dead"]) == (0, 0, 0)


def test_each_upkeep_loop_is_built_from_the_store_alone(deck, clock):
    """The sweeper takes the store, a clock and ``stall_timeout``; retention
    the store and its settings; the roll-up the store: none needs a deck."""
    from jobdeck.maintenance.prune import Prune
    from jobdeck.maintenance.rescue import Rescue
    from jobdeck.maintenance.rollup import RollUp

    store = deck.store
    rollup = RollUp(store)
    assert rollup.rollup_once(clock.now) == 0  # sets the watermark an hour back
    store.register_worker("w1", "host", 1, 1, clock.now)
    job, _ = deck.enqueue("demo.sleep", max_retries=0)
    assert [j.id for j in store.claim("w1", clock.now, limit=1)] == [job.id]
    assert Rescue(store, clock, stall_timeout=60.0).sweep_once(clock.advance(30)) == []
    assert Rescue(store, clock, stall_timeout=10.0).sweep_once(clock.now) == [job.id]
    assert store.get(job.id).status is State.DEAD
    minute = clock.now.replace(second=0, microsecond=0)
    assert rollup.rollup_once(clock.advance(120)) > 0
    rows = {(r["type"], r["minute"]): r for r in rollup.stats(minute - timedelta(hours=2))}
    assert rows[("demo.sleep", minute)]["dead"] == 1
    assert Prune(store, Retention(completed_days=1, dead_days=1)).prune_once(clock.advance(2 * 86400))["dead"] == 1
    assert store.list_jobs(_all(), clock.now) == []


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_gone_workers_session_caught_in_a_transaction_is_ended_so_its_job_is_rescued(deck, clock, db_url):
    """A host cut off in the middle of a write can leave its backend holding
    its job's row lock with no timeout armed, and the rescue skips locked
    rows (tests/adversarial/test_partition.py cuts a real link). Here a
    session of that worker's process holds the row in an open transaction,
    its idle timeout off, as such a backend does: the sweep that marks the
    worker gone ends it, and the next one rescues the job. The same
    process's session resting outside a transaction holds nothing and stays."""
    import psycopg
    from jobdeck.store.engine import session_name
    from sqlalchemy.engine import make_url

    m = Maintenance(deck.store, deck.clock, deck.config.stall_timeout)
    far = "farhost:4242:abcdef"
    deck.store.register_worker(far, "farhost", 4242, 1, clock.now)
    job, _ = deck.enqueue("demo.sleep", max_retries=1)
    assert [j.id for j in deck.store.claim(far, clock.now, limit=1)] == [job.id]
    url = make_url(db_url)
    params = {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
              "dbname": url.database, "options": url.query["options"], "application_name": session_name("farhost:4242")}  # fmt: skip
    held = psycopg.connect(**params)
    resting = psycopg.connect(**params, autocommit=True)
    try:
        held.execute("SET idle_in_transaction_session_timeout = 0")
        held.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", [job.id])
        assert m.sweep_once(clock.advance(deck.config.stall_timeout + 1)) == []  # locked: skipped; far marked gone
        # The backend exits, and its lock goes, a moment after it is told to.
        assert wait_for(lambda: m.sweep_once(clock.now), message="the job rescued") == [job.id]
        assert deck.store.get(job.id).status is State.FAILED
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
        assert resting.execute("SELECT 1").fetchone() == (1,)
    finally:
        held.close()
        resting.close()


def test_session_names_fit_the_server_and_keep_each_process_apart():
    """The server keeps 63 bytes of an application_name: a long host name
    (a Kubernetes pod's FQDN) is cut with a digest of it, never the pid, or
    every process of that host would share one name and a sweep would end
    its live neighbours' sessions."""
    from jobdeck.store.engine import session_name

    assert session_name("web-1:4242") == "jobdeck web-1:4242"
    long_host = "worker-7d9f8c6b5d-x2x9k.jobs.svc.cluster.example.internal"
    names = {session_name(f"{host}:{pid}") for host in (long_host, long_host + "x") for pid in (1, 65535, 4194304)}
    assert len(names) == 6
    assert all(len(n.encode()) <= 63 and n.startswith("jobdeck worker-7d9f") for n in names)
    assert session_name("é" * 40 + ":7").endswith(":7") and len(session_name("é" * 40 + ":7").encode()) <= 63


def test_a_gone_workers_process_is_named_by_its_row_and_narrowed_by_its_id():
    """Host and pid come from the workers row; the id adds the process's
    nonce only where it agrees with them, so an id cannot name another
    process (an older version's id, or one a pool was given, names host:pid)."""
    from jobdeck.store.server_sessions import _process_of

    assert _process_of("web-1:42.ab12cd:ef3456", "web-1", 42) == "web-1:42.ab12cd"
    assert _process_of("web-1:42:ef3456", "web-1", 42) == "web-1:42"
    assert _process_of("web-2:7.ab12cd:ef3456", "web-1", 42) == "web-1:42"
    assert _process_of("web-1:420.ab12cd:ef3456", "web-1", 42) == "web-1:42"
    assert _process_of("web-1:42.:x", "web-1", 42) == "web-1:42"
