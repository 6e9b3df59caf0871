"""Names that cannot be confused (``jobdeck.core.validation.check_name``).

Seven queues whose text all read "billing" were once listed on /queues, and
pausing ``billing`` left the other six running; a decomposed "é" made a
second queue beside the composed one. Every way a queue or type name comes
in (the API, Python, the CLI, the config, schedules, handler registration,
an edit) now refuses the lookalikes with a 422 naming the character and its
position, and NFC-normalizes the rest. Rows written before keep working:
listed, filtered, paused and retried under their own spelling, and shown
isolated in ``<bdi>``. Idempotency keys stay exact bytes."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dashboard_support import make_dash_app, post
from jobdeck.cli import main
from jobdeck.core.config import ConfigError, load
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.store import JobFilter, NewJob

LOOKALIKES = {
    "bill\u200bing": "U+200B ZERO WIDTH SPACE at position 5",
    "\u200ebilling": "U+200E LEFT-TO-RIGHT MARK at position 1",
    "billing\u2060": "U+2060 WORD JOINER at position 8",
    "bil\u202eling": "U+202E RIGHT-TO-LEFT OVERRIDE at position 4",
    "\ufeffbilling": "U+FEFF ZERO WIDTH NO-BREAK SPACE at position 1",
    "bill\u00ading": "U+00AD SOFT HYPHEN at position 5",
    "bil\u034fling": "U+034F COMBINING GRAPHEME JOINER at position 4",
    "billing\ufe0f": "U+FE0F VARIATION SELECTOR-16 at position 8",
    "billing\u3164": "U+3164 HANGUL FILLER at position 8",
    "bill\u00a0ing": "U+00A0 NO-BREAK SPACE at position 5",
    "billing\x07": "U+0007 at position 8",
    "b\u0456lling": "U+0456 CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I at position 2: mixes Cyrillic and Latin",
    "\uff42illing": "U+FF42 FULLWIDTH LATIN SMALL LETTER B at position 1 is a compatibility form of 'b'",
    "billing ": "no leading or trailing spaces",
}
"""Names that read as "billing", and what the refusal says of each."""
COMPOSED = "facturación"
DECOMPOSED = unicodedata.normalize("NFD", COMPOSED)


def test_the_spellings_differ() -> None:
    assert DECOMPOSED != COMPOSED and unicodedata.normalize("NFC", DECOMPOSED) == COMPOSED
    assert all(name != "billing" for name in LOOKALIKES)


@pytest.mark.parametrize("name", list(LOOKALIKES))
def test_a_lookalike_queue_name_is_refused_by_the_api_naming_the_character(
    client: Any, deck: Jobdeck, name: str
) -> None:
    r = client.post("/api/jobs", json={"type": "demo.noop", "queue": name})
    assert r.status_code == 422, r.get_data(as_text=True)
    body = r.get_json()
    assert body["field"] == "queue" and LOOKALIKES[name] in body["error"], body
    assert deck.store.counts(deck.clock())["pending"] == 0


@pytest.mark.parametrize("name", list(LOOKALIKES))
def test_a_lookalike_is_refused_from_python_as_a_queue_and_as_a_type(deck: Jobdeck, name: str) -> None:
    with pytest.raises(InvalidField, match=re.escape(LOOKALIKES[name])):
        deck.enqueue("demo.noop", {}, queue=name)
    with pytest.raises(InvalidField, match=re.escape(LOOKALIKES[name])):
        deck.enqueue_many([{"type": "demo.noop", "payload": {}}, {"type": "demo.noop", "queue": name}])
    with pytest.raises(InvalidField, match=re.escape(LOOKALIKES[name])):
        deck.enqueue(name, {})  # as a type: refused for what it holds, before it is looked up
    with pytest.raises(InvalidField, match=re.escape(LOOKALIKES[name])):
        Registry().handler(name)(lambda payload, ctx: None)
    with pytest.raises(InvalidField, match=re.escape(LOOKALIKES[name])):
        Registry().handler("fine", queue=name)(lambda payload, ctx: None)


def test_a_type_lookalike_names_the_character(deck: Jobdeck) -> None:
    with pytest.raises(InvalidField, match=r"type: U\+200B ZERO WIDTH SPACE at position 5"):
        deck.enqueue("demo\u200b.noop", {})


def test_an_edit_refuses_a_lookalike_queue(client: Any, deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", {}, run_at="2030-01-01T00:00:00Z")
    r = client.patch(f"/api/jobs/{job.id}", json={"queue": "bill\u200bing"})
    assert r.status_code == 422 and "U+200B ZERO WIDTH SPACE at position 5" in r.get_json()["error"]
    assert deck.store.get(job.id).queue == "default"


def test_the_cli_refuses_a_lookalike(tmp_path: Path) -> None:
    env = {"JOBDECK_DATABASE_URL": f"sqlite:///{tmp_path / 'jobdeck.db'}", "JOBDECK_INSTANCE_PATH": str(tmp_path)}
    r = CliRunner().invoke(main, ["enqueue", "demo.noop", "--demo", "--create", "--queue", "bill\u200bing"], env=env)
    assert r.exit_code != 0 and "queue: U+200B ZERO WIDTH SPACE at position 5" in r.output, r.output
    ok = CliRunner().invoke(main, ["enqueue", "demo.noop", "--demo", "--queue", DECOMPOSED], env=env)
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["queue"] == COMPOSED


@pytest.mark.parametrize(
    "extra",
    [
        {"queues": {"bill\u200bing": {"concurrency": 2}}},
        {"types": {"demo.noop\u200b": {"concurrency": 2}}},
        {"external_types": ["billing\u202e.sync"]},
    ],
)
def test_the_config_refuses_a_lookalike(tmp_path: Path, extra: dict[str, Any]) -> None:
    values = {"database_url": f"sqlite:///{tmp_path / 'j.db'}", "instance_path": str(tmp_path), **extra}
    with pytest.raises(ConfigError, match=r"U\+20(0B|2E) "):
        load(path=None, env={}, overrides=values)


def test_a_schedule_refuses_a_lookalike_queue(make_config: Any, registry: Registry, client: Any) -> None:
    schedule = {"name": "nightly", "cron": "0 2 * * *", "type": "demo.noop", "queue": "bill\u200bing"}
    with pytest.raises(ConfigError, match="U\\+200B ZERO WIDTH SPACE at position 5"):
        Jobdeck(make_config(schedules=[schedule]), registry)
    r = client.post("/api/schedules", json=schedule)
    assert r.status_code == 422 and "U+200B ZERO WIDTH SPACE at position 5" in r.get_data(as_text=True)


def test_decomposed_input_lands_in_the_composed_queue(client: Any, deck: Jobdeck) -> None:
    made = [client.post("/api/jobs", json={"type": "demo.noop", "queue": q}) for q in (DECOMPOSED, COMPOSED)]
    assert [r.status_code for r in made] == [201, 201]
    assert {r.get_json()["queue"] for r in made} == {COMPOSED}
    job, _ = deck.enqueue("demo.noop", {}, queue=DECOMPOSED)
    assert job.queue == COMPOSED
    ids = deck.enqueue_many([{"type": "demo.noop", "payload": {}, "queue": DECOMPOSED}])
    assert deck.store.get(ids[0]).queue == COMPOSED
    queues = [q["name"] for q in client.get("/api/queues").get_json()["queues"]]
    assert queues.count(COMPOSED) == 1 and DECOMPOSED not in queues
    listed = client.get("/api/jobs", query_string={"queue": DECOMPOSED}).get_json()["jobs"]
    assert len(listed) == 4


def test_pausing_the_queue_pauses_what_was_enqueued_in_its_decomposed_form(client: Any, deck: Jobdeck) -> None:
    job, _ = deck.enqueue("demo.noop", {}, queue=DECOMPOSED)
    assert client.post(f"/api/queues/{COMPOSED}/pause").status_code == 200
    assert deck.store.claim("w1", deck.clock(), limit=10) == []
    assert client.post(f"/api/queues/{DECOMPOSED}/resume").status_code == 200
    assert [j.id for j in deck.store.claim("w1", deck.clock(), limit=10)] == [job.id]
    queues = [q["name"] for q in client.get("/api/queues").get_json()["queues"]]
    assert DECOMPOSED not in queues, "pausing by the decomposed spelling made a lookalike queue"


def _old_row(deck: Jobdeck, queue: str, job_type: str = "demo.noop") -> int:
    """A job stored before names were checked: straight into the store."""
    return deck.store.enqueue(NewJob(type=job_type, queue=queue), deck.clock()).job.id


def test_rows_from_before_still_show_and_can_be_paused_filtered_and_retried(deck: Jobdeck) -> None:
    dash = make_dash_app(deck).test_client()
    hidden, spelled = "bill\u200bing", DECOMPOSED
    old = {q: _old_row(deck, q) for q in (hidden, spelled)}
    page = dash.get("/jobs/pending").get_data(as_text=True)
    for q in old:
        assert f'<span class="queue"><bdi>{q}</bdi></span>' in page
    queues_page = dash.get("/queues").get_data(as_text=True)
    assert f"<bdi>{hidden}</bdi>" in queues_page

    assert post(dash, f"/queues/{hidden}/pause").status_code == 200
    assert post(dash, f"/queues/{spelled}/pause").status_code == 200
    assert deck.store.claim("w1", deck.clock(), limit=10) == [], "a paused old queue was claimed from"
    assert post(dash, f"/queues/{hidden}/resume").status_code == 200
    assert [j.id for j in deck.store.claim("w1", deck.clock(), limit=10)] == [old[hidden]]

    for q, job_id in old.items():
        listed = deck.store.list_jobs(JobFilter(queue=q), deck.clock())
        assert [j.id for j in listed] == [job_id]
    assert post(dash, f"/actions/jobs/{old[spelled]}/discard").status_code == 200
    assert deck.store.get(old[spelled]).status is State.DISCARDED
    assert post(dash, f"/actions/jobs/{old[spelled]}/retry").status_code == 200
    assert deck.store.get(old[spelled]).queue == spelled


def test_the_dashboard_isolates_names_and_errors(deck: Jobdeck) -> None:
    dash = make_dash_app(deck).test_client()
    from dashboard_support import make_dead

    make_dead(deck, payload={"x": 1})
    page = dash.get("/jobs/dead").get_data(as_text=True)
    assert "<bdi>demo.fail</bdi>" in page and '<span class="queue"><bdi>default</bdi></span>' in page
    assert "<bdi>boom</bdi>" in page


def test_idempotency_keys_stay_exact_bytes(deck: Jobdeck) -> None:
    first, created_first = deck.enqueue("demo.noop", {}, idempotency_key=f"order-{COMPOSED}")
    second, created_second = deck.enqueue("demo.noop", {}, idempotency_key=f"order-{DECOMPOSED}")
    assert created_first and created_second and first.id != second.id
    assert deck.store.get(second.id).idempotency_key == f"order-{DECOMPOSED}"
    keyed, created = deck.enqueue("demo.noop", {}, idempotency_key="order\u200b-7")
    assert created and keyed.idempotency_key == "order\u200b-7"
