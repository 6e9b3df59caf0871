"""A file system that turns read-only under a running ``jobdeck serve``:
SQLite on an ext4 image mounted ``errors=remount-ro``, made read-only by
the kernel's own error path (what a failing disk does), with the database
and its -wal and -shm files open for writing. (``mount -o remount,ro`` is
refused with EBUSY while they are open, on tmpfs as on any file system.)

Before: enqueues answered 500 ("disk I/O error" from the connections that
were open, "attempt to write a readonly database" from new ones) and
``/api/health`` said all was well.

Now: 503 with ``Retry-After`` and the cause ``read_only``, and health 503.
The guarantee stops there: a job that finished while the file system was
read-only cannot be acknowledged, nor its outcome kept on the same file
system, so after the restart it is rescued and runs again (at-least-once),
and the process says so when it stops.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.adversarial.cli_process import JobdeckProcess, write_config
from tests.adversarial.mounts import ext4_disk
from tests.adversarial.outage_handlers import MARK, runs
from tests.adversarial.test_disk_full import health, post, statuses
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

GRACE = 2.0
STALL = 3.0


def test_a_read_only_file_system_answers_503_and_loses_no_job(tmp_path: Path) -> None:
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    with ext4_disk(tmp_path) as disk:
        db = disk.folder / "jobdeck.db"
        config = write_config(
            tmp_path, database_url=f"sqlite:///{db}", instance_path=str(disk.folder / "instance"), workers=1,
            shutdown_grace=GRACE, stall_timeout=STALL, sweep_interval=0.5,
            handler_modules=["tests.adversarial.outage_handlers"],
        )  # fmt: skip
        serve = JobdeckProcess(tmp_path, config, "serve", name="serve", log_level="info")
        try:
            serve.wait_serving()
            before = [post(serve.url, {"type": MARK, "payload": {"log": str(log)}}) for _ in range(5)]
            assert [s for s, _, _ in before] == [201] * 5, before
            held = post(serve.url, {"type": MARK, "payload": {"log": str(log), "gate": str(gate)}})[2]["id"]
            wait_for(lambda: statuses(db, [held]) == {held: "running"}, 30, message="the gated job to run")
            refused = subprocess.run(["mount", "-o", "remount,ro", str(disk.folder)], capture_output=True, text=True)
            assert refused.returncode != 0, "remount,ro with the database open (the kernel refuses it: EBUSY)"

            disk.make_read_only()
            during = [post(serve.url, {"type": MARK, "payload": {"log": str(log)}}) for _ in range(20)]
            assert {s for s, _, _ in during} == {503}, during
            assert {b["cause"] for _, _, b in during} == {"read_only"}, during
            assert all(int(h.get("Retry-After", 0)) > 0 for _, h, _ in during)
            code, said = health(serve.url)
            assert code == 503 and "read-only" in said["error"], said

            gate.touch()  # the held job finishes; nothing can take its outcome
            wait_for(lambda: runs(log)[held] == 1, 30, message="the gated handler to finish")
            serve.signal(signal.SIGTERM)
            code, took = serve.wait_exit(timeout=GRACE + 15)
            assert code == 0, serve.out()
            assert f"job {held} attempt 1: its outcome (completed) was neither stored nor kept" in serve.out()
        finally:
            serve.kill()
        disk.remount()  # what an operator does once the disk is sound: the journal is replayed
        serve = JobdeckProcess(tmp_path, config, "serve", name="serve2", log_level="info")
        try:
            serve.wait_serving()
            assert health(serve.url)[0] == 200
            ids = [b["id"] for _, _, b in before] + [held]
            wait_for(lambda: set(statuses(db, ids).values()) == {"completed"}, 60, interval=0.2,
                     message="every job to complete")  # fmt: skip
            executions = runs(log)
            assert all(executions[i] == 1 for i in ids if i != held)
            print(
                f"\nSQLite on ext4 turned read-only: {len(during)} enqueues answered 503 (read_only) with "
                f"Retry-After {during[0][1].get('Retry-After')}, health 503; serve stopped in {took:.2f} s "
                f"(grace {GRACE:g} s); the job that finished meanwhile could not be kept and ran "
                f"{executions[held]} times; no job lost"
            )
        finally:
            serve.kill()
