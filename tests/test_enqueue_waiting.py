"""The "why is it waiting?" read behind each enqueue answer. On SQLite the
group commit's leader reads what holds jobs back right after the commit, on
its connection, once per batch (``Enqueued.holders``), and the answer says
what a read of its own would have said; a failed read there stores no job
twice and leaves the answer to read alone. Elsewhere, concurrent enqueue
answers share one read (``jobdeck.web.serialize.SharedRead``); an answer
alone reads alone, and each answer judges its job at its own ``now``."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.store import NewJob
from jobdeck.store import enqueue as enqueue_module
from jobdeck.web.serialize import SharedRead

from tests.conftest import wait_for
from tests.helpers import force_state
from tests.openapi_check import check
from tests.test_waiting import T0, a_job, clear


def test_concurrent_enqueues_that_ask_get_one_read_per_batch_made_after_their_commit(deck, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    running, _ = deck.enqueue("demo.report")
    force_state(deck, running.id, State.RUNNING, worker_id="pool-1")
    deck.store.register_worker("pool-1", "host", 1, 2, deck.clock())
    reads: list[int] = []
    real = enqueue_module.read_holders_on

    def counted(db, sqlite):  # type: ignore[no-untyped-def]
        reads.append(1)
        return real(db, sqlite=sqlite)

    monkeypatch.setattr(enqueue_module, "read_holders_on", counted)
    batches = deck.store._enqueuer.batches
    start = threading.Barrier(20)
    got: dict[int, object] = {}

    def produce(i: int) -> None:
        start.wait()
        got[i] = deck.store.enqueue(NewJob("demo.noop", {"i": i}), deck.clock(), read_holders=i % 2 == 0)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 20 and deck.store.counts(deck.clock())["pending"] == 20
    committed = deck.store._enqueuer.batches - batches
    assert 1 <= len(reads) <= committed, "one read per batch that asked, none for the others"
    for i, enqueued in got.items():
        holders = enqueued.holders  # type: ignore[attr-defined]
        if i % 2:
            assert holders is None, "a caller that did not ask gets no read"
            continue
        assert [(g.type, g.worker_id, g.count) for g in holders.running] == [("demo.report", "pool-1", 1)]
        assert [(p.id, p.threads) for p in holders.pools] == [("pool-1", 2)]


def test_the_enqueue_answer_from_the_commits_read_says_what_the_job_page_says(deck, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    client = create_app(deck=deck).test_client()
    reads: list[int] = []
    real = enqueue_module.read_holders_on
    monkeypatch.setattr(
        enqueue_module, "read_holders_on", lambda db, sqlite: reads.append(1) or real(db, sqlite=sqlite)
    )

    def answer_and_page(body: dict[str, object]) -> tuple[object, object]:
        shared = SharedRead.reasons
        monkeypatch.setattr(SharedRead, "reasons", lambda *a: pytest.fail("the answer read apart from its commit"))
        posted = check(client.post("/api/jobs", json=body), "/api/jobs", "post")
        monkeypatch.setattr(SharedRead, "reasons", shared)
        shown = client.get(f"/api/jobs/{posted['id']}").get_json()
        return posted["waiting_reason"], shown["waiting_reason"]

    posted, shown = answer_and_page({"type": "demo.noop"})
    assert posted == shown and posted["code"] == "no_worker"  # type: ignore[index]
    deck.store.register_worker("pool-1", "host", 1, 1, clock.now)
    posted, shown = answer_and_page({"type": "demo.noop"})
    assert posted is None and shown is None, "a live pool with a free slot takes it"
    busy, _ = deck.enqueue("demo.report")
    force_state(deck, busy.id, State.RUNNING, worker_id="pool-1")
    posted, shown = answer_and_page({"type": "demo.noop"})
    assert posted == shown and posted["code"] == "workers_busy"  # type: ignore[index]
    client.post("/api/queues/reports/pause")
    posted, shown = answer_and_page({"type": "demo.report"})
    assert posted == shown and posted["code"] == "queue_paused"  # type: ignore[index]
    posted, shown = answer_and_page({"type": "demo.noop", "run_at": (clock.now + timedelta(hours=1)).isoformat()})
    assert posted == shown and posted["code"] == "scheduled"  # type: ignore[index]
    assert len(reads) == 5, "each answer's reasons came with its commit"


def test_a_failed_read_after_the_commit_stores_the_job_once_and_the_answer_reads_alone(deck, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(db, sqlite):  # type: ignore[no-untyped-def]
        raise RuntimeError("the read after the commit failed")

    monkeypatch.setattr(enqueue_module, "read_holders_on", broken)
    enqueued = deck.store.enqueue(NewJob("demo.noop", {}), deck.clock(), read_holders=True)
    assert enqueued.holders is None and enqueued.created
    assert deck.store.counts(deck.clock())["pending"] == 1, "the committed batch was not written again"
    r = create_app(deck=deck).test_client().post("/api/jobs", json={"type": "demo.noop"})
    assert check(r, "/api/jobs", "post")["waiting_reason"]["code"] == "no_worker", "read on its own"
    assert deck.store.counts(deck.clock())["pending"] == 2


def test_answers_in_flight_together_share_one_read_each_at_its_own_now() -> None:
    shared = SharedRead()
    reads: list[int] = []
    reading, release = threading.Event(), threading.Event()

    def load():  # type: ignore[no-untyped-def]
        reads.append(1)
        reading.set()
        release.wait(10)
        return clear(now=T0)

    later = T0 + timedelta(seconds=5)
    due_later = a_job(available_at=later)  # due at the follower's now, not at the leader's
    got: dict[str, object] = {}
    leader = threading.Thread(target=lambda: got.update(leader=shared.reasons(load, T0).of(a_job())))
    leader.start()
    assert reading.wait(10), "the leader's read did not start"
    follower = threading.Thread(target=lambda: got.update(follower=shared.reasons(load, later).of(due_later)))
    follower.start()
    flight = shared._flight
    assert flight is not None
    # The follower waits on the leader's read (the Future's condition has a waiter).
    wait_for(lambda: flight._condition._waiters, 5, message="the follower to join the read")  # type: ignore[attr-defined]
    release.set()
    leader.join(10)
    follower.join(10)
    assert len(reads) == 1, "the concurrent answers read once between them"
    assert got == {"leader": None, "follower": None}, "the follower judged its job at the leader's now"


def test_an_answer_alone_reads_alone_every_time() -> None:
    shared = SharedRead()
    reads: list[int] = []

    def load():  # type: ignore[no-untyped-def]
        reads.append(1)
        return clear(paused=frozenset({"reports"}) if len(reads) > 1 else frozenset())

    assert shared.reasons(load, T0).of(a_job()) is None
    assert shared.reasons(load, T0).of(a_job())["code"] == "queue_paused"  # type: ignore[index]
    assert len(reads) == 2, "a finished read is never reused"


def test_a_failed_read_fails_every_answer_that_shared_it_and_the_next_reads_again() -> None:
    shared = SharedRead()
    calls: list[int] = []

    def failing():  # type: ignore[no-untyped-def]
        calls.append(1)
        raise RuntimeError("database is gone")

    with pytest.raises(RuntimeError, match="database is gone"):
        shared.reasons(failing, T0).of(a_job())
    assert shared.reasons(lambda: clear(), T0).of(a_job()) is None
