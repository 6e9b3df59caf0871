"""What the process executor holds is shown: the pool's row keeps each
executor's capacity and busy slots and the process pool's children, so the
Workers page and ``/metrics`` of every process show them (revision 0029)."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from jobdeck.runtime import pool_for
from jobdeck.web.factory import create_app

from tests import process_handlers
from tests.conftest import wait_for
from tests.test_metrics import scrape, value

pytestmark = [pytest.mark.backends, pytest.mark.slow]  # child interpreters: left out of the quick tier


def test_the_workers_page_and_metrics_show_the_children_and_their_restarts(make_config, tmp_path: Path) -> None:
    registry = Registry()
    process_handlers.register(registry, **{"proc.sleeps": {"timeout": 30}, "proc.segfaults": {}})
    deck = Jobdeck(make_config(process_workers=2), registry)
    deck.init_db()
    client = create_app(deck=deck, init_db=False).test_client()
    crash = deck.enqueue("proc.segfaults", {}).job
    pool = pool_for(deck, 3)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(crash.id).status is State.DEAD, timeout=30, message="the crash is failed")
        job = deck.enqueue("proc.sleeps", {"pidfile": str(tmp_path / "pid")}).job
        pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), timeout=30))

        def process_row() -> dict | None:
            held = deck.store.list_workers()[0]["executors"]
            process = (held or {}).get("process")
            return process if process and process["busy"] == 1 and process["restarts"] else None

        process = wait_for(process_row, timeout=30, message="the pool's row shows its busy child")
        assert process["capacity"] == 2 and process["restarts"] == {"crash": 1}
        assert {"pid": pid, "job_id": job.id} in [{k: c[k] for k in ("pid", "job_id")} for c in process["children"]]

        page = client.get("/workers").get_data(as_text=True)
        assert f"pid {pid}" in page and 'process <span class="mono">1/2</span> busy' in page
        assert "replaced: crash 1" in page

        samples = scrape(client)
        assert value(samples, "jobdeck_executor_busy", worker=pool.worker_id, executor="process") == 1
        assert value(samples, "jobdeck_executor_capacity", worker=pool.worker_id, executor="process") == 2
        assert value(samples, "jobdeck_executor_capacity", worker=pool.worker_id, executor="thread") == 3
        assert value(samples, "jobdeck_process_child_restarts_total", worker=pool.worker_id, cause="crash") == 1
        deck.cancel(job.id, "test")
        wait_for(lambda: deck.store.get(job.id).status is State.CANCELLED, timeout=15)
    finally:
        pool.stop(2.0)
        deck.store.engine.dispose()
