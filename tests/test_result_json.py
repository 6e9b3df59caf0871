"""A handler's result is JSON or refused: a ``datetime``, a ``set``, an
object or NaN once completed the job with its repr stored as the result, a
string nobody asked for. Now the attempt fails, not retried, naming the type
and where it is. Real pool threads and the pool's event loop, on both
databases."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from jobdeck.core.errors import ResultNotJSON
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext, Registry
from jobdeck.runtime import pool_for
from jobdeck.worker.results import storable_result

from tests.conftest import all_in, wait_for

pytestmark = pytest.mark.backends

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Receipt:
    def __repr__(self) -> str:
        return "<Receipt ch_1>"


REFUSED = {
    "t.when": ({"charge": "ch_1", "when": WHEN}, 'result["when"]: datetime is not JSON'),
    "t.set": ({"tags": ["a", {"b": {1, 2}}]}, 'result["tags"][1]["b"]: set is not JSON'),
    "t.object": (Receipt(), "result: Receipt is not JSON"),
    "t.nan": ({"ratio": math.nan}, 'result["ratio"]: float nan is not JSON'),
    "t.inf": ([1.5, math.inf], "result[1]: float inf is not JSON"),
    "t.clash": (
        {"n": {1: "a", "1": "b"}},
        """result["n"]: the keys 1 and '1' are both "1" in JSON, one would be lost""",
    ),
}


def _settle(deck: Jobdeck, job_ids: list[int]) -> None:
    pool = pool_for(deck, 2)
    pool.start()
    try:
        ended = (State.COMPLETED, State.DEAD)
        wait_for(lambda: all_in(deck, job_ids, ended), message="every job to end")
    finally:
        pool.stop(grace=5)


def _register(registry: Registry, name: str, value: object, is_async: bool) -> None:
    if is_async:

        async def returns(payload: dict[str, Any], ctx: JobContext) -> object:
            await asyncio.sleep(0)
            return value

        registry.handler(name)(returns)
    else:
        registry.handler(name)(lambda payload, ctx: value)


@pytest.mark.parametrize("is_async", [False, True], ids=["thread", "async"])
def test_a_result_that_is_not_json_fails_its_attempt_without_a_retry(
    live_deck: Jobdeck, registry: Registry, is_async: bool
) -> None:
    for name, (value, _) in REFUSED.items():
        _register(registry, name, value, is_async)
    _register(registry, "t.fine", {"when": WHEN.isoformat(), "pair": (1, 2), 7: None}, is_async)
    ids = {name: live_deck.enqueue(name, max_retries=3).job.id for name in [*REFUSED, "t.fine"]}

    _settle(live_deck, list(ids.values()))

    fine = live_deck.store.get(ids["t.fine"])
    assert fine.status is State.COMPLETED
    assert fine.result == {"when": WHEN.isoformat(), "pair": [1, 2], "7": None}, (
        "tuples and number keys as json writes them"
    )
    for name, (_, message) in REFUSED.items():
        job = live_deck.store.get(ids[name])
        assert (job.status, job.retry_count, job.result) == (State.DEAD, 0, None), name
        assert (job.error or "").startswith(f"ResultNotJSON: {message} (a result is stored as JSON"), job.error
        (attempt,) = live_deck.store.attempts_of(job.id)
        assert attempt.outcome == "failed" and message in (attempt.error or "")


def test_the_first_offender_is_named_however_the_result_is_built() -> None:
    def refused(value: object) -> str:
        with pytest.raises(ResultNotJSON) as caught:
            storable_result(value, 10**6)
        return caught.value.path + ": " + str(caught.value).split(": ", 1)[1].split(" (a result")[0]

    assert refused({"a": 1, "b": [b"raw", WHEN]}) == 'result["b"][0]: bytes is not JSON'
    assert refused({("x", 1): 2}) == "result: the key ('x', 1) is a tuple; JSON object keys are strings"
    assert refused({"n": {"m": -math.inf}}) == 'result["n"]["m"]: float -inf is not JSON'
    loop: list[Any] = []
    loop.append(loop)
    assert refused(loop) == "result: holds itself (a circular reference) and is not JSON"
    deep: list[Any] = []
    for _ in range(100_000):  # past what the encoder's recursion can walk
        deep = [deep]
    assert refused(deep) == "result: is nested deeper than 500 levels and cannot be written as JSON"
    assert (
        refused([{True: 1, "true": 2}])
        == """result[0]: the keys True and 'true' are both "true" in JSON, one would be lost"""
    )
    assert refused({"a": {None: 1, "null": 2}}).startswith('result["a"]: the keys None and \'null\' are both "null"')
    assert refused({"a": {math.nan: 1}}) == 'result["a"]: the key nan is not JSON'
    assert refused({"a": [1, 10**5000]}) == 'result["a"][1]: an integer of more than 4300 digits is not JSON'
    mixed = {1: "a", "b": 2, None: 3, 2.5: {"c": True}}  # keys of mixed types, none written twice
    assert storable_result(mixed, 10**6) is mixed
    assert storable_result({"ok": [1, "two", None, True, 2.5]}, 10**6) == {"ok": [1, "two", None, True, 2.5]}
    assert storable_result(None, 1) is None
