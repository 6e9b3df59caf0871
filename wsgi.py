"""WSGI entry point from a checkout (``gunicorn wsgi:app``): the same as
``jobdeck.wsgi``, which an installed wheel serves (``gunicorn jobdeck.wsgi:app``)."""

from jobdeck.wsgi import app, runtime

__all__ = ["app", "runtime"]
