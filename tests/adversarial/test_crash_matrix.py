"""The crash matrix: two real Jobdeck processes (``serve`` and ``worker``)
on one database, each SIGKILLed at the points where a queue loses work or
repeats it, on SQLite and on PostgreSQL.

The points, and how each is hit on purpose (not by hoping a timed kill lands):

1. ``enqueue``: clients post jobs over HTTP to ``serve`` and it is killed
   under them, with requests in flight (counted: the ones cut off mid-request).
2. ``claim``: ``JOBDECK_TEST_CRASH_AT=claim`` makes a worker kill itself right
   after a claimed batch is held, before any of it starts.
3. ``effect``: ``demo.charge-card`` with ``gateway_delay_seconds`` holds its
   charge inside the effect; the process whose attempt is there (its effect
   row says ``started``) is killed.
4. ``ack``: the hook kills inside an acknowledgement's transaction, after the
   handlers ran (their charges are made) and before the commit.
5. ``sweep``: the hook kills both processes inside the stalled-job sweep's
   transaction, before its commit, while jobs wait to be rescued.

The matrix runs once per backend and HTTP server ``serve`` runs on. Points
2 and 4 kill the worker alone, while ``serve`` is down: they run in the
first server's variant of each backend, since the other's would repeat them.

Then both processes start again, with a short stall timeout so the rescue
runs, and drain. Every job answered 201 (or enqueued) must exist and end
completed or dead; no order is charged twice; none is silently skipped: a
completed charge has its charge and its effect ``done``, and a charge whose
outcome is unknown is dead with "effect charge:... was started by attempt N
and its outcome is unknown" (unless replay-safe: then it completed, charged
once, the gateway deduplicating by the ledger's key).

6. ``http effect`` (``test_an_http_worker_killed_between_start_and_finish``):
   a worker in another process that speaks only the HTTP protocol
   (``http_effect_worker.py``) starts two charges' effects, makes the
   charges, and is SIGKILLed before it finishes them. The next attempt's
   start finds each outcome unknown: the charge that is not replay-safe
   goes to dead with the same words as a Python handler's, the replay-safe
   one is charged again through the gateway's key (no second charge) and
   completes. A person resolves the dead one through the API, retries it,
   and the retry skips the charge.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jobdeck.core.config import HTTP_SERVERS
from jobdeck.core.states import EffectState, State
from jobdeck.store import NewJob, Store
from jobdeck.store.engine import make_engine
from jobdeck.store.models import demo_charges, effects, jobs
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from tests.adversarial.cli_process import JobdeckProcess, children, exited, write_config
from tests.conftest import wait_for

pytestmark = pytest.mark.backends
ROOT = Path(__file__).parents[2]
STALL_TIMEOUT = 2.0
GATEWAY_DELAY = 1.0
RETRIES = 8
"""Enough that a job held at several kills is never dead for lack of retries."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Tally:
    """What one backend's run did and found, for the summary."""

    kills: Counter[str] = field(default_factory=Counter)
    jobs: int = 0
    charges: int = 0
    unknown_dead: int = 0
    unknown_charged: int = 0
    keyed: int = 0
    """Charges made through the gateway's idempotency key (replay-safe)."""
    in_flight_at_enqueue_kill: int = 0
    lost: list[Any] = field(default_factory=list)
    double: list[Any] = field(default_factory=list)
    skipped: list[Any] = field(default_factory=list)
    wrong: list[Any] = field(default_factory=list)


class Cluster:
    """``python -m jobdeck.cli serve`` (A) and ``python -m jobdeck.cli worker`` (B),
    started, killed and restarted one by one, each optionally armed with a
    crash point."""

    def __init__(self, db_url: str, tmp_path: Path, server: str) -> None:
        self.port = _free_port()
        self.tmp_path = tmp_path
        self.config = tmp_path / "jobdeck.toml"
        self.config.write_text(
            f"database_url = {json.dumps(db_url)}\n"
            f"instance_path = {json.dumps(str(tmp_path / 'instance'))}\n"
            'secret_key = "the-same-secret-on-every-host"\n'
            "demo = true\nworkers = 2\nhttp_threads = 4\npoll_interval = 0.1\nheartbeat_interval = 0.3\n"
            f"stall_timeout = {STALL_TIMEOUT}\nsweep_interval = 0.3\nbackoff_base = 0.05\nbackoff_cap = 0.5\n"
            f"shutdown_grace = 3.0\nhttp_server = {json.dumps(server)}\n"
            # The demo's schedules and its charge-card concurrency limit stay out of the way.
            "schedules = []\ntypes = {}\n"
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[Path] = []
        self._n = itertools.count()

    def start(self, name: str, crash_at: str | None = None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
        env |= {"PYTHONPATH": str(ROOT), "JOBDECK_CONFIG": str(self.config)}
        if crash_at:
            env["JOBDECK_TEST_CRASH_AT"] = crash_at
        args = ["serve", "--bind", f"127.0.0.1:{self.port}"] if name == "A" else ["worker"]
        log = self.tmp_path / f"{name}-{next(self._n)}-{crash_at or 'plain'}.log"
        self.logs.append(log)
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobdeck.cli", *args, "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def pids(self, name: str) -> list[int]:
        """The process ``name`` and its children: granian's ``serve`` runs the
        app, its pool included, in a worker process of its own."""
        pid = self.procs[name].pid
        return [pid, *children(pid)]

    def kill(self, name: str) -> None:
        """SIGKILL ``name``; returns once it and its children are gone (a
        restart binds the same port)."""
        proc = self.procs[name]
        held = self.pids(name)[1:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: all(exited(c) for c in held), 10, interval=0.01, message=f"{name}'s children to die")

    def died_by_its_hook(self, name: str, timeout: float, what: str) -> None:
        """Wait for the armed process to SIGKILL itself (never any other exit)."""
        proc = self.procs[name]
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} never reached its crash point ({what}) in {timeout} s") from None
        assert code == -signal.SIGKILL, f"{name} exited with {code}, not by its crash point ({what})"

    def stop(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def check_alive(self, *names: str) -> None:
        for name in names:
            code = self.procs[name].poll()
            if code is not None:
                raise AssertionError(f"{name} exited with {code}")

    def healthy(self) -> bool:
        self.check_alive("A")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/health", timeout=2) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}" for log in self.logs)

    def shutdown(self) -> None:
        for name in self.procs:
            self.stop(name)


class Plan:
    """Every job the test made, by kind, so the end state can be judged."""

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.orders: dict[int, str] = {}
        self._lock = threading.Lock()
        self._n = itertools.count()

    def new(self, kind: str, delay: float = 0.0) -> dict[str, Any]:
        n = next(self._n)
        if kind == "noop":
            return {"type": "demo.noop", "payload": {"n": n}, "max_retries": RETRIES}
        payload: dict[str, Any] = {"order_id": f"o-{n}", "amount_cents": 100 + n}
        if kind == "charge-safe":
            payload["replay_safe"] = True
        if delay:
            payload["gateway_delay_seconds"] = delay
        return {"type": "demo.charge-card", "payload": payload, "max_retries": RETRIES}

    def add(self, job_id: int, body: dict[str, Any]) -> None:
        kind = "noop" if body["type"] == "demo.noop" else (
            "charge-safe" if body["payload"].get("replay_safe") else "charge"
        )  # fmt: skip
        with self._lock:
            self.kinds[job_id] = kind
            if kind != "noop":
                self.orders[job_id] = body["payload"]["order_id"]

    def enqueue(self, store: Store, bodies: list[dict[str, Any]]) -> None:
        news = [NewJob(b["type"], b["payload"], max_retries=b["max_retries"]) for b in bodies]
        for job_id, body in zip(store.enqueue_many(news, _now()), bodies):
            self.add(job_id, body)


def _enqueue_under_kill(cluster: Cluster, plan: Plan, tally: Tally) -> None:
    """Point 1: three clients post jobs to A; A is killed once 40 are accepted."""
    killed = threading.Event()
    accepted = threading.Semaphore(0)
    in_flight = Counter[str]()
    kinds = itertools.cycle(["noop", "charge", "charge-safe"])
    lock = threading.Lock()
    problems: list[str] = []

    def client() -> None:
        while not killed.is_set():
            with lock:
                body = plan.new(next(kinds))
            request = urllib.request.Request(
                f"http://127.0.0.1:{cluster.port}/api/jobs", json.dumps(body).encode(),
                {"content-type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    answer = json.load(response)
                    status = response.status
            except (OSError, http.client.HTTPException) as exc:
                # Refused: A was already gone. Anything else: cut off mid-request.
                refused = isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
                with lock:
                    in_flight["refused" if refused else "cut"] += 1
                if not killed.is_set():
                    problems.append(f"enqueue failed before the kill: {exc!r}")
                return
            if status != 201:
                problems.append(f"enqueue answered {status}: {answer}")
                return
            plan.add(int(answer["id"]), body)
            accepted.release()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(40):
        assert accepted.acquire(timeout=30), f"the server stopped accepting jobs before the kill: {problems}"
    killed.set()
    cluster.kill("A")
    tally.kills["enqueue"] += 1
    for t in threads:
        t.join(timeout=15)
    assert problems == [] and not any(t.is_alive() for t in threads), problems
    tally.in_flight_at_enqueue_kill = in_flight["cut"]


def _effect_holders(store: Store, orders: set[str]) -> Counter[int]:
    """pid -> how many of ``orders``' charges it has started and not finished."""
    with store.read() as conn:
        rows = conn.execute(
            select(effects.c.worker_id).where(
                effects.c.key.in_([f"charge:{o}" for o in orders]), effects.c.state == EffectState.STARTED.value
            )
        ).scalars()
        return Counter(int(str(w).split(":")[1].split(".")[0]) for w in rows if w)


def _judge(store: Store, plan: Plan, tally: Tally) -> None:
    with store.read() as conn:
        final = {r.id: r for r in conn.execute(select(jobs.c.id, jobs.c.status, jobs.c.error)).all()}
        charges = Counter(dict(
            conn.execute(select(demo_charges.c.order_id, func.count()).group_by(demo_charges.c.order_id)).all()
        ))  # fmt: skip
        ledger = dict(conn.execute(select(effects.c.key, effects.c.state)).all())
    tally.jobs = len(plan.kinds)
    tally.charges = sum(charges.values())
    for job_id, kind in plan.kinds.items():
        row = final.get(job_id)
        if row is None or row.status not in (State.COMPLETED.value, State.DEAD.value):
            tally.lost.append((job_id, kind, row and row.status))
            continue
        if kind == "noop":
            if row.status != State.COMPLETED.value:
                tally.wrong.append((job_id, kind, row.status, row.error))
            continue
        order = plan.orders[job_id]
        key = f"charge:{order}"
        n = charges.get(order, 0)
        if n > 1:
            tally.double.append((job_id, order, n))
        if row.status == State.COMPLETED.value:
            if n == 0 or ledger.get(key) != EffectState.DONE.value:
                tally.skipped.append((job_id, order, n, ledger.get(key)))
            continue
        unknown = (
            bool(row.error)
            and f"effect {key} was started by attempt " in row.error
            and row.error.endswith("and its outcome is unknown")
        )
        # Still started; or done, when a busy machine delayed the heartbeat, the
        # sweep rescued a live attempt, and that attempt finished its charge later.
        known_late = ledger.get(key) == EffectState.DONE.value and n == 1
        if kind == "charge-safe" or not unknown or not (ledger.get(key) == EffectState.STARTED.value or known_late):
            tally.wrong.append((job_id, kind, row.status, row.error, ledger.get(key)))
            continue
        tally.unknown_dead += 1
        tally.unknown_charged += n
    with store.read() as conn:
        tally.keyed = conn.execute(
            select(func.count()).select_from(demo_charges).where(demo_charges.c.idempotency_key.is_not(None))
        ).scalar_one()


SUMMARY: dict[str, Tally] = {}


@pytest.mark.parametrize("server", HTTP_SERVERS)
def test_crash_matrix(
    db_url: str, tmp_path: Path, backend: str, server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    cluster = Cluster(db_url, tmp_path, server)
    engine = make_engine(db_url, pool_size=2)
    store = Store(engine)
    plan = Plan()
    tally = Tally()
    try:
        # 1. HTTP enqueue: A serves (and works); it is killed under three clients.
        cluster.start("A")
        wait_for(cluster.healthy, 60, interval=0.1, message="serve to answer")
        _enqueue_under_kill(cluster, plan, tally)

        # 2 and 4 kill B alone (A is down since point 1), a jobdeck worker that
        # serves no HTTP: once per backend, in the first server's variant.
        if server == HTTP_SERVERS[0]:
            # 2. A claimed batch held: B alone, armed, claims and dies at once.
            plan.enqueue(store, [plan.new(k) for k in ["noop"] * 40 + ["charge"] * 10 + ["charge-safe"] * 10])
            cluster.start("B", crash_at="claim")
            cluster.died_by_its_hook("B", 60, "claim")
            tally.kills["claim"] += 1

            # 4. Acknowledgement: B again, dies inside its first ack's transaction
            # after the handlers ran (charges made, completions not committed).
            plan.enqueue(store, [plan.new(k) for k in ["noop"] * 20 + ["charge"] * 5 + ["charge-safe"] * 5])
            cluster.start("B", crash_at="ack")
            cluster.died_by_its_hook("B", 60, "ack")
            tally.kills["ack"] += 1

        # 3. Between an effect's record and its side effect: charges held in the
        # gateway; the process whose attempts are there is killed.
        slow = [plan.new(k, delay=GATEWAY_DELAY) for k in ["charge", "charge-safe"] * 4]
        plan.enqueue(store, slow)
        cluster.start("A")
        cluster.start("B")
        pids = {pid: n for n in ("A", "B") for pid in cluster.pids(n)}
        # The victim holds a charge that is not replay-safe: its retry must go dead.
        slow_orders = {b["payload"]["order_id"] for b in slow if not b["payload"].get("replay_safe")}

        def holder() -> str | None:
            cluster.check_alive("A", "B")
            held = [(n, pid) for pid, n in _effect_holders(store, slow_orders).most_common() if pid in pids]
            return pids[held[0][1]] if held else None

        victim = wait_for(holder, 60, interval=0.02, message="a process to hold a charge inside its effect")
        cluster.kill(victim)
        tally.kills["effect"] += 1
        survivor = "B" if victim == "A" else "A"
        cluster.stop(survivor)  # gracefully: its own charges finish within shutdown_grace
        # A batch held by a host that died long ago, so the sweep certainly
        # has work even if the survivor rescued the victim's jobs before it stopped.
        plan.enqueue(store, [plan.new("noop") for _ in range(5)])
        assert store.claim("ghost:1:gone", _now(), limit=5)

        # 5. The sweep: both start armed; the first sweep that finds the
        # victim's stalled jobs dies before its commit, so the other finds them too.
        cluster.start("A", crash_at="sweep")
        cluster.start("B", crash_at="sweep")
        cluster.died_by_its_hook("A", 60, "sweep")
        cluster.died_by_its_hook("B", 60, "sweep")
        tally.kills["sweep"] += 2

        # The survivors: both start clean, rescue what the kills left and drain.
        cluster.start("A")
        cluster.start("B")

        def drained() -> bool:
            cluster.check_alive("A", "B")
            try:
                with store.read() as conn:
                    open_jobs = conn.execute(
                        select(func.count()).where(
                            jobs.c.id.in_(list(plan.kinds)),
                            jobs.c.status.not_in([State.COMPLETED.value, State.DEAD.value]),
                        )
                    ).scalar_one()
            except SQLAlchemyError:
                return False
            return open_jobs == 0

        wait_for(drained, 90, interval=0.2, message="every job to end completed or dead")
        _judge(store, plan, tally)
        assert (tally.lost, tally.double, tally.skipped, tally.wrong) == ([], [], [], []), tally
        assert tally.unknown_dead > 0, "no charge was caught between its record and its charge"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.tails()}") from None
    finally:
        cluster.shutdown()
        engine.dispose()
    SUMMARY[f"{backend}, {server}"] = tally
    with capsys.disabled():
        print(
            f"\ncrash matrix [{backend}, serve on {server}]: {sum(tally.kills.values())} kills at {len(tally.kills)} points "
            f"({', '.join(f'{p} x{n}' for p, n in tally.kills.items())}); {tally.jobs} jobs, "
            f"{tally.in_flight_at_enqueue_kill} requests cut off mid-enqueue; lost {len(tally.lost)}, "
            f"double {len(tally.double)}, skipped {len(tally.skipped)}; {tally.charges} charges "
            f"({tally.keyed} through the gateway's key), {tally.unknown_dead} unknown outcomes dead "
            f"({tally.unknown_charged} of them charged before the kill); {time.monotonic() - started:.1f} s"
        )


# -- 6. an HTTP worker killed between an effect's start and its finish -------------------------

HTTP_WORKER = Path(__file__).with_name("http_effect_worker.py")


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _http_worker(url: str, gateway: Path, mode: str, n: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(HTTP_WORKER), url, str(gateway), mode, str(n)], env=env, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _charges(gateway: Path) -> Counter[str]:
    return Counter(json.loads(line)["order"] for line in gateway.read_text().splitlines())


def test_an_http_worker_killed_between_start_and_finish(db_url: str, tmp_path: Path) -> None:
    config = write_config(
        tmp_path, database_url=db_url, demo=False, workers=0, external_types=["ext.charge"],
        stall_timeout=STALL_TIMEOUT, sweep_interval=0.3, backoff_base=0.05, backoff_cap=0.2,
    )  # fmt: skip
    serve = JobdeckProcess(tmp_path, config, "serve")
    engine = make_engine(db_url, pool_size=2)
    store = Store(engine)
    gateway = tmp_path / "gateway.jsonl"
    logs = [tmp_path / f"http-worker-{n}.log" for n in range(3)]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        serve.wait_serving()
        jobs_of = [
            {"type": "ext.charge", "payload": {"order": "o-1"}, "max_retries": RETRIES},
            {"type": "ext.charge", "payload": {"order": "o-2", "replay_safe": True}, "max_retries": RETRIES},
        ]
        plain, safe = (j["id"] for j in _post(f"{serve.url}/api/jobs/bulk", {"jobs": jobs_of})["jobs"])

        # The worker starts both effects, charges both, and dies before finishing either.
        holder = _http_worker(serve.url, gateway, "hold", 2, logs[0])
        workers.append(holder)
        wait_for(lambda: "holding" in logs[0].read_text() or holder.poll() is not None, 60, message="the charges")
        assert holder.poll() is None, logs[0].read_text()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        assert _charges(gateway) == {"o-1": 1, "o-2": 1}
        assert {store.ledger.get(f"charge:{o}").state for o in ("o-1", "o-2")} == {EffectState.STARTED}

        # The sweep rescues both; the next worker's starts find the outcomes unknown.
        worker = _http_worker(serve.url, gateway, "work", 2, logs[1])
        workers.append(worker)
        assert worker.wait(timeout=120) == 0, logs[1].read_text()
        dead, done = store.get(plain), store.get(safe)
        message = "effect charge:o-1 was started by attempt 1 and its outcome is unknown"
        assert (dead.status, dead.error) == (State.DEAD, f"EffectOutcomeUnknown: {message}"), dead
        assert [str(a.outcome) for a in store.attempts_of(plain)] == ["stalled", "failed"]
        assert done.status is State.COMPLETED and done.result == {"charge_id": "ch_o-2_2", "replayed": True}, done
        assert [str(a.outcome) for a in store.attempts_of(safe)] == ["stalled", "completed"]
        assert store.ledger.get("charge:o-1").state is EffectState.STARTED
        safe_effect = store.ledger.get("charge:o-2")
        assert (safe_effect.state, safe_effect.attempt) == (EffectState.DONE, 2)
        assert _charges(gateway) == {"o-1": 1, "o-2": 1}, "a charge was made twice"

        # A person checks the gateway (charged), says so, and retries: the retry skips the charge.
        resolved = _post(
            f"{serve.url}/api/jobs/{plain}/effects/charge:o-1/resolve",
            {"outcome": "done", "result": {"charge_id": "ch_o-1_1", "replayed": False}},
        )
        assert (resolved["state"], resolved["resolved_by"]) == ("done", "api"), resolved
        _post(f"{serve.url}/api/jobs/{plain}/retry", {})
        again = _http_worker(serve.url, gateway, "work", 1, logs[2])
        workers.append(again)
        assert again.wait(timeout=120) == 0, logs[2].read_text()
        assert logs[2].read_text().startswith(f"skip {plain} "), logs[2].read_text()
        final = store.get(plain)
        assert final.status is State.COMPLETED and final.result == {"charge_id": "ch_o-1_1", "replayed": False}
        assert _charges(gateway) == {"o-1": 1, "o-2": 1}
    except AssertionError as exc:
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in logs if log.exists())
        raise AssertionError(f"{exc}\n{tails}\n--- serve\n{serve.out()[-3000:]}") from None
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        _stop(serve)
        engine.dispose()


def _stop(serve: JobdeckProcess) -> None:
    if serve.proc.poll() is None:
        serve.signal(signal.SIGTERM)
        try:
            serve.wait_exit(20)
        except subprocess.TimeoutExpired:
            serve.kill()
