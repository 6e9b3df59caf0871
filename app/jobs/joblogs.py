"""Per-job logs: what a handler logs is kept per attempt, with level and time.

    def render(payload, ctx):
        ctx.log("fetching %d rows", 500)          # level "info"
        ctx.log.warning("slow page %s", page)
        ctx.log("done", level="debug")

Lines are buffered in memory per attempt (``AttemptLog``) and written in
batches: by the worker pool's monitor every ``[logs] flush_interval``
seconds and once when the attempt ends, before its outcome is written, so
a handler that logs nothing costs no write and a chatty one costs one write
per interval, never one per line. A process that dies loses at most the
lines logged since the last flush.

Caps (``[logs]``): ``max_lines_per_attempt`` and ``max_bytes_per_job``;
past either, one ``truncated`` marker line is kept for the attempt and the
rest dropped (in memory already, so a flood costs no memory either). Each
message is cut to ``MAX_LINE_CHARS``.

With ``capture_logging`` (``[logs]`` for every type, or ``[types."T"]``
for one) the standard ``logging`` records made on the handler's thread are
kept too (``CaptureHandler``): the thread knows which attempt it runs.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from jobdeck.core.errors import InvalidField
from jobdeck.core.loglines import TRUNCATED as TRUNCATED  # the marker's level, read by the API's schema
from jobdeck.core.loglines import LogLimits, LogLine
from jobdeck.core.validation import parse_time, storable_text

LEVELS = ("debug", "info", "warning", "error", "critical")
"""The levels a line can have (``logging``'s, lower case)."""
MAX_LINE_CHARS = 4000
"""A longer message is cut here, with an ellipsis."""

MAX_LINES_PER_BEAT = 1000
"""Lines one HTTP heartbeat may carry; a worker with more sends them over several beats."""
_LINE_KEYS = frozenset({"level", "message", "at"})
_ALIASES = {"warn": "warning", "fatal": "critical", "exception": "error"}
_STD_LEVEL = {name: getattr(logging, name.upper()) for name in LEVELS}


class InvalidLogLevel(ValueError):
    """A level that is not one of ``LEVELS``."""


def check_level(level: object) -> str:
    """``level`` as one of ``LEVELS`` (any case; ``warn`` is ``warning``)."""
    if not isinstance(level, str):
        raise InvalidLogLevel(f"level must be one of {', '.join(LEVELS)}")
    name = _ALIASES.get(level.strip().lower(), level.strip().lower())
    if name not in LEVELS:
        raise InvalidLogLevel(f"level must be one of {', '.join(LEVELS)}, got {level[:40]!r}")
    return name


def level_of(levelno: int) -> str:
    """A ``logging`` record's level number as one of ``LEVELS``."""
    if levelno >= logging.CRITICAL:
        return "critical"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    return "info" if levelno >= logging.INFO else "debug"


def clean_message(message: object) -> str:
    """A message as it is stored: text (``str()`` of anything else; a
    broken ``__str__`` does not raise), storable on every backend (NUL and
    lone surrogates escaped, ``storable_text``) and at most
    ``MAX_LINE_CHARS``. Control characters stay: the page escapes them."""
    if not isinstance(message, str):
        try:
            message = str(message)
        except Exception:
            message = f"<unprintable {type(message).__name__}>"
    if len(message) > MAX_LINE_CHARS:
        message = message[: MAX_LINE_CHARS - 1] + "…"
    message = storable_text(message) or ""
    if len(message) > MAX_LINE_CHARS:  # the escapes made it longer
        message = message[: MAX_LINE_CHARS - 1] + "…"
    return message


def parse_lines(value: Any, now: datetime) -> list[LogLine]:
    """The heartbeat's ``logs``: a list of ``{level?, message, at?}`` (level
    ``info`` and time ``now`` by default). A malformed entry refuses the
    whole request (422, nothing kept, no beat). A message is kept like a
    ``ctx.log`` line: NUL escaped, cut at ``MAX_LINE_CHARS``: a worker's odd
    output never costs it its heartbeat."""
    if not isinstance(value, list):
        raise InvalidField("logs", "must be a list of {level, message, at} objects")
    if len(value) > MAX_LINES_PER_BEAT:
        raise InvalidField("logs", f"at most {MAX_LINES_PER_BEAT} lines per heartbeat")
    lines = []
    for i, entry in enumerate(value):
        where = f"logs[{i}]"
        if not isinstance(entry, dict):
            raise InvalidField(where, "must be an object with level, message and at")
        unknown = set(entry) - _LINE_KEYS
        if unknown:
            raise InvalidField(where, f"unknown field {sorted(unknown)[0][:40]!r} (only level, message, at)")
        message = entry.get("message")
        if not isinstance(message, str):
            raise InvalidField(f"{where}.message", "required, a string")
        try:
            level = check_level(entry.get("level", "info"))
        except InvalidLogLevel as exc:
            raise InvalidField(f"{where}.level", str(exc)) from None
        at = parse_time(entry["at"], f"{where}.at") if entry.get("at") is not None else now
        lines.append(LogLine(level, clean_message(message), at))
    return lines


@dataclass
class Pending:
    """What a flush writes: the lines, and whether the buffer dropped some
    (then the store keeps the attempt's marker)."""

    lines: list[LogLine] = field(default_factory=list)
    dropped: int = 0


class AttemptLog:
    """The in-memory buffer of one attempt's lines, written by ``flush``.

    Any thread may ``add`` (the handler's, a thread it started, the logging
    capture) and any may ``flush`` (the monitor, the executor at the end).
    It keeps at most ``max_lines_per_attempt`` lines and
    ``max_bytes_per_job`` bytes in all (the store decides what still fits
    beside the job's earlier attempts); what is past that is only counted.
    """

    def __init__(
        self,
        job_id: int,
        attempt: int,
        limits: LogLimits,
        clock: Callable[[], datetime],
        write: Callable[[AttemptLog, Pending], None],
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.limits = limits
        self._clock = clock
        self._write = write
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending = Pending()
        self._kept = 0
        self._bytes = 0
        self.dropped = 0
        """Lines dropped past a cap so far (this process's count)."""

    @property
    def full(self) -> bool:
        """No more lines fit this attempt: a line now is only counted."""
        return self._kept >= self.limits.max_lines_per_attempt

    def drop(self) -> None:
        """Count a line dropped past the cap without building it."""
        with self._lock:
            self._pending.dropped += 1
            self.dropped += 1

    def add(self, level: str, message: object, at: datetime | None = None) -> None:
        if self.full:
            self.drop()
            return
        text = clean_message(message)
        size = len(text.encode("utf-8"))
        line = LogLine(level, text, at or self._clock())
        with self._lock:
            if self._kept >= self.limits.max_lines_per_attempt or self._bytes + size > self.limits.max_bytes_per_job:
                self._pending.dropped += 1
                self.dropped += 1
                return
            self._kept += 1
            self._bytes += size
            self._pending.lines.append(line)

    def take(self) -> Pending:
        """What is buffered, now the caller's to write (the acker's batch)."""
        with self._flush_lock, self._lock:
            taken, self._pending = self._pending, Pending()
        return taken

    def has_pending(self) -> bool:
        """Lines or drops are buffered now. Read without the lock: a line
        added just after is missed either way, and the executor asks once
        per job."""
        pending = self._pending
        return bool(pending.lines or pending.dropped)

    def flush(self) -> int:
        """Write what is buffered (one transaction); returns how many lines.
        Flushes of one attempt never overlap, so its lines keep their order.
        A write that failed for a passing reason (``is_transient``) puts the
        lines back for the next flush; any other failure drops them."""
        with self._flush_lock:
            with self._lock:
                taken, self._pending = self._pending, Pending()
            if not taken.lines and not taken.dropped:
                return 0
            try:
                self._write(self, taken)
            except Exception as exc:
                from jobdeck.store.faults import is_transient  # SQLAlchemy's errors: not in a child, which never writes

                if is_transient(exc):
                    with self._lock:
                        self._pending.lines[:0] = taken.lines
                        self._pending.dropped += taken.dropped
                raise
            return len(taken.lines)


class JobLog:
    """``ctx.log``: call it, or use it like a ``logging.Logger``::

        ctx.log("copied %d files", n)
        ctx.log("disk almost full", level="warning")
        ctx.log.error("upload failed: %s", exc)

    Each line goes into the attempt's log (when the job runs in a worker
    pool) and to the standard logger ``jobdeck.job.<type>`` as before."""

    def __init__(self, job_type: str, buffer: AttemptLog | None = None) -> None:
        self.job_type = job_type
        self.buffer = buffer
        self.span: Any = None
        """The attempt's span with tracing on (``jobdeck.tracing``): each line is an event of it too."""

    @cached_property
    def logger(self) -> logging.Logger:
        """``jobdeck.job.<type>``, looked up at the first line: most handlers
        log nothing, and the lookup (under logging's lock) was a fifth of an
        executor's own time for each job it ran."""
        return logging.getLogger(f"jobdeck.job.{self.job_type}")

    def __call__(self, message: object, *args: Any, level: str = "info") -> None:
        self._log(check_level(level), message, args)

    def debug(self, message: object, *args: Any) -> None:
        self._log("debug", message, args)

    def info(self, message: object, *args: Any) -> None:
        self._log("info", message, args)

    def warning(self, message: object, *args: Any) -> None:
        self._log("warning", message, args)

    def error(self, message: object, *args: Any) -> None:
        self._log("error", message, args)

    def critical(self, message: object, *args: Any) -> None:
        self._log("critical", message, args)

    def exception(self, message: object, *args: Any) -> None:
        """An error line with the traceback of the exception being handled."""
        self._log("error", message, args, exc_info=True)

    def _log(self, level: str, message: object, args: tuple[Any, ...], exc_info: bool = False) -> None:
        buffer = self.buffer
        if buffer is not None and buffer.full and not self.logger.isEnabledFor(_STD_LEVEL[level]):
            buffer.drop()  # a flood past the cap: not even formatted
            return
        text = _format(message, args)
        if exc_info:
            text = f"{text}\n{traceback.format_exc().rstrip()}"
        if self.buffer is not None:
            self.buffer.add(level, text)
        if self.span is not None:
            self.span.add_event("job.log", {"jobdeck.log.level": level, "jobdeck.log.message": text})
        self.logger.log(_STD_LEVEL[level], "%s", text, extra={_KEPT: True})


_KEPT = "jobdeck_job_log"
"""Set on the records ``JobLog`` forwards: the capture skips them (kept already)."""


def _format(message: object, args: tuple[Any, ...]) -> str:
    try:
        return str(message) % args if args else str(message)
    except Exception:
        try:
            return f"{message} {args!r}"
        except Exception:
            return f"<unprintable {type(message).__name__}>"


class CaptureHandler(logging.Handler):
    """Keeps the ``logging`` records made on a thread that runs an attempt
    with capture on, in that attempt's log. Installed once on the root
    logger (``install_capture``); a record from any other thread costs one
    thread-local lookup. Records still pass the loggers' own levels: the
    root logger's WARNING by default, unless the application sets one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._current = threading.local()

    def bind(self, buffer: AttemptLog | None) -> None:
        """This thread runs ``buffer``'s attempt from now (None: no attempt)."""
        self._current.buffer = buffer

    @staticmethod
    def bind_task(buffer: AttemptLog) -> None:
        """The current asyncio task runs ``buffer``'s attempt (an ``async def``
        handler's task: many share the loop's thread, each has its own context)."""
        _task_buffer.set(buffer)

    def emit(self, record: logging.LogRecord) -> None:
        buffer = _task_buffer.get()
        if buffer is None:
            buffer = getattr(self._current, "buffer", None)
        if buffer is None or getattr(record, _KEPT, False):
            return
        try:
            text = record.getMessage()
            if record.exc_info:
                text = f"{text}\n{logging.Formatter().formatException(record.exc_info)}"
            buffer.add(level_of(record.levelno), text)
        except Exception:
            self.handleError(record)


_task_buffer: ContextVar[AttemptLog | None] = ContextVar("jobdeck_attempt_log", default=None)
"""The attempt an asyncio task runs, for ``CaptureHandler`` (``bind_task``)."""

_capture: CaptureHandler | None = None
_capture_lock = threading.Lock()


def install_capture() -> CaptureHandler:
    """The process's one ``CaptureHandler``, on the root logger."""
    global _capture
    with _capture_lock:
        if _capture is None:
            _capture = CaptureHandler()
            logging.getLogger().addHandler(_capture)
        return _capture
