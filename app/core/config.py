"""Configuration: a TOML file plus environment overrides, validated at start.

The file is ``$JOBDECK_CONFIG`` or ``./jobdeck.toml`` when present. Each common
key can be overridden by ``JOBDECK_<KEY>`` in the environment. An invalid value
refuses to start with a message naming the key and what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobdeck.core.errors import InvalidField
from jobdeck.core.loglines import LogLimits, limits_from
from jobdeck.core.validation import MAX_QUEUE_CHARS, MAX_TYPE_CHARS, check_name


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


@dataclass
class Config:
    database_url: str = ""
    """SQLAlchemy URL. Default: SQLite at ``<instance_path>/jobdeck.db``."""
    instance_path: str = "instance"
    bind: str = "127.0.0.1:8000"
    workers: int = 4
    """Embedded worker threads; 0 runs the web process and API only."""
    http_server: str = "granian"
    """The HTTP server ``jobdeck serve`` runs: ``granian`` (HTTP in Rust,
    the app in one worker process it supervises: ``jobdeck.web.granian_server``)
    or ``waitress``, the pure-Python fallback, in this process
    (``jobdeck.web.server``). granian is the default because it answered more of
    everything in scenario 3 of the benchmark, run beside waitress and
    gunicorn (POST /api/jobs 790 against 606 req/s with the pool on, p99 30
    against 56 ms; health 4,443 against 2,439), and both pass the crash
    matrix, the idle-connection and the signal tests alike. Choose waitress
    where granian's wheel does not install, or to keep one process."""
    http_threads: int = 16
    """Threads answering HTTP requests (the WSGI calls). An idle connection
    holds no thread; only requests being answered do. Concurrent enqueues
    share one commit (group commit), so more threads make bigger batches:
    16 enqueued about a quarter more per second than 8 (bench scenario 3)."""
    http_connection_limit: int = 2000
    """Open HTTP connections the server holds before it stops accepting
    more. waitress's own default (100) let about 100 idle connections make
    the server unreachable; idle connections cost a file descriptor and a
    few kilobytes each. ``jobdeck serve`` raises the process's soft
    file-descriptor limit to fit, up to the hard limit (``ulimit -Hn``), and
    lowers this value, with a warning, when even the hard limit is short."""
    http_channel_timeout: float = 30.0
    """Seconds an HTTP connection may sit idle (no request in progress)
    before the server closes it (waitress's default: 120). Checked every
    ``http_channel_timeout / 2`` seconds, at most every 30."""
    http_body_timeout: float = 30.0
    """Seconds a request's body may take to arrive once its headers have
    (waitress: the whole request, from its first byte). A slower request is
    answered 408 and its connection closed. A body being received holds no
    thread on either server, so slow clients cannot take the threads the
    others need; this bounds how long each holds a connection."""
    sqlite_synchronous: str = "FULL"
    """FULL: an acknowledged job survives a power cut. NORMAL: faster; a
    power cut may lose the last transactions (never corrupts)."""
    handler_modules: list[str] = field(default_factory=list)
    external_types: list[str] = field(default_factory=list)
    demo: bool = False
    api_token: str = ""
    secret_key: str = ""
    secure_cookies: bool = False
    """On when the dashboard is served over HTTPS (directly or behind a TLS
    proxy): the session cookie is marked ``Secure`` (never sent over plain
    HTTP) and every response carries ``Strict-Transport-Security``, so the
    browser refuses plain HTTP to this host for a year. Leave off for plain
    HTTP, or the browser drops the cookie and nobody can sign in."""
    max_payload_bytes: int = 65536
    max_list_bytes: int = 2097152
    """The most bytes of payloads, results and errors one page of jobs
    carries (``GET /api/jobs``, the dashboard's lists): the page ends early,
    with more to come, where the next job would pass it. A field larger
    than this by itself is left out of lists (``jobdeck.store.listing``)."""
    max_result_bytes: int = 1048576
    """The largest result a handler may return (or an HTTP worker complete
    with), as compact UTF-8 JSON. A result lives in the job's row and is
    sent whole with the job (API, job page); a larger one fails the attempt
    (not retried; 413 for an HTTP worker) with a message pointing at
    ``ctx.artifact`` for large outputs."""
    max_bulk_jobs: int = 1000
    """The most jobs one bulk enqueue carries (``POST /api/jobs/bulk``,
    ``jobdeck enqueue --file``); more is refused, nothing inserted. All of
    them are inserted in one transaction, which holds SQLite's write lock
    while it runs: at most 100,000."""
    max_bulk_bytes: int = 8388608
    """The largest request body ``POST /api/jobs/bulk`` accepts, in bytes
    (413 past it; never less than one enqueue's own cap, three times
    ``max_payload_bytes`` plus 64 KiB). Each of its jobs is held to
    ``max_payload_bytes`` as well. Only that path reads a body this large;
    every other request keeps one enqueue's cap."""
    default_max_retries: int = 3
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    poll_interval: float = 1.0
    heartbeat_interval: float = 5.0
    stall_timeout: float = 60.0
    sweep_interval: float = 5.0
    clock_skew_warn: float = 1.0
    """PostgreSQL: seconds a host's clock may be off the database's before
    Jobdeck logs a warning. Every process runs on the database's clock
    (``jobdeck.core.clock``) whatever its host's says; the warning points at broken NTP."""
    clock_check_interval: float = 60.0
    """PostgreSQL: seconds between measurements of this process's clock
    against the database's (the sweeper also measures before each rescue)."""
    shutdown_grace: float = 30.0
    claim_batch: int = 250
    max_abandoned_threads: int = 10
    """A handler that runs past its type's timeout is failed and its thread
    abandoned: a Python thread cannot be killed, so it runs on until the
    handler returns. With this many abandoned threads still alive the
    process reports itself unhealthy (``/api/health`` answers 503, the
    Workers page says why) and claims no new jobs."""
    exit_when_unhealthy: bool = False
    """When unhealthy (see ``max_abandoned_threads``), shut down gracefully
    and exit with status 3, so a supervisor (systemd, Kubernetes) restarts
    the process and its stuck threads with it."""
    sqlite_busy_timeout: float = 30.0
    """Seconds a SQLite write waits for another process's lock before it
    fails with "database is locked" (the API then answers 503)."""
    request_lock_timeout: float = 5.0
    """PostgreSQL: seconds a statement of an HTTP request (API or
    dashboard) waits for a lock before it fails and the request is answered
    503 with ``Retry-After``, having committed nothing: a held ``LOCK
    TABLE`` otherwise kept enqueues waiting past their clients' timeouts, to
    commit them later, so a retry without a key stored the job twice. 0: no
    limit. The worker pool and maintenance wait as long as they need."""
    request_statement_timeout: float = 30.0
    """PostgreSQL: seconds one statement of an HTTP request may run before
    it is cancelled (503). 0: no limit."""
    allowed_hosts: list[str] = field(default_factory=list)
    """Host names besides ``localhost`` and loopback addresses that an open
    deployment (no ``[users]``) answers to. A web page that rebinds its own
    name to 127.0.0.1 reaches the socket as if from this machine, but its
    requests name its own host: an open deployment refuses them (403)."""
    log_format: str = "text"
    """``text`` (one line per record) or ``json`` (one JSON object per line,
    with job ids and types as fields: ``jobdeck.core.structured_logs``)."""
    auto_migrate: bool = True
    """Upgrade the database schema at start-up (``jobdeck db upgrade``).
    Off: start-up refuses to run on a schema older than the code."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Tables of the file that other parts of Jobdeck read (schedules, ...)."""

    @property
    def host(self) -> str:
        return self.bind.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.bind.rsplit(":", 1)[1])

    @property
    def is_loopback(self) -> bool:
        """The bind reaches this machine only: ``localhost`` or an address in
        127.0.0.0/8 or ::1, parsed as an address (``127.evil.example`` is a
        host name that resolves anywhere, not loopback)."""
        return is_loopback_host(self.host)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        path = Path(self.instance_path).resolve() / "jobdeck.db"
        return f"sqlite:///{path}"


def is_loopback_host(host: str | None) -> bool:
    """``localhost``, or an IP address in 127.0.0.0/8 or ::1 (also written as
    an IPv4-mapped IPv6 address); any other name or address is not."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


MAX_BULK_JOBS = 100_000
"""The highest ``max_bulk_jobs`` accepted."""
HTTP_SERVERS = ("waitress", "granian")
"""What ``http_server`` (``jobdeck serve --server``) accepts."""

# Keys read from the environment as JOBDECK_<KEY upper-cased>.
ENV_KEYS = (
    "database_url", "instance_path", "bind", "workers", "http_server", "http_threads",
    "http_connection_limit", "http_channel_timeout", "http_body_timeout",
    "sqlite_synchronous", "handler_modules", "external_types", "demo",
    "api_token", "secret_key", "secure_cookies", "max_payload_bytes", "max_result_bytes", "max_list_bytes",
    "max_bulk_jobs", "max_bulk_bytes", "default_max_retries",
    "poll_interval", "heartbeat_interval", "stall_timeout", "sweep_interval",
    "clock_skew_warn", "clock_check_interval", "shutdown_grace", "claim_batch",
    "auto_migrate", "max_abandoned_threads", "exit_when_unhealthy", "sqlite_busy_timeout",
    "request_lock_timeout", "request_statement_timeout",
    "allowed_hosts", "log_format",
)  # fmt: skip

_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "extra"}
# Tables owned by other parts of Jobdeck; kept as-is in ``Config.extra``.
EXTRA_TABLES = (
    "schedules", "queues", "types", "alerts", "retention", "dashboard", "users", "artifacts", "logs", "workflows",
)  # fmt: skip


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Read the file, then the environment, then explicit overrides."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    if path is None:
        path = env.get("JOBDECK_CONFIG") or None
        if path is None and Path("jobdeck.toml").exists():
            path = "jobdeck.toml"
    if path is not None:
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in EXTRA_TABLES:
            extra[key] = value
        elif key in _FIELDS:
            values[key] = _coerce(key, value, from_env=False)
        else:
            raise ConfigError(f"{key}: unknown configuration key")
    for key in ENV_KEYS:
        name = f"JOBDECK_{key.upper()}"
        if name in env:
            values[key] = _coerce(key, env[name], from_env=True, source=name)
    for key, value in (overrides or {}).items():
        if key in EXTRA_TABLES:
            extra[key] = value
        elif key in _FIELDS:
            values[key] = _coerce(key, value, from_env=False)
        else:
            raise ConfigError(f"{key}: unknown configuration key")
    config = Config(**values, extra=extra)
    validate(config)
    return config


def _coerce(key: str, value: Any, *, from_env: bool, source: str | None = None) -> Any:
    name = source or key
    kind = _FIELDS[key].type
    try:
        if kind == "int":
            if isinstance(value, bool) or (not from_env and not isinstance(value, int)):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or (not from_env and not isinstance(value, (int, float))):
                raise ValueError
            return float(value)
        if kind == "bool":
            if from_env:
                lowered = str(value).strip().lower()
                if lowered in {"1", "true", "yes", "on"}:
                    return True
                if lowered in {"0", "false", "no", "off", ""}:
                    return False
                raise ValueError
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind == "list[str]":
            if from_env:
                return [v.strip() for v in str(value).split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return list(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except ValueError:
        expected = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "list[str]": "a list of strings", "str": "a string"}[str(kind)]  # fmt: skip
        raise ConfigError(f"{name}: expected {expected}, got {value!r}") from None


def validate(config: Config) -> None:
    """Refuse values that would fail later in a less clear way."""

    def positive(key: str, allow_zero: bool = False) -> None:
        value = getattr(config, key)
        if value < 0 or (value == 0 and not allow_zero):
            raise ConfigError(f"{key}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")

    positive("workers", allow_zero=True)
    positive("default_max_retries", allow_zero=True)
    for key in ("http_threads", "http_connection_limit", "http_channel_timeout", "http_body_timeout",
                "max_payload_bytes", "max_result_bytes", "max_list_bytes", "max_bulk_jobs", "max_bulk_bytes",
                "backoff_base", "backoff_cap", "poll_interval", "heartbeat_interval", "stall_timeout",
                "sweep_interval", "claim_batch",
                "max_abandoned_threads", "sqlite_busy_timeout", "clock_skew_warn",
                "clock_check_interval"):  # fmt: skip
        positive(key)
    positive("shutdown_grace", allow_zero=True)
    positive("request_lock_timeout", allow_zero=True)
    positive("request_statement_timeout", allow_zero=True)
    if config.max_bulk_jobs > MAX_BULK_JOBS:
        raise ConfigError(f"max_bulk_jobs: must be at most {MAX_BULK_JOBS}, got {config.max_bulk_jobs}")
    if config.claim_batch > 1000:
        raise ConfigError(f"claim_batch: must be at most 1000, got {config.claim_batch}")
    if config.sqlite_synchronous.upper() not in {"FULL", "NORMAL"}:
        raise ConfigError(f"sqlite_synchronous: must be FULL or NORMAL, got {config.sqlite_synchronous!r}")
    config.sqlite_synchronous = config.sqlite_synchronous.upper()
    if config.http_server not in HTTP_SERVERS:
        raise ConfigError(f"http_server: must be one of {', '.join(HTTP_SERVERS)}, got {config.http_server!r}")
    if config.log_format not in ("text", "json"):
        raise ConfigError(f"log_format: must be text or json, got {config.log_format!r}")
    host, sep, port = config.bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bind: expected HOST:PORT, got {config.bind!r}")
    if config.heartbeat_interval * 2 > config.stall_timeout:
        raise ConfigError(
            f"stall_timeout: must be at least twice heartbeat_interval "
            f"({config.heartbeat_interval}), got {config.stall_timeout}"
        )
    artifact_max_bytes(config)
    log_limits(config)
    url = config.resolved_database_url()
    if not (url.startswith("sqlite") or url.startswith("postgresql")):
        raise ConfigError(f"database_url: only sqlite:// and postgresql+psycopg:// are supported, got {url!r}")
    _check_non_retryable(config)
    _check_option_names(config)
    _check_max_snoozes(config)
    _check_names(config)


def _check_names(config: Config) -> None:
    """Queue and type names the config declares, held to the enqueue's rule
    and NFC-normalized (``jobdeck.core.validation.check_name``)."""
    try:
        config.external_types = [check_name(n, "external_types", MAX_TYPE_CHARS) for n in config.external_types]
        for table, most in (("queues", MAX_QUEUE_CHARS), ("types", MAX_TYPE_CHARS)):
            section = config.extra.get(table)
            if not isinstance(section, dict):
                continue
            normal: dict[str, Any] = {}
            for key, value in section.items():
                name = check_name(key, f"[{table}.{ascii(key)}]", most)
                if name in normal:
                    raise ConfigError(f"[{table}]: {ascii(key)} and another name are the same name once normalized")
                normal[name] = value
            config.extra[table] = normal
    except InvalidField as exc:
        raise ConfigError(str(exc)) from None


QUEUE_OPTIONS = frozenset({"concurrency", "rate", "rate_key", "concurrency_key"})
"""What a ``[queues.NAME]`` table may set (``jobdeck.jobs.queues``, ``jobdeck.jobs.flow``)."""
TYPE_OPTIONS = QUEUE_OPTIONS | {"unique", "non_retryable", "max_snoozes", "capture_logging"}
"""What a ``[types."T"]`` table may set: the queue's options, and ``jobdeck.jobs.unique``'s,
``non_retryable``, ``jobdeck.jobs.snooze``'s and ``jobdeck.jobs.joblogs``' own."""
_HANDLER_ONLY = {"timeout", "max_retries", "queue", "priority", "backoff_base", "backoff_cap"}
"""Options of ``@handler`` that a ``[types."T"]`` table cannot set: named in the error."""


def _check_option_names(config: Config) -> None:
    """A key that no part of Jobdeck reads is refused: ``timeout = 30`` under
    ``[types."T"]`` was silently ignored, and the job ran without one."""
    for table, allowed in (("queues", QUEUE_OPTIONS), ("types", TYPE_OPTIONS)):
        entries = config.extra.get(table)
        if not isinstance(entries, dict):
            continue  # a malformed table is named by the part that reads it
        for name, options in entries.items():
            if not isinstance(options, dict):
                continue
            for key in sorted(set(options) - allowed, key=str):
                hint = (
                    f"; {key} is an option of @handler({key}=...) in the code"
                    if table == "types" and key in _HANDLER_ONLY
                    else ""
                )
                raise ConfigError(
                    f"{table}.{name}: unknown key {str(key)[:80]!r} (known: {', '.join(sorted(allowed))}){hint}"
                )


def _check_max_snoozes(config: Config) -> None:
    """Each ``[types."T"] max_snoozes`` (``jobdeck.jobs.snooze``) is an integer >= 0."""
    types = config.extra.get("types")
    if not isinstance(types, dict):
        return
    for job_type, options in types.items():
        if not isinstance(options, dict) or "max_snoozes" not in options:
            continue
        value = options["max_snoozes"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"types.{job_type}.max_snoozes: must be an integer >= 0, got {value!r}")


def non_retryable(config: Config, job_type: str) -> tuple[str, ...]:
    """``[types."T"] non_retryable``: the exception class names that send a
    job of type ``T`` straight to ``dead`` (``HandlerSpec.retries``). Checked
    at load; read on each failure, so it costs nothing on success."""
    types = config.extra.get("types")
    options = types.get(job_type) if isinstance(types, dict) else None
    names = options.get("non_retryable", ()) if isinstance(options, dict) else ()
    return tuple(names)


def _check_non_retryable(config: Config) -> None:
    """Each ``non_retryable`` is a list of class names, bare (``ValueError``)
    or dotted with their module (``requests.exceptions.HTTPError``)."""
    types = config.extra.get("types")
    if not isinstance(types, dict):
        return  # the queue controls name a malformed [types] table
    for job_type, options in types.items():
        if not isinstance(options, dict) or "non_retryable" not in options:
            continue
        names = options["non_retryable"]
        where = f"types.{job_type}.non_retryable"
        if not isinstance(names, list):
            raise ConfigError(f"{where}: expected a list of exception class names, got {names!r}")
        for name in names:
            if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
                raise ConfigError(f'{where}: {name!r} is not an exception class name (like "ValueError")')


# -- [artifacts] ------------------------------------------------------------------

_SIZE_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
MAX_ARTIFACT_BYTES = 1024**3
DEFAULT_ARTIFACT_BYTES = 10 * 1024 * 1024
"""``[artifacts] max_bytes`` when the config does not say: 10 MiB."""
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def artifact_max_bytes(config: Config) -> int:
    """``[artifacts] max_bytes``: the largest file ``ctx.artifact`` stores,
    as a number of bytes or a size such as ``"10 MiB"`` (default 10 MiB).
    The bytes live in the database and a download holds them in memory."""
    table = config.extra.get("artifacts", {})
    if not isinstance(table, dict):
        raise ConfigError("artifacts: expected a table ([artifacts])")
    unknown = set(table) - {"max_bytes"}
    if unknown:
        raise ConfigError(f"artifacts.{sorted(unknown)[0]}: unknown key (only max_bytes)")
    value = table.get("max_bytes", DEFAULT_ARTIFACT_BYTES)
    size = _size(value)
    if size is None or size <= 0:
        raise ConfigError(
            f'artifacts.max_bytes: expected a positive number of bytes or a size like "10 MiB", got {value!r}'
        )
    if size > MAX_ARTIFACT_BYTES:
        raise ConfigError(f"artifacts.max_bytes: at most 1 GiB (PostgreSQL's limit for one value), got {value!r}")
    return size


def _size(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    factor = _SIZE_UNITS.get((match.group(2) or "b").lower()) if match else None
    if match is None or factor is None:
        return None
    return int(float(match.group(1)) * factor)


# -- [logs] -----------------------------------------------------------------------


def log_limits(config: Config) -> LogLimits:
    """``[logs]``: the caps of per-job logs (``jobdeck.jobs.joblogs``)::

        [logs]
        max_lines_per_attempt = 1000   # then one "truncated" marker
        max_bytes_per_job = "1 MiB"    # every attempt's lines together
        flush_interval = 1.0           # seconds between batched writes
        capture_logging = false        # keep logging calls made on the handler's thread

    ``[types."T"] capture_logging = true`` captures for one type only."""
    table = config.extra.get("logs", {})
    if not isinstance(table, dict):
        raise ConfigError("logs: expected a table ([logs])")
    known = {"max_lines_per_attempt", "max_bytes_per_job", "flush_interval", "capture_logging"}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"logs.{sorted(unknown)[0]}: unknown key (only {', '.join(sorted(known))})")
    checked = dict(table)
    lines = table.get("max_lines_per_attempt")
    if lines is not None and (isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= 1_000_000):
        raise ConfigError(f"logs.max_lines_per_attempt: expected an integer from 1 to 1000000, got {lines!r}")
    if "max_bytes_per_job" in table:
        size = _size(table["max_bytes_per_job"])
        if size is None or size <= 0 or size > MAX_ARTIFACT_BYTES:
            raise ConfigError(
                'logs.max_bytes_per_job: expected a positive number of bytes or a size like "1 MiB" '
                f"(at most 1 GiB), got {table['max_bytes_per_job']!r}"
            )
        checked["max_bytes_per_job"] = size
    interval = table.get("flush_interval")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.05 <= interval <= 3600
    ):
        raise ConfigError(f"logs.flush_interval: expected seconds from 0.05 to 3600, got {interval!r}")
    capture = table.get("capture_logging", False)
    if not isinstance(capture, bool):
        raise ConfigError(f"logs.capture_logging: expected true or false, got {capture!r}")
    types = config.extra.get("types")
    if isinstance(types, dict):
        for name, options in types.items():
            if isinstance(options, dict) and not isinstance(options.get("capture_logging", False), bool):
                raise ConfigError(f"types.{name}.capture_logging: expected true or false")
    return limits_from(checked, types if isinstance(types, dict) else None)
