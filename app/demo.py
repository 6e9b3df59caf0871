"""Demo job types, registered by ``--demo`` (or ``demo = true``)."""

from __future__ import annotations

import csv
import io
import threading
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobdeck.core.config import Config
from jobdeck.core.errors import InvalidField
from jobdeck.jobs.handlers import JobContext, Registry, Snooze
from jobdeck.store.demo_tables import record_demo_charge, send_demo_email

DEMO_CONFIG = Path(__file__).with_name("demo.toml")
"""The demo's schedules, queue limits and types (shipped in the wheel)."""

TYPES = (
    "demo.noop",
    "demo.sleep",
    "demo.fail",
    "demo.flaky",
    "demo.send-email",
    "demo.charge-card",
    "demo.report",
    "demo.snooze",
    "demo.extract",
    "demo.build",
)


def add_demo_config(config: Config) -> None:
    """Add the demo's tables to ``config``, under any the config sets itself.
    Its workflows join the config's ``[workflows]`` one by one: a config that
    only sets ``[workflows] max_jobs`` must not leave the demo's schedules
    naming a workflow that is not there."""
    with DEMO_CONFIG.open("rb") as fh:
        for key, value in tomllib.load(fh).items():
            mine = config.extra.get(key)
            if key == "workflows" and isinstance(mine, dict):
                for name, workflow in value.items():
                    mine.setdefault(name, workflow)
            else:
                config.extra.setdefault(key, value)


def _now() -> datetime:
    return datetime.now(UTC)


def _number(payload: dict[str, Any], key: str, default: float) -> float:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InvalidField(f"payload.{key}", "must be a number >= 0")
    return float(value)


def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    return None


def sleep(payload: dict[str, Any], ctx: JobContext) -> dict[str, float]:
    """Sleeps ``seconds`` (default 1), reporting progress and logging each
    step as it goes (the job page streams the log); a cancel stops it at
    once (it waits on ``ctx.cancelled``)."""
    seconds = _number(payload, "seconds", 1.0)
    steps = max(1, min(20, int(seconds * 4)))
    ctx.log("sleeping %g s in %d steps", seconds, steps)
    for step in range(steps):
        if ctx.cancelled.wait(seconds / steps):
            ctx.log.warning("cancelled after %d of %d steps", step, steps)
            ctx.check_cancelled()
        slept = f"slept {seconds * (step + 1) / steps:.1f} of {seconds:g} s"
        ctx.progress((step + 1) / steps, slept)
        ctx.log("step %d/%d: %s", step + 1, steps, slept)
    return {"slept": seconds}


def fail(payload: dict[str, Any], ctx: JobContext) -> None:
    raise RuntimeError(str(payload.get("message") or "demo.fail always fails"))


def _failed_runs(ctx: JobContext) -> int:
    """The job's runs that failed, from its history: not ``ctx.attempt``,
    which a claim given back before its handler started also counts (and
    which an operator's retry does not reset, as it resets ``ctx.retries``)."""
    return sum(1 for a in ctx.store.attempts_of(ctx.job_id) if a.outcome in ("failed", "timed_out"))


def flaky(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    """Fails its first ``failures`` attempts, then succeeds."""
    failures = int(_number(payload, "failures", 1))
    failed = _failed_runs(ctx)
    if failed < failures:
        run = failed + 1
        ctx.log.warning("attempt %d: failing as planned (%d planned failures)", run, failures)
        raise RuntimeError(f"flaky: attempt {run} of {failures} planned failures")
    return {"succeeded_on_attempt": ctx.attempt}


MAX_DEMO_ID_CHARS = 100
"""The demo tables' ``order_id`` and ``user_id`` columns."""


def _demo_id(payload: dict[str, Any], field: str) -> str:
    """``payload[field]`` as text: required, and at most the column's length
    (PostgreSQL refused a longer one at the insert, inside the effect, which
    left the charge's outcome unknown; SQLite stored it)."""
    value = str(payload.get(field, ""))
    if not value:
        raise InvalidField(f"payload.{field}", "required")
    if len(value) > MAX_DEMO_ID_CHARS:
        raise InvalidField(f"payload.{field}", f"at most {MAX_DEMO_ID_CHARS} characters")
    return value


def send_email(payload: dict[str, Any], ctx: JobContext) -> None:
    user_id = _demo_id(payload, "user_id")
    send_demo_email(ctx.store, user_id, ctx.job_id, f"Hello user {user_id}", _now())


class FakeGateway:
    """A payment gateway that records every charge it makes in
    ``demo_charges``. Like real gateways it takes an optional idempotency
    key: a second charge with the same key makes no new charge and returns
    the first one. Without a key every call charges."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def charge(
        self, order_id: str, amount_cents: int, idempotency_key: str | None = None, delay: float = 0.0
    ) -> dict[str, Any]:
        if delay:
            threading.Event().wait(delay)  # the request on its way: a crash here leaves the outcome unknown
        charge_id, replayed = record_demo_charge(
            self.ctx.store, order_id, amount_cents, self.ctx.job_id, _now(), idempotency_key
        )
        return {"charge_id": charge_id, "replayed": replayed}


def charge_card(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Charges once per order, however often the job is delivered.

    ``gateway_delay_seconds`` holds the charge on its way to the gateway (so
    a crash between the ledger's record and the charge can be produced);
    ``replay_safe`` forwards the ledger's key to the gateway as its
    idempotency key, so an attempt whose outcome is unknown is charged again
    safely instead of going to dead; ``fail_after_charge`` fails the first
    attempt after the charge, to show the retry does not charge again."""
    order_id = _demo_id(payload, "order_id")
    amount = int(_number(payload, "amount_cents", 0))
    delay = _number(payload, "gateway_delay_seconds", 0.0)
    gateway = FakeGateway(ctx)
    key = f"charge:{order_id}"
    if payload.get("replay_safe"):
        charge = ctx.effect(
            key, lambda k: gateway.charge(order_id, amount, idempotency_key=k, delay=delay), replay_safe=True
        )
    else:
        charge = ctx.effect(key, lambda: gateway.charge(order_id, amount, delay=delay))
    if payload.get("fail_after_charge") and _failed_runs(ctx) == 0:
        raise RuntimeError("demo: failing after the charge to show the retry does not charge again")
    return {"order_id": order_id, "charge": charge}


def report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Builds a CSV report of ``rows`` rows and keeps it as the job's
    artifact ``<name>.csv`` (``ctx.artifact``): the job page and the
    Schedules page link it for download."""
    name = str(payload.get("name") or "report")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:80] or "report"
    rows = int(_number(payload, "rows", 100))
    ctx.log("building %s.csv with %d rows", safe, rows)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["row", "value"])
    for i in range(rows):
        writer.writerow([i, i * i])
        if rows >= 10 and i % max(1, rows // 10) == 0:
            ctx.progress(i / rows, f"wrote {i} of {rows} rows")
    artifact = ctx.artifact(f"{safe}.csv", out.getvalue())
    ctx.progress(1.0, f"wrote {rows} rows")
    ctx.log("kept %s (%d bytes)", artifact.name, artifact.size)
    return {"artifact": artifact.name, "rows": rows, "bytes": artifact.size}


def snooze(payload: dict[str, Any], ctx: JobContext) -> Snooze | dict[str, int]:
    """Snoozes its first ``times`` attempts (default 1) for ``seconds``
    (default 5) each, then completes: the snoozes count neither as retries
    nor as failures."""
    times = int(_number(payload, "times", 1))
    seconds = _number(payload, "seconds", 5.0)
    # Counted from the job's history, not ctx.attempt: a claim given back
    # before its handler started keeps its number.
    snoozed = sum(1 for a in ctx.store.attempts_of(ctx.job_id) if a.outcome == "snoozed")
    if snoozed < times:
        return Snooze(seconds, f"demo: snooze {snoozed + 1} of {times}")
    return {"completed_on_attempt": ctx.attempt}


def extract(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """One region's rows for the ``demo.nightly`` workflow: takes
    ``seconds`` (default 2) so the workflow page shows it running."""
    region = str(payload.get("region") or "eu")[:40]
    seconds = _number(payload, "seconds", 2.0)
    if ctx.cancelled.wait(min(seconds, 60.0)):
        ctx.check_cancelled()
    rows = 100 * (1 + sum(map(ord, region)) % 9)
    ctx.log("extracted %d rows for %s", rows, region)
    return {"region": region, "rows": rows}


def build(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The report of ``demo.nightly``, from its extracts' results
    (``ctx.dependency_results``): it runs only once all of them completed."""
    parts = ctx.dependency_results()
    rows = {name: r.get("rows", 0) for name, r in parts.items() if isinstance(r, dict)}
    ctx.log("building the report from %s", ", ".join(sorted(rows)) or "nothing")
    return {"rows": sum(rows.values()), "from": sorted(rows)}


def register(registry: Registry) -> None:
    registry.handler("demo.noop")(noop)
    registry.handler("demo.sleep", timeout=3600)(sleep)
    registry.handler("demo.fail")(fail)
    registry.handler("demo.flaky", backoff_base=0.5)(flaky)
    registry.handler("demo.send-email")(send_email)
    registry.handler("demo.charge-card")(charge_card)
    registry.handler("demo.report", timeout=600, queue="reports")(report)
    registry.handler("demo.snooze")(snooze)
    registry.handler("demo.extract")(extract)
    registry.handler("demo.build")(build)
