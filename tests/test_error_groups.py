"""Failed and dead jobs grouped by type and error fingerprint, on both
databases: the fail statement (and the rescue, which runs it) stores the
fingerprint, the grouping read counts it, a group is one more filter of
``JobFilter`` for the bulk actions, and migration 0012 backfills old rows.
A group's "First seen" is when its jobs first failed with its error, kept
across retries (migration 0026)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobdeck.core.states import SOURCES, State, Transition
from jobdeck.deck import Jobdeck
from jobdeck.store import JobFilter, NewJob, Outcome, migrate
from jobdeck.store.models import jobs
from jobdeck.store.reads import count_matching, error_groups, newest_id, next_batch
from sqlalchemy import select, text, update

pytestmark = pytest.mark.backends


def fail_jobs(deck: Jobdeck, job_type: str, errors: list[str], *, retryable: bool = False) -> list[int]:
    """Enqueue one job of ``job_type`` per error and fail each with it
    (straight to dead unless ``retryable``); returns their ids in order."""
    now = deck.clock()
    ids = deck.store.enqueue_many([NewJob(type=job_type, payload={"i": i}) for i in range(len(errors))], now)
    claimed = {j.id: j for j in deck.store.claim("w1", now, limit=len(errors), types=[job_type])}
    for job_id, error in zip(ids, errors, strict=True):
        job = claimed[job_id]
        deck.store.fail_many([Outcome(job.id, "w1", attempt=job.attempt, error=error, retryable=retryable)], now)
    return ids


def fingerprint_of(deck: Jobdeck, job_id: int) -> str | None:
    with deck.store.read() as conn:
        return conn.execute(select(jobs.c.error_fingerprint).where(jobs.c.id == job_id)).scalar()


def test_the_fail_statement_stores_the_fingerprint_on_both_paths(deck):
    dead = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'"])
    failed = fail_jobs(deck, "demo.flaky", ["RuntimeError: card 4242 declined"], retryable=True)
    assert deck.store.get(dead[0]).status is State.DEAD
    assert deck.store.get(failed[0]).status is State.FAILED
    assert fingerprint_of(deck, dead[0]) == "KeyError: '?'"
    assert fingerprint_of(deck, failed[0]) == "RuntimeError: card ? declined"


def test_the_http_workers_fail_and_the_rescue_store_it_too(deck, clock):
    [job_id] = deck.store.enqueue_many([NewJob(type="demo.fail")], clock())
    [job] = deck.store.claim("w-http", clock(), limit=1)
    deck.store.fail(job.id, "w-http", "ValueError: row 17 is bad\x00", clock(), retryable=False)
    assert fingerprint_of(deck, job_id) == "ValueError: row ? is bad\\x?"

    [stalled_id] = deck.store.enqueue_many([NewJob(type="demo.fail")], clock())
    deck.store.claim("w-gone", clock(), limit=1)
    rescued = deck.store.rescue_stalled(clock() + timedelta(seconds=60), stall_timeout=5)
    assert [j.id for j in rescued] == [stalled_id]
    assert fingerprint_of(deck, stalled_id) == "stalled: worker w-gone stopped heart-beating at ?-?-?T?:?:?+?:?"


def test_groups_count_and_order_by_size_with_first_last_seen_and_sample(deck, clock):
    t0 = clock()
    first = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'", "KeyError: 'user_77'"])
    clock.advance(60)
    fail_jobs(deck, "demo.fail", ["RuntimeError: card 4242 declined"])
    clock.advance(60)
    last = fail_jobs(deck, "demo.fail", ["KeyError: 'user_9'"])
    fail_jobs(deck, "demo.report", ["KeyError: 'user_1'"])  # same error, other type: its own group
    fail_jobs(deck, "demo.fail", ["KeyError: 'user_5'"], retryable=True)  # failed, not dead

    groups = error_groups(deck.store, State.DEAD)
    assert [(g.type, g.fingerprint, g.count) for g in groups] == [
        ("demo.fail", "KeyError: '?'", 3),
        ("demo.report", "KeyError: '?'", 1),
        ("demo.fail", "RuntimeError: card ? declined", 1),
    ]
    keys = groups[0]
    assert keys.first_seen == t0 and keys.last_seen == t0 + timedelta(seconds=120)
    assert keys.first_seen.tzinfo is not None
    assert keys.sample_id == last[0] and keys.sample_error == "KeyError: 'user_9'"
    assert first[0] != keys.sample_id
    [retrying] = error_groups(deck.store, State.FAILED)
    assert (retrying.fingerprint, retrying.count, retrying.sample_error) == ("KeyError: '?'", 1, "KeyError: 'user_5'")


def fail_again(deck: Jobdeck, ids: list[int], error: str, *, retryable: bool = False) -> None:
    """Claim the jobs ``ids`` (due now) and fail each once more with ``error``."""
    now = deck.clock()
    claimed = deck.store.claim("w2", now, limit=len(ids))
    assert sorted(j.id for j in claimed) == sorted(ids)
    deck.store.fail_many(
        [Outcome(j.id, "w2", attempt=j.attempt, error=error, retryable=retryable) for j in claimed], now
    )


def test_first_seen_is_kept_when_the_group_is_retried_and_fails_the_same_way(deck, clock):
    t0 = clock()
    keys = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'", "KeyError: 'user_77'"])
    clock.advance(240)
    assert sorted(deck.store.retry_ids(keys, clock())) == sorted(keys)  # a person's retry of the whole group
    fail_again(deck, keys, "KeyError: 'user_3'")
    [group] = error_groups(deck.store, State.DEAD)
    assert (group.fingerprint, group.count) == ("KeyError: '?'", 2)
    assert group.first_seen == t0 and group.last_seen == t0 + timedelta(seconds=240)


def test_first_seen_is_kept_across_the_jobs_own_retries(deck, clock):
    t0 = clock()
    [job_id] = fail_jobs(deck, "demo.flaky", ["OSError: disk 3 full"], retryable=True)
    clock.advance(3600)  # past the backoff
    fail_again(deck, [job_id], "OSError: disk 4 full", retryable=True)
    [group] = error_groups(deck.store, State.FAILED)
    assert (group.count, group.first_seen, group.last_seen) == (1, t0, t0 + timedelta(seconds=3600))


def test_a_new_error_on_the_same_job_starts_its_own_first_seen(deck, clock):
    [job_id] = fail_jobs(deck, "demo.flaky", ["OSError: disk 3 full"], retryable=True)
    clock.advance(3600)
    fail_again(deck, [job_id], "ValueError: row 7 is bad", retryable=True)
    clock.advance(3600)
    fail_again(deck, [job_id], "ValueError: row 8 is bad", retryable=True)
    [group] = error_groups(deck.store, State.FAILED)
    assert group.fingerprint == "ValueError: row ? is bad"
    assert group.first_seen == clock() - timedelta(seconds=3600) and group.last_seen == clock()


def test_groups_are_bounded_and_an_empty_state_has_none(deck):
    assert error_groups(deck.store, State.DEAD) == []
    fail_jobs(deck, "demo.fail", [f"E{i}: x" for i in range(5)])
    assert len(error_groups(deck.store, State.DEAD, limit=3)) == 3


def test_jobs_without_a_fingerprint_form_one_group(deck):
    """Failed by a release that stored none (a rolling deploy)."""
    ids = fail_jobs(deck, "demo.fail", ["KeyError: 'a'", "OSError: b"])
    with deck.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(ids)).values(error_fingerprint=None))
    [group] = error_groups(deck.store, State.DEAD)
    assert (group.fingerprint, group.count) == (None, 2)


def test_a_group_is_a_filter_the_bulk_actions_count_and_batch_by(deck):
    keys = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'", "KeyError: 'user_77'", "KeyError: 'u3'"])
    other = fail_jobs(deck, "demo.fail", ["RuntimeError: card 4242 declined"])
    elsewhere = fail_jobs(deck, "demo.report", ["KeyError: 'user_1'"])
    now = deck.clock()
    group = JobFilter(status=State.DEAD, type="demo.fail", error_fingerprint="KeyError: '?'")
    up_to = newest_id(deck.store)
    assert count_matching(deck.store, group, now, SOURCES[Transition.RETRY], up_to) == 3
    batch = next_batch(deck.store, group, now, SOURCES[Transition.RETRY], up_to + 1)
    assert sorted(batch) == sorted(keys)
    assert sorted(deck.store.retry_ids(batch, now)) == sorted(keys)
    assert count_matching(deck.store, group, now, SOURCES[Transition.RETRY], up_to) == 0
    assert [deck.store.get(i).status for i in other + elsewhere] == [State.DEAD, State.DEAD]
    # A retried job keeps its old fingerprint, but is no longer in the group.
    assert deck.store.list_jobs(JobFilter(error_fingerprint="KeyError: '?'", type="demo.fail"), now) == []


def test_migration_backfills_failed_and_dead_jobs_from_their_error(engine_url_deck):
    deck = engine_url_deck
    dead = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'", "KeyError: 'user_77'"])
    failed = fail_jobs(deck, "demo.fail", ["RuntimeError: card 4242 declined"], retryable=True)
    [done] = deck.store.enqueue_many([NewJob(type="demo.noop")], deck.clock())
    previous = migrate.script().get_revision("0012").down_revision
    migrate.downgrade(deck.store.engine, str(previous))
    with deck.store.read() as conn:
        columns = conn.execute(text("SELECT * FROM jobs WHERE 1 = 0")).keys()
    assert "error_fingerprint" not in columns

    migrate.upgrade(deck.store.engine)

    assert [fingerprint_of(deck, i) for i in dead] == ["KeyError: '?'"] * 2
    assert fingerprint_of(deck, failed[0]) == "RuntimeError: card ? declined"
    assert fingerprint_of(deck, done) is None
    assert migrate.differences(deck.store.engine) == []


def test_migration_0026_starts_error_since_at_the_last_failure(engine_url_deck, clock):
    deck = engine_url_deck
    t0 = clock()
    dead = fail_jobs(deck, "demo.fail", ["KeyError: 'user_42'"])
    clock.advance(60)
    failed = fail_jobs(deck, "demo.flaky", ["OSError: disk 3 full"], retryable=True)
    [done] = deck.store.enqueue_many([NewJob(type="demo.noop")], deck.clock())
    migrate.downgrade(deck.store.engine, "0025")
    with deck.store.read() as conn:
        columns = list(conn.execute(text("SELECT * FROM jobs WHERE 1 = 0")).keys())
    assert "error_since" not in columns

    migrate.upgrade(deck.store.engine)

    with deck.store.read() as conn:
        since = dict(conn.execute(select(jobs.c.id, jobs.c.error_since)).all())
    assert since == {dead[0]: t0, failed[0]: t0 + timedelta(seconds=60), done: None}
    assert [g.first_seen for g in error_groups(deck.store, State.DEAD)] == [t0]
    assert migrate.differences(deck.store.engine) == []


@pytest.fixture
def engine_url_deck(make_deck, clock):
    return make_deck(clock=clock)
