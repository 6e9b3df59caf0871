"""The process executor's children: a pool of ``process_workers`` pre-started
child processes (``jobdeck.worker.child``), each a fresh interpreter
(``python -m jobdeck.worker.child``, as spawn does), never a fork of this
process and its threads, and never importing this process's ``__main__``
(a script without an ``if __name__ == "__main__"`` guard would run again).
One long-lived thread starts them all: a child asks the kernel to kill it
when the thread that started it ends (``PR_SET_PDEATHSIG``), so that thread
must live as long as the pool. An executor thread borrows a free child for one job
(``jobdeck.worker.process_run``) and gives it back; a child that died, was
killed, went over its memory limit or ran ``max_jobs_per_child`` jobs is
replaced by a fresh one, and each replacement is counted by its cause.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("jobdeck.worker")

TERM_GRACE = 1.0
"""Seconds a child has to end after SIGTERM before SIGKILL."""


@dataclass
class ChildProcess:
    """One child: its process, the parent's end of its pipe, and what it did."""

    process: subprocess.Popen[bytes]
    conn: Connection
    jobs_run: int = 0
    job_id: int | None = None
    started: float = field(default_factory=time.monotonic)
    _killing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss(self) -> int:
        """Resident bytes now (0 once it is gone)."""
        try:
            with open(f"/proc/{self.pid}/statm", encoding="ascii") as fh:
                return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def kill(self) -> None:
        """SIGTERM, then SIGKILL after ``TERM_GRACE``; reaped either way.
        Safe from two threads at once (a pool's stop and the thread driving
        the child's job): the second waits for the first, and the pipe is
        closed once. Unguarded, both closed it, and the second close failed
        with EBADF, or could have closed a descriptor the process had opened
        since under the same number."""
        with self._killing:
            if self.alive():
                self.process.terminate()
                self._wait(TERM_GRACE)
            if self.alive():
                self.process.kill()
            self._wait(5.0)
            if not self.conn.closed:
                self.conn.close()

    def _wait(self, seconds: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(seconds)

    def ended(self) -> str:
        """How the process ended, in the words of the job's error."""
        self._wait(1.0)
        code = self.process.returncode
        if code is None:
            return "worker process stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            return f"worker process exited with signal {-code} ({name})"
        return f"worker process exited with exit code {code}"


class ProcessPool:
    """The children of one worker pool (see the module docstring)."""

    def __init__(self, size: int, *, max_jobs_per_child: int = 0, handler_modules: list[str] | None = None) -> None:
        self.size = size
        self.max_jobs_per_child = max_jobs_per_child
        self.handler_modules = list(handler_modules or [])
        self.restarts: Counter[str] = Counter()
        """Children replaced, by cause: timeout, memory, crash, cancel, recycled, released."""
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="jobdeck-process-starter")
        """The one thread that starts every child (see the module docstring)."""
        self._lock = threading.Condition()
        self._idle: list[ChildProcess] = []
        self._busy: list[ChildProcess] = []
        self._stopped = False

    # -- starting and stopping -------------------------------------------------------

    def start(self) -> None:
        """Start the children now, so the first jobs do not wait for them."""
        with self._lock:
            while len(self._idle) + len(self._busy) < self.size and not self._stopped:
                self._idle.append(self._new())

    def _new(self) -> ChildProcess:
        return self._starter.submit(self._start_one).result()

    def _start_one(self) -> ChildProcess:
        parent_end, child_end = multiprocessing.Pipe(duplex=True)
        told = json.dumps({"handler_modules": self.handler_modules, "path": sys.path, "parent": os.getpid()})
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "jobdeck.worker.child", str(child_end.fileno()), told],
                pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            child_end.close()
        return ChildProcess(process, parent_end)

    def stop(self) -> None:
        """End every child: idle ones now; a busy one is killed by the thread
        that drives it when its slot is given up, or here at the latest."""
        with self._lock:
            self._stopped = True
            children = self._idle + self._busy
            self._idle, self._busy = [], []
            self._lock.notify_all()
        for child in children:
            with contextlib.suppress(OSError):
                child.conn.send(("stop",))
        for child in children:
            child._wait(TERM_GRACE)
            child.kill()
        self._starter.shutdown(wait=False)

    # -- lending ------------------------------------------------------------------------

    def acquire(self, job_id: int, give_up: Callable[[], bool]) -> ChildProcess | None:
        """A free child for ``job_id``, waiting for one while every child is
        busy; None when ``give_up()`` turns true first or the pool stopped."""
        with self._lock:
            while not self._stopped and not give_up():
                if self._idle:
                    child = self._idle.pop()
                    if not child.alive():  # died while idle (killed from outside)
                        self.restarts["crash"] += 1
                        child.kill()
                        child = self._new()
                    child.job_id = job_id
                    self._busy.append(child)
                    return child
                if len(self._busy) < self.size:
                    child = self._new()
                    child.job_id = job_id
                    self._busy.append(child)
                    return child
                self._lock.wait(0.05)
        return None

    def release(self, child: ChildProcess, replace: str | None = None) -> None:
        """Give ``child`` back after a job; ``replace`` names why it must be
        replaced instead (it is killed now, a fresh one started)."""
        jobs_run = child.jobs_run + 1
        if replace is None and self.max_jobs_per_child and jobs_run >= self.max_jobs_per_child:
            replace = "recycled"
        if replace is None and not child.alive():
            replace = "crash"
        if replace is not None:
            child.kill()
            log.info("replacing worker process %s (%s) after %d jobs", child.pid, replace, jobs_run)
        with self._lock:  # the child's job, its count and its place change at once (``summary``)
            child.jobs_run, child.job_id = jobs_run, None
            if child in self._busy:
                self._busy.remove(child)
            if replace is not None:
                self.restarts[replace] += 1
                if self._stopped:
                    return
                child = self._new()
            if self._stopped:
                child.kill()
            else:
                self._idle.append(child)
            self._lock.notify()

    # -- what the Workers page shows ---------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The pool at one moment: its capacity, busy children, each child
        (pid, the job it runs, its resident memory, the jobs it ran) and the
        children replaced by cause. Read under one hold of the lock: read
        apart, a crash could show as counted while its dead child was still
        listed running the crashed job, and the replacement missing."""
        with self._lock:
            busy = len(self._busy)
            every = [(c, c.pid, c.job_id, c.jobs_run) for c in [*self._busy, *self._idle]]
            restarts = dict(sorted(self.restarts.items()))
        children = [
            {"pid": pid, "job_id": job_id, "rss_mib": c.rss() >> 20, "jobs_run": ran} for c, pid, job_id, ran in every
        ]
        return {"capacity": self.size, "busy": busy, "children": children, "restarts": restarts}

    def pids(self) -> list[int]:
        with self._lock:
            return [c.pid for c in [*self._busy, *self._idle] if c.pid is not None]
