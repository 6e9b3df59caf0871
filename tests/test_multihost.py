"""Three separate Jobdeck processes on one database, as three hosts would run.

They start together (and migrate the schema together), share 10,000 jobs of
mixed types, and every job ends exactly as its type dictates; each order is
charged exactly once. Then one process is killed with SIGKILL while it holds
jobs, and the other two rescue and finish them. The same run holds on one
SQLite file (three processes on one host) and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.states import ENDED, State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import attempts, demo_charges, jobs, workers
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from tests.adversarial.cli_process import children
from tests.conftest import wait_for
from tests.helpers import STARVED, STARVED_SAID

pytestmark = [pytest.mark.slow, pytest.mark.backends]
ROOT = Path(__file__).parents[1]
STALL_TIMEOUT = 4.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """Three ``python -m jobdeck.cli`` processes: one ``serve``, two ``worker``."""

    def __init__(self, db_url: str, tmp_path: Path, extra_toml: str = "") -> None:
        self.port = _free_port()
        config = tmp_path / "jobdeck.toml"
        config.write_text(
            f"database_url = {json.dumps(db_url)}\n"
            f"instance_path = {json.dumps(str(tmp_path / 'instance'))}\n"
            'secret_key = "the-same-secret-on-every-host"\n'
            "demo = true\nworkers = 4\nhttp_threads = 4\npoll_interval = 0.2\nheartbeat_interval = 0.5\n"
            f"stall_timeout = {STALL_TIMEOUT}\nsweep_interval = 0.5\nbackoff_base = 0.05\nbackoff_cap = 1.0\n"
            "shutdown_grace = 5.0\n" + extra_toml
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBDECK_CONFIG": str(config)}
        env = {k: v for k, v in env.items() if not (k.startswith("JOBDECK_") and k != "JOBDECK_CONFIG")}
        commands = [
            ["serve", "--bind", f"127.0.0.1:{self.port}"],
            ["worker"],
            ["worker"],
        ]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [tmp_path / f"proc{i}.log" for i in range(3)]
        for args, log in zip(commands, self.logs):
            with log.open("wb") as fh:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "jobdeck.cli", *args, "--log-level", "warning"],
                        cwd=ROOT,
                        env=env,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                    )
                )

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs)

    def pids(self) -> dict[int, subprocess.Popen[bytes]]:
        """Each process by its pid, and by its children's: on granian,
        ``serve`` runs its pool in a worker process, which dies with it."""
        found: dict[int, subprocess.Popen[bytes]] = {}
        for p in self.procs:
            found.update(dict.fromkeys([p.pid, *children(p.pid)], p))
        return found

    def check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None and p.returncode != -signal.SIGKILL:
                raise AssertionError(f"process {p.pid} exited with {p.returncode}:\n{self.tails()}")

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def serving(self) -> bool:
        """The serve process answers HTTP. Its pool registers from granian's
        worker process before that process listens, so a registered serve
        may still refuse a connection for a moment on a busy machine."""
        self.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/health", timeout=10) as response:
                return bool(response.status == 200)
        except OSError:  # URLError included: not listening yet
            return False

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _expected() -> list[tuple[NewJob, State, int]]:
    """(job, final state, attempts it must take): 10,000 of them, shuffled."""
    plan: list[tuple[NewJob, State, int]] = []
    plan += [(NewJob("demo.noop", {"i": i}), State.COMPLETED, 1) for i in range(7350)]
    plan += [(NewJob("demo.flaky", {"failures": 1}, max_retries=2), State.COMPLETED, 2) for _ in range(1500)]
    plan += [(NewJob("demo.fail", {"message": "no"}, max_retries=0), State.DEAD, 1) for _ in range(500)]
    plan += [(NewJob("demo.fail", {"message": "no"}, max_retries=1), State.DEAD, 2) for _ in range(500)]
    # The demo runs at most 2 charges at once (``concurrency = 2``), so
    # charges drain at a fraction of the other types' pace: 150 of them fit
    # inside the others' drain, where 1,500 added a tail of half a minute
    # with all three processes polling for the next free slot.
    for n in range(150):
        order = n % 100  # orders 0..49 are delivered twice: still one charge each
        fail_after = order % 4 == 0 and n < 100
        payload = {"order_id": f"o{order}", "amount_cents": 100 + order, "fail_after_charge": fail_after}
        plan.append((NewJob("demo.charge-card", payload, max_retries=2), State.COMPLETED, 2 if fail_after else 1))
    random.Random(4).shuffle(plan)
    return plan


PLAN_TYPES = ("demo.noop", "demo.flaky", "demo.fail", "demo.charge-card")


def _states(store: Store) -> Counter[str]:
    """States of the planned jobs (not of any the demo's own schedules add)."""
    with store.read() as conn:
        return Counter(
            dict(
                conn.execute(
                    select(jobs.c.status, func.count()).where(jobs.c.type.in_(PLAN_TYPES)).group_by(jobs.c.status)
                ).all()
            )
        )


def test_three_processes_share_one_database(empty_db_url, tmp_path, backend):
    db_url = empty_db_url  # they migrate it together
    cluster = Cluster(db_url, tmp_path)
    engine = make_engine(db_url, pool_size=4)
    store = Store(engine)
    try:
        # They migrated the empty database together; all three registered.
        def registered() -> bool:
            cluster.check_alive()
            try:
                with store.read() as conn:
                    return conn.execute(select(func.count()).select_from(workers)).scalar_one() == 3
            except SQLAlchemyError:  # the schema is still being created
                return False

        wait_for(registered, 60, interval=0.1, message="three processes to register")
        wait_for(cluster.serving, 60, interval=0.1, message="the serve process to answer HTTP")
        pids = cluster.pids()

        # 10,000 jobs: through the serve process's API and straight into the database.
        plan = _expected()
        by_id: dict[int, tuple[State, int]] = {}
        for new, state, tries in plan[:100]:
            body = {"type": new.type, "payload": new.payload, "max_retries": new.max_retries}
            by_id[cluster.post("/api/jobs", body)["id"]] = (state, tries)
        for start in range(100, len(plan), 1000):
            chunk = plan[start : start + 1000]
            ids = store.enqueue_many([n for n, _, _ in chunk], store_now())
            by_id.update({i: (s, t) for i, (_, s, t) in zip(ids, chunk)})
        assert len(by_id) == 10_000

        def drained() -> bool:
            cluster.check_alive()
            counts = _states(store)
            return counts[State.COMPLETED.value] + counts[State.DEAD.value] == 10_000

        wait_for(drained, 150, interval=0.25, message="10,000 jobs to finish")

        with store.read() as conn:
            final = dict(conn.execute(select(jobs.c.id, jobs.c.status).where(jobs.c.type.in_(PLAN_TYPES))).all())
            tries = dict(conn.execute(select(attempts.c.job_id, func.count()).group_by(attempts.c.job_id)).all())
            starved = set(conn.execute(select(attempts.c.job_id).where(attempts.c.outcome.in_(STARVED))).scalars())
            charges = dict(
                conn.execute(select(demo_charges.c.order_id, func.count()).group_by(demo_charges.c.order_id)).all()
            )
            workers_used = conn.execute(select(func.count(func.distinct(attempts.c.worker_id)))).scalar_one()
        # A process starved of CPU has its jobs handed on, as it should: past
        # half of stall_timeout without a beat landing it loses its lease and
        # gives back what it runs (an ``interrupted`` attempt), and past
        # stall_timeout the others rescue them (``stalled``). Each is an
        # attempt more, excused only where a process said it beat late or
        # lost its lease, and such a job must still have finished.
        if starved:
            said = [log.name for log in cluster.logs if any(s in log.read_text() for s in STARVED_SAID)]
            assert said, f"jobs {sorted(starved)[:5]} were handed on ({STARVED}), but no process beat late"
        wrong = [
            (i, final[i], tries.get(i), want)
            for i, want in by_id.items()
            if (State(final[i]), tries.get(i)) != want and not (i in starved and State(final[i]) in ENDED)
        ]
        if wrong:
            histories = {
                i: [(a.outcome, a.worker_id, (a.error or "")[:120]) for a in store.attempts_of(i)]
                for i, *_ in wrong[:5]
            }
            raise AssertionError(f"{len(wrong)} jobs ended wrongly, e.g. {wrong[:5]}; their attempts {histories}")
        assert len(starved) <= len(by_id) // 20, f"{len(starved)} of {len(by_id)} jobs were handed on"
        assert charges == {f"o{n}": 1 for n in range(100)}
        assert workers_used == 3

        # SIGKILL one process while it holds jobs; the others rescue and finish them.
        sleepers = store.enqueue_many(
            [NewJob("demo.sleep", {"seconds": 1.0}, max_retries=2) for _ in range(12)], store_now()
        )

        def victim() -> int | None:
            with store.read() as conn:
                held = Counter(
                    int(w.split(":")[1].split(".")[0])
                    for w in conn.execute(
                        select(jobs.c.worker_id).where(jobs.c.id.in_(sleepers), jobs.c.status == State.RUNNING.value)
                    ).scalars()
                )
            return held.most_common(1)[0][0] if held else None

        pid = wait_for(victim, 30, message="a process to hold sleep jobs")
        with store.read() as conn:
            # The sleepers only: the demo's own schedules enqueue jobs too (a
            # demo.extract held by the victim is rescued into a backoff and
            # may not have run again by the time the sleepers are done).
            running = (
                jobs.c.id.in_(sleepers),
                jobs.c.worker_id.like(f"%:{pid}.%"),
                jobs.c.status == State.RUNNING.value,
            )
            held = set(conn.execute(select(jobs.c.id).where(*running)).scalars())
        pids[pid].send_signal(signal.SIGKILL)
        pids[pid].wait(timeout=10)

        def rescued() -> bool:
            cluster.check_alive()
            with store.read() as conn:
                done = conn.execute(
                    select(func.count()).where(jobs.c.id.in_(sleepers), jobs.c.status == State.COMPLETED.value)
                ).scalar_one()
            return done == len(sleepers)

        wait_for(rescued, 60, interval=0.2, message="the killed process's jobs to be rescued and finished")
        for job_id in held:
            history = store.attempts_of(job_id)
            told = [(a.attempt, a.outcome.value, a.worker_id, str(a.started_at), str(a.finished_at)) for a in history]
            first, last = history[0], history[-1]
            assert first.outcome == "stalled" and f":{pid}." in (first.worker_id or ""), (job_id, told)
            assert last.outcome == "completed" and f":{pid}." not in (last.worker_id or ""), (job_id, told)
        assert held, "the victim held no jobs"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.tails()}") from None
    finally:
        cluster.stop()
        engine.dispose()


def store_now() -> datetime:
    return datetime.now(UTC)


# Cron once per fire time across the three processes, on both databases.
SCHEDULE_TOML = """
[[schedules]]
name = "tick"
cron = "* * * * * *"
type = "demo.noop"
"""


def test_cron_fires_once_per_fire_time_across_three_processes(db_url, tmp_path):
    cluster = Cluster(db_url, tmp_path, SCHEDULE_TOML)
    engine = make_engine(db_url, pool_size=2)
    store = Store(engine)
    try:

        def fired() -> int:
            cluster.check_alive()
            try:
                with store.read() as conn:
                    return int(conn.execute(select(func.count()).where(jobs.c.type == "demo.noop")).scalar_one())
            except SQLAlchemyError:  # the schema is still being created
                return 0

        wait_for(lambda: fired() >= 5, 60, interval=0.2, message="five fire times")
        with store.read() as conn:
            rows = conn.execute(
                select(jobs.c.idempotency_key, jobs.c.created_at).where(jobs.c.type == "demo.noop")
            ).all()
        keys = [r.idempotency_key for r in rows]
        assert all(keys) and len(keys) == len(set(keys))
        span = (max(r.created_at for r in rows) - min(r.created_at for r in rows)).total_seconds()
        assert len(rows) <= span + 2, f"{len(rows)} jobs in {span:.1f} s: more than one per fire time"
    finally:
        cluster.stop()
        engine.dispose()
