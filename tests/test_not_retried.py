"""An artifact the store refuses (too large, a bad name) can never be kept by
a retry, so the attempt is not retried; and a job sent to dead by an error
no retry can fix says so in its error, so a person does not wonder why its
retries were never used. Real pool threads, on both databases."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck.core.errors import DeadLetter
from jobdeck.core.states import State
from jobdeck.jobs.handlers import Registry

from tests.dashboard_support import make_dash_app
from tests.helpers import settle_failures

pytestmark = pytest.mark.backends


def _keeps(name: str, data: str) -> Any:
    def handler(payload: dict[str, Any], ctx: Any) -> None:
        ctx.artifact(name, data)

    return handler


def _raises(exc: BaseException) -> Any:
    def handler(payload: dict[str, Any], ctx: Any) -> None:
        raise exc

    return handler


def test_a_refused_artifact_is_not_retried(make_deck, registry: Registry) -> None:
    registry.handler("t.huge")(_keeps("report.csv", "x" * 100))
    registry.handler("t.badname")(_keeps("../report.csv", "x"))
    registry.handler("t.flaky")(_raises(OSError("disk busy")))
    deck = make_deck(backoff_base=3600, artifacts={"max_bytes": 10})
    ids = [deck.enqueue(t, max_retries=3)[0].id for t in ("t.huge", "t.badname", "t.flaky")]
    assert list(settle_failures(deck, *ids).values()) == [State.DEAD, State.DEAD, State.FAILED]
    for job_id in ids[:2]:
        assert deck.store.get(job_id).retry_count == 0
        assert [a.outcome for a in deck.store.attempts_of(job_id)] == ["failed"]
    assert (deck.store.get(ids[0]).error or "").startswith("ArtifactTooLarge: artifact 'report.csv' is 100 B")


def test_a_non_retryable_error_says_why_it_was_not_retried(make_deck, registry: Registry) -> None:
    registry.handler("t.listed", non_retryable=["LookupError"])(_raises(KeyError("user_42")))
    registry.handler("t.artifact")(_keeps("a\x00b", "x"))
    registry.handler("t.plain")(_raises(KeyError("user_42")))
    deck = make_deck(backoff_base=3600)
    listed, _ = deck.enqueue("t.listed", max_retries=3)
    artifact, _ = deck.enqueue("t.artifact", max_retries=1)
    plain, _ = deck.enqueue("t.plain", max_retries=3)
    settle_failures(deck, listed.id, artifact.id, plain.id)
    for job_id, cls in ((listed.id, "KeyError"), (artifact.id, "InvalidArtifact")):
        error = deck.store.get(job_id).error or ""
        assert error.split("\n")[-1] == f"(not retried: {cls} is non-retryable)"
        assert error.startswith(f"{cls}: ")
        assert deck.store.attempts_of(job_id)[0].error == error
    assert deck.store.get(plain.id).error == "KeyError: 'user_42'"
    page = make_dash_app(deck).test_client().get(f"/jobs/{listed.id}").get_data(as_text=True)
    assert "(not retried: KeyError is non-retryable)" in page  # the attempt's error, on the timeline
    assert '<dd class="attempts">1 of 4, not retried: non-retryable KeyError</dd>' in page  # not "1/4"


def test_no_note_when_no_retry_was_left_or_the_handler_chose_dead(make_deck, registry: Registry) -> None:
    registry.handler("t.last", non_retryable=["ValueError"])(_raises(ValueError("bad row")))
    registry.handler("t.chosen")(_raises(DeadLetter("refund window closed")))
    deck = make_deck(backoff_base=3600)
    last, _ = deck.enqueue("t.last", max_retries=0)
    chosen, _ = deck.enqueue("t.chosen", max_retries=3)
    assert settle_failures(deck, last.id, chosen.id) == {last.id: State.DEAD, chosen.id: State.DEAD}
    assert deck.store.get(last.id).error == "ValueError: bad row"
    assert deck.store.get(chosen.id).error == "DeadLetter: refund window closed"
