"""Job logs in the store, on SQLite and PostgreSQL: ``append_lines``
enforces the caps over every attempt and batch of the job, keeps one
``truncated`` marker per attempt, stores nothing for a job that is gone,
and numbers the lines of concurrent batches for one attempt without a gap
or a clash (the job's row is locked on PostgreSQL, the write lock held on
SQLite)."""

from __future__ import annotations

import threading

import pytest
from jobdeck.jobs.joblogs import TRUNCATED, LogLimits, LogLine
from jobdeck.store.joblogs import append_lines, lines_of

pytestmark = pytest.mark.backends


def test_the_per_job_byte_cap_counts_every_attempt_and_flush(make_deck) -> None:
    deck = make_deck()
    job, _ = deck.enqueue("demo.noop", {})
    limits = LogLimits(max_lines_per_attempt=100, max_bytes_per_job=100)
    now = deck.clock()
    line = LogLine("info", "x" * 30, now)
    assert append_lines(deck.store, job.id, 1, [line, line], 0, limits) == 2
    assert append_lines(deck.store, job.id, 2, [line, line], 0, limits) == 1  # 90 of 100 bytes
    assert append_lines(deck.store, job.id, 2, [line], 0, limits) == 0
    assert append_lines(deck.store, job.id, 3, [LogLine("info", "é" * 6, now)], 0, limits) == 0  # 12 bytes
    levels = [(x.attempt, x.level) for x in lines_of(deck.store, job.id)]
    assert levels == [(1, "info"), (1, "info"), (2, "info"), (2, TRUNCATED), (3, TRUNCATED)]
    assert "max_bytes_per_job" in lines_of(deck.store, job.id, attempt=3)[0].message


def test_a_buffer_that_dropped_lines_gets_the_marker_once(make_deck) -> None:
    deck = make_deck()
    job, _ = deck.enqueue("demo.noop", {})
    limits = LogLimits(max_lines_per_attempt=3)
    line = LogLine("info", "a", deck.clock())
    append_lines(deck.store, job.id, 1, [line], 7, limits)
    assert append_lines(deck.store, job.id, 1, [line, line, line], 2, limits) == 0
    append_lines(deck.store, job.id, 1, [], 5, limits)
    assert [x.level for x in lines_of(deck.store, job.id)] == ["info", TRUNCATED]
    assert append_lines(deck.store, 10**9, 1, [line], 0, limits) == 0  # no such job: nothing stored


def test_after_the_marker_an_attempt_stores_nothing_even_a_line_that_would_fit(make_deck) -> None:
    """The marker says the rest was dropped: a short line sent after a long
    one hit the byte cap must not appear after it (a gap the marker denies)."""
    deck = make_deck()
    job, _ = deck.enqueue("demo.noop", {})
    limits = LogLimits(max_lines_per_attempt=100, max_bytes_per_job=100)
    now = deck.clock()
    assert append_lines(deck.store, job.id, 1, [LogLine("info", "short", now)], 0, limits) == 1
    assert append_lines(deck.store, job.id, 1, [LogLine("info", "x" * 500, now)], 0, limits) == 0
    assert append_lines(deck.store, job.id, 1, [LogLine("info", "l1", now)], 0, limits) == 0
    assert [x.level for x in lines_of(deck.store, job.id)] == ["info", TRUNCATED]
    assert append_lines(deck.store, job.id, 2, [LogLine("info", "l1", now)], 0, limits) == 1, "a new attempt logs"


def test_concurrent_batches_for_one_attempt_number_their_lines_in_turn(make_deck) -> None:
    deck = make_deck()
    job, _ = deck.enqueue("demo.noop", {})
    limits = LogLimits(max_lines_per_attempt=10_000)
    writers, batches, size = 4, 15, 5
    start = threading.Barrier(writers, timeout=10)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            start.wait()
            for b in range(batches):
                lines = [LogLine("info", f"w{w} b{b} l{i}", deck.clock()) for i in range(size)]
                assert append_lines(deck.store, job.id, 1, lines, 0, limits) == size
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    got = lines_of(deck.store, job.id, limit=10_000)
    total = writers * batches * size
    assert [x.seq for x in got] == list(range(1, total + 1))
    assert len({x.message for x in got}) == total
    for w in range(writers):  # each batch stays together, in the writer's order
        mine = [x.message for x in got if x.message.startswith(f"w{w} ")]
        assert mine == [f"w{w} b{b} l{i}" for b in range(batches) for i in range(size)]
