"""A handler's 50 MB result is not stored, nor sent with its job (issue 29).

Before the cap the result was stored whole and sent whole: to the API and
into the job's page. With the default ``max_result_bytes`` (1 MiB) the
attempt fails instead, the job goes to dead with an error that points at
``ctx.artifact``, and the job's API answer and page stay small."""

from __future__ import annotations

from typing import Any

from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for
from sqlalchemy import text

from tests.conftest import wait_for
from tests.dashboard_support import make_dash_app

FIFTY_MB = 50 * 1024 * 1024


def test_a_fifty_megabyte_result_is_refused_and_never_sent(make_deck: Any, registry: Registry) -> None:
    registry.handler("t.export")(lambda payload, ctx: "x" * FIFTY_MB)
    deck = make_deck()
    job_id = deck.enqueue("t.export", max_retries=3)[0].id
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job_id).status is State.DEAD, 60, message="the job to be refused")
    finally:
        pool.stop(grace=5)

    with deck.store.read() as conn:
        stored = conn.execute(text("SELECT length(result) FROM jobs WHERE id = :id"), {"id": job_id}).scalar()
    assert stored is None, f"{stored} characters of result were stored"
    api = create_app(deck=deck).test_client().get(f"/api/jobs/{job_id}")
    page = make_dash_app(deck).test_client().get(f"/jobs/{job_id}")
    print(f"\n50 MB result: job dead after 1 attempt; API answer {len(api.data):,} B, job page {len(page.data):,} B")
    assert api.status_code == 200 and len(api.data) < 100_000
    assert page.status_code == 200 and len(page.data) < 200_000
    error = api.get_json()["error"]
    assert error.startswith("ResultTooLarge: the result is 52,428,802 bytes as JSON") and "ctx.artifact" in error
    assert [a["outcome"] for a in api.get_json()["attempts"]] == ["failed"]
