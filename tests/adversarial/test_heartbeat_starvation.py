"""Heartbeats keep up while three processes drain one SQLite file flat out
on a busy machine.

Three real ``jobdeck worker`` processes (each with its sweeper) drain no-op
jobs from one file while two CPU hogs keep both cores busy; one hog is a
probe that measures how long this machine keeps a sleeping thread from
running. An observer reads each worker's ``heartbeat_at`` every few
milliseconds: the oldest beat it ever sees must stay well under the stall
timeout, plus what the probe measured of the machine, and no live job may
be rescued as stalled nor any worker marked gone. Before the fix, beats
waited behind the process's acks (an unfair lock) and other processes'
writers (SQLite's busy handler) for up to 11 s, and the sweepers rescued
hundreds of live jobs.

A machine starved enough (the probe says so) can still keep a beat from
landing for longer than the stall timeout; then the sweepers rescue that
worker's jobs, as they must, and the test asks instead that the worker knew:
any worker whose beat the observer saw older than half the stall timeout
logged its late heartbeat (``jobdeck.worker.leasing``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import attempts, jobs, workers
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from tests.conftest import wait_for

ROOT = Path(__file__).parents[2]
HEARTBEAT_INTERVAL = 0.5
STALL_TIMEOUT = 4.0
BACKLOG = 20_000
"""Due jobs kept waiting (refilled at half), so the drain never pauses."""
OBSERVE = 10.0
"""Seconds of saturated drain observed."""
REFILL = 1000
"""Jobs per enqueue transaction: one of 10,000 held SQLite's write lock, and
so every worker's beat, for seconds on a loaded machine."""
WAITS = 3
"""Scheduling waits a beat goes through (its thread's start, the write
lock, the commit), each as long as the probe's longest at worst."""
SYNCS = 2
"""Syncs a beat waits for: the commit it waits behind, and its own."""
PROBE = """
import os, sys, threading, time
def burn():
    while True:
        pass
threading.Thread(target=burn, daemon=True).start()
end = time.monotonic() + float(sys.argv[1])
late = stall = 0.0
with open(sys.argv[2], "ab") as fh:
    while time.monotonic() < end:
        began = time.monotonic()
        time.sleep(0.1)
        woke = time.monotonic()
        fh.write(b"x" * 4096)
        fh.flush()
        os.fsync(fh.fileno())
        late, stall = max(late, woke - began - 0.1), max(stall, time.monotonic() - woke)
print(late, stall, flush=True)
"""
"""A CPU hog that measures the machine. Beside a thread that never sleeps
(as a beat thread waits beside a pool's busy threads), it sleeps 0.1 s at a
time, then appends to a file beside the database and syncs it (as every
SQLite commit does, holding the write lock). It prints the longest it
overslept and the longest sync: what this machine's CPU and disk made a
beat wait during the drain."""


pytestmark = [pytest.mark.slow, pytest.mark.alone]


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


def test_heartbeats_keep_up_with_a_saturated_three_process_drain(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobdeck.db'}"
    config = tmp_path / "jobdeck.toml"
    config.write_text(
        f"database_url = {json.dumps(url)}\ninstance_path = {json.dumps(str(tmp_path))}\n"
        f'secret_key = "s"\ndemo = true\nworkers = 4\npoll_interval = 0.2\nheartbeat_interval = {HEARTBEAT_INTERVAL}\n'
        f"stall_timeout = {STALL_TIMEOUT}\nsweep_interval = 0.5\nshutdown_grace = 5.0\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(PYTHONPATH=str(ROOT), JOBDECK_CONFIG=str(config))
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = [_spawn(["-m", "jobdeck.cli", "worker", "--log-level", "warning"], log, env) for log in logs]
    hogs: list[subprocess.Popen[bytes]] = []
    engine = make_engine(url, pool_size=2)
    store = Store(engine)
    try:

        def registered() -> bool:
            for p in procs:
                assert p.poll() is None, f"a worker exited with {p.returncode}: {logs[procs.index(p)].read_text()}"
            try:
                with store.read() as conn:
                    return conn.execute(select(func.count()).select_from(workers)).scalar_one() == 3
            except SQLAlchemyError:  # the schema is still being created
                return False

        wait_for(registered, 60, interval=0.1, message="three workers to register")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]

        def feed(n: int) -> None:
            for start in range(0, n, REFILL):
                batch = [NewJob("demo.noop", {"i": i}) for i in range(start, min(n, start + REFILL))]
                store.enqueue_many(batch, datetime.now(UTC))

        # Keep the drain saturated for the whole window, however fast this machine drains.
        feed(BACKLOG)
        oldest: dict[str, float] = {}
        least_waiting = BACKLOG
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(OBSERVE), str(tmp_path / "probe.bin")], stdout=subprocess.PIPE, text=True
        )
        hogs.append(probe)
        began = time.monotonic()
        while time.monotonic() - began < OBSERVE:
            with store.read() as conn:
                now = datetime.now(UTC)
                for worker_id, beat in conn.execute(select(workers.c.id, workers.c.heartbeat_at)):
                    oldest[worker_id] = max(oldest.get(worker_id, 0.0), (now - beat).total_seconds())
                waiting = conn.execute(
                    select(func.count()).where(jobs.c.status.in_([State.PENDING.value, State.RUNNING.value]))
                ).scalar_one()
            least_waiting = min(least_waiting, waiting)
            if waiting < BACKLOG // 2:
                feed(BACKLOG // 2)
            time.sleep(0.005)  # the observer's poll interval
        delay, sync = (float(v) for v in probe.communicate(timeout=30)[0].split())
        for hog in hogs:
            hog.kill()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)

        with store.read() as conn:
            stalled = conn.execute(
                select(func.count()).select_from(attempts).where(attempts.c.outcome == "stalled")
            ).scalar_one()
            gone = conn.execute(select(func.count()).where(workers.c.gone_at.is_not(None))).scalar_one()
            done = conn.execute(select(func.count()).where(jobs.c.status == State.COMPLETED.value)).scalar_one()
        worst = max(oldest.values())
        bound = STALL_TIMEOUT * 0.6 + WAITS * delay + SYNCS * sync
        print(
            f"\nheartbeat staleness under a saturated drain ({done} jobs in {OBSERVE:.0f} s, 3 processes, "
            f"2 CPU hogs): worst {worst:.2f} s, per worker "
            f"{sorted(round(v, 2) for v in oldest.values())}; interval {HEARTBEAT_INTERVAL} s, stall {STALL_TIMEOUT} s; "
            f"the probe's worst scheduling delay {delay:.2f} s and sync {sync:.2f} s (bound {bound:.2f} s); "
            f"{stalled} rescued as stalled, {gone} marked gone"
        )
        # Saturated: jobs were waiting all along, and the drain ran (how fast is the machine's business).
        assert least_waiting > 0 and done >= 1000, (
            f"the drain ran dry or barely ran: {least_waiting} waiting, {done} done"
        )
        assert worst < bound, f"a worker's heartbeat fell {worst:.2f} s behind (bound {bound:.2f} s)"
        log_of = {p.pid: log for p, log in zip(procs, logs)}
        for worker_id, staleness in oldest.items():
            if staleness > STALL_TIMEOUT / 2:  # the worker's own count is no shorter than what the observer saw
                text = log_of[int(worker_id.split(":")[1].split(".")[0])].read_text()
                assert "heartbeat late" in text, f"{worker_id} beat {staleness:.2f} s late and did not say so:\n{text}"
        if worst < STALL_TIMEOUT:
            assert stalled == 0, f"{stalled} live jobs were rescued as stalled"
            assert gone == 0, f"{gone} live workers were marked gone"
    finally:
        for p in hogs + procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        engine.dispose()
