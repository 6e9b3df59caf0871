"""``log_format = "json"``: Jobdeck's own logs (start, stop, dead job,
alert, audit) as one JSON object per line carrying job ids and types, from
a real ``jobdeck worker`` process; the text format stays the default."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from jobdeck.core.config import ConfigError, load
from jobdeck.core.structured_logs import JsonFormatter

from tests.conftest import wait_for
from tests.helpers import settle_failures  # noqa: F401  (the shared helper module must import)

pytestmark = pytest.mark.backends


def test_the_key_and_its_environment_variable(tmp_path):
    assert load(path=None, env={}).log_format == "text"
    assert load(path=None, env={"JOBDECK_LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(ConfigError, match=r"JOBDECK_LOG_FORMAT|log_format: must be text or json, got 'xml'"):
        load(path=None, env={"JOBDECK_LOG_FORMAT": "xml"})


def _json_records(deck, clock, act) -> list[dict]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("jobdeck")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        act()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    lines = stream.getvalue().splitlines()
    return [json.loads(line) for line in lines]


def test_dead_jobs_alerts_and_audit_carry_their_fields(make_deck, clock):
    from jobdeck.store import Outcome

    deck = make_deck(clock=clock, alerts={"thresholds": {"no_live_workers": ["default"]}})

    def act() -> None:
        job, _ = deck.enqueue("demo.fail", max_retries=0, payload={"note": "line one\nINFO forged: line two\x00"})
        [claimed] = deck.store.claim("w", clock.now)
        deck.store.fail_many([Outcome(job.id, "w", attempt=claimed.attempt, error="boom\nERROR forged")], clock.now)
        deck.thresholds.check_once(clock.now)
        deck.retry(job.id, actor="alice") if hasattr(deck, "retry") else None
        deck.cancel(deck.enqueue("demo.noop")[0].id, actor="alice")

    records = _json_records(deck, clock, act)
    dead = next(r for r in records if r.get("event") == "job.dead")
    assert dead["level"] == "ERROR" and dead["logger"] == "jobdeck.alerts"
    assert dead["job_type"] == "demo.fail" and isinstance(dead["job_id"], int) and dead["attempts"] == 1
    assert "boom\nERROR forged" in dead["message"]  # kept, but inside one JSON string
    firing = next(r for r in records if r.get("event") == "threshold.firing")
    assert firing["alert"] == "no_live_workers" and firing["queue"] == "default"
    audit = next(r for r in records if r.get("event") == "audit" and r["action"] == "cancel")
    assert audit["actor"] == "alice" and isinstance(audit["job_id"], int) and audit["count"] == 1
    assert all(r["time"].endswith("Z") for r in records)


@pytest.mark.slow
def test_a_worker_process_logs_json_lines(make_config, tmp_path):
    config = make_config(workers=1)
    env = {**os.environ, "JOBDECK_DATABASE_URL": config.database_url, "JOBDECK_LOG_FORMAT": "json",
           "JOBDECK_INSTANCE_PATH": str(tmp_path / "instance"), "JOBDECK_WORKERS": "1"}  # fmt: skip
    env.pop("JOBDECK_CONFIG", None)
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobdeck.cli", "worker", "--demo"], cwd=Path(__file__).resolve().parent.parent,
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: b"worker.started" in log_path.read_bytes(), timeout=30, message="the started line")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    events = [r.get("event") for r in records]
    assert "worker.started" in events and "worker.stopped" in events and "scheduler.started" in events
    started = next(r for r in records if r.get("event") == "worker.started")
    assert started["worker_id"] and started["threads"] == 1 and started["logger"] == "jobdeck.worker"
