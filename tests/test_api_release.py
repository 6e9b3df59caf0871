"""The HTTP worker's release (``POST /api/jobs/{job_id}/release``): a claimed
job given back at shutdown goes to pending at once with no retry counted,
fenced by job, attempt and worker like complete and fail, on SQLite and
PostgreSQL; each answer checked against the OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest
from jobdeck.deck import Jobdeck

from tests.openapi_check import check

pytestmark = pytest.mark.backends

JOBS = "/api/jobs"
PATH = "/api/jobs/{job_id}/release"


def post(client: Any, path: str, body: Any) -> Any:
    return client.post(path, json=body)


def _claimed(client: Any, worker: str = "ext") -> dict[str, Any]:
    job = post(client, JOBS, {"type": "demo.noop", "max_retries": 2}).get_json()
    claimed = post(client, "/api/jobs/claim", {"worker_id": worker}).get_json()
    assert claimed["id"] == job["id"] and claimed["status"] == "running"
    return claimed


def test_release_returns_the_job_to_pending_and_the_next_claim_gets_the_next_attempt(client, deck: Jobdeck) -> None:
    job = _claimed(client)
    assert job["attempt"] == 1
    released = post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "ext", "attempt": 1})
    body = check(released, PATH, "post")
    assert released.status_code == 200
    assert body["status"] == "pending" and body["retry_count"] == 0 and body["worker_id"] is None
    assert body["available_at"] <= body["updated_at"]  # due at once, not snoozed
    shown = client.get(f"{JOBS}/{job['id']}").get_json()
    assert [(a["attempt"], a["outcome"], a["worker_id"]) for a in shown["attempts"]] == [(1, "interrupted", "ext")]
    assert shown["attempts"][0]["snooze_seconds"] is None

    again = post(client, "/api/jobs/claim", {"worker_id": "ext2"}).get_json()
    assert again["id"] == job["id"] and again["attempt"] == 2 and again["retry_count"] == 0
    # The released attempt's late calls are refused; the new one completes.
    late = post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "ext", "attempt": 1})
    assert late.status_code == 409 and "held by worker 'ext2'" in check(late, PATH, "post")["error"]
    done = post(client, f"{JOBS}/{job['id']}/complete", {"worker_id": "ext2"})
    assert done.status_code == 200 and done.get_json()["status"] == "completed"


def test_a_stale_attempt_of_the_same_worker_is_refused(client, deck: Jobdeck) -> None:
    job = _claimed(client)
    assert post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "ext", "attempt": 1}).status_code == 200
    again = post(client, "/api/jobs/claim", {"worker_id": "ext"}).get_json()
    assert again["attempt"] == 2
    stale = post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "ext", "attempt": 1})
    assert stale.status_code == 409
    assert check(stale, PATH, "post")["error"] == f"job {job['id']} is on attempt 2; attempt 1 is over"
    assert deck.store.get(job["id"]).status.value == "running"
    # A release after the job finished is refused as a late complete is.
    assert post(client, f"{JOBS}/{job['id']}/complete", {"worker_id": "ext"}).status_code == 200
    over = post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "ext", "attempt": 2})
    assert over.status_code == 409
    assert check(over, PATH, "post")["error"].startswith(f"job {job['id']} is completed; only running jobs")


def test_another_workers_claim_is_refused(client, deck: Jobdeck) -> None:
    job = _claimed(client, worker="owner")
    other = post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "thief", "attempt": 1})
    assert other.status_code == 409 and "held by worker 'owner'" in check(other, PATH, "post")["error"]
    kept = deck.store.get(job["id"])
    assert kept.status.value == "running" and kept.worker_id == "owner"


def test_an_unknown_job_is_404(client) -> None:
    missing = post(client, f"{JOBS}/999/release", {"worker_id": "ext", "attempt": 1})
    assert missing.status_code == 404 and check(missing, PATH, "post")["error"] == "job 999 does not exist"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"attempt": 1}, "worker_id"),
        ({"worker_id": "", "attempt": 1}, "worker_id"),
        ({"worker_id": "a\x00b", "attempt": 1}, "worker_id"),
        ({"worker_id": "w" * 100_000, "attempt": 1}, "worker_id"),
        ({"worker_id": 5, "attempt": 1}, "worker_id"),
        ({"worker_id": "ext"}, "attempt"),
        ({"worker_id": "ext", "attempt": 0}, "attempt"),
        ({"worker_id": "ext", "attempt": True}, "attempt"),
        ({"worker_id": "ext", "attempt": "1"}, "attempt"),
        ({"worker_id": "ext", "attempt": 2**31}, "attempt"),
        ({"worker_id": "ext", "attempt": 2**70}, "attempt"),
    ],
    ids=[
        "no-worker",
        "empty-worker",
        "nul-worker",
        "huge-worker",
        "int-worker",
        "no-attempt",
        "zero",
        "bool",
        "string",
        "past-int32",
        "past-int64",
    ],  # fmt: skip
)
def test_bad_bodies_are_422_naming_the_field_and_change_nothing(client, deck: Jobdeck, body, field) -> None:
    job = _claimed(client)
    refused = post(client, f"{JOBS}/{job['id']}/release", body)
    assert refused.status_code == 422 and check(refused, PATH, "post")["field"] == field
    assert deck.store.get(job["id"]).status.value == "running"


def test_a_malformed_body_is_400(client, deck: Jobdeck) -> None:
    job = _claimed(client)
    bad = client.post(
        f"{JOBS}/{job['id']}/release", data=b'{"worker_id": "ext", "attempt": 1', content_type="application/json"
    )
    assert bad.status_code == 400 and check(bad, PATH, "post")["error"] == "malformed JSON in request body"
    nul = client.post(
        f"{JOBS}/{job['id']}/release", data=b'{"worker_id": "e\\u0000", "attempt": 1}', content_type="application/json"
    )
    assert nul.status_code == 422 and nul.get_json()["field"] == "worker_id"
    assert deck.store.get(job["id"]).status.value == "running"


def test_a_job_cancelled_while_it_ran_ends_cancelled(client, deck: Jobdeck) -> None:
    job = _claimed(client)
    assert client.post(f"{JOBS}/{job['id']}/cancel").status_code == 202
    released = post(client, f"{JOBS}/{job['id']}/release", {"worker_id": "ext", "attempt": 1})
    assert released.status_code == 200 and check(released, PATH, "post")["status"] == "cancelled"
