"""``jobdeck db copy``'s library (``jobdeck.store.transfer``): a SQLite
deployment moves to PostgreSQL with every table, ids and sequences; a copy
killed midway completes when run again, without a duplicate; a source in
use, and a target holding other data, are refused before a row is written."""

from __future__ import annotations

import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from jobdeck import deck_of
from jobdeck.deck import Jobdeck
from jobdeck.store.engine import make_engine
from jobdeck.store.models import jobs
from jobdeck.store.schema import ensure_current
from jobdeck.store.transfer import SKIPPED, CopyRefused, TableCount, copied_tables, copy_database, report
from sqlalchemy import create_engine, delete, func, inspect, select, text, update

from tests import transfer_support as support
from tests.adversarial.cli_process import JobdeckProcess
from tests.conftest import sqlite_url

PROGRESS = re.compile(r"^(?P<step>\w+) (?P<table>\w+): (?P<done>\d+) of (?P<total>\d+) rows$")
"""A progress line of ``jobdeck db copy``."""


@pytest.fixture
def pg_target(request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty PostgreSQL schema of the test's own: the copy migrates it."""
    from tests.pgtest import fresh_schema

    yield from fresh_schema(request)


def counts_of(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in copied_tables()}
    finally:
        engine.dispose()


@pytest.fixture
def small_deployment(tmp_path: Path, sqlite_template: Path) -> Callable[..., str]:
    """Make a migrated SQLite file with a few jobs, every process on it gone."""
    return lambda jobs_=5: support.small(tmp_path, sqlite_template, jobs_)


# -- what is copied ---------------------------------------------------------------------------


def test_every_table_is_copied_or_skipped_with_a_reason(tmp_path: Path) -> None:
    """The migrations' tables are the copy's tables and the skipped ones:
    a table a migration adds without a model, or one dropped from the copy
    without a reason, fails here."""
    engine = make_engine(sqlite_url(tmp_path), pool_size=1)
    try:
        ensure_current(engine, auto_migrate=True)
        with engine.connect() as conn:
            migrated = set(inspect(conn).get_table_names()) - {"alembic_version", "sqlite_sequence"}
    finally:
        engine.dispose()
    copied = [t.name for t in copied_tables()]
    assert migrated == set(copied) | set(SKIPPED)
    assert not set(copied) & set(SKIPPED)
    assert all(reason.strip() for reason in SKIPPED.values())
    for position, table in enumerate(copied_tables()):
        parents = {fk.column.table.name for fk in table.foreign_keys} - {table.name}
        assert parents <= set(copied[:position]), f"{table.name} is copied before {parents}"


def test_the_report_says_which_tables_differ() -> None:
    lines = report([TableCount("jobs", 3, 3, 1), TableCount("attempts", 2, 1, 1)])
    assert lines[1].split()[:3] == ["jobs", "3", "3"] and "MISMATCH" not in lines[1]
    assert lines[2].endswith("MISMATCH")
    assert lines[-1] == "the counts differ in 1 table(s): attempts"
    assert report([TableCount("jobs", 3, 3, 0)])[-1] == "the counts match in all 1 tables (3 rows)"


# -- the move ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
def test_a_deployment_moves_to_postgresql_and_a_killed_copy_completes(tmp_path: Path, pg_target: str) -> None:
    """10,000 jobs in every state with their attempts, logs, effects and
    artifacts, a workflow, a batch, schedules, queue controls, a session
    and the audit log: the copy is killed midway, run again, and then the
    app on PostgreSQL reads what the app on SQLite read."""
    made = support.build(tmp_path)
    assert made.jobs >= 10_000
    source = counts_of(made.url)
    assert all(source.values()), f"tables the deployment left empty: {[t for t, n in source.items() if not n]}"

    killed_at = kill_midway(made.url, pg_target, table="jobs", after=1000)
    partial = counts_of(pg_target)
    assert killed_at <= partial["jobs"] < made.jobs, "the copy was not cut short in jobs"
    assert partial["attempts"] == 0

    seen: list[tuple[str, str, int, int]] = []
    counts = copy_database(made.url, pg_target, batch_size=500, progress=lambda *step: seen.append(step))
    assert all(c.matches for c in counts), report(counts)
    assert {c.table: c.target for c in counts} == source
    by_table = {c.table: c for c in counts}
    assert by_table["jobs"].written == made.jobs - partial["jobs"], "rows copied before the kill were written again"
    assert ("checking", "jobs", partial["jobs"], partial["jobs"]) in seen
    assert ("copying", "jobs", made.jobs, made.jobs) in seen

    again = copy_database(made.url, pg_target)
    assert all(c.matches and c.written == 0 for c in again), report(again)

    same_pages(made, tmp_path, pg_target)


def kill_midway(source: str, target: str, table: str, after: int) -> int:
    """Run ``jobdeck db copy`` and SIGKILL it once it says it has copied
    ``after`` rows of ``table``; the rows it had reported."""
    command = ["db", "copy", "--from", source, "--to", target, "--batch-size", "100"]
    child = subprocess.Popen(
        [sys.executable, "-m", "jobdeck.cli", *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in child.stderr or []], daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    try:
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            said = PROGRESS.match(line.strip())
            if said and said["step"] == "copying" and said["table"] == table and int(said["done"]) >= after:
                child.send_signal(signal.SIGKILL)
                return int(said["done"])
            assert child.poll() is None, f"the copy ended before it was killed: {line}"
    finally:
        child.kill()
        child.wait(timeout=30)
        reader.join(timeout=30)
        if child.stderr is not None:
            child.stderr.close()


def same_pages(made: support.Deployment, tmp_path: Path, target: str) -> None:
    """What the API and the dashboard show on both sides of the move."""
    before, after = support.app_on(made.url, tmp_path / "a"), support.app_on(target, tmp_path / "b")
    try:
        ids = made.ids
        paths = [
            f"/api/jobs?status={state}&limit=100"
            for state in ("dead", "pending", "running", "failed", "completed", "cancelled", "discarded", "blocked")
        ]
        paths += [
            f"/api/jobs/{ids[name]}"
            for name in (
                "dead",
                "completed",
                "report",
                "charge",
                "snoozed",
                "running",
                "failed",
                "blocked",
                "scheduled",
                "cancelled",
                "discarded",
            )
        ]
        paths += [f"/api/jobs/{ids['report']}/logs", f"/api/jobs/{ids['report']}/artifacts",
                  f"/api/jobs/{ids['charge']}/effects", f"/api/workflows/{ids['workflow']}",
                  f"/api/workflows/{ids['held_workflow']}", f"/api/batches/{ids['batch']}", "/api/queues",
                  "/api/errors", "/api/workflows", "/api/batches"]  # fmt: skip
        one, two = before.test_client(), after.test_client()
        for path in paths:
            assert support.api(two, "GET", path) == support.api(one, "GET", path), path
        served_the_same(made, tmp_path, target, paths, one)
        download = f"/api/jobs/{ids['report']}/artifacts/r0.csv"
        assert two.get(download, headers=support.AUTH).data == one.get(download, headers=support.AUTH).data
        assert support.made_counts(deck_of(after)) == support.made_counts(deck_of(before))

        assert made.session_cookie is not None
        two.set_cookie(*made.session_cookie)
        page = two.get(f"/jobs/{ids['dead']}")
        assert page.status_code == 200, "the signed-in session did not move"

        new = support.api(two, "POST", "/api/jobs", {"type": "demo.noop"})
        assert new["id"] == made.jobs + 1
    finally:
        deck_of(before).store.engine.dispose()
        deck_of(after).store.engine.dispose()


def served_the_same(made: support.Deployment, tmp_path: Path, target: str, paths: list[str], one: Any) -> None:
    """A real ``jobdeck serve`` on PostgreSQL answers each of ``paths`` as the
    app on the SQLite file did, and its dead-letter page lists the same jobs
    to the operator signed in before the move."""
    folder = tmp_path / "served"
    folder.mkdir()
    config = folder / "jobdeck.toml"
    config.write_text(support.config_toml(target, folder / "instance"))
    server = JobdeckProcess(folder, config, name="serve-on-postgresql")
    try:
        server.wait_serving()
        http = requests.Session()
        for path in paths:
            answer = http.get(server.url + path, headers=support.AUTH, timeout=30)
            assert answer.status_code == 200, (path, answer.text[:300])
            assert answer.json() == support.api(one, "GET", path), path
        assert made.session_cookie is not None
        http.cookies.set(*made.session_cookie)
        served = http.get(server.url + "/jobs/dead", timeout=30)
        one.set_cookie(*made.session_cookie)
        local = one.get("/jobs/dead")
        assert served.status_code == 200 and "/login" not in served.url, "the signed-in session did not move"
        listed = re.findall(r'id="job-(\d+)"', served.text)
        assert listed and listed == re.findall(r'id="job-(\d+)"', local.get_data(as_text=True))
    finally:
        server.signal()
        try:
            server.wait_exit(30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("jobdeck serve did not stop within 30 s of SIGTERM") from None


# -- running again ----------------------------------------------------------------------------


@pytest.mark.postgres
def test_ids_handed_out_and_deleted_are_not_handed_out_again(
    tmp_path: Path, small_deployment: Callable[..., str], pg_target: str
) -> None:
    url = small_deployment(jobs_=5)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(delete(jobs).where(jobs.c.id == 5))
    engine.dispose()
    counts = copy_database(url, pg_target)
    assert {c.table: c.target for c in counts}["jobs"] == 4
    app = support.app_on(pg_target, tmp_path / "b")
    try:
        assert support.api(app.test_client(), "POST", "/api/jobs", {"type": "demo.noop"})["id"] == 6
    finally:
        deck_of(app).store.engine.dispose()


@pytest.mark.postgres
def test_a_source_changed_since_an_interrupted_copy_is_refused(
    tmp_path: Path, small_deployment: Callable[..., str], pg_target: str
) -> None:
    url = small_deployment()
    copy_database(url, pg_target)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == 2).values(priority=7))
    engine.dispose()
    with pytest.raises(CopyRefused, match=r"jobs row 2 differs from the source's in priority"):
        copy_database(url, pg_target)


@pytest.mark.postgres
def test_a_target_holding_other_data_is_refused_and_left_alone(
    tmp_path: Path, small_deployment: Callable[..., str], pg_target: str
) -> None:
    other = support.app_on(pg_target, tmp_path / "other")
    try:
        mine = support.api(other.test_client(), "POST", "/api/jobs", {"type": "demo.sleep", "payload": {"own": 1}})
    finally:
        deck_of(other).store.engine.dispose()
    url = small_deployment()
    with pytest.raises(
        CopyRefused, match=r"the target already holds other data: jobs row 1 differs .* in type, payload"
    ):
        copy_database(url, pg_target)
    assert counts_of(pg_target)["jobs"] == 1
    assert mine["id"] == 1


def test_a_source_at_another_revision_is_refused(tmp_path: Path, small_deployment: Callable[..., str]) -> None:
    url = small_deployment()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0020'"))
    engine.dispose()
    with pytest.raises(CopyRefused, match=r"at revision 0020.*run `jobdeck db upgrade` on the source"):
        copy_database(url, f"sqlite:///{tmp_path / 'target.db'}")
    assert not (tmp_path / "target.db").exists()


def test_a_missing_source_is_refused_not_made(tmp_path: Path) -> None:
    with pytest.raises(CopyRefused, match="no database at"):
        copy_database(f"sqlite:///{tmp_path / 'nothing.db'}", f"sqlite:///{tmp_path / 'target.db'}")
    assert not (tmp_path / "nothing.db").exists()
    with pytest.raises(CopyRefused, match="the same database"):
        copy_database(f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path}/../{tmp_path.name}/a.db")


# -- a source in use --------------------------------------------------------------------------

HOLD = """
import sys
from jobdeck.store.engine import make_engine
from sqlalchemy import text

engine = make_engine(sys.argv[1], pool_size=1)
with engine.connect() as conn:
    conn.execute(text("SELECT count(*) FROM jobs")).all()
print("open", flush=True)
sys.stdin.read()  # holds the file, idle in its pool, until the test closes stdin
"""


def test_a_source_another_process_has_open_is_refused(tmp_path: Path, small_deployment: Callable[..., str]) -> None:
    url = small_deployment()
    target = f"sqlite:///{tmp_path / 'target.db'}"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(CopyRefused, match=r"a process has .*jobdeck.db open.*stop every `jobdeck serve`"):
            copy_database(url, target)
    finally:
        holder.communicate(input="", timeout=30)
    assert not (tmp_path / "target.db").exists()
    counts = copy_database(url, target)
    assert {c.table: c.target for c in counts}["jobs"] == 5


def test_no_process_can_open_the_source_while_the_copy_reads_it(
    tmp_path: Path, small_deployment: Callable[..., str]
) -> None:
    from jobdeck.store.transfer_checks import source_connection

    url = small_deployment()
    with (
        source_connection(url),
        closing(sqlite3.connect(tmp_path / "jobdeck.db", timeout=0.2)) as other,
        pytest.raises(sqlite3.OperationalError, match="locked"),
    ):
        other.execute("SELECT count(*) FROM jobs").fetchall()
    with closing(sqlite3.connect(tmp_path / "jobdeck.db", timeout=0.2)) as other:
        assert other.execute("SELECT count(*) FROM jobs").fetchone() == (5,)


def test_a_pool_that_still_beats_is_refused(tmp_path: Path, small_deployment: Callable[..., str]) -> None:
    url = small_deployment()
    target = f"sqlite:///{tmp_path / 'target.db'}"
    deck = Jobdeck(support.config(url, tmp_path / "instance"), support.demo_registry())
    beat = datetime.now(UTC)
    try:
        deck.store.register_worker("web-1:4242", "web-1", 4242, 4, beat)
    finally:
        deck.store.engine.dispose()
    with pytest.raises(CopyRefused, match=r"1 worker pool\(s\) still beat on the source, e.g. web-1:4242 \(host web-1"):
        copy_database(url, target, now=beat + timedelta(seconds=5))
    counts = copy_database(url, target, now=beat + timedelta(seconds=61))
    assert {c.table: c.target for c in counts}["workers"] == 1


# -- the way back -----------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_a_copy_goes_back_from_postgresql_to_sqlite(
    tmp_path: Path, small_deployment: Callable[..., str], pg_target: str
) -> None:
    url = small_deployment()
    copy_database(url, pg_target)
    home = f"sqlite:///{tmp_path / 'home.db'}"
    counts = copy_database(pg_target, home)
    assert all(c.matches for c in counts) and {c.table: c.target for c in counts}["jobs"] == 5
    assert counts_of(home) == counts_of(url)
