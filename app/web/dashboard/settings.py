"""The dashboard's configuration: the ``[dashboard]`` and ``[users]`` tables.

    [dashboard]
    poll_seconds = 3            # live refresh interval, 1..300
    counts_cache_seconds = 3    # overview snapshot lifetime, 0..300 (0: no cache)
    login_failures = 10         # failed sign-ins per account, and per address, ...
    login_window_seconds = 60   # ... within this window before 429 (jobdeck.web.dashboard.throttle)

    [users.alice]
    password_hash = "scrypt:32768:8:1$..."   # from `jobdeck hash-password`
    role = "operator"                        # or "viewer" (read-only)

Validated when the app is built, so a typo stops start-up with the key named.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from jobdeck.core.config import Config, ConfigError

ROLES = ("viewer", "operator")
OPERATOR = "operator"
VIEWER = "viewer"


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str
    role: str

    @property
    def can_act(self) -> bool:
        return self.role == OPERATOR

    @property
    def credential(self) -> str:
        """A fingerprint of what this user signs in with and may do: a
        session remembers it (``jobdeck.store.sessions``) and ends when the
        config gives the user another password or role. A digest of the
        (salted, slow) password hash, so it tells nothing of the password."""
        text = "\0".join((self.name, self.password_hash, self.role))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class DashboardSettings:
    poll_seconds: float = 3.0
    counts_cache_seconds: float = 3.0
    users: dict[str, User] = field(default_factory=dict)
    login_failures: int = 10
    login_window_seconds: float = 60.0
    embedded: bool = False
    """Mounted in a host Flask app (``jobdeck.embed``): the host's login decides
    the role, and ``[users]`` is not used."""

    @property
    def open_access(self) -> bool:
        """No users configured: everyone is an operator (loopback only)."""
        return not self.users and not self.embedded


def _number(table: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"dashboard.{key}: expected a number, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"dashboard.{key}: must be between {low:g} and {high:g}, got {value}")
    return float(value)


def load_settings(config: Config) -> DashboardSettings:
    table = config.extra.get("dashboard", {}) or {}
    if not isinstance(table, dict):
        raise ConfigError("dashboard: expected a table")
    unknown = sorted(set(table) - {"poll_seconds", "counts_cache_seconds", "login_failures", "login_window_seconds"})
    if unknown:
        raise ConfigError(f"dashboard.{unknown[0]}: unknown configuration key")
    poll = _number(table, "poll_seconds", 3.0, 1.0, 300.0)
    cache = _number(table, "counts_cache_seconds", min(poll, 3.0), 0.0, 300.0)
    failures = _number(table, "login_failures", 10, 1, 1000)
    if failures != int(failures):
        raise ConfigError(f"dashboard.login_failures: expected a whole number, got {failures:g}")
    window = _number(table, "login_window_seconds", 60.0, 1.0, 86400.0)
    return DashboardSettings(poll, cache, load_users(config), int(failures), window)


MAX_USER_NAME_CHARS = 200
"""A user's name is stored with each session (``dashboard_sessions.user_name``)
and as the actor of what they do (``audit_log.actor``, ``effects.resolved_by``,
``runtime_schedules.updated_by``): columns of 200 characters."""


def load_users(config: Config) -> dict[str, User]:
    table = config.extra.get("users", {}) or {}
    if not isinstance(table, dict):
        raise ConfigError("users: expected a table of users, e.g. [users.alice]")
    users: dict[str, User] = {}
    for name, entry in table.items():
        key = f"users.{name}"
        if len(name) > MAX_USER_NAME_CHARS:
            raise ConfigError(
                f"users.{name[:40]}...: a user name is at most {MAX_USER_NAME_CHARS} characters "
                "(it is stored with each session and as the actor of each action)"
            )
        if not isinstance(entry, dict):
            raise ConfigError(f"{key}: expected a table with password_hash and role")
        unknown = sorted(set(entry) - {"password_hash", "role"})
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}: unknown configuration key")
        pw = entry.get("password_hash")
        if not isinstance(pw, str) or "$" not in pw:
            raise ConfigError(f"{key}.password_hash: required; produce one with `jobdeck hash-password`")
        role = entry.get("role", VIEWER)
        if role not in ROLES:
            raise ConfigError(f"{key}.role: must be one of {', '.join(ROLES)}, got {role!r}")
        users[name] = User(name, pw, role)
    return users
