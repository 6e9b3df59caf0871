"""Sixteen largest pages at once keep a serve process small (issue 29).

500 jobs with 255 KB payloads (``max_payload_bytes`` raised to 256 KiB);
16 clients ask a real ``jobdeck serve`` (the default server) for
``GET /api/jobs?limit=500`` at once, twice each. Before lists were bounded
by bytes each answer was 131 MB, and the process that runs the app peaked at
4.1 GB. Now each page stops at ``max_list_bytes`` (2 MiB) with a cursor to
the rest, and the process must peak under 500 MB (VmHWM, the kernel's
high-water mark of its resident memory).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest
from jobdeck.core.config import load
from jobdeck.deck import Jobdeck

from tests.adversarial.cli_process import JobdeckProcess, children, write_config

pytestmark = pytest.mark.slow

JOBS = 500
PAYLOAD = 255_000
CLIENTS = 16
LIMIT_MB = 500


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_sixteen_largest_pages_at_once_keep_the_process_under_500_mb(tmp_path: Path) -> None:
    config = write_config(tmp_path, workers=0, max_payload_bytes=256 * 1024)
    deck = Jobdeck.of(load(config))
    deck.enqueue_many([{"type": "demo.noop", "payload": {"blob": "x" * (PAYLOAD - 12)}} for _ in range(JOBS)])
    deck.store.engine.dispose()
    server = JobdeckProcess(tmp_path, config)
    try:
        server.wait_serving()
        app_pid = (children(server.proc.pid) or [server.proc.pid])[0]  # granian's worker runs the app
        before = _peak_mb(app_pid)
        sizes: list[int] = []
        cursors: list[object] = []
        errors: list[BaseException] = []

        def client() -> None:
            try:
                for _ in range(2):
                    with urllib.request.urlopen(f"{server.url}/api/jobs?limit={JOBS}", timeout=120) as response:
                        body = response.read()
                    sizes.append(len(body))
                    cursors.append(json.loads(body)["next_cursor"])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        server.alive()
        peak = _peak_mb(app_pid)
        print(
            f"\n{CLIENTS} clients x 2 GET /api/jobs?limit={JOBS} over {JOBS} jobs of {PAYLOAD:,} B: answers "
            f"{max(sizes, default=0) / 1e6:.1f} MB at most; app process peak RSS {before:.0f} MB before, "
            f"{peak:.0f} MB after"
        )
        assert not errors, errors[:3]
        assert len(sizes) == 2 * CLIENTS
        assert all(c is not None for c in cursors), "a page over the byte budget gave no cursor to the rest"
        assert peak < LIMIT_MB, f"the app process peaked at {peak:.0f} MB"
    finally:
        server.kill()
