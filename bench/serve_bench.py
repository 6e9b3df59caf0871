"""Scenarios against a real ``jobdeck serve`` / ``jobdeck worker`` process:
HTTP enqueue (wrk), cross-process latency, steady state, the dashboard at
scale and memory while draining."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import REPO, median, percentile
from bench.peers.pg_harness import rss_mb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(db: Path, config: Path | None = None, **settings: Any) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), JOBDECK_DATABASE_URL=f"sqlite:///{db}",
               JOBDECK_INSTANCE_PATH=str(db.parent / "instance"), JOBDECK_SECRET_KEY="bench")  # fmt: skip
    env.pop("JOBDECK_CONFIG", None)
    if config is not None:
        env["JOBDECK_CONFIG"] = str(config)
    for key, value in settings.items():
        env[f"JOBDECK_{key.upper()}"] = str(value)
    return env


@contextmanager
def process(
    db: Path, command: str, config: Path | None = None, extra_env: dict[str, str] | None = None, **settings: Any
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``python -m jobdeck.cli serve|worker --demo`` on ``db``; yields (proc, port).
    ``extra_env``: more variables (``OTEL_*``, say) for the process."""
    port = _free_port()
    args = [sys.executable, "-m", "jobdeck.cli", command, "--demo", "--log-level", "warning"]
    if command == "serve":
        args += ["--bind", f"127.0.0.1:{port}"]
    env = {**_env(db, config, **settings), **(extra_env or {})}
    with open(db.parent / f"{command}-{port}.log", "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=log)
        try:
            if command == "serve":
                _wait_healthy(proc, port, db.parent / f"serve-{port}.log")
            yield proc, port
        finally:
            stop(proc)


def get(port: int, path: str, conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    if conn is None:
        c.close()
    return r.status, body


def fresh_db(workdir: Path, name: str) -> Path:
    from jobdeck.store.engine import make_engine
    from jobdeck.store.migrate import upgrade

    db = workdir / name
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    engine = make_engine(f"sqlite:///{db}")
    upgrade(engine)  # through the migrations, as the processes under test expect
    engine.dispose()
    return db


def _t(dt: datetime) -> str:
    return dt.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def fill(db: Path, n: int, *, dead: int = 0, types: int = 1, status: str = "pending") -> None:
    """Insert ``n`` jobs straight into the file (the set-up, not measured)."""
    now = _t(datetime.now(UTC))
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    sql = ("INSERT INTO jobs (type, queue, payload, priority, status, attempt, retry_count, max_retries, error, "
           "available_at, created_at, updated_at, finished_at) VALUES (?, 'default', ?, 0, ?, ?, 0, 0, ?, ?, ?, ?, ?)")  # fmt: skip
    chunk = 50_000
    for start in range(0, n, chunk):
        rows = []
        for i in range(start, min(n, start + chunk)):
            kind = "demo.noop" if types == 1 else f"demo.type{i % types}"
            if i < dead:
                rows.append((kind, f'{{"user_id":"u{i}"}}', "dead", 1, f"RuntimeError: boom {i}", now, now, now, now))
            else:
                done = status == "completed"
                rows.append(
                    (kind, f'{{"user_id":"u{i}"}}', status, int(done), None, now, now, now, now if done else None)
                )
        conn.execute("BEGIN")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    conn.close()


ENQUEUE_BODY = '{"type":"demo.noop"}'
REFUSED_BODY = '{"type":"no.such.type"}'
"""The control: a POST of the same shape that validation refuses (422)
before any database work, so its rate is what the server, the API's guard
and the body's parsing allow an enqueue at most."""


def _wrk(
    port: int, path: str, seconds: int, connections: int, body: str | None, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """wrk on ``path``: a GET, or a JSON POST of ``body`` (with ``headers``, if any)."""
    cmd = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if body is not None:
        more = "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in (headers or {}).items())
        script = Path(REPO / "bench" / "results" / f"post-{zlib.crc32((body + more).encode()):08x}.lua")
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                          'wrk.headers["Content-Type"] = "application/json"\n' + more)  # fmt: skip
        cmd += ["-s", str(script)]
    out = subprocess.run([*cmd, f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"{label}%\s+([\d.]+)(us|ms|s)\b", out)
        if not m:
            return float("nan")
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": ms("50"), "p99_ms": ms("99"),
        "errors": (int(errors.group(1)) if errors else 0) + (sum(map(int, socket_errors.groups())) if socket_errors else 0),
    }  # fmt: skip


HTTP_SERVERS = ("waitress", "gunicorn", "granian")
"""The production servers scenario 3 compares: ``jobdeck serve`` with
``http_server`` waitress or granian, and gunicorn's ``gthread`` worker on
``jobdeck.wsgi`` (one worker process: one pool and scheduler)."""


@contextmanager
def http_server(
    db: Path, server: str, threads: int, workers: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """One server on ``db`` with its embedded pool running (``workers``
    threads, by default the configured number; 0: no pool) and ``threads``
    request threads; yields (proc, port)."""
    pool = {} if workers is None else {"workers": workers}
    if server != "gunicorn":
        with process(db, "serve", http_server=server, http_threads=threads, **pool) as running:
            yield running
        return
    port = _free_port()
    args = [sys.executable, "-m", "gunicorn", "-k", "gthread", "-w", "1", f"--threads={threads}",
            f"--bind=127.0.0.1:{port}", "--log-level=warning", "jobdeck.wsgi:app"]  # fmt: skip
    env = _env(db, bind=f"127.0.0.1:{port}", demo=1, **pool)
    with open(db.parent / f"gunicorn-{port}.log", "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=log)
        try:
            _wait_healthy(proc, port, db.parent / f"gunicorn-{port}.log")
            yield proc, port
        finally:
            stop(proc)


def http_enqueue(
    workdir: Path,
    seconds: int,
    runs: int,
    connections: int = 16,
    threads: int | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """wrk against GET /api/health, a refused POST (the control,
    ``REFUSED_BODY``) and POST /api/jobs in the same server, for each of
    ``HTTP_SERVERS`` serving Jobdeck on SQLite (synchronous FULL) with its
    embedded pool running. The three servers run side by side and are
    measured in interleaved rounds (the three calls on each server in turn,
    ``runs`` rounds after a warm-up round), so a slow minute of the machine
    lands on all of them. Each figure is the median round; ``ratio`` is
    POST/health within a server, ``refused_ratio`` the control's. The
    top-level ``health``, ``enqueue`` and ``ratio`` are those of ``jobdeck
    serve``'s default server.
    ``workers=0`` measures the HTTP path without the pool beside it."""
    if not shutil.which("wrk"):
        return {"skipped": "wrk not installed (apt-get install -y wrk)"}
    from jobdeck.core.config import Config

    threads = threads or Config().http_threads
    calls = (
        ("health", "/api/health", None),
        ("refused", "/api/jobs", REFUSED_BODY),
        ("enqueue", "/api/jobs", ENQUEUE_BODY),
    )
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {s: {label: [] for label, *_ in calls} for s in HTTP_SERVERS}
    with contextlib_exit() as stack:
        ports = {}
        for server in HTTP_SERVERS:
            db = fresh_db(workdir, f"http-{server}.db")
            ports[server] = stack.enter_context(http_server(db, server, threads, workers))[1]
        for n in range(runs + 1):
            for server in HTTP_SERVERS:
                for label, path, body in calls:
                    result = _wrk(ports[server], path, 1 if n == 0 else seconds, connections, body)
                    if n:  # round 0 warms every server up
                        rounds[server][label].append(result)
    out: dict[str, Any] = {"servers": {}, "default": Config().http_server, "connections": connections,
                           "threads": threads, "workers": Config().workers if workers is None else workers}  # fmt: skip
    for server, by_label in rounds.items():
        figures: dict[str, Any] = {}
        for label, results in by_label.items():
            ordered = sorted(results, key=lambda r: r["rps"])
            figures[label] = dict(ordered[len(ordered) // 2], runs=[r["rps"] for r in results])
        figures["ratio"] = figures["enqueue"]["rps"] / figures["health"]["rps"]
        figures["refused_ratio"] = figures["refused"]["rps"] / figures["health"]["rps"]
        out["servers"][server] = figures
    out.update(out["servers"][out["default"]])
    print_http_table(out)  # what ``bench/run.py --only 3`` shows per server
    return out


def single_enqueue(workdir: Path, seconds: int, runs: int, connections: int = 16) -> dict[str, Any]:
    """Issue 33's single HTTP enqueue: ``POST /api/jobs`` against its
    control (``REFUSED_BODY``, a 422 before any database work) in the same
    ``jobdeck serve`` (the default server, 16 request threads, SQLite FULL),
    wrk at ``connections``. Two servers side by side, each on its own file:
    as users run it, with the embedded pool claiming and completing the
    posted jobs ("pool"), and without it (``workers`` 0: "no pool"), which
    shows what the pool's writes on SQLite's one write lock cost the
    enqueue. Each round measures, on each server in turn, the control and
    the enqueue back to back (their order alternating by round), so a slow
    minute of the machine lands on both; ``runs`` rounds after a warm-up.
    Prints each round as it ends (control, enqueue, ratio, p50 and p99, the
    load average) and the medians; the ratio is the median of the rounds'
    ratios. Target: ratio >= 80% and p99 < 25 ms."""
    if not shutil.which("wrk"):
        return {"skipped": "wrk not installed (apt-get install -y wrk)"}
    configs = {"pool": None, "no pool": 0}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    print(
        "| server | round | control (422) req/s | POST /api/jobs req/s | ratio | POST p50 / p99 ms | errors | load 1 min |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with contextlib_exit() as stack:
        ports = {}
        for name, workers in configs.items():
            db = fresh_db(workdir, f"single-{name.replace(' ', '-')}.db")
            ports[name] = stack.enter_context(http_server(db, "granian", 16, workers))[1]
        for n in range(runs + 1):
            for name, port in ports.items():
                calls = [("control", REFUSED_BODY), ("enqueue", ENQUEUE_BODY)]
                got = {label: _wrk(port, "/api/jobs", 1 if n == 0 else seconds, connections, body)
                       for label, body in (calls if n % 2 else calls[::-1])}  # fmt: skip
                if not n:
                    continue  # round 0 warms both servers up
                c, e = got["control"], got["enqueue"]
                row = {"control": c, "enqueue": e, "ratio": e["rps"] / c["rps"], "load": os.getloadavg()[0]}
                rounds[name].append(row)
                print(f"| {name} | {n} | {c['rps']:,.0f} | {e['rps']:,.0f} | {row['ratio']:.0%} "
                      f"| {e['p50_ms']:.1f} / {e['p99_ms']:.1f} | {e['errors']} | {row['load']:.1f} |", flush=True)  # fmt: skip
    out: dict[str, Any] = {"connections": connections, "seconds": seconds, "rounds": rounds}
    print("| server | medians | control (422) req/s | POST /api/jobs req/s | ratio | POST p99 ms | target met |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in rounds.items():
        figures = {
            "control": median([r["control"]["rps"] for r in rows]),
            "enqueue": median([r["enqueue"]["rps"] for r in rows]),
            "ratio": median([r["ratio"] for r in rows]),
            "p99_ms": median([r["enqueue"]["p99_ms"] for r in rows]),
            "errors": sum(r["enqueue"]["errors"] for r in rows),
            "load": [r["load"] for r in rows],
        }
        figures["met"] = figures["ratio"] >= 0.8 and figures["p99_ms"] < 25 and not figures["errors"]
        out[name] = figures
        print(f"| {name} | {len(rows)} rounds | {figures['control']:,.0f} | {figures['enqueue']:,.0f} "
              f"| {figures['ratio']:.0%} | {figures['p99_ms']:.1f} | {'yes' if figures['met'] else 'no'} |")  # fmt: skip
    return out


def print_http_table(result: dict[str, Any]) -> None:
    """The per-server table of ``http_enqueue``. "refused" is the control
    (``REFUSED_BODY``): wrk counts its 422s as non-2xx, so they are not errors here."""
    print(f"| server ({result['threads']} threads, {result['workers']} pool threads, wrk {result['connections']} conns) "
          "| GET /api/health req/s | POST refused (422) req/s | POST /api/jobs req/s | POST p50 / p99 ms "
          "| refused/health | POST/health | errors |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for server, f in result["servers"].items():
        h, r, e = f["health"], f["refused"], f["enqueue"]
        mark = " (default)" if server == result["default"] else ""
        print(f"| {server}{mark} | {h['rps']:,.0f} | {r['rps']:,.0f} | {e['rps']:,.0f} | {e['p50_ms']:.1f} / {e['p99_ms']:.1f} "
              f"| {f['refused_ratio']:.0%} | {f['ratio']:.0%} | {h['errors'] + e['errors']} |")  # fmt: skip


def _wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if get(port, "/api/health")[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a server or worker process: SIGTERM, and SIGKILL past a minute (the idle harness uses it too)."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_started(conn: sqlite3.Connection, job_id: int, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT started_at FROM attempts WHERE job_id = ?", (job_id,)).fetchone()
        if row:
            return str(row[0])
        time.sleep(0.001)
    raise RuntimeError(f"job {job_id} did not run within {timeout} s")


def latency_cross_process(workdir: Path, n: int) -> dict[str, Any]:
    """POST one job at a time to a serve process (no workers); a separate
    worker process runs it. Enqueue-to-handler-start, ms (wall clock)."""
    db = fresh_db(workdir, "xlat.db")
    samples: list[float] = []
    with process(db, "serve", workers=0) as (_, port), process(db, "worker", workers=4):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        watch = sqlite3.connect(db)
        for i in range(n + 5):
            t0 = datetime.now(UTC)
            c.request("POST", "/api/jobs", body='{"type":"demo.noop"}', headers={"Content-Type": "application/json"})
            r = c.getresponse()
            job = json.loads(r.read())
            started = datetime.fromisoformat(_wait_started(watch, job["id"])).replace(tzinfo=UTC)
            if i >= 5:  # the first few warm the worker up
                samples.append((started - t0).total_seconds() * 1000)
        watch.close()
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "n": n}


def memory_drain(workdir: Path, n: int) -> dict[str, Any]:
    """RSS of ``jobdeck serve`` (4 workers; its worker process included)
    draining ``n`` pre-filled jobs."""
    db = fresh_db(workdir, "mem.db")
    fill(db, n)
    samples: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    with process(db, "serve", workers=4) as (proc, _):
        watch = sqlite3.connect(db)
        while True:
            done = watch.execute("SELECT coalesce(max(id), 0) FROM attempts").fetchone()[0]
            samples.append((int(done), rss_mb(proc.pid)))
            if done >= n:
                break
            if time.perf_counter() - t0 > max(120, n / 2000):
                raise RuntimeError(f"memory drain stalled at {done}/{n}")
            time.sleep(0.5)
        watch.close()
    elapsed = time.perf_counter() - t0
    after_tenth = [rss for done, rss in samples if done >= n // 10] or [samples[-1][1]]
    return {
        "jobs": n, "max_rss_mb": max(r for _, r in samples), "rss_at_10pct_mb": after_tenth[0],
        "rss_end_mb": samples[-1][1], "growth_after_10pct_mb": max(after_tenth) - after_tenth[0],
        "jobs_per_s_incl_startup": n / elapsed,
    }  # fmt: skip


DASHBOARD_PATHS = ["/", "/jobs/pending", "/jobs/scheduled", "/jobs/running", "/jobs/failed", "/jobs/dead",
                   "/jobs/completed", "/jobs/discarded", "/jobs/dead?type=demo.type7", "/jobs/dead?q=boom%201234",
                   "/jobs/completed?type=demo.type3", "/jobs/{id}", "/api/jobs?status=dead",
                   "/api/jobs?status=dead&type=demo.type7", "/api/jobs/{id}", "/api/stats"]  # fmt: skip


def dashboard(workdir: Path, n: int, requests: int) -> dict[str, Any]:
    """GET each page ``requests`` times over one keep-alive connection with
    ``n`` jobs stored (10% dead, over 20 types). A path that 404s on this
    branch is skipped with the reason."""
    db = fresh_db(workdir, "dash.db")
    fill(db, n, dead=n // 10, types=20, status="completed")
    out: dict[str, Any] = {}
    with process(db, "serve", workers=0) as (_, port):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for template in DASHBOARD_PATHS:
            path = template.format(id=n // 20)
            status, _ = get(port, path, c)
            if status == 404:
                out[path] = {"skipped": "404 on this branch (the dashboard is built elsewhere)"}
                continue
            if status >= 400:
                out[path] = {"skipped": f"HTTP {status}"}
                continue
            times = []
            for _ in range(requests):
                t = time.perf_counter()
                get(port, path, c)
                times.append((time.perf_counter() - t) * 1000)
            out[path] = {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99)}
    return out


def steady(workdir: Path, rate: float, seconds: float, processes: int) -> dict[str, Any]:
    """A producer enqueues ``rate`` jobs/s (batches every 10 ms) for
    ``seconds`` while ``processes`` worker processes (4 threads each) run
    them. Backlog at the end, completions/s, p99 enqueue-to-start, and any
    "database is locked" in the workers' logs."""
    from bench.common import make_deck

    db = workdir / "steady.db"
    for old in workdir.glob("worker-*.log"):
        old.unlink()
    deck = make_deck(db, "FULL", 0)
    deck.registry.handler("demo.noop")(lambda p, c: None)
    with contextlib_exit() as stack:
        # The same configuration as scenario 1 (no concurrency limits): the
        # demo config's limit on demo.charge-card would send every claim
        # through the limit-aware claim (jobdeck.jobs.queues), which is measured apart.
        unlimited = workdir / "unlimited.toml"
        unlimited.write_text("[types]\n")
        procs = [stack.enter_context(process(db, "worker", config=unlimited, workers=4, poll_interval=0.05))
                 for _ in range(processes)]  # fmt: skip
        time.sleep(1.0)  # the workers are up
        t0 = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - t0) < seconds:
            due = int(rate * elapsed) - sent
            if due > 0:
                deck.enqueue_many([{"type": "demo.noop"}] * due)
                sent += due
            time.sleep(0.01)  # the producer's pace
        with sqlite3.connect(db) as watch:
            backlog = watch.execute("SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')").fetchone()[0]
            lat = [r[0] for r in watch.execute(
                "SELECT (julianday(a.started_at) - julianday(j.created_at)) * 86400000 FROM attempts a JOIN jobs j ON j.id = a.job_id"
            )]  # fmt: skip
            completed = watch.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[0]
        _ = procs
    deck.store.engine.dispose()
    locked = sum(p.read_text(errors="replace").count("database is locked") for p in workdir.glob("worker-*.log"))
    return {"sent": sent, "completed_per_s": completed / seconds, "backlog_at_end": backlog,
            "p99_ms": percentile(lat, 99), "p50_ms": percentile(lat, 50), "locked_errors": locked}  # fmt: skip


def contextlib_exit() -> Any:
    import contextlib

    return contextlib.ExitStack()


if __name__ == "__main__":
    # python3 -m bench.serve_bench [seconds] [runs] [workers]: scenario 3's three servers, as a table;
    # python3 -m bench.serve_bench single [seconds] [runs]: the single enqueue against its control
    import tempfile

    if sys.argv[1:2] == ["single"]:
        with tempfile.TemporaryDirectory() as tmp:
            seconds, runs = ([int(a) for a in sys.argv[2:4]] + [5, 5][len(sys.argv[2:4]) :])[:2]
            print(json.dumps(single_enqueue(Path(tmp), seconds, runs), indent=1, default=str))
        sys.exit(0)
    with tempfile.TemporaryDirectory() as tmp:
        args = [int(a) for a in sys.argv[1:4]]
        seconds, runs = (args + [5, 3][len(args) :])[:2]
        result = http_enqueue(Path(tmp), seconds, runs, workers=args[2] if len(args) > 2 else None)
    print(json.dumps(result, indent=1, default=str))
