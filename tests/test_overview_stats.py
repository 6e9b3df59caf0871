"""The overview's throughput chart reads the per-minute counters for the
minutes the roll-up closed, so it survives retention pruning the attempts
(and restarts); the minutes after the roll-up come live from attempts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobdeck.maintenance.upkeep import Maintenance, Retention
from jobdeck.store import Outcome
from jobdeck.store.overview import throughput

pytestmark = pytest.mark.backends


def _finish(deck, clock, at, ok: bool) -> int:
    """One attempt finished at ``at`` through the real claim and ack."""
    now, clock.now = clock.now, at - timedelta(seconds=1)
    job, _ = deck.enqueue("demo.noop" if ok else "demo.fail", {}, max_retries=0)
    clock.now = now
    assert [j.id for j in deck.store.claim("w1", at - timedelta(seconds=1), limit=1)] == [job.id]
    if ok:
        deck.store.complete(job.id, "w1", at)
    else:
        deck.store.fail_many([Outcome(job.id, "w1", error="boom")], at)
    return job.id


def test_throughput_survives_pruning_through_the_minute_counters(deck, clock):
    m = Maintenance(
        deck.store, deck.clock, deck.config.stall_timeout, Retention(completed_days=0.001)
    )  # ~86 s: the test's jobs are old enough to prune
    m.rollup_once(clock.now)  # watermark one hour back
    early = clock.now - timedelta(minutes=10)
    _finish(deck, clock, early, ok=True)
    _finish(deck, clock, early + timedelta(seconds=5), ok=True)
    _finish(deck, clock, early + timedelta(seconds=9), ok=False)
    clock.advance(120)
    assert m.rollup_once(clock.now) > 0
    assert m.prune_once(clock.now)["jobs"] == 2  # the completed jobs and their attempts are gone
    _finish(deck, clock, clock.now - timedelta(seconds=1), ok=True)  # after the watermark: counted live

    series = {minute: (ok, failed) for minute, ok, failed in throughput(deck.store, clock.now)}
    assert len(series) == 60
    assert series[early.replace(second=0)] == (2, 1)
    assert series[(clock.now - timedelta(seconds=1)).replace(second=0, microsecond=0)] == (1, 0)
    assert sum(ok + failed for ok, failed in series.values()) == 4


def test_without_a_roll_up_the_hour_comes_from_attempts(deck, clock):
    _finish(deck, clock, clock.now - timedelta(minutes=30), ok=False)
    series = throughput(deck.store, clock.now)
    assert [(ok, failed) for _, ok, failed in series if ok or failed] == [(0, 1)]
