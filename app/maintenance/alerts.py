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
at the end of the window, with their count. The slot is chosen by
compare-and-set on the type's watermark (``jobdeck.store.alerts.claim_alert_slot``),
so of several processes planning at once one wins each slot, and the alert
job is keyed ``alert:<type>:<slot>``. The slot and the job are two
transactions: a process that dies between them loses that one message (the
jobs are still dead on the dashboard, and the ERROR log has each of them).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.config import Config, ConfigError
from jobdeck.core.validation import parse_time
from jobdeck.jobs.handlers import JobContext
from jobdeck.store import JobRecord, NewJob
from jobdeck.store.alerts import claim_alert_slot, dead_between

if TYPE_CHECKING:
    from jobdeck.core.clock import Clock
    from jobdeck.jobs.handlers import Registry
    from jobdeck.store import Store

log = logging.getLogger("jobdeck.alerts")

ALERT_TYPE = "jobdeck.alert"
ALERT_QUEUE = "jobdeck"


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
        if key == "thresholds":
            continue  # [alerts.thresholds]: jobdeck.maintenance.thresholds
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


Superseded = Callable[[dict[str, Any]], "str | None"]
"""Why an alert job's message is no longer the newest, or None to send it."""


def never_superseded(payload: dict[str, Any]) -> str | None:
    return None


class Alerts:
    """The dead-letter alerts of one store: the store's dead listener plans
    them, the ``jobdeck.alert`` handler (registered when a webhook is set)
    delivers them. ``superseded`` lets a message planned elsewhere (schedule
    health) be dropped when a newer one exists."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        registry: Registry,
        settings: AlertSettings,
        superseded: Superseded = never_superseded,
    ) -> None:
        self.store = store
        self.clock = clock
        self.registry = registry
        self.settings = settings
        self.superseded = superseded

    def install(self) -> None:
        self.store.on_dead(self.on_dead)
        if self.settings.webhook_url:
            s = self.settings
            self.registry.handler(
                ALERT_TYPE, max_retries=s.max_retries, timeout=s.timeout * 2, queue=ALERT_QUEUE,
                backoff_base=s.backoff_base,
            )(self.deliver)  # fmt: skip

    # -- on dead ----------------------------------------------------------------

    def on_dead(self, dead: list[JobRecord]) -> None:
        """The store's dead listener. Never raises: it runs in the acker and
        the sweeper, which must not stop over an alert."""
        for job in dead:
            log.error(
                "job %s (%s) is dead after %d attempt(s): %s", job.id, job.type, job.attempt, job.error or "no error",
                extra={"event": "job.dead", "job_id": job.id, "job_type": job.type, "attempts": job.attempt},
            )  # fmt: skip
        if not self.settings.webhook_url:
            return
        latest: dict[str, datetime] = {}
        for job in dead:
            if job.type == ALERT_TYPE:
                continue  # an undeliverable alert is logged, not alerted about
            t = job.finished_at or self.clock()
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

        def slot_for(last: datetime | None) -> datetime | None:
            if last is not None and last >= t:
                return None
            return t if last is None or t >= last + window else last + window

        claimed = claim_alert_slot(self.store, job_type, slot_for)
        if claimed is None:
            return None
        last, slot = claimed
        new = NewJob(
            type=ALERT_TYPE,
            payload={"type": job_type, "since": last.isoformat() if last else None, "until": slot.isoformat()},
            queue=ALERT_QUEUE,
            priority=20,
            max_retries=self.settings.max_retries,
            idempotency_key=f"alert:{job_type}:{_stamp(slot)}",
            available_at=slot,
        )
        self.store.enqueue(new, self.clock())
        return slot

    # -- delivery (the jobdeck.alert handler) -------------------------------------

    def message(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The JSON body for one alert slot, or None when no job of the type
        is still dead in it (a person retried them meanwhile). An alert
        planned whole elsewhere (schedule health) carries its ``body``."""
        if isinstance(payload.get("body"), dict):
            return dict(payload["body"])
        job_type = str(payload["type"])
        until = parse_time(payload["until"], "until")
        since = (
            parse_time(payload["since"], "since")
            if payload.get("since")
            else until - timedelta(seconds=self.settings.window)
        )
        rows = dead_between(self.store, job_type, since, until)
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
        stale = self.superseded(payload)  # a newer schedule health message exists
        if stale is not None:
            return {"sent": False, "reason": stale}
        body = self.message(payload)
        if body is None:
            return {"sent": False, "reason": "no dead jobs left in the window"}
        return {"sent": True, "status": self.post(body), "count": body.get("count", 1)}

    def post(self, body: dict[str, Any]) -> int:
        """``post_webhook`` with these settings."""
        return post_webhook(self.settings, body)


def post_webhook(settings: AlertSettings, body: dict[str, Any]) -> int:
    """POST ``body`` as JSON to the webhook; its HTTP status, or a
    RuntimeError (the alert job then retries with backoff)."""
    request = urllib.request.Request(
        settings.webhook_url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "jobdeck-alerts"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"webhook answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"webhook unreachable: {getattr(exc, 'reason', exc)}") from None
    return int(status)


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
