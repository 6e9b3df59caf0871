"""The store on the configured database: its engine (and, on PostgreSQL,
the HTTP requests' own), sized for the process's workers and HTTP threads."""

from __future__ import annotations

from jobdeck.core.config import Config
from jobdeck.store.engine import make_engine
from jobdeck.store.lifecycle import Store


def open_store(config: Config) -> Store:
    """The store on the configured database. On PostgreSQL the HTTP
    requests get an engine of their own whose sessions carry the request
    timeouts (``Store.bound_requests``), with ``http_threads`` of the pool
    (the rest serve the workers and maintenance)."""
    url = config.resolved_database_url()
    requests = config.http_threads if url.startswith("postgresql") else 0
    idle = max(10.0, config.stall_timeout)
    store = Store(
        make_engine(
            url,
            synchronous=config.sqlite_synchronous,
            pool_size=max(5, config.workers + config.http_threads + 4 - requests),
            busy_timeout=config.sqlite_busy_timeout,
            idle_in_transaction=idle,
        )
    )
    if requests:
        timeouts = (config.request_lock_timeout, config.request_statement_timeout)
        store.bound_requests(make_engine(url, pool_size=requests, idle_in_transaction=idle, timeouts=timeouts))
    return store
