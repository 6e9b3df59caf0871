"""Unique jobs: at most one job per key while it is in the chosen states,
for a period.

Config, per type (``[types."T"] unique``), or per enqueue (``unique`` in
the ``POST /api/jobs`` body, ``deck.enqueue(..., unique=...)``), same shape::

    [types."report.build"]
    unique = { by = ["type", "payload.order_id"], period = 3600,
               states = ["pending", "scheduled", "running", "failed"],
               on_duplicate = "replace", debounce = 30 }

The enqueue computes the job's unique key from the ``by`` fields and stores
it on the row with the job's states and the end of its period; a UNIQUE
index on the key decides between racing enqueues in any process. A row keeps
its key until a later enqueue of the same key finds the holder no longer
holding it (outside its states, or past its period) and frees it in the
same transaction as its own insert (``jobdeck.store.unique``): the holder's
state changes (claim, completion, death, a retry, time passing a scheduled
job's run-at) then cost the transitions nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobdeck.core.config import Config, ConfigError
from jobdeck.core.errors import InvalidField
from jobdeck.core.states import SCHEDULED, State
from jobdeck.core.uniqueness import STATE_BITS as STATE_BITS  # named here by the API's schema too
from jobdeck.core.uniqueness import UniqueClaim

DEFAULT_BY = ("type", "queue", "payload")
DEFAULT_STATES = (State.PENDING.value, SCHEDULED, State.RUNNING.value, State.FAILED.value)
"""Waiting, scheduled, running or waiting for a retry: until it is done, dead, discarded or cancelled."""
ON_DUPLICATE = ("keep", "replace")
OPTIONS = ("by", "period", "states", "on_duplicate", "debounce")
MAX_BY = 10
MAX_PATH_SEGMENTS = 8
MAX_SECONDS = 10 * 365 * 86400
"""The longest period or debounce: ten years."""
MAX_READABLE_KEY = 200
"""A key longer than this is stored as its SHA-256 (the column holds 255)."""

_SEGMENT = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclass(frozen=True)
class Unique:
    """A validated ``unique`` option."""

    by: tuple[str, ...] = DEFAULT_BY
    period: float | None = None
    """Seconds from the enqueue the key is held; None: as long as the job is in ``states``."""
    states: frozenset[str] = frozenset(DEFAULT_STATES)
    replace: bool = False
    """``on_duplicate = "replace"``: a duplicate gives a kept job that has not started its payload and run-at."""
    debounce: float | None = None
    """Seconds: each enqueue (first or duplicate) runs the kept job this long after it, if not started."""

    @property
    def mask(self) -> int:
        return sum(STATE_BITS[s] for s in self.states)


def parse_unique(value: Any, field: str, error: type[Exception] = InvalidField) -> Unique | None:
    """``true`` (the defaults), ``false`` (none) or a table of ``OPTIONS``.
    ``error`` is ``ConfigError`` for the config file (named by ``field``),
    ``InvalidField`` (422) for a request."""

    def bad(where: str, why: str) -> Exception:
        if error is ConfigError:
            return ConfigError(f"{where}: {why}")
        return InvalidField(where, why)

    if value is True:
        return Unique()
    if value is False or value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad(field, f"expected a table of {', '.join(OPTIONS)} (or true), got {_short(value)}")
    unknown = sorted(str(k) for k in value if k not in OPTIONS)
    if unknown:
        raise bad(f"{field}.{unknown[0][:64]}", f"unknown option; unique takes {', '.join(OPTIONS)}")
    by = _by(value.get("by", list(DEFAULT_BY)), lambda why: bad(f"{field}.by", why))
    states = value.get("states", list(DEFAULT_STATES))
    if not isinstance(states, list) or not states or not all(isinstance(s, str) for s in states):
        raise bad(f"{field}.states", f"expected a non-empty list of {', '.join(STATE_BITS)}")
    wrong = [s for s in states if s not in STATE_BITS]
    if wrong:
        raise bad(f"{field}.states", f"{_short(wrong[0])} is not one of {', '.join(STATE_BITS)}")
    on_duplicate = value.get("on_duplicate", "keep")
    if on_duplicate not in ON_DUPLICATE:
        raise bad(f"{field}.on_duplicate", f'must be "keep" or "replace", got {_short(on_duplicate)}')
    debounce = _seconds(value.get("debounce"), lambda why: bad(f"{field}.debounce", why))
    if debounce is not None and SCHEDULED not in states:
        raise bad(f"{field}.debounce", 'a debounced job is scheduled: add "scheduled" to states')
    if on_duplicate == "replace" and not {State.PENDING.value, SCHEDULED} & set(states):
        raise bad(
            f"{field}.on_duplicate", 'replace changes a job not yet started: add "pending" or "scheduled" to states'
        )
    return Unique(
        by=by,
        period=_seconds(value.get("period"), lambda why: bad(f"{field}.period", why)),
        states=frozenset(states),
        replace=on_duplicate == "replace",
        debounce=debounce,
    )


def _by(value: Any, bad: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or len(value) > MAX_BY:
        raise bad(f"expected a list of 1 to {MAX_BY} fields: type, queue, payload or payload.<path>")
    seen: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise bad(f"{_short(item)} is not a field name")
        if item not in ("type", "queue", "payload"):
            head, _, path = item.partition(".")
            segments = path.split(".")
            if head != "payload" or not path or len(segments) > MAX_PATH_SEGMENTS:
                raise bad(f"{_short(item)} is not type, queue, payload or payload.<path>")
            if not all(_SEGMENT.fullmatch(s) for s in segments):
                raise bad(f"{_short(item)}: each path segment is 1-64 of A-Z a-z 0-9 _ -")
        if item in seen:
            raise bad(f"{_short(item)} is named twice")
        seen.append(item)
    return tuple(seen)


def _seconds(value: Any, bad: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise bad(f"must be a number of seconds > 0, got {_short(value)}")
    if value > MAX_SECONDS:
        raise bad(f"must be at most ten years ({MAX_SECONDS} seconds)")
    return float(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_unique_types(config: Config) -> dict[str, Unique]:
    """``[types."T"] unique`` of every type; ConfigError names the key."""
    types = config.extra.get("types")
    found: dict[str, Unique] = {}
    if not isinstance(types, dict):
        return found  # the queue controls name a malformed [types] table
    for job_type, options in types.items():
        if isinstance(options, dict) and "unique" in options:
            spec = parse_unique(options["unique"], f"types.{job_type}.unique", ConfigError)
            if spec is not None:
                found[job_type] = spec
    return found


def unique_key(spec: Unique, job_type: str, queue: str, payload: Mapping[str, Any]) -> str:
    """The key of a job: its ``by`` fields and their values as canonical
    JSON (``{"payload.order_id":42,"type":"report.build"}``), or
    ``sha256:<hex>`` of that when longer than ``MAX_READABLE_KEY``. A path
    the payload lacks, or whose value is an object or a list, is refused.

    The type is always part of the key, listed in ``by`` or not: a
    duplicate of one type must never be answered with, or replace the
    payload of, another type's job. Numbers are compared by value (``1``,
    ``1.0`` and ``-0.0`` vs ``0`` make one key), as JSON from another
    language may write them either way."""
    fields: dict[str, Any] = {"type": job_type}
    for name in spec.by:
        if name == "queue":
            fields[name] = queue
        elif name == "payload":
            fields[name] = _by_value(dict(payload))
        elif name != "type":
            fields[name] = _by_value(_at(payload, name))
    text = _ENCODER.encode(fields)
    if len(text) > MAX_READABLE_KEY:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def _by_value(value: Any) -> Any:
    """``value`` with every integral float written as an integer (``1.0`` is
    ``1``, ``-0.0`` is ``0``), so numerically equal payloads make one key."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    return value


def _at(payload: Mapping[str, Any], path: str) -> Any:
    value: Any = payload
    for segment in path.split(".")[1:]:
        if not isinstance(value, Mapping) or segment not in value:
            raise InvalidField("unique", f"by names {path}, which this payload lacks")
        value = value[segment]
    if isinstance(value, (dict, list)):
        raise InvalidField("unique", f"{path} must be a string, number, boolean or null to be part of a unique key")
    return value


def claim_for(spec: Unique, job_type: str, queue: str, payload: Mapping[str, Any], now: datetime) -> UniqueClaim:
    until = None if spec.period is None else now + timedelta(seconds=spec.period)
    return UniqueClaim(unique_key(spec, job_type, queue, payload), until, spec.mask, spec.replace, spec.debounce)
