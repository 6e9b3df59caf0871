"""The pool's heartbeats and its lease (``jobdeck.worker.lease``): the beats that
tell every process this one is alive, the watch that acts when they stop
landing, and the jobs given back once they land again.

Three rules make it hold on a bad network:

- The watch does no I/O. A thread that writes can be stuck on a connection
  the network dropped, or behind a lock, for longer than the lease: acting
  on the lease from such a thread told handlers 76 s after a cut.
- A beat that has not landed within one interval does not hold up the
  next: another starts on another connection (at most ``BEATS_IN_FLIGHT``),
  so the first beat after the network is back lands at once instead of
  after TCP's retransmission backoff.
- Each beat also reads the database's clock once (``DatabaseClock.follow``),
  so every process follows a step of the database's clock within one beat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from jobdeck.core.clock import DatabaseClock, since_boot
from jobdeck.store import PoolBeat, Store
from jobdeck.store.timekeeping import record_late_beat
from jobdeck.worker.holdings import Holdings
from jobdeck.worker.lease import LEASE_LOST, Lease
from jobdeck.worker.results import first_line

log = logging.getLogger("jobdeck.worker")

BEATS_IN_FLIGHT = 4
"""At most this many heartbeats of one pool wait on the database at once."""


class Heartbeats:
    """One pool's heartbeats and its lease. ``wake`` makes the fetcher
    claim at once (the lease is back)."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        holdings: Holdings,
        lease: Lease,
        *,
        worker_id: str,
        heartbeat_interval: float,
        wake: Callable[[], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.holdings = holdings
        self.lease = lease
        self.worker_id = worker_id
        self.heartbeat_interval = heartbeat_interval
        self.wake = wake
        self._lock = threading.Lock()
        self._suspects: dict[int, int] = {}
        """Jobs the last beat found held by this worker id that the pool does not know: id -> attempt."""

    def heartbeat_once(self, now: datetime | None = None) -> int:
        """Beat for every held job and for the worker; without ``now`` the
        time is read once the store's write lock is held. The answer names
        the held jobs cancelled meanwhile (by any process): their handlers
        are told at once. Returns how many jobs were beaten."""
        beat = self.store.heartbeat_pool(self.worker_id, now or self.clock)
        self.holdings.cancel_running(beat.cancelled, held=True)
        self._release_orphans(beat)
        return len(beat.held)

    def beat_once(self) -> bool:
        """One heartbeat as the beat threads make it: follow the database's
        clock, beat, renew the lease, give back what was set aside. False
        when the database did not answer."""
        started = since_boot()
        try:
            if isinstance(self.clock, DatabaseClock):
                self.clock.follow()
            self.heartbeat_once()
        except Exception as exc:
            log.warning("heartbeat failed: %s", first_line(exc))
            return False
        self._note_late_beat(since_boot() - self.lease.renewed)
        if self.lease.renew(started):
            log.warning("worker pool %s has its lease again; claiming resumes", self.worker_id,
                        extra={"event": "worker.lease_regained", "worker_id": self.worker_id})  # fmt: skip
            self.wake()
        if not self.lease.lost and self.holdings.has_set_aside():
            self.release_set_aside()
        return True

    def late_beat_after(self) -> float:
        """Seconds between two landed beats past which a beat is late: half
        way from the beat period to the lease's end (half of stall_timeout,
        where the pool gives its jobs up; at stall_timeout others rescue them)."""
        period = min(self.heartbeat_interval, self.lease.ttl / 2)
        return (period + self.lease.ttl) / 2

    def _note_late_beat(self, gap: float) -> None:
        """A beat landed ``gap`` seconds after the one before it started: if
        that is late, say so in the log and in this worker's row."""
        if gap <= self.late_beat_after():
            return
        stall_timeout = self.lease.ttl * 2
        log.warning(
            "worker pool %s: heartbeat late, %.1f s since the last one landed (heartbeat_interval %g s, "
            "stall_timeout %g s); at stall_timeout other processes rescue this worker's jobs. A process starved "
            "of CPU or stuck behind the database beats late: give it room, or raise stall_timeout",
            self.worker_id, gap, self.heartbeat_interval, stall_timeout,
            extra={"event": "worker.heartbeat_late", "worker_id": self.worker_id, "seconds": round(gap, 3)},
        )  # fmt: skip
        try:
            record_late_beat(self.store, self.worker_id, gap, self.clock())
        except Exception as exc:
            log.warning("recording the late heartbeat failed: %s", first_line(exc))

    def heartbeat_loop(self, ended: threading.Event) -> None:
        """Start a beat every interval (at least four per lease, half of
        ``stall_timeout``), each on a thread of its own: a beat still waiting
        after one interval does not hold up the next.

        When ``ended`` is set, the loop ends once its beats in flight have
        landed or given up, for at most one lease: the pool's ``stop`` joins
        this loop before it writes the worker's last state, so a beat of the
        stopped pool does not land after it (nor outlive it as a thread).
        The stop waits for this loop only until its own deadline, though: a
        stop with a short grace, or hurried, can write its last state with a
        beat still waiting on the database. Such a beat moves the row's
        ``heartbeat_at``, never its ``stopped_at``."""
        interval = min(self.heartbeat_interval, self.lease.ttl / 2)
        beats: list[threading.Thread] = []
        while not ended.wait(interval):
            beats = [t for t in beats if t.is_alive()]
            if len(beats) >= BEATS_IN_FLIGHT:
                continue
            beat = threading.Thread(target=self.beat_once, name="jobdeck-beat", daemon=True)
            beat.start()
            beats.append(beat)
        give_up_at = since_boot() + self.lease.ttl
        for beat in beats:
            beat.join(timeout=max(0.0, give_up_at - since_boot()))

    # -- the lease ---------------------------------------------------------------

    def lease_watch_once(self, now: float | None = None) -> bool:
        """When the lease runs out, tell the running handlers (``ctx.cancelled``,
        reason "lease lost") and set the queued, unstarted jobs aside. No I/O
        and no lock a writer holds: it runs on time whatever the database
        does. True when the lease was lost just now."""
        if not self.lease.expired(now):
            return False
        unstarted = self.holdings.take_queued()  # the acker's held refill is set aside as it is handed over (run_job)
        running = self.holdings.set_aside(unstarted)
        self.holdings.cancel_running(running, reason=LEASE_LOST)
        log.error(
            "worker pool %s lost its lease: no heartbeat landed for %.1f s (half of stall_timeout); "
            "its %d running handlers are told to stop (ctx.cancelled), %d claimed jobs are not started, "
            "and nothing is claimed until a heartbeat lands",
            self.worker_id, self.lease.ttl, len(running), len(unstarted),
            extra={"event": "worker.lease_lost", "worker_id": self.worker_id},
        )  # fmt: skip
        return True

    def lease_watch_loop(self, ended: threading.Event) -> None:
        while not ended.wait(0.1):
            self.lease_watch_once()

    def release_set_aside(self) -> None:
        """Give back the jobs set aside while the lease was lost, fenced: a
        job rescued meanwhile is not touched. Kept for the next beat if the
        database refuses."""
        aside = self.holdings.take_set_aside()
        if not aside:
            return
        held = [(a.job.id, a.job.attempt) for a in aside]
        interrupted = {a.job.id: a.started for a in aside if a.started is not None}
        try:
            released = self.store.release(self.worker_id, held, self.clock(), interrupted=interrupted)
        except Exception as exc:
            self.holdings.keep_set_aside(aside)
            log.warning("releasing jobs set aside for the lost lease failed (%s); next beat retries", first_line(exc))
            return
        self.holdings.given_back(a.job.id for a in aside)
        self.holdings.room.set()
        log.warning(
            "released %d of %d jobs set aside while the lease was lost (the others were rescued meanwhile)",
            len(released), len(aside),
        )  # fmt: skip

    # -- jobs held without knowing ------------------------------------------------

    def _release_orphans(self, beat: PoolBeat) -> None:
        """A claim whose COMMIT landed but whose reply was lost holds jobs in
        the database that this pool never queued, and its beats kept them
        alive forever. A job the beats find under this worker id that the
        pool does not hold, twice in a row (a claim landing between the beat
        and the look is not taken for one), is released, fenced by its attempt."""
        with self._lock:  # beats in flight at once each compare with the last
            unknown = self.holdings.unknown(beat.held)
            orphans = [(j, a) for j, a in unknown.items() if self._suspects.get(j) == a]
            self._suspects = {j: a for j, a in unknown.items() if (j, a) not in orphans}
        if not orphans:
            return
        released = self.store.release(self.worker_id, orphans, self.clock())
        log.warning(
            "released %d jobs held under this worker id that the pool never received (a claim whose reply was "
            "lost): %s", len(released), released,
        )  # fmt: skip
