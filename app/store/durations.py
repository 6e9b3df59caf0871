"""Run-time histograms kept as counters: how long attempts ran, in fixed
log-spaced buckets, so the Queues page reads p50 and p95 per job type from
``stats_minutely`` instead of scanning attempts.

There are ``BUCKETS`` buckets, two per doubling (each √2 wide): bucket 0
holds runs under 1 ms, bucket ``i`` runs from ``EDGES[i-1]`` to ``EDGES[i]``
(1 ms · √2^(i-1) to 1 ms · √2^i), and the last one everything from about
2.3 h on. A percentile is the bucket holding that rank (nearest rank, so
the true value is in it), reported as the bucket's geometric middle: within
a factor 2^(1/4) of the true value, i.e. at most 19% high or 16% low. Below
1 ms it says "< 1 ms", past the last edge "> 2.3 h". SQLite computes a
duration to the millisecond (``julianday``), PostgreSQL to the microsecond.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BUCKETS = 48
RATIO = math.sqrt(2.0)
FIRST_EDGE = 0.001
"""Seconds: the upper edge of bucket 0."""
EDGES: tuple[float, ...] = tuple(FIRST_EDGE * RATIO**i for i in range(BUCKETS - 1))
"""``EDGES[i]`` is the upper edge (exclusive) of bucket ``i``, in seconds; the last bucket has none."""
COLUMNS: tuple[str, ...] = tuple(f"dur_{i:02d}" for i in range(BUCKETS))
"""The counter columns of ``stats_minutely``, one per bucket."""


def bucket_of(seconds: float) -> int:
    """The bucket a run of ``seconds`` is counted in (the roll-up's SQL
    ``CASE`` over ``EDGES`` says the same)."""
    for i, edge in enumerate(EDGES):
        if seconds < edge:
            return i
    return BUCKETS - 1


def percentile_bucket(counts: Sequence[int], q: float) -> int | None:
    """The bucket holding the ``q`` quantile (0 < q <= 1) by nearest rank:
    the smallest bucket whose running total reaches ``ceil(q * total)``.
    None without any run."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    running = 0
    for i, n in enumerate(counts):
        running += n
        if running >= rank:
            return i
    return len(counts) - 1


def middle(bucket: int) -> float:
    """The seconds a bucket stands for: its geometric middle; half of 1 ms
    for bucket 0 and the lower edge for the last (open-ended) one."""
    if bucket == 0:
        return FIRST_EDGE / 2
    if bucket >= BUCKETS - 1:
        return EDGES[-1]
    return EDGES[bucket - 1] * math.sqrt(RATIO)


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of the runs counted in ``counts``, in seconds (see the module's precision)."""
    bucket = percentile_bucket(counts, q)
    return None if bucket is None else middle(bucket)


def shown(counts: Sequence[int], q: float) -> str:
    """A percentile as the dashboard writes it: ``≈ 120 ms``, ``< 1 ms``, ``> 2.3 h``, ``—`` without runs."""
    bucket = percentile_bucket(counts, q)
    if bucket is None:
        return "—"
    if bucket == 0:
        return "< 1 ms"
    if bucket >= BUCKETS - 1:
        return f"> {_duration(EDGES[-1])}"
    return f"≈ {_duration(middle(bucket))}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.2g} h"
