"""Keeps the PostgreSQL benchmark's profile honest: the CPU a drain reports
per job is what the processes used, and the statement profile reads a real
server's plan (time, triggers, WAL). No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.peers.pg_harness import _cpu_seconds
from bench.pg_statements import _explain

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('done', flush=True)\ninput()"


def test_a_processs_cpu_is_counted_while_it_runs_and_nothing_once_gone() -> None:
    busy = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = time.monotonic()
        assert busy.stdout is not None and busy.stdout.readline().strip() == "done"
        assert time.monotonic() - before < 30
        used = _cpu_seconds([busy.pid])
        assert 0.25 <= used < 5, used  # its 0.3 s of burning, in clock ticks, and its start-up
    finally:
        busy.communicate("\n", timeout=30)
    assert _cpu_seconds([busy.pid]) == 0  # reaped: nothing to read


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_statement_profile_reads_time_triggers_and_wal_from_a_real_plan(db_url: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE parent (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent (id))")
        conn.execute("INSERT INTO parent SELECT generate_series(1, 50)")
        figures = _explain(conn, "INSERT INTO child SELECT i, i FROM generate_series(1, %s) AS i", (50,))
    assert figures["rows"] == 0  # an INSERT without RETURNING emits no rows
    assert figures["ms"] > 0 and figures["trigger_ms"] > 0  # the foreign key's check ran, once per row
    assert figures["wal_records"] >= 100  # 50 heap rows and 50 index entries at least
    assert figures["wal_bytes"] > 0
