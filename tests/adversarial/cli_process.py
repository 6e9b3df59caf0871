"""A real ``jobdeck serve`` or ``jobdeck worker`` in a subprocess, for the
tests that signal, flood or starve it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobdeck.core.states import State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine

from tests.conftest import wait_for

ROOT = Path(__file__).parents[2]


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (none once it is gone): on granian,
    ``jobdeck serve``'s worker process, which runs the app and its pool."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except FileNotFoundError:
        return []
    return found


def exited(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, **values: Any) -> Path:
    """A jobdeck.toml on a SQLite file in ``tmp_path``; ``values`` add keys."""
    settings: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path / 'jobdeck.db'}",
        "instance_path": str(tmp_path / "instance"),
        "secret_key": "test-secret",
        "demo": True,
        "workers": 2,
        "poll_interval": 0.2,
        "heartbeat_interval": 0.5,
        "stall_timeout": 5.0,
        **values,
    }
    path = tmp_path / "jobdeck.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return path


class JobdeckProcess:
    """``python -m jobdeck.cli <command>`` with its own config, stdout and stderr
    in files (read them with ``out`` and ``err``)."""

    def __init__(
        self,
        tmp_path: Path,
        config: Path,
        command: str = "serve",
        *,
        name: str = "jobdeck",
        preexec_fn: Callable[[], None] | None = None,
        log_level: str = "warning",
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        args = [command, "--log-level", log_level]
        if command == "serve":
            args += ["--bind", f"127.0.0.1:{self.port}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        env.update(PYTHONPATH=str(ROOT), JOBDECK_CONFIG=str(config))
        self.stdout = tmp_path / f"{name}.out"
        self.stderr = tmp_path / f"{name}.err"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jobdeck.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=err,
                preexec_fn=preexec_fn,
            )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def out(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()

    def err(self) -> str:
        return self.stderr.read_text()

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"jobdeck exited with {self.proc.returncode}:\n{self.out()}")
        return True

    def health(self, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(f"{self.url}/api/health", timeout=timeout) as response:
            return json.load(response)

    def wait_serving(self, timeout: float = 60.0) -> None:
        def answers() -> bool:
            self.alive()
            try:
                self.health(timeout=2.0)
            except OSError:
                return False
            return True

        wait_for(answers, timeout, interval=0.05, message="jobdeck serve to answer /api/health")

    def wait_logged(self, text: str, timeout: float = 30.0) -> None:
        try:
            wait_for(lambda: text in self.out(), timeout, interval=0.02, message=f"{text!r} in the process's output")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the output:\n{self.out()}") from None

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """(exit code, seconds it took)."""
        began = time.monotonic()
        code = self.proc.wait(timeout=timeout)
        return code, time.monotonic() - began

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def serving_a_job(
    tmp_path: Path, seconds: float, *, preexec_fn: Callable[[], None] | None = None, log_level: str = "warning",
    **config: Any,
) -> Iterator[tuple[JobdeckProcess, Store, int]]:  # fmt: skip
    """``jobdeck serve`` (granian, one worker process) on a SQLite file in
    ``tmp_path`` with ``config``, serving, and a ``demo.sleep`` job of
    ``seconds`` running in it: (the process, a store on its database, the
    job's id). The process is killed and the store closed on the way out."""
    path = write_config(tmp_path, workers=1, http_server="granian", **config)
    proc = JobdeckProcess(tmp_path, path, "serve", preexec_fn=preexec_fn, log_level=log_level)
    engine = make_engine(f"sqlite:///{tmp_path / 'jobdeck.db'}", pool_size=2)
    store = Store(engine)
    try:
        proc.wait_serving()
        job_id = store.enqueue(NewJob("demo.sleep", {"seconds": seconds}, max_retries=3), datetime.now(UTC))[0].id
        wait_for(lambda: proc.alive() and store.get(job_id).status is State.RUNNING, 30, message="the job to run")
        yield proc, store, job_id
    finally:
        proc.kill()
        engine.dispose()
