"""Threshold alerts, with recovery: a queue waiting too long, a job type
failing too often, a queue with no live worker.

Config (all optional; each key present turns its check on)::

    [alerts.thresholds]
    queue_latency = 300          # seconds the next due job of a queue may wait (paused queues aside)
    failure_rate = 20            # percent of a type's finished attempts that failed ...
    failure_window = 900         # ... over the last this many seconds (default 900) ...
    failure_min_runs = 10        # ... once at least this many finished in it (default 10)
    no_live_workers = ["default", "reports"]   # queues that must always have a live worker pool

``check_once(now)`` (every 15 s in the scheduler) measures each one from the
same reads as ``GET /metrics`` (``jobdeck.store.metrics``; the failure rate from
the per-minute counters, so minutes the roll-up has not closed yet are not
in it). An alert is firing from the check that finds its threshold crossed
until the first check that finds it clear; each start and each recovery is
sent once, whatever the number of processes checking: the move between
firing and clear is a compare-and-set in ``threshold_alerts``
(``jobdeck.store.thresholds.move_threshold``), and only its winner sends. Each
is logged (WARNING when it starts, INFO when it clears) and, with
``[alerts] webhook_url``, posted as JSON by a ``jobdeck.threshold`` job on
the ``jobdeck`` queue, retried with backoff like the dead-letter alerts. A
burst needs no window here: an alert that stays crossed sends nothing more.
As with the dead-letter alerts, the move and the job are two transactions.

Each message is its own job with its own retries, so while the webhook is
down a start and a recovery could otherwise arrive in any order. The job
therefore checks, when it runs, that its move is still the alert's latest
(the row's ``firing`` and ``changed_at`` are the message's ``event`` and
``at``); a message superseded by a later move is not sent, and its job
completes with ``{"sent": false, "reason": "superseded by ..."}``. The
latest move's message is sent (retried like any alert), so the receiver's
last message about an alert says what the alert is now.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobdeck.core.config import Config, ConfigError
from jobdeck.core.validation import stored_time
from jobdeck.jobs.handlers import JobContext
from jobdeck.maintenance.alerts import ALERT_QUEUE, AlertSettings, _stamp, post_webhook
from jobdeck.store import NewJob
from jobdeck.store.metrics import due_queues, live_workers, paused_queues, queue_latencies
from jobdeck.store.thresholds import move_threshold, stored_key, threshold_state, threshold_states
from jobdeck.store.upkeep import type_health

if TYPE_CHECKING:
    from jobdeck.core.clock import Clock
    from jobdeck.jobs.handlers import Registry
    from jobdeck.store import Store

log = logging.getLogger("jobdeck.alerts")

THRESHOLD_TYPE = "jobdeck.threshold"
QUEUE_LATENCY = "queue_latency"
FAILURE_RATE = "failure_rate"
NO_LIVE_WORKERS = "no_live_workers"
MAX_QUEUES = 1000


@dataclass(frozen=True)
class ThresholdSettings:
    queue_latency: float | None = None
    failure_rate: float | None = None
    """Percent, 0 < x <= 100."""
    failure_window: float = 900.0
    failure_min_runs: int = 10
    no_live_workers: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return self.queue_latency is not None or self.failure_rate is not None or bool(self.no_live_workers)


def parse_thresholds(config: Config) -> ThresholdSettings:
    alerts = config.extra.get("alerts", {})
    raw = alerts.get("thresholds", {}) if isinstance(alerts, dict) else {}
    if not isinstance(raw, dict):
        raise ConfigError("alerts.thresholds: expected a table ([alerts.thresholds])")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"alerts.thresholds.{key}"
        if key not in ThresholdSettings.__dataclass_fields__:
            raise ConfigError(f"{where}: unknown key (queue_latency, failure_rate, failure_window, "
                              "failure_min_runs, no_live_workers)")  # fmt: skip
        if key == NO_LIVE_WORKERS:
            if not isinstance(value, list) or not value or len(value) > MAX_QUEUES:
                raise ConfigError(f"{where}: expected a list of 1 to {MAX_QUEUES} queue names, got {value!r}")
            for name in value:
                if not isinstance(name, str) or not name or len(name) > 100 or "\x00" in name:
                    raise ConfigError(f"{where}: {name!r} is not a queue name (1 to 100 characters, no NUL)")
            values[key] = tuple(dict.fromkeys(value))
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= 0:
            raise ConfigError(f"{where}: must be a number > 0, got {value!r}")
        if key == FAILURE_RATE and value > 100:
            raise ConfigError(f"{where}: a percentage, at most 100, got {value!r}")
        if key == "failure_window" and (value < 60 or value > 30 * 86400):
            raise ConfigError(f"{where}: seconds from 60 (one minute of counters) to 30 days, got {value!r}")
        if key == "failure_min_runs":
            if not isinstance(value, int):
                raise ConfigError(f"{where}: must be an integer >= 1, got {value!r}")
            values[key] = value
            continue
        values[key] = float(value)
    return ThresholdSettings(**values)


@dataclass(frozen=True)
class Breach:
    key: str
    kind: str
    subject: dict[str, str]
    value: float
    threshold: float
    text: str


class ThresholdAlerts:
    """The thresholds over one store: the check, and the webhook job.
    ``stall_timeout`` says which worker pools are still alive."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        registry: Registry,
        settings: ThresholdSettings,
        alerts: AlertSettings,
        stall_timeout: float,
    ) -> None:
        self.store = store
        self.clock = clock
        self.registry = registry
        self.settings = settings
        self.alerts = alerts
        self.stall_timeout = stall_timeout

    def install(self) -> None:
        if self.settings.any and self.alerts.webhook_url:
            a = self.alerts
            self.registry.handler(
                THRESHOLD_TYPE, max_retries=a.max_retries, timeout=a.timeout * 2, queue=ALERT_QUEUE,
                backoff_base=a.backoff_base,
            )(self.deliver)  # fmt: skip

    # -- the check ----------------------------------------------------------------

    def breaches(self, now: datetime) -> dict[str, Breach]:
        """Every threshold crossed now, by key (``<kind>:<subject>``)."""
        s = self.settings
        found: list[Breach] = []
        if s.queue_latency is not None:
            paused = paused_queues(self.store)
            queues = [q for q in due_queues(self.store, now) if q not in paused]
            for queue, seconds in queue_latencies(self.store, now, queues).items():
                if seconds > s.queue_latency:
                    found.append(Breach(f"{QUEUE_LATENCY}:{queue}", QUEUE_LATENCY, {"queue": queue}, seconds,
                                        s.queue_latency, f"queue {queue}: the next job has waited {seconds:.0f} s "
                                        f"(threshold {s.queue_latency:g} s)"))  # fmt: skip
        if s.failure_rate is not None:
            for h in type_health(self.store, now, timedelta(seconds=s.failure_window)):
                rate = h.failure_rate
                if h.type.startswith("jobdeck.") or rate is None or h.completed + h.failed < s.failure_min_runs:
                    continue  # the alerts' own jobs are not alerted about (a broken webhook would loop)
                if rate * 100 > s.failure_rate:
                    found.append(Breach(f"{FAILURE_RATE}:{h.type}", FAILURE_RATE, {"type": h.type}, rate * 100,
                                        s.failure_rate, f"{h.type}: {rate * 100:.0f}% of {h.completed + h.failed} "
                                        f"attempts failed in {s.failure_window:g} s (threshold {s.failure_rate:g}%)"))  # fmt: skip
        if s.no_live_workers:
            pools = live_workers(self.store, now, self.stall_timeout)
            for queue in s.no_live_workers:
                if not any(p.serves(queue) for p in pools):
                    found.append(Breach(f"{NO_LIVE_WORKERS}:{queue}", NO_LIVE_WORKERS, {"queue": queue}, 0.0, 1.0,
                                        f"queue {queue}: no live worker pool claims from it"))  # fmt: skip
        return {stored_key(b.key): b for b in found}

    def check_once(self, now: datetime) -> list[tuple[str, bool]]:
        """Start the alerts newly crossed and recover those clear again;
        returns the (key, firing) moves this process won (and sent)."""
        if not self.settings.any and not self._any_firing():
            return []
        crossed = self.breaches(now)
        states = threshold_states(self.store)
        moves: list[tuple[str, bool]] = []
        for key, breach in crossed.items():
            state = states.get(key)
            if (state is None or not state.firing) and move_threshold(self.store, key, True, now, breach.value):
                self._send(breach, True, now, since=now)
                moves.append((key, True))
        for key, state in states.items():
            if state.firing and key not in crossed and move_threshold(self.store, key, False, now, None):
                self._send(_cleared(key), False, now, since=state.changed_at)
                moves.append((key, False))
        return moves

    def _any_firing(self) -> bool:
        return any(s.firing for s in threshold_states(self.store).values())

    def _send(self, breach: Breach, firing: bool, now: datetime, since: datetime) -> None:
        event = "threshold.firing" if firing else "threshold.recovered"
        text = breach.text if firing else f"recovered: {breach.text}"
        names = {"type": "job_type"}  # the log field every other Jobdeck line uses for a type
        fields = {"alert": breach.kind, "event": event, **{names.get(k, k): v for k, v in breach.subject.items()}}
        if firing:
            log.warning("threshold alert %s: %s", breach.key, text, extra=fields)
        else:
            log.info("threshold alert %s: %s", breach.key, text, extra=fields)
        if not self.alerts.webhook_url or THRESHOLD_TYPE not in self.registry:
            return
        body = {
            "event": event,
            "alert": breach.kind,
            **breach.subject,
            "value": breach.value if firing else None,
            "threshold": breach.threshold if firing else None,
            "since": since.isoformat(),
            "at": now.isoformat(),
            "text": text,
            "dashboard": self.alerts.dashboard_url,
        }
        new = NewJob(
            type=THRESHOLD_TYPE,
            payload=body,
            queue=ALERT_QUEUE,
            priority=20,
            max_retries=self.alerts.max_retries,
            idempotency_key=f"threshold:{'firing' if firing else 'recovered'}:{_stamp(now)}:{_short(breach.key)}",
            available_at=now,
        )
        self.store.enqueue(new, self.clock())

    # -- delivery (the jobdeck.threshold handler) -------------------------------------

    def deliver(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        stale = self.superseded(payload)
        if stale is not None:
            return {"sent": False, "reason": stale, "event": payload.get("event")}
        status = post_webhook(self.alerts, payload)
        return {"sent": True, "status": status, "event": payload.get("event")}

    def superseded(self, body: dict[str, Any]) -> str | None:
        """Why message ``body`` is no longer its alert's latest move, or None
        to send it. The move is in the row: the message is current while the
        row still says what it says (firing or clear) since the same ``at``."""
        kind = body.get("alert")
        subject = body.get("type" if kind == FAILURE_RATE else "queue")
        at = stored_time(body.get("at"))
        if not _name(kind) or not _name(subject) or at is None:
            return None  # not a message this module wrote: nothing to compare, send it
        state = threshold_state(self.store, f"{kind}:{subject}")
        if state is None:
            return None
        firing = body.get("event") == "threshold.firing"
        if state.firing == firing and state.changed_at == at:
            return None
        now = "threshold.firing" if state.firing else "threshold.recovered"
        return f"superseded by {now} at {state.changed_at.isoformat()}"


def _name(text: Any) -> bool:
    return isinstance(text, str) and 0 < len(text) <= 10_000 and "\x00" not in text


def _short(key: str) -> str:
    return key if len(key) <= 200 else hashlib.sha256(key.encode()).hexdigest()


def _cleared(key: str) -> Breach:
    kind, _, subject = key.partition(":")
    name = "type" if kind == FAILURE_RATE else "queue"
    return Breach(key, kind, {name: subject}, 0.0, 0.0, f"{kind.replace('_', ' ')} of {name} {subject}")
