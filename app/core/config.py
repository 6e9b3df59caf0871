"""Configuration: a TOML file plus environment overrides, validated at start.

The file is ``$JOBDECK_CONFIG`` or ``./jobdeck.toml`` when present. Each common
key can be overridden by ``JOBDECK_<KEY>`` in the environment. An invalid value
refuses to start with a message naming the key and what is wrong with it.

The keys themselves are ``Config`` (``jobdeck.core.config_schema``); the
tables the config checks at load are read by ``jobdeck.core.config_tables``.
This module reads and checks; it also exports the schema's names, so callers
import configuration from one place.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobdeck.core.config_schema import HTTP_SERVERS, MAX_BULK_JOBS, Config, ConfigError, is_loopback_host
from jobdeck.core.config_tables import (
    artifact_max_bytes,
    check_max_snoozes,
    check_names,
    check_non_retryable,
    check_option_names,
    check_process_options,
    log_limits,
    tracing_enabled,
)

__all__ = [
    "ENV_KEYS", "EXTRA_TABLES", "HTTP_SERVERS", "Config", "ConfigError", "artifact_max_bytes", "is_loopback_host",
    "load", "log_limits", "tracing_enabled", "validate",
]  # fmt: skip

# Keys read from the environment as JOBDECK_<KEY upper-cased>.
ENV_KEYS = (
    "database_url", "instance_path", "bind", "workers", "http_server", "http_threads",
    "http_connection_limit", "http_channel_timeout", "http_body_timeout",
    "sqlite_synchronous", "handler_modules", "external_types", "demo",
    "api_token", "secret_key", "secure_cookies", "max_payload_bytes", "max_result_bytes", "max_list_bytes",
    "max_bulk_jobs", "max_bulk_bytes", "default_max_retries",
    "poll_interval", "heartbeat_interval", "stall_timeout", "sweep_interval",
    "clock_skew_warn", "clock_check_interval", "shutdown_grace", "claim_batch",
    "async_concurrency", "process_workers", "max_jobs_per_child", "cancel_grace", "auto_migrate", "max_abandoned_threads", "exit_when_unhealthy", "sqlite_busy_timeout",
    "request_lock_timeout", "request_statement_timeout",
    "allowed_hosts", "log_format",
)  # fmt: skip

_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "extra"}
# Tables owned by other parts of Jobdeck; kept as-is in ``Config.extra``.
EXTRA_TABLES = (
    "schedules", "queues", "types", "alerts", "retention", "dashboard", "users", "artifacts", "logs", "workflows",
    "api_tokens", "tracing",
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
    if "JOBDECK_TRACING" in env and isinstance(extra.get("tracing", {}), dict):
        # [tracing] enabled: the one key of a table with a variable of its own
        extra["tracing"] = {**extra.get("tracing", {}), "enabled": _env_bool("JOBDECK_TRACING", env["JOBDECK_TRACING"])}
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


def _env_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


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
                "sweep_interval", "claim_batch", "async_concurrency",
                "max_abandoned_threads", "sqlite_busy_timeout", "clock_skew_warn",
                "clock_check_interval"):  # fmt: skip
        positive(key)
    positive("shutdown_grace", allow_zero=True)
    positive("process_workers", allow_zero=True)
    positive("max_jobs_per_child", allow_zero=True)
    positive("cancel_grace")
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
    tracing_enabled(config)
    url = config.resolved_database_url()
    if not (url.startswith("sqlite") or url.startswith("postgresql")):
        raise ConfigError(f"database_url: only sqlite:// and postgresql+psycopg:// are supported, got {url!r}")
    check_non_retryable(config)
    check_option_names(config)
    check_max_snoozes(config)
    check_process_options(config)
    check_names(config)
