"""The reference pages say what the code does, checked both ways.

- ``docs/configuration.md`` against the configuration the code accepts: every
  top-level key of ``jobdeck.core.config.Config`` (with its ``JOBDECK_*`` variable
  exactly when ``ENV_KEYS`` has one), every table of ``EXTRA_TABLES``, and the
  keys each table's parser accepts; and no key on the page that the code
  does not accept.
- ``docs/api.md`` against ``/api/openapi.json`` as a real app serves it: every
  route and method has its ``### METHOD /path`` section, with the request's
  fields on its ``**Body**:`` line and its query parameters on its
  ``**Query**:`` line; every section is a route of the document; and every
  ``METHOD /path`` named anywhere in the docs or the README is a route.
- ``docs/cli.md`` against the ``jobdeck`` commands, and the state machine
  table of ``docs/architecture.md`` against ``app/core/states.py``.

Each checker takes the page's text, so the tests at the end show it fails
on a page that misses a key, a route or a field.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core import config as config_module
from jobdeck.core.config import ENV_KEYS, EXTRA_TABLES, Config

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# -- reading the pages ---------------------------------------------------------------------

HEADING = re.compile(r"^(#{2,4}) (.+?)\s*$", re.M)
ROW_KEY = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.M)


def sections(text: str, level: str = "##") -> dict[str, str]:
    """Each heading of ``level`` with the text up to the next heading of that level or above."""
    found: dict[str, str] = {}
    marks = [m for m in HEADING.finditer(text) if len(m[1]) <= len(level)]
    for mark, after in zip(marks, [*marks[1:], None]):
        if mark[1] == level:
            found[mark[2]] = text[mark.end() : after.start() if after else len(text)]
    return found


def table_keys(body: str) -> list[str]:
    """The first column of the first table in ``body``, each a backticked key."""
    table = re.search(r"(?:^\|.*\n)+", body, re.M)
    return ROW_KEY.findall(table[0]) if table else []


# -- configuration: what the code accepts --------------------------------------------------


def _string_sets(fn: Callable[..., Any]) -> set[str]:
    """The keys a parser accepts, read from its source: the string set it
    subtracts from the table's keys (``set(table) - {"a", "b"}``, directly or
    through a name assigned that set)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    named: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Set) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                named[target.id] = _strings(node.value)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            if isinstance(node.right, ast.Set):
                found |= _strings(node.right)
            elif isinstance(node.right, ast.Name) and node.right.id in named:
                found |= named[node.right.id]
    assert found, f"no accepted keys found in {fn.__qualname__}: its check changed; update this test"
    return found


def _strings(node: ast.Set) -> set[str]:
    return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def _option_reads() -> tuple[set[str], set[str]]:
    """The keys of ``[queues.NAME]`` and ``[types."T"]``, which do not refuse
    unknown keys, read from the code that reads them: ``options["k"]``,
    ``options.get("k")`` and ``"k" in options`` anywhere under app/. A read in
    a function that also names the "queues" table counts for both tables.
    Fresh sets each call, of a reading made once per test process: four tests
    ask, in each of the three runs CI makes, and each reading parsed every
    module under app/ and walked every function's tree anew (about 1.5 s of
    CPU each on the development machine)."""
    queues, types = _option_reads_once()
    return set(queues), set(types)


@functools.cache
def _option_reads_once() -> tuple[frozenset[str], frozenset[str]]:
    queues: set[str] = set()
    types: set[str] = set()

    def visit(node: ast.AST) -> tuple[set[str], bool]:
        """The keys read under ``node``, and whether it names "queues" (one
        pass: walking each function anew, nested ones again, took seconds)."""
        keys = {key} if (key := _read_of_options(node)) else set()
        named = isinstance(node, ast.Constant) and node.value == "queues"
        for child in ast.iter_child_nodes(node):
            child_keys, child_named = visit(child)
            keys |= child_keys
            named = named or child_named
        if isinstance(node, ast.FunctionDef) and keys:
            types.update(keys)
            if named:
                queues.update(keys)
        return keys, named

    for path in (REPO / "app").rglob("*.py"):
        visit(ast.parse(path.read_text()))
    assert queues and types, "no reads of [queues]/[types] options found under app/; update this test"
    return frozenset(queues), frozenset(types)


def _read_of_options(node: ast.AST) -> str | None:
    def is_options(n: ast.AST) -> bool:
        return isinstance(n, ast.Name) and n.id == "options"

    def text(n: ast.AST) -> str | None:
        return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None

    if isinstance(node, ast.Subscript) and is_options(node.value):
        return text(node.slice)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return text(node.args[0]) if node.func.attr == "get" and is_options(node.func.value) and node.args else None
    if isinstance(node, ast.Compare) and len(node.comparators) == 1 and is_options(node.comparators[0]):
        return text(node.left) if isinstance(node.ops[0], ast.In | ast.NotIn) else None
    return None


def accepted_config() -> dict[str, set[str]]:
    """Section name on the page -> the keys the code accepts there."""
    from jobdeck.jobs import intake, workflows
    from jobdeck.maintenance import schedule_entries
    from jobdeck.maintenance.alerts import AlertSettings
    from jobdeck.maintenance.thresholds import ThresholdSettings
    from jobdeck.maintenance.upkeep import Retention
    from jobdeck.web import tokens
    from jobdeck.web.dashboard import settings

    fields = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    queues, types = _option_reads()
    return {
        "Top-level keys": fields(Config) - {"extra"},
        "`[queues.NAME]`": queues,
        '`[types."TYPE"]`': types,
        "`[[schedules]]`": set(schedule_entries._KEYS),
        "`[workflows]`": {"max_jobs"},
        "`[workflows.NAME]`": set(workflows._CONFIG_FIELDS),
        "`[[workflows.NAME.jobs]]`": (set(intake._FIELDS) - set(workflows.REFUSED_OPTIONS)) | workflows._STEP_FIELDS,
        "`[retention]`": fields(Retention) - {"max_batches"},  # parse_retention refuses max_batches
        "`[alerts]`": fields(AlertSettings),
        "`[alerts.thresholds]`": fields(ThresholdSettings),
        "`[dashboard]`": _string_sets(settings.load_settings),
        "`[users.NAME]`": _string_sets(settings.load_users),
        "`[api_tokens.NAME]`": _string_sets(tokens.load_tokens),
        "`[artifacts]`": _string_sets(config_module.artifact_max_bytes),
        "`[logs]`": _string_sets(config_module.log_limits),
        "`[tracing]`": _string_sets(config_module.tracing_enabled),
    }


def config_problems(text: str, accepted: dict[str, set[str]]) -> list[str]:
    found = []
    documented = sections(text)
    tables = {re.match(r"`\[+([a-z_]+)", name)[1] for name in documented if name.startswith("`[")}
    for table in sorted(set(EXTRA_TABLES) - tables):
        found.append(f"the config accepts the table [{table}]; the page has no section for it")
    for table in sorted(tables - set(EXTRA_TABLES)):
        found.append(f"the page documents a table [{table}] the config does not accept")
    for name, keys in accepted.items():
        if name not in documented:
            found.append(f"no section {name!r} on the page")
            continue
        on_page = table_keys(documented[name])
        for key in sorted(keys - set(on_page)):
            found.append(f"{name}: the config accepts {key!r}; the page does not document it")
        for key in sorted(set(on_page) - keys):
            found.append(f"{name}: the page documents {key!r}; the config does not accept it")
        for key in {k for k in on_page if on_page.count(k) > 1}:
            found.append(f"{name}: {key!r} is documented twice")
    for name in documented:
        if name.startswith("`[") and name not in accepted:
            found.append(f"the page has a section {name!r} this test does not know: add its keys to accepted_config")
    found += env_problems(documented.get("Top-level keys", ""))
    return found


def env_problems(body: str) -> list[str]:
    """The environment column names ``JOBDECK_<KEY>`` exactly for ``ENV_KEYS``."""
    found = []
    for row in re.findall(r"^\|\s*`([a-z_]+)`\s*\|[^|]*\|([^|]*)\|", body, re.M):
        key, env = row
        variable = f"JOBDECK_{key.upper()}"
        if key in ENV_KEYS and variable not in env:
            found.append(f"{key}: can be set as {variable}; the page does not say so")
        if key not in ENV_KEYS and "JOBDECK_" in env:
            found.append(f"{key}: the page names an environment variable; the config reads none for it")
    return found


def test_configuration_page_matches_the_config() -> None:
    problems = config_problems((DOCS / "configuration.md").read_text(), accepted_config())
    assert not problems, "docs/configuration.md and the config disagree:\n" + "\n".join(problems)


def test_config_check_fails_on_an_undocumented_key() -> None:
    text = (DOCS / "configuration.md").read_text()
    accepted = accepted_config()
    accepted["Top-level keys"] = accepted["Top-level keys"] | {"new_key"}
    accepted["`[retention]`"] = accepted["`[retention]`"] - {"batch"}
    problems = config_problems(text.replace("| `dead_days` |", "| `deadline_days` |"), accepted)
    assert "Top-level keys: the config accepts 'new_key'; the page does not document it" in problems
    assert "`[retention]`: the config accepts 'dead_days'; the page does not document it" in problems
    assert "`[retention]`: the page documents 'deadline_days'; the config does not accept it" in problems
    assert "`[retention]`: the page documents 'batch'; the config does not accept it" in problems


def test_the_key_readers_find_what_the_parsers_refuse() -> None:
    """The keys read from the parsers' source are the ones they accept: each
    is loaded without complaint, and a key beside them is refused."""
    from jobdeck.core.config import ConfigError, load
    from jobdeck.web.dashboard.settings import load_settings

    for key in _string_sets(load_settings):
        load_settings(load(env={}, overrides={"dashboard": {key: 5}}))
    with pytest.raises(ConfigError, match="dashboard.nope: unknown configuration key"):
        load_settings(load(env={}, overrides={"dashboard": {"nope": 5}}))
    with pytest.raises(ConfigError, match="logs.nope: unknown key"):
        load(env={}, overrides={"logs": {"nope": 1}})
    queues, types = _option_reads()
    assert {"concurrency", "rate", "rate_key", "concurrency_key"} <= queues < types
    assert {"unique", "non_retryable", "max_snoozes", "capture_logging"} <= types - queues


# -- the HTTP API -------------------------------------------------------------------------

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ROUTE_HEADING = re.compile(rf"^(?:{'|'.join(METHODS)}) /\S+$")
MENTION = re.compile(rf"`({'|'.join(METHODS)}) (/[^`\s?]*)[^`]*`")


def openapi() -> dict[str, Any]:
    """The document a real app serves at /api/openapi.json."""
    import tempfile

    from jobdeck import create_app
    from jobdeck.core.config import load

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(load(env={}, overrides={"database_url": f"sqlite:///{tmp}/openapi.db"}))
        try:
            answer = app.test_client().get("/api/openapi.json")
        finally:
            app.extensions["jobdeck"].store.engine.dispose()
    assert answer.status_code == 200
    return answer.get_json()


def operations(doc: dict[str, Any]) -> dict[str, dict[str, set[str]]]:
    """``METHOD /path`` -> its body fields and query parameters."""
    schemas = doc.get("components", {}).get("schemas", {})

    def resolve(schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    found = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method.upper() not in METHODS:
                continue
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            found[f"{method.upper()} {path}"] = {
                "Body": set(resolve(body).get("properties", {})) if body else set(),
                "Query": {p["name"] for p in op.get("parameters", []) if p.get("in") == "query"},
            }
    return found


def api_problems(text: str, ops: dict[str, dict[str, set[str]]]) -> list[str]:
    found = []
    documented = {name: body for name, body in sections(text, "###").items() if ROUTE_HEADING.match(name)}
    for op in sorted(set(ops) - set(documented)):
        found.append(f"{op} is a route of /api/openapi.json; the page has no '### {op}' section")
    for op in sorted(set(documented) - set(ops)):
        found.append(f"the page documents {op}; /api/openapi.json has no such route")
    for op in sorted(set(ops) & set(documented)):
        for part in ("Body", "Query"):
            line = re.search(rf"^\*\*{part}\*\*:(.*(?:\n(?!\n).*)*)", documented[op], re.M)
            on_page = set(re.findall(r"`([a-z_]+)`", line[1])) if line else set()
            for name in sorted(ops[op][part] - on_page):
                found.append(f"{op}: the {part.lower()} takes {name!r}; its **{part}** line does not list it")
            for name in sorted(on_page - ops[op][part]):
                found.append(f"{op}: its **{part}** line lists {name!r}; the route does not take it")
    return found


def _route_pattern(path: str) -> str:
    return "/".join("{}" if re.fullmatch(r"\{[^}]*\}|<[^>]*>|\d+|[A-Z]+", part) else part for part in path.split("/"))


def mention_problems(pages: Iterable[Path], ops: Iterable[str]) -> list[str]:
    """Every ``METHOD /path`` named in backticks is a route (ids and
    placeholders, ``{job_id}``, ``<id>`` or ``ID``, match any parameter)."""
    known = {(op.split(" ")[0], _route_pattern(op.split(" ")[1])) for op in ops}
    found = []
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for method, path in MENTION.findall(line):
                if (method, _route_pattern(path.rstrip("/") or "/")) not in known:
                    found.append(f"{page.relative_to(REPO)}:{number}: `{method} {path}` is not a route")
    return found


@pytest.fixture(scope="module")
def api_ops() -> dict[str, dict[str, set[str]]]:
    return operations(openapi())


def test_api_page_matches_the_openapi_document(api_ops: dict[str, dict[str, set[str]]]) -> None:
    problems = api_problems((DOCS / "api.md").read_text(), api_ops)
    assert not problems, "docs/api.md and /api/openapi.json disagree:\n" + "\n".join(problems)


def test_every_route_named_in_the_docs_exists(api_ops: dict[str, dict[str, set[str]]]) -> None:
    problems = mention_problems([REPO / "README.md", *sorted(DOCS.glob("*.md"))], api_ops)
    assert not problems, "\n".join(problems)


def test_api_check_fails_on_an_undocumented_route_or_field(api_ops: dict[str, dict[str, set[str]]]) -> None:
    text = (DOCS / "api.md").read_text()
    ops = {**api_ops, "POST /api/jobs/{job_id}/pin": {"Body": set(), "Query": set()}}
    ops["POST /api/jobs/claim"] = {
        **ops["POST /api/jobs/claim"],
        "Body": ops["POST /api/jobs/claim"]["Body"] | {"lease"},
    }
    problems = api_problems(
        text.replace("### DELETE /api/schedules/{name}", "### DELETE /api/schedules/{schedule}"), ops
    )
    assert "POST /api/jobs/{job_id}/pin is a route of /api/openapi.json; the page has no " in "\n".join(problems)
    assert "POST /api/jobs/claim: the body takes 'lease'; its **Body** line does not list it" in problems
    assert "the page documents DELETE /api/schedules/{schedule}; /api/openapi.json has no such route" in problems


def test_mention_check_fails_on_a_route_that_is_not_there(
    tmp_path: Path, api_ops: dict[str, dict[str, set[str]]]
) -> None:
    page = REPO / "docs" / "mentions-probe.md"
    try:
        page.write_text(
            "`POST /api/jobs/<id>/cancel` and `GET /api/jobs/42` exist; `POST /api/jobs/<id>/pin` does not\n"
        )
        problems = mention_problems([page], api_ops)
    finally:
        page.unlink()
    assert problems == ["docs/mentions-probe.md:1: `POST /api/jobs/<id>/pin` is not a route"]


# -- the command line and the state machine ------------------------------------------------


def test_cli_page_names_every_command() -> None:
    from jobdeck.cli import main

    text = (DOCS / "cli.md").read_text()
    headings = {n for h in sections(text) for n in re.split(r", | and ", h) if n}
    commands = set(main.commands)
    assert commands - headings == set(), f"docs/cli.md has no section for: {sorted(commands - headings)}"
    stray = headings - commands - {"The database it uses"}
    assert stray == set(), f"docs/cli.md has sections for commands that do not exist: {sorted(stray)}"
    for name in main.commands["db"].commands:
        assert f"jobdeck db {name}" in text, f"docs/cli.md does not name `jobdeck db {name}`"


def test_architecture_state_machine_matches_app_states() -> None:
    from jobdeck.core.states import ALL_STATES, SOURCES, TARGETS

    body = sections((DOCS / "architecture.md").read_text())["The state machine"]
    rows = re.findall(r"^\| `([a-z_]+)` \| ((?:`[a-z]+`(?:, )?)+) \| ((?:`[a-z]+`(?:, )?)+) \|$", body, re.M)
    on_page = {name: (set(re.findall(r"`(\w+)`", src)), set(re.findall(r"`(\w+)`", dst))) for name, src, dst in rows}
    in_code = {
        t.value: ({s.value for s in ALL_STATES if s in SOURCES[t]}, {s.value for s in ALL_STATES if s in TARGETS[t]})
        for t in SOURCES
    }
    assert on_page == in_code, "docs/architecture.md's transition table differs from app/core/states.py"


def test_python_api_page_lists_exactly_what_jobdeck_exports() -> None:
    """``docs/python.md`` names each of ``jobdeck.__all__``, and nothing else
    as ``jobdeck.NAME``: the public API is documented in one place."""
    import jobdeck

    page = (REPO / "docs" / "python.md").read_text()
    listed = set(re.findall(r"^jobdeck\.(\w+)\s", page, re.M))
    assert listed == set(jobdeck.__all__), f"docs/python.md lists {sorted(listed)}; jobdeck exports {jobdeck.__all__}"
    for name in jobdeck.__all__:
        assert getattr(jobdeck, name) is not None
