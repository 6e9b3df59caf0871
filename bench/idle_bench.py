"""Idle CPU: what a deployment with nothing to do costs the machine.

Usage: ``python3 -m bench.idle_bench [--seconds 20] [--rounds 3] [--no-peers]``

Each round starts, on a fresh SQLite file with the shipped defaults (as
``bench.shipped_bench`` starts them):

- ``jobdeck worker --demo``, ready once its worker row is in the database;
- ``jobdeck serve --demo`` (granian), ready once ``/api/health`` answers;
- Huey's consumer with Huey's defaults and 4 threads, on SqliteHuey
  (``bench/peers/peer.py``, ``huey_idle``), measured inside its own process.

After three seconds to settle (start-up's schedules and first sweeps), the
CPU time each spent over ``--seconds`` (user and system, every process of its
tree, from ``/proc``) is divided by the wall time: the share of one core, in
percent. The order rotates each round; the table shows the medians and every
round. Nothing is enqueued: this is the cost of waiting, which a small
deployment pays all day.

Where it comes from: the threads that wake on a timer (the fetcher's
``poll_interval``, heartbeats, the scheduler and maintenance) and the
SQLite commit watcher, which since it sleeps on inotify between writes
(``jobdeck.worker.file_changes``) no longer reads every 5 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, machine  # noqa: E402
from bench.serve_bench import stop  # noqa: E402
from bench.shipped_bench import command  # noqa: E402

SETTLE = 3.0
"""Seconds between ready and the measurement: start-up's own work left out."""
TICKS = 100
"""Clock ticks per second in ``/proc/PID/stat`` (``os.sysconf('SC_CLK_TCK')`` on Linux)."""


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it (granian's worker is a child of ``serve``)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while listed
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(parents.get(p, []))
    return found


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)
    return total / TICKS


def _ready(what: str, argv: list[str], url: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
            if what == "serve":
                bind = argv[argv.index("--bind") + 1]
                try:
                    with urllib.request.urlopen(f"http://{bind}/api/health", timeout=2) as answer:
                        if answer.status == 200:
                            return
                except OSError:
                    pass
            else:
                try:
                    with engine.connect() as conn:
                        if conn.execute(text("SELECT count(*) FROM workers WHERE stopped_at IS NULL")).scalar():
                            return
                except Exception:  # noqa: BLE001 (the file or its tables are not there yet)
                    pass
            time.sleep(0.1)  # polling for readiness, under the deadline
        raise RuntimeError(f"{what} was not ready in time")
    finally:
        engine.dispose()


def jobdeck_idle(what: str, seconds: float, work: Path, settle: float = SETTLE) -> float:
    """The share of one core (percent) an idle ``jobdeck worker`` or ``serve`` spends."""
    folder = Path(tempfile.mkdtemp(prefix=f"idle-{what}-", dir=work))
    url = f"sqlite:///{folder / 'jobdeck.db'}"
    argv, env = command(what, url, folder)
    with open(folder / "out.log", "wb") as out:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=out)
    try:
        _ready(what, argv, url, proc, time.monotonic() + 60)
        time.sleep(settle)  # start-up's own work left out of the measurement
        pids = _tree(proc.pid)
        cpu, wall = _cpu_seconds(pids), time.monotonic()
        time.sleep(seconds)  # the measurement window: the process is left alone
        return 100 * (_cpu_seconds(pids) - cpu) / (time.monotonic() - wall)
    finally:
        stop(proc)


def huey_idle(seconds: float) -> float:
    from bench.run import ensure_venv

    out = subprocess.run([ensure_venv(), "peer.py", "huey", "idle", str(int(seconds)), "4"],
                         cwd=REPO / "bench" / "peers", capture_output=True, text=True, timeout=600)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"huey idle: {out.stderr[-1500:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def run(seconds: float, rounds: int, peers: bool = True, settle: float = SETTLE) -> dict[str, Any]:
    systems: dict[str, Any] = {
        "jobdeck worker --demo": lambda work: jobdeck_idle("worker", seconds, work, settle),
        "jobdeck serve --demo": lambda work: jobdeck_idle("serve", seconds, work, settle),
    }
    if peers:
        systems["Huey consumer (defaults, 4 threads)"] = lambda work: huey_idle(seconds)
    names = list(systems)
    per: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="jobdeck-idle-") as tmp:
        for i in range(rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                share = systems[name](Path(tmp))
                per[name].append(share)
                print(f"  round {i + 1}: {name}: {share:.2f}% of a core", flush=True)
    return {"seconds": seconds, "rounds": rounds, "machine": machine(),
            "systems": {name: {"median": statistics.median(v), "rounds": v} for name, v in per.items()}}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    lines = [
        f"| idle, {result['seconds']:g} s after start-up | share of one core (median) | per round |",
        "|---|---|---|",
    ]
    for name, r in result["systems"].items():
        rounds = ", ".join(f"{v:.2f}" for v in r["rounds"])
        lines.append(f"| {name} | {r['median']:.2f}% | {rounds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="leave Huey out (no peers' virtualenv)")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.rounds, peers=not args.no_peers)
    print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
