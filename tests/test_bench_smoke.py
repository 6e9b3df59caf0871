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


def test_the_shipped_processes_drain_every_job_and_render(tmp_path: Path) -> None:
    from bench import shipped_bench as sb

    runs = []
    for what in ("worker", "serve"):  # each raises unless all 200 completed
        got = sb.drain(what, 200, tmp_path)
        assert got["rate"] > 0 and got["startup_s"] > 0 and got["jobs"] == 200, (what, got)
        runs.append(got)
    fake = {"pool": {"rate": 2.0}, "worker": runs[0], "serve": runs[1], "huey": {"rate": 1.0}}
    summary = sb.summary([fake], [("worker", "huey"), ("worker", "pool"), ("serve", "pool"), ("nope", "huey")])
    assert summary["ratio"]["worker/huey"] == runs[0]["rate"] and "nope/huey" not in summary["ratio"]
    text = sb.table({"counts": dict(sb.TINY), "sqlite": sb.summary([fake], [("serve", "huey"), ("worker", "pool")])})
    assert "| `jobdeck worker --demo` |" in text and "| `jobdeck serve --demo` (granian) |" in text


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_two_shipped_workers_drain_a_postgres_database(tmp_path: Path, db_url: str) -> None:
    from bench import shipped_bench as sb

    got = sb.drain("worker", 200, tmp_path, db_url, procs=2)  # raises unless all 200 completed
    assert got["rate"] > 0 and 0 < got["jobs"] <= 200


def test_several_processes_are_timed_from_when_the_last_one_started() -> None:
    from datetime import UTC, datetime, timedelta

    from bench.shipped_bench import _timed

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    at = [t0 + timedelta(seconds=s) for s in range(6)]
    starts = [("a", at[1]), ("a", at[2]), ("b", at[3]), ("a", at[3]), ("b", at[4])]
    both = _timed(5, 2, starts, at[5], t0)  # b's first job at 3 s: 3 jobs from then, in 2 s
    assert (both["jobs"], both["seconds"], both["rate"], both["all_ran"], both["startup_s"]) == (3, 2, 1.5, True, 1)
    one = _timed(5, 2, [(w, t) for w, t in starts if w == "a"], at[5], t0)  # b never ran: the whole drain
    assert (one["jobs"], one["seconds"], one["all_ran"]) == (5, 4, False)


def test_a_traced_worker_exports_its_spans_to_the_sink(tmp_path: Path) -> None:
    from bench import shipped_bench as sb

    before = sb._Sink.received["requests"]
    with sb.otlp_sink() as env:
        assert env["JOBDECK_TRACING"] == "1"
        assert sb.drain("worker", 200, tmp_path, env=env)["rate"] > 0
    assert sb._Sink.received["requests"] > before  # tracing was on: the spans reached the sink


def test_the_executor_scenario_drains_on_both_executors_and_renders(capsys) -> None:
    from bench import executor_bench as eb

    # each figure raises unless the jobs after the warm-up completed, the process executor's in its children
    assert eb.main(["--tiny", "--no-peers", "--only", "process"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| Jobdeck: thread executor"))
    assert "error" not in out and "failed" not in row and row.count("jobs/s") == 2, out
    fake = {"in": [{"rate": 1000.0}, {"rate": 1000.0}], "process": [{"rate": 500.0}, {"error": "x"}]}
    peer = {"in": [{"rate": 1000.0}, {"rate": 1000.0}], "process": [{"rate": 250.0}, {"rate": 250.0}]}
    summary = eb.overheads({"jobdeck": fake, "rq": peer})
    assert summary["jobdeck"]["extra_ms"] == 1.0 and summary["jobdeck"]["errors"] == 1
    assert summary["rq"]["extra_ms"] == 3.0 and summary["rq"]["vs_jobdeck"] == 3.0  # the round both measured
    assert summary["rq"]["child_ratio"] == 2.0 and summary["jobdeck"]["child_ratio"] is None


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_executor_scenarios_async_drain_runs_an_async_handler_on_postgres(db_url: str, capsys) -> None:
    from bench import executor_bench as eb

    result = eb.run(dict(eb.TINY), {"async"}, peers=False, log=lambda _m: None)
    run = result["async"]["runs"]["jobdeck"][0]
    assert run.get("rate", 0) > 0, run  # raises in the harness unless every job completed
    assert "| jobs/s | " in eb.table(result)


def test_the_limits_scenario_drains_every_variant(tmp_path: Path) -> None:
    from bench import limits_bench

    result = limits_bench.compare(tmp_path, 300, 1)
    assert set(result["median"]) == set(limits_bench.VARIANTS)
    assert all(rate > 0 for rate in result["median"].values()), result


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_the_bulk_http_scenario_enqueues_every_job_both_ways_and_renders(
    tmp_path: Path, backend: str, db_url: str
) -> None:
    from bench import bulk_bench

    # Each way raises unless every call answered 201 and every job it sent is stored.
    result = bulk_bench.compare(tmp_path, 1, 1, db_url if backend == "postgres" else None)
    assert result["http"] > 0 and result["in_process"] > 0 and result["kept"] == result["http"] / result["in_process"]
    # Where bench/run.py puts each database's figure.
    where = {"serve": {"http_bulk": result}} if backend == "sqlite" else {"http_bulk_postgres": result}
    text = table({"machine": {"cores": 2, "python": "3", "sqlite": "3", "loadavg_at_start": [0, 0, 0]},
                  "mode": "tiny", "counts": {**TINY, "runs": 1}, "jobdeck": {}, **where})  # fmt: skip
    assert f"| 3. bulk HTTP enqueue, {result['database']}, 4 clients x 1,000 jobs/call (jobs/s) |" in text


def test_the_idle_scenario_measures_both_shipped_processes() -> None:
    from bench.idle_bench import run, table

    result = run(seconds=0.5, rounds=1, peers=False, settle=0.1)
    shares = {name: r["median"] for name, r in result["systems"].items()}
    assert set(shares) == {"jobdeck worker --demo", "jobdeck serve --demo"}
    assert all(0 <= share < 200 for share in shares.values()), shares  # of one core; two cores at most
    assert "jobdeck serve --demo" in table(result)


def test_the_scheduled_jobs_scenario_runs_every_trickled_job_and_renders() -> None:
    """Tiny sizes: every trickled job must run (the harness raises otherwise),
    on SQLite with a real worker process; the claim with nothing due is timed too."""
    from bench.scheduled_bench import run, table

    result = run(scheduled=300, rate=20, seconds=0.5, rounds=1, database_url=None)
    assert set(result["medians"]) == {0, 300}
    assert all(r[0]["jobs"] == 10 for r in result["rounds"].values())
    assert all(0 <= m["p50_ms"] <= m["p99_ms"] for m in result["medians"].values())
    assert "beside 300 jobs scheduled for later" in table(result)
