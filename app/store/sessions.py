"""Server-side dashboard sessions: the SQL behind login and logout.

The signed session cookie alone cannot be revoked: whoever copies it stays
signed in after the owner logs out. So each login opens a row here, and the
cookie carries only a random token whose SHA-256 names the row. Every
request checks the row still exists; logout deletes it, which every process
sharing the database sees at once. The table holds hashes, not tokens, so
reading it gives no usable cookie.

Each row also keeps the fingerprint of its user's credential (password hash
and role) at login: a session is honoured only while the config still gives
its user that credential, so changing a password or a role ends the user's
existing sessions in every process that runs the new config.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from jobdeck.store.lifecycle import Store
from jobdeck.store.models import dashboard_sessions
from sqlalchemy import delete, insert, select

SESSION_LIFETIME = timedelta(days=7)
"""A session older than this is refused (and pruned at the next login),
however long the browser keeps its cookie."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def open_session(store: Store, user_name: str, credential: str, now: datetime) -> str:
    """Record a new session for ``user_name`` holding ``credential`` (the
    fingerprint of its password hash and role); returns the token for the
    cookie. Expired sessions of anyone are pruned in the same transaction."""
    token = secrets.token_urlsafe(32)
    with store.write() as conn:
        conn.execute(delete(dashboard_sessions).where(dashboard_sessions.c.created_at < now - SESSION_LIFETIME))
        conn.execute(
            insert(dashboard_sessions).values(
                id=_digest(token), user_name=user_name, created_at=now, credential=credential
            )
        )
    return token


def session_user(store: Store, token: str, credential: str, now: datetime) -> str | None:
    """The user a live session belongs to; None when it was closed, never
    existed, has expired, or was opened with another credential than
    ``credential`` (the user's password or role changed since)."""
    stmt = select(dashboard_sessions.c.user_name).where(
        dashboard_sessions.c.id == _digest(token),
        dashboard_sessions.c.created_at >= now - SESSION_LIFETIME,
        dashboard_sessions.c.credential == credential,
    )
    with store.read() as conn:
        name = conn.execute(stmt).scalar_one_or_none()
    return str(name) if name is not None else None


def close_session(store: Store, token: str) -> bool:
    """End one session everywhere; False if it was already gone."""
    with store.write() as conn:
        return conn.execute(delete(dashboard_sessions).where(dashboard_sessions.c.id == _digest(token))).rowcount > 0
