"""Hostile artifacts: a name is user data that becomes a file name in a
``Content-Disposition`` header and on an operator's disk, a content type is
a header value, and a handler may hand over anything. Each hostile one is
refused by ``ctx.artifact`` with a clear message (the attempt fails with
it) before any SQL, and any name that passes downloads under exactly that
name in a header that cannot be split. Names that reach the store run on
SQLite and PostgreSQL, where a NUL would be a DataError."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.jobs.artifacts import InvalidArtifact, check_name
from jobdeck.jobs.handlers import JobContext
from jobdeck.runtime import pool_for
from jobdeck.store.artifacts import artifacts_of, get_artifact
from jobdeck.store.models import job_artifacts
from jobdeck.web.api.artifacts import content_disposition
from sqlalchemy import func, select

from tests.conftest import wait_for

HOSTILE_NAMES = {
    "": "non-empty",
    "a\x00b.csv": "control characters",
    "report.csv\r\nSet-Cookie: session=stolen": "control characters",
    "tab\there.csv": "control characters",
    "bell\x07.csv": "control characters",
    "del\x7f.csv": "control characters",
    "c1\x85.csv": "control characters",
    "invoice\u202egpj.exe": "control characters",  # shows as invoiceexe.jpg
    "zero\u200bwidth.csv": "control characters",
    "line\u2028sep.csv": "control characters",
    "../../etc/passwd": "path separators",
    "a/b.csv": "path separators",
    "..\\..\\boot.ini": "path separators",
    "/abs.csv": "path separators",
    ".": "not . or ..",
    "..": "not . or ..",
    " leading.csv": "leading or trailing spaces",
    "trailing.csv ": "leading or trailing spaces",
    "x" * 256: "at most 255 bytes",
    "é" * 128: "at most 255 bytes",  # 128 characters, 256 bytes
}
HOSTILE_TYPES = [
    "text/html\r\nSet-Cookie: a=b",
    "text/html\nX: y",
    "text/html\x00",
    "nonsense",
    "text/",
    "/csv",
    "text/csv; charset",
    'text/csv; name="a\r\nb"',
    "text/csv" + "; a=b" * 100,
    "",
]

pytestmark = pytest.mark.backends


def _ctx(deck: Any) -> JobContext:
    job, _ = deck.enqueue("demo.noop", {})
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1, types=["demo.noop"])
    return JobContext(deck.store, job.id, claimed.attempt, "w1", job.type, deck.clock)


def _rows(deck: Any) -> int:
    with deck.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(job_artifacts)).scalar_one())


def test_hostile_names_and_content_types_are_refused_before_any_sql(deck):
    ctx = _ctx(deck)
    for name, why in HOSTILE_NAMES.items():
        with pytest.raises(InvalidArtifact, match=why):
            ctx.artifact(name, b"data")
    for content_type in HOSTILE_TYPES:
        with pytest.raises(InvalidArtifact, match="expected a media type"):
            ctx.artifact("a.csv", b"x", content_type=content_type)
    assert _rows(deck) == 0


def test_the_biggest_allowed_names_store_and_download(deck):
    ctx = _ctx(deck)
    longest = ["x" * 255, "é" * 127 + "x", "📈" * 63 + "abc"]
    for name in longest:
        ctx.artifact(name, name)
    assert sorted(a.name for a in artifacts_of(deck.store, ctx.job_id)) == sorted(longest)
    client = create_app(deck=deck).test_client()
    for name in longest:
        r = client.get(f"/api/jobs/{ctx.job_id}/artifacts/{quote(name, safe='')}")
        assert r.status_code == 200 and r.data == name.encode()


def test_a_handler_that_stores_a_hostile_artifact_fails_with_the_message(live_deck, registry):
    @registry.handler("test.hostile", max_retries=0)
    def hostile(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.artifact("../../etc/cron.d/evil", "* * * * * root sh")

    job, _ = live_deck.enqueue("test.hostile", {})
    pool = pool_for(live_deck, 1)
    pool.start()
    try:
        wait_for(lambda: live_deck.store.get(job.id).status is State.DEAD, message="the hostile job fails")
    finally:
        pool.stop(grace=5)
    assert "no path separators" in (live_deck.store.get(job.id).error or "")
    assert _rows(live_deck) == 0


def test_over_the_limit_the_attempt_fails_with_the_limit_in_its_message(make_deck, registry):
    deck = make_deck(artifacts={"max_bytes": "1 KiB"})
    create_app(deck=deck)  # installs the deck's limit, as jobdeck serve and worker do

    @registry.handler("test.big", max_retries=0)
    def big(payload: dict[str, Any], ctx: JobContext) -> None:
        ctx.artifact("big.bin", b"\x00" * 1025)

    job, _ = deck.enqueue("test.big", {})
    pool = pool_for(deck, 1)
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job.id).status is State.DEAD, message="the big job fails")
    finally:
        pool.stop(grace=5)
    error = deck.store.get(job.id).error or ""
    assert "artifact 'big.bin' is 1.0 KiB (1025 bytes); the limit is 1.0 KiB (1024 bytes" in error
    assert _rows(deck) == 0


NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(name=NAMES)
def test_any_name_is_refused_or_round_trips_through_the_header(name):
    """Property: ``check_name`` refuses the name with a message, or its
    Content-Disposition is one line of ASCII whose ``filename*`` decodes
    back to exactly the name and whose quoted fallback holds no quote."""
    try:
        check_name(name)
    except InvalidArtifact as exc:
        assert str(exc).startswith("artifact name")
        return
    header = content_disposition("attachment", name)
    assert header.isascii() and all(" " <= c <= "~" for c in header)
    _, fallback, extended = header.split("; ")
    assert unquote(extended.removeprefix("filename*=UTF-8''"), errors="strict") == name
    assert '"' not in fallback.removeprefix('filename="').removesuffix('"')


def test_stored_names_with_every_printable_oddity_download_as_themselves(deck):
    ctx = _ctx(deck)
    odd = ["%00.csv", "%0d%0a.csv", "a%2Fb.csv", "<script>.html", "'; DROP TABLE jobs; --.csv", "C:evil.txt"]
    for name in odd:
        ctx.artifact(name, name)
    client = create_app(deck=deck).test_client()
    for name in odd:
        r = client.get(f"/api/jobs/{ctx.job_id}/artifacts/{quote(name, safe='')}")
        assert r.status_code == 200 and r.data == name.encode(), name
        assert get_artifact(deck.store, ctx.job_id, name).data == name.encode()
        extended = r.headers["Content-Disposition"].split("filename*=UTF-8''")[1]
        assert unquote(extended) == name
