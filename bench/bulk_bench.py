"""Bulk enqueue over HTTP against in-process ``enqueue_many``, in the same run.

Four clients, 1,000 jobs a call, both ways:

- **HTTP**: four threads of this process each send ``POST /api/jobs/bulk``
  with 1,000 ``demo.noop`` jobs, over a kept-alive connection, to a real
  ``jobdeck serve --demo`` process (its default server, its embedded pool off:
  nothing drains while the jobs go in). A call counts when its 201 is read;
  the 201 means the jobs are committed (SQLite ``synchronous=FULL``).
- **In process** (the control): four threads each call ``deck.enqueue_many``
  with 1,000 jobs on a deck of this process.

Each way starts on an empty database (a fresh SQLite file, or the PostgreSQL
database of ``--database-url`` emptied), warms up with one call per thread,
then times ``--calls`` calls per thread. The rounds alternate which way goes
first; the figures are the medians, and ``kept`` is the HTTP median over the
in-process one (target: at least 50%).

    python3 -m bench.bulk_bench [--calls 10] [--runs 3] [--database-url postgresql+psycopg://...]

``bench/run.py`` runs it in scenario 3 on SQLite, and on PostgreSQL in
scenario 10 (a database of its own, ``postgres_database``).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobdeck.store.engine import make_engine
from sqlalchemy import text

from bench.common import NOOP, make_deck, median
from bench.flow_bench import empty_postgres
from bench.serve_bench import fresh_db, process

CLIENTS = 4
PER_CALL = 1000


def _timed(clients: int, calls: int, call: Callable[[int, int], None]) -> float:
    """jobs/s of ``clients`` threads each making ``calls`` timed calls of
    ``PER_CALL`` jobs (``call(client, i)``), after one call each to warm up."""
    started = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            call(n, -1)
            started.wait()
            started.wait()
            for i in range(calls):
                call(n, i)
        except BaseException as exc:  # reported below: a failed call fails the figure
            errors.append(exc)
            started.abort()

    threads = [threading.Thread(target=client, args=(n,), name=f"bulk-client-{n}") for n in range(clients)]
    for t in threads:
        t.start()
    try:
        started.wait()  # every client warmed up
        t0 = time.perf_counter()
        started.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"a bulk call failed: {errors[0]!r}") from errors[0]
    return clients * calls * PER_CALL / (time.perf_counter() - t0)


def _jobs(kind: str, client: int, i: int) -> list[dict[str, Any]]:
    base = (client * 1_000_000) + (i + 1) * PER_CALL
    return [{"type": kind, "payload": {"n": base + k}} for k in range(PER_CALL)]


def in_process(workdir: Path, calls: int, database_url: str | None) -> float:
    """The control: ``enqueue_many`` from ``CLIENTS`` threads of this process."""
    overrides = {"database_url": database_url} if database_url else {}
    deck = make_deck(workdir / "in-process.db", "FULL", 0, **overrides)
    try:
        if database_url:
            empty_postgres(deck)
        bodies = {(c, i): _jobs(NOOP, c, i) for c in range(CLIENTS) for i in range(-1, calls)}
        rate = _timed(CLIENTS, calls, lambda c, i: deck.enqueue_many(bodies[c, i]))
        _check_count(deck.store.engine, calls)
        return rate
    finally:
        deck.store.engine.dispose()


def over_http(workdir: Path, calls: int, database_url: str | None) -> float:
    """``POST /api/jobs/bulk`` from ``CLIENTS`` threads to a ``jobdeck serve`` process."""
    db = fresh_db(workdir, "http.db")
    extra = {}
    if database_url:
        deck = make_deck(workdir / "unused.db", "FULL", 0, database_url=database_url)
        try:
            empty_postgres(deck)
        finally:
            deck.store.engine.dispose()
        extra["JOBDECK_DATABASE_URL"] = database_url
    bodies = {
        (c, i): json.dumps({"jobs": _jobs("demo.noop", c, i)}).encode()
        for c in range(CLIENTS)
        for i in range(-1, calls)
    }
    with process(db, "serve", extra_env=extra, workers=0) as (_, port):
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=120) for _ in range(CLIENTS)]

        def post(c: int, i: int) -> None:
            conns[c].request("POST", "/api/jobs/bulk", bodies[c, i], {"Content-Type": "application/json"})
            answer = conns[c].getresponse()
            body = answer.read()
            if answer.status != 201:
                raise RuntimeError(f"POST /api/jobs/bulk answered {answer.status}: {body[:300]!r}")

        try:
            rate = _timed(CLIENTS, calls, post)
        finally:
            for conn in conns:
                conn.close()
    _check_count(make_engine(database_url or f"sqlite:///{db}"), calls, "demo.noop")
    return rate


def _check_count(engine: Any, calls: int, kind: str = NOOP) -> None:
    """Every job of every call (the warm-up's too) is in the database: a rate
    counts only then. (The demo's schedules add jobs of other types.)"""
    try:
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM jobs WHERE type = :kind"), {"kind": kind}).scalar_one()
    finally:
        engine.dispose()
    expected = CLIENTS * (calls + 1) * PER_CALL
    if stored != expected:
        raise RuntimeError(f"{stored} jobs stored, {expected} sent")


def postgres_database(name: str = "jobdeck_bulk") -> str:
    """A fresh PostgreSQL database beside the peers' (``BENCH_PG_ADMIN_DSN``), as a Jobdeck URL."""
    from sqlalchemy.engine import make_url

    from bench.peers import pg_harness

    pg_harness.fresh_database(name)
    return make_url(pg_harness.ADMIN_DSN).set(drivername="postgresql+psycopg", database=name).render_as_string(False)


def compare(workdir: Path, calls: int, runs: int, database_url: str | None = None) -> dict[str, Any]:
    """Both ways, ``runs`` rounds, which goes first alternating by round."""
    ways = {"in_process": in_process, "http": over_http}
    got: dict[str, list[float]] = {name: [] for name in ways}
    for n in range(runs):
        order = list(ways) if n % 2 == 0 else list(ways)[::-1]
        for name in order:
            got[name].append(ways[name](workdir, calls, database_url))
        print(f"  round {n + 1}: in process {got['in_process'][-1]:,.0f} jobs/s, over HTTP {got['http'][-1]:,.0f} "
              f"({got['http'][-1] / got['in_process'][-1]:.0%}), load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    a, b = median(got["in_process"]), median(got["http"])
    return {
        "database": "postgresql" if database_url else "sqlite",
        "clients": CLIENTS,
        "jobs_per_call": PER_CALL,
        "calls_per_client": calls,
        "in_process": a,
        "http": b,
        "kept": b / a,
        "runs_in_process": got["in_process"],
        "runs_http": got["http"],
    }


if __name__ == "__main__":
    import argparse
    import sys
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10, help="timed calls per client (of 1,000 jobs each)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--database-url", default=None, help="postgresql+psycopg://... to enqueue into PostgreSQL")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobdeck-bulk-") as tmp:
        print(json.dumps(compare(Path(tmp), args.calls, args.runs, args.database_url)))
    sys.exit(0)
