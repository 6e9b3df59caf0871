"""PostgreSQL's own statements: the NOTIFY that wakes other processes'
pools, the LISTEN their listeners run (``app.worker.listener``), and the
advisory lock that serializes the queue policy's limited claims."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

CHANNEL = "jobdeck_jobs"
NOTIFY_SQL = f"NOTIFY {CHANNEL}"
"""Sent in the transaction that makes a job claimable; delivered at commit,
once per transaction however many jobs it touched."""


def listen_sql(channel: str = CHANNEL) -> str:
    return f"LISTEN {channel}"


CLAIM_LOCK = 0x6A6F6264  # "jobd": any fixed number
"""The advisory lock that limited claims take before counting running jobs."""


def lock_limited_claims() -> Any:
    """Transaction-scoped: released by the commit that ends the claim."""
    return select(func.pg_advisory_xact_lock(CLAIM_LOCK))
