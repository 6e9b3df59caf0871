"""Every string that reaches a bounded column (``varchar(n)``), against
values one character too long, and values that grow when normalized.

PostgreSQL enforces the length (the statement fails: a 500, or a handler
that dies on a ``DataError``, unless something refused the value first);
SQLite ignores it and stores the value, which ``jobdeck db copy`` must then
move into PostgreSQL. So each bound has to be checked where the value comes
in, on the value as it will be stored (after NFC normalization, a token's
prefix, a key's prefix), with a refusal that names the field.

What holds (the regression tests at the end): workflow, step and batch
names and workflow keys at their limits, idempotency keys of 255
characters of any width, a named token's prefix counted in an HTTP
worker's id, an error's fingerprint cut to fit, unique keys from long
payload values hashed to fit, a manual run of a schedule with a 200
character name (its key is 249 characters), and claim filters longer than
the queue column.

What did not, each fixed with the test below that failed on it:

- Pausing a queue (``POST /api/queues/<name>/pause`` and the dashboard's
  Pause button) checks the name's length as given, then pauses its NFC
  form: 60 times U+0958 is 60 characters as given and 120 once composed.
  PostgreSQL: 500 (``value too long for type character varying(100)``);
  SQLite: a 120 character ``queue_state`` row. The gap ``check_name`` had
  for enqueues, in the one path that normalizes without it. Now a 422
  naming ``name`` (``Queues.set_paused`` checks the normalized length).
- ``[users.NAME]`` bounds no name: a user named with 201 characters is
  accepted at start-up; signing in writes ``dashboard_sessions.user_name``
  (200): a 500 on PostgreSQL; on SQLite the session, and every action's
  ``audit_log.actor`` (200), ``effects.resolved_by`` and
  ``runtime_schedules.updated_by``, hold the long name. Now a config
  error at start-up (``load_users``: at most 200 characters).
- ``ctx.effect(key, fn)`` checks nothing of ``key`` (the HTTP route checks
  255 characters and NUL): a 256 character key, or one holding NUL, is a
  ``DataError`` inside the handler on PostgreSQL, and on SQLite the effect
  runs and its key is stored. Now refused before ``fn`` runs, as the route
  refuses it (``effects.checked_key``).
- The demo's ``demo.charge-card`` and ``demo.send-email`` write the
  payload's ``order_id`` / ``user_id`` into 100 character columns
  unchecked. On PostgreSQL the charge fails inside ``ctx.effect``'s
  function, so its key stays ``started``: the retry finds the outcome
  "unknown" and sends the job to dead for a person to resolve. Now
  refused by name before the effect.
- ``jobdeck db copy`` meets such a value only when it writes it: it stops
  midway (``CopyError``: "writing queue_state rows <first key> to <last
  key> failed: value too long for type character varying(100)"), with the
  ten tables before it (jobs, effects, the audit log, ...) written and the
  rest not, naming the batch's keys but not the column, where its other
  checks refuse before a row is written (``CopyRefused``). Now refused
  so, naming the table, the column and the row (``refuse_overlong_values``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from urllib.parse import quote

import pytest
from jobdeck import create_app
from jobdeck.core.config import ConfigError
from jobdeck.core.errors import InvalidField, JobdeckError
from jobdeck.core.states import State
from jobdeck.demo import charge_card, send_email
from jobdeck.jobs.handlers import JobContext
from jobdeck.store.models import dashboard_sessions, demo_charges, demo_outbox, effects, jobs, metadata, queue_state
from jobdeck.store.transfer import CopyRefused, copied_tables, copy_database
from sqlalchemy import create_engine, func, inspect, select

from tests.dashboard_support import csrf_token, make_dash_app
from tests.helpers import password_hash

PG = pytest.mark.parametrize("backend", ["postgres"], indirect=True)
BOTH = pytest.mark.backends

LONG_AFTER_NFC = "\u0958" * 60
"""60 characters as given, 120 once NFC-composed (U+0958 is a composition
exclusion: NFC decomposes it), past the queue column's 100."""


def _longest(deck, column) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.coalesce(func.max(func.length(column)), 0))).scalar_one())


def _attempt(deck, job_id: int, worker: str = "w") -> JobContext:
    """Claim ``job_id`` and give its handler's context (as ``tests/test_effects.py`` does)."""
    (job,) = deck.store.claim(worker, deck.clock(), limit=1)
    assert job.id == job_id
    return JobContext(deck.store, job.id, job.attempt, worker, job.type, deck.clock)


def _answer(response) -> str:
    return f"{response.status_code} {response.get_data(as_text=True)[:300]}"


def test_the_long_name_grows_past_the_queue_column_once_normalized():
    assert len(LONG_AFTER_NFC) == 60
    assert len(unicodedata.normalize("NFC", LONG_AFTER_NFC)) == 120


# -- queue pauses -------------------------------------------------------------------


@BOTH
def test_the_api_refuses_to_pause_a_queue_longer_than_its_column_once_normalized(make_deck, backend):
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    response = client.post(f"/api/queues/{quote(LONG_AFTER_NFC)}/pause")
    # PostgreSQL: 500 (value too long for type character varying(100)); SQLite: 200, a 120 character row.
    assert response.status_code == 422, _answer(response)
    assert response.get_json()["field"] == "name"
    assert _longest(deck, queue_state.c.name) <= 100


@BOTH
def test_the_dashboard_refuses_to_pause_a_queue_longer_than_its_column_once_normalized(make_deck, backend):
    deck = make_deck()
    app = make_dash_app(deck)
    app.config["TESTING"] = False  # a failure is the answer a browser gets, not an exception here
    client = app.test_client()
    headers = {"HX-Request": "true", "X-CSRFToken": csrf_token(client)}
    response = client.post(f"/queues/{quote(LONG_AFTER_NFC)}/pause", headers=headers)
    assert 400 <= response.status_code < 500, _answer(response)
    assert _longest(deck, queue_state.c.name) <= 100


# -- dashboard user names -------------------------------------------------------------

LONG_USER = "u" * 201
"""One past ``dashboard_sessions.user_name`` and ``audit_log.actor`` (200)."""


def _users(name: str) -> dict[str, dict[str, str]]:
    return {name: {"password_hash": password_hash("pw-secret"), "role": "operator"}}


def test_a_user_name_longer_than_the_session_and_audit_columns_is_refused_by_the_config(make_deck):
    deck = make_deck(users=_users(LONG_USER))
    with pytest.raises(ConfigError, match=r"users\."):
        create_app(deck=deck)


@PG
def test_signing_in_never_answers_500_for_a_configured_user(make_deck, backend):
    """What the unbounded name does today on PostgreSQL: the login's session insert fails."""
    deck = make_deck(users=_users(LONG_USER))
    try:
        app = create_app(deck=deck)
    except ConfigError:
        return  # refused at start-up, as it should be: nobody can sign in under the name
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    response = client.post("/login", data={"username": LONG_USER, "password": "pw-secret", "csrf_token": token})
    assert response.status_code < 500, _answer(response)
    assert _longest(deck, dashboard_sessions.c.user_name) <= 200


# -- effects ----------------------------------------------------------------------------


@BOTH
@pytest.mark.parametrize("key", ["k" * 256, "\u00e9" * 256, "a\x00b"], ids=["256-ascii", "256-accented", "nul"])
def test_an_effect_key_the_ledger_cannot_hold_is_refused_before_the_effect_runs(make_deck, backend, key):
    """The HTTP route (``/api/jobs/<id>/effects/<key>/start``) refuses these
    with a 422; ``ctx.effect`` must refuse them too, before ``fn`` runs,
    whatever the database (PostgreSQL raised a ``DataError``; SQLite ran the
    effect and stored the key)."""
    deck = make_deck()
    job, _ = deck.enqueue("demo.noop")
    ctx = _attempt(deck, job.id)
    calls: list[int] = []
    with pytest.raises(Exception) as raised:
        ctx.effect(key, lambda: calls.append(1))
    assert isinstance(raised.value, ValueError | JobdeckError), repr(raised.value)[:300]
    assert calls == []
    assert deck.store.ledger.of_job(job.id) == []


# -- the demo's own tables -----------------------------------------------------------------


@BOTH
@pytest.mark.parametrize(
    ("job_type", "handler", "field", "table"),
    [
        ("demo.charge-card", charge_card, "order_id", demo_charges),
        ("demo.send-email", send_email, "user_id", demo_outbox),
    ],
    ids=["charge-card", "send-email"],
)
def test_the_demo_refuses_an_id_longer_than_its_column_by_name(make_deck, backend, job_type, handler, field, table):
    """On PostgreSQL the charge failed inside ``ctx.effect``'s function: the
    key stayed ``started``, and the retry sent the job to dead as an effect
    of unknown outcome."""
    deck = make_deck()
    payload = {field: "o" * 101, "amount_cents": 100}
    job, _ = deck.enqueue(job_type, payload)
    ctx = _attempt(deck, job.id)
    with pytest.raises(Exception) as raised:
        handler(payload, ctx)
    assert isinstance(raised.value, InvalidField), repr(raised.value)[:300]
    assert f"payload.{field}" in str(raised.value)
    assert deck.store.ledger.of_job(job.id) == []
    assert _longest(deck, table.c[field]) == 0


# -- db copy ------------------------------------------------------------------------------


@pytest.fixture
def pg_target(request):
    """An empty PostgreSQL schema of the test's own: the copy migrates it."""
    from tests.pgtest import fresh_schema

    yield from fresh_schema(request)


def _counts(url: str) -> dict[str, int]:
    """Rows in each copied table of the target (none where a refusal left it unmigrated)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            present = set(inspect(conn).get_table_names())
            return {
                t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in copied_tables()
                if t.name in present
            }
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_db_copy_refuses_a_value_longer_than_its_column_before_writing_a_row(make_deck, pg_target):
    """A SQLite deployment holding a queue name PostgreSQL cannot (the
    pause above made one: a 120 character ``queue_state.name``): the copy
    should say which table, column and row before it writes anything, not
    stop midway with the database's words for a batch of rows."""
    deck = make_deck()
    deck.enqueue("demo.noop")
    client = create_app(deck=deck).test_client()
    client.post(f"/api/queues/{quote(LONG_AFTER_NFC)}/pause")
    if _longest(deck, queue_state.c.name) <= 100:  # the pause is refused now: store one as an older version did
        with deck.store.write() as conn:
            conn.execute(queue_state.insert().values(name="q" * 120, paused=True, updated_at=deck.clock()))
    source = str(deck.store.engine.url)
    deck.store.engine.dispose()
    with pytest.raises(CopyRefused) as refused:
        copy_database(source, pg_target)
    assert "queue_state" in str(refused.value) and "name" in str(refused.value)
    assert sum(_counts(pg_target).values()) == 0, "the copy wrote rows before it stopped"


# -- what holds ---------------------------------------------------------------------------


@BOTH
def test_workflow_batch_and_key_bounds_hold_at_their_limits(make_deck, backend):
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    wide = "\U0001f600"  # one character, four bytes: the columns count characters
    body = {"name": wide * 200, "key": wide * 255, "jobs": [{"name": "s" * 200, "type": "demo.noop"}]}
    response = client.post("/api/workflows", json=body)
    assert response.status_code == 201, _answer(response)
    for field, value in (("name", wide * 201), ("key", wide * 256)):
        response = client.post("/api/workflows", json={**body, field: value})
        assert response.status_code == 422, _answer(response)
        assert response.get_json()["field"] == field
    step = {**body, "key": "other", "jobs": [{"name": "s" * 201, "type": "demo.noop"}]}
    response = client.post("/api/workflows", json=step)
    assert response.status_code == 422 and response.get_json()["field"] == "jobs[0].name", _answer(response)
    response = client.post("/api/batches", json={"name": "b" * 201})
    assert response.status_code == 422 and response.get_json()["field"] == "name", _answer(response)
    response = client.post("/api/jobs", json={"type": "demo.noop", "idempotency_key": "\u00e9" * 255})
    assert response.status_code == 201, _answer(response)
    response = client.post("/api/jobs", json={"type": "demo.noop", "idempotency_key": "\u00e9" * 256})
    assert response.status_code == 422 and response.get_json()["field"] == "idempotency_key", _answer(response)
    assert _longest(deck, jobs.c.step) == 200 and _longest(deck, jobs.c.idempotency_key) == 255


TOKEN_NAME = "t" * 64
SECRET = "bounded-columns-secret"


@BOTH
def test_a_named_tokens_prefix_counts_in_the_http_workers_id(make_deck, backend):
    tokens = {TOKEN_NAME: {"token_sha256": hashlib.sha256(SECRET.encode()).hexdigest(), "scopes": ["work"]}}
    deck = make_deck(api_tokens=tokens)
    job, _ = deck.enqueue("demo.noop")
    client = create_app(deck=deck).test_client()
    auth = {"Authorization": f"Bearer {SECRET}"}
    room = 200 - len(TOKEN_NAME) - 1
    response = client.post("/api/jobs/claim", json={"worker_id": "w" * (room + 1)}, headers=auth)
    assert response.status_code == 422 and response.get_json()["field"] == "worker_id", _answer(response)
    response = client.post("/api/jobs/claim", json={"worker_id": "w" * room}, headers=auth)
    assert response.status_code == 200 and response.get_json()["id"] == job.id, _answer(response)
    assert deck.store.get(job.id).worker_id == f"{TOKEN_NAME}/{'w' * room}"
    long_error = "E" * 5000 + ": " + "\u00e9" * 5000
    response = client.post(
        f"/api/jobs/{job.id}/fail", json={"worker_id": "w" * room, "error": long_error}, headers=auth
    )
    assert response.status_code == 200, _answer(response)
    assert 0 < _longest(deck, jobs.c.error_fingerprint) <= 255


@BOTH
def test_keys_made_from_long_payload_values_fit_their_columns(make_deck, backend):
    deck = make_deck(types={"demo.noop": {"unique": {"by": ["payload.v"]}}})
    made, _ = deck.enqueue("demo.noop", {"v": "\u00e9" * 5000})
    assert made.status is State.PENDING
    assert 0 < _longest(deck, jobs.c.unique_key) <= 255
    again, _ = deck.enqueue("demo.noop", {"v": "\u00e9" * 5000})
    assert again.id == made.id


@BOTH
def test_a_schedule_named_at_the_limit_runs_by_hand(make_deck, backend):
    """Its manual run's key is ``schedule:<name>:manual:<time>``: 249 characters for a 200 character name."""
    deck = make_deck()
    client = create_app(deck=deck).test_client()
    name = "s" * 200
    response = client.post("/api/schedules", json={"name": name, "cron": "0 2 * * *", "type": "demo.noop"})
    assert response.status_code == 201, _answer(response)
    response = client.post(f"/api/schedules/{name}/run")
    assert response.status_code == 201, _answer(response)
    assert len(response.get_json()["idempotency_key"]) <= 255


@BOTH
def test_a_claim_filter_longer_than_the_queue_column_finds_nothing(make_deck, backend):
    deck = make_deck()
    deck.enqueue("demo.noop")
    client = create_app(deck=deck).test_client()
    body = {"worker_id": "w", "queues": ["q" * 200], "types": ["t" * 200]}
    response = client.post("/api/jobs/claim", json=body)
    assert response.status_code == 200 and response.get_json() is None, _answer(response)


def test_every_bounded_column_is_one_this_file_knows():
    """A bounded column added to the models is a new way in to check here."""
    bounded = {f"{t.name}.{c.name}" for t in metadata.sorted_tables for c in t.c if getattr(c.type, "length", None)}
    assert len(bounded) == 52, sorted(bounded)
    assert {"jobs.queue", "queue_state.name", "dashboard_sessions.user_name", "effects.key"} <= bounded
    assert effects.c.key.type.length == 255 and queue_state.c.name.type.length == 100
