"""WSGI entry point for another server (e.g. ``gunicorn wsgi:app``).

Builds the app and starts this process's runtime (workers and scheduler)
once; ``jobdeck serve`` does the same with waitress.
"""

import atexit

from app import create_app
from app.runtime import Runtime

app = create_app()
runtime = Runtime.for_app(app)
runtime.start()
atexit.register(runtime.stop)
