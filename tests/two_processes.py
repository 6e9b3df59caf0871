"""Two real ``jobdeck serve`` processes on one database (as two hosts would
run), for the runtime-schedule tests and their browser twin."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TwoProcesses:
    """``python -m jobdeck.cli serve`` twice, each with workers and the scheduler."""

    def __init__(self, db_url: str, tmp_path: Path, extra_toml: str = "") -> None:
        config = tmp_path / "jobdeck.toml"
        config.write_text(
            f"database_url = {json.dumps(db_url)}\n"
            f"instance_path = {json.dumps(str(tmp_path / 'instance'))}\n"
            'secret_key = "the-same-secret-on-every-host"\n'
            "demo = true\nworkers = 2\nhttp_threads = 4\npoll_interval = 0.2\nheartbeat_interval = 0.5\n"
            "shutdown_grace = 5.0\n" + extra_toml
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        env.update(PYTHONPATH=str(ROOT), JOBDECK_CONFIG=str(config))
        self.ports = [free_port(), free_port()]
        self.logs = [tmp_path / f"proc{i}.log" for i in range(2)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for port, log in zip(self.ports, self.logs):
            with log.open("wb") as fh:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "jobdeck.cli",
                            "serve",
                            "--bind",
                            f"127.0.0.1:{port}",
                            "--log-level",
                            "info",
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                    )  # fmt: skip
                )

    def url(self, i: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in self.logs)

    def check_alive(self, *which: int) -> None:
        for i, p in enumerate(self.procs):
            if (not which or i in which) and p.poll() is not None:
                raise AssertionError(f"process {p.pid} exited with {p.returncode}:\n{self.tails()}")

    def up(self) -> bool:
        self.check_alive()
        for i in range(2):
            try:
                with urllib.request.urlopen(f"{self.url(i)}/api/health", timeout=2):
                    pass
            except (urllib.error.URLError, OSError):
                return False
        return True

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, i: int = 0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url(i)}{path}", data, {"content-type": "application/json"},
                                         method=method)  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

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
