"""Hostile queue, type and schedule names in ``GET /metrics``: quotes,
backslashes, newlines (escaped by the format), NUL and other control
characters (stored by a bypassing writer; shown as U+FFFD), and names that
look like exposition syntax. Every scrape parses with prometheus_client's
parser, each name stays its own series, and no line is forged."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobdeck import create_app
from jobdeck.store import durations
from jobdeck.store.models import stats_totals
from jobdeck.web.metrics import label
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert

pytestmark = pytest.mark.backends

HOSTILE = [
    'q"uote',
    "back\\slash",
    "new\nline",
    'x"} 1\njobdeck_workers_live 999\n# ',
    "tab\there",
    "emoji 🚀 and ünïcode",
    "} {",
    "#",
]


def _scrape(client) -> list:
    response = client.get("/metrics")
    assert response.status_code == 200
    body = response.get_data(as_text=True)
    return list(text_string_to_metric_families(body)), body


def test_hostile_queue_names_stay_their_own_series(make_deck, clock):
    """Names the enqueue now refuses (newlines, quotes...) may be in rows
    written before it did: written here straight into the store."""
    from jobdeck.store import NewJob

    deck = make_deck(clock=clock)
    for name in HOSTILE:
        deck.store.enqueue(NewJob(type="demo.noop", queue=name), clock())
    families, body = _scrape(create_app(deck=deck).test_client())
    jobs = next(f for f in families if f.name == "jobdeck_jobs")
    pending = {s.labels["queue"]: s.value for s in jobs.samples if s.labels["state"] == "pending"}
    for name in HOSTILE:
        assert pending[label(name)] == 1, name
    live = [s for f in families if f.name == "jobdeck_workers_live" for s in f.samples]
    assert [s.value for s in live] == [0]  # the forged "999" line is inside a label
    assert body.count("\njobdeck_workers_live ") == 1


def test_nul_and_control_characters_from_a_bypassing_writer(make_deck, clock, backend):
    deck = make_deck(clock=clock)
    names = ["nul\x00type", "bell\x07", "del\x7f", "esc\x1b[31m"]
    if backend == "postgres":
        names = names[1:]  # PostgreSQL text cannot hold NUL at all
    with deck.store.write() as conn:
        conn.execute(
            insert(stats_totals),
            [{"type": n, "completed": 1, "failed": 0, "dead": 0, **{c: 0 for c in durations.COLUMNS}} for n in names],
        )
    families, body = _scrape(create_app(deck=deck).test_client())
    assert "\x00" not in body and "\x07" not in body and "\x1b" not in body and "\x7f" not in body
    runs = next(f for f in families if f.name == "jobdeck_job_runs")
    types = {s.labels["type"] for s in runs.samples}
    assert types == {label(n) for n in names}
    assert all("\ufffd" in t for t in types)


def test_hostile_schedule_names(make_deck, clock):
    deck = make_deck(clock=clock)
    from jobdeck.store.schedules import schedule_states

    schedule_states(deck.store, ['night"ly\n# HELP x', "a\\b"], datetime(2026, 1, 1, tzinfo=UTC))
    families, _ = _scrape(create_app(deck=deck).test_client())
    assert any(f.name == "jobdeck_schedule_last_success_timestamp_seconds" for f in families)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=100))
def test_any_queue_name_the_api_accepts_parses_back(name, make_deck, clock):
    from jobdeck.core.errors import JobdeckError

    deck = make_deck(clock=clock)
    try:
        job, _ = deck.enqueue("demo.noop", queue=name)
    except JobdeckError:
        return  # refused before any SQL (NUL, control and invisible characters, ...)
    families, _ = _scrape(create_app(deck=deck).test_client())
    jobs = next(f for f in families if f.name == "jobdeck_jobs")
    assert any(
        s.labels["queue"] == label(job.queue) and s.value >= 1 for s in jobs.samples
    )  # the database is shared by the examples; the name as stored (NFC-normalized)


def test_hostile_authorization_headers_get_401_not_500(make_deck, clock):
    deck = make_deck(clock=clock, api_token="s3cret")
    client = create_app(deck=deck).test_client()
    for header in ["Bearer " + "x" * 100_000, "Bearer s3cret\x00", "Bearer \udcff".encode("utf-8", "surrogateescape").decode("latin-1"),
                   "Basic czNjcmV0", "Bearer"]:  # fmt: skip
        response = client.get("/metrics", headers={"Authorization": header})
        assert response.status_code == 401, header[:40]
