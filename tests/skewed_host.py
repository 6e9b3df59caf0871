"""Run the ``jobdeck`` command as a host whose wall clock is off by
``sys.argv[1]`` seconds (positive: ahead): ``python tests/skewed_host.py 90
worker``. Everything that reads this host's clock through Jobdeck (the
deck's default clock, ``jobdeck.core.clock.host_now``) sees the skew; the handlers'
own ``time.time()`` does not, so a test can judge both processes on one
true time line. An injected offset rather than libfaketime: faked time
breaks ``time.sleep`` or ``Event.wait`` here."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import jobdeck.core.clock  # noqa: E402

SKEW = timedelta(seconds=float(sys.argv[1]))


def skewed_now() -> datetime:
    return datetime.now(UTC) + SKEW


jobdeck.core.clock.host_now = skewed_now

if __name__ == "__main__":
    from jobdeck.cli import main

    sys.exit(main(args=sys.argv[2:]))
