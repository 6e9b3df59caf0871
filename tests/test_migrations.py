"""Alembic manages the schema on both databases: the upgrade path is the one
every test's ``deck`` takes, and these tests pin what it must keep true."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from jobdeck.core.config import ConfigError
from jobdeck.core.states import EffectState, State
from jobdeck.deck import Jobdeck
from jobdeck.store import NewJob, Store, migrate, schema
from jobdeck.store.engine import make_engine
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

pytestmark = pytest.mark.backends


@pytest.fixture
def db_url(empty_db_url):
    """Here every database starts empty: the migrations are what is tested."""
    return empty_db_url


@pytest.fixture
def engine(db_url):
    e = make_engine(db_url, pool_size=4)
    yield e
    e.dispose()


BASELINE_JOBS = ["pending"] * 30 + ["running", "completed", "completed", "failed", "failed", "dead", "discarded"]
"""A job in every state the baseline knew (and many pending), with one attempt each once claimed."""


def _fill(store: Store, clock) -> dict[int, State]:
    """Jobs in every state, with attempts and an effect: what an upgrade must
    keep. Written in the baseline's own columns, in SQL: this code's
    statements name columns that later revisions add (``cancel_requested_at``)."""
    now = clock()
    t = now.replace(tzinfo=None).isoformat(" ") if store.dialect == "sqlite" else now  # as sqlite3 wrote it
    job_sql = text(
        "INSERT INTO jobs (type, queue, payload, priority, status, attempt, retry_count, max_retries,"
        " idempotency_key, available_at, created_at, updated_at, worker_id, error)"
        " VALUES ('demo.noop', 'default', :payload, 0, :status, :attempt, 0, 3, :key, :t, :t, :t, :worker, :error)"
    )
    attempt_sql = text(
        "INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error)"
        " VALUES (:j, 1, 'w1', :t, :t, :outcome, :error)"
    )
    with store.write() as conn:
        for i, status in enumerate(BASELINE_JOBS):
            ran = status not in ("pending", "discarded")
            values = {"payload": f'{{"n": {i}}}' if i else "{}", "status": status, "attempt": int(ran), "t": t,
                      "key": "order-1" if i == 0 else None, "worker": "w1" if status == "running" else None,
                      "error": "boom" if status in ("failed", "dead") else None}  # fmt: skip
            conn.execute(job_sql, values)
            job_id = conn.execute(text("SELECT max(id) FROM jobs")).scalar_one()
            if ran and status != "running":
                outcome = "completed" if status == "completed" else "failed"
                conn.execute(attempt_sql, {"j": job_id, "t": t, "outcome": outcome, "error": values["error"]})
        first = conn.execute(text("SELECT min(id) FROM jobs")).scalar_one()
        # As every revision's code records one (0005 added the rest).
        conn.execute(
            text("INSERT INTO effects (key, job_id, attempt, created_at) VALUES ('charge:1', :j, 1, :t)"),
            {"j": first, "t": t},
        )
    with store.read() as conn:
        return {row.id: State(row.status) for row in conn.execute(text("SELECT id, status FROM jobs"))}


def _states(store: Store) -> dict[int, State]:
    with store.read() as conn:
        return {row.id: State(row.status) for row in conn.execute(text("SELECT id, status FROM jobs"))}


def test_fresh_upgrade_matches_the_models(engine):
    """Any model change without its revision fails here (and tells you the command)."""
    migrate.upgrade(engine)
    assert migrate.current(engine) == migrate.heads()
    diffs = migrate.differences(engine)
    assert diffs == [], f"models and migrations differ; add a revision with `jobdeck db revision -m ...`: {diffs}"
    names = {ix["name"] for ix in inspect(engine).get_indexes("jobs")}
    assert {"ix_jobs_claim", "ix_jobs_claim_queue"} <= names


def test_head_is_alembics_head_and_the_start_up_check_reads_it(engine):
    """``schema.HEAD`` names the newest revision (a new revision must move
    it), and the check start-up runs without Alembic agrees with Alembic's
    own reading: not at head on an empty database, nor one revision down."""
    assert migrate.heads() == {schema.HEAD}, "a new revision: set jobdeck.store.schema.HEAD to it"
    assert not schema.at_head(engine)
    migrate.upgrade(engine)
    assert schema.at_head(engine)
    previous = migrate.script().get_revision(schema.HEAD).down_revision
    migrate.downgrade(engine, previous)
    assert migrate.current(engine) == {previous} and not schema.at_head(engine)
    schema.ensure_current(engine, auto_migrate=True)
    assert schema.at_head(engine) and migrate.current(engine) == {schema.HEAD}


@pytest.mark.slow
def test_a_model_change_without_revision_is_detected(engine):
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_jobs_type_id"))
    diffs = migrate.differences(engine)
    assert [d[0] for d in diffs] == ["add_index"] and diffs[0][1].name == "ix_jobs_type_id"


def _fill_at_baseline(engine, clock) -> tuple[Store, dict[int, State], dict[int, Any]]:
    """Jobs in every state (and their attempts) in a database at the
    baseline: written by this code at head (it writes the columns later
    revisions added to ``jobs``), then taken down to the baseline, which
    keeps every row."""
    migrate.upgrade(engine)
    store = Store(engine)
    before = _fill(store, clock)
    attempts_before = {j: store.attempts_of(j) for j in before}
    migrate.downgrade(engine, migrate.BASELINE)
    return store, before, attempts_before


@pytest.mark.slow
def test_upgrade_from_the_previous_revision_keeps_every_job(engine, clock):
    store, before, attempts_before = _fill_at_baseline(engine, clock)
    assert migrate.current(engine) == {migrate.BASELINE}
    assert "ix_jobs_claim_queue" not in {ix["name"] for ix in inspect(engine).get_indexes("jobs")}

    migrate.upgrade(engine)

    assert migrate.current(engine) == migrate.heads()
    assert _states(store) == before
    assert {j: store.attempts_of(j) for j in before} == attempts_before
    # An effect recorded before the two-phase ledger was performed: it reads as done.
    assert store.ledger.get("charge:1").state is EffectState.DONE
    _, created = store.enqueue(NewJob(type="demo.noop", idempotency_key="order-1"), clock())
    assert not created
    # And the upgraded database keeps working: the due jobs are claimed.
    due = [j for j, s in before.items() if s in (State.PENDING, State.FAILED)]
    claimed = store.claim("w2", clock().replace(year=2030), limit=100)
    assert sorted(j.id for j in claimed) == sorted(due)


@pytest.mark.slow
def test_a_database_made_before_migrations_is_adopted(engine, clock):
    """A database created by create_all (no alembic_version) is stamped at the
    baseline and upgraded; nothing is recreated, nothing is lost."""
    _, before, _ = _fill_at_baseline(engine, clock)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
    assert migrate.current(engine) == set()
    migrate.ensure_current(engine, auto_migrate=True)
    assert migrate.current(engine) == migrate.heads()
    assert _states(Store(engine)) == before


@pytest.mark.slow
def test_downgrade_and_upgrade_again(engine, clock):
    migrate.upgrade(engine)
    before = _fill(Store(engine), clock)
    migrate.downgrade(engine, migrate.BASELINE)
    assert "ix_jobs_claim_queue" not in {ix["name"] for ix in inspect(engine).get_indexes("jobs")}
    migrate.upgrade(engine)
    assert _states(Store(engine)) == before
    assert migrate.differences(engine) == []


def test_auto_migrate_off_refuses_an_old_schema(make_config, registry, engine):
    migrate.upgrade(engine, migrate.BASELINE)
    deck = Jobdeck(make_config(auto_migrate=False), registry)
    try:
        with pytest.raises(ConfigError, match=r"auto_migrate: .*revision 0001.*jobdeck db upgrade"):
            deck.init_db()
        deck.config.auto_migrate = True
        deck.init_db()
        assert migrate.current(deck.store.engine) == migrate.heads()
        deck.config.auto_migrate = False
        deck.init_db()  # current: starts
    finally:
        deck.store.engine.dispose()


@pytest.mark.slow
def test_concurrent_upgrades_migrate_once(db_url):
    """Several hosts starting together: one migrates, the others find it done."""
    engines = [make_engine(db_url, pool_size=1) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(engines))

    def run(e):
        barrier.wait()
        try:
            migrate.ensure_current(e, auto_migrate=True)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert errors == []
        assert migrate.current(engines[0]) == migrate.heads()
        assert migrate.differences(engines[0]) == []
    finally:
        for e in engines:
            e.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_postgres_gets_the_autovacuum_settings(engine):
    migrate.upgrade(engine)
    with engine.connect() as conn:
        options = conn.execute(text("SELECT reloptions FROM pg_class WHERE oid = 'jobs'::regclass")).scalar_one()
    assert "autovacuum_vacuum_scale_factor=0.01" in options
    assert "fillfactor=90" in options


def test_cli_db_upgrade_and_current(db_url, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from jobdeck.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOBDECK_CONFIG", raising=False)
    runner = CliRunner(env={"JOBDECK_DATABASE_URL": db_url})

    def cli(*args):
        return runner.invoke(main, ["db", *args], catch_exceptions=False)

    r = cli("current")
    assert r.exit_code == 1 and "database: unversioned" in r.output
    r = cli("upgrade", migrate.BASELINE)
    assert r.exit_code == 0 and "schema at 0001 (was unversioned)" in r.output
    r = cli("upgrade")
    head = ", ".join(sorted(migrate.heads()))
    assert r.exit_code == 0 and f"schema at {head} (was 0001)" in r.output
    r = cli("current")
    assert r.exit_code == 0 and f"database: {head}; code: {head}" in r.output


def _insert_keyed(engine, clock, key: str | None, unique_key: str | None = None) -> int:
    """A job in 0020's own columns, in SQL (this code's statements name the head's indexes)."""
    now = clock()
    t = now.replace(tzinfo=None).isoformat(" ") if engine.dialect.name == "sqlite" else now
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (type, queue, payload, priority, status, attempt, retry_count, max_retries,"
                " idempotency_key, unique_key, available_at, created_at, updated_at)"
                " VALUES ('demo.noop', 'default', '{}', 0, 'pending', 0, 0, 3, :key, :uk, :t, :t, :t)"
            ),
            {"key": key, "uk": unique_key, "t": t},
        )
        return int(conn.execute(text("SELECT max(id) FROM jobs")).scalar_one())


def _key_indexes(engine) -> dict[str, bool]:
    """The unique indexes on the two key columns, and whether each is partial."""
    found = {}
    for ix in inspect(engine).get_indexes("jobs"):
        if ix["name"] in ("ux_jobs_idempotency_key", "ux_jobs_unique_key"):
            where = ix.get("dialect_options", {}).get(f"{engine.dialect.name}_where")
            found[ix["name"]] = where is not None and "IS NOT NULL" in str(where).upper()
    return found


def test_0021_makes_the_key_indexes_partial_and_keys_stay_unique(engine, clock):
    """From 0020 with keyed, unique and plain jobs in it: after the upgrade
    the keys live in partial unique indexes, an enqueue with a known key
    answers its job, a duplicate key is still refused; the downgrade puts
    the full constraint back, every job kept, and the upgrade runs again."""
    migrate.upgrade(engine, "0020")
    keyed = _insert_keyed(engine, clock, "order-1")
    held = _insert_keyed(engine, clock, None, unique_key="report:1")
    plain = [_insert_keyed(engine, clock, None) for _ in range(3)]

    migrate.upgrade(engine)
    assert migrate.differences(engine) == []
    assert _key_indexes(engine) == {"ux_jobs_idempotency_key": True, "ux_jobs_unique_key": True}
    store = Store(engine)
    job, created = store.enqueue(NewJob(type="demo.noop", idempotency_key="order-1"), clock())
    assert not created and job.id == keyed
    ids = store.enqueue_many([NewJob(type="demo.noop", idempotency_key="order-1"), NewJob("demo.noop")], clock())
    assert ids[0] == keyed and ids[1] > keyed
    for key, unique_key in (("order-1", None), (None, "report:1")):
        with pytest.raises(IntegrityError):
            _insert_keyed(engine, clock, key, unique_key)
    assert {store.get(j).id for j in (keyed, held, *plain)} == {keyed, held, *plain}

    migrate.downgrade(engine, "0020")
    assert "ux_jobs_idempotency_key" not in {ix["name"] for ix in inspect(engine).get_indexes("jobs")}
    for key, unique_key in (("order-1", None), (None, "report:1")):
        with pytest.raises(IntegrityError):
            _insert_keyed(engine, clock, key, unique_key)
    _insert_keyed(engine, clock, None)  # keyless jobs never collide, before or after
    migrate.upgrade(engine)
    assert migrate.differences(engine) == []
    job, created = Store(engine).enqueue(NewJob(type="demo.noop", idempotency_key="order-1"), clock())
    assert not created and job.id == keyed
