"""Flow control at claim time: rate limits and concurrency per key.

Config, beside the global ``concurrency`` of ``jobdeck.jobs.queues``::

    [types."api.sync"]
    rate = "100/60s"                    # at most 100 starts per 60 s (also "10/1s", "5/1m", "2/1h")
    rate_key = "payload.account_id"     # ... per account instead of for the whole type

    [queues.billing]
    concurrency = 1
    concurrency_key = "payload.customer_id"   # at most 1 running job per customer

Every limit holds across all processes on one database: it is checked in
the claim's serialized write transaction (``BEGIN IMMEDIATE`` on SQLite, a
transaction advisory lock on PostgreSQL, as for ``jobdeck.jobs.queues``). A job over
a limit is simply not claimed yet; nothing is rescheduled.

**Keys.** A key is computed at enqueue time from the payload and stored on
the job (``jobs.rate_key``, ``jobs.concurrency_key``) as canonical JSON, so
``7`` and ``"7"`` are different keys and nested objects compare by value;
an encoding longer than ``MAX_KEY_CHARS`` is stored as its SHA-256. A job
whose payload lacks the field (or holds null) gets the key ``null``: all
such jobs share one bucket, so a limit is never exceeded by them. One job
has one key of each kind: when both its type and its queue set a key path,
the type's wins and the queue's limit counts the job under it.

**Rate algorithm: a sliding window log.** Each start of a rate-limited job
is a row in ``flow_starts`` (limit, key, time); a claim counts the rows of
the last window and claims at most what is left. Precision: exact, to the
microsecond, in the claimers' clocks, for the claims. The handlers start a
little after their claims (the pool's hand-off: milliseconds, more on a
machine short of CPU), so the window is widened by ``START_SLACK``
(0.25 s): the attempts' start times show at most N in any window as long
as no handler starts more than that after its claim. The cost is that a
saturated limit runs a little under N per window (20/1s gives about 16/s;
100/60s loses under half a percent). Across hosts, clock skew adds to the
error.
Rows older than the window are pruned by the claims themselves.

``ctx.rate_limited(seconds)`` (a downstream answered 429) closes the job's
rate limits (for its key, if keyed; its type if it has no rate limit) for
every process until now + seconds (``flow_closed``), then raises
``RateLimited``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobdeck.core.config import Config, ConfigError
from jobdeck.jobs.snooze import Snooze

MAX_KEY_CHARS = 200
"""A key encoding longer than this is stored as ``sha256:<hex>``."""
START_SLACK = 0.25
"""Seconds added to each rate window (see the module doc)."""
NO_KEY = ""
"""The key of an unkeyed limit in ``flow_starts`` and ``flow_closed``."""
MAX_RATE_COUNT = 1_000_000
MAX_WINDOW_SECONDS = 7 * 24 * 3600

_UNITS = {"s": 1, "m": 60, "h": 3600}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)?\s*([smh])\s*$")
_PATH = re.compile(r"^payload(\.[A-Za-z0-9_-]{1,100}){1,8}$")
_OPTIONS = ("rate", "rate_key", "concurrency_key")


class RateLimited(Snooze):  # noqa: N818  (a Snooze, named for what happened)
    """Raised by ``ctx.rate_limited(seconds)`` once the job's limit is closed
    for ``seconds``: a snooze for as long, so the job runs again when the
    limit reopens without counting a retry (and within ``max_snoozes``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds, "rate limited by the handler")


@dataclass(frozen=True)
class Rate:
    count: int
    window: float
    """Seconds."""
    text: str

    @property
    def window_text(self) -> str:
        return f"{self.window:g} s"


@dataclass(frozen=True)
class FlowLimit:
    """The flow options of one ``[queues.NAME]`` or ``[types."T"]`` table."""

    scope: str
    """``queue`` or ``type``."""
    name: str
    rate: Rate | None = None
    rate_key: str | None = None
    """A ``payload.<path>``: the rate is per key."""
    concurrency: int | None = None
    """Set only with ``concurrency_key``: running jobs per key (the global
    ``concurrency`` stays in ``Limits``)."""
    concurrency_key: str | None = None

    ident: str = field(init=False)
    """The limit's name in ``flow_starts`` and ``flow_closed``: ``type:T`` or ``queue:Q``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ident", f"{self.scope}:{self.name}")

    def applies(self, job_type: str, queue: str) -> bool:
        return self.name == (job_type if self.scope == "type" else queue)


@dataclass(frozen=True)
class Limits:
    """The global ``concurrency`` of queues and types (``jobdeck.jobs.queues``),
    which the flow claim counts beside its own limits (``jobdeck.jobs.flow_claim``)."""

    queues: dict[str, int]
    types: dict[str, int]

    def __bool__(self) -> bool:
        return bool(self.queues or self.types)


def parse_rate(value: Any, where: str) -> Rate:
    """``"N/Ws"``, ``"N/Wm"``, ``"N/Wh"`` (W defaults to 1): at most N starts per W."""
    found = _RATE.match(value) if isinstance(value, str) else None
    if found is None:
        raise ConfigError(f'{where}: expected "COUNT/WINDOW" like "100/60s", "5/1m" or "10/1h", got {value!r}')
    count, span = int(found.group(1)), int(found.group(2) or 1)
    window = span * _UNITS[found.group(3)]
    if count < 1 or count > MAX_RATE_COUNT:
        raise ConfigError(f"{where}: the count must be between 1 and {MAX_RATE_COUNT}, got {count}")
    if span < 1 or window > MAX_WINDOW_SECONDS:
        raise ConfigError(f"{where}: the window must be between 1 s and 7 days, got {value!r}")
    return Rate(count, float(window), value.strip())


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _PATH.match(value):
        raise ConfigError(f'{where}: expected "payload.<field>" (like "payload.account_id"), got {value!r}')
    return value


def parse_flow(config: Config) -> list[FlowLimit]:
    """The flow limits of ``[queues.*]`` and ``[types.*]``; a ``ConfigError``
    naming the key for every bad value."""
    limits: list[FlowLimit] = []
    for table, scope in (("queues", "queue"), ("types", "type")):
        section = config.extra.get(table, {})
        if not isinstance(section, dict):
            raise ConfigError(f"{table}: expected a table of {scope} names")
        for name, options in section.items():
            if not isinstance(options, dict):
                raise ConfigError(f"{table}.{name}: expected a table")
            if not any(o in options for o in _OPTIONS):
                continue
            where = f"{table}.{name}"
            rate = parse_rate(options["rate"], f"{where}.rate") if "rate" in options else None
            rate_key = _path(options["rate_key"], f"{where}.rate_key") if "rate_key" in options else None
            if rate_key is not None and rate is None:
                raise ConfigError(f'{where}.rate_key: needs a rate in the same table (like rate = "100/60s")')
            concurrency_key = None
            concurrency = None
            if "concurrency_key" in options:
                concurrency_key = _path(options["concurrency_key"], f"{where}.concurrency_key")
                if "concurrency" not in options:
                    raise ConfigError(f"{where}.concurrency_key: needs a concurrency in the same table (like 1)")
                concurrency = options["concurrency"]  # checked by jobdeck.jobs.queues.parse_limits
            limits.append(FlowLimit(scope, name, rate, rate_key, concurrency, concurrency_key))
    return limits


def encode_key(payload: Mapping[str, Any] | None, path: str) -> str:
    """The stored key of ``payload`` under ``path`` (see the module doc)."""
    value: Any = payload
    for part in path.split(".")[1:]:
        value = value.get(part) if isinstance(value, Mapping) else None
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(repr(value))
    if len(text) > MAX_KEY_CHARS:
        return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text


def shown_key(key: str | None) -> str:
    """A stored key as a person reads it: a string without its quotes."""
    if key is None:
        return "null"
    try:
        value = json.loads(key)
    except ValueError:
        return key
    return value if isinstance(value, str) else key


@dataclass
class Flow:
    """The flow limits of a deployment, with the lookups the enqueue and the claim need."""

    limits: list[FlowLimit] = field(default_factory=list)
    _for_job: dict[tuple[str, str], list[FlowLimit]] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return bool(self.limits)

    def of(self, scope: str, name: str) -> FlowLimit | None:
        for limit in self.limits:
            if limit.scope == scope and limit.name == name:
                return limit
        return None

    def for_job(self, job_type: str, queue: str) -> list[FlowLimit]:
        """The type's limit first, then the queue's (cached: the claim asks per candidate)."""
        found = self._for_job.get((job_type, queue))
        if found is None:
            found = [f for f in (self.of("type", job_type), self.of("queue", queue)) if f is not None]
            if len(self._for_job) < 10_000:
                self._for_job[(job_type, queue)] = found
        return found

    def keys(self, job_type: str, queue: str, payload: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
        """(rate_key, concurrency_key) to store on a new job: the type's path first, then the queue's."""
        rate_key = concurrency_key = None
        for limit in self.for_job(job_type, queue):
            if rate_key is None and limit.rate_key:
                rate_key = encode_key(payload, limit.rate_key)
            if concurrency_key is None and limit.concurrency_key:
                concurrency_key = encode_key(payload, limit.concurrency_key)
        return rate_key, concurrency_key

    @property
    def rated(self) -> list[FlowLimit]:
        return [f for f in self.limits if f.rate is not None]

    @property
    def keyed_columns(self) -> list[str]:
        """The job columns whose keys the claim scans key by key."""
        cols = []
        if any(f.rate_key for f in self.limits):
            cols.append("rate_key")
        if any(f.concurrency_key for f in self.limits):
            cols.append("concurrency_key")
        return cols
