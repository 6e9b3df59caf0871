"""PostgreSQL's array literals (``jobdeck.store.postgres.text_array``,
``int_array``, ``time_array``) against hostile values: the bulk enqueue
(``statements.enqueue_unnest``), the claim of given ids
(``claim_statements.claim_id_array``) and the flow claim's starts
(``claim_statements.claim_ids_logging``).

What holds: every string an array literal could misread (quotes,
backslashes, braces, commas, the word NULL in any case, empty strings,
white space at the ends, control characters, non-BMP characters, long
strings) comes back exactly as sent, as payload, idempotency key and queue,
through ``enqueue_many`` (plain and keyed), ``enqueue_bulk`` and
``POST /api/jobs/bulk``; duplicate keys in one call make one job; the flow
claim logs each start under the exact key and keeps its limits; the claim
of ids takes none, one, duplicates and missing ids as it should.

Two defects it found, fixed:

- A queue name that NFC normalization makes longer than its column (60
  times U+0958, 120 characters once composed) passed intake, whose length
  check ran before the normalization; the bulk insert then answered 500 on
  PostgreSQL (before cf7d055 the varchar(100)[] cast cut it to 100
  characters without a word). ``check_name`` now checks the normalized
  length: refused by name, a 422.
- A handler's default ``priority`` that is not an integer (2.7: not
  checked at registration) was truncated by ``int_array`` (2) in a bulk
  enqueue, where the single enqueue's cast rounded it (3). ``Registry.handler``
  now checks it as an enqueue's priority is checked.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime

import pytest
from jobdeck import create_app
from jobdeck.core.errors import InvalidField
from jobdeck.store.models import flow_starts, jobs
from sqlalchemy import select

PG = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

HOSTILE = [
    "NULL", "null", "NuLl", " NULL ", "NULL ", '"NULL"', "", " ", "  padded  ", '"', '""', "\\", "\\\\", '\\"', '"\\',
    "{", "}", "{}", "{a,b}", "{NULL}", ",", "a,b", "'", "a'b", "[1:2]={a,b}", "\t", "\n", "\r\n", "\x01", "\x1f",
    "\x7f", "\x00", "a\x00b", "\u00a0", "\u2028", "\ufeff", "\U0001f600", "\U0001f600" * 3, "x" * 5000, "é", "e\u0301",
]  # fmt: skip
"""Strings an array literal could misread, as payload values and keys."""
KEYS = [s for s in HOSTILE if s and len(s) <= 255 and "\x00" not in s] + ["\U0001f600" * 255, "k" * 255]
"""Those an idempotency key may be (intake refuses empty, NUL, more than 255 characters)."""
QUEUES = ['a"b', "a\\b", "{q}", "a,b", "NULL", "null", "Null", "a'b", "\U0001f600", "q" * 100, "é", "a b"]
"""Queue names intake accepts that an array literal could misread."""


def _payload(s: str) -> dict[str, object]:
    return {"v": s, s: [s, None, {"n": s}]} if s else {"v": s}


def _stored(deck, ids):
    with deck.store.read() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.queue, jobs.c.payload, jobs.c.idempotency_key)).all()
    by_id = {r.id: r for r in rows}
    return [by_id[i] for i in ids]


@PG
def test_hostile_payloads_keys_and_queues_come_back_exactly_from_every_bulk_path(make_deck, backend):
    deck = make_deck()
    plain = [{"type": "demo.noop", "payload": _payload(s)} for s in HOSTILE]
    ids = deck.enqueue_many(plain)
    assert [json.loads(r.payload) for r in _stored(deck, ids)] == [p["payload"] for p in plain]

    keyed = [{"type": "demo.noop", "idempotency_key": k, "payload": _payload(k)} for k in KEYS]
    ids = deck.enqueue_many([*keyed, {"type": "demo.noop"}])
    rows = _stored(deck, ids)
    assert [r.idempotency_key for r in rows] == [*KEYS, None]
    assert [json.loads(r.payload) for r in rows[:-1]] == [k["payload"] for k in keyed]
    assert deck.enqueue_many(keyed) == ids[:-1]  # every key found again: nothing inserted twice

    queued = [{"type": "demo.noop", "queue": q} for q in QUEUES]
    ids = deck.enqueue_many(queued)
    assert [r.queue for r in _stored(deck, ids)] == QUEUES

    answered = deck.enqueue_bulk(plain)
    assert [json.loads(r.payload) for r in _stored(deck, [a.id for a in answered])] == [p["payload"] for p in plain]

    client = create_app(deck=deck).test_client()
    response = client.post("/api/jobs/bulk", json={"jobs": plain})
    assert response.status_code == 201, response.get_data(as_text=True)[:300]
    got = [j["id"] for j in response.get_json()["jobs"]]
    assert [json.loads(r.payload) for r in _stored(deck, got)] == [p["payload"] for p in plain]


@PG
def test_a_key_given_twice_in_one_bulk_call_is_one_job(make_deck, backend):
    deck = make_deck()
    for key in ("NULL", '"', "\\", "{,}", " "):
        ids = deck.enqueue_many(
            [
                {"type": "demo.noop", "idempotency_key": key},
                {"type": "demo.noop"},
                {"type": "demo.noop", "idempotency_key": key},
            ]
        )
        assert ids[0] == ids[2] != ids[1]
        assert deck.store.get(ids[0]).idempotency_key == key


@PG
def test_run_at_at_the_ends_of_time_and_at_odd_offsets_in_bulk(make_deck, backend):
    deck = make_deck()
    for at in (
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z",
        "2024-03-31T02:30:00+05:45",
        "1900-01-01T00:00:00.000001-00:19",
    ):
        want = datetime.fromisoformat(at.replace("Z", "+00:00")).astimezone(UTC)
        ids = deck.enqueue_many(
            [{"type": "demo.noop", "run_at": at}, {"type": "demo.noop", "run_at": at, "idempotency_key": at}]
        )
        assert [deck.store.get(i).available_at for i in ids] == [want, want]


@PG
def test_the_claim_of_given_ids_takes_none_one_duplicates_and_missing_ids(make_deck, backend):
    deck = make_deck(types={"demo.noop": {"concurrency": 2}})
    ids = deck.enqueue_many([{"type": "demo.noop"}] * 5)
    assert [j.id for j in deck.store.claim("w", deck.clock(), limit=10)] == ids[:2]  # the limit: claim_ids
    now = deck.clock()
    with deck.store.write() as conn:
        assert deck.store.claim_ids(conn, "w", now, []) == []
        assert deck.store.claim_ids(conn, "w", now, [10**6, -1, 2**63 - 1]) == []
        assert [j.id for j in deck.store.claim_ids(conn, "w", now, [ids[4], ids[4], ids[4]])] == [ids[4]]
        assert deck.store.claim_ids(conn, "w", now, [ids[4]]) == []  # running now: not claimable again
        assert [j.id for j in deck.store.claim_ids(conn, "w", now, (ids[3], ids[0]))] == [ids[3]]


FLOW_KEYS = ['b "q" \\ {,}', "NULL", "null", " NULL ", "", " ", "\\", '"', "{}", ",", "a\tb", "\U0001f600", "x" * 300]


@PG
def test_the_flow_claim_logs_every_start_under_its_exact_key_and_keeps_the_limits(make_deck, backend):
    limits = {
        "demo.noop": {"concurrency": 1, "concurrency_key": "payload.k", "rate": "1000/10s"},
        "demo.sleep": {"rate": "1/60s", "rate_key": "payload.a"},
    }
    deck = make_deck(types=limits)
    deck.enqueue_many([{"type": "demo.noop", "payload": {"k": k}} for k in FLOW_KEYS] * 2)
    deck.enqueue_many([{"type": "demo.sleep", "payload": {"a": k}} for k in FLOW_KEYS] * 2)
    deck.enqueue_many([{"type": "demo.sleep", "payload": {}}] * 2)
    claimed = deck.store.claim("w", deck.clock(), limit=1000)
    keyed = {j.concurrency_key for j in claimed if j.type == "demo.noop"}
    rated = [j.rate_key for j in claimed if j.type == "demo.sleep"]
    assert len(keyed) == len(FLOW_KEYS) == len([j for j in claimed if j.type == "demo.noop"])
    assert len(rated) == len(set(rated)) == len(FLOW_KEYS) + 1
    with deck.store.read() as conn:
        starts = {
            (n, k): c
            for n, k, c in conn.execute(select(flow_starts.c.limit_name, flow_starts.c.key, flow_starts.c["count"]))
        }
    assert starts == {("type:demo.noop", ""): len(FLOW_KEYS), **{("type:demo.sleep", k): 1 for k in rated}}
    assert deck.store.claim("w", deck.clock(), limit=1000) == []


# -- defects ------------------------------------------------------------------------

LONG_AFTER_NFC = "\u0958" * 60
"""60 characters as given, 120 once NFC-composed (U+0958 is a composition
exclusion: NFC decomposes it), past the queue column's 100."""


@PG
def test_a_queue_longer_than_its_column_once_normalized_is_refused_by_name_in_a_bulk_request(make_deck, backend):
    assert len(unicodedata.normalize("NFC", LONG_AFTER_NFC)) == 120
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    response = client.post("/api/jobs/bulk", json={"jobs": [{"type": "demo.noop", "queue": LONG_AFTER_NFC}]})
    # Was 500 (value too long for type character varying(100)); before cf7d055,
    # 201 with the queue cut to 100 characters without a word. A refused field is a 422.
    assert response.status_code == 422, (response.status_code, response.get_data(as_text=True)[:300])
    assert response.get_json()["field"] == "jobs[0].queue"


@PG
def test_a_queue_longer_than_its_column_once_normalized_is_refused_by_name_in_enqueue_many(make_deck, backend):
    deck = make_deck()
    with pytest.raises(InvalidField) as refused:  # was sqlalchemy's DataError from the insert
        deck.enqueue_many([{"type": "demo.noop", "queue": LONG_AFTER_NFC}, {"type": "demo.noop"}])
    assert "queue" in str(refused.value)


@PG
def test_a_queue_longer_than_its_column_once_normalized_is_refused_by_name_in_one_enqueue(make_deck, backend):
    """The same gap in intake, on the single enqueue (a 500 before cf7d055 too)."""
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    response = client.post("/api/jobs", json={"type": "demo.noop", "queue": LONG_AFTER_NFC})
    assert response.status_code == 422, (response.status_code, response.get_data(as_text=True)[:300])
    assert response.get_json()["field"] == "queue"


@pytest.mark.parametrize("bad", [2.7, "2.5", True, "urgent", 10**9])
def test_a_handler_default_priority_that_is_not_one_is_refused_when_registered(registry, bad):
    """A float went to the store as it was: the single insert's cast rounded 2.7 to 3,
    the bulk insert's literal (``int_array``) cut it to 2. ``Registry.handler`` now
    checks ``priority`` as an enqueue's is checked, and names the handler."""
    with pytest.raises(ValueError, match=r"t\.bad_priority: priority"):
        registry.handler("t.bad_priority", priority=bad)(lambda ctx: None)
    assert "t.bad_priority" not in registry


@PG
def test_a_handler_default_priority_is_the_same_one_at_a_time_and_in_bulk(make_deck, registry, backend):
    """An integer or a label, stored alike by the single enqueue and both bulk paths."""
    registry.handler("t.int_priority", priority=7)(lambda ctx: None)
    registry.handler("t.label_priority", priority="high")(lambda ctx: None)  # type: ignore[arg-type]
    deck = make_deck()
    for kind in ("t.int_priority", "t.label_priority"):
        one = deck.enqueue(kind).job.id
        [plain] = deck.enqueue_many([{"type": kind}])
        [keyed] = deck.enqueue_many([{"type": kind, "idempotency_key": kind}])
        got = [deck.store.get(i).priority for i in (one, plain, keyed)]
        assert got[0] == got[1] == got[2] == registry.get(kind).priority, f"{kind}: one, plain bulk, keyed bulk: {got}"
