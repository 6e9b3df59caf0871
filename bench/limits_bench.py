"""What a concurrency limit costs a drain that does not touch it (the demo
sets one on ``demo.charge-card``, so every claim of ``jobdeck worker
--demo`` goes through the limit-aware claim): the bare pool drains ``n``
no-op jobs without a limit, with a limit of 2 on a type it does not run,
and with that limit and this claim's fast paths switched off ("counting":
every claim counts the running jobs first; on PostgreSQL each of its
statements is a round trip of its own, and the due jobs are read and
picked). Alternated in one process, on SQLite FULL or, with
``--database-url``, PostgreSQL.

The switch is for this measurement only (it replaces the policy's
``controls.Blocked``); the product has no setting for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import NOOP, Counter, make_deck
from bench.flow_bench import analyze, empty_postgres
from bench.jobdeck_bench import timed_drain

LIMIT = {"bench.other": {"concurrency": 2}}
VARIANTS = ("unlimited", "counting", "limited")


class _Counting:
    """A ``controls.Blocked`` that never lets a SQLite claim skip the counts."""

    value: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    took_limited = True

    def quiet(self, paused: frozenset[str]) -> bool:
        return False


def drain(workdir: Path, n: int, variant: str, threads: int = 4, **overrides: Any) -> float:
    """jobs/s draining ``n`` no-op jobs as ``variant`` (one of ``VARIANTS``)."""
    counter = Counter(n)
    if variant != "unlimited":
        overrides["types"] = LIMIT
        overrides["external_types"] = list(LIMIT)
    deck = make_deck(workdir / "limits.db", "FULL", threads, handler=lambda p, c: counter.hit(), **overrides)
    try:
        postgres = deck.store.dialect == "postgresql"
        if postgres:
            empty_postgres(deck)
        for start in range(0, n, 5000):
            deck.enqueue_many([{"type": NOOP} for _ in range(start, min(n, start + 5000))])
        if postgres:
            analyze(deck)
        if variant == "counting":
            policy = deck.store.claim_policy
            policy._blocked = None if postgres else _Counting()
        return timed_drain(deck, counter, n, threads, max(120.0, n / 100), f"{variant} drain")
    finally:
        deck.store.engine.dispose()


def compare(workdir: Path, n: int, runs: int, **overrides: Any) -> dict[str, Any]:
    """Every variant, alternated ``runs`` times; each round's rates and ratios, and the medians."""
    rounds = []
    for r in range(runs):
        rates = {v: drain(workdir, n, v, **overrides) for v in VARIANTS}
        rounds.append(rates)
        print(f"round {r + 1}/{runs}: " + ", ".join(f"{v} {rates[v]:,.0f}" for v in VARIANTS)
              + f"; limited/counting {rates['limited'] / rates['counting']:.2f}x", flush=True)  # fmt: skip

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    return {
        "jobs": n,
        "median": {v: median([r[v] for r in rounds]) for v in VARIANTS},
        "limited/counting": median([r["limited"] / r["counting"] for r in rounds]),
        "limited/unlimited": median([r["limited"] / r["unlimited"] for r in rounds]),
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--database-url", default=None, help="postgresql+psycopg://... to drain on PostgreSQL")
    args = ap.parse_args(argv)
    extra = {"database_url": args.database_url} if args.database_url else {}
    with tempfile.TemporaryDirectory(prefix="jobdeck-limits-") as tmp:
        print(json.dumps(compare(Path(tmp), args.jobs, args.runs, **extra)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
