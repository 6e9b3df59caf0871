"""A pool that cannot hand out a working connection is an outage, not a
bug: while a burst of backend terminations lasts, every connection the pool
tries fails its ping at checkout, and SQLAlchemy gives up with a plain
InvalidRequestError ("This connection is closed"). Under a CPU hog the
backend-termination test (tests/adversarial/test_db_faults.py) saw it
answered 500 in three runs of four."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.store import engine as engine_module
from jobdeck.store.faults import UNAVAILABLE, outage_of
from sqlalchemy import exc as sa_exc


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_pool_whose_every_connection_fails_its_ping_answers_503_and_recovers(deck: Jobdeck, monkeypatch: Any) -> None:
    client = create_app(deck=deck).test_client()
    assert client.post("/api/jobs", json={"type": "demo.noop", "payload": {}}).status_code == 201

    def refuse(_dialect: Any, _dbapi_conn: Any) -> None:
        raise OSError("terminating connection due to administrator command")

    monkeypatch.setattr(engine_module, "needs_ping", lambda *_args: True)
    monkeypatch.setattr(type(deck.store.engine.dialect), "do_ping", refuse)  # every engine: requests have their own
    answer = client.post("/api/jobs", json={"type": "demo.noop", "payload": {}})
    assert answer.status_code == 503, answer.get_data(as_text=True)
    assert answer.get_json() == {"error": UNAVAILABLE.message, "cause": "unavailable"}
    assert answer.headers["Retry-After"] == str(UNAVAILABLE.retry_after)

    monkeypatch.undo()
    assert client.post("/api/jobs", json={"type": "demo.noop", "payload": {}}).status_code == 201


def test_a_closed_connection_used_again_is_still_a_bug() -> None:
    assert outage_of(sa_exc.InvalidRequestError("This connection is closed")) is UNAVAILABLE
    assert outage_of(sa_exc.ResourceClosedError("This Connection is closed")) is None
    assert outage_of(sa_exc.InvalidRequestError("some other misuse")) is None
