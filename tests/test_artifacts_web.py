"""Artifacts over HTTP: the API's list and download (token, 404s, headers,
weird names, HTML never inline), the dashboard's job page and download
(login; viewers may download), the Schedules page's link to the last
successful run's report, and a real worker pool running ``demo.report``
whose CSV downloads byte for byte."""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest
from dashboard_support import make_dash_app
from jobdeck import create_app
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import JobContext
from jobdeck.runtime import pool_for
from jobdeck.store import Outcome
from jobdeck.store.artifacts import get_artifact
from openapi_check import check

from tests.conftest import wait_for
from tests.helpers import password_hash

TOKEN = "artifact-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAGE_CSP_SANDBOX = "sandbox; default-src 'none'; frame-ancestors 'none'"


def _stored(deck: Jobdeck, artifacts: dict[str, tuple[bytes | str, str | None]], complete: bool = True) -> int:
    """A job that ran once and kept ``artifacts`` (name -> (data, content type))."""
    job, _ = deck.enqueue("demo.noop", {})
    (claimed,) = deck.store.claim("w1", deck.clock(), limit=1, types=["demo.noop"])
    ctx = JobContext(deck.store, job.id, claimed.attempt, "w1", job.type, deck.clock)
    for name, (data, content_type) in artifacts.items():
        ctx.artifact(name, data, content_type=content_type)
    if complete:
        deck.store.complete_many([Outcome(job.id, "w1", attempt=claimed.attempt)], deck.clock())
    return job.id


@pytest.fixture
def api(make_deck):
    deck = make_deck(api_token=TOKEN)
    app = create_app(deck=deck)
    app.config["TESTING"] = True
    return deck, app.test_client()


def _url(job_id: int, name: str) -> str:
    return f"/api/jobs/{job_id}/artifacts/{quote(name, safe='')}"


# -- the API ------------------------------------------------------------------------


def test_list_and_download_with_the_token(api):
    deck, client = api
    job_id = _stored(deck, {"sales.csv": ("row,value\r\n1,1\r\n", None), "raw.bin": (b"\x00\xff", None)})
    r = client.get(f"/api/jobs/{job_id}/artifacts", headers=AUTH)
    body = check(r, "/api/jobs/{job_id}/artifacts", "get")
    assert [(a["name"], a["content_type"], a["size"], a["attempt"]) for a in body["artifacts"]] == [
        ("raw.bin", "application/octet-stream", 2, 1),
        ("sales.csv", "text/csv; charset=utf-8", 16, 1),
    ]
    r = client.get(_url(job_id, "sales.csv"), headers=AUTH)
    assert r.status_code == 200 and r.data == b"row,value\r\n1,1\r\n"
    assert r.headers["Content-Type"] == "text/csv; charset=utf-8"
    assert r.headers["Content-Disposition"] == "attachment; filename=\"sales.csv\"; filename*=UTF-8''sales.csv"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Content-Security-Policy"] == PAGE_CSP_SANDBOX
    assert r.headers["Cache-Control"] == "private, no-store"


def test_the_token_is_required(api):
    deck, client = api
    job_id = _stored(deck, {"a.csv": ("1", None)})
    for url in (f"/api/jobs/{job_id}/artifacts", _url(job_id, "a.csv")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = client.get(url, headers=headers)
            assert r.status_code == 401 and "bearer token" in r.get_json()["error"]
            assert r.data != b"1"


def test_unknown_job_and_unknown_name_are_404_and_impossible_names_422(api):
    deck, client = api
    job_id = _stored(deck, {"a.csv": ("1", None)})
    r = client.get("/api/jobs/999999/artifacts", headers=AUTH)
    assert check(r, "/api/jobs/{job_id}/artifacts", "get") == {"error": "job 999999 does not exist"}
    r = client.get(_url(999999, "a.csv"), headers=AUTH)
    assert check(r, "/api/jobs/{job_id}/artifacts/{name}", "get") == {"error": "job 999999 does not exist"}
    r = client.get(_url(job_id, "b.csv"), headers=AUTH)
    assert check(r, "/api/jobs/{job_id}/artifacts/{name}", "get") == {
        "error": f"job {job_id} has no artifact named 'b.csv'"
    }
    for bad in ("a\x00.csv", "a\r\nSet-Cookie: x=1", "..", " a.csv", "x" * 256, "\u202egpj.exe"):
        r = client.get(_url(job_id, bad), headers=AUTH)
        assert r.status_code == 422, bad
        assert "artifact name" in check(r, "/api/jobs/{job_id}/artifacts/{name}", "get")["error"]
    assert client.get(f"/api/jobs/{job_id}/artifacts/a%2Fb.csv", headers=AUTH).status_code == 404


WEIRD = [
    "résumé – 2026.csv",
    'quote " inside.csv',
    "semi;colon, comma=equals.csv",
    "100% done?#frag.csv",
    "emoji 📈.csv",
    "spaces  inside.csv",
    "日本語のレポート.csv",
]


def test_weird_names_download_under_their_exact_name(api):
    deck, client = api
    job_id = _stored(deck, {name: (f"ok {i}", None) for i, name in enumerate(WEIRD)})
    for i, name in enumerate(WEIRD):
        r = client.get(_url(job_id, name), headers=AUTH)
        assert r.status_code == 200 and r.data == f"ok {i}".encode(), name
        disposition = r.headers["Content-Disposition"]
        assert "\r" not in disposition and "\n" not in disposition and disposition.isascii()
        head, fallback, extended = disposition.split("; ")
        assert head == "attachment"
        assert unquote(extended.removeprefix("filename*=UTF-8''")) == name
        inner = fallback.removeprefix('filename="').removesuffix('"')
        assert '"' not in inner and "\\" not in inner and len(inner) == len(name)
    listed = client.get(f"/api/jobs/{job_id}/artifacts", headers=AUTH).get_json()["artifacts"]
    assert sorted(a["name"] for a in listed) == sorted(WEIRD)


def test_html_and_svg_are_attachments_and_never_run_safe_images_show_inline(api):
    deck, client = api
    html = "<script>fetch('/api/jobs', {method: 'POST'})</script><h1>pwned</h1>"
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    job_id = _stored(
        deck,
        {
            "report.html": (html, None),
            "chart.svg": (svg, None),
            "disguised.png": (html, "text/html"),
            "image.png": (b"\x89PNG\r\n\x1a\n", None),
            "log.txt": ("plain", None),
        },
    )
    for name, kind in [("report.html", "text/html"), ("chart.svg", "image/svg+xml"), ("disguised.png", "text/html")]:
        r = client.get(_url(job_id, name), headers=AUTH)
        assert r.headers["Content-Disposition"].startswith("attachment;"), name
        assert r.headers["Content-Type"].startswith(kind), name
        assert r.headers["Content-Security-Policy"] == PAGE_CSP_SANDBOX
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    for name in ("image.png", "log.txt"):
        r = client.get(_url(job_id, name), headers=AUTH)
        assert r.headers["Content-Disposition"].startswith("inline;"), name
        assert r.headers["Content-Security-Policy"] == PAGE_CSP_SANDBOX


# -- the dashboard ----------------------------------------------------------------


def test_the_job_page_lists_artifacts_with_their_size_and_links_them(dash, deck):
    name = 'sales <i>"q4"<i>.csv'
    job_id = _stored(deck, {name: ("x" * 3000, None), "tiny.txt": ("hi", None)})
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert '<section class="card" id="job-artifacts-card">' in html
    assert "sales &lt;i&gt;&#34;q4&#34;&lt;i&gt;.csv" in html and "<i>" not in html.split("job-artifacts-card")[1]
    assert "2.9 KiB" in html and "2 B" in html
    href = f"/jobs/{job_id}/artifacts/sales%20%3Ci%3E%22q4%22%3Ci%3E.csv"
    assert f'href="{href}" download>' in html
    r = dash.get(href)
    assert r.status_code == 200 and r.data == b"x" * 3000
    assert r.headers["Content-Disposition"].startswith("attachment;")
    assert "hx-trigger" not in html.split('id="job-artifacts"')[1].split(">")[0]  # completed: no polling


def test_a_running_jobs_artifacts_refresh_until_it_finishes(dash, deck):
    job_id = _stored(deck, {"part-1.csv": ("1", None)}, complete=False)
    html = dash.get(f"/jobs/{job_id}").get_data(as_text=True)
    tag = html.split('<div id="job-artifacts"')[1].split(">")[0]
    assert f'hx-get="/fragments/jobs/{job_id}/artifacts"' in tag and 'hx-trigger="jd-poll from:body"' in tag
    deck.store.complete_many([Outcome(job_id, "w1", attempt=1)], deck.clock())
    fragment = dash.get(f"/fragments/jobs/{job_id}/artifacts").get_data(as_text=True)
    assert fragment.startswith('<div id="job-artifacts">') and "part-1.csv" in fragment
    assert dash.get("/fragments/jobs/999999/artifacts").status_code == 404


def test_a_job_without_artifacts_shows_no_card(dash, deck):
    job_id = _stored(deck, {})
    assert "job-artifacts-card" not in dash.get(f"/jobs/{job_id}").get_data(as_text=True)


def test_dashboard_download_needs_a_login_and_viewers_may_download(deck):
    users = {"victor": {"password_hash": password_hash("victor-secret"), "role": "viewer"}}
    client = make_dash_app(deck, users=users).test_client()
    job_id = _stored(deck, {"report.csv": ("a,b\r\n", None)})
    url = f"/jobs/{job_id}/artifacts/report.csv"
    r = client.get(url)
    assert r.status_code == 302 and "/login?next=" in r.headers["Location"]
    assert client.get(f"/api/jobs/{job_id}/artifacts/report.csv").status_code == 401
    _login(client, "victor", "victor-secret")
    r = client.get(url)
    assert r.status_code == 200 and r.data == b"a,b\r\n"
    assert client.get(f"/api/jobs/{job_id}/artifacts/report.csv").data == b"a,b\r\n"
    assert client.get(f"/jobs/{job_id}/artifacts/other.csv").status_code == 404


def _login(client, name: str, password: str) -> None:
    import re

    html = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    r = client.post("/login", data={"username": name, "password": password, "csrf_token": token})
    assert r.status_code == 302


SCHEDULE = {
    "name": "nightly-sales",
    "cron": "0 2 * * *",
    "type": "demo.report",
    "payload": {"name": "sales", "rows": 5},
}


def test_the_schedules_page_links_the_last_successful_runs_artifacts(make_deck, clock, registry):
    deck = make_deck(clock=clock, schedules=[SCHEDULE])
    dash = make_dash_app(deck).test_client()
    assert "Last successful run" not in dash.get("/schedules").get_data(as_text=True)

    def run_once(fail: bool) -> int:
        job = deck.schedules.run_now("nightly-sales", clock(), "test")
        (claimed,) = deck.store.claim("w1", clock(), limit=1, types=["demo.report"])
        ctx = JobContext(deck.store, job.id, claimed.attempt, "w1", job.type, clock)
        result = registry.get("demo.report").fn(job.payload, ctx)
        outcome = Outcome(job.id, "w1", attempt=claimed.attempt, result=result, error="x" if fail else None)
        (deck.store.fail_many if fail else deck.store.complete_many)([outcome], clock())
        clock.advance(60)
        return job.id

    good = run_once(fail=False)
    run_once(fail=True)  # the newest run failed: the link stays on the last good one
    html = dash.get("/schedules").get_data(as_text=True)
    assert "Last successful run:" in html
    href = f"/jobs/{good}/artifacts/sales.csv"
    assert f'href="{href}"' in html
    r = dash.get(href)
    assert r.status_code == 200 and r.data == get_artifact(deck.store, good, "sales.csv").data
    assert r.data.startswith(b"row,value\r\n0,0\r\n")
    assert href in dash.get("/fragments/schedules").get_data(as_text=True)


# -- a real worker ----------------------------------------------------------------


@pytest.mark.backends
def test_a_real_worker_runs_demo_report_and_its_csv_downloads_byte_for_byte(make_deck):
    deck = make_deck(api_token=TOKEN)
    client = create_app(deck=deck).test_client()
    r = client.post(
        "/api/jobs", json={"type": "demo.report", "payload": {"name": "q4 sales", "rows": 50}}, headers=AUTH
    )
    assert r.status_code == 201, r.get_data(as_text=True)
    job_id = r.get_json()["id"]
    pool = pool_for(deck, 1, queues=["reports"])
    pool.start()
    try:
        wait_for(lambda: deck.store.get(job_id).status is State.COMPLETED, message="demo.report completes")
    finally:
        pool.stop(grace=5)
    expected = "row,value\r\n" + "".join(f"{i},{i * i}\r\n" for i in range(50))
    assert deck.store.get(job_id).result == {"artifact": "q4-sales.csv", "rows": 50, "bytes": len(expected)}
    r = client.get(f"/api/jobs/{job_id}/artifacts/q4-sales.csv", headers=AUTH)
    assert r.status_code == 200 and r.data == expected.encode()
    assert r.headers["Content-Type"] == "text/csv; charset=utf-8"
