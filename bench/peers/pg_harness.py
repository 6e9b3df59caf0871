"""The PostgreSQL scenarios, written once for every system (Jobdeck and the
peers): each system supplies a small adapter (see ``System``) and this
module does the measuring, so every system is timed by the same code.

It runs in each system's own interpreter: Python 3.11 with ``app`` for
Jobdeck (``bench/pg_jobdeck.py``), a peer's virtualenv for the peers
(``bench/peers/pg_peers.py``). It needs only the standard library and
psycopg 3. One measurement per process; it prints one JSON line.

Scenarios (the same no-op job everywhere):

- ``drain``: fill ``n`` jobs (not timed), ``VACUUM ANALYZE``, start
  ``--procs`` consumer processes and wait until each has set itself up
  (imports, connections), then tell them to go: jobs/s from "go" until the
  database counts ``n`` completed (polled every ``POLL`` s, with a deadline).
- ``enqueue1``: ``n`` calls of one job each, sequential; each durable on
  return (a committed transaction, ``synchronous_commit`` on). jobs/s.
- ``enqueue1000``: ``n`` jobs, 1,000 per call. jobs/s.
- ``latency``: one consumer process running at idle; enqueue one job, the
  consumer's handler prints its start time (wall clock, same machine), wait
  until that job is completed too, then the next one. p50/p99 ms over ``n``
  jobs after ``LATENCY_WARMUP`` discarded ones.

Consumer protocol: a consumer process prints ``BENCH ready`` once set up,
reads one line (``go``) from stdin, then consumes until it is terminated.
With ``BENCH_REPORT_STARTS=1`` in its environment its handler prints
``BENCH start <i> <time.time()>`` (``i`` from the job's payload).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Protocol

ADMIN_DSN = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
POLL = (0.002, 0.05)
"""Least and most seconds between two counts of completed jobs: half the
time the rate so far says is left, within these bounds, so the count is
precise at the end and costs the server little before (counting a
20,000-row table every few milliseconds would compete with the consumers)."""
LATENCY_WARMUP = 5
REPORT_STARTS = os.environ.get("BENCH_REPORT_STARTS") == "1"


class System(Protocol):
    """What a system's adapter provides. ``dsn`` names its own database,
    which ``install`` creates afresh (dropping the last run's)."""

    dsn: str

    def install(self) -> None: ...

    def fill(self, n: int) -> None: ...

    def completed(self, conn: Any) -> int: ...

    def consumer(self) -> tuple[list[str], dict[str, str], str]:
        """(argv, environment, working directory) of one consumer process."""
        ...

    def enqueue_single(self, n: int) -> float:
        """Seconds for ``n`` sequential calls enqueuing one job each."""
        ...

    def enqueue_bulk(self, n: int, batch: int) -> float:
        """Seconds for ``n`` jobs enqueued ``batch`` per call."""
        ...

    def enqueue_one(self, i: int) -> None:
        """Enqueue one job with ``i`` in its payload (latency)."""
        ...

    def close(self) -> None: ...


def report_start(i: Any) -> None:
    """Called first thing by a handler: prints its start for ``latency``."""
    if REPORT_STARTS:
        print(f"BENCH start {i} {time.time():.6f}", flush=True)


def wait_for_go() -> None:
    """A consumer's set-up is done: say so, and block until the harness says go."""
    print("BENCH ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)


def fresh_database(name: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def vacuum_analyze(dsn: str) -> None:
    """Autovacuum is off on the local server and TRUNCATE drops statistics:
    every system's consumers plan on fresh statistics."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _readline(stream: IO[str], deadline: float) -> str:
    """The next ``BENCH`` line of a consumer's stdout, before ``deadline``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            raise TimeoutError("a consumer said nothing in time")
        line = stream.readline()
        if not line:
            raise RuntimeError("a consumer exited")
        if line.startswith("BENCH "):
            return line.split(" ", 1)[1].strip()


@contextmanager
def consumers(system: System, count: int, report_starts: bool = False) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` consumer processes, each set up and waiting for ``go``."""
    argv, env, cwd = system.consumer()
    if report_starts:
        env = dict(env, BENCH_REPORT_STARTS="1")
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen(argv, env=env, cwd=cwd, text=True, bufsize=1, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE))  # fmt: skip
        for p in procs:
            assert p.stdout is not None
            if _readline(p.stdout, time.monotonic() + 60) != "ready":
                raise RuntimeError("a consumer did not get ready")
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def go(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()


def _wait_completed(system: System, conn: Any, n: int, deadline: float, procs: list[subprocess.Popen[str]]) -> None:
    t0 = time.monotonic()
    while (done := system.completed(conn)) < n:
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"stalled at {done}/{n} completed")
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a consumer exited at {done}/{n} completed")
        left = (n - done) * (now - t0) / done if done else POLL[1]
        time.sleep(min(POLL[1], max(POLL[0], left / 2)))
    if done != n:
        raise RuntimeError(f"{done} completed, expected {n}")


def drain(system: System, n: int, procs: int) -> dict[str, float]:
    import psycopg

    system.fill(n)
    vacuum_analyze(system.dsn)
    with psycopg.connect(system.dsn, autocommit=True) as watch, consumers(system, procs) as running:
        if system.completed(watch) != 0:
            raise RuntimeError("jobs completed before go")
        pids = [p.pid for p in running]
        cpu0, server0 = _cpu_seconds(pids), _cpu_seconds(_server_pids())
        t0 = time.perf_counter()
        go(running)
        _wait_completed(system, watch, n, time.monotonic() + max(120.0, n / 50), running)
        elapsed = time.perf_counter() - t0
        cpu, server = _cpu_seconds(pids) - cpu0, _cpu_seconds(_server_pids()) - server0
        rss = max(rss_mb(p.pid) for p in running)
    return {
        "rate": n / elapsed,
        "seconds": elapsed,
        "rss_mb": rss,
        "consumer_cpu_us": cpu / n * 1e6,
        "server_cpu_us": server / n * 1e6,
    }


def _cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes ``pids`` (and their
    threads) have used so far; a process that is gone counts nothing."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _server_pids() -> list[int]:
    """Every PostgreSQL server process on this machine (backends, WAL writer,
    checkpointer...): what the server spent on a drain, whoever's backend."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == "postgres":
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def rss_mb(pid: int) -> float:
    """A process's resident memory now, its children's included (none of the
    peers forks; granian's ``jobdeck serve`` runs the app in a worker process)."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{p}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        except FileNotFoundError:  # a child that exited meanwhile
            continue
    return total / 1024


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def enqueue(system: System, n: int, batch: int) -> dict[str, float]:
    warm = batch if batch > 1 else 50
    if batch == 1:
        system.enqueue_single(warm)
        elapsed = system.enqueue_single(n)
    else:
        system.enqueue_bulk(warm, batch)
        elapsed = system.enqueue_bulk(n, batch)
    return {"rate": n / elapsed, "seconds": elapsed}


def latency(system: System, n: int) -> dict[str, float]:
    import psycopg

    samples: list[float] = []
    with psycopg.connect(system.dsn, autocommit=True) as watch, consumers(system, 1, report_starts=True) as running:
        go(running)
        out = running[0].stdout
        assert out is not None
        for i in range(n + LATENCY_WARMUP):
            t0 = time.time()
            system.enqueue_one(i)
            word, job, started = _readline(out, time.monotonic() + 30).split()
            if word != "start" or int(job) != i:
                raise RuntimeError(f"expected the start of job {i}, got {word} {job}")
            if i >= LATENCY_WARMUP:
                samples.append((float(started) - t0) * 1000)
            _wait_completed(system, watch, i + 1, time.monotonic() + 30, running)  # idle before the next
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "n": n}


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (the same as bench/common.py's)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return float(ordered[k])


SCENARIOS = ("drain", "enqueue1", "enqueue1000", "latency")


def main(make: Callable[[], System], consume: Callable[[], None], argv: list[str] | None = None) -> int:
    """``SCENARIO N [--procs K]`` measures once and prints JSON; ``consume``
    runs one consumer process (started by ``drain`` and ``latency``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=[*SCENARIOS, "consume"])
    ap.add_argument("n", type=int, nargs="?", default=0)
    ap.add_argument("--procs", type=int, default=1, help="drain: consumer processes")
    args = ap.parse_args(argv)
    if args.scenario == "consume":
        consume()
        return 0
    system = make()
    try:
        system.install()
        if args.scenario == "drain":
            result = drain(system, args.n, args.procs)
        elif args.scenario == "latency":
            result = latency(system, args.n)
        else:
            result = enqueue(system, args.n, 1 if args.scenario == "enqueue1" else 1000)
    finally:
        system.close()
    print(json.dumps(result), flush=True)
    return 0
