"""The process's APScheduler: a ``BackgroundScheduler`` owned by a service
that ``jobdeck.runtime.Runtime`` starts and stops (never at import time, never in
``create_app``, at most once per process). Its jobs are thin shells around the
``*_once(now)`` bodies:

- schedules: ``Periodic.enqueue_due_once`` every second;
- schedule health: ``ScheduleHealth.check_once`` every second;
- sweeper: ``Maintenance.sweep_once`` every ``sweep_interval`` seconds;
- counters: ``Maintenance.rollup_once`` every 15 seconds;
- retention: ``Maintenance.prune_once`` every minute;
- thresholds: ``ThresholdAlerts.check_once`` every 15 seconds.

``maintenance_loops`` lists them from the parts; the service runs any list
of (name, seconds, body) on a clock.

Any number of processes may run this against one database: every body is
deduplicated by the database (unique keys, conditional updates).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from jobdeck.core.clock import Clock, since_boot
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from jobdeck.maintenance.cron import Periodic
    from jobdeck.maintenance.schedule_health import ScheduleHealth
    from jobdeck.maintenance.thresholds import ThresholdAlerts
    from jobdeck.maintenance.upkeep import Maintenance

log = logging.getLogger("jobdeck.scheduler")

SCHEDULE_TICK = 1.0
STATS_TICK = 15.0
PRUNE_TICK = 60.0
THRESHOLD_TICK = 15.0

STEP_BACK = 1.0
"""Seconds the wall clock must step back for the ticks to be rearmed."""

_running: SchedulerService | None = None
_running_lock = threading.Lock()

Loop = tuple[str, float, Callable[[datetime], Any]]
"""A tick: its name, its interval in seconds, and its ``*_once(now)`` body."""


def maintenance_loops(
    schedules: Periodic,
    schedule_health: ScheduleHealth,
    maintenance: Maintenance,
    thresholds: ThresholdAlerts,
    sweep_interval: float,
) -> list[Loop]:
    """The ticks of the maintenance parts, each at its interval."""
    return [
        ("schedules", SCHEDULE_TICK, schedules.enqueue_due_once),
        ("schedule_health", SCHEDULE_TICK, schedule_health.check_once),
        ("sweeper", sweep_interval, maintenance.sweep_once),
        ("stats", STATS_TICK, maintenance.rollup_once),
        ("retention", PRUNE_TICK, maintenance.prune_once),
        ("thresholds", THRESHOLD_TICK, thresholds.check_once),
    ]


class SchedulerService:
    """Runs ``loops`` on APScheduler, each body given ``clock()``;
    ``schedules`` counts the recurring jobs for the start-up line."""

    def __init__(
        self,
        loops: Sequence[Loop],
        clock: Clock,
        schedules: Callable[[], int] = lambda: 0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.loops = list(loops)
        self.clock = clock
        self.schedules = schedules
        self.wall = wall
        """The wall clock APScheduler runs on (a test steps it)."""
        self.scheduler: BackgroundScheduler | None = None
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._wall_base: float | None = None

    def start(self) -> None:
        global _running
        with _running_lock:
            if _running is not None:
                raise RuntimeError("the Jobdeck scheduler is already running in this process")
            _running = self
        aps_log = logging.getLogger("apscheduler")
        if aps_log.level == logging.NOTSET:
            aps_log.setLevel(logging.WARNING)  # it logs every tick at INFO
        sched = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
        )
        for name, seconds, body in self.loops:
            sched.add_job(self._shell(name, body), "interval", seconds=seconds, id=name, name=f"jobdeck {name}",
                          next_run_time=datetime.now(UTC))  # fmt: skip
        sched.start()
        self.scheduler = sched
        self._stop.clear()
        self._watch = threading.Thread(target=self._watch_loop, name="jobdeck-scheduler-clock", daemon=True)
        self._watch.start()
        count = self.schedules()
        log.info(
            "scheduler started with %d schedule(s)", count, extra={"event": "scheduler.started", "schedules": count}
        )

    def rearm_after_step_once(self) -> bool:
        """APScheduler times its ticks on the wall clock: stepped back an
        hour, it ran no sweep, no cron and no retention for an hour. Each
        second this compares the wall clock with the boot clock; after a
        step back every tick is due now. True when it rearmed."""
        base = self.wall() - since_boot()
        stepped = self._wall_base is not None and base < self._wall_base - STEP_BACK
        self._wall_base = base
        sched = self.scheduler
        if not stepped or sched is None:
            return False
        log.warning("this host's clock stepped back; the maintenance ticks run now instead of waiting it out")
        now = datetime.now(UTC)
        for job in sched.get_jobs():
            job.modify(next_run_time=now)
        return True

    def _watch_loop(self) -> None:
        while not self._stop.wait(1.0):
            self.rearm_after_step_once()

    def _shell(self, name: str, body: Callable[[datetime], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                body(self.clock())
            except DBAPIError as exc:
                log.warning("%s: database error (%s); next tick retries", name, exc.__class__.__name__)
            except Exception:
                log.exception("%s failed; next tick retries", name)

        return run

    def stop(self, grace: float | None = None) -> None:
        global _running
        self._stop.set()
        if self.scheduler is not None:
            # Not waiting: a loop stuck on a connection the network dropped
            # held the stop (and the pool's grace behind it) for 15-20 s.
            # A stop run again after one that a signal cut short (at exit,
            # jobdeck.wsgi) finds it shut down already.
            if self.scheduler.running:
                self.scheduler.shutdown(wait=False)
            self.scheduler = None
        with _running_lock:
            if _running is self:
                _running = None
