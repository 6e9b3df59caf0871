"""Clients generated from the live ``/api/openapi.json`` by generators nobody
here wrote, each running a worker loop against a real server.

- Python: openapi-python-client (the ``test`` extra) generates a package,
  which is imported, and the loop runs with its own functions and models.
- TypeScript: openapi-typescript generates the types, tsc type-checks
  ``tests/clients/ts/worker.ts`` against them (a document change that breaks
  the types fails there), and node runs it with openapi-fetch. The tools are
  pinned in ``tests/clients/ts/package-lock.json``; ``npm ci`` installs them
  when ``node_modules`` is missing or older than the lock file. Without node
  or npm, or without the registry, the test fails: it never skips.

Each loop: enqueue, and a duplicate of a unique job -> claim -> heartbeat with
a log line -> an effect started (perform) and finished with its result ->
complete; a job with ``max_retries`` 1: claim -> an effect performed ->
fail -> claim once due -> the effect skipped, with its stored result ->
fail -> dead; a bulk enqueue of two jobs -> claim both -> complete. The
database, read apart from the client, must agree.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck

from tests.conftest import wait_for
from tests.live_server import served

pytestmark = pytest.mark.slow

TOKEN = "generated-client-token-0123456789"
TYPES = ["ext.resize", "ext.flaky"]
"""Job types that no handler here runs: the generated clients are the workers."""
TS = Path(__file__).parent / "clients" / "ts"
PACKAGE = "jobdeck_client"
GENERATOR_CONFIG = """\
post_hooks: []
content_type_overrides:
  "*/*": application/octet-stream
"""
"""No formatter run on the generated code (its output is only imported here);
an artifact's bytes, sent as whatever type it has (``*/*``), read as bytes."""


@dataclass
class Live:
    url: str
    deck: Jobdeck


@pytest.fixture
def live(make_config: Any, registry: Any) -> Iterator[Live]:
    """A real server with a token, accepting the external types; no worker
    pool, and a backoff short enough that a failed job is due again at once."""
    config = make_config(api_token=TOKEN, external_types=TYPES, backoff_base=0.05, backoff_cap=0.1)
    deck = Jobdeck(config, registry)
    deck.init_db()
    try:
        with served(create_app(deck=deck)) as url:
            yield Live(url, deck)
    finally:
        deck.store.engine.dispose()


def _run(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, (
        f"{' '.join(command)} exited {run.returncode}:\n{run.stdout[-5000:]}{run.stderr[-5000:]}"
    )
    return run.stdout


def _status(live: Live, job_id: int) -> str:
    return str(live.deck.store.get(job_id).status)


# -- Python: openapi-python-client ----------------------------------------------------------------


@contextmanager
def _imported(folder: Path, name: str) -> Iterator[ModuleType]:
    """The package ``folder/name``, imported; forgotten again afterwards."""
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_a_generated_python_client_runs_the_worker_loop(live: Live, tmp_path: Path) -> None:
    config = tmp_path / "generator.yaml"
    config.write_text(GENERATOR_CONFIG)
    _run(
        [
            sys.executable, "-m", "openapi_python_client", "generate", "--url", f"{live.url}/api/openapi.json",
            "--meta", "none", "--output-path", str(tmp_path / PACKAGE), "--config", str(config), "--fail-on-warning",
        ],
        cwd=tmp_path,
        timeout=180,
    )  # fmt: skip
    with _imported(tmp_path, PACKAGE) as package:
        ids = _python_loop(package, live.url)
    _check_database(live, ids)


def _check_database(live: Live, ids: dict[str, Any]) -> None:
    assert (_status(live, ids["worked"]), _status(live, ids["dead"])) == ("completed", "dead")
    assert [str(a.outcome) for a in live.deck.store.attempts_of(ids["dead"])] == ["failed", "failed"]
    assert len(ids["bulk"]) == 2 and [_status(live, job_id) for job_id in ids["bulk"]] == ["completed"] * 2
    ledger = live.deck.store.ledger
    worked = ledger.get(f"thumbnail:{ids['worked']}")
    assert (worked.state, worked.job_id, worked.attempt, worked.result) == ("done", ids["worked"], 1, {"bytes": 2048})
    notified = ledger.get(f"notify:{ids['dead']}")
    assert (notified.state, notified.attempt, notified.result) == ("done", 1, {"message_id": "m-1"}), notified


def _python_loop(package: ModuleType, url: str) -> dict[str, Any]:
    """The loop, with the generated client's own functions and models."""

    def module(name: str) -> Any:
        return importlib.import_module(f"{package.__name__}.{name}")

    enqueue_job, get_job = module("api.jobs.enqueue_job"), module("api.jobs.get_job")
    enqueue_jobs = module("api.jobs.enqueue_jobs")
    claim_jobs, heartbeat = module("api.worker.claim_jobs"), module("api.worker.heartbeat")
    complete_job, fail_job = module("api.worker.complete_job"), module("api.worker.fail_job")
    start_effect, finish_effect = module("api.effects.start_effect"), module("api.effects.finish_effect")
    models = module("models")
    client = module("client").AuthenticatedClient(base_url=url, token=TOKEN, raise_on_unexpected_status=True)
    me = "python-worker"

    def claim(job_type: str, limit: int | None = None) -> Any:
        body = models.ClaimRequest(worker_id=me, types=[job_type])
        if limit is not None:
            body.limit = limit
        answer = claim_jobs.sync_detailed(client=client, body=body)
        assert answer.status_code == 200, answer.content
        return answer.parsed

    def effect(job: Any, key: str, result: Any) -> tuple[str, Any]:
        """Start ``key`` for the job's attempt; perform it (here: ``result``)
        and finish it when told to; returns the decision and the result."""
        step = {"worker_id": me, "attempt": job.attempt}
        begun = start_effect.sync(job_id=job.id, key=key, client=client, body=models.EffectStartRequest(**step))
        assert isinstance(begun, models.EffectStart) and begun.effect.key == key, begun
        if begun.decision == models.EffectStartDecision.SKIP:
            return "skip", begun.effect.result
        assert begun.decision == models.EffectStartDecision.PERFORM and begun.replayed is False, begun
        body = models.EffectFinishRequest(**step, result=result)
        finished = finish_effect.sync(job_id=job.id, key=key, client=client, body=body)
        assert isinstance(finished, models.Effect) and finished.state == models.EffectState.DONE, finished
        return "perform", finished.result

    # enqueue (a unique job, twice) -> claim -> heartbeat -> effect -> complete
    new = models.NewJob(
        type_="ext.resize",
        payload=models.NewJobPayload.from_dict({"image": "cat.png"}),
        priority=models.PriorityLabel.HIGH,
        unique=True,
    )
    created = enqueue_job.sync_detailed(client=client, body=new)
    assert created.status_code == 201 and isinstance(created.parsed, models.Job), created.content
    again = enqueue_job.sync_detailed(client=client, body=new)
    assert again.status_code == 200 and again.parsed.duplicate is True and again.parsed.id == created.parsed.id
    claimed = claim("ext.resize")
    assert isinstance(claimed, models.Job) and claimed.id == created.parsed.id, claimed
    assert claimed.status == models.JobState.RUNNING and claimed.priority == 20
    beat = heartbeat.sync(
        job_id=claimed.id,
        client=client,
        body=models.HeartbeatRequest(worker_id=me, logs=[models.NewLogLine(message="resizing cat.png")]),
    )
    assert isinstance(beat, models.HeartbeatAnswer) and beat.cancel is False and beat.logs_kept == 1, beat
    assert effect(claimed, f"thumbnail:{claimed.id}", {"bytes": 2048}) == ("perform", {"bytes": 2048})
    done = complete_job.sync(
        job_id=claimed.id, client=client, body=models.CompleteRequest(worker_id=me, result={"width": 64})
    )
    assert isinstance(done, models.Job) and done.status == models.JobState.COMPLETED, done
    shown = get_job.sync(job_id=claimed.id, client=client)
    assert isinstance(shown, models.JobDetail) and shown.result == {"width": 64} and shown.logs.lines == 1

    # fail -> retry -> dead, with max_retries 1
    flaky = enqueue_job.sync(client=client, body=models.NewJob(type_="ext.flaky", max_retries=1))
    assert isinstance(flaky, models.Job) and flaky.max_retries == 1, flaky
    first = claim("ext.flaky", limit=1)
    assert isinstance(first, list) and [j.id for j in first] == [flaky.id], first
    notify = f"notify:{flaky.id}"
    assert effect(first[0], notify, {"message_id": "m-1"}) == ("perform", {"message_id": "m-1"})
    failed = fail_job.sync(
        job_id=flaky.id, client=client, body=models.FailRequest(worker_id=me, error="timed out", retryable=True)
    )
    assert isinstance(failed, models.Job) and failed.status == models.JobState.FAILED and failed.retry_count == 1
    retried = wait_for(lambda: claim("ext.flaky"), timeout=10, message="the failed job to come due again")
    assert isinstance(retried, models.Job) and retried.id == flaky.id and retried.attempt == 2, retried
    assert effect(retried, notify, {"message_id": "m-2"}) == ("skip", {"message_id": "m-1"})
    dead = fail_job.sync(job_id=flaky.id, client=client, body=models.FailRequest(worker_id=me, error="timed out again"))
    assert isinstance(dead, models.Job) and dead.status == models.JobState.DEAD, dead

    # a bulk enqueue -> claim both -> complete
    images = [models.NewJobPayload.from_dict({"image": name}) for name in ("a.png", "b.png")]
    bulk = enqueue_jobs.sync_detailed(
        client=client, body=models.NewJobs(jobs=[models.NewJob(type_="ext.resize", payload=p) for p in images])
    )
    assert bulk.status_code == 201 and isinstance(bulk.parsed, models.EnqueuedJobs), bulk.content
    assert [(j.created, j.duplicate) for j in bulk.parsed.jobs] == [(True, False)] * 2
    batch = claim("ext.resize", limit=2)
    assert sorted(j.id for j in batch) == sorted(j.id for j in bulk.parsed.jobs), batch
    for job in batch:
        answer = complete_job.sync(job_id=job.id, client=client, body=models.CompleteRequest(worker_id=me))
        assert isinstance(answer, models.Job) and answer.status == models.JobState.COMPLETED, answer
    client.get_httpx_client().close()
    return {"worked": claimed.id, "dead": flaky.id, "bulk": [j.id for j in bulk.parsed.jobs]}


# -- TypeScript: openapi-typescript, openapi-fetch, tsc --------------------------------------------


def _node_modules() -> Path:
    """``tests/clients/ts/node_modules`` as its lock file pins it: ``npm ci``
    when missing or older than ``package-lock.json``. Fails without npm."""
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm are needed (Node 20 or newer)"
    installed = TS / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < (TS / "package-lock.json").stat().st_mtime:
        _run([npm, "ci", "--no-audit", "--no-fund"], cwd=TS, timeout=300)
    return TS / "node_modules"


def test_a_generated_typescript_client_runs_the_worker_loop(live: Live, tmp_path: Path) -> None:
    node = shutil.which("node")
    node_modules = _node_modules()
    assert node
    for name in ("worker.ts", "tsconfig.json", "package.json"):
        shutil.copy(TS / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(node_modules, target_is_directory=True)
    cli = node_modules / "openapi-typescript" / "bin" / "cli.js"
    _run([node, str(cli), f"{live.url}/api/openapi.json", "-o", "jobdeck.d.ts"], cwd=tmp_path, timeout=120)
    _run([node, str(node_modules / "typescript" / "bin" / "tsc"), "-p", "tsconfig.json"], cwd=tmp_path, timeout=180)

    env = {**os.environ, "JOBDECK_URL": live.url, "JOBDECK_API_TOKEN": TOKEN}
    ids = json.loads(_run([node, "out/worker.js"], cwd=tmp_path, timeout=120, env=env).splitlines()[-1])
    _check_database(live, ids)
