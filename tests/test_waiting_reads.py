"""The reads behind "why is it waiting?" (app/store/waiting.py) and the
reasons they give through the real store, on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jobdeck.jobs.waiting import for_deck
from jobdeck.store.waiting import PoolRow, RunningGroup, read_waiting

pytestmark = pytest.mark.backends


def _claim(deck, worker_id, job_type, now):
    claimed = deck.store.claim(worker_id, now, limit=1, types=[job_type])
    assert len(claimed) == 1, f"{worker_id} claimed {claimed}"
    return claimed[0]


def test_the_reads_group_running_jobs_and_find_pools_and_http_traces(make_deck, clock, backend):
    deck = make_deck(clock, external_types=["pdf.render", "ocr.scan"])
    now = clock.now
    deck.store.register_worker("pool-1", "host", 1, 2, now)
    deck.store.register_worker("pool-gone", "host", 2, 2, now)
    deck.store.stop_worker("pool-gone", now)
    for _ in range(2):
        deck.enqueue("demo.noop")
    deck.enqueue("demo.report")
    deck.enqueue("pdf.render")
    deck.enqueue("pdf.render")
    _claim(deck, "pool-1", "demo.noop", now)
    _claim(deck, "pool-1", "demo.noop", now)
    _claim(deck, "http-1", "pdf.render", now)
    done = _claim(deck, "http-2", "pdf.render", now)
    deck.store.complete(done.id, "http-2", now)

    reads = read_waiting(deck.store, now - timedelta(seconds=5), {"pdf.render", "ocr.scan"})

    assert sorted(reads.running, key=lambda g: (g.type, g.worker_id)) == [
        RunningGroup("default", "demo.noop", "pool-1", 2, now),
        RunningGroup("default", "pdf.render", "http-1", 1, now),
    ]
    assert reads.pools == [PoolRow("pool-1", 2, now, None)]
    assert reads.recently_finished_types == frozenset({"pdf.render"})
    assert read_waiting(deck.store, now + timedelta(seconds=1), {"pdf.render"}).recently_finished_types == frozenset()
    assert read_waiting(deck.store, now).recently_finished_types == frozenset()  # not asked: not read


def test_the_reasons_through_the_real_store(make_deck, clock, backend):
    deck = make_deck(clock, external_types=["pdf.render"], queues={"mail": {"concurrency": 1}})
    now = clock.now
    deck.store.register_worker("pool-1", "host", 1, 2, now)
    report, _ = deck.enqueue("demo.report")  # queue reports
    deck.queues.set_paused("reports", True, now, "test")
    mail_a, _ = deck.enqueue("demo.noop", queue="mail")
    mail_b, _ = deck.enqueue("demo.noop", queue="mail")
    later, _ = deck.enqueue("demo.noop", delay_seconds=60)
    pdf, _ = deck.enqueue("pdf.render")
    noop, _ = deck.enqueue("demo.noop")
    held = deck.store.claim("pool-1", now, limit=1, types=["demo.noop"], queues=["mail"])
    assert [j.id for j in held] == [mail_a.id]

    def codes():
        reasons = for_deck(deck, clock.now)
        return {j: (r or {}).get("code") for j, r in ((j.id, reasons.of(deck.store.get(j.id))) for j in jobs)}

    jobs = [report, mail_a, mail_b, later, pdf, noop]
    assert codes() == {
        report.id: "queue_paused",
        mail_a.id: None,  # running
        mail_b.id: "concurrency_limit",
        later.id: "scheduled",
        pdf.id: "no_worker",
        noop.id: None,  # pool-1 has a free slot
    }
    _claim(deck, "pool-1", "demo.noop", now)  # a second job: pool-1's two slots are full
    extra, _ = deck.enqueue("demo.noop")
    jobs.append(extra)
    assert codes()[extra.id] == "workers_busy"
    clock.advance(10)  # past the stall timeout (5 s): pool-1 is silent
    assert codes()[extra.id] == "no_worker"


def test_the_driver_level_read_raises_sqlalchemys_errors_and_keeps_its_connection(make_deck, clock, backend):
    """``Transactions.glance`` runs a statement on the pooled driver
    connection: a failing one raises SQLAlchemy's error (what the API's
    error handler tells apart: 500 for a bug, 503 for an outage), and the
    connection goes back to the pool usable."""
    from sqlalchemy.exc import DBAPIError

    deck = make_deck(clock)
    with pytest.raises(DBAPIError), deck.store.glance() as db:
        db.execute("SELECT * FROM no_such_table")
    for _ in range(3):  # the pool's connections, the one above among them
        assert read_waiting(deck.store, clock.now).running == []
    deck.store.register_worker("pool-1", "host", 1, 2, clock.now)
    assert [p.id for p in read_waiting(deck.store, clock.now).pools] == ["pool-1"]
