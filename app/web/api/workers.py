"""The worker pools over JSON: what the Workers page shows, per pool.

    GET /api/workers -> {"workers": [live pools], "gone": [...], "stopped": [...]}

Each pool with its executors as its monitor last wrote them into its row
(``workers.executors``, every 2 s at most): per executor its capacity and
busy slots, the async loop's lag, and the process pool's children (pid,
job, resident memory, jobs run) and the children replaced by cause. The
row is written by another process, so it is read here field by field, and
lists are cut to fixed lengths: the answer stays bounded whatever it holds.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from flask import current_app, jsonify
from jobdeck.deck import Jobdeck
from jobdeck.web.api.jobs import bp
from jobdeck.web.serialize import iso

MAX_LIVE = 200
"""Live pools listed, newest first."""
MAX_GONE = 50
"""Pools that stopped heart-beating without saying goodbye, most recently lost first."""
MAX_STOPPED = 20
"""Pools that stopped cleanly, newest first."""
MAX_CHILDREN = 256
"""Children listed per process executor."""
MAX_CAUSES = 20
"""Causes of replaced children listed per process executor."""
EXECUTORS = ("thread", "async", "process")


@bp.get("/workers")
def list_workers() -> Any:
    deck: Jobdeck = current_app.extensions["jobdeck"]
    cutoff = deck.clock() - timedelta(seconds=deck.config.stall_timeout)
    everyone = deck.store.list_workers()
    live = [w for w in everyone if _is_live(w, cutoff)]
    gone = [w for w in everyone if w["stopped_at"] is None and not _is_live(w, cutoff)]
    gone.sort(key=lambda w: w.get("gone_at") or w["heartbeat_at"], reverse=True)
    stopped = [w for w in everyone if w["stopped_at"] is not None]
    return jsonify(
        {
            "workers": [worker_json(w) for w in live[:MAX_LIVE]],
            "gone": [worker_json(w) for w in gone[:MAX_GONE]],
            "stopped": [worker_json(w) for w in stopped[:MAX_STOPPED]],
        }
    )


def _is_live(worker: dict[str, Any], cutoff: datetime) -> bool:
    """Heart-beating, not stopped, and not marked gone by the sweeper (as the Workers page says)."""
    return worker["stopped_at"] is None and worker.get("gone_at") is None and worker["heartbeat_at"] >= cutoff


def worker_json(w: dict[str, Any]) -> dict[str, Any]:
    """One pool's row as the API writes it."""
    held = None
    if w.get("loop_held_at") is not None:
        held = {
            "seconds": w["loop_held_seconds"],
            "at": iso(w["loop_held_at"]),
            "job_id": w["loop_held_job"],
            "type": w["loop_held_type"],
        }
    return {
        "id": w["id"],
        "host": w["host"],
        "pid": w["pid"],
        "threads": w["threads"],
        "started_at": iso(w["started_at"]),
        "heartbeat_at": iso(w["heartbeat_at"]),
        "stopped_at": iso(w["stopped_at"]),
        "gone_at": iso(w.get("gone_at")),
        "running": w["running"],
        "abandoned_threads": w.get("abandoned_threads") or 0,
        "unhealthy": w.get("unhealthy"),
        "loop_held": held,
        "executors": executors_json(w.get("executors")),
    }


def executors_json(held: Any) -> dict[str, Any] | None:
    """The executors' summary a pool wrote, keeping only the fields it is
    documented to have, each of its type (a row from an older or newer
    version, or a damaged one, cannot put anything else in the answer)."""
    if not isinstance(held, dict):
        return None
    out: dict[str, Any] = {}
    for name in EXECUTORS:
        e = held.get(name)
        if not isinstance(e, dict):
            continue
        one: dict[str, Any] = {"capacity": _count(e.get("capacity")), "busy": _count(e.get("busy"))}
        if name == "async":
            one["lag"] = _seconds(e.get("lag"))
        if name == "process":
            children = e.get("children")
            children = children if isinstance(children, list) else []
            one["children"] = [_child(c) for c in children if isinstance(c, dict)][:MAX_CHILDREN]
            restarts = e.get("restarts")
            restarts = restarts if isinstance(restarts, dict) else {}
            one["restarts"] = {str(k)[:40]: _count(n) for k, n in list(restarts.items())[:MAX_CAUSES]}
        out[name] = one
    return out


def _child(c: dict[str, Any]) -> dict[str, Any]:
    job_id = c.get("job_id")
    return {
        "pid": _count(c.get("pid")) if c.get("pid") is not None else None,
        "job_id": job_id if isinstance(job_id, int) and not isinstance(job_id, bool) else None,
        "rss_mib": _count(c.get("rss_mib")),
        "jobs_run": _count(c.get("jobs_run")),
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None
