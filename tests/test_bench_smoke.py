"""Keeps the benchmark harness working: its Jobdeck-only parts with tiny
counts (no peers, no venv, no servers). No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import jobdeck_bench as jb
from bench import raw, workflow_bench
from bench.report import table
from bench.run import TINY, jobdeck_scenarios

pytestmark = pytest.mark.slow  # other processes and builds: left out of the quick tier


def test_jobdeck_scenarios_run_and_render(tmp_path: Path) -> None:
    result = jobdeck_scenarios(dict(TINY), {"1", "2", "4"}, tmp_path, log=lambda _m: None)
    for key in ("drain_FULL", "drain_NORMAL", "raw_drain_FULL", "enqueue_FULL", "enqueue16_FULL", "enqueue_many"):
        assert result[key]["median"] > 0, key
    assert 0 < result["latency_inproc"]["p50_ms"] <= result["latency_inproc"]["p99_ms"]
    text = table({"machine": {"cores": 2, "python": "3", "sqlite": "3", "loadavg_at_start": [0, 0, 0]},
                  "mode": "tiny", "counts": {**TINY, "runs": 1}, "jobdeck": result})  # fmt: skip
    assert "| 1. drain 300 no-op jobs, FULL" in text and "enqueue_many" in text


def test_raw_ceiling_drains_every_row(tmp_path: Path) -> None:
    assert raw.drain(tmp_path / "raw.db", 250, "NORMAL", batch=100) > 0  # raises unless all 250 were drained


def test_drain_checks_every_job_completed(tmp_path: Path) -> None:
    assert jb.drain(tmp_path, 120, "NORMAL", threads=2) > 0  # raises unless 120 completed


def test_the_flow_limits_scenario_runs_and_renders(tmp_path: Path) -> None:
    result = jobdeck_scenarios(dict(TINY), {"8"}, tmp_path, log=lambda _m: None)
    flow = result["flow_sqlite"]
    assert flow["limited"] > 0 and flow["unlimited"] > 0 and flow["jobs"] == TINY["flow"]
    text = table({"machine": {"cores": 2, "python": "3", "sqlite": "3", "loadavg_at_start": [0, 0, 0]},
                  "mode": "tiny", "counts": {**TINY, "runs": 1}, "jobdeck": result})  # fmt: skip
    assert "| 8. drain 200 jobs over 100 keys" in text


def test_the_workflows_scenario_drains_both_halves_and_prints_its_table(tmp_path: Path, capsys) -> None:
    result = jobdeck_scenarios(dict(TINY), {"9"}, tmp_path, log=lambda _m: None)
    w = result["workflow_sqlite"]  # each drain raises unless every job completed (B only after A)
    assert w["workflow"] > 0 and w["plain"] > 0 and w["workflow_jobs"] == 2 * TINY["workflows"]
    assert w["ratio"] == w["workflow"] / w["plain"]
    assert workflow_bench.main(["--workflows", "20", "--plain", "40", "--runs", "1", "--database-url", ""]) == 0
    out = capsys.readouterr().out
    assert "| sqlite |" in out and "(20 workflows, 40 jobs)" in out
