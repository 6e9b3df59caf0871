"""``log_format = "json"`` (or ``JOBDECK_LOG_FORMAT=json``): Jobdeck's own
logs as one JSON object per line, for a log shipper to index::

    {"time": "2026-12-01T19:00:00.123Z", "level": "ERROR", "logger": "jobdeck.alerts",
     "message": "job 42 (mail.send) is dead after 3 attempt(s): ...", "event": "job.dead",
     "job_id": 42, "job_type": "mail.send", "attempts": 3}

The fields beyond time, level, logger and message are the ``extra=`` of the
log call: ``event`` names what happened (``worker.started``,
``worker.stopped``, ``scheduler.started``, ``job.dead``, ``job.rescued``,
``threshold.firing``, ``threshold.recovered``, ``audit``), with ``job_id``,
``job_type``, ``queue``, ``worker_id``, ``actor``, ``action`` where they apply. A
traceback is the ``exception`` field. JSON escapes newlines and control
characters, so a job's error text cannot forge a line. The default,
``text``, stays the one-line text format.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=True)


def use_log_format(log_format: str) -> None:
    """Switch the root logger's handlers to ``log_format`` (adding a stderr
    handler at INFO when there is none, as under another WSGI server)."""
    if log_format != "json":
        return
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
        if root.level == logging.WARNING:
            root.setLevel(logging.INFO)
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
