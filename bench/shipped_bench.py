"""Scenario 1 as users run it: the drain by a real ``jobdeck worker`` and a
real ``jobdeck serve`` process, beside the bare pool and the peers in the
same run; and the cost of tracing (off against on) on the drain and on the
HTTP enqueue.

Usage: ``python3 -m bench.shipped_bench [--full] [--rounds N] [--no-postgres]
[--no-sqlite] [--no-tracing] [--only-tracing] [--no-peers]``. The default sizes take a few minutes;
``--full`` drains issue 33's 100,000 jobs on SQLite (20,000 on PostgreSQL).
``bench/run.py`` runs the same as part of scenario 1.

How a shipped process is timed: the jobs are enqueued with
``deck.enqueue_many`` before the process starts (not timed), then the
process is started exactly as the README says, ``jobdeck serve --demo`` or
``jobdeck worker --demo`` (its defaults: 4 worker threads, SQLite FULL,
granian, log level info), on its own database. Nothing watches it closely
while it drains: the harness asks the database every ``POLL`` seconds
whether any of those jobs is still pending or running (one indexed read,
in autocommit, no read transaction held between two polls: a reader would
hold back SQLite's WAL checkpoints). Once none is, the figure is read from
the database's own timestamps: the jobs over the time from the first
attempt's start to the last job's ``finished_at``. The process's start-up
(imports, migrations, granian's worker) is reported apart, from the spawn
to the first start.

Rounds: each round runs every system once, the order rotated each round;
each ratio is taken within its round, and the median over rounds reported.
SQLite: the bare pool (``bench.jobdeck_bench.drain`` in a fresh process,
as ``bench/compare.py`` runs it), ``jobdeck worker``, ``jobdeck serve`` and
Huey (``bench/peers/peer.py``). PostgreSQL: scenario 10's Jobdeck consumer
(a runtime built in the benchmark's process, ``bench/pg_jobdeck.py``),
``jobdeck worker`` with 1 and with 2 processes, and PgQueuer's consumer with
1 and 2 processes (the first and the last timed by
``bench/peers/pg_harness.py``, from their go to its count of completions).

Tracing (issue 36): ``jobdeck worker`` draining, and ``jobdeck serve``
answering ``POST /api/jobs`` (wrk, 16 connections, each request carrying a
``traceparent``, the refused POST as the control), with tracing off and
with ``JOBDECK_TRACING=1``, interleaved. With tracing on the spans are
exported over OTLP/HTTP to a sink in this process that reads and discards
them (the export's cost is the process's, as with a real collector).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, machine, make_deck  # noqa: E402

POLL = 0.5
"""Seconds between two looks at whether the drain is done (see the module's docstring)."""
FULL = {"sqlite": 100_000, "huey": 20_000, "postgres": 20_000, "tracing": 100_000, "http_seconds": 5, "rounds": 3}
SMALL = {"sqlite": 10_000, "huey": 2_000, "postgres": 5_000, "tracing": 10_000, "http_seconds": 2, "rounds": 2}
TINY = {"sqlite": 300, "huey": 100, "postgres": 300, "tracing": 300, "http_seconds": 1, "rounds": 1}
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PG_DATABASE = "bench_jobdeck_shipped"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _utc(value: Any) -> datetime:
    """A timestamp the store wrote (naive UTC; text on SQLite) as an aware datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _engine(url: str) -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, poolclass=NullPool)  # no connection held between two polls


def fill(url: str, workdir: Path, n: int) -> tuple[int, int]:
    """A migrated database at ``url`` with ``n`` pending ``demo.noop`` jobs,
    enqueued with ``deck.enqueue_many`` as a user would; their first and last ids."""
    deck = make_deck(workdir / "shipped.db", "FULL", 0, database_url=url)
    try:
        deck.registry.handler("demo.noop", max_retries=0)(lambda payload, ctx: None)
        for start in range(0, n, 5000):
            deck.enqueue_many([{"type": "demo.noop"} for _ in range(min(5000, n - start))])
    finally:
        deck.store.engine.dispose()
    from sqlalchemy import text

    engine = _engine(url)
    with engine.connect() as conn:
        first, last = conn.execute(text("SELECT min(id), max(id) FROM jobs WHERE type = 'demo.noop'")).one()
    if url.startswith("postgresql"):  # every system's consumers plan on fresh statistics (pg_harness)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE jobs, attempts"))
    engine.dispose()
    return int(first), int(last)


def fresh_postgres(name: str = PG_DATABASE) -> str:
    """A new, empty PostgreSQL database; its SQLAlchemy URL."""
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def _free_port() -> int:
    from bench.serve_bench import _free_port as free

    return free()


def command(what: str, url: str, workdir: Path, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``jobdeck serve --demo`` or ``jobdeck worker --demo``, with the database
    and instance folder set in the environment and nothing else changed."""
    argv = [sys.executable, "-m", "jobdeck.cli", what, "--demo"]
    if what == "serve":
        argv += ["--bind", f"127.0.0.1:{_free_port()}"]
    full = {k: v for k, v in os.environ.items() if not k.startswith(("JOBDECK_", "OTEL_"))}
    full.update(PYTHONPATH=str(REPO), JOBDECK_DATABASE_URL=url, JOBDECK_INSTANCE_PATH=str(workdir / "instance"),
                JOBDECK_SECRET_KEY="bench")  # fmt: skip
    full.update(env or {})
    return argv, full


def drain(what: str, n: int, workdir: Path, url: str | None = None, procs: int = 1,
          env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One drain of ``n`` pre-enqueued jobs by ``procs`` processes of
    ``jobdeck worker`` (or ``serve``) on SQLite FULL (a fresh file in
    ``workdir``), or on PostgreSQL at ``url``. jobs/s from the first
    attempt's start to the last completion, from the database's timestamps."""
    from sqlalchemy import text

    url = url or f"sqlite:///{workdir / f'{what}.db'}"
    if url.startswith("sqlite"):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{url.removeprefix('sqlite:///')}{suffix}").unlink(missing_ok=True)
    first, last = fill(url, workdir, n)
    engine = _engine(url)
    logs = []
    running: list[subprocess.Popen[bytes]] = []
    try:
        spawned = datetime.now(UTC)
        for i in range(procs):
            argv, full_env = command(what, url, workdir, env)
            log = workdir / f"{what}-{i}.log"
            logs.append(log)
            with open(log, "wb") as out:
                running.append(subprocess.Popen(argv, cwd=workdir, env=full_env, stdout=out, stderr=out))
        deadline = time.monotonic() + max(120.0, n / 500)
        left = text("SELECT id FROM jobs WHERE status IN ('pending', 'running') AND id BETWEEN :a AND :b LIMIT 1")
        while True:
            time.sleep(POLL)
            with engine.connect() as conn:
                if not conn.execute(left, {"a": first, "b": last}).fetchall():
                    break
            if any(p.poll() is not None for p in running) or time.monotonic() > deadline:
                tail = logs[0].read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{what} drain: stopped or stalled with jobs left: {tail}")
        with engine.connect() as conn:
            done, ended = conn.execute(
                text("SELECT count(*), max(finished_at) FROM jobs WHERE status = 'completed' AND id BETWEEN :a AND :b"),
                {"a": first, "b": last},
            ).one()
            starts = conn.execute(
                text("SELECT worker_id, started_at FROM attempts WHERE job_id BETWEEN :a AND :b"),
                {"a": first, "b": last},
            ).all()
    finally:
        for p in running:
            p.terminate()
        for p in running:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        engine.dispose()
    if done != n:
        raise RuntimeError(f"{what} drain: {done} completed, expected {n}")
    return _timed(n, procs, [(w, _utc(t)) for w, t in starts], _utc(ended), spawned)


def _timed(n: int, procs: int, starts: list[tuple[str, datetime]], ended: datetime,
           spawned: datetime) -> dict[str, Any]:  # fmt: skip
    """The drain's figure from its attempts' (worker, start) and the last
    completion. With several processes, from the moment the last of them
    started its first job: before it the others drained alone, and at a
    small size that part would weigh more than at the full one. A process
    that ran no job at all (the others drained everything before it was up)
    leaves the whole drain timed, and ``all_ran`` false."""
    first: dict[str, datetime] = {}
    for worker, started in starts:
        first[worker] = min(started, first.get(worker, started))
    began = min(first.values())
    all_ran = len(first) >= procs
    if procs > 1 and all_ran:
        began = max(first.values())
        n = sum(started >= began for _, started in starts)
    seconds = (ended - began).total_seconds()
    return {"rate": n / seconds, "seconds": seconds, "jobs": n, "all_ran": all_ran,
            "startup_s": (min(first.values()) - spawned).total_seconds()}  # fmt: skip


# -- the systems of a round ---------------------------------------------------------------


def _huey(n: int) -> float:
    from bench.run import ensure_venv, peer

    return float(peer(ensure_venv(), "huey", "drain", n, 1)["median"])


def _pool(n: int) -> float:
    from bench.compare import run_child

    return run_child(REPO, "drain", n, None)  # a fresh process with a warm-up, as compare.py's


def _runtime_pg(n: int) -> float:
    """Scenario 10's Jobdeck drain (``bench/pg_jobdeck.py``): the runtime built
    inside the benchmark's consumer process, on a fresh database analyzed after
    the fill, timed by the same harness as PgQueuer."""
    from bench import pg_bench

    got = pg_bench.measure("jobdeck", None, "drain1", n)
    if "error" in got:
        raise RuntimeError(f"Jobdeck's scenario 10 drain: {got['error']}")
    return float(got["rate"])


def _pgqueuer(n: int, procs: int) -> float:
    from bench import pg_bench

    got = pg_bench.measure("pgqueuer", pg_bench.peer_python("pgqueuer"), f"drain{procs}", n)
    if "error" in got:
        raise RuntimeError(f"PgQueuer drain: {got['error']}")
    return float(got["rate"])


def sqlite_systems(c: dict[str, int], work: Path, peers: bool = True) -> dict[str, Callable[[], dict[str, Any]]]:
    n = c["sqlite"]
    systems: dict[str, Callable[[], dict[str, Any]]] = {
        "pool": lambda: {"rate": _pool(n), "jobs": n},
        "worker": lambda: drain("worker", n, work),
        "serve": lambda: drain("serve", n, work),
    }
    if peers:
        systems["huey"] = lambda: {"rate": _huey(c["huey"]), "jobs": c["huey"]}
    return systems


def postgres_systems(c: dict[str, int], work: Path, peers: bool = True) -> dict[str, Callable[[], dict[str, Any]]]:
    n = c["postgres"]
    systems: dict[str, Callable[[], dict[str, Any]]] = {
        "pool": lambda: {"rate": _runtime_pg(n), "jobs": n},
        "worker": lambda: drain("worker", n, work, fresh_postgres()),
        "worker2": lambda: drain("worker", n, work, fresh_postgres(), procs=2),
    }
    if peers:
        systems["pgqueuer"] = lambda: {"rate": _pgqueuer(n, 1), "jobs": n}
        systems["pgqueuer2"] = lambda: {"rate": _pgqueuer(n, 2), "jobs": n}
    return systems


def rounds(systems: dict[str, Callable[[], dict[str, Any]]], count: int,
           log: Callable[[str], None] = print) -> list[dict[str, dict[str, Any]]]:  # fmt: skip
    """``count`` rounds, each running every system once, the order rotated."""
    names = list(systems)
    out = []
    for r in range(count):
        order = names[r % len(names) :] + names[: r % len(names)]
        got: dict[str, dict[str, Any]] = {}
        for name in order:
            got[name] = systems[name]()
            extra = f", start-up {got[name]['startup_s']:.2f} s" if "startup_s" in got[name] else ""
            log(f"  round {r + 1}/{count} {name:<10} {got[name]['rate']:,.0f} jobs/s{extra}")
        out.append(got)
    return out


def summary(runs: list[dict[str, dict[str, Any]]], against: list[tuple[str, str]]) -> dict[str, Any]:
    """Each system's median rate, and for each (system, other) of ``against``
    the median of the per-round ratios, keyed "system/other"."""
    med = {name: statistics.median(r[name]["rate"] for r in runs) for name in runs[0]}
    ratios = {f"{a}/{b}": statistics.median(r[a]["rate"] / r[b]["rate"] for r in runs)
              for a, b in against if a in med and b in med}  # fmt: skip
    startup = {name: statistics.median(r[name]["startup_s"] for r in runs) for name in runs[0]
               if "startup_s" in runs[0][name]}  # fmt: skip
    return {"median": med, "ratio": ratios, "startup_s": startup, "runs": runs}


# -- tracing off and on ------------------------------------------------------------------------


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that reads each export and discards it."""

    received = {"requests": 0, "bytes": 0}

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Sink.received["requests"] += 1
        _Sink.received["bytes"] += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@contextmanager
def otlp_sink() -> Iterator[dict[str, str]]:
    """A local OTLP/HTTP endpoint; yields the environment that turns tracing on toward it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"JOBDECK_TRACING": "1", "OTEL_SERVICE_NAME": "jobdeck-bench",
               "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()


def tracing(c: dict[str, int], work: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The drain (``jobdeck worker``) and the HTTP enqueue (``jobdeck
    serve``) with tracing off and on, in interleaved rounds."""

    out: dict[str, Any] = {}
    with otlp_sink() as on_env:
        before = dict(_Sink.received)
        systems = {"off": lambda: drain("worker", c["tracing"], work),
                   "on": lambda: drain("worker", c["tracing"], work, env=on_env)}  # fmt: skip
        runs = rounds(systems, c["rounds"], log)
        out["drain"] = summary(runs, [("on", "off")])
        out["drain"]["exported"] = {k: _Sink.received[k] - before[k] for k in before}
        out["drain"]["jobs"] = c["tracing"]
        if not shutil.which("wrk"):
            out["http"] = {"skipped": "wrk not installed (apt-get install -y wrk)"}
            return out
        before = dict(_Sink.received)
        out["http"] = http_enqueue(work, c["http_seconds"], c["rounds"], on_env, log)
        out["http"]["exported"] = {k: _Sink.received[k] - before[k] for k in before}
    return out


def http_enqueue(work: Path, seconds: int, count: int, on_env: dict[str, str],
                 log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Two ``jobdeck serve --demo`` side by side, tracing off and on, each on
    its own SQLite file with its pool running the posted jobs; wrk 16
    connections POSTs (with a ``traceparent``) and the refused control, in
    interleaved rounds after a warm-up round. Median req/s per side."""
    from bench import serve_bench

    headers = {"traceparent": TRACEPARENT}
    calls = (("refused", serve_bench.REFUSED_BODY), ("enqueue", serve_bench.ENQUEUE_BODY))
    got: dict[str, dict[str, list[dict[str, Any]]]] = {s: {label: [] for label, _ in calls} for s in ("off", "on")}
    with serve_bench.contextlib_exit() as stack:
        ports = {}
        for side, env in (("off", {}), ("on", on_env)):
            db = serve_bench.fresh_db(work, f"http-tracing-{side}.db")
            ports[side] = stack.enter_context(serve_bench.process(db, "serve", extra_env=env))[1]
        for r in range(count + 1):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for side in order:
                for label, body in calls:
                    result = serve_bench._wrk(ports[side], "/api/jobs", 1 if r == 0 else seconds, 16, body, headers)
                    if r:  # round 0 warms both servers up
                        got[side][label].append(result)
                        log(f"  round {r}/{count} http {label:<8} tracing {side:<3} {result['rps']:,.0f} req/s, "
                            f"p99 {result['p99_ms']:.1f} ms")  # fmt: skip
    out: dict[str, Any] = {"connections": 16, "seconds": seconds}
    for side, by_label in got.items():
        out[side] = {}
        for label, results in by_label.items():
            ordered = sorted(results, key=lambda x: x["rps"])
            out[side][label] = dict(ordered[len(ordered) // 2], runs=[x["rps"] for x in results])
    pairs = list(zip(got["on"]["enqueue"], got["off"]["enqueue"], strict=True))
    out["ratio"] = statistics.median(on["rps"] / off["rps"] for on, off in pairs)
    return out


# -- the whole scenario ------------------------------------------------------------------------


def run(c: dict[str, int], work: Path, postgres: bool = True, with_tracing: bool = True, drains: bool = True,
        peers: bool = True, sqlite: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """The drains as shipped (SQLite, then PostgreSQL unless ``postgres`` is
    false or the server is not there) and tracing off/on; ``peers`` false
    leaves Huey and PgQueuer out."""
    out: dict[str, Any] = {"counts": dict(c)}
    if drains and sqlite:
        log(f"scenario 1 as shipped, SQLite: {c['rounds']} rounds of pool, worker, serve{', Huey' * peers}")
        out["sqlite"] = summary(rounds(sqlite_systems(c, work, peers), c["rounds"], log),
                                [("pool", "huey"), ("worker", "huey"), ("serve", "huey"),
                                 ("worker", "pool"), ("serve", "pool")])  # fmt: skip
    if drains and postgres:
        try:
            from bench.pg_bench import check_postgres

            check_postgres()
        except (RuntimeError, ImportError) as exc:
            out["postgres"] = {"skipped": str(exc)}
        else:
            log(
                f"scenario 1 as shipped, PostgreSQL: {c['rounds']} rounds of pool, worker (1, 2)"
                + ", PgQueuer (1, 2)" * peers
            )
            out["postgres"] = summary(rounds(postgres_systems(c, work, peers), c["rounds"], log),
                                      [("pool", "pgqueuer"), ("worker", "pgqueuer"),
                                       ("worker2", "pgqueuer2"), ("worker", "pool")])  # fmt: skip
    if with_tracing:
        log(f"tracing off and on: {c['rounds']} rounds")
        out["tracing"] = tracing(c, work, log)
    return out


def _x(ratios: dict[str, float], key: str, fmt: str = "{:.1f}x") -> str:
    return fmt.format(ratios[key]) if key in ratios else "–"


def _rate(medians: dict[str, float], key: str) -> str:
    return f"{medians[key]:,.0f}" if key in medians else "–"


def table(result: dict[str, Any]) -> str:
    """The rows, Markdown."""
    lines = []
    c = result["counts"]
    s = result.get("sqlite")
    if s:
        m, r, up = s["median"], s["ratio"], s["startup_s"]
        lines += [
            f"Scenario 1 as users run it, SQLite FULL, 4 threads, {c['sqlite']:,} no-op jobs (Huey {c['huey']:,}); "
            f"median of {len(s['runs'])} interleaved rounds, ratios within each round:",
            "",
            "| what drains | jobs/s | vs Huey | vs the bare pool | start-up (s) |",
            "|---|---|---|---|---|",
            f"| bare pool (`bench.jobdeck_bench.drain`, diagnostic) | {m['pool']:,.0f} | {_x(r, 'pool/huey')} | – | – |",
            f"| `jobdeck worker --demo` | {m['worker']:,.0f} | {_x(r, 'worker/huey')} | {_x(r, 'worker/pool', '{:.0%}')} "
            f"| {up['worker']:.2f} |",
            f"| `jobdeck serve --demo` (granian) | {m['serve']:,.0f} | {_x(r, 'serve/huey')} | {_x(r, 'serve/pool', '{:.0%}')} "
            f"| {up['serve']:.2f} |",
            f"| Huey (SqliteHuey, 4 threads) | {_rate(m, 'huey')} | – | – | – |",
        ]  # fmt: skip
    p = result.get("postgres")
    if p and "skipped" in p:
        lines += ["", f"PostgreSQL: skipped: {p['skipped']}"]
    elif p:
        m, r, up = p["median"], p["ratio"], p["startup_s"]
        alone = sum(not run["worker2"].get("all_ran", True) for run in p["runs"])
        lines += [
            "",
            f"Scenario 1 as users run it, PostgreSQL, {c['postgres']:,} no-op jobs; median of {len(p['runs'])} "
            "interleaved rounds:",
            "",
            "| what drains | jobs/s | vs PgQueuer (same processes) | vs the diagnostic row | start-up (s) |",
            "|---|---|---|---|---|",
            f"| runtime in the benchmark's process (scenario 10's, diagnostic) | {m['pool']:,.0f} | {_x(r, 'pool/pgqueuer', '{:.2f}x')} | – | – |",
            f"| `jobdeck worker --demo`, 1 process | {m['worker']:,.0f} | {_x(r, 'worker/pgqueuer', '{:.2f}x')} "
            f"| {_x(r, 'worker/pool', '{:.0%}')} | {up['worker']:.2f} |",
            f"| `jobdeck worker --demo`, 2 processes{f' (one ran no job in {alone} rounds)' if alone else ''} "
            f"| {m['worker2']:,.0f} | {_x(r, 'worker2/pgqueuer2', '{:.2f}x')} | – "
            f"| {up['worker2']:.2f} |",
            f"| PgQueuer 1.6.0, 1 process | {_rate(m, 'pgqueuer')} | – | – | – |",
            f"| PgQueuer 1.6.0, 2 processes | {_rate(m, 'pgqueuer2')} | – | – | – |",
        ]  # fmt: skip
    t = result.get("tracing")
    if t:
        d = t["drain"]
        lines += [
            "",
            f"Tracing off and on (`JOBDECK_TRACING=1`, OTLP/HTTP to a local sink), median of {len(d['runs'])} "
            "interleaved rounds:",
            "",
            "| what | tracing off | tracing on | on / off |",
            "|---|---|---|---|",
            f"| `jobdeck worker --demo` drains {d['jobs']:,} jobs (jobs/s) | {d['median']['off']:,.0f} "
            f"| {d['median']['on']:,.0f} | {d['ratio']['on/off']:.0%} |",
        ]
        h = t.get("http")
        if h and "skipped" in h:
            lines.append(f"| `POST /api/jobs` | skipped: {h['skipped']} | | |")
        elif h:
            off, on = h["off"], h["on"]
            lines += [
                f"| `jobdeck serve --demo`, `POST /api/jobs` with a `traceparent`, wrk 16 conns (req/s) "
                f"| {off['enqueue']['rps']:,.0f} (p99 {off['enqueue']['p99_ms']:.1f} ms) "
                f"| {on['enqueue']['rps']:,.0f} (p99 {on['enqueue']['p99_ms']:.1f} ms) | {h['ratio']:.0%} |",
                f"| the control, a refused POST (422) (req/s) | {off['refused']['rps']:,.0f} "
                f"| {on['refused']['rps']:,.0f} | {on['refused']['rps'] / off['refused']['rps']:.0%} |",
            ]
        exported = t["drain"]["exported"]["requests"] + (h or {}).get("exported", {}).get("requests", 0)
        lines.append(f"\nExports received by the sink with tracing on: {exported} requests.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--full", action="store_true", help="issue 33's sizes: 100,000 jobs on SQLite, 20,000 on PostgreSQL"
    )
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 2; --full 3)")
    ap.add_argument("--no-postgres", action="store_true", help="leave PostgreSQL out")
    ap.add_argument("--no-sqlite", action="store_true", help="leave SQLite's drains out")
    ap.add_argument("--no-tracing", action="store_true", help="leave out tracing off/on")
    ap.add_argument("--only-tracing", action="store_true", help="tracing off/on alone")
    ap.add_argument("--no-peers", action="store_true", help="leave Huey and PgQueuer out")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    c = dict(TINY if args.tiny else FULL if args.full else SMALL)
    if args.rounds:
        c["rounds"] = args.rounds
    result: dict[str, Any] = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"machine: {result['machine']}", flush=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobdeck-shipped-") as tmp:
        result.update(run(c, Path(tmp), postgres=not args.no_postgres, with_tracing=not args.no_tracing,
                          drains=not args.only_tracing, peers=not args.no_peers, sqlite=not args.no_sqlite, log=lambda m: print(m, flush=True)))  # fmt: skip
    result["seconds"] = time.monotonic() - t0
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = REPO / "bench" / "results" / f"shipped-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    m = result["machine"]
    print(f"\nMachine: {m['cores']} cores, Python {m['python']}, SQLite {m['sqlite']}, load at start "
          f"{m['loadavg_at_start']}, at end {result['loadavg_at_end']}.\n")  # fmt: skip
    print(table(result))
    print(f"\nJSON: {out}  ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
