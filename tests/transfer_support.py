"""A SQLite deployment worth moving, for the tests of ``jobdeck db copy``:
jobs in every state, made the way a deployment makes them (the API, a real
worker pool, an HTTP worker), with their attempts, logs, effects and
artifacts, a workflow done and one blocked, a fired batch, paused queues
and schedules, a signed-in session and the audit log. A table none of that
writes gets a row of its own (``fill_empty_tables``), so every table of the
schema holds rows to copy, a table added later included."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobdeck import create_app, deck_of
from jobdeck.core.config import Config, load
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.store.models import metadata
from sqlalchemy import Connection, Table, func, insert, select

from tests.conftest import wait_for
from tests.helpers import password_hash

TOKEN = "copy-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USER, PASSWORD = "olivia", "olivia-secret"
PASSWORD_HASH = password_hash(PASSWORD)
"""One hash for both sides: a session is bound to the hash it signed in with."""
HELD = "held"
"""The paused queue whose jobs stay pending."""


def config(url: str, instance: Path) -> Config:
    """The deployment's config; the same on both sides of the move."""
    return load(
        path=None,
        env={},
        overrides={
            "database_url": url,
            "instance_path": str(instance),
            "workers": 0,
            "poll_interval": 0.05,
            "secret_key": "copy-test-secret",
            "api_token": TOKEN,
            "demo": True,
            "users": {USER: {"password_hash": PASSWORD_HASH, "role": "operator"}},
            "types": {"demo.charge-card": {"rate": "1000/1s"}},
            "dashboard": {"counts_cache_seconds": 0},
        },
    )


def config_toml(url: str, instance: Path) -> str:
    """``config`` as the jobdeck.toml of a ``jobdeck serve``: the same
    deployment, but for its schedules: the demo's would fire in the new
    process and add jobs the SQLite side never had (the app the tests build
    in-process runs no scheduler)."""
    return "\n".join([
        f"database_url = {json.dumps(url)}",
        "schedules = []",
        f"instance_path = {json.dumps(str(instance))}",
        "workers = 0",
        'secret_key = "copy-test-secret"',
        f"api_token = {json.dumps(TOKEN)}",
        "demo = true",
        f"[users.{USER}]",
        f"password_hash = {json.dumps(PASSWORD_HASH)}",
        'role = "operator"',
        '[types."demo.charge-card"]',
        'rate = "1000/1s"',
        "[dashboard]",
        "counts_cache_seconds = 0",
        "",
    ])  # fmt: skip


def app_on(url: str, instance: Path) -> Any:
    app = create_app(config(url, instance))
    app.config["TESTING"] = True
    return app


@dataclass
class Deployment:
    """What the tests look up after the move: ids by what they show."""

    url: str
    jobs: int = 0
    ids: dict[str, int] = field(default_factory=dict)
    session_cookie: tuple[str, str] | None = None


def build(directory: Path, total_jobs: int = 10_000) -> Deployment:
    """Make the deployment in ``directory/jobdeck.db``; every process on it is gone when this returns."""
    url = f"sqlite:///{directory / 'jobdeck.db'}"
    app = app_on(url, directory / "instance")
    deck = deck_of(app)
    client = app.test_client()
    made = Deployment(url)
    try:
        _run_jobs(deck, client, made)
        _hold_jobs(deck, client, made, total_jobs)
        _operate(deck, client, made)
        with deck.store.engine.begin() as conn:
            fill_empty_tables(conn, deck.clock())
        made.jobs = _job_count(deck)
    finally:
        deck.store.engine.dispose()
    return made


def small(directory: Path, template: Path, jobs: int = 5) -> str:
    """A copy of the migrated SQLite ``template`` in ``directory`` with a
    few plain jobs, every process on it gone: its URL."""
    shutil.copyfile(template, directory / "jobdeck.db")
    url = f"sqlite:///{directory / 'jobdeck.db'}"
    deck = Jobdeck(config(url, directory / "instance"), demo_registry())
    try:
        deck.enqueue_many([{"type": "demo.noop", "payload": {"n": n}} for n in range(jobs)])
    finally:
        deck.store.engine.dispose()
    return url


def demo_registry() -> Registry:
    from jobdeck import demo

    made = Registry()
    demo.register(made)
    return made


def made_counts(deck: Jobdeck) -> dict[str, int]:
    """The jobs by state, as the overview counts them."""
    return dict(deck.store.counts(deck.clock()))


def api(client: Any, method: str, url: str, body: Any = None, status: int | tuple[int, ...] = (200, 201)) -> Any:
    answer = client.open(url, method=method, json=body, headers=AUTH)
    expected = status if isinstance(status, tuple) else (status,)
    assert answer.status_code in expected, f"{method} {url}: {answer.status_code} {answer.get_data(as_text=True)}"
    return answer.get_json()


def _run_jobs(deck: Jobdeck, client: Any, made: Deployment) -> None:
    """Jobs a real pool runs to the end: completed, dead, with logs,
    effects and artifacts; a workflow and a batch that finish."""
    from jobdeck.runtime import pool_for

    ids = deck.enqueue_many([{"type": "demo.noop", "payload": {"n": n}} for n in range(1500)])
    dead = deck.enqueue_many(
        [{"type": "demo.fail", "payload": {"message": f"no such user {n}"}, "max_retries": 0} for n in range(300)]
    )
    reports = [api(client, "POST", "/api/jobs", {"type": "demo.report", "payload": {"name": f"r{n}", "rows": 40}})
               for n in range(10)]  # fmt: skip
    charges = [api(client, "POST", "/api/jobs", {"type": "demo.charge-card",
                                                 "payload": {"order_id": f"o{n}", "amount_cents": 100 + n}})
               for n in range(10)]  # fmt: skip
    emails = deck.enqueue_many([{"type": "demo.send-email", "payload": {"user_id": f"u{n}"}} for n in range(5)])
    sleeps = deck.enqueue_many([{"type": "demo.sleep", "payload": {"seconds": 0.05}} for _ in range(5)])
    snoozed = deck.enqueue_many([{"type": "demo.snooze", "payload": {"seconds": 86400}} for _ in range(5)])
    workflow = api(client, "POST", "/api/workflows", {"name": "nightly", "jobs": [
        {"name": "extract", "type": "demo.extract", "payload": {"region": "eu", "seconds": 0}},
        {"name": "build", "type": "demo.build", "depends_on": ["extract"]},
        {"name": "email", "type": "demo.send-email", "payload": {"user_id": "ops"}, "depends_on": ["build"]},
    ]})  # fmt: skip
    batch = api(client, "POST", "/api/batches", {"name": "imports", "on_complete": "demo.noop"})
    batch_jobs = api(client, "POST", f"/api/batches/{batch['id']}/jobs", {"jobs": [{"type": "demo.noop"}] * 3})
    api(client, "POST", f"/api/batches/{batch['id']}/close")
    every = [*ids, *dead, *(j["id"] for j in reports + charges), *emails, *sleeps, *batch_jobs["ids"]]
    every += list(workflow["jobs"].values())
    pool = pool_for(deck, 2)
    pool.start()
    try:
        try:
            wait_for(lambda: _all_ended(deck, every) and _all_snoozed(deck, snoozed), timeout=120, message="the run")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still waiting, e.g. {_last_seen}") from None
        wait_for(lambda: _batch_fired(client, batch["id"]), timeout=30, message="the batch's callback")
    finally:
        pool.stop(grace=10)
    made.ids.update(dead=dead[0], completed=ids[0], report=reports[0]["id"], charge=charges[0]["id"],
                    snoozed=snoozed[0], sleep=sleeps[0], workflow=workflow["id"], batch=batch["id"],
                    step=workflow["jobs"]["build"])  # fmt: skip


def _all_ended(deck: Jobdeck, ids: list[int]) -> bool:
    from jobdeck.store.models import jobs

    with deck.store.engine.connect() as conn:
        waiting = conn.execute(
            select(jobs.c.id, jobs.c.type, jobs.c.status)
            .where(jobs.c.id.in_(ids), jobs.c.status.not_in(["completed", "dead"]))
            .limit(5)
        ).all()
    _last_seen[:] = waiting
    return not waiting


_last_seen: list[Any] = []
"""The jobs ``_all_ended`` last found still waiting, for the timeout's message."""


def _all_snoozed(deck: Jobdeck, ids: list[int]) -> bool:
    return all(deck.store.get(i).attempt >= 1 and deck.store.get(i).status is State.PENDING for i in ids)


def _batch_fired(client: Any, batch_id: int) -> bool:
    return bool(api(client, "GET", f"/api/batches/{batch_id}").get("fired_at"))


def _hold_jobs(deck: Jobdeck, client: Any, made: Deployment, total_jobs: int) -> None:
    """Jobs in the states a stopped deployment holds them in: running on an
    HTTP worker, failed and waiting for a retry, blocked, scheduled,
    pending in a paused queue, cancelled and discarded."""
    api(client, "POST", f"/api/queues/{HELD}/pause")
    flaky = deck.enqueue_many([{"type": "demo.flaky", "queue": "http"} for _ in range(5)])
    claimed = api(client, "POST", "/api/jobs/claim", {"worker_id": "http-1", "queues": ["http"], "limit": 5})
    assert sorted(j["id"] for j in claimed) == sorted(flaky)
    for job in claimed[:2]:
        api(client, "POST", f"/api/jobs/{job['id']}/fail", {"worker_id": "http-1", "error": "upstream 502",
                                                             "logs": [{"message": "calling upstream"}]})  # fmt: skip
    api(client, "POST", f"/api/jobs/{claimed[2]['id']}/heartbeat", {"worker_id": "http-1",
                                                                     "logs": [{"message": "halfway"}]})  # fmt: skip
    blocked = api(client, "POST", "/api/workflows", {"name": "held-nightly", "jobs": [
        {"name": "extract", "type": "demo.extract", "queue": HELD},
        {"name": "build", "type": "demo.build", "depends_on": ["extract"]},
        {"name": "email", "type": "demo.send-email", "payload": {"user_id": "ops"}, "depends_on": ["build"]},
    ]})  # fmt: skip
    later = (deck.clock() + timedelta(days=1)).isoformat()
    scheduled = deck.enqueue_many([{"type": "demo.noop", "run_at": later, "priority": n % 3} for n in range(2000)])
    pending = total_jobs - _job_count(deck) - 1  # the schedule's run (``_operate``) makes one more
    held = deck.enqueue_many(
        [{"type": "demo.noop", "queue": HELD, "payload": {"n": n}} for n in range(max(pending, 1))]
    )
    now = deck.clock()
    deck.store.cancel_ids(held[:500], now)
    dead = _dead_ids(deck)
    deck.store.discard_ids(dead[-100:], now)
    made.ids.update(running=claimed[2]["id"], failed=claimed[0]["id"], blocked=blocked["jobs"]["build"],
                    scheduled=scheduled[0], pending=held[-1], cancelled=held[0], discarded=dead[-1],
                    held_workflow=blocked["id"])  # fmt: skip


def _job_count(deck: Jobdeck) -> int:
    with deck.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(metadata.tables["jobs"])).scalar_one())


def _dead_ids(deck: Jobdeck) -> list[int]:
    from jobdeck.store.models import jobs

    with deck.store.engine.connect() as conn:
        return list(conn.execute(select(jobs.c.id).where(jobs.c.status == "dead").order_by(jobs.c.id)).scalars())


def _operate(deck: Jobdeck, client: Any, made: Deployment) -> None:
    """What operators leave behind: actions in the audit log, a runtime
    schedule run once and paused, a signed-in session, the stats roll-up."""
    from jobdeck.store.upkeep import roll_up_minutes, whole_minute

    dead = _dead_ids(deck)
    api(client, "POST", f"/api/jobs/{dead[1]}/retry")
    api(client, "POST", f"/api/jobs/{dead[2]}/discard")
    api(client, "POST", f"/api/jobs/{made.ids['scheduled'] + 1}/cancel")
    schedule = {"name": "hourly-report", "cron": "0 * * * *", "type": "demo.report", "queue": HELD,
                "payload": {"name": "hourly"}, "expect_success_within": "2h"}  # fmt: skip
    api(client, "POST", "/api/schedules", schedule)
    api(client, "POST", "/api/schedules/hourly-report/run")
    api(client, "POST", "/api/schedules/hourly-report/pause")
    page = client.get("/login").get_data(as_text=True)
    token = page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    signed_in = client.post("/login", data={"username": USER, "password": PASSWORD, "csrf_token": token})
    assert signed_in.status_code == 302, signed_in.get_data(as_text=True)
    cookie = client.get_cookie("session")
    assert cookie is not None, "signing in set no session cookie"
    made.session_cookie = (cookie.key, cookie.value)
    minute = whole_minute(deck.clock())
    roll_up_minutes(deck.store, minute + timedelta(minutes=1))
    roll_up_minutes(deck.store, minute + timedelta(minutes=2))


def fill_empty_tables(conn: Connection, now: datetime) -> list[str]:
    """One row in each table that holds none, made from its columns' types
    (a foreign key takes an existing parent's key): the copy must carry
    every table, whatever wrote to it. Returns the tables filled."""
    filled = []
    for table in metadata.sorted_tables:
        if conn.execute(select(func.count()).select_from(table)).scalar_one():
            continue
        conn.execute(insert(table).values(_row(conn, table, now)))
        filled.append(table.name)
    return filled


def _row(conn: Connection, table: Table, now: datetime) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for column in table.columns:
        if column.autoincrement is True or (column.primary_key and table.autoincrement_column is column):
            continue
        parent = next(iter(column.foreign_keys), None)
        if parent is not None:
            row[column.name] = conn.execute(select(parent.column).limit(1)).scalar_one()
            continue
        kind = getattr(column.type, "impl_instance", column.type).python_type  # a TypeDecorator says object
        row[column.name] = {
            int: 1,
            str: f"copy-{column.name}"[: getattr(column.type, "length", None) or 64],
            datetime: now.astimezone(UTC),
            bool: True,
            float: 1.25,
            bytes: b"\x00copy\xff",
        }[kind]
    return row
