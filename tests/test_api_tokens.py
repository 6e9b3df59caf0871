"""Named API tokens with least privilege (``jobdeck.web.tokens``,
``jobdeck.web.scopes``, ``jobdeck.web.guard``).

The scope matrix is enumerated from the Flask URL map: every operation the
API's guard protects must be in the scope table, and each scope's token is
allowed exactly what the table grants it (403 naming the scope otherwise),
so a new route without a declared scope fails here.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from typing import Any

import pytest
from click.testing import CliRunner
from jobdeck import create_app
from jobdeck.core.config import ConfigError
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.store.audit import list_audit
from jobdeck.web import scopes, tokens
from jobdeck.web.api.openapi import document
from jobdeck.web.exposure import exposure_problem

TYPES = ["ext.resize", "ext.other"]
SCHEDULES = [{"name": "nightly", "cron": "0 2 * * *", "type": "demo.noop"}]
LEGACY = "legacy-secret-token"
SECRETS = {
    "only-enqueue": "tok-enqueue-0123456789",
    "only-work": "tok-work-0123456789",
    "only-read": "tok-read-0123456789",
    "only-operate": "tok-operate-0123456789",
    "resize-worker": "tok-resize-0123456789",
    "media-worker": "tok-media-0123456789",
    "other-resizer": "tok-other-resizer-0123",
}


def entry(name: str, scope_list: list[str], **extra: Any) -> dict[str, Any]:
    return {"token_sha256": hashlib.sha256(SECRETS[name].encode()).hexdigest(), "scopes": scope_list, **extra}


API_TOKENS = {
    **{f"only-{s}": entry(f"only-{s}", [s]) for s in tokens.SCOPES},
    "resize-worker": entry("resize-worker", ["work"], types=["ext.resize"]),
    "media-worker": entry("media-worker", ["work"], queues=["media"]),
    "other-resizer": entry("other-resizer", ["work"], types=["ext.resize"]),
}


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS.get(name, name)}"}


@pytest.fixture
def tokened(make_deck: Any, clock: Any) -> Jobdeck:
    deck: Jobdeck = make_deck(clock, api_tokens=API_TOKENS, api_token=LEGACY, external_types=TYPES, schedules=SCHEDULES)
    return deck


@pytest.fixture
def api(tokened: Jobdeck) -> Any:
    app = create_app(deck=tokened)
    app.config["TESTING"] = True
    return app


# -- the matrix, from the URL map ----------------------------------------------------------


def guarded_operations(app: Any) -> dict[str, Any]:
    """Every ``METHOD /rule`` the API's guard stands in front of: the /api
    routes and ``/metrics``."""
    found = {}
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/") and rule.endpoint != "metrics.metrics":
            continue
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            found[scopes.key(method, rule.rule)] = rule
    return found


def undeclared(app: Any) -> list[str]:
    return sorted(set(guarded_operations(app)) - set(scopes.OPERATIONS))


def test_every_api_operation_declares_its_scope(api: Any) -> None:
    assert undeclared(api) == [], "add these operations to jobdeck.web.scopes.OPERATIONS"
    stale = sorted(set(scopes.OPERATIONS) - set(guarded_operations(api)))
    assert stale == [], f"the scope table names operations no route serves: {stale}"
    for key, granted in scopes.OPERATIONS.items():
        assert set(granted) <= set(tokens.SCOPES), key


def test_a_new_route_without_a_scope_fails_the_check_and_is_refused_to_named_tokens(tokened: Jobdeck) -> None:
    app = create_app(deck=tokened)
    app.config["WTF_CSRF_ENABLED"] = False  # an app-level route is not an exempt API blueprint's
    app.add_url_rule("/api/jobs/<int:job_id>/pin", "api_extra_pin", lambda job_id: {"ok": True}, methods=["POST"])
    app.before_request_funcs.setdefault(None, []).insert(0, _guard_extra)
    assert undeclared(app) == ["POST /api/jobs/<int:job_id>/pin"]
    client = app.test_client()
    job, _ = tokened.enqueue("demo.noop", {})
    for name in API_TOKENS:
        refused = client.post(f"/api/jobs/{job.id}/pin", headers=bearer(name))
        assert refused.status_code == 403, (name, refused.get_json())
        assert "declares no scope" in refused.get_json()["error"]
    assert client.post(f"/api/jobs/{job.id}/pin", headers=bearer(LEGACY)).status_code == 200


def _guard_extra() -> Any:
    from flask import request
    from jobdeck.web.guard import authenticate

    return authenticate() if request.endpoint == "api_extra_pin" else None


def _fixtures(deck: Jobdeck, client: Any) -> dict[str, str]:
    """A real object for every kind of path parameter."""
    job, _ = deck.enqueue("ext.resize", {"n": 1})
    workflow = client.post(
        "/api/workflows", json={"name": "wf", "jobs": [{"name": "a", "type": "demo.noop"}]}, headers=bearer(LEGACY)
    ).get_json()
    batch = client.post("/api/batches", json={"name": "b"}, headers=bearer(LEGACY)).get_json()
    return {
        "job_id": str(job.id),
        "workflow_id": str(workflow["id"]),
        "batch_id": str(batch["id"]),
        "name": "nightly",
        "key": "charge:1",
    }


def _url(rule: str, values: dict[str, str]) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match[1]
        if name == "name" and "/queues/" in rule:
            return "default"
        if name == "name" and "/artifacts/" in rule:
            return "report.txt"
        return values[name]

    return re.sub(r"<(?:\w+:)?(\w+)>", fill, rule)


def _call(client: Any, method: str, url: str, headers: dict[str, str]) -> Any:
    kwargs: dict[str, Any] = {"headers": headers}
    if method in ("POST", "PUT", "PATCH"):
        kwargs["json"] = {}
    return client.open(url, method=method, **kwargs)


@pytest.mark.parametrize("scope", tokens.SCOPES)
def test_each_scope_is_allowed_exactly_what_the_table_grants(api: Any, tokened: Jobdeck, scope: str) -> None:
    client = api.test_client()
    values = _fixtures(tokened, client)
    allowed, refused = [], []
    for key, rule in guarded_operations(api).items():
        method = key.split(" ", 1)[0]
        granted = scopes.OPERATIONS[key]
        response = _call(client, method, _url(rule.rule, values), bearer(f"only-{scope}"))
        if not granted or scope in granted:
            assert response.status_code not in (401, 403), (key, response.status_code, response.get_data()[:300])
            allowed.append(key)
        else:
            body = response.get_json()
            assert response.status_code == 403, (key, response.status_code, body)
            assert body["scope"] == granted[0] and f"lacks the scope {granted[0]}" in body["error"], (key, body)
            assert f"only-{scope}" in body["error"] and f"it has {scope}" in body["error"]
            refused.append(key)
    expected = {k for k, g in scopes.OPERATIONS.items() if not g or scope in g}
    assert set(allowed) == expected and refused
    if scope != "operate":  # nothing an operator does ran: the audit log is empty
        assert list_audit(tokened.store)[0] == []


def test_the_legacy_api_token_keeps_every_scope(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    values = _fixtures(tokened, client)
    for key, rule in guarded_operations(api).items():
        method = key.split(" ", 1)[0]
        response = _call(client, method, _url(rule.rule, values), bearer(LEGACY))
        assert response.status_code not in (401, 403), (key, response.get_json())
    entries, _ = list_audit(tokened.store)
    assert entries and {e.actor for e in entries} == {"api"}


def test_the_public_operations_need_no_token_and_any_other_needs_one(api: Any) -> None:
    client = api.test_client()
    assert client.get("/api/health").status_code == 200
    assert client.get("/api/openapi.json").status_code == 200
    assert client.get("/api/jobs").status_code == 401
    assert client.get("/api/jobs", headers=bearer("not-a-token")).status_code == 401


def test_the_document_states_each_operations_scope(api: Any) -> None:
    doc = api.test_client().get("/api/openapi.json").get_json()
    assert "scope" in doc["components"]["securitySchemes"]["bearer"]["description"]
    for key, granted in scopes.OPERATIONS.items():
        method, rule = key.split(" ", 1)
        operation = doc["paths"][scopes.openapi_path(rule)][method.lower()]
        assert operation["x-scopes"] == list(granted), key
        assert scopes.describe(granted) in operation["description"], key
        if granted:
            assert operation["security"] == [{"bearer": [s]} for s in granted], key
            assert "403" in operation["responses"] and "401" in operation["responses"], key
        else:
            assert operation["security"] == [], key
    assert document()["paths"]["/api/jobs/claim"]["post"]["x-scopes"] == ["work"]


# -- a work token confined to its types and queues ------------------------------------------


@pytest.mark.backends
def test_a_work_token_claims_and_sees_only_its_types(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    other, _ = tokened.enqueue("ext.other", {"n": 1}, priority=30)
    mine, _ = tokened.enqueue("ext.resize", {"n": 2})
    claimed = client.post("/api/jobs/claim", json={"worker_id": "go-1", "limit": 10}, headers=bearer("resize-worker"))
    assert claimed.status_code == 200 and [j["id"] for j in claimed.get_json()] == [mine.id]
    assert claimed.get_json()[0]["worker_id"] == "resize-worker/go-1"
    assert tokened.store.get(other.id).status is State.PENDING
    asked = client.post(
        "/api/jobs/claim", json={"worker_id": "go-1", "types": ["ext.other"]}, headers=bearer("resize-worker")
    )
    assert asked.status_code == 403 and asked.get_json()["field"] == "types"
    assert "works only types ext.resize" in asked.get_json()["error"]
    # The other type's job does not exist for it, whatever the operation.
    tokened.store.claim("w9", tokened.clock(), limit=1, types=["ext.other"])
    worker = {"worker_id": "w9"}
    for method, path, body in [
        ("GET", f"/api/jobs/{other.id}", None),
        ("GET", f"/api/jobs/{other.id}/logs", None),
        ("GET", f"/api/jobs/{other.id}/artifacts", None),
        ("GET", f"/api/jobs/{other.id}/artifacts/x.txt", None),
        ("GET", f"/api/jobs/{other.id}/effects", None),
        ("POST", f"/api/jobs/{other.id}/heartbeat", worker),
        ("POST", f"/api/jobs/{other.id}/complete", worker),
        ("POST", f"/api/jobs/{other.id}/fail", {**worker, "error": "x"}),
        ("POST", f"/api/jobs/{other.id}/snooze", {**worker, "seconds": 5}),
        ("POST", f"/api/jobs/{other.id}/release", {**worker, "attempt": 1}),
    ]:
        answer = client.open(path, method=method, json=body, headers=bearer("resize-worker"))
        assert answer.status_code == 404 and answer.get_json() == {"error": f"job {other.id} does not exist"}, path
    assert tokened.store.get(other.id).status is State.RUNNING and tokened.store.get(other.id).worker_id == "w9"
    # Its own job: read, beat, complete.
    assert client.get(f"/api/jobs/{mine.id}", headers=bearer("resize-worker")).status_code == 200
    assert client.get(f"/api/jobs/{mine.id}/logs", headers=bearer("resize-worker")).status_code == 200
    beat = client.post(f"/api/jobs/{mine.id}/heartbeat", json={"worker_id": "go-1"}, headers=bearer("resize-worker"))
    assert beat.status_code == 200
    done = client.post(f"/api/jobs/{mine.id}/complete", json={"worker_id": "go-1"}, headers=bearer("resize-worker"))
    assert done.status_code == 200 and done.get_json()["status"] == "completed"


@pytest.mark.backends
def test_a_work_token_confined_to_queues_claims_only_from_them(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    elsewhere, _ = tokened.enqueue("ext.resize", {}, queue="default", priority=30)
    media, _ = tokened.enqueue("ext.other", {}, queue="media")
    claimed = client.post("/api/jobs/claim", json={"worker_id": "m", "limit": 5}, headers=bearer("media-worker"))
    assert [j["id"] for j in claimed.get_json()] == [media.id]
    refused = client.post(
        "/api/jobs/claim", json={"worker_id": "m", "queues": ["default"]}, headers=bearer("media-worker")
    )
    assert refused.status_code == 403 and refused.get_json()["field"] == "queues"
    assert client.get(f"/api/jobs/{elsewhere.id}", headers=bearer("media-worker")).status_code == 404
    assert client.get(f"/api/jobs/{media.id}", headers=bearer("media-worker")).status_code == 200


@pytest.mark.backends
def test_attempts_name_the_token_and_another_token_cannot_act_for_its_worker(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    job, _ = tokened.enqueue("ext.resize", {}, max_retries=1)
    client.post("/api/jobs/claim", json={"worker_id": "go-1"}, headers=bearer("resize-worker"))
    # Same types, same worker id, another token: not the holder.
    stolen = client.post(f"/api/jobs/{job.id}/complete", json={"worker_id": "go-1"}, headers=bearer("other-resizer"))
    assert stolen.status_code == 409
    failed = client.post(
        f"/api/jobs/{job.id}/fail", json={"worker_id": "go-1", "error": "boom"}, headers=bearer("resize-worker")
    )
    assert failed.status_code == 200 and failed.get_json()["status"] == "failed"
    shown = client.get(f"/api/jobs/{job.id}", headers=bearer("only-read")).get_json()
    assert [a["worker_id"] for a in shown["attempts"]] == ["resize-worker/go-1"]
    assert [a.worker_id for a in tokened.store.attempts_of(job.id)] == ["resize-worker/go-1"]


def test_a_named_tokens_worker_id_leaves_room_for_its_name(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    tokened.enqueue("ext.resize", {})
    room = 200 - len("resize-worker/")
    too_long = client.post("/api/jobs/claim", json={"worker_id": "w" * (room + 1)}, headers=bearer("resize-worker"))
    assert too_long.status_code == 422 and too_long.get_json()["field"] == "worker_id"
    assert f"at most {room} characters with the token resize-worker" in too_long.get_json()["error"]
    fits = client.post("/api/jobs/claim", json={"worker_id": "w" * room}, headers=bearer("resize-worker"))
    assert fits.status_code == 200 and fits.get_json()["worker_id"] == "resize-worker/" + "w" * room


@pytest.mark.backends
def test_the_audit_log_names_the_token(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    job, _ = tokened.enqueue("demo.noop", {})
    assert client.post(f"/api/jobs/{job.id}/discard", headers=bearer("only-operate")).status_code == 200
    assert client.post("/api/queues/media/pause", headers=bearer("only-operate")).status_code == 200
    assert client.post(f"/api/jobs/{job.id}/retry", headers=bearer(LEGACY)).status_code == 200
    entries, _ = list_audit(tokened.store)
    assert [(e.actor, e.action) for e in reversed(entries)] == [
        ("token:only-operate", "discard"),
        ("token:only-operate", "queue.pause"),
        ("api", "retry"),
    ]


# -- /metrics --------------------------------------------------------------------------------


def _requests(client: Any) -> dict[tuple[str, str], float]:
    text = client.get("/metrics", headers=bearer("only-read")).get_data(as_text=True)
    found = {}
    for labels, value in re.findall(r"^jobdeck_api_requests_total\{(.*)\} (\S+)$", text, re.M):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found[(named["token"], named["code"])] = float(value)
    return found


def test_metrics_count_requests_by_token_name_with_bounded_labels(api: Any, tokened: Jobdeck) -> None:
    client = api.test_client()
    client.get("/api/jobs", headers=bearer("only-read"))
    client.post("/api/jobs", json={"type": "demo.noop"}, headers=bearer("only-enqueue"))
    client.get("/api/jobs", headers=bearer("only-enqueue"))  # 403
    client.get("/api/jobs", headers=bearer(LEGACY))
    client.get("/api/health")
    for n in range(50):  # made-up tokens cannot add labels
        client.get("/api/jobs", headers=bearer(f"made-up-{n}"))
    counted = _requests(client)
    assert counted[("only-read", "200")] >= 1
    assert counted[("only-enqueue", "201")] == 1 and counted[("only-enqueue", "403")] == 1
    assert counted[("api_token", "200")] == 1
    assert counted[("anonymous", "200")] == 1
    assert counted[("invalid", "401")] == 50
    assert {t for t, _ in counted} <= set(API_TOKENS) | set(tokens.FIXED_LABELS)


# -- hostile tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        SECRETS["only-read"] + "\x00",
        "\x00" + SECRETS["only-read"],
        SECRETS["only-read"][:-1],
        SECRETS["only-read"] + " x",
        "x" * 100_000,
        SECRETS["only-read"] * 200,
        "é" * 40,
        "",
    ],
    ids=["nul-after", "nul-before", "prefix", "suffix", "very-long", "repeated", "non-ascii", "empty"],
)
def test_a_hostile_token_is_401_never_a_crash(api: Any, given: str) -> None:
    client = api.test_client()
    answer = client.get("/api/jobs", headers={"Authorization": f"Bearer {given}"})
    assert answer.status_code == 401 and answer.get_json() == {"error": "missing or invalid bearer token"}


def test_tokens_are_compared_by_hash_in_constant_time_against_every_one(
    tokened: Jobdeck, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = tokens.load_tokens(tokened.config)
    calls: list[tuple[bytes, bytes]] = []
    real = tokens.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        assert isinstance(a, bytes) and isinstance(b, bytes) and len(a) == len(b) == 32  # digests, never the token
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", recording)
    for given in (SECRETS["only-enqueue"], SECRETS["other-resizer"], LEGACY, "wrong"):
        calls.clear()
        configured.identify(given)
        assert len(calls) == len(API_TOKENS) + 1, given  # every hash, whichever matched (the first, the last, none)
    assert configured.identify(SECRETS["only-enqueue"]).name == "only-enqueue"  # type: ignore[union-attr]
    assert configured.identify(LEGACY) is tokens.LEGACY


def test_a_token_whose_name_was_removed_opens_nothing(make_deck: Any) -> None:
    kept = {k: v for k, v in API_TOKENS.items() if k != "only-read"}
    deck = make_deck(api_tokens=kept)
    client = create_app(deck=deck).test_client()
    assert client.get("/api/jobs", headers=bearer("only-read")).status_code == 401
    assert client.post("/api/jobs", json={"type": "demo.noop"}, headers=bearer("only-enqueue")).status_code == 201


def test_named_tokens_alone_close_the_open_api(make_config: Any, make_deck: Any) -> None:
    deck = make_deck(api_tokens={"only-read": API_TOKENS["only-read"]})
    client = create_app(deck=deck).test_client()
    assert client.get("/api/jobs").status_code == 401  # from loopback too: a token is configured
    assert client.get("/api/jobs", headers=bearer("only-read")).status_code == 200
    users = {"alice": {"password_hash": "scrypt:32768:8:1$x$y", "role": "operator"}}
    exposed = make_config(bind="0.0.0.0:8000", api_tokens={"only-read": API_TOKENS["only-read"]}, users=users)
    assert exposure_problem(exposed) is None
    bare = make_config(bind="0.0.0.0:8000", users=users)
    assert "no api_token configured (nor any [api_tokens.NAME])" in (exposure_problem(bare) or "")


# -- the config ------------------------------------------------------------------------------

HASH = "ab" * 32


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"bad name": {"token_sha256": HASH, "scopes": ["read"]}}, "api_tokens.bad name: a token's name"),
        ({"session": {"token_sha256": HASH, "scopes": ["read"]}}, "not one of api_token, session"),
        ({"t": {"scopes": ["read"]}}, "api_tokens.t.token_sha256: required, 64 hex digits"),
        ({"t": {"token_sha256": "secret", "scopes": ["read"]}}, "api_tokens.t.token_sha256: required"),
        ({"t": {"token_sha256": HASH}}, "api_tokens.t.scopes: required"),
        ({"t": {"token_sha256": HASH, "scopes": ["admin"]}}, "'admin' is not a scope"),
        ({"t": {"token_sha256": HASH, "scopes": ["read"], "role": "x"}}, "api_tokens.t.role: unknown"),
        ({"t": {"token_sha256": HASH, "scopes": ["read", "work"], "types": ["a"]}}, "types and queues confine"),
        ({"t": {"token_sha256": HASH, "scopes": ["work"], "queues": []}}, "api_tokens.t.queues: 1 to 1000"),
        ({"t": {"token_sha256": HASH, "scopes": ["work"], "types": ["a\x00"]}}, "non-empty strings"),
        (
            {"a": {"token_sha256": HASH, "scopes": ["read"]}, "b": {"token_sha256": HASH, "scopes": ["work"]}},
            "api_tokens.b.token_sha256: the same token as api_tokens.a",
        ),
        ({"t": "secret"}, "api_tokens.t: expected a table"),
    ],
)
def test_a_bad_token_table_stops_start_up_naming_the_key(
    make_config: Any, registry: Any, table: Any, message: str
) -> None:
    deck = Jobdeck(make_config(api_tokens=table), registry)
    try:
        with pytest.raises(ConfigError, match=re.escape(message)):
            create_app(deck=deck, init_db=False)
    finally:
        deck.store.engine.dispose()


def test_a_named_token_may_not_reuse_the_legacy_secret(make_config: Any) -> None:
    table = {"t": {"token_sha256": hashlib.sha256(b"same").hexdigest(), "scopes": ["read"]}}
    with pytest.raises(ConfigError, match="the same token as api_token"):
        tokens.load_tokens(make_config(api_token="same", api_tokens=table))


# -- the command -----------------------------------------------------------------------------


def test_token_create_prints_the_token_once_and_the_lines_that_admit_it(make_config: Any) -> None:
    from jobdeck.cli import main

    result = CliRunner().invoke(
        main, ["token", "create", "resize.v2", "--scopes", "work,enqueue", "--types", "ext.resize", "--queues", "media"]
    )
    assert result.exit_code == 0, result.output
    secret = re.search(r"^    (\S+)$", result.output, re.M)[1]  # type: ignore[index]
    assert len(secret) == 43 and result.output.count(secret) == 1
    lines = result.output[result.output.index("[api_tokens.") :]
    table = tomllib.loads(lines)["api_tokens"]
    assert table == {
        "resize.v2": {
            "token_sha256": hashlib.sha256(secret.encode()).hexdigest(),
            "scopes": ["work", "enqueue"],
            "types": ["ext.resize"],
            "queues": ["media"],
        }
    }
    found = tokens.load_tokens(make_config(api_tokens=table)).identify(secret)
    assert found is not None and found.name == "resize.v2" and found.types == ("ext.resize",)
    again = CliRunner().invoke(main, ["token", "create", "resize.v2", "--scopes", "work"])
    assert re.search(r"^    (\S+)$", again.output, re.M)[1] != secret  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["token", "create", "w", "--scopes", "admin"], "'admin' is not a scope"),
        (["token", "create", "-w", "--scopes", "read"], "No such option"),
        (["token", "create", "w/x", "--scopes", "read"], "a token's name is 1 to 64"),
        (["token", "create", "w", "--scopes", "read", "--types", "a"], "types and queues confine a work token"),
        (["token", "create", "w"], "Missing option '--scopes'"),
    ],
)
def test_token_create_refuses_what_the_config_would(args: list[str], message: str) -> None:
    from jobdeck.cli import main

    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "[api_tokens." not in result.output


def test_the_api_page_lists_each_scopes_operations_as_the_table_does() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    section = page[page.index("\n## Tokens\n") :]
    section = section[: section.index("\n## ", 1)]
    on_page = {
        scope: set(re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`]+)`", row))
        for scope, row in re.findall(r"^\| `(\w+)` \| (.+) \|$", section, re.M)
    }
    in_table: dict[str, set[str]] = {s: set() for s in tokens.SCOPES}
    for key, granted in scopes.OPERATIONS.items():
        method, rule = key.split(" ", 1)
        for scope in granted:
            in_table[scope].add(f"{method} {scopes.openapi_path(rule)}")
    assert on_page == in_table
