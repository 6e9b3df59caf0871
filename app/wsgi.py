"""WSGI entry point for another server (``gunicorn jobdeck.wsgi:app``; from a
checkout also ``gunicorn wsgi:app``).

Refuses to start exposed without credentials, exactly as ``jobdeck serve``
does (``jobdeck.web.exposure``; set ``JOBDECK_BIND`` to the address the server
listens on), then builds the app and starts this process's runtime (workers
and scheduler) once; ``jobdeck serve`` does the same with granian or waitress.

The runtime stops (gracefully, within ``shutdown_grace``) when the process
exits: under gunicorn before Python shuts ``concurrent.futures`` down (below),
and through a ``multiprocessing`` finalizer in a worker that
``multiprocessing`` started and that skips ``atexit`` (``granian --interface
wsgi jobdeck.wsgi:app``).
"""

import atexit
import logging
import multiprocessing.util
import threading

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


def stop_before_futures() -> None:
    """The runtime's stop, run by threading's exit hooks. At exit Python
    shuts concurrent.futures down, refusing new work, before it runs
    ``atexit``: the scheduler's jobs that came due in between failed to
    start, each logged with a traceback ("cannot schedule new futures after
    interpreter shutdown"), as would anything else handed to a thread pool
    then (the process executor starts its children through one). These
    hooks run first, newest first (concurrent.futures registered its own
    when it was imported); ``atexit`` stays for a Python without them, and a
    stop after a finished one returns at once.

    A signal that ends the stop early (a gunicorn worker raises SystemExit
    from its SIGQUIT and SIGINT handlers) hurries it instead: the running
    jobs are released at once by the stop that ``atexit`` runs again, as a
    second signal does for ``jobdeck serve``. Nothing leaves this hook: an
    exception would skip the hooks after it, which join the thread pools."""
    try:
        runtime.stop()
    except BaseException as exc:  # noqa: BLE001 (SystemExit and KeyboardInterrupt too, by design)
        runtime.hurry()
        logging.getLogger("jobdeck").warning("the runtime's stop at exit was cut short (%r): releasing its jobs", exc)


register_hook = getattr(threading, "_register_atexit", None)
if register_hook is not None:
    register_hook(stop_before_futures)
