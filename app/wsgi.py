"""WSGI entry point for another server (``gunicorn jobdeck.wsgi:app``; from a
checkout also ``gunicorn wsgi:app``).

Refuses to start exposed without credentials, exactly as ``jobdeck serve``
does (``jobdeck.web.exposure``; set ``JOBDECK_BIND`` to the address the server
listens on), then builds the app and starts this process's runtime (workers
and scheduler) once; ``jobdeck serve`` does the same with granian or waitress.

The runtime stops (gracefully, within ``shutdown_grace``) when the process
exits: through ``atexit`` under gunicorn, and through a ``multiprocessing``
finalizer in a worker that ``multiprocessing`` started and that skips
``atexit`` (``granian --interface wsgi jobdeck.wsgi:app``).
"""

import atexit
import multiprocessing.util

from jobdeck import create_app
from jobdeck.core.config import load
from jobdeck.core.structured_logs import use_log_format
from jobdeck.runtime import Runtime
from jobdeck.web.exposure import exposure_problem

config = load()
use_log_format(config.log_format)
problem = exposure_problem(config)
if problem:
    raise SystemExit(f"jobdeck: {problem}")
app = create_app(config)
runtime = Runtime.for_app(app)
runtime.start()
atexit.register(runtime.stop)
multiprocessing.util.Finalize(runtime, runtime.stop, exitpriority=10)
