"""Every operator action lands in the audit log, whichever way it came in."""

from __future__ import annotations

from jobdeck.store.audit import list_audit


def _actions(deck) -> list[tuple[str, str, int, str | None]]:
    entries, _ = list_audit(deck.store)
    return [(e.actor, e.action, e.count, e.detail) for e in reversed(entries)]


def test_api_retry_and_discard_are_audited(client, deck) -> None:
    job = client.post("/api/jobs", json={"type": "demo.noop"}).get_json()
    assert client.post(f"/api/jobs/{job['id']}/discard").status_code == 200
    assert client.post(f"/api/jobs/{job['id']}/retry").status_code == 200
    assert [(a, v, n) for a, v, n, _ in _actions(deck)] == [("api", "discard", 1), ("api", "retry", 1)]


def test_queue_pause_through_the_api_is_audited(client, deck) -> None:
    assert client.post("/api/queues/reports/pause").status_code == 200
    assert client.post("/api/queues/reports/resume").status_code == 200
    assert [(a, v, d) for a, v, _, d in _actions(deck)] == [
        ("api", "queue.pause", "reports"),
        ("api", "queue.resume", "reports"),
    ]
    page = client.get("/audit")
    assert page.status_code == 200
    assert b"queue.pause" in page.data and b"reports" in page.data
