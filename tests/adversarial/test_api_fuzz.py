"""Schemathesis against the live JSON API, from its own OpenAPI document.

The real WSGI app is served by waitress on 127.0.0.1 (port 0) in a thread,
with a real worker pool running the demo handlers, on a temporary SQLite
file; Schemathesis' CLI runs in a subprocess against /api/openapi.json, once
without ``api_token``, once with one (sending the bearer token), and once
with a named ``work`` token confined to one job type. Between them every
operation goes through the coverage phase (boundary and negative values
derived from the schema: about 2,800 cases, most of them refused input) and
the fuzzing phase (``EXAMPLES`` hypothesis-generated requests per
operation): the work token in both, ``api_token`` in the coverage phase,
the run without a token in the fuzzing phase. The checks are
not_a_server_error, status_code_conformance, content_type_conformance and
response_schema_conformance. The seed and the number of cases are fixed, so
a CI failure replays case for case.

Why ``api_token`` and no token split the phases: the seed and the document
are the same in every run, so a phase run in both would send the very same
requests twice, once with the header added, and each would be served alike.
The token is decided before the view reads the body
(``jobdeck.web.guard.authenticate``), and past it the legacy token's
principal changes nothing a view computes (every scope, unconfined types and
queues, the worker id as given, the actor ``api``, as without a token). What
the token itself adds, every operation accepting it and refusing a missing or
wrong one, is in the coverage phase, so that phase runs with the token. Each
phase was about half of a run's CPU. The work token keeps both: what it may
touch depends on the body (the types a claim names, the job an effect
belongs to).

Two independent witnesses must agree that nothing failed: Schemathesis'
own report, and a WSGI wrapper that counts every status the server sent
(a 5xx the fuzzer did not attribute would still fail the test). The wrapper
also records each answer's route, so the work token's run shows that no
operation outside the ``work`` scope (``jobdeck.web.scopes``) answered 2xx.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.deck import Jobdeck
from jobdeck.store import JobFilter
from jobdeck.web import scopes
from jobdeck.web.api.openapi import document
from live_server import running
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map

EXAMPLES = 10
"""Cases per operation in the fuzzing phase: one pass over every operation.
(A time budget instead, fuzzing until it was spent, cost 45 s per
configuration whatever the machine, fuzzed a number of cases that depended
on the machine's speed, and on a loaded machine did not reach every
operation.)"""
TIMEOUT_SECONDS = 240
"""Only a hang comes near this: both phases take about 25 s here."""
SEED = 20260109
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
TOKEN = "fuzz-token-0123456789abcdef"
WORK_TOKEN = "fuzz-work-token-0123456789abcdef"
WORK_TYPE = "ext.render"
PHASES = {"": ("fuzzing",), TOKEN: ("coverage",), WORK_TOKEN: ("coverage", "fuzzing")}
"""The phases each run has (module doc: why ``api_token`` and no token split them)."""
LEAST_CASES = {"coverage": 2000, "fuzzing": 300}
"""Fewer cases than this in a phase means it stopped early (about 2,850 and 470 here)."""
WORK_TOKENS = {
    "fuzz-worker": {
        "token_sha256": hashlib.sha256(WORK_TOKEN.encode()).hexdigest(),
        "scopes": ["work"],
        "types": [WORK_TYPE],
    }
}
SCHEDULES = [
    {"name": "nightly", "cron": "0 2 * * *", "type": "demo.noop"},
    {"name": "tick", "cron": "* * * * *", "type": "demo.noop", "payload": {"n": 1}},
]


@dataclass
class StatusCount:
    """A WSGI wrapper that counts each status the server answered, by method
    and by (method, route, status), and keeps the requests answered 5xx."""

    app: Callable[..., Any]
    url_map: Map
    counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    routes: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def counting_start(status: str, headers: Any, exc_info: Any = None) -> Any:
            code = int(status.split()[0])
            route = self._route(environ)
            with self.lock:
                self.counts[(environ["REQUEST_METHOD"], code)] += 1
                self.routes[(environ["REQUEST_METHOD"], route, code)] += 1
                if code >= 500:
                    self.server_errors.append(f"{code} {environ['REQUEST_METHOD']} {environ.get('PATH_INFO')}")
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        return self.app(environ, counting_start)  # type: ignore[no-any-return]

    def _route(self, environ: dict[str, Any]) -> str:
        """The rule the request matched (``/api/jobs/<int:job_id>``), or ``?``."""
        try:
            rule, _ = self.url_map.bind_to_environ(environ).match(return_rule=True)
        except HTTPException:
            return "?"
        return str(rule.rule)

    def total(self, low: int, high: int) -> int:
        with self.lock:
            return sum(n for (_, code), n in self.counts.items() if low <= code < high)


@dataclass
class LiveApi:
    url: str
    deck: Jobdeck
    statuses: StatusCount


@pytest.fixture
def live_api(make_config: Any, registry: Any) -> Iterator[Callable[..., LiveApi]]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> LiveApi:
            config = make_config(workers=2, schedules=SCHEDULES, external_types=["ext.render"], **overrides)
            deck = Jobdeck(config, registry)
            deck.init_db()
            app = create_app(deck=deck)
            statuses = StatusCount(app.wsgi_app, app.url_map)
            app.wsgi_app = statuses  # type: ignore[method-assign]
            return LiveApi(stack.enter_context(running(deck, app, workers=2)), deck, statuses)

        yield start


def _scenarios(ndjson: Path) -> tuple[set[tuple[str, str]], int]:
    """(phase, operation) pairs in which Schemathesis ran cases, and how many."""
    seen: set[tuple[str, str]] = set()
    cases = 0
    with ndjson.open() as events:
        for line in events:
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if finished is None:
                continue
            recorder = finished.get("recorder") or {}
            ran = len(recorder.get("cases") or {})  # a scenario cut off by the time budget may hold none
            if ran:
                seen.add((finished["phase"], recorder["label"]))
                cases += ran
    return seen, cases


@pytest.mark.parametrize("token", ["", TOKEN, WORK_TOKEN], ids=["without-token", "with-token", "with-work-token"])
def test_schemathesis_finds_no_failure(live_api: Callable[..., LiveApi], tmp_path: Path, token: str) -> None:
    work = token == WORK_TOKEN
    live = live_api(api_tokens=WORK_TOKENS) if work else live_api(api_token=token)
    if work:  # jobs its claims can take (no handler here runs the external type)
        for n in range(20):
            live.deck.enqueue(WORK_TYPE, {"n": n})
    phases = PHASES[token]
    report = tmp_path / "report.json"
    events = tmp_path / "events.ndjson"
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{live.url}/api/openapi.json",
        "--checks", CHECKS, "--phases", ",".join(phases), "--seed", str(SEED),
        "--max-examples", str(EXAMPLES), "--workers", "1",
        "--request-timeout", "20", "--generation-database", "none", "--no-color",
        "--report", "json,ndjson", "--report-json-path", str(report), "--report-ndjson-path", str(events),
    ]  # fmt: skip
    if token:
        command += ["--header", f"Authorization: Bearer {token}"]
    started = time.monotonic()
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    elapsed = time.monotonic() - started
    output = run.stdout[-20000:] + run.stderr[-5000:]

    summary = json.loads(report.read_text())
    seen, cases = _scenarios(events)
    operations = {f"{m.upper()} {p}" for p, ops in document()["paths"].items() for m in ops}
    # Schemathesis loads the document from GET /api/openapi.json (a load that
    # fails is a failed run) and leaves that one operation out of its phases.
    expected = operations - {"GET /api/openapi.json"}
    server_5xx = live.statuses.total(500, 600)
    label = "a work token" if work else "api_token" if token else "no token"
    print(
        f"\nschemathesis with {label}: {summary['test_cases']['generated']} cases "
        f"in {elapsed:.0f} s over {len(expected)} operations; {len(summary['failures'])} failures, "
        f"{server_5xx} 5xx answered; statuses {sorted(live.statuses.counts.items())}"
    )

    assert run.returncode == 0, output
    assert summary["failures"] == [] and summary["errors"] == [], output
    assert live.statuses.server_errors == [], live.statuses.server_errors
    for phase in phases:
        assert summary["phases"][phase]["status"] == "success", summary["phases"]
        missed = sorted(expected - {label for p, label in seen if p == phase})
        assert not missed, f"the {phase} phase never ran {missed}"
    least = sum(LEAST_CASES[phase] for phase in phases)
    assert cases >= summary["test_cases"]["generated"] > least, summary["test_cases"]
    if work:
        _work_token_stayed_in_its_scope(live)
        return
    # The fuzzer reached the API's logic, not only its doorstep: jobs were
    # created (so with a token, the token was sent and accepted).
    assert live.statuses.counts[("POST", 201)] > 0, live.statuses.counts
    if "coverage" in phases:
        # So were the workflow and batch operations: a graph was enqueued
        # whole and a batch opened, past their checks (by the coverage
        # phase's valid bodies; ten random ones per operation seldom pass).
        assert live.deck.store.list_workflows(limit=1) and live.deck.store.list_batches(limit=1)
    if token:
        assert live.statuses.total(200, 300) > live.statuses.counts[("GET", 401)] + live.statuses.counts[("POST", 401)]


def _work_token_stayed_in_its_scope(live: LiveApi) -> None:
    """No operation outside the ``work`` scope answered 2xx to the work
    token, every other one was refused 403, and the token did work: it
    claimed jobs of its type, and only those."""
    routes = dict(live.statuses.routes)

    def within_work(method: str, rule: str) -> bool:
        granted = scopes.needed(method, rule)
        return granted is not None and (granted == scopes.PUBLIC or "work" in granted)

    outside = sorted(
        f"{method} {rule} {code} x{n}"
        for (method, rule, code), n in routes.items()
        # OPTIONS is no operation: it answers the route's methods (Allow), never a job.
        if 200 <= code < 300 and method != "OPTIONS" and not within_work(method, rule)
    )
    assert outside == [], outside
    refused = {(m, r) for (m, r, code) in routes if code == 403}
    should_refuse = {
        tuple(key.split(" ", 1)) for key, granted in scopes.OPERATIONS.items() if granted and "work" not in granted
    }
    assert should_refuse <= refused, sorted(should_refuse - refused)
    assert routes.get(("POST", "/api/jobs/claim", 200), 0) > 0, sorted(routes.items())
    store = live.deck.store
    claimed = {
        job.type
        for job in store.list_jobs(JobFilter(limit=10_000), live.deck.clock())
        for worker in (job.worker_id, *(a.worker_id for a in store.attempts_of(job.id)))
        if (worker or "").startswith("fuzz-worker/")
    }
    assert claimed == {WORK_TYPE}, claimed
