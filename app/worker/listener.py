"""Cross-process wake-up on PostgreSQL: LISTEN/NOTIFY.

Every transaction that makes a job claimable (enqueue, retry, release, run now) also
issues ``NOTIFY jobdeck_jobs`` (``jobdeck.store.postgres``);
PostgreSQL delivers it at commit, to every listening session, once per
transaction however many jobs it inserted. Each process runs one
``Listener``: a thread on its own psycopg connection (not from the
SQLAlchemy pool, which hands connections out per transaction) that wakes the
worker pool, so a job enqueued on host A is claimed on host B within
milliseconds instead of at B's next poll.

The listener is only an accelerator: the pool keeps polling every
``poll_interval``, so while the listening connection is down (database
restart, network cut) jobs still start, just later. The listener reconnects
with exponential backoff and, once back, wakes the pool at once, since
notifications sent while it was away are lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from jobdeck.store import Store
from jobdeck.store.postgres import CHANNEL, listen_sql
from sqlalchemy.engine import URL, make_url

log = logging.getLogger("jobdeck.notify")

# TCP keepalives: a silently dropped connection (a host or network gone, not
# a restart, which closes the socket) is noticed within about 25 s.
_KEEPALIVE: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def conninfo(url: str | URL) -> str:
    """The libpq URI for a SQLAlchemy ``postgresql+psycopg://`` URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    """LISTEN on one dedicated connection; call ``on_notify`` per notification.

    ``connected`` is set while listening and ``received`` counts
    notifications: signals tests wait on instead of sleeping.
    """

    def __init__(
        self,
        dsn: str,
        on_notify: Callable[[], None],
        *,
        channel: str = CHANNEL,
        max_backoff: float = 5.0,
        tick: float = 0.2,
    ) -> None:
        self.dsn = dsn
        self.on_notify = on_notify
        self.channel = channel
        self.max_backoff = max_backoff
        self.tick = tick
        """How often the wait for notifications checks for ``stop``."""
        self.connected = threading.Event()
        self.received = 0
        self.reconnects = 0
        self.listens = 0
        """Connections that got as far as LISTEN (the first one included)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="jobdeck-listener", daemon=True)
        self._thread.start()

    def stop(self, grace: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, self.tick * 5))

    def _run(self) -> None:
        import psycopg

        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5, **_KEEPALIVE) as conn:
                    conn.execute(listen_sql(self.channel))
                    if failures or self.reconnects:
                        log.info("listening on %s again", self.channel)
                    self.listens += 1
                    self.connected.set()
                    failures = 0
                    self.on_notify()  # notifications sent while away are lost: look now
                    self._listen(conn)
            except Exception as exc:
                # Any error, not only psycopg's (a socket error, a failing
                # wake-up callback): the thread must live to reconnect.
                if self._stop.is_set():
                    break
                failures += 1
                self.reconnects += 1
                delay = min(self.max_backoff, 0.1 * 2 ** (failures - 1))
                log.warning(
                    "LISTEN connection lost (%s); polling every poll_interval, reconnecting in %.1fs",
                    exc.__class__.__name__,
                    delay,
                    exc_info=not isinstance(exc, psycopg.Error),
                )
                self._stop.wait(delay)
            finally:
                self.connected.clear()

    def _listen(self, conn: Any) -> None:
        while not self._stop.is_set():
            for _ in conn.notifies(timeout=self.tick):
                self.received += 1
                self.on_notify()


def listener_for(store: Store, wake: Callable[[], None]) -> Listener | None:
    """The listener a process runs beside its pool, waking it with ``wake``; None off PostgreSQL."""
    if store.dialect != "postgresql":
        return None
    return Listener(conninfo(store.engine.url), wake)
