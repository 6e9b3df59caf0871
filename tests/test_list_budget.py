"""Lists of jobs are bounded by bytes as well as by rows (``max_list_bytes``,
``jobdeck.store.listing``, issue 29): a page ends early, with more to come,
where the next job's payload, result and error would pass the budget; a
field over the budget by itself is left out and named; paging still reaches
every job exactly once; the dashboard's lists read no payloads at all. Both
databases, through the store and the real API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.store import JobFilter
from jobdeck.store.listing import list_within

from tests.openapi_check import check

pytestmark = pytest.mark.backends

BUDGET = 10_000


def _payload(size: int) -> dict[str, str]:
    """A payload of exactly ``size`` bytes as stored (compact JSON)."""
    return {"x": "a" * (size - len('{"x":""}'))}


def test_a_page_ends_where_the_budget_does_and_paging_reaches_every_job(make_deck: Any) -> None:
    deck = make_deck(max_payload_bytes=BUDGET * 2)
    sizes = [3000, 3000, 3000, 3000, 15000, 100, 100]  # enqueued oldest first; listed newest first
    ids = [deck.enqueue("demo.noop", _payload(size))[0].id for size in sizes]
    now = datetime.now(UTC)

    pages: list[list[int]] = []
    omitted: dict[int, tuple[str, ...]] = {}
    cursor = None
    while True:
        jobs, cut = list_within(deck.store, JobFilter(before_id=cursor, limit=50), now, BUDGET)
        pages.append([j.id for j in jobs])
        omitted.update({j.id: j.omitted for j in jobs})
        for j in jobs:
            expected = {} if j.omitted else _payload(sizes[ids.index(j.id)])
            assert j.payload == expected
        if not cut:
            break
        cursor = jobs[-1].id
    newest_first = ids[::-1]
    assert [i for page in pages for i in page] == newest_first, "paging skipped or repeated a job"
    # 100 + 100 + the 15,000 left out (0) + 3 x 3,000 fit 10,000; the fourth 3,000 does not.
    assert pages == [newest_first[:6], newest_first[6:]]
    assert omitted[ids[4]] == ("payload",), "the payload over the budget by itself was not named"
    assert all(not omitted[i] for i in ids if i != ids[4])


def test_the_dashboards_lists_read_no_payloads(make_deck: Any) -> None:
    deck = make_deck(max_payload_bytes=BUDGET * 2)
    job_id = deck.enqueue("demo.noop", _payload(15000))[0].id
    jobs, cut = list_within(deck.store, JobFilter(limit=50), datetime.now(UTC), BUDGET, fields=("error",))
    assert [j.id for j in jobs] == [job_id] and not cut
    assert jobs[0].payload == {} and jobs[0].omitted == ("payload", "result")


def test_the_api_pages_by_bytes_and_its_answers_conform(make_deck: Any) -> None:
    deck = make_deck(max_payload_bytes=BUDGET * 2, max_list_bytes=BUDGET)
    ids = [deck.enqueue("demo.noop", _payload(size))[0].id for size in (15000, 4000, 4000, 4000)]
    client = create_app(deck=deck).test_client()

    first = check(client.get("/api/jobs?limit=500"), "/api/jobs", "get")
    assert [j["id"] for j in first["jobs"]] == ids[:0:-1][:2] and first["next_cursor"] == ids[2]
    assert all("omitted" not in j and j["payload"] == _payload(4000) for j in first["jobs"])
    second = check(client.get(f"/api/jobs?limit=500&cursor={first['next_cursor']}"), "/api/jobs", "get")
    assert [j["id"] for j in second["jobs"]] == [ids[1], ids[0]] and second["next_cursor"] is None
    left_out = second["jobs"][1]
    assert left_out["payload"] is None and left_out["omitted"] == ["payload"]
    assert client.get(f"/api/jobs/{ids[0]}").get_json()["payload"] == _payload(15000)

    small = check(client.get("/api/jobs?limit=1"), "/api/jobs", "get")
    assert [j["id"] for j in small["jobs"]] == [ids[3]] and small["next_cursor"] == ids[3]


def test_the_overview_and_workers_lists_read_no_payloads(make_deck: Any) -> None:
    from jobdeck.store.reads import last_dead, running_by_worker

    deck = make_deck(max_payload_bytes=BUDGET * 2)
    dead = deck.enqueue("demo.noop", _payload(15000), max_retries=0)[0].id
    held = deck.enqueue("demo.noop", _payload(15000))[0].id
    now = datetime.now(UTC)
    claimed = deck.store.claim("w1", now, limit=2)
    assert {j.id for j in claimed} == {dead, held}
    deck.store.fail(dead, "w1", "boom", now, retryable=False)

    [overview] = last_dead(deck.store, 50)
    assert overview.id == dead and overview.error == "boom"
    assert overview.payload == {} and overview.omitted == ("payload", "result")
    [running] = running_by_worker(deck.store, ["w1"])["w1"]
    assert running.id == held and running.payload == {} and running.omitted == ("payload", "result", "error")
