"""A bulk action's audit entry: opened with its total, counted batch by batch
in each batch's own transaction, finished by its last, and read as running,
finished or interrupted (``jobdeck.store.audit``). On both databases."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from dashboard_support import make_dead, post
from jobdeck.core import processes
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import audit
from jobdeck.store.audit import STALE_AFTER, Tally, audit_entry, open_bulk
from jobdeck.store.reads import BATCH, newest_id

pytestmark = pytest.mark.backends


def _entry(deck: Jobdeck, entry: int) -> audit.AuditRecord:
    record = audit_entry(deck.store, entry)
    assert record is not None
    return record


def test_a_batch_and_its_count_commit_together_or_not_at_all(deck: Jobdeck, monkeypatch: Any) -> None:
    ids = [make_dead(deck) for _ in range(3)]
    entry = open_bulk(deck.store, "alice", "retry all", deck.clock(), total=3, detail="all dead")
    assert deck.store.retry_ids(ids[:2], deck.clock(), Tally(entry)) == ids[:2]
    assert (_entry(deck, entry).count, _entry(deck, entry).finished_at) == (2, None)

    def broken(*args: Any) -> None:
        raise RuntimeError("the count's update failed")

    monkeypatch.setattr("jobdeck.store.lifecycle.count_moved", broken)
    with pytest.raises(RuntimeError):
        deck.store.retry_ids(ids[2:], deck.clock(), Tally(entry, last=True))
    assert deck.store.get(ids[2]).status is State.DEAD, "the batch moved without its count"
    monkeypatch.undo()
    deck.store.retry_ids(ids[2:], deck.clock(), Tally(entry, last=True))
    done = _entry(deck, entry)
    assert (done.count, done.total, done.finished_at) == (3, 3, deck.clock())
    progress = done.progress(deck.clock())
    assert progress is not None and progress.describe() == "3 of 3"


def test_an_unfinished_action_reads_running_then_interrupted(deck: Jobdeck, clock: Any) -> None:
    entry = open_bulk(deck.store, "alice", "retry all", clock(), total=20_000, detail="all dead")
    here = _entry(deck, entry)
    assert here.owner == processes.identity()
    assert here.progress(clock()).state == "running"  # type: ignore[union-attr]
    clock.advance(STALE_AFTER.total_seconds() * 10)
    assert here.progress(clock()).state == "running", "a live process of this host is running it"  # type: ignore[union-attr]

    with deck.store.write() as conn:
        audit.count_moved(conn, Tally(entry), 5_500, clock())
        conn.exec_driver_sql(f"UPDATE audit_log SET owner = 'elsewhere:42:abcd.1' WHERE id = {entry}")
    other_host = _entry(deck, entry)
    assert other_host.progress(clock()).describe() == "5,500 of 20,000 so far"  # type: ignore[union-attr]
    later = clock() + STALE_AFTER + timedelta(seconds=1)
    assert other_host.progress(later).describe() == "interrupted after 5,500 of 20,000"  # type: ignore[union-attr]

    host, pid, marker = processes.identity().rsplit(":", 2)
    dead = f"{host}:{2**22 + 1}:{marker}"  # above the kernel's pid_max: no such process
    with deck.store.write() as conn:
        conn.exec_driver_sql(f"UPDATE audit_log SET owner = '{dead}' WHERE id = {entry}")
    assert processes.gone(dead) is True
    assert _entry(deck, entry).progress(clock()).interrupted  # type: ignore[union-attr]
    assert audit.interrupted_bulk(deck.store, "alice", clock()) is not None
    assert audit.interrupted_bulk(deck.store, "bob", clock()) is None


def test_ticked_rows_are_one_bulk_action_with_its_total(dash: Any, deck: Jobdeck) -> None:
    ids = [make_dead(deck) for _ in range(3)]
    deck.store.retry(ids[0], deck.clock())  # moved on before the click
    r = post(dash, "/actions/selected/retry", {"tab": "dead", "ids": [str(i) for i in ids]})
    assert r.status_code == 200
    (entry,) = [e for e in audit.list_audit(deck.store)[0] if e.action == "retry selected"]
    assert (entry.count, entry.total) == (2, 3) and entry.finished_at is not None
    assert entry.progress(deck.clock()).describe() == "2 of 3; 1 had moved on"  # type: ignore[union-attr]


def test_all_matching_reads_its_progress_from_the_entry_and_refuses_another_s(dash: Any, deck: Jobdeck) -> None:
    deck.enqueue_many([{"type": "demo.noop", "payload": {"n": i}} for i in range(BATCH + 5)])
    up_to = newest_id(deck.store)
    first = post(dash, "/actions/matching/discard", {"tab": "pending", "up_to": up_to, "total": 7})
    vals = json.loads(re.search(r"hx-vals='([^']+)'", first.get_data(as_text=True)).group(1).replace("&#34;", '"'))
    assert set(vals) == {"tab", "up_to", "entry", "below"}, "the tally must come from the entry, not the form"
    (entry,) = audit.list_audit(deck.store)[0]
    assert (entry.count, entry.total, entry.finished_at) == (BATCH, 7, None)

    stranger = open_bulk(deck.store, "someone else", "discard all", deck.clock(), total=1, detail="theirs")
    r = post(dash, "/actions/matching/discard", {**vals, "entry": stranger})
    assert r.status_code == 409 and "not one of yours" in r.get_data(as_text=True)

    last = post(dash, "/actions/matching/discard", vals)
    assert f"{BATCH + 5:,} of {BATCH + 5:,} discarded" in last.get_data(as_text=True)
    done = _entry(deck, entry.id)
    assert (done.count, done.finished_at is not None) == (BATCH + 5, True)
    again = post(dash, "/actions/matching/discard", vals)
    assert again.status_code == 409 and "has finished" in again.get_data(as_text=True)


def test_a_workflow_action_is_a_bulk_action(client: Any, deck: Jobdeck) -> None:
    wf = deck.workflow("w").add("a", "demo.noop").add("b", "demo.noop", depends_on=["a"]).enqueue()
    r = client.post(f"/api/workflows/{wf.id}/cancel", json={})
    assert r.status_code == 200, r.get_data(as_text=True)
    (entry,) = audit.list_audit(deck.store)[0]
    assert (entry.action, entry.count, entry.total, entry.detail) == ("cancel", 2, 2, f"workflow {wf.id}")
    assert entry.finished_at is not None
