"""The clock check: on PostgreSQL, measure this process's clock against the
database's at start and every ``clock_check_interval`` (``jobdeck.core.clock``), and
keep the offset in this process's workers row for the Workers page. A thin
loop around ``check_once``; it waits on a stop event."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from jobdeck.core.clock import DatabaseClock, Reading
from jobdeck.store.faults import is_transient

log = logging.getLogger("jobdeck.clock")


class ClockCheck:
    def __init__(
        self, clock: DatabaseClock, interval: float, on_reading: Callable[[Reading], None] | None = None
    ) -> None:
        self.clock = clock
        self.interval = interval
        self.on_reading = on_reading
        """Called with each reading (the runtime records it in its pool's row)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> Reading | None:
        """Measure once; None when nothing is measured or the database did not answer."""
        try:
            reading = self.clock.measure()
            if reading is not None and self.on_reading is not None:
                self.on_reading(reading)
        except Exception as exc:
            if not is_transient(exc):
                log.exception("measuring the database's clock failed")
            else:
                log.warning("measuring the database's clock failed (%s); next check retries", exc.__class__.__name__)
            return None
        return reading

    def _loop(self) -> None:
        self.check_once()
        while not self._stop.wait(self.interval):
            self.check_once()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="jobdeck-clock", daemon=True)
        self._thread.start()

    def stop(self, grace: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)  # a daemon: one stuck on a dropped connection is left behind
            self._thread = None
