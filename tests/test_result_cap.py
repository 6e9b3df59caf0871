"""Results are capped (``max_result_bytes``, issue 29): a result lives in the
job's row and is sent whole with the job, so a handler returning more fails
its attempt (not retried, pointing at ``ctx.artifact``) and an HTTP worker's
completion carrying more is refused with 413. Real pool threads and the real
API, on both databases."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core.config import ConfigError, load
from jobdeck.core.states import State
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for

from tests.conftest import all_in, wait_for

pytestmark = pytest.mark.backends

CAP = 1000


def _settled(deck: Any, *job_ids: int) -> dict[int, State]:
    pool = pool_for(deck, 2)
    pool.start()
    try:
        done = (State.COMPLETED, State.DEAD)
        wait_for(lambda: all_in(deck, job_ids, done), message="every job to settle")
    finally:
        pool.stop(grace=5)
    return {i: deck.store.get(i).status for i in job_ids}


def test_a_result_over_the_cap_fails_its_attempt_without_a_retry(make_deck: Any, registry: Registry) -> None:
    registry.handler("t.big")(lambda payload, ctx: "€" * (CAP // 3))  # 333 characters, 1,001 bytes as JSON
    registry.handler("t.fits")(lambda payload, ctx: {"rows": "x" * (CAP - 20)})
    registry.handler("t.many")(lambda payload, ctx: ["x"] * 1000)  # 4,001 bytes once written
    deck = make_deck(max_result_bytes=CAP, backoff_base=3600)
    big, fits, huge = (deck.enqueue(t, max_retries=3)[0].id for t in ("t.big", "t.fits", "t.many"))

    assert _settled(deck, big, fits, huge) == {big: State.DEAD, fits: State.COMPLETED, huge: State.DEAD}
    assert deck.store.get(fits).result == {"rows": "x" * (CAP - 20)}
    for job_id, size in ((big, 1001), (huge, 4001)):
        job = deck.store.get(job_id)
        assert job.result is None and job.retry_count == 0
        assert [a.outcome for a in deck.store.attempts_of(job_id)] == ["failed"]
        assert (job.error or "").startswith(
            f"ResultTooLarge: the result is {size:,} bytes as JSON, over max_result_bytes ({CAP:,})"
        ), job.error
        assert "ctx.artifact" in (job.error or "")


def test_an_http_workers_completion_over_the_cap_is_refused_with_413(make_deck: Any) -> None:
    deck = make_deck(max_result_bytes=CAP, external_types=["ext.report"])
    client = create_app(deck=deck).test_client()
    job_id = client.post("/api/jobs", json={"type": "ext.report"}).get_json()["id"]
    claimed = client.post("/api/jobs/claim", json={"worker_id": "w1", "types": ["ext.report"]}).get_json()
    assert claimed["id"] == job_id

    refused = client.post(f"/api/jobs/{job_id}/complete", json={"worker_id": "w1", "result": "x" * CAP})
    assert refused.status_code == 413, refused.get_data(as_text=True)
    assert "max_result_bytes" in refused.get_json()["error"]
    assert deck.store.get(job_id).status is State.RUNNING, "a refused completion changed the job"

    done = client.post(f"/api/jobs/{job_id}/complete", json={"worker_id": "w1", "result": "x" * (CAP - 2)})
    assert done.status_code == 200, done.get_data(as_text=True)
    assert deck.store.get(job_id).result == "x" * (CAP - 2)


def test_max_result_bytes_is_a_validated_setting() -> None:
    assert load(path=None, env={"JOBDECK_MAX_RESULT_BYTES": "2048"}).max_result_bytes == 2048
    assert load(path=None, env={}).max_result_bytes == 1024 * 1024
    with pytest.raises(ConfigError, match="max_result_bytes"):
        load(path=None, env={}, overrides={"max_result_bytes": 0})
