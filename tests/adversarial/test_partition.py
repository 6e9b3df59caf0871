"""A network partition between one host and PostgreSQL, with two hosts.

Host A is a real ``jobdeck worker`` in a network namespace of its own,
reaching the database over a veth pair (through a relay on the root
namespace's end of it, since the server listens on loopback); host B is a
``jobdeck worker`` beside the database. A holds five jobs when its link is
cut for longer than ``stall_timeout`` (the interface taken down: packets
vanish, nothing is refused), then restored. What must hold:

- A's handlers, which write ``ctx.log`` lines all the while, are told
  "lease lost" within half of ``stall_timeout`` (plus one watch tick),
  whether the link goes down or packets silently vanish;
- B rescues A's jobs once they stall and runs them;
- A's late acknowledgement (a handler that ignores the cancel and finishes
  during the partition) is refused when the link is back;
- no effect recorded ``done`` is performed twice;
- A takes its lease back and runs jobs again, without a restart.

Needs root for ``ip netns`` (CI runs as root): without it the test fails in
CI and is skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from jobdeck.store.models import attempts, effects, jobs, workers
from sqlalchemy import select
from sqlalchemy.engine import make_url

from tests import skew_handlers
from tests.adversarial.outages import Proxy
from tests.conftest import wait_for
from tests.pgtest import required
from tests.worker_processes import stop

ROOT = Path(__file__).parents[2]
STALL = 6.0
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["postgres"], indirect=True)]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Namespace:
    """A network namespace joined to the root one by a veth pair on a /30."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"
        self.name, self.outer, self.inner = f"jdpart{tag}", f"jdo{tag}", f"jdi{tag}"
        a, b = random.randrange(16, 250), random.randrange(0, 63) * 4
        self.outer_ip, self.inner_ip = f"10.{a}.{b // 256}.{b % 256 + 1}", f"10.{a}.{b // 256}.{b % 256 + 2}"
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
            _ip("link", "set", self.inner, "netns", self.name)
            _ip("addr", "add", f"{self.outer_ip}/30", "dev", self.outer)
            _ip("link", "set", self.outer, "up")
            self.run("ip", "addr", "add", f"{self.inner_ip}/30", "dev", self.inner)
            self.run("ip", "link", "set", self.inner, "up")
            self.run("ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def run(self, *argv: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.name, *argv], check=True, capture_output=True)

    def cut(self, silent: bool = False) -> None:
        """The link taken down (a local error for every send), or, ``silent``,
        packets vanishing both ways with the link and routes up (a firewall
        that drops everything): each side's neighbour is pinned to an address
        nobody has, so nothing answers, nothing is refused."""
        self.silent = silent
        if silent:
            self.run("ip", "neigh", "replace", self.outer_ip, "lladdr", "02:00:00:00:00:01", "nud", "permanent",
                     "dev", self.inner)  # fmt: skip
            _ip("neigh", "replace", self.inner_ip, "lladdr", "02:00:00:00:00:02", "nud", "permanent", "dev", self.outer)
        else:
            self.run("ip", "link", "set", self.inner, "down")

    def restore(self) -> None:
        if self.silent:
            self.run("ip", "neigh", "del", self.outer_ip, "dev", self.inner)
            _ip("neigh", "del", self.inner_ip, "dev", self.outer)
        else:
            self.run("ip", "link", "set", self.inner, "up")

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def _namespaces_work() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if os.geteuid() != 0:
        return "ip netns needs root"
    probe = subprocess.run(["ip", "netns", "add", f"jdprobe{os.getpid()}"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", f"jdprobe{os.getpid()}"], capture_output=True)
    return probe.stderr.strip() or None if probe.returncode else None


@pytest.fixture
def namespace():
    why = _namespaces_work()
    if why is not None:
        if required():
            pytest.fail(f"the partition test needs network namespaces: {why}")
        pytest.skip(f"network namespaces: {why}")
    ns = Namespace()
    yield ns
    ns.close()


def _config(path: Path, db_url: str, tmp_path: Path) -> Path:
    # Without the test's application_name, so the hosts' sessions carry
    # Jobdeck's own (``host:pid.nonce``), by which B's sweeper finds A's.
    url = make_url(db_url)
    db_url = url.set(query={k: v for k, v in url.query.items() if k != "application_name"}).render_as_string(
        hide_password=False
    )
    path.write_text(
        f"database_url = {json.dumps(db_url)}\ninstance_path = {json.dumps(str(tmp_path / 'instance'))}\n"
        f"workers = 5\npoll_interval = 0.2\nheartbeat_interval = 0.5\nstall_timeout = {STALL}\n"
        "sweep_interval = 0.5\nbackoff_base = 0.05\nbackoff_cap = 0.5\nshutdown_grace = 2.0\n"
        'handler_modules = ["tests.skew_handlers"]\n'
    )
    return path


def _worker(config: Path, log: Path, netns: str | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBDECK_")}
    env.update(PYTHONPATH=str(ROOT), JOBDECK_CONFIG=str(config))
    prefix = ["ip", "netns", "exec", netns] if netns else []
    argv = [*prefix, sys.executable, "-m", "jobdeck.cli", "worker", "--log-level", "info"]
    with log.open("wb") as fh:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("silent", [False, True], ids=["link-down", "silent-drop"])
def test_a_host_cut_off_longer_than_the_stall_timeout_hands_over_and_rejoins(
    db_url, tmp_path, make_deck, registry, namespace, silent
):
    skew_handlers.register(registry)
    deck = make_deck()
    parsed = make_url(db_url)
    relay = Proxy(parsed.host or "127.0.0.1", parsed.port or 5432, listen=namespace.outer_ip)
    config_a = _config(tmp_path / "a.toml", relay.url(db_url), tmp_path)
    config_b = _config(tmp_path / "b.toml", db_url, tmp_path)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    runs, done_effects = tmp_path / "runs.jsonl", tmp_path / "effects.jsonl"
    common = {"log": str(runs), "effects": str(done_effects), "later": 0.5, "chatty": True}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_worker(config_a, log_a, namespace.name))
        host_a = wait_for(lambda: _live(deck), timeout=60, message="host A started")[0]
        payloads = [
            {"seconds": 60, "effect": "after-0"},
            {"seconds": 60, "effect": "after-1"},
            {"seconds": 60, "effect": "first-2", "effect_first": True},
            {"seconds": 60, "effect": "first-3", "effect_first": True},
            {"seconds": 3 * STALL, "ignore_cancel": True},
        ]
        ids = deck.enqueue_many([{"type": skew_handlers.HOLD, "payload": {**p, **common}} for p in payloads])
        wait_for(lambda: len(_events(runs, "start")) == 5, timeout=30, message="host A runs all five")
        wait_for(lambda: len(_lines(done_effects)) == 2, timeout=30, message="host A performed two effects")
        procs.append(_worker(config_b, log_b))
        wait_for(lambda: len(_live(deck)) == 2, timeout=60, message="host B started")

        cut = time.monotonic()
        namespace.cut(silent)
        stopped = wait_for(
            lambda: _all(_events(runs, "stopped"), 4),
            timeout=STALL + 1,
            message="A's four cancel-aware handlers told",
        )
        told_after = time.monotonic() - cut
        wait_for(lambda: _completed(deck, ids), timeout=90, message="host B finished A's five jobs")
        handed_over = time.monotonic() - cut
        wait_for(lambda: _events(runs, "done", job=ids[4], attempt=1), timeout=3 * STALL + 10,
                 message="A's ignoring handler finished during the partition")  # fmt: skip
        partition = time.monotonic() - cut
        namespace.restore()

        wait_for(lambda: "has its lease again" in log_a.read_text(errors="replace"), timeout=60,
                 message="host A has its lease back")  # fmt: skip
        rejoined = time.monotonic() - cut
        stop(procs[1:])  # B goes: what is enqueued now only A can run
        more = deck.enqueue_many([{"type": skew_handlers.HOLD, "payload": {"seconds": 0.2, **common}}] * 2)
        wait_for(lambda: _completed(deck, more), timeout=60, message="host A runs jobs again")
        with deck.store.read() as conn:
            history = conn.execute(
                select(attempts.c.job_id, attempts.c.attempt, attempts.c.worker_id, attempts.c.outcome)
                .where(attempts.c.job_id.in_(ids + more))
                .order_by(attempts.c.job_id, attempts.c.attempt)
            ).all()
            ledger = dict(conn.execute(select(effects.c.key, effects.c.state)).all())
            finals = dict(conn.execute(select(jobs.c.id, jobs.c.worker_id).where(jobs.c.id.in_(ids + more))).all())
    finally:
        stop(procs)
        relay.close()
    text_a = log_a.read_text(errors="replace")
    ended = "database session(s) of gone workers" in log_b.read_text(errors="replace")
    performed = Counter(line["key"] for line in _lines(done_effects))
    late_done = _events(runs, "done", job=ids[4], attempt=1)
    print(
        f"{'silent drop' if silent else 'link down'}, handlers logging: cut for {partition:.1f} s (stall_timeout {STALL:g} s): A's handlers told 'lease lost' after {told_after:.2f} s; "
        f"B finished A's jobs {handed_over:.1f} s after the cut; A had its lease back {rejoined - partition:.1f} s "
        f"after the link; B {'ended' if ended else 'ended none of'} A's sessions caught in a transaction; "
        f"effects performed {dict(performed)}; ledger {ledger}"
    )
    assert all(r["reason"] == "lease lost" for r in stopped) and told_after < STALL
    assert "lost its lease" in text_a
    for job_id in ids:
        rows = [r for r in history if r.job_id == job_id]
        assert rows[0].worker_id == host_a and rows[0].outcome == "stalled", rows
        assert rows[-1].outcome == "completed" and rows[-1].worker_id != host_a, rows
        assert finals[job_id] != host_a
    assert late_done, "the ignoring handler finished on A"
    assert "released 0 of 4 jobs set aside" in text_a, "A's set-aside attempts were refused: B had taken them"
    assert all(n == 1 for n in performed.values()) and len(performed) == 4, performed
    assert set(ledger.values()) == {"done"} and len(ledger) == 4
    assert all(finals[job_id] == host_a for job_id in more), "A runs jobs again after the partition"


def _live(deck) -> list[str]:
    with deck.store.read() as conn:
        return [w for (w,) in conn.execute(select(workers.c.id).where(workers.c.stopped_at.is_(None)))]


def _all(found: list[dict], n: int) -> list[dict] | None:
    return found if len(found) == n else None


def _lines(path: Path) -> list[dict]:
    return skew_handlers.read(path)


def _events(path: Path, event: str, **where: object) -> list[dict]:
    return [r for r in skew_handlers.read(path) if r["event"] == event and all(r[k] == v for k, v in where.items())]


def _completed(deck, ids: list[int]) -> bool:
    with deck.store.read() as conn:
        states = [s for (s,) in conn.execute(select(jobs.c.status).where(jobs.c.id.in_(ids)))]
    return states == ["completed"] * len(ids)


def test_a_host_cut_off_for_less_than_the_stall_timeout_keeps_its_jobs(
    db_url, tmp_path, make_deck, registry, namespace
):
    """A silent cut of 0.7 of ``stall_timeout``: the handlers are told at half
    of it and stop; when the network is back a beat lands at once (not after
    TCP's retransmission backoff, on a new connection), before anyone
    rescues, and the jobs are given back, interrupted, no retry counted."""
    skew_handlers.register(registry)
    deck = make_deck()
    parsed = make_url(db_url)
    relay = Proxy(parsed.host or "127.0.0.1", parsed.port or 5432, listen=namespace.outer_ip)
    config_a = _config(tmp_path / "a.toml", relay.url(db_url), tmp_path)
    config_b = _config(tmp_path / "b.toml", db_url, tmp_path)
    log_a = tmp_path / "a.log"
    runs = tmp_path / "runs.jsonl"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_worker(config_a, log_a, namespace.name))
        wait_for(lambda: _live(deck), timeout=60, message="host A started")
        payload = {"seconds": 60, "later": 0.2, "log": str(runs), "chatty": True}
        ids = deck.enqueue_many([{"type": skew_handlers.HOLD, "payload": payload}] * 3)
        wait_for(lambda: len(_events(runs, "start")) == 3, timeout=30, message="host A runs all three")
        procs.append(_worker(config_b, tmp_path / "b.log"))  # a sweeper elsewhere, ready to rescue
        wait_for(lambda: len(_live(deck)) == 2, timeout=60, message="host B started")
        cut = time.monotonic()
        namespace.cut(silent=True)
        wait_for(lambda: _all(_events(runs, "stopped"), 3), timeout=STALL, message="A's handlers told")
        told_after = time.monotonic() - cut
        # The cut's length: 0.7 of stall_timeout from the cut, not from the
        # moment the handlers were seen told (later on a busy machine).
        time.sleep(max(0.0, cut + 0.7 * STALL - time.monotonic()))
        namespace.restore()
        restored_after = time.monotonic() - cut
        wait_for(lambda: _completed(deck, ids), timeout=60, message="the jobs run again")
        with deck.store.read() as conn:
            outcomes = [o for (o,) in conn.execute(select(attempts.c.outcome).where(attempts.c.job_id.in_(ids)))]
            retries = [r for (r,) in conn.execute(select(jobs.c.retry_count).where(jobs.c.id.in_(ids)))]
    finally:
        stop(procs)
        relay.close()
    print(
        f"silent cut of {restored_after:.1f} s (stall_timeout {STALL:g} s), handlers told after {told_after:.2f} s: "
        f"attempts {sorted(outcomes)}"
    )
    assert "stalled" not in outcomes, "nobody rescued: A was back in time"
    assert sorted(outcomes) == ["completed"] * 3 + ["interrupted"] * 3 and retries == [0, 0, 0]


def test_a_host_stopped_while_cut_off_exits_within_its_grace(db_url, tmp_path, make_deck, registry, namespace):
    """SIGTERM while packets silently vanish: the pool gives up its last
    writes at its deadline (``shutdown_grace`` + 2 s), and threads stuck on
    the dropped connections are not waited for (they held the process for
    30 s with a grace of 2 s)."""
    skew_handlers.register(registry)
    deck = make_deck()
    parsed = make_url(db_url)
    relay = Proxy(parsed.host or "127.0.0.1", parsed.port or 5432, listen=namespace.outer_ip)
    config = _config(tmp_path / "a.toml", relay.url(db_url), tmp_path)
    runs = tmp_path / "runs.jsonl"
    proc = _worker(config, tmp_path / "a.log", namespace.name)
    try:
        wait_for(lambda: _live(deck), timeout=60, message="host A started")
        deck.enqueue_many([{"type": skew_handlers.HOLD, "payload": {"seconds": 60, "log": str(runs), "chatty": True}}])
        wait_for(lambda: _events(runs, "start"), timeout=30, message="host A runs the job")
        namespace.cut(silent=True)
        time.sleep(1.0)  # the cut settles in: statements now hang instead of failing
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
        relay.close()
    grace = 2.0
    print(f"SIGTERM during a silent cut: exited {proc.returncode} after {took:.1f} s (shutdown_grace {grace:g} s)")
    # grace, the pool's margin, the stuck threads' margin, and room for a busy machine (it took 30 s before)
    assert took < grace + 2.0 + 2.0 + 5.0
