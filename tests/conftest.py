"""Shared fixtures: a real SQLite file per test (and PostgreSQL when
JOBDECK_TEST_POSTGRES_URL is set), a Jobdeck on it, the Flask app and client,
an injectable clock, and ``wait_for`` (a poll with a deadline, never a sleep).
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from jobdeck import create_app
from jobdeck.core import forks
from jobdeck.core.config import load
from jobdeck.core.states import State
from jobdeck.deck import Jobdeck
from jobdeck.jobs.handlers import Registry
from sqlalchemy import Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.util import LRUCache
from werkzeug.routing.rules import Rule

pytest_plugins = ["tests.tiers"]  # the quick tier, and the tests that run alone

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _rules_compiled_once() -> None:
    """Werkzeug compiles every rule of every app: it parses the rule's text
    into the parts its matcher is built from (regular expressions, weights)
    and compiles two URL-builder functions (Python code, through ``ast`` and
    ``compile``). That was most of the CPU ``create_app`` takes, and the
    suite makes well over a thousand apps per run. Only the tests do this: a
    deployment builds its app once.

    Both are made from the rule's text, its defaults and the converter
    classes of the app's map, so an app after the first reuses what was made
    for an identical rule. The parts and the trace are plain data; each rule
    gets converter objects of its own, bound to its own map, made with the
    arguments the first parse gave them; a builder reaches its rule through
    its ``self`` argument (it is bound to each rule afterwards)."""
    compile_rule = Rule.compile
    compile_builder = Rule._compile_builder
    get_converter = Rule.get_converter
    parsed: dict[tuple[Any, ...], tuple[list[Any], list[Any], list[tuple[Any, ...]]]] = {}
    builders: dict[tuple[Any, ...], Callable[..., Any]] = {}
    recording: list[list[tuple[Any, ...]]] = []

    def recorded(self: Rule, variable: str, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if recording:
            recording[-1].append((variable, name, args, kwargs))
        return get_converter(self, variable, name, args, kwargs)

    def compile(self: Rule) -> None:
        assert self.map is not None, "rule not bound"
        key = (self.rule, self.subdomain, self.host, self.map.host_matching, self.merge_slashes,
               tuple(self.map.converters.items()))  # fmt: skip
        if key not in parsed:
            recording.append([])
            try:
                compile_rule(self)
            finally:
                made = recording.pop()
            parsed[key] = (list(self._parts), list(self._trace), made)
            return
        parts, trace, made = parsed[key]
        self._parts = list(parts)
        self._trace = list(trace)
        self._converters = {v: self.get_converter(v, name, args, kwargs) for v, name, args, kwargs in made}
        self.arguments.update(v for v, *_ in made)
        self._build = self._compile_builder(False).__get__(self, None)
        self._build_unknown = self._compile_builder(True).__get__(self, None)

    def cached_builder(self: Rule, append_unknown: bool = True) -> Callable[..., Any]:
        # The rule's text gives its parts and each converter's arguments; the
        # classes the text names come from the app's map, the same in every app.
        key = (
            (self.rule, self.subdomain, self.host),
            repr(sorted((self.defaults or {}).items())),
            tuple((k, type(c)) for k, c in self._converters.items()),
            append_unknown,
        )
        if key not in builders:
            builders[key] = compile_builder(self, append_unknown)
        return builders[key]

    Rule.compile = compile  # type: ignore[method-assign]
    Rule.get_converter = recorded  # type: ignore[method-assign]
    Rule._compile_builder = cached_builder  # type: ignore[method-assign]


_rules_compiled_once()


class _CompiledAcrossEngines(LRUCache[Any, Any]):
    """One cache of compiled statements for every engine of a test process.

    SQLAlchemy compiles each statement once per engine: its cache is the
    engine's own, keyed by the engine's dialect object. Every test opens
    its own engines, so it compiled again every statement it ran, several
    milliseconds of a test on a fresh deck. Two dialects that agree on
    their class and on every setting (what ``initialize`` read from the
    server included) compile a statement to the same SQL, so here they
    share what was compiled. A dialect's objects of its own (its identifier
    preparer, type compiler, memos, events) are made from those settings;
    the schema it found at connect is left out (a compiler reads it only
    for a ``schema_translate_map``, and such a statement keeps its engine's
    own entry). Only the tests do this: a deployment keeps its engines."""

    _OWN = frozenset({"_type_memos", "dispatch", "identifier_preparer", "type_compiler", "type_compiler_instance",
                      "_psycopg_adapters_map", "default_schema_name", "_has_events"})  # fmt: skip

    def __init__(self) -> None:
        super().__init__(5000)
        self._settings: weakref.WeakKeyDictionary[Dialect, tuple[Any, ...]] = weakref.WeakKeyDictionary()

    def _settings_of(self, dialect: Dialect) -> tuple[Any, ...]:
        settings = self._settings.get(dialect)
        if settings is None:
            settings = (type(dialect), *sorted(
                (name, value if isinstance(value, (bool, int, float, str, tuple, type(None))) else id(value))
                for name, value in dict(vars(dialect)).items() if name not in self._OWN
            ))  # fmt: skip  # a copy: another thread may be memoizing an attribute on the dialect meanwhile
            self._settings[dialect] = settings
        return settings

    def _shared(self, key: Any) -> Any:
        if isinstance(key, tuple) and len(key) == 5 and isinstance(key[0], Dialect) and not key[3]:
            return (self._settings_of(key[0]), *key[1:])
        return key

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(self._shared(key), default)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(self._shared(key), value)


def _statements_compiled_once() -> None:
    """Every engine made in this process shares ``_CompiledAcrossEngines``."""
    shared = _CompiledAcrossEngines()
    init = Engine.__init__

    def engine_init(self: Engine, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self._compiled_cache is not None:
            self._compiled_cache = shared

    Engine.__init__ = engine_init  # type: ignore[method-assign]


_statements_compiled_once()


def _servers_asked_once() -> None:
    """SQLAlchemy asks the server about itself on each engine's first
    connection (its version, isolation level, string escapes, whether hstore
    is there: eight statements on PostgreSQL, about 1.5 ms of the test's CPU
    and 1 ms of the server's), and every PostgreSQL test makes engines of its
    own. The answers are the same for every engine on one server, one
    database and one user, but for the schema the connection starts in (its
    ``search_path``): a later engine there takes the settings the first one
    learned and asks only ``current_schema()``. Settings are taken only as
    plain values; a server with hstore (adapters to register) is asked in
    full each time. Only the tests do this: a deployment makes its engines
    once."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    initialize = PGDialect_psycopg.initialize
    learned: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    plain = (bool, int, float, str, tuple, type(None))

    def initialize_once(self: PGDialect_psycopg, connection: Any) -> None:
        url = connection.engine.url
        query = {k: re.sub(r"-csearch_path=\S*", "", str(v)) for k, v in url.query.items() if k != "application_name"}
        key = (type(self), url.host, url.port, url.database, url.username, tuple(sorted(query.items())))
        settings = learned.get(key)
        if settings is None:
            before = dict(vars(self))
            initialize(self, connection)
            changed = {k: v for k, v in vars(self).items() if k not in before or before[k] is not v}
            for own in ("default_schema_name", "_type_memos", "_psycopg_TransactionStatus"):
                changed.pop(own, None)  # the schema; a memo made afresh; one read lazily
            usable = not self._has_native_hstore and all(isinstance(v, plain) for v in changed.values())
            learned.setdefault(key, changed if usable else None)
            return
        vars(self).update(settings)
        self.default_schema_name = connection.exec_driver_sql("SELECT current_schema()").scalar()

    PGDialect_psycopg.initialize = initialize_once  # type: ignore[method-assign]


_servers_asked_once()

CHROMIUM = Path("/usr/bin/chromium-headless-shell")
"""Debian's Chromium headless shell (the package chromium-headless-shell):
Playwright cannot download a browser on these machines. It is the browser
Playwright itself runs for headless tests, without the full browser's window
and compositing layers: the browser tests spent about half the CPU with it
that they spent with the full ``chromium`` (35.7 against 67.8 core-seconds
for the same 19 tests, twice each, on one machine)."""


class Clock:
    """A settable UTC clock for ``*_once(now)`` style tests."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, message: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)  # polling interval with a deadline, not a fixed wait


def all_in(deck: Jobdeck, ids: Iterable[int], states: Iterable[Any]) -> bool:
    """Whether every job of ``ids`` is in one of ``states``, read in one
    query. A poll that read the jobs one by one (``store.get``, a hundred
    reads a poll every 10 ms) competes for the GIL with the pool it waits
    for: on a starved machine (a quick tier in CI) a pool's 83 async jobs
    were still running 25 s after it had its lease back, most likely its
    event loop held back by that poll (not reproduced)."""
    from jobdeck.store.models import jobs
    from sqlalchemy import select

    wanted = {State(s).value for s in states}
    ids = list(ids)
    with deck.store.read() as conn:
        rows = conn.execute(select(jobs.c.status).where(jobs.c.id.in_(ids))).scalars().all()
    return len(rows) == len(set(ids)) and all(r in wanted for r in rows)


PLUMBING = (
    "jobdeck-fetch",
    "jobdeck-ack",
    "jobdeck-monitor",
    "jobdeck-beat",
    "jobdeck-heart",
    "jobdeck-lease",
    "jobdeck-listener",
)
"""The name prefixes of a pool's own threads (not its executors'), joined before a test's engines are disposed."""
PLUMBING_GRACE = 10.0
_lingering: list[Any] = []
"""Disposed engines' old pools that had a connection out: closed again after each later test."""


@pytest.fixture(autouse=True)
def _engines_closed() -> Iterator[None]:
    """Engines a test made (``jobdeck.store.engine.make_engine``) are disposed
    when it ends, so the connections resting in their pools are closed then,
    by this test, and not by the garbage collector in the middle of some later
    test: Python 3.13 warns of every sqlite3 connection never closed, psycopg
    of every connection deleted open, and the suite makes warnings errors, so
    one test's leak failed another, chosen by chance. A disposed engine still
    works: its next statement opens a fresh pool.

    First the pools' own threads the test started get a while to end: a
    pool's ``stop`` gives up waiting for them at its deadline, and on a
    starved machine an acker still writing then handed its connection back
    after the engine was disposed, into a pool nothing closed (seen: two
    psycopg connections reported deleted open in the next test). Executor
    threads are left alone: some tests leave a handler stuck on purpose.

    A thread can outlive that wait too (seen beside a CPU hog: one psycopg
    connection reported deleted open in a later test). Disposing gives the
    engine a new pool; a connection still checked out goes back into the old
    one when its thread lets go, and nothing would close it there before the
    collector did. So an old pool with a connection out is kept, and closed
    again when each later test ends, for the rest of the run: kept for 60 s
    only, one was let go before its connection came back (seen beside a CPU
    hog on a slow machine). Such pools are few (a handful a run), and closing
    an empty one costs microseconds. How long the connection stays out cannot
    be read off the pool: disposing it resets its count of them."""
    before = {id(engine) for engine in forks.engines()}
    threads = set(threading.enumerate())
    yield
    deadline = time.monotonic() + PLUMBING_GRACE
    for t in threading.enumerate():
        if t not in threads and t.name.startswith(PLUMBING) and t is not threading.current_thread():
            t.join(timeout=max(0.0, deadline - time.monotonic()))
    for pool in _lingering:
        pool.dispose()  # closes what came back to it since
    for engine in forks.engines():
        if id(engine) not in before:
            out = getattr(engine.pool, "checkedout", None)  # QueuePool's; a NullPool closes what comes back
            if out is not None and out() > 0:
                _lingering.append(engine.pool)
            engine.dispose()


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the test's own, where pytest's ``tmp_path`` puts it, made
    at once. pytest numbers each test's folder after reading the name of
    every folder the run made before it: work that grows with the run,
    about 2 ms a test by the 3,000th and 3.5 s of CPU over a quick tier run
    in one process, where making a folder with a unique name takes
    microseconds."""
    name = re.sub(r"\W", "_", request.node.name)[:30]
    return Path(tempfile.mkdtemp(prefix=name, dir=tmp_path_factory.getbasetemp()))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="session")
def demo_handlers() -> Registry:
    """The demo types, registered once per test process (registering checks
    each handler's signature: half a millisecond, for every test)."""
    from jobdeck import demo

    reg = Registry()
    demo.register(reg)
    return reg


@pytest.fixture
def registry(demo_handlers: Registry) -> Registry:
    """A fresh registry per test, with the demo types: a test's own
    registrations stay in it."""
    return demo_handlers.copy()


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobdeck.db'}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per test process: each test's
    ``db_url`` is a copy of it (milliseconds, where migrating is half a second)."""
    from jobdeck.store.engine import make_engine
    from jobdeck.store.schema import ensure_current

    path = tmp_path_factory.mktemp("template") / "jobdeck.db"
    engine = make_engine(f"sqlite:///{path}", pool_size=1)
    try:
        ensure_current(engine, auto_migrate=True)
    finally:
        engine.dispose()
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the one file that is copied
    return path


@pytest.fixture(scope="session")
def pg_schemas() -> Iterator[Any]:
    """Migrated PostgreSQL schemas for this test process, reset between
    tests (``tests.pgtest.Schemas``); made on first use, dropped at the end."""
    from tests.pgtest import Schemas

    schemas = Schemas()
    yield schemas
    schemas.close()


@pytest.fixture
def db_url(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The database of one test, already at the code's schema revision and
    holding no jobs: a copy of the migrated SQLite file, or (for tests marked
    ``backends`` running their postgres variant) a PostgreSQL schema of its
    own, reset to the migrated one. The migrations themselves are tested
    from ``empty_db_url``."""
    if backend == "postgres":
        from tests.pgtest import migrated_schema

        yield from migrated_schema(request, request.getfixturevalue("pg_schemas"))
        return
    shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / "jobdeck.db")
    yield sqlite_url(tmp_path)


@pytest.fixture
def empty_db_url(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database (no file yet on SQLite), for what must start from
    nothing: the migrations, and processes that migrate at start-up."""
    if backend == "postgres":
        from tests.pgtest import fresh_schema

        yield from fresh_schema(request)
        return
    yield sqlite_url(tmp_path)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """``sqlite``, or the backend a ``backends``-marked test was parametrized with."""
    return str(getattr(request, "param", "sqlite"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tests marked ``backends`` (e.g. ``pytestmark = pytest.mark.backends``)
    # run once per database: same test code, so a difference is a failure.
    # A test may pin one with @pytest.mark.parametrize("backend", ["postgres"], indirect=True).
    pinned = any("backend" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize"))
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("backends") and not pinned:
        twin = pytest.param("postgres", marks=pytest.mark.postgres_twin)  # left out of the quick tier
        metafunc.parametrize("backend", ["sqlite", twin], indirect=True)


@pytest.fixture
def make_config(tmp_path: Path, db_url: str) -> Callable[..., Any]:
    def make(**overrides: Any) -> Any:
        values: dict[str, Any] = {
            "database_url": db_url,
            "instance_path": str(tmp_path / "instance"),
            "workers": 0,
            "poll_interval": 0.05,
            "heartbeat_interval": 0.5,
            "stall_timeout": 5.0,
            "secret_key": "test-secret",
        }
        values.update(overrides)
        return load(path=None, env={}, overrides=values)

    return make


@pytest.fixture
def deck(make_config: Callable[..., Any], registry: Registry, clock: Clock) -> Iterator[Jobdeck]:
    """A Jobdeck on a fresh SQLite file, with the test clock."""
    d = Jobdeck(make_config(), registry, clock=clock)
    d.init_db()
    yield d
    d.store.engine.dispose()


@pytest.fixture
def live_deck(make_config: Callable[..., Any], registry: Registry) -> Iterator[Jobdeck]:
    """A Jobdeck on real time, for tests with real worker threads."""
    d = Jobdeck(make_config(), registry)
    d.init_db()
    yield d
    d.store.engine.dispose()


@pytest.fixture
def make_deck(make_config: Callable[..., Any], registry: Registry) -> Iterator[Callable[..., Jobdeck]]:
    """Build more Jobdecks on the test database (with config overrides); each
    is initialised, and its connections closed at teardown."""
    made: list[Jobdeck] = []

    def make(clock: Callable[[], Any] | None = None, **overrides: Any) -> Jobdeck:
        kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
        d = Jobdeck(make_config(**overrides), registry, **kwargs)
        d.init_db()
        made.append(d)
        return d

    yield make
    for d in made:
        d.store.engine.dispose()


@pytest.fixture
def app(deck: Jobdeck) -> Any:
    flask_app = create_app(deck=deck)
    flask_app.config["TESTING"] = True
    return flask_app


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()


@pytest.fixture
def dash(deck: Jobdeck) -> Any:
    """A dashboard test client on ``deck`` (snapshot cache off: reads are fresh)."""
    from dashboard_support import make_dash_app

    return make_dash_app(deck).test_client()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Every browser test (e2e and adversarial) launches Debian's Chromium
    headless shell. A missing one fails them: CI must never skip them."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium-headless-shell (the browser tests never skip)")
    return {
        **browser_type_launch_args,
        "executable_path": str(CHROMIUM),
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
        ],
    }
