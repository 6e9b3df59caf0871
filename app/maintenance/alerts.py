"""Dead-letter alerts.

Every job that lands in ``dead`` is logged at ERROR with its id, type and
error. With a webhook configured::

    [alerts]
    webhook_url = "https://hooks.example.com/jobdeck"
    window = 300                          # seconds: at most one message per job type per window
    dashboard_url = "http://127.0.0.1:8000"

each dead job also leads to a JSON POST, delivered by Jobdeck's own queue as a
``jobdeck.alert`` job, so an unreachable webhook is retried with backoff like
any job. Bursts are aggregated: the first dead job of a type alerts at once;
more of that type within ``window`` of an alert are gathered into one message
at the end of the window, with their count. The alert's slot is chosen and
its job inserted in one serialized write transaction (IMMEDIATE on SQLite, an
advisory lock on PostgreSQL) and keyed ``alert:<type>:<slot>``, so several
processes plan the same slots.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from app.config import Config, ConfigError
from app.deck import Jobdeck, parse_time
from app.handlers import JobContext
from app.states import State
from app.store import JobRecord, NewJob
from app.store.models import jobs

log = logging.getLogger("jobdeck.alerts")

ALERT_TYPE = "jobdeck.alert"
ALERT_QUEUE = "jobdeck"
_PG_LOCK = 0x6A6F6261  # serializes alert planning on PostgreSQL


@dataclass(frozen=True)
class AlertSettings:
    webhook_url: str = ""
    window: float = 300.0
    dashboard_url: str = ""
    timeout: float = 10.0
    max_retries: int = 10
    backoff_base: float = 5.0


def parse_alerts(config: Config) -> AlertSettings:
    raw = config.extra.get("alerts", {})
    if not isinstance(raw, dict):
        raise ConfigError("alerts: expected a table")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in AlertSettings.__dataclass_fields__:
            raise ConfigError(f"alerts.{key}: unknown key")
        if key in ("webhook_url", "dashboard_url"):
            if not isinstance(value, str) or (value and not value.startswith(("http://", "https://"))):
                raise ConfigError(f"alerts.{key}: expected an http:// or https:// URL, got {value!r}")
            values[key] = value.rstrip("/") if key == "dashboard_url" else value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"alerts.{key}: must be a number > 0, got {value!r}")
            values[key] = int(value) if key == "max_retries" else float(value)
    settings = AlertSettings(**values)
    if not settings.dashboard_url:
        settings = AlertSettings(**{**values, "dashboard_url": f"http://{config.bind}"})
    return settings


class Alerts:
    def __init__(self, deck: Jobdeck, settings: AlertSettings) -> None:
        self.deck = deck
        self.store = deck.store
        self.settings = settings

    def install(self) -> None:
        self.store.on_dead(self.on_dead)
        if self.settings.webhook_url:
            s = self.settings
            self.deck.registry.handler(
                ALERT_TYPE, max_retries=s.max_retries, timeout=s.timeout * 2, queue=ALERT_QUEUE,
                backoff_base=s.backoff_base,
            )(self.deliver)  # fmt: skip

    # -- on dead ----------------------------------------------------------------

    def on_dead(self, dead: list[JobRecord]) -> None:
        """The store's dead listener. Never raises: it runs in the acker and
        the sweeper, which must not stop over an alert."""
        for job in dead:
            log.error(
                "job %s (%s) is dead after %d attempt(s): %s", job.id, job.type, job.attempt, job.error or "no error"
            )
        if not self.settings.webhook_url:
            return
        latest: dict[str, datetime] = {}
        for job in dead:
            if job.type == ALERT_TYPE:
                continue  # an undeliverable alert is logged, not alerted about
            t = job.finished_at or self.deck.clock()
            latest[job.type] = max(t, latest.get(job.type, t))
        for job_type, t in latest.items():
            try:
                self.plan(job_type, t)
            except Exception:
                log.exception("could not plan the dead-letter alert for %s", job_type)

    def plan(self, job_type: str, t: datetime) -> datetime | None:
        """Make sure an alert slot covers a job of ``job_type`` dead at ``t``;
        returns the new slot, or None when a pending one covers it."""
        window = timedelta(seconds=self.settings.window)
        prefix = f"alert:{job_type}:"
        now = self.deck.clock()
        with self.store.write() as conn:
            if self.store.dialect == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(_PG_LOCK)))
            # The slot is read from the key (fixed-width, so it sorts), not from
            # available_at, which a retry of the alert moves.
            last_key = conn.execute(
                select(func.max(jobs.c.idempotency_key)).where(
                    jobs.c.type == ALERT_TYPE, func.substr(jobs.c.idempotency_key, 1, len(prefix)) == prefix
                )
            ).scalar()
            last = None if last_key is None else parse_time(last_key[len(prefix) :], "slot")
            if last is not None and last >= t:
                return None
            slot = t if last is None or t >= last + window else last + window
            new = NewJob(
                type=ALERT_TYPE,
                payload={"type": job_type, "since": last.isoformat() if last else None, "until": slot.isoformat()},
                queue=ALERT_QUEUE,
                priority=20,
                max_retries=self.settings.max_retries,
                idempotency_key=f"{prefix}{_stamp(slot)}",
                available_at=slot,
            )
            conn.execute(
                self.store._insert()(jobs)
                .values(self.store._values(new, now))
                .on_conflict_do_nothing(index_elements=["idempotency_key"])
            )
        self.store._notify_enqueued()
        return slot

    # -- delivery (the jobdeck.alert handler) -------------------------------------

    def message(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The JSON body for one alert slot, or None when no job of the type
        is still dead in it (a person retried them meanwhile)."""
        job_type = str(payload["type"])
        until = parse_time(payload["until"], "until")
        since = (
            parse_time(payload["since"], "since")
            if payload.get("since")
            else until - timedelta(seconds=self.settings.window)
        )
        with self.store.read() as conn:
            rows = conn.execute(
                select(jobs.c.id, jobs.c.error, jobs.c.attempt, jobs.c.finished_at)
                .where(
                    jobs.c.type == job_type,
                    jobs.c.status == State.DEAD.value,
                    jobs.c.finished_at > since,
                    jobs.c.finished_at <= until,
                )
                .order_by(jobs.c.id.desc())
            ).all()
        if not rows:
            return None
        base = self.settings.dashboard_url
        latest = rows[0]
        return {
            "event": "jobs.dead",
            "type": job_type,
            "count": len(rows),
            "since": since.isoformat(),
            "until": until.isoformat(),
            "job": {
                "id": latest.id,
                "type": job_type,
                "error": latest.error,
                "attempts": latest.attempt,
                "link": f"{base}/jobs/{latest.id}",
            },
            "job_ids": [r.id for r in rows[:100]],
            "dashboard": f"{base}/jobs?status=dead&type={job_type}",
            "text": f"{len(rows)} {job_type} job(s) dead; latest #{latest.id}: {latest.error}",
        }

    def deliver(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        body = self.message(payload)
        if body is None:
            return {"sent": False, "reason": "no dead jobs left in the window"}
        request = urllib.request.Request(
            self.settings.webhook_url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "User-Agent": "jobdeck-alerts"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"webhook answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RuntimeError(f"webhook unreachable: {getattr(exc, 'reason', exc)}") from None
        return {"sent": True, "status": status, "count": body["count"]}


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
