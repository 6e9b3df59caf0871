"""An HTTP worker with nothing of Jobdeck's but its protocol (the standard
library only), for the crash matrix's point "an HTTP worker killed between
an effect's start and its finish" (tests/adversarial/test_crash_matrix.py).

    python http_effect_worker.py URL GATEWAY hold N    claim N jobs, start and perform each one's
                                                       charge, print "holding", then wait to be killed
    python http_effect_worker.py URL GATEWAY work N    work until N jobs ended (completed, or refused
                                                       with 409: the attempt is over), then exit

Each job of type ``ext.charge`` charges ``payload.order`` once, through the
effect ``charge:<order>`` (``replay_safe`` from the payload). The gateway is
a JSON Lines file: one line per charge made; like a payment provider, it
makes no second charge for a key it has seen when the key is forwarded.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

WORKER = "http-effect-worker"
TYPE = "ext.charge"


def call(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def charge(gateway: Path, order: str, key: str | None) -> dict[str, Any]:
    """The side effect: a line in the gateway's file (none again for a forwarded key it has)."""
    lines = gateway.read_text().splitlines() if gateway.exists() else []
    for line in lines:
        made = json.loads(line)
        if key is not None and made["key"] == key:
            return {"charge_id": made["charge_id"], "replayed": True}
    made = {"order": order, "key": key, "charge_id": f"ch_{order}_{len(lines) + 1}"}
    with gateway.open("a") as out:
        out.write(json.dumps(made) + "\n")
        out.flush()
    return {"charge_id": made["charge_id"], "replayed": False}


def claim(url: str, limit: int) -> list[dict[str, Any]]:
    status, jobs = call(url, "/api/jobs/claim", {"worker_id": WORKER, "types": [TYPE], "limit": limit})
    assert status == 200, (status, jobs)
    return list(jobs)


def effect(url: str, gateway: Path, job: dict[str, Any], finish: bool) -> tuple[str, Any]:
    """Start the job's charge; perform it if told to, and finish it when
    ``finish``. Returns the decision (or "ended" with the 409's error) and the charge."""
    order = job["payload"]["order"]
    safe = bool(job["payload"].get("replay_safe"))
    key = f"charge:{order}"
    step = {"worker_id": WORKER, "attempt": job["attempt"]}
    deadline = time.monotonic() + 60
    while True:
        status, begun = call(url, f"/api/jobs/{job['id']}/effects/{key}/start", {**step, "replay_safe": safe})
        if status == 409:
            return "ended", begun["error"]
        assert status == 200, (status, begun)
        if begun["decision"] == "skip":
            return "skip", begun["effect"]["result"]
        if begun["decision"] == "wait":
            assert time.monotonic() < deadline, f"{key} was held by another attempt for 60 s"
            time.sleep(0.05)  # a poll with a deadline: another job's attempt holds the key, ask again shortly
            continue
        made = charge(gateway, order, key if safe else None)
        if finish:
            status, done = call(url, f"/api/jobs/{job['id']}/effects/{key}/finish", {**step, "result": made})
            assert status == 200, (status, done)
        return "perform", made


def hold(url: str, gateway: Path, n: int) -> None:
    held: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(held) < n:
        assert time.monotonic() < deadline, f"claimed {len(held)} of {n} jobs in 60 s"
        held += claim(url, n - len(held))
    for job in held:
        decision, _ = effect(url, gateway, job, finish=False)
        assert decision == "perform", decision
        print(f"charged {job['id']}", flush=True)
    print("holding", flush=True)
    # Killed here (SIGKILL), between the charges and their finish; never heart-beats. A kill has
    # nothing to poll for, so this only bounds the wait: a worker nobody kills does not run on forever.
    time.sleep(300)
    sys.exit("holding: not killed within 300 s")


def work(url: str, gateway: Path, n: int) -> None:
    ended = 0
    deadline = time.monotonic() + 90
    while ended < n:
        assert time.monotonic() < deadline, f"{ended} of {n} jobs ended in 90 s"
        jobs = claim(url, 10)
        if not jobs:
            time.sleep(0.05)  # a poll with a deadline: nothing due yet (a rescue or a backoff to wait out)
            continue
        for job in jobs:
            decision, outcome = effect(url, gateway, job, finish=True)
            print(f"{decision} {job['id']} {json.dumps(outcome)}", flush=True)
            if decision != "ended":
                status, done = call(url, f"/api/jobs/{job['id']}/complete", {"worker_id": WORKER, "result": outcome})
                assert status == 200, (status, done)
            ended += 1


if __name__ == "__main__":
    base, gateway_file, mode, count = sys.argv[1:5]
    (hold if mode == "hold" else work)(base, Path(gateway_file), int(count))
