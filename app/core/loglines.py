"""The words of per-job logs that the handler's buffer (``jobdeck.jobs.joblogs``)
and the store (``jobdeck.store.joblogs``) share: a line, the caps, and the
marker an attempt gets past a cap. Here so that the store, which writes the
lines and enforces the caps, needs nothing from the layer above it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

TRUNCATED = "truncated"
"""The level of the one marker line an attempt gets past a cap."""
DEFAULT_MAX_LINES = 1000
DEFAULT_MAX_BYTES_PER_JOB = 1024 * 1024
DEFAULT_FLUSH_INTERVAL = 1.0


@dataclass(frozen=True)
class LogLimits:
    """``[logs]``: the caps, and how often buffered lines are written."""

    max_lines_per_attempt: int = DEFAULT_MAX_LINES
    max_bytes_per_job: int = DEFAULT_MAX_BYTES_PER_JOB
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    capture_logging: bool = False
    """Capture ``logging`` records on the handler's thread, for every type."""
    capture_types: frozenset[str] = frozenset()
    """Types that capture although ``capture_logging`` is off (``[types."T"]``)."""

    def captures(self, job_type: str) -> bool:
        return self.capture_logging or job_type in self.capture_types


@dataclass(frozen=True)
class LogLine:
    """One line before it is stored."""

    level: str
    message: str
    at: datetime


def limits_from(table: Mapping[str, Any], types: Mapping[str, Any] | None) -> LogLimits:
    """``LogLimits`` from an already checked ``[logs]`` table and ``[types]``."""
    capture_types = frozenset(
        name for name, opts in (types or {}).items() if isinstance(opts, dict) and opts.get("capture_logging") is True
    )
    return LogLimits(
        max_lines_per_attempt=table.get("max_lines_per_attempt", DEFAULT_MAX_LINES),
        max_bytes_per_job=table.get("max_bytes_per_job", DEFAULT_MAX_BYTES_PER_JOB),
        flush_interval=table.get("flush_interval", DEFAULT_FLUSH_INTERVAL),
        capture_logging=table.get("capture_logging", False),
        capture_types=capture_types,
    )
