"""Real ``python -m jobdeck.cli worker`` processes on one database and config
file, for the multi-process tests of flow limits and snooze."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def write_config(db_url: str, tmp_path: Path, settings: str) -> Path:
    """``tmp_path/jobdeck.toml``: the database, an instance folder, and ``settings`` (TOML lines)."""
    config = tmp_path / "jobdeck.toml"
    config.write_text(
        f"database_url = {json.dumps(db_url)}\ninstance_path = {json.dumps(str(tmp_path / 'instance'))}\n" + settings
    )
    return config


def start_workers(config: Path, n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` worker processes on ``config``, each logging to ``workerN.log`` beside it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(PYTHONPATH=str(ROOT), JOBDECK_CONFIG=str(config))
    procs = []
    for i in range(n):
        with (config.parent / f"worker{i}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "jobdeck.cli", "worker", "--log-level", "warning"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each (a graceful stop), then wait; kill what does not stop in 30 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
