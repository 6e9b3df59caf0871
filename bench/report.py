"""The Markdown table from a result dict (see run.py)."""

from __future__ import annotations

from typing import Any


def _m(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    return None if v is None else float(v["median"])


def _n(v: float | None, unit: str = "") -> str:
    return "–" if v is None else f"{v:,.0f}{unit}"


def _vs(jd: float | None, other: float | None) -> str:
    if jd is None or other is None:
        return "–"
    return f"{_n(other)} ({jd / other:.1f}x)"


def _ok(cond: bool | None) -> str:
    return "–" if cond is None else ("yes" if cond else "**no**")


def table(result: dict[str, Any]) -> str:
    j = result.get("jobdeck", {})
    p = result.get("peers", {})
    s = result.get("serve", {})
    m = result["machine"]
    lines = [
        f"Machine: {m['cores']} cores, Python {m['python']}, SQLite {m['sqlite']}, load at start {m['loadavg_at_start']}; "
        f"mode {result['mode']}; median of {result['counts']['runs']} runs after a warm-up.",
        "",
        "| scenario | Jobdeck | raw sqlite3 (Jobdeck's share) | Huey | RQ | Procrastinate | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, jd: float | None, raw: float | None, peers: list[str], target: str, met: bool | None,
            unit: str = "") -> None:  # fmt: skip
        share = "–" if jd is None or raw is None else f"{_n(raw)} ({jd / raw:.0%})"
        cells = [_vs(jd, _m(p, key)) if key else "–" for key in peers]
        lines.append(f"| {name} | {_n(jd, unit)} | {share} | {' | '.join(cells)} | {target} | {_ok(met)} |")

    for sync in ("FULL", "NORMAL"):
        jd = _m(j, f"drain_{sync}")
        if jd is not None:
            huey = _m(p, "huey_drain")
            paired = p.get("huey_paired", {}).get("median_ratio")
            if paired is not None:  # the interleaved rounds' ratio decides (``run.huey_paired``)
                met = jd >= 20_000 and (sync != "FULL" or paired >= 8)
            else:
                met = jd >= 20_000 and (huey is None or sync != "FULL" or jd >= 8 * huey)
            row(f"1. drain {result['counts']['drain']:,} no-op jobs, {sync} (jobs/s; 4 threads)", jd,
                _m(j, f"raw_drain_{sync}"), ["huey_drain", "rq_drain", "procrastinate_drain"] if sync == "FULL" else ["", "", ""],
                ">= 20,000 and >= 8x Huey", met)  # fmt: skip
    for sync, goal in (("FULL", 2_500), ("NORMAL", 6_000)):
        jd = _m(j, f"enqueue_{sync}")
        if jd is not None:
            row(f"2. enqueue, 1 job/call, 1 thread, {sync} (jobs/s)", jd, _m(j, f"raw_enqueue_{sync}"),
                ["huey_enqueue", "rq_enqueue", "procrastinate_enqueue"] if sync == "FULL" else ["", "", ""],
                f">= {goal:,}", jd >= goal)  # fmt: skip
            row(
                f"2. enqueue, 1 job/call, 16 threads (group commit), {sync}",
                _m(j, f"enqueue16_{sync}"),
                _m(j, f"raw_enqueue_{sync}"),
                ["", "", ""],
                "–",
                None,
            )
    if "enqueue_many" in j:
        jd = _m(j, "enqueue_many")
        row(
            "2. enqueue_many, 1,000/call, FULL (jobs/s)",
            jd,
            _m(j, "raw_enqueue_many"),
            ["", "rq_enqueue_many", "procrastinate_enqueue_many"],
            ">= 150,000",
            (jd or 0) >= 150_000,
        )
    http = s.get("http")
    if http and "skipped" not in http:
        e, h = http["enqueue"], http["health"]
        control = (f"; refused POST (422): {http['refused']['rps']:,.0f} ({http['refused_ratio']:.0%})"
                   if "refused" in http else "")  # fmt: skip
        lines.append(f"| 3. HTTP POST /api/jobs, wrk 16 conns (req/s) | {e['rps']:,.0f} (p50 {e['p50_ms']:.1f} ms, "
                     f"p99 {e['p99_ms']:.1f} ms, {e['errors']} errors) | GET /api/health: {h['rps']:,.0f} "
                     f"({http['ratio']:.0%}){control} | – | – | – | >= 80% of health, 0 errors | "
                     f"{_ok(http['ratio'] >= 0.8 and e['errors'] == 0)} |")  # fmt: skip
    elif http:
        lines.append(f"| 3. HTTP | skipped: {http['skipped']} | | | | | | |")
    single = s.get("http_single")
    if single and "skipped" not in single:
        for name in ("pool", "no pool"):
            f = single[name]
            lines.append(f"| 3. single HTTP enqueue, {name}, wrk {single['connections']} conns (req/s) | {f['enqueue']:,.0f} "
                         f"(p99 {f['p99_ms']:.1f} ms, {f['errors']} errors) | refused POST (422): {f['control']:,.0f} "
                         f"({f['ratio']:.0%}, median of the rounds' ratios) | – | – | – | >= 80% of the control, "
                         f"p99 < 25 ms | {_ok(f['met'])} |")  # fmt: skip
    for bulk in (s.get("http_bulk"), result.get("http_bulk_postgres")):
        if bulk:
            lines.append(f"| 3. bulk HTTP enqueue, {bulk['database']}, {bulk['clients']} clients x 1,000 jobs/call "
                         f"(jobs/s) | {bulk['http']:,.0f} | in-process enqueue_many: {bulk['in_process']:,.0f} "
                         f"({bulk['kept']:.0%}) | – | – | – | >= 50% of in-process | {_ok(bulk['kept'] >= 0.5)} |")  # fmt: skip
    flow = j.get("flow_sqlite")
    if flow:
        lines.append(f"| 8. drain {flow['jobs']:,} jobs over 100 keys, concurrency 1 per key + a rate limit (jobs/s) | "
                     f"{_n(flow['limited'])} | unlimited {_n(flow['unlimited'])} ({flow['kept']:.0%} kept) | – | – | – "
                     f"| >= 50% of unlimited | {_ok(flow['kept'] >= 0.5)} |")  # fmt: skip
    lat = j.get("latency_inproc")
    if lat:
        lines.append(f"| 4. latency enqueue→start, in-process ({lat['n']} jobs) | p50 {lat['p50_ms']:.2f} ms, "
                     f"p99 {lat['p99_ms']:.2f} ms | – | – | – | – | p50 < 2 ms, p99 < 20 ms | "
                     f"{_ok(lat['p50_ms'] < 2 and lat['p99_ms'] < 20)} |")  # fmt: skip
    x = s.get("latency_cross")
    if x:
        lines.append(f"| 4. latency HTTP → other process ({x['n']} jobs) | p50 {x['p50_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms "
                     f"| – | – | – | – | p50 < 50 ms | {_ok(x['p50_ms'] < 50)} |")  # fmt: skip
    for k in ("steady_1", "steady_2"):
        st = s.get(k)
        if st:
            ok = st["backlog_at_end"] <= s["steady_rate"] * 0.1 and st["p99_ms"] < 50 and st["locked_errors"] == 0
            if k == "steady_2" and s.get("steady_1"):  # 2 processes at least 0.9x of 1
                ok = ok and st["completed_per_s"] >= 0.9 * s["steady_1"]["completed_per_s"]
            more = ", >= 0.9x of 1 process" if k == "steady_2" else ""
            lines.append(f"| 5. steady {s['steady_rate']:,.0f} jobs/s, {k[-1]} process(es), "
                         f"{result['counts']['steady_seconds']} s | {st['completed_per_s']:,.0f} done/s, backlog "
                         f"{st['backlog_at_end']}, p50 {st['p50_ms']:.1f} ms, p99 {st['p99_ms']:.1f} ms, "
                         f"{st['locked_errors']} locked | – | – | – | – | no growth, p99 < 50 ms, 0 locked{more} | {_ok(ok)} |")  # fmt: skip
    for path, d in (s.get("dashboard") or {}).items():
        if "skipped" in d:
            lines.append(
                f"| 6. GET {path} ({result['counts']['dashboard']:,} jobs) | skipped: {d['skipped']} | | | | | | |"
            )
        else:
            lines.append(f"| 6. GET {path} ({result['counts']['dashboard']:,} jobs) | p50 {d['p50_ms']:.1f} ms, "
                         f"p99 {d['p99_ms']:.1f} ms | – | – | – | – | p50 < 50, p99 < 150 ms | "
                         f"{_ok(d['p50_ms'] < 50 and d['p99_ms'] < 150)} |")  # fmt: skip
    mem = s.get("memory")
    if mem:
        lines.append(f"| 7. RSS of serve draining {mem['jobs']:,} jobs | max {mem['max_rss_mb']:.0f} MB, "
                     f"+{mem['growth_after_10pct_mb']:.0f} MB after 10% | – | – | – | – | < 200 MB, flat | "
                     f"{_ok(mem['max_rss_mb'] < 200 and mem['growth_after_10pct_mb'] < 20)} |")  # fmt: skip
    pg = result.get("postgres")
    if pg:
        from bench.pg_bench import table as pg_table

        lines += [
            "",
            "10. PostgreSQL, interleaved with PgQueuer, oban-py, Procrastinate (`python3 -m bench.pg_bench`):",
            "",
        ]
        lines.append(f"skipped: {pg['skipped']}" if "skipped" in pg else pg_table(pg))
    executors = result.get("executors")
    if executors:
        from bench.executor_bench import table as executor_table

        lines += ["", "12. Executors: the async drain, and a child process against the worker "
                  "(`python3 -m bench.executor_bench`):", "", executor_table(executors)]  # fmt: skip
    shipped = result.get("shipped")
    if shipped:
        from bench.shipped_bench import table as shipped_table

        lines += ["", shipped_table(shipped)]
    if p:
        counts = ", ".join(f"{k.split('_')[0]} {v['jobs']:,}" for k, v in p.items() if k.endswith("_drain"))
        lines.append("")
        lines.append(f"Peer drain counts (kept small so a run stays within minutes; rates are per job): {counts}.")
        paired = p.get("huey_paired")
        if paired:
            rounds = ", ".join(f"{r['jobdeck']:,.0f}/{r['huey']:,.0f} ({r['ratio']:.1f}x)" for r in paired["rounds"])
            lines.append(
                f"Scenario 1 against Huey in {len(paired['rounds'])} interleaved rounds (Jobdeck/Huey jobs/s, FULL): "
                f"{rounds}; median ratio {paired['median_ratio']:.1f}x, which decides its 8x target."
            )
    return "\n".join(lines)
