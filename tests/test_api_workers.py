"""``GET /api/workers``: what the Workers page shows, as JSON
(``jobdeck.web.api.workers``): each pool's executors with their capacity and
busy slots, the async loop's lag, the process pool's children and the
children replaced by cause; bounded, documented fields only, read scope."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for
from jobdeck.store.timekeeping import record_executors
from jobdeck.web.api.workers import MAX_CAUSES, MAX_CHILDREN
from jobdeck.web.factory import create_app

from tests import process_handlers
from tests.conftest import wait_for
from tests.openapi_check import check
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.backends


async def waits_briefly(payload: dict[str, Any], ctx: Any) -> str:
    await asyncio.sleep(0.01)
    return "done"


def _mine(client: Any, worker_id: str) -> dict[str, Any] | None:
    body = check(client.get("/api/workers"), "/api/workers", "get")
    return next((w for w in body["workers"] if w["id"] == worker_id), None)


@pytest.mark.slow  # starts child interpreters
def test_each_pool_shows_its_executors_children_and_loop_lag(make_config, tmp_path: Path) -> None:
    registry = Registry()
    process_handlers.register(registry, **{"proc.sleeps": {"timeout": 30}, "proc.segfaults": {}})
    registry.handler("async.brief")(waits_briefly)
    deck = Jobdeck(make_config(process_workers=2), registry)
    deck.init_db()
    client = create_app(deck=deck, init_db=False).test_client()
    crash = deck.enqueue("proc.segfaults", {}).job
    quick = deck.enqueue("async.brief", {}).job
    pool = pool_for(deck, 3)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(crash.id).status is State.DEAD, timeout=30, message="the crash is failed")
        wait_for(lambda: deck.store.get(quick.id).status is State.COMPLETED, timeout=30, message="async job ran")
        job = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "pid")}).job
        pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), timeout=30))

        def shown() -> dict[str, Any] | None:
            mine = _mine(client, pool.worker_id)
            held = (mine or {}).get("executors") or {}
            process = held.get("process")
            return mine if process and process["busy"] == 1 and process["restarts"] and "async" in held else None

        mine = wait_for(shown, timeout=30, message="the API shows the pool's busy child and its loop")
        executors = mine["executors"]
        assert set(executors) == {"thread", "async", "process"}
        assert executors["thread"]["capacity"] == 3
        assert executors["async"]["busy"] == 0 and executors["async"]["lag"] is not None
        assert executors["async"]["lag"] < 1.0, "an idle loop keeps up with its tick"
        process = executors["process"]
        assert process["capacity"] == 2 and process["restarts"] == {"crash": 1}
        assert {"pid": pid, "job_id": job.id} in [{k: c[k] for k in ("pid", "job_id")} for c in process["children"]]
        assert all(c["jobs_run"] >= 0 and c["rss_mib"] >= 0 for c in process["children"])
        assert mine["running"] == 1 and mine["unhealthy"] is None
        deck.cancel(job.id, "test")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=15)
    finally:
        pool.stop(2.0)
        deck.store.engine.dispose()
    body = check(client.get("/api/workers"), "/api/workers", "get")
    assert pool.worker_id in [w["id"] for w in body["stopped"]], "a stopped pool is listed as stopped"
    assert pool.worker_id not in [w["id"] for w in body["workers"]]


HOSTILE = {
    "thread": {"capacity": "<script>", "busy": -3, "extra": "<b>x</b>"},
    "async": {"capacity": 4, "busy": True, "lag": "Infinity"},
    "process": {
        "capacity": 2,
        "busy": 1,
        "children": [{"pid": 7, "job_id": "<img>", "rss_mib": 1.5, "jobs_run": 2, "secret": "x"}, "junk"]
        + [{"pid": n, "job_id": None, "rss_mib": 1, "jobs_run": 0} for n in range(MAX_CHILDREN + 50)],
        "restarts": {f"cause-{n}-" + "x" * 100: 1 for n in range(MAX_CAUSES + 30)},
    },
    "<script>alert(1)</script>": {"capacity": 1, "busy": 1},
}


def test_a_damaged_row_answers_only_documented_fields_bounded(deck: Jobdeck, client: Any) -> None:
    """The row is another process's writing: whatever it holds, the answer
    has the documented fields of their types, cut to their bounds."""
    # A row, not a running pool: a pool's monitor would write its own summary over it.
    deck.store.register_worker("pool-hostile", "host", 1234, 2, deck.clock())
    record_executors(deck.store, "pool-hostile", HOSTILE)
    answer = client.get("/api/workers")
    assert answer.mimetype == "application/json"
    mine = next(w for w in check(answer, "/api/workers", "get")["workers"] if w["id"] == "pool-hostile")
    held = mine["executors"]
    assert set(held) == {"thread", "async", "process"}
    assert held["thread"] == {"capacity": 0, "busy": 0}
    assert held["async"] == {"capacity": 4, "busy": 0, "lag": None}
    children = held["process"]["children"]
    assert len(children) == MAX_CHILDREN
    assert children[0] == {"pid": 7, "job_id": None, "rss_mib": 0, "jobs_run": 2}
    assert len(held["process"]["restarts"]) == MAX_CAUSES
    assert all(len(cause) <= 40 for cause in held["process"]["restarts"])
    assert "<script>" not in answer.get_data(as_text=True)


def test_a_read_token_may_list_workers_and_an_enqueue_token_may_not(make_deck: Any) -> None:
    secrets = {"reader": "tok-reader-0123456789", "producer": "tok-producer-0123456789"}
    scopes = {"reader": ["read"], "producer": ["enqueue"]}
    tokens = {
        name: {"token_sha256": hashlib.sha256(secret.encode()).hexdigest(), "scopes": scopes[name]}
        for name, secret in secrets.items()
    }
    client = create_app(deck=make_deck(api_tokens=tokens)).test_client()
    assert client.get("/api/workers").status_code == 401
    refused = client.get("/api/workers", headers={"Authorization": f"Bearer {secrets['producer']}"})
    assert refused.status_code == 403 and "read" in refused.get_json()["error"]
    allowed = client.get("/api/workers", headers={"Authorization": f"Bearer {secrets['reader']}"})
    assert check(allowed, "/api/workers", "get") == {"workers": [], "gone": [], "stopped": []}


def test_metrics_carry_each_pool_s_loop_lag(deck: Jobdeck, client: Any) -> None:
    rows = {"pool-late": {"async": {"capacity": 4, "busy": 1, "lag": 2.5}}, "pool-plain": {"thread": {}}}
    for worker_id, held in rows.items():  # rows, not running pools: a pool's monitor writes its own
        deck.store.register_worker(worker_id, "host", 1234, 2, deck.clock())
        record_executors(deck.store, worker_id, held)
    samples = scrape(client)
    assert value(samples, "jobdeck_async_loop_lag_seconds", worker="pool-late") == 2.5
    assert ("jobdeck_async_loop_lag_seconds", (("worker", "pool-plain"),)) not in samples, "no loop, no lag"
