"""Artifacts in the store, on SQLite and PostgreSQL: ``ctx.artifact`` keeps
a handler's file in ``job_artifacts``; a later attempt replaces it, a stale
one does not; the size limit refuses before anything is stored; retention
deletes the rows with their job, on SQLite even where the connection does
not enforce foreign keys."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from jobdeck.core.errors import ArtifactNotFound
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.artifacts import ArtifactTooLarge, InvalidArtifact
from jobdeck.jobs.handlers import JobContext
from jobdeck.store import Outcome
from jobdeck.store.artifacts import artifacts_of, get_artifact, last_completed_artifacts
from jobdeck.store.models import job_artifacts
from jobdeck.store.schedules import record_manual_run
from jobdeck.store.upkeep import prune_finished
from sqlalchemy import event, func, select

pytestmark = pytest.mark.backends


def _running(deck: Jobdeck, job_type: str = "demo.noop", worker: str = "w1") -> JobContext:
    """A job claimed for real, and the context its handler would get."""
    job, _ = deck.enqueue(job_type, {})
    (claimed,) = deck.store.claim(worker, deck.clock(), limit=1, types=[job_type])
    assert claimed.id == job.id
    return JobContext(deck.store, job.id, claimed.attempt, worker, job_type, deck.clock)


def _rows(deck: Jobdeck) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(job_artifacts)).scalar_one())


def test_store_list_and_fetch_bytes_text_and_a_path(deck, tmp_path):
    ctx = _running(deck)
    png = bytes(range(256)) + b"\x00\xff" * 100  # every byte value, NUL included
    (tmp_path / "chart.png").write_bytes(png)
    ctx.artifact("sales.csv", "row,value\r\n0,0\r\n1,1\r\n")
    ctx.artifact("chart.png", tmp_path / "chart.png")
    info = ctx.artifact("data.bin", b"\x00\x01", content_type="application/x-thing; v=2")

    assert (info.name, info.size, info.attempt) == ("data.bin", 2, 1)
    listed = artifacts_of(deck.store, ctx.job_id)
    assert [(a.name, a.content_type, a.size) for a in listed] == [
        ("chart.png", "image/png", len(png)),
        ("data.bin", "application/x-thing; v=2", 2),
        ("sales.csv", "text/csv; charset=utf-8", 21),
    ]
    assert get_artifact(deck.store, ctx.job_id, "chart.png").data == png
    assert get_artifact(deck.store, ctx.job_id, "sales.csv").data == b"row,value\r\n0,0\r\n1,1\r\n"
    with pytest.raises(ArtifactNotFound, match="job .* has no artifact named 'nope.csv'"):
        get_artifact(deck.store, ctx.job_id, "nope.csv")


def test_unicode_text_is_stored_as_utf8_and_unknown_extensions_are_octet_streams(deck):
    ctx = _running(deck)
    ctx.artifact("résumé – 2026.txt", "naïve café ✓")
    ctx.artifact("blob.unknownext", b"\x89")
    ctx.artifact("notes.unknownext", "plain words")
    got = {a.name: a for a in artifacts_of(deck.store, ctx.job_id)}
    assert get_artifact(deck.store, ctx.job_id, "résumé – 2026.txt").data == "naïve café ✓".encode()
    assert got["résumé – 2026.txt"].content_type == "text/plain; charset=utf-8"
    assert got["blob.unknownext"].content_type == "application/octet-stream"
    assert got["notes.unknownext"].content_type == "text/plain; charset=utf-8"


def test_a_later_attempt_replaces_the_artifact_and_a_stale_one_does_not(deck, clock):
    first = _running(deck, "demo.flaky")
    first.artifact("report.csv", "attempt 1")
    deck.store.fail_many([Outcome(first.job_id, "w1", attempt=first.attempt, error="boom")], clock())
    clock.advance(3600)
    (again,) = deck.store.claim("w2", clock(), limit=1)
    second = JobContext(deck.store, again.id, again.attempt, "w2", again.type, clock)
    second.artifact("report.csv", "attempt 2, longer")

    (info,) = artifacts_of(deck.store, first.job_id)
    assert (info.attempt, info.size) == (2, len("attempt 2, longer"))
    first.artifact("report.csv", "late thread of attempt 1")  # a timed-out attempt finishing late
    assert get_artifact(deck.store, first.job_id, "report.csv").data == b"attempt 2, longer"
    second.artifact("report.csv", "attempt 2 again")  # the same attempt may rewrite its own
    assert get_artifact(deck.store, first.job_id, "report.csv").data == b"attempt 2 again"
    assert _rows(deck) == 1


def test_the_size_limit_refuses_before_storing(deck, tmp_path):
    deck.store.artifact_max_bytes = 1000
    ctx = _running(deck)
    ctx.artifact("exactly.bin", b"x" * 1000)
    with pytest.raises(ArtifactTooLarge, match=r"artifact 'big.bin' is 1001 B \(1001 bytes\); the limit is 1000 B"):
        ctx.artifact("big.bin", b"x" * 1001)
    with pytest.raises(ArtifactTooLarge, match="max_bytes"):
        ctx.artifact("big.txt", "é" * 501)  # 1002 bytes of UTF-8 in 501 characters
    huge = tmp_path / "huge.bin"
    with huge.open("wb") as fh:
        fh.truncate(50 * 1024 * 1024)  # sparse: refused by its size, never read
    with pytest.raises(ArtifactTooLarge, match="50.0 MiB"):
        ctx.artifact("huge.bin", huge)
    assert [a.name for a in artifacts_of(deck.store, ctx.job_id)] == ["exactly.bin"]


def test_the_default_limit_is_ten_mib(deck):
    ctx = _running(deck)
    ctx.artifact("ten.bin", b"\x00" * (10 * 1024 * 1024))
    with pytest.raises(ArtifactTooLarge, match="the limit is 10.0 MiB"):
        ctx.artifact("over.bin", b"\x00" * (10 * 1024 * 1024 + 1))
    assert get_artifact(deck.store, ctx.job_id, "ten.bin").info.size == 10 * 1024 * 1024


def test_bad_values_are_refused_with_a_clear_message(deck, tmp_path):
    ctx = _running(deck)
    with pytest.raises(InvalidArtifact, match="expected bytes, str or a path, got dict"):
        ctx.artifact("x.json", {"a": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArtifact, match="cannot read"):
        ctx.artifact("missing.csv", tmp_path / "missing.csv")
    with pytest.raises(InvalidArtifact, match="not valid Unicode"):
        ctx.artifact("s.txt", "\ud800")
    assert _rows(deck) == 0


def test_retention_deletes_artifacts_with_their_jobs(deck, clock):
    kept = _running(deck)
    kept.artifact("keep.csv", "still running")
    done = _running(deck)
    done.artifact("gone.csv", "finished")
    deck.store.complete_many([Outcome(done.job_id, "w1", attempt=done.attempt)], clock())
    clock.advance(86400)
    assert prune_finished(deck.store, [State.COMPLETED], clock() - timedelta(hours=1)) == 1
    assert artifacts_of(deck.store, done.job_id) == []
    assert [a.name for a in artifacts_of(deck.store, kept.job_id)] == ["keep.csv"]


def test_retention_deletes_them_even_without_foreign_key_enforcement(deck, clock, backend):
    """SQLite enforces foreign keys only on connections that ask; the prune
    deletes the rows itself instead of counting on the cascade."""
    if backend == "sqlite":

        @event.listens_for(deck.store.engine, "connect")
        def _no_foreign_keys(dbapi_connection, _record):  # after the engine's own (which turns them on)
            dbapi_connection.execute("PRAGMA foreign_keys=OFF")

        deck.store.engine.dispose()
    done = _running(deck)
    done.artifact("a.csv", "1")
    done.artifact("b.csv", "2")
    deck.store.complete_many([Outcome(done.job_id, "w1", attempt=done.attempt)], clock())
    clock.advance(86400)
    assert prune_finished(deck.store, [State.COMPLETED], clock()) == 1
    assert _rows(deck) == 0


def test_the_last_completed_run_of_each_schedule_and_its_artifacts(deck, clock):
    def run(schedule: str, outcome: str, body: str) -> int:
        ctx = _running(deck, "demo.report")
        record_manual_run(deck.store, schedule, ctx.job_id, clock())
        clock.advance(1)
        ctx.artifact("nightly.csv", body)
        if outcome == "completed":
            deck.store.complete_many([Outcome(ctx.job_id, "w1", attempt=ctx.attempt)], clock())
        else:
            deck.store.fail_many([Outcome(ctx.job_id, "w1", attempt=ctx.attempt, error="x", retryable=False)], clock())
        return ctx.job_id

    run("nightly", "completed", "old")
    good = run("nightly", "completed", "newest good")
    run("nightly", "dead", "broken")
    run("broken", "dead", "never good")
    found = last_completed_artifacts(deck.store, ["nightly", "broken", "unknown"])
    assert set(found) == {"nightly"}
    job_id, artifacts = found["nightly"]
    assert job_id == good and [a.name for a in artifacts] == ["nightly.csv"]
    assert get_artifact(deck.store, job_id, "nightly.csv").data == b"newest good"


def test_demo_report_keeps_its_csv_as_an_artifact(deck, registry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the report used to write under ./instance/reports
    ctx = _running(deck, "demo.report")
    result = registry.get("demo.report").fn({"name": "sales q4", "rows": 3}, ctx)
    expected = b"row,value\r\n0,0\r\n1,1\r\n2,4\r\n"
    assert result == {"artifact": "sales-q4.csv", "rows": 3, "bytes": len(expected)}
    assert get_artifact(deck.store, ctx.job_id, "sales-q4.csv").data == expected
    assert not Path("instance").exists()
