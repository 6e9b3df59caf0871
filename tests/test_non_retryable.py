"""Errors that no retry can fix end the job in ``dead`` at its first attempt:
validation errors by default, and the exception classes a type lists as
``non_retryable`` (handler option or ``[types."T"]`` in the config). Real
pool threads, on both databases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from jobdeck.core.config import ConfigError, load
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import State
from jobdeck.core.validation import parse_int
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry

from tests.helpers import settle_failures

pytestmark = pytest.mark.backends


class GatewayRefused(LookupError):
    """A custom error whose base class (LookupError) a type lists."""


def _raising(exc: BaseException) -> Callable[[dict[str, Any], Any], None]:
    def handler(payload: dict[str, Any], ctx: Any) -> None:
        raise exc

    return handler


def _one_attempt(deck: Jobdeck, job_id: int) -> None:
    job = deck.store.get(job_id)
    assert job.retry_count == 0
    assert [a.outcome for a in deck.store.attempts_of(job_id)] == ["failed"]


def test_a_validation_error_is_not_retried(make_deck, registry: Registry) -> None:
    def parse(payload: dict[str, Any], ctx: Any) -> None:
        parse_int(payload["n"], "n", 0)

    registry.handler("t.parse")(parse)
    registry.handler("t.value")(_raising(ValueError("flaky upstream")))
    deck = make_deck(backoff_base=3600)
    bad, _ = deck.enqueue("t.parse", {"n": "twelve"}, max_retries=5)
    other, _ = deck.enqueue("t.value", max_retries=5)
    states = settle_failures(deck, bad.id, other.id)
    assert states == {bad.id: State.DEAD, other.id: State.FAILED}
    _one_attempt(deck, bad.id)
    assert "n:" in (deck.store.get(bad.id).error or "")


def test_the_handler_option_names_classes_and_their_bases(make_deck, registry: Registry) -> None:
    registry.handler("t.base", non_retryable=["LookupError"])(_raising(GatewayRefused("card refused")))
    registry.handler("t.dotted", non_retryable=[f"{__name__}.GatewayRefused"])(_raising(GatewayRefused("x")))
    registry.handler("t.other", non_retryable=["LookupError"])(_raising(ValueError("not listed")))
    deck = make_deck(backoff_base=3600)
    ids = [deck.enqueue(t, max_retries=3)[0].id for t in ("t.base", "t.dotted", "t.other")]
    assert list(settle_failures(deck, *ids).values()) == [State.DEAD, State.DEAD, State.FAILED]
    _one_attempt(deck, ids[0])
    _one_attempt(deck, ids[1])


def test_the_config_lists_classes_per_type(make_deck, registry: Registry) -> None:
    registry.handler("t.listed")(_raising(ValueError("bad row")))
    registry.handler("t.unlisted")(_raising(ValueError("bad row")))
    registry.handler("t.both", non_retryable=["KeyError"])(_raising(TimeoutError("slow")))
    types = {"t.listed": {"non_retryable": ["ValueError"]}, "t.both": {"non_retryable": ["TimeoutError"]}}
    deck = make_deck(backoff_base=3600, types=types)
    ids = [deck.enqueue(t, max_retries=3)[0].id for t in ("t.listed", "t.unlisted", "t.both")]
    assert list(settle_failures(deck, *ids).values()) == [State.DEAD, State.FAILED, State.DEAD]
    _one_attempt(deck, ids[0])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ValueError", "expected a list of exception class names"),
        ([1], "1 is not an exception class name"),
        (["Value Error"], "'Value Error' is not an exception class name"),
        (["Bad\x00Name"], "is not an exception class name"),
        (["app..X"], "is not an exception class name"),
        (["9Lives"], "is not an exception class name"),
    ],
)
def test_the_config_refuses_what_is_no_class_name(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=r"types\.t\.non_retryable: ") as raised:
        load(path=None, env={}, overrides={"types": {"t": {"non_retryable": value}}})
    assert message in str(raised.value)


def test_the_handler_option_refuses_one_string() -> None:
    with pytest.raises(ValueError, match="not one string"):
        Registry().handler("t", non_retryable="ValueError")


def test_an_invalid_field_from_anywhere_is_never_retried(registry: Registry) -> None:
    registry.handler("t.listed", non_retryable=["OSError"])(_raising(ValueError()))
    spec = registry.get("t.listed")
    assert spec is not None
    assert not spec.retries(InvalidField("n", "bad"))
    assert not spec.retries(FileNotFoundError())
    assert not spec.retries(KeyError(), also=("LookupError",))
    assert spec.retries(ValueError())
