"""The same schedule, limit, sweeper, retention, counter and alert tests on
PostgreSQL (advisory locks, ``date_trunc``, ``ON CONFLICT``), each on a fresh
database. Selected by JOBDECK_TEST_POSTGRES_URL (CI sets it).

Advisory locks are per database, hence a database per test; each is a copy
(``CREATE DATABASE ... TEMPLATE``) of one migrated once per test process,
as a test's schema is a reset copy of a migrated one elsewhere
(``tests/pgtest.py``): running the migrations costs far more than the copy.
The migrations themselves are tested in ``tests/test_migrations.py``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.test_alerts import (  # noqa: F401  (collected here again, on PostgreSQL)
    alert_deck,
    port,
    test_an_unreachable_webhook_is_retried_with_backoff,
    test_dead_jobs_log_at_error_and_alert_once_per_window_with_the_count,
)
from tests.test_maintenance import (  # noqa: F401
    test_retention_prunes_old_finished_jobs_in_batches_and_frees_their_keys,
    test_rollup_counts_per_minute_and_type_once,
    test_sweep_rescues_stalled_jobs_by_the_fail_rule_and_marks_the_worker_gone,
)
from tests.test_periodic import (  # noqa: F401
    test_pause_resume_run_now_and_history_after_removal,
    test_three_schedulers_on_one_database_make_one_job_per_fire_time,
)
from tests.test_queues import (  # noqa: F401
    test_a_paused_queue_is_not_claimed_from_until_resumed,
    test_type_and_queue_limits_hold_across_two_pools,
)

pytestmark = pytest.mark.postgres
PG_URL = os.environ.get("JOBDECK_TEST_POSTGRES_URL")


def _url(database: str) -> str:
    return make_url(PG_URL or "").set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def migrated_template() -> Iterator[str]:
    """A database at the code's revision, only ever copied: no test connects to it."""
    from jobdeck.store.engine import make_engine
    from jobdeck.store.schema import ensure_current

    if not PG_URL:
        pytest.skip("JOBDECK_TEST_POSTGRES_URL is not set")
    name = f"jobdeck_sched_template_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        engine = make_engine(_url(name), pool_size=1)
        try:
            ensure_current(engine, auto_migrate=True)
        finally:
            engine.dispose()  # a template must have no connections while it is copied
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def db_url(migrated_template: str) -> Iterator[str]:
    name = f"jobdeck_sched_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL or "", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}"'))
    try:
        yield _url(name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
