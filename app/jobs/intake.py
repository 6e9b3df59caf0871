"""The validated way in for new jobs: what the API, the CLI, Python callers,
cron and workflows all enqueue through, and an operator's edit. Checks and
builds a ``NewJob`` (or the plain bulk shape); the store writes it. Needs the
config, the handler registry, the flow limits' keys and the types' unique
rules, no store and no clock: each call is given its ``now``."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from jobdeck.core.config import Config
from jobdeck.core.errors import InvalidField, ItemRefused, JobdeckError, PayloadTooLarge, UnknownType
from jobdeck.core.validation import (
    MAX_QUEUE_CHARS,
    MAX_TYPE_CHARS,
    check_json,
    check_name,
    check_text,
    parse_priority,
    parse_time,
    spellings,
)
from jobdeck.jobs.flow import Flow
from jobdeck.jobs.handlers import Registry
from jobdeck.jobs.payloads import PayloadShape
from jobdeck.jobs.unique import Unique, claim_for, parse_unique
from jobdeck.store import NewJob, backoff_delay
from jobdeck.store.enqueue import PlainJob
from jobdeck.store.lifecycle import JobChanges

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Built once: ``json.dumps`` with options builds an encoder per call. It
refuses NaN and Infinity, which are not JSON and break strict clients."""

MAX_KEY_CHARS = 255
MAX_RETRIES = 1000
"""The most retries a job can ask for."""
MAX_DELAY_SECONDS = 10 * 365 * 86400
"""The latest a job can be delayed to: ten years."""


log = logging.getLogger("jobdeck")


class Intake:
    """Checks what a caller asks to enqueue or edit, naming the field it refuses."""

    def __init__(self, config: Config, registry: Registry, flow: Flow, unique_types: Mapping[str, Unique]) -> None:
        self.config = config
        self.registry = registry
        self.flow = flow
        self.unique_types = unique_types

    def backoff(self, job_type: str, retry_count: int) -> float:
        """The exponential backoff (``jobdeck.store.lifecycle.backoff_delay``) with the base
        and cap from the handler's options or the config."""
        spec = self.registry.get(job_type)
        base = spec.backoff_base if spec and spec.backoff_base is not None else self.config.backoff_base
        cap = spec.backoff_cap if spec and spec.backoff_cap is not None else self.config.backoff_cap
        return backoff_delay(base, cap, retry_count)

    def type_names(self) -> list[str]:
        """Every job type this deployment accepts: registered handlers and
        ``external_types`` (served by HTTP workers)."""
        return sorted(set(self.registry.names()) | set(self.config.external_types))

    def known_type(self, name: str) -> bool:
        """Registered here or an external type, under either spelling (``spellings``)."""
        return any(n in self.registry or n in self.config.external_types for n in spellings(name))

    def warn_unknown_types(self) -> None:
        """A ``[types."X"]`` table whose X no handler here registers and
        ``external_types`` does not list is most likely a typo: its options
        (limits, unique, snoozes, log capture) would silently never apply.
        Said at start-up; not refused, as another process may run that
        type's handler."""
        types = self.config.extra.get("types")
        for name in sorted(types) if isinstance(types, dict) else ():
            if not self.known_type(name):
                log.warning(
                    '[types."%s"]: no handler for this type is registered here and external_types does not list it;'
                    " check the name (known: %s)",
                    name,
                    ", ".join(self.type_names()[:20]) or "none",
                )

    def job_changes(self, data: Mapping[str, Any], job_type: str | None = None) -> JobChanges:
        """Validate an edit like an enqueue: any of ``payload``, ``priority``,
        ``queue`` and ``run_at``, each checked by the rule the enqueue uses
        (a payload also by its type's shape, ``jobdeck.jobs.payloads``, given
        the job's ``job_type``); raise InvalidField (or PayloadTooLarge) naming the field."""
        unknown = sorted(set(data) - set(EDITABLE))
        if unknown:
            raise InvalidField(unknown[0], f"unknown field; an edit sets {', '.join(EDITABLE)}")
        for name, value in data.items():
            if value is None:
                raise InvalidField(name, "leave the field out to keep it; null is no value")
        payload = data.get("payload")
        priority = data.get("priority")
        queue = data.get("queue")
        run_at = data.get("run_at")
        payload_json = None if payload is None else self.payload_json(payload)  # its depth first, as an enqueue
        spec = self.registry.get(job_type) if job_type is not None and payload is not None else None
        if spec is not None and spec.payload_shape is not None:
            spec.payload_shape.check(payload)
        return JobChanges(
            payload_json=payload_json,
            priority=None if priority is None else parse_priority(priority),
            queue=None if queue is None else queue_name(queue),
            available_at=None if run_at is None else parse_time(run_at, "run_at"),
        )

    def plain_shape(self, items: Sequence[Any]) -> bool:
        """Whether ``plain_jobs`` takes every item: each gives a type and a
        payload and nothing else, no type has a unique rule, and no keyed
        flow limit is configured (the keys are computed by ``new_job``).
        Decided before any job is checked, so a call is checked once, by
        one path or the other."""
        if self.flow.keyed_columns:
            return False
        unique: dict[Any, bool] = {}
        for item in items:
            if type(item) is not dict or not _PLAIN.issuperset(item):
                return False
            job_type = item.get("type")
            if self.unique_types and type(job_type) is str:  # any other type is refused by the pass
                if job_type not in unique:
                    unique[job_type] = self._has_unique_rule(job_type)
                if unique[job_type]:
                    return False
        return True

    def _has_unique_rule(self, job_type: str) -> bool:
        try:
            return check_name(job_type, "type", MAX_TYPE_CHARS) in self.unique_types
        except InvalidField:
            return False  # refused by the pass, as new_job refuses it

    def plain_jobs(self, items: Sequence[Mapping[str, Any]], now: datetime) -> list[PlainJob]:
        """The common bulk shape (``plain_shape`` said so) checked in one
        pass, without a ``NewJob`` per item (that cost more than the
        insert): each type is checked, and its defaults found, once by
        ``new_job`` itself, and each payload by ``payload_json`` and its
        type's shape, the checks ``new_job`` makes, in its order. A refused
        job raises ``ItemRefused`` with its index."""
        defaults: dict[str, tuple[str, int, int, PayloadShape | None]] = {}
        jobs: list[PlainJob] = []
        append = jobs.append
        payload_json = self.payload_json
        for i, item in enumerate(items):
            try:
                job_type = item.get("type")
                d = defaults.get(job_type) if type(job_type) is str else None
                if d is None:
                    new = self.new_job(item, now)
                    assert new.unique is None and new.rate_key is None is new.concurrency_key, "not a plain job"
                    spec = self.registry.get(new.type)
                    shape = spec.payload_shape if spec is not None else None
                    d = defaults[new.type] = (new.queue, new.priority, new.max_retries, shape)
                    append((new.type, d[0], new.payload_json or "{}", d[1], d[2]))
                else:
                    append((job_type, d[0], payload_json(item.get("payload")), d[1], d[2]))  # type: ignore[arg-type]
                    if d[3] is not None:
                        d[3].check(item.get("payload"))
            except JobdeckError as exc:
                raise ItemRefused(i, exc) from None
        return jobs

    def payload_json(self, payload: Any) -> str:
        """Check a payload and serialize it: an object (or nothing), valid
        JSON (``check_json``), at most ``max_payload_bytes`` encoded."""
        if payload is None or (not payload and type(payload) is dict):
            return "{}"
        if type(payload) is not dict:
            if not isinstance(payload, dict):
                raise InvalidField("payload", "must be a JSON object")
            check_json(payload, "payload")
        else:
            for key, value in payload.items():  # check_json would pass for certain: skip its walk
                kind = type(value)
                if not (type(key) is str and key.isascii()) or not (
                    kind is int or kind is bool or value is None or (kind is str and value.isascii())
                ):
                    check_json(payload, "payload")
                    break
        try:
            text = _ENCODER.encode(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidField("payload", f"not serializable as JSON: {exc}") from None
        limit = self.config.max_payload_bytes
        # A character is at most 4 bytes in UTF-8: count bytes only near the limit.
        if len(text) * 4 > limit and (size := len(text.encode())) > limit:
            raise PayloadTooLarge(size, limit)
        return text

    def new_job(self, data: Mapping[str, Any], now: datetime) -> NewJob:
        """Validate an enqueue request; raise InvalidField naming the field."""
        if not isinstance(data, Mapping):
            raise InvalidField("body", "expected a JSON object")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise InvalidField(unknown[0], "unknown field")
        job_type = data.get("type")
        if not isinstance(job_type, str) or not job_type.strip():
            raise InvalidField("type", "required, a non-empty string")
        job_type = check_name(job_type, "type", MAX_TYPE_CHARS)
        if not self.known_type(job_type):
            raise UnknownType(job_type)
        spec = self.registry.get(job_type)

        payload = data.get("payload", {})
        payload_json = self.payload_json(payload)
        if payload is None:
            payload = {}
        if spec is not None and spec.payload_shape is not None:
            spec.payload_shape.check(payload)  # a typed payload (``jobdeck.jobs.payloads``)

        priority = parse_priority(data.get("priority"), default=spec.priority if spec and spec.priority else 0)

        max_retries = data.get("max_retries")
        if max_retries is None:
            max_retries = spec.max_retries if spec and spec.max_retries is not None else self.config.default_max_retries
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidField("max_retries", "must be an integer >= 0")
        if max_retries > MAX_RETRIES:
            raise InvalidField("max_retries", f"must be at most {MAX_RETRIES}")

        key = data.get("idempotency_key")
        if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS):
            raise InvalidField("idempotency_key", f"must be a non-empty string of at most {MAX_KEY_CHARS} characters")
        if key is not None:
            check_text(key, "idempotency_key", MAX_KEY_CHARS)

        queue = data.get("queue")
        if queue is None:
            queue = spec.queue if spec and spec.queue else "default"
        queue = queue_name(queue)

        available_at = _available_at(data.get("run_at"), data.get("delay_seconds"), now)
        once = self._unique_of(job_type, data, key)
        unique = None
        if once is not None:
            if once.debounce is not None:
                available_at = max(available_at, now + timedelta(seconds=once.debounce))
            unique = claim_for(once, job_type, queue, payload, now)
        rate_key, concurrency_key = self.flow.keys(job_type, queue, payload)
        return NewJob(
            type=job_type,
            payload=payload,
            queue=queue,
            priority=priority,
            max_retries=max_retries,
            idempotency_key=key,
            available_at=available_at,
            payload_json=payload_json,
            unique=unique,
            rate_key=rate_key,
            concurrency_key=concurrency_key,
        )

    def _unique_of(self, job_type: str, data: Mapping[str, Any], key: str | None) -> Unique | None:
        """The enqueue's own ``unique`` (``false``: none), else the type's.
        An explicit ``idempotency_key`` takes the type's place."""
        if "unique" not in data:
            return None if key is not None else self.unique_types.get(job_type)
        value = data["unique"]
        spec = value if isinstance(value, Unique) else parse_unique(value, "unique")
        if spec is not None and key is not None:
            raise InvalidField("unique", "give unique or idempotency_key, not both")
        return spec


_PLAIN = frozenset({"type", "payload"})
_FIELDS = frozenset(
    {"type", "payload", "priority", "max_retries", "idempotency_key", "unique", "run_at", "delay_seconds", "queue"}
)
"""What an enqueue request may carry (``Intake.new_job``)."""

EDITABLE = ("payload", "priority", "queue", "run_at")
"""What an edit may set (``Intake.job_changes``)."""


def queue_name(value: Any) -> str:
    """A queue name as enqueue and edit accept it (``check_name``: normalized, nothing hidden)."""
    return check_name(value, "queue", MAX_QUEUE_CHARS)


def _available_at(run_at: Any, delay: Any, now: datetime) -> datetime:
    if run_at is not None and delay is not None:
        raise InvalidField("run_at", "give run_at or delay_seconds, not both")
    if run_at is not None:
        return parse_time(run_at, "run_at")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
            raise InvalidField("delay_seconds", "must be a finite number >= 0")
        if delay > MAX_DELAY_SECONDS:
            raise InvalidField("delay_seconds", f"must be at most ten years ({MAX_DELAY_SECONDS} seconds)")
        return now + timedelta(seconds=delay)
    return now
