"""The checks and readers of the configuration's tables that the config
itself vouches for at load (``jobdeck.core.config.validate``): the names and
option keys of ``[queues.NAME]`` and ``[types."T"]``, ``non_retryable``,
``max_snoozes``, ``[artifacts]``, ``[logs]`` and ``[tracing]``. Tables that a part of Jobdeck
owns (schedules, alerts, retention, ...) are checked by that part when the
deck is built."""

from __future__ import annotations

import re
from typing import Any

from jobdeck.core.config_schema import Config, ConfigError
from jobdeck.core.errors import InvalidField
from jobdeck.core.loglines import LogLimits, limits_from
from jobdeck.core.validation import MAX_QUEUE_CHARS, MAX_TYPE_CHARS, check_name


def check_names(config: Config) -> None:
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


QUEUE_OPTIONS = frozenset({"concurrency", "rate", "rate_key", "concurrency_key", "executor", "memory_limit"})
"""What a ``[queues.NAME]`` table may set (``jobdeck.jobs.queues``, ``jobdeck.jobs.flow``)."""
TYPE_OPTIONS = QUEUE_OPTIONS | {"unique", "non_retryable", "max_snoozes", "capture_logging"}
"""What a ``[types."T"]`` table may set: the queue's options, and ``jobdeck.jobs.unique``'s,
``non_retryable``, ``jobdeck.jobs.snooze``'s and ``jobdeck.jobs.joblogs``' own."""
_HANDLER_ONLY = {"timeout", "max_retries", "queue", "priority", "backoff_base", "backoff_cap"}
"""Options of ``@handler`` that a ``[types."T"]`` table cannot set: named in the error."""


def check_option_names(config: Config) -> None:
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


def check_max_snoozes(config: Config) -> None:
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


def check_non_retryable(config: Config) -> None:
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


# -- executor, memory_limit -------------------------------------------------------

MIN_MEMORY_LIMIT = 32 * 1024 * 1024
"""The smallest ``memory_limit``: a child's Python needs some room of its own."""


def check_process_options(config: Config) -> None:
    """``executor`` is "thread" or "process"; ``memory_limit`` is a size such as
    "512 MiB" (at least 32 MiB), for process jobs only: a thread cannot be held to one."""
    for table in ("queues", "types"):
        entries = config.extra.get(table)
        if not isinstance(entries, dict):
            continue
        for name, options in entries.items():
            if not isinstance(options, dict):
                continue
            where = f"{table}.{name}"
            if "executor" in options and options["executor"] not in ("thread", "process"):
                raise ConfigError(f'{where}.executor: expected "thread" or "process", got {options["executor"]!r}')
            if "memory_limit" in options:
                size = _size(options["memory_limit"])
                if size is None or size < MIN_MEMORY_LIMIT:
                    raise ConfigError(
                        f'{where}.memory_limit: expected a size of at least 32 MiB, like "512 MiB", '
                        f"got {options['memory_limit']!r}"
                    )
                if options.get("executor", "process") != "process":
                    raise ConfigError(
                        f'{where}.memory_limit: only a job in a child process can be held to a memory limit; set executor = "process"'
                    )


def process_option(config: Config, job_type: str, queue: str | None, key: str) -> Any:
    """``[types."T"] key``, else ``[queues.NAME] key`` of the type's queue, else None."""
    for table, name in (("types", job_type), ("queues", queue)):
        entries = config.extra.get(table)
        options = entries.get(name) if isinstance(entries, dict) and name is not None else None
        if isinstance(options, dict) and key in options:
            return options[key]
    return None


def executor_of(config: Config, job_type: str, declared: str | None, queue: str | None) -> str:
    """Where jobs of ``job_type`` run: ``[types."T"] executor``, else the
    handler's ``executor=``, else ``[queues.NAME] executor`` of its queue, else "thread"."""
    types = config.extra.get("types")
    options = types.get(job_type) if isinstance(types, dict) else None
    if isinstance(options, dict) and "executor" in options:
        return str(options["executor"])
    return declared or str(process_option(config, job_type, queue, "executor") or "thread")


def memory_limit(config: Config, job_type: str, queue: str | None) -> int | None:
    """A process job's ``memory_limit`` in bytes (its type's, else its queue's); None: none."""
    value = process_option(config, job_type, queue, "memory_limit")
    return None if value is None else _size(value)


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


# -- [tracing] --------------------------------------------------------------------


def tracing_enabled(config: Config) -> bool:
    """``[tracing] enabled`` (or ``JOBDECK_TRACING=1``): OpenTelemetry spans
    for each attempt (``jobdeck.tracing``). Off by default; the exporter,
    endpoint, service name and sampling come from the standard ``OTEL_*``
    environment variables, never from this table."""
    table = config.extra.get("tracing", {})
    if not isinstance(table, dict):
        raise ConfigError("tracing: expected a table ([tracing])")
    unknown = set(table) - {"enabled", "trace_url"}
    if unknown:
        raise ConfigError(f"tracing.{sorted(unknown)[0]}: unknown key (only enabled, trace_url)")
    enabled = table.get("enabled", False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"tracing.enabled: expected true or false, got {enabled!r}")
    url = table.get("trace_url", "")
    if not isinstance(url, str) or (
        url and (not url.startswith(("http://", "https://")) or "{trace_id}" not in url or len(url) > 2000)
    ):
        raise ConfigError(
            'tracing.trace_url: expected an http(s) URL holding {trace_id}, like "https://tempo.example/trace/{trace_id}"'
            f", got {str(url)[:200]!r}"
        )
    return enabled


def trace_url(config: Config) -> str:
    """``[tracing] trace_url``: where the dashboard links a traced job's
    trace, ``{trace_id}`` replaced by its id (checked at load); "" for none."""
    table = config.extra.get("tracing", {})
    return str(table.get("trace_url", "")) if isinstance(table, dict) else ""
