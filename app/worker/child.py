"""The child side of the process executor (``jobdeck.worker.processes``): a
process started clean (forkserver or spawn, never a fork of the web server's
threads) that imports the handler modules, then runs one job at a time as
the parent sends them, over one pipe.

The child never touches the database. Its ``ctx`` is a proxy: logs and
progress are sent to the parent, which writes them; an artifact, an effect's
ledger steps and a rate limit are calls the parent answers. The payload
arrives as JSON and the result leaves as JSON; an exception leaves as its
first line, its traceback and its classes' names, for the parent to decide
whether a retry can fix it.

The child dies with its parent: ``PR_SET_PDEATHSIG`` kills it when its
parent process ends (under forkserver the parent is the fork server, which
itself ends with the pool's process), and a thread that reads the pipe exits
the process as soon as the parent's end of it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import inspect
import json
import os
import queue
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from jobdeck.core.startup import frozen_imports

with frozen_imports(__name__ == "__main__"):  # the child process starting (jobdeck.core.startup)
    from jobdeck.core.errors import Cancelled
    from jobdeck.jobs.handlers import HandlerSpec, is_async_callable
    from jobdeck.jobs.payloads import shape_of, typed_call
    from jobdeck.jobs.snooze import Snooze
    from jobdeck.worker.child_context import ChildContext
    from jobdeck.worker.results import first_line, storable_result

PR_SET_PDEATHSIG = 1
UNREADABLE_EXIT = 70
"""The child's exit code when a message from the parent could not be read (``Child.unreadable``)."""


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent process ends (Linux only; elsewhere the pipe watch)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """The child's loop: a reader thread takes messages off the pipe, the main thread runs the jobs."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self.jobs: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.ctx: ChildContext | None = None
        self._replies: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._calls = 0

    def send(self, *message: Any) -> None:
        with self._send_lock:
            self.conn.send(message)

    def send_for(self, ctx: ChildContext, *message: Any) -> bool:
        """Send for ``ctx``'s attempt only, checked under the lock that also
        ends the attempt (``finish``): a line from a thread the handler left
        behind goes before the attempt's answer, or nowhere."""
        with self._send_lock:
            if self.ctx is not ctx:
                return False
            self.conn.send(message)
            return True

    def finish(self, *answer: Any) -> None:
        """Send the attempt's answer and end it, in one step under the send lock."""
        with self._send_lock:
            self.ctx = None
            self.conn.send(answer)

    def call(self, ctx: ChildContext, name: str, args: tuple[Any, ...]) -> Any:
        """Ask the parent to do ``name`` with the attempt's real context; its
        answer, or its error raised. Refused once ``ctx``'s attempt has ended,
        checked under the lock ``finish`` takes, as ``send_for``."""
        with self._send_lock:
            if self.ctx is not ctx:
                raise RuntimeError(f"ctx.{name.split('_')[0]} of job {ctx.job_id}: its attempt has ended")
            self._calls += 1
            call_id = self._calls
            answered = threading.Event()
            self._replies[call_id] = (answered, [])
            self.conn.send(("call", call_id, name, args))
        answered.wait()
        ok, value = self._replies.pop(call_id)[1]
        if ok:
            return value
        raise RuntimeError(value) if not isinstance(value, BaseException) else value

    def read(self) -> None:
        """The reader thread: jobs, cancels and answers; the parent gone ends the process."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the parent is gone: nothing here may outlive it
            except BaseException as exc:  # noqa: BLE001 - this thread must not die silently
                self.unreadable(exc)
            try:
                self.take(message)
            except BaseException as exc:  # noqa: BLE001
                self.unreadable(exc)

    def take(self, message: Any) -> None:
        kind = message[0]
        if kind == "job":
            self.jobs.put(message[1])
        elif kind == "cancel" and self.ctx is not None and self.ctx.job_id == message[1]:
            self.ctx.cancel_reason = message[2]
            self.ctx.cancelled.set()
        elif kind == "reply" and message[1] in self._replies:
            answered, box = self._replies[message[1]]
            box.extend(message[2:])
            answered.set()
        elif kind == "stop":
            os._exit(0)

    def unreadable(self, exc: BaseException) -> NoReturn:
        """A message from the parent that cannot be read (an answer that does
        not unpickle here, a malformed one) is lost: a job, a cancel or an
        answer a handler waits for. Without this thread the handler would
        wait until its timeout, so tell the parent why (it fails the job at
        once and replaces this child) and end."""
        with contextlib.suppress(BaseException):
            self.send("unreadable", first_line(exc))
        os._exit(UNREADABLE_EXIT)

    def run(self, import_error: str | None) -> None:
        threading.Thread(target=self.read, name="jobdeck-child-pipe", daemon=True).start()
        while True:
            job = self.jobs.get()
            self.ctx = ChildContext(self, job)
            self.finish(*self.attempt(job, import_error))  # attempt answers every handler error itself

    def attempt(self, job: dict[str, Any], import_error: str | None) -> tuple[Any, ...]:
        assert self.ctx is not None
        limit = job.get("memory_limit")
        saved = resource.getrlimit(resource.RLIMIT_AS)
        try:
            if import_error is not None:
                raise LookupError(import_error)
            fn = find_handler(job["type"], job["module"], job["qualname"])
            self.send("started")
            if limit:
                forget_peak()
                hard = saved[1]
                soft = address_space() + limit
                resource.setrlimit(
                    resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
                )
            result = fn(json.loads(job["payload"]), self.ctx)
            if inspect.isawaitable(result):  # an async handler: a loop of its own, in this process
                result = asyncio.run(_awaited(result))
            if isinstance(result, Snooze):
                raise result
            resource.setrlimit(resource.RLIMIT_AS, saved)
            return ("done", json.dumps(storable_result(result, sys.maxsize)))  # the parent checks the size
        except Snooze as snooze:
            resource.setrlimit(resource.RLIMIT_AS, saved)
            return ("snooze", snooze.seconds, snooze.reason)
        except BaseException as exc:  # SystemExit too: the handler's failure, as on a thread
            resource.setrlimit(resource.RLIMIT_AS, saved)
            return ("error", describe(exc, traceback.format_exc()), peak_rss())


def _no_handler(payload: Any, ctx: Any) -> None:
    """The stand-in of ``describe``'s ``HandlerSpec``: only its retry rule is read."""


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def describe(exc: BaseException, tb: str) -> dict[str, Any]:
    """An exception as the parent needs it: its line, traceback, and what decides a retry."""
    try:
        text = str(exc).strip()
    except Exception:
        text = "<unprintable>"
    names = [n for cls in type(exc).__mro__ for n in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")]
    return {
        "line": f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
        "traceback": tb,
        "names": names,
        "never": not HandlerSpec("?", _no_handler).retries(exc) or "InvalidArtifact" in names,
        "cancelled": isinstance(exc, Cancelled),
        "memory": isinstance(exc, MemoryError),
    }


def find_handler(job_type: str, module: str, qualname: str) -> Callable[..., Any]:
    """The handler of ``job_type`` by its module and name: a process handler is
    imported in the child, never sent to it, so it must be importable by name."""
    if "<locals>" in qualname or module == "__main__":
        raise LookupError(
            f"the handler of {job_type!r} ({module}.{qualname}) is not importable by name: a handler run by "
            "the process executor must be a module-level function of a module listed in handler_modules"
        )
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise LookupError(
            f"the handler of {job_type!r} ({module}.{qualname}) cannot be imported in the worker process ({exc}); "
            "list its module in handler_modules"
        ) from None
    shape = shape_of(found)  # a typed payload is converted here, as on a thread (``jobdeck.jobs.payloads``)
    return typed_call(found, shape, is_async_callable(found)) if shape else found


def _status(field: str) -> int:
    """A ``kB`` line of ``/proc/self/status``, in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def address_space() -> int:
    return _status("VmSize")


def peak_rss() -> int:
    return _status("VmHWM")


def forget_peak() -> None:
    """Start the resident high-water mark over, so the peak is this job's."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def main(conn: Connection, handler_modules: list[str], path: list[str], parent: int) -> None:
    """The child process's loop, once its pipe is open."""
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was asked for
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the parent decides
    sys.path[:] = [*path, *(p for p in sys.path if p not in path)]
    import_error: str | None = None
    with frozen_imports(True):
        for name in handler_modules:
            try:
                importlib.import_module(name)
            except Exception as exc:
                import_error = f"handler_modules: cannot import {name!r} in the worker process: {exc}"
                break
    Child(conn).run(import_error)


if __name__ == "__main__":  # python -m jobdeck.worker.child FD SETTINGS (``jobdeck.worker.processes``)
    told = json.loads(sys.argv[2])
    main(Connection(int(sys.argv[1])), told["handler_modules"], told["path"], told["parent"])
