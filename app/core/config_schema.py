"""The configuration's schema: every top-level key of ``jobdeck.toml`` as a
field of ``Config``, with its default and what it means (the reference page,
``docs/configuration.md``, is checked against these fields). Reading a file
and the environment into one, and checking it, is ``jobdeck.core.config``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


@dataclass
class Config:
    database_url: str = ""
    """SQLAlchemy URL. Default: SQLite at ``<instance_path>/jobdeck.db``."""
    instance_path: str = "instance"
    bind: str = "127.0.0.1:8000"
    workers: int = 4
    """Embedded worker threads; 0 runs the web process and API only."""
    http_server: str = "granian"
    """The HTTP server ``jobdeck serve`` runs: ``granian`` (HTTP in Rust,
    the app in one worker process it supervises: ``jobdeck.web.granian_server``)
    or ``waitress``, the pure-Python fallback, in this process
    (``jobdeck.web.server``). granian is the default because it answered more of
    everything in scenario 3 of the benchmark, run beside waitress and
    gunicorn (POST /api/jobs 790 against 606 req/s with the pool on, p99 30
    against 56 ms; health 4,443 against 2,439), and both pass the crash
    matrix, the idle-connection and the signal tests alike. Choose waitress
    where granian's wheel does not install, or to keep one process."""
    http_threads: int = 16
    """Threads answering HTTP requests (the WSGI calls). An idle connection
    holds no thread; only requests being answered do. Concurrent enqueues
    share one commit (group commit), so more threads make bigger batches:
    16 enqueued about a quarter more per second than 8 (bench scenario 3)."""
    http_connection_limit: int = 2000
    """Open HTTP connections the server holds before it stops accepting
    more. waitress's own default (100) let about 100 idle connections make
    the server unreachable; idle connections cost a file descriptor and a
    few kilobytes each. ``jobdeck serve`` raises the process's soft
    file-descriptor limit to fit, up to the hard limit (``ulimit -Hn``), and
    lowers this value, with a warning, when even the hard limit is short."""
    http_channel_timeout: float = 30.0
    """Seconds an HTTP connection may sit idle (no request in progress)
    before the server closes it (waitress's default: 120). Checked every
    ``http_channel_timeout / 2`` seconds, at most every 30."""
    http_body_timeout: float = 30.0
    """Seconds a request's body may take to arrive once its headers have
    (waitress: the whole request, from its first byte). A slower request is
    answered 408 and its connection closed. A body being received holds no
    thread on either server, so slow clients cannot take the threads the
    others need; this bounds how long each holds a connection."""
    sqlite_synchronous: str = "FULL"
    """FULL: an acknowledged job survives a power cut. NORMAL: faster; a
    power cut may lose the last transactions (never corrupts)."""
    handler_modules: list[str] = field(default_factory=list)
    external_types: list[str] = field(default_factory=list)
    demo: bool = False
    api_token: str = ""
    secret_key: str = ""
    secure_cookies: bool = False
    """On when the dashboard is served over HTTPS (directly or behind a TLS
    proxy): the session cookie is marked ``Secure`` (never sent over plain
    HTTP) and every response carries ``Strict-Transport-Security``, so the
    browser refuses plain HTTP to this host for a year. Leave off for plain
    HTTP, or the browser drops the cookie and nobody can sign in."""
    max_payload_bytes: int = 65536
    max_list_bytes: int = 2097152
    """The most bytes of payloads, results and errors one page of jobs
    carries (``GET /api/jobs``, the dashboard's lists): the page ends early,
    with more to come, where the next job would pass it. A field larger
    than this by itself is left out of lists (``jobdeck.store.listing``)."""
    max_result_bytes: int = 1048576
    """The largest result a handler may return (or an HTTP worker complete
    with), as compact UTF-8 JSON. A result lives in the job's row and is
    sent whole with the job (API, job page); a larger one fails the attempt
    (not retried; 413 for an HTTP worker) with a message pointing at
    ``ctx.artifact`` for large outputs."""
    max_bulk_jobs: int = 1000
    """The most jobs one bulk enqueue carries (``POST /api/jobs/bulk``,
    ``jobdeck enqueue --file``); more is refused, nothing inserted. All of
    them are inserted in one transaction, which holds SQLite's write lock
    while it runs: at most 100,000."""
    max_bulk_bytes: int = 8388608
    """The largest request body ``POST /api/jobs/bulk`` accepts, in bytes
    (413 past it; never less than one enqueue's own cap, three times
    ``max_payload_bytes`` plus 64 KiB). Each of its jobs is held to
    ``max_payload_bytes`` as well. Only that path reads a body this large;
    every other request keeps one enqueue's cap."""
    default_max_retries: int = 3
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    poll_interval: float = 1.0
    heartbeat_interval: float = 5.0
    stall_timeout: float = 60.0
    sweep_interval: float = 5.0
    clock_skew_warn: float = 1.0
    """PostgreSQL: seconds a host's clock may be off the database's before
    Jobdeck logs a warning. Every process runs on the database's clock
    (``jobdeck.core.clock``) whatever its host's says; the warning points at broken NTP."""
    clock_check_interval: float = 60.0
    """PostgreSQL: seconds between measurements of this process's clock
    against the database's (the sweeper also measures before each rescue)."""
    shutdown_grace: float = 30.0
    claim_batch: int = 250
    async_concurrency: int = 100
    """Jobs of ``async def`` handlers one worker pool runs at once, as tasks on
    its one event loop; they hold none of the ``workers`` threads while they
    wait. The per-queue and per-type ``concurrency`` limits still apply."""
    process_workers: int = 0
    """Child processes of one worker pool's process executor (for types with
    ``executor = "process"``); 0: the number of CPUs. Started with the pool
    when a process type is registered, by forkserver (or spawn)."""
    max_jobs_per_child: int = 0
    """Jobs a child process runs before it is replaced by a fresh one, for
    handlers that leak; 0: no limit."""
    cancel_grace: float = 10.0
    """Seconds a process job's handler has, once cancelled (``ctx.cancelled``
    set in its child), to end by itself before its child is killed (sooner
    at its type's ``timeout``)."""
    max_abandoned_threads: int = 10
    """A handler that runs past its type's timeout is failed and its thread
    abandoned: a Python thread cannot be killed, so it runs on until the
    handler returns. With this many abandoned threads still alive the
    process reports itself unhealthy (``/api/health`` answers 503, the
    Workers page says why) and claims no new jobs."""
    exit_when_unhealthy: bool = False
    """When unhealthy (see ``max_abandoned_threads``), shut down gracefully
    and exit with status 3, so a supervisor (systemd, Kubernetes) restarts
    the process and its stuck threads with it."""
    sqlite_busy_timeout: float = 30.0
    """Seconds a SQLite write waits for another process's lock before it
    fails with "database is locked" (the API then answers 503)."""
    request_lock_timeout: float = 5.0
    """PostgreSQL: seconds a statement of an HTTP request (API or
    dashboard) waits for a lock before it fails and the request is answered
    503 with ``Retry-After``, having committed nothing: a held ``LOCK
    TABLE`` otherwise kept enqueues waiting past their clients' timeouts, to
    commit them later, so a retry without a key stored the job twice. 0: no
    limit. The worker pool and maintenance wait as long as they need."""
    request_statement_timeout: float = 30.0
    """PostgreSQL: seconds one statement of an HTTP request may run before
    it is cancelled (503). 0: no limit."""
    allowed_hosts: list[str] = field(default_factory=list)
    """Host names besides ``localhost`` and loopback addresses that an open
    deployment (no ``[users]``) answers to. A web page that rebinds its own
    name to 127.0.0.1 reaches the socket as if from this machine, but its
    requests name its own host: an open deployment refuses them (403)."""
    log_format: str = "text"
    """``text`` (one line per record) or ``json`` (one JSON object per line,
    with job ids and types as fields: ``jobdeck.core.structured_logs``)."""
    auto_migrate: bool = True
    """Upgrade the database schema at start-up (``jobdeck db upgrade``).
    Off: start-up refuses to run on a schema older than the code."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Tables of the file that other parts of Jobdeck read (schedules, ...)."""

    @property
    def host(self) -> str:
        return self.bind.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.bind.rsplit(":", 1)[1])

    @property
    def is_loopback(self) -> bool:
        """The bind reaches this machine only: ``localhost`` or an address in
        127.0.0.0/8 or ::1, parsed as an address (``127.evil.example`` is a
        host name that resolves anywhere, not loopback)."""
        return is_loopback_host(self.host)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        path = Path(self.instance_path).resolve() / "jobdeck.db"
        return f"sqlite:///{path}"


def is_loopback_host(host: str | None) -> bool:
    """``localhost``, or an IP address in 127.0.0.0/8 or ::1 (also written as
    an IPv4-mapped IPv6 address); any other name or address is not."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


MAX_BULK_JOBS = 100_000
"""The highest ``max_bulk_jobs`` accepted."""
HTTP_SERVERS = ("waitress", "granian")
"""What ``http_server`` (``jobdeck serve --server``) accepts."""
