"""WSGI entry point from a checkout (``gunicorn wsgi:app``): the same as
``app.wsgi``, which an installed wheel serves (``gunicorn app.wsgi:app``)."""

from app.wsgi import app, runtime

__all__ = ["app", "runtime"]
