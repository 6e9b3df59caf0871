"""Puts schedules, queue controls, dead-letter alerts and maintenance onto a
deck, validating their config. Called by ``create_app`` and by the runtime's
scheduler service (once per deck; the second call returns the first result),
so a bad schedule stops start-up before anything runs.
"""

from __future__ import annotations

import threading
import tomllib
import weakref
from dataclasses import dataclass
from pathlib import Path

from app.deck import Jobdeck
from app.maintenance.alerts import Alerts, parse_alerts
from app.maintenance.cron import Periodic, parse_schedules
from app.maintenance.upkeep import Maintenance, parse_retention
from app.queues import QueueControls, parse_limits

DEMO_CONFIG = Path(__file__).with_name("demo.toml")


@dataclass
class Operations:
    periodic: Periodic
    queues: QueueControls
    alerts: Alerts
    maintenance: Maintenance


_installed: weakref.WeakKeyDictionary[Jobdeck, Operations] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def install(deck: Jobdeck) -> Operations:
    """Validate the config's schedules, queues, types, alerts and retention
    tables (ConfigError naming the entry) and install them on ``deck``."""
    with _lock:
        ops = _installed.get(deck)
        if ops is not None:
            return ops
        config = deck.config
        if config.demo:
            with DEMO_CONFIG.open("rb") as fh:
                for key, value in tomllib.load(fh).items():
                    config.extra.setdefault(key, value)
        alerts = Alerts(deck, parse_alerts(config))
        alerts.install()  # registers jobdeck.alert before schedules are checked against the types
        ops = Operations(
            periodic=Periodic(deck, parse_schedules(config.extra.get("schedules"), deck)),
            queues=QueueControls(deck.store, parse_limits(config), refresh=config.poll_interval),
            alerts=alerts,
            maintenance=Maintenance(deck, parse_retention(config)),
        )
        ops.queues.install()
        _installed[deck] = ops
        return ops


def operations_of(deck: Jobdeck) -> Operations:
    return install(deck)
