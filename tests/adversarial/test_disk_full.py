"""A full disk under real processes: ``jobdeck serve`` and ``jobdeck worker``
on one SQLite file on a 20 MB tmpfs (an ext4 image where tmpfs is refused).

Before: after the disk filled, enqueues answered 500 with no
``Retry-After`` and ``/api/health`` said all was well; a job whose handler
finished while the disk was full could not be acknowledged, stayed
``running`` after the space came back (SIGTERM did not release it), and
after a restart was rescued as stalled and ran a second time.

Now: enqueues answer 507 with ``Retry-After`` and the cause, health answers
503 until writes land again, a finished job's acknowledgement is retried
until it lands, and a process stopped during the outage keeps the outcomes
it could not write for the next pool on the host. Every run of a handler is
counted in a file outside the full disk.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.cli_process import JobdeckProcess, write_config
from tests.adversarial.mounts import free_bytes, small_disk
from tests.adversarial.outage_handlers import MARK, runs
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

GRACE = 3.0
STALL = 5.0
PAYLOAD = "x" * 30_000
"""Each filling job's payload: the disk fills in some hundreds of enqueues."""


def post(url: str, body: dict[str, Any]) -> tuple[int, Message, Any]:
    request = urllib.request.Request(f"{url}/api/jobs", json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read() or b"null")


def health(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """A read of the database file (reads work on a full disk)."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def statuses(db: Path, ids: list[int]) -> dict[int, str]:
    marks = ",".join("?" * len(ids))
    return dict(rows(db, f"SELECT id, status FROM jobs WHERE id IN ({marks})", *ids))  # noqa: S608


def test_a_full_disk_answers_507_and_no_finished_job_runs_twice(tmp_path: Path) -> None:
    with small_disk(tmp_path, 20) as disk:
        db = disk / "jobdeck.db"
        log, gate = tmp_path / "runs.log", tmp_path / "gate"
        config = write_config(
            tmp_path, database_url=f"sqlite:///{db}", instance_path=str(disk / "instance"), workers=2,
            shutdown_grace=GRACE, stall_timeout=STALL, sweep_interval=0.5,
            handler_modules=["tests.adversarial.outage_handlers"],
        )  # fmt: skip
        serve = JobdeckProcess(tmp_path, config, "serve", name="serve", log_level="info")
        worker: JobdeckProcess | None = None
        try:
            serve.wait_serving()
            worker = JobdeckProcess(tmp_path, config, "worker", name="worker", log_level="info")
            worker.wait_logged("worker pool")

            # One gated job per handler thread, two in each process: they run
            # until the test opens the gate, which it does once the disk is full.
            gated = [post(serve.url, {"type": MARK, "payload": {"log": str(log), "gate": str(gate)}}) for _ in range(4)]
            assert all(status == 201 for status, _, _ in gated), gated
            gated_ids = [body["id"] for _, _, body in gated]

            def held_by_both() -> bool:
                serve.alive()
                holders = rows(db, "SELECT status, worker_id FROM jobs WHERE id IN (?,?,?,?)", *gated_ids)
                pids = Counter(w.split(":")[1].split(".")[0] for s, w in holders if s == "running")
                return pids == Counter({str(serve_pid(serve)): 2, str(worker.proc.pid): 2})  # type: ignore[union-attr]

            wait_for(held_by_both, 30, interval=0.05, message="two gated jobs running in each process")

            # Fill the disk: a ballast file first (freed later), then jobs until the database cannot grow.
            ballast = disk / "ballast"
            with ballast.open("wb") as fh:
                fh.write(b"\0" * (free_bytes(disk) - (4 << 20)))  # 4 MB left for jobs
            accepted: list[int] = []
            answer: tuple[int, Message, Any] = (201, Message(), None)
            for _ in range(2000):
                answer = post(serve.url, {"type": MARK, "payload": {"log": str(log), "pad": PAYLOAD}})
                if answer[0] != 201:
                    break
                accepted.append(answer[2]["id"])
            assert answer[0] == 507, f"after {len(accepted)} jobs: {answer}"
            # A 30 KB job no longer fits, but a small one still may (seen: two
            # more landed): fill on with small ones until they too are refused.
            # Each one answered 201 is committed, and must run once like the rest.
            for _ in range(500):
                answer = post(serve.url, {"type": MARK, "payload": {"log": str(log)}})
                if answer[0] != 201:
                    break
                accepted.append(answer[2]["id"])
            status, headers, body = answer
            assert status == 507, f"after {len(accepted)} jobs: {status} {body}"
            assert body["cause"] == "disk_full" and "disk is full" in body["error"], body
            assert int(headers.get("Retry-After", 0)) > 0, headers

            during = [post(serve.url, {"type": MARK, "payload": {"log": str(log)}}) for _ in range(20)]
            assert [s for s, _, _ in during] == [507] * 20, during
            assert all(h.get("Retry-After") for _, h, _ in during)
            code, said = health(serve.url)
            assert code == 503 and "disk is full" in said["error"], said

            # The gated handlers finish while the disk is full: they ran once,
            # and their acknowledgements cannot land.
            gate.touch()
            wait_for(lambda: sum(runs(log)[i] for i in gated_ids) == 4, 30, message="the gated handlers to finish")
            assert set(statuses(db, gated_ids).values()) == {"running"}

            def lease_long_gone() -> bool:
                beats = rows(db, "SELECT max(heartbeat_at) FROM jobs WHERE id IN (?,?,?,?)", *gated_ids)[0][0]
                age = datetime.now(UTC) - datetime.fromisoformat(beats).replace(tzinfo=UTC)
                return age.total_seconds() > STALL + 1

            # Held full past the stall timeout, so a sweeper could call them stalled.
            wait_for(
                lease_long_gone,
                60,
                interval=0.2,
                message="the held jobs' heartbeats to be older than the stall timeout",
            )
            assert set(statuses(db, gated_ids).values()) == {"running"}

            # SIGTERM to serve during the outage: it stops within its grace and keeps what it could not write.
            serve.signal(signal.SIGTERM)
            code, took = serve.wait_exit(timeout=GRACE + 10)
            assert code == 0, serve.out()
            assert "kept 2 outcomes" in serve.out(), serve.out()
            spools = disk / "instance" / "acks"
            kept = [p for p in spools.glob("*.acks") if p.read_bytes().strip(b"\0")]
            assert len(kept) == 1, "the kept outcomes' file"

            # Space comes back.
            outage_ended = time.monotonic()
            ballast.unlink()
            wait_for(
                lambda: set(statuses(db, gated_ids).values()) == {"completed"}, 30,
                message="the four finished jobs to be acknowledged",
            )  # fmt: skip
            acked_after = time.monotonic() - outage_ended
            serve = JobdeckProcess(tmp_path, config, "serve", name="serve2", log_level="info")
            serve.wait_serving()
            wait_for(lambda: health(serve.url)[0] == 200, 15, message="health to say 200")
            after = [post(serve.url, {"type": MARK, "payload": {"log": str(log)}}) for _ in range(10)]
            assert [s for s, _, _ in after] == [201] * 10, after
            everything = gated_ids + accepted + [b["id"] for _, _, b in after]

            def all_completed() -> bool:
                worker.alive()  # type: ignore[union-attr]
                return set(statuses(db, everything).values()) == {"completed"}

            wait_for(all_completed, 120, interval=0.2, message="every job to complete")
            executions = runs(log)
            twice = {i: n for i, n in executions.items() if n != 1}
            assert not twice, f"jobs run more than once: {twice}"
            assert set(executions) == set(everything)
            assert not kept[0].exists(), "the kept outcomes were adopted, and their file removed"
            print(
                f"\nSQLite on a 20 MB tmpfs, serve + worker: {len(accepted)} jobs of 30 KB accepted before full, "
                f"then {len(during) + 1} enqueues answered 507 with Retry-After {headers['Retry-After']} "
                f"(health 503); serve stopped by SIGTERM during the outage in {took:.2f} s (grace {GRACE:g} s) "
                f"and kept 2 outcomes; 4 jobs finished during the outage acknowledged {acked_after:.2f} s "
                f"after space returned; {len(everything)} jobs, each run exactly once"
            )
        finally:
            for p in (serve, worker):
                if p is not None:
                    p.kill()


def serve_pid(serve: JobdeckProcess) -> int:
    """The pid whose pool runs serve's jobs: granian's worker process (the one child)."""
    from tests.adversarial.cli_process import children

    kids = children(serve.proc.pid)
    return kids[0] if kids else serve.proc.pid
