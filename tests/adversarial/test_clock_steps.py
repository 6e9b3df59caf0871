"""The scheduler's ticks when this host's wall clock steps back.

APScheduler times its interval ticks on the wall clock: stepped back an
hour, a process ran no sweep, no cron and no retention for an hour. The
scheduler service compares the wall clock with the boot clock and makes
every tick due at once after a step back."""

from __future__ import annotations

import time

from jobdeck.maintenance.scheduler import SchedulerService, maintenance_loops

from tests.conftest import wait_for


def test_a_wall_clock_stepped_back_does_not_stop_the_maintenance_ticks(make_deck):
    deck = make_deck(sweep_interval=3600.0)
    sweeps: list[object] = []
    original = deck.maintenance.sweep_once
    deck.maintenance.sweep_once = lambda now: sweeps.append(now) or original(now)  # type: ignore[method-assign]
    shift = [0.0]
    loops = maintenance_loops(deck.schedules, deck.schedule_health, deck.maintenance, deck.thresholds, 3600.0)
    service = SchedulerService(loops, deck.clock, wall=lambda: time.time() + shift[0])
    service.start()
    try:
        wait_for(lambda: len(sweeps) == 1, timeout=10, message="the first sweep")
        assert not service.rearm_after_step_once(), "no step yet"
        shift[0] = -60.0  # the next sweep is an hour away on the scheduler's clock, and now 60 s more
        wait_for(lambda: len(sweeps) == 2, timeout=10, message="a sweep at once after the step back")
    finally:
        service.stop()
    print(f"sweeps {len(sweeps)}: the second right after the wall clock stepped back 60 s")
