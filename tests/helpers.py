"""Test-only helpers (kept out of conftest so modules can import them)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store import JobRecord, Outcome
from jobdeck.store.models import jobs
from sqlalchemy import event, update
from werkzeug.security import generate_password_hash

STARVED = ("stalled", "interrupted")
"""The outcomes of an attempt handed on from a process starved of CPU: rescued
by the others past ``stall_timeout``, or given back when its lease was lost."""
STARVED_SAID = ("heartbeat late", "lost its lease")
"""What such a process logs (``jobdeck.worker.leasing``): a test excuses a
starved attempt only where a process said one of these."""

PASSWORD_METHOD = "scrypt:1024:8:1"
"""The tests' users' password hashes: scrypt with 1/32 of werkzeug's default
work factor (32768), about 4 ms a hash or a check where the default takes
0.1 s of CPU. A hash names its method, and sign-in checks whatever a hash
names, so the code under test is the same; only werkzeug's loop is shorter.
Users' hashes, from ``jobdeck hash-password``, keep the default."""


def password_hash(password: str) -> str:
    return generate_password_hash(password, method=PASSWORD_METHOD)


def completions(claimed: list[JobRecord], worker: str = "w") -> list[Outcome]:
    """The outcomes of ``claimed`` jobs completed by ``worker``, each for its current attempt."""
    return [Outcome(j.id, worker, attempt=j.attempt, started_at=j.claimed_at) for j in claimed]


def force_state(deck: Jobdeck, job_id: int, state: State, worker_id: str | None = "w1", **values: Any) -> None:
    """Put a job straight into a state, to test transitions out of it.
    (Only tests write a status without a transition.)"""
    fields: dict[str, Any] = {"status": state.value, "worker_id": worker_id, **values}
    if state is State.RUNNING:
        fields.setdefault("attempt", 1)
        fields.setdefault("heartbeat_at", deck.clock())
        fields.setdefault("claimed_at", deck.clock())
    with deck.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(fields))


def settle_failures(deck: Jobdeck, *job_ids: int) -> dict[int, State]:
    """Run a real pool until every job has failed once (``failed`` or
    ``dead``); their states."""
    from jobdeck.runtime import pool_for

    from tests.conftest import wait_for

    pool = pool_for(deck, 2)
    pool.start()
    try:
        wait_for(
            lambda: all(deck.store.get(i).status in (State.FAILED, State.DEAD) for i in job_ids),
            message="every job failed once",
        )
    finally:
        pool.stop(grace=5)
    return {i: deck.store.get(i).status for i in job_ids}


@contextmanager
def statements_sent(deck: Jobdeck) -> Iterator[list[str]]:
    """Every statement the deck's store sends while inside: through
    SQLAlchemy (``before_cursor_execute``) and at driver level
    (``Transactions.alone`` and ``glance``, which bypass SQLAlchemy's events)."""
    sent: list[str] = []
    store = deck.store

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        sent.append(statement)

    def recording(open_: Any) -> Any:
        @contextmanager
        def wrapped() -> Iterator[Any]:
            with open_() as db:  # glance on PostgreSQL opens alone: record each statement once
                yield db if isinstance(db, _Recording) else _Recording(db, sent)

        return wrapped

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store, "alone", recording(store.alone))
            patch.setattr(store, "glance", recording(store.glance))
            yield sent
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


class _Recording:
    """A driver connection whose ``execute`` notes each statement's text."""

    def __init__(self, db: Any, sent: list[str]) -> None:
        self._db, self._sent = db, sent

    def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._sent.append(query)
        return self._db.execute(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def worst_oversleep(stopped: Callable[[], bool]) -> float:
    """Sleep 5 ms at a time until ``stopped()``; the longest a sleep overran
    (how long the thread was kept from running once its sleep was over)."""
    worst = 0.0
    while not stopped():
        began = time.monotonic()
        time.sleep(0.005)
        worst = max(worst, time.monotonic() - began - 0.005)
    return worst


SLEEP_PROBE = f"""
from __future__ import annotations
import sys, threading, time
{inspect.getsource(worst_oversleep)}
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print(worst_oversleep(stop.is_set), flush=True)
"""
"""``worst_oversleep`` in a process of its own, until its stdin closes."""


class SchedulingProbe:
    """While the ``with`` block runs, ``worst_oversleep`` in a process of its
    own and in a thread of this one; then ``machine`` and ``here`` are the
    longest each was kept from running once its sleep was over. A test's
    latency bound can allow for that: a machine that starves every process
    is not the defect the test is after, and the probe process is not
    slowed by anything the test's own process does wrong (a lock, a held
    GIL). ``here`` is this process's share of the CPU and its GIL, which
    the test's own threads may crowd."""

    def __init__(self) -> None:
        self.machine = 0.0
        self.here = 0.0
        self._process: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run_here, daemon=True)

    def _run_here(self) -> None:
        self.here = worst_oversleep(self._stop.is_set)

    def __enter__(self) -> SchedulingProbe:
        self._process = subprocess.Popen(
            [sys.executable, "-c", SLEEP_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._stop.set()
        self._thread.join(timeout=10)
        out, _ = self._process.communicate("", timeout=30)
        self.machine = float(out)


BUTTON_BOXES = """() => [...document.querySelectorAll("main button, main .btn")]
    .filter(e => getComputedStyle(e).visibility !== "hidden")
    .map(e => [e.textContent.trim(), e.getBoundingClientRect().toJSON()])
    .filter(([, box]) => box.width > 0 && box.height > 0)"""
"""Every visible button's text and box, read in one go: the page re-renders
as jobs move, and a button listed first and measured after could
be gone by then (seen: a bounding box of None, on the workflow
page and on the schedules and overview pages)."""
