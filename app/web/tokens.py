"""Named API tokens with least privilege: the ``[api_tokens.NAME]`` tables.

    [api_tokens.resize-worker]
    token_sha256 = "9f86d0..."   # the token's SHA-256 in hex, from `jobdeck token create`
    scopes = ["work"]            # any of enqueue, work, read, operate
    types = ["ext.resize"]       # optional: the only job types a work token sees
    queues = ["media"]           # optional: the only queues a work token sees

The config holds hashes, never tokens: a copy of the file opens nothing.
A request's bearer token is hashed and compared with every configured hash
(and with the hash of the legacy ``api_token``, which keeps every scope) by
``hmac.compare_digest``, each one, so neither which token matched nor how
much of it did shows in the answer's timing.

What each scope lets a token do is the table of ``jobdeck.web.scopes``; the
guard (``jobdeck.web.guard``) refuses the rest with 403. ``types`` and
``queues`` confine a ``work`` token: its claims take only those jobs, and
any job outside them is, to it, a job that does not exist (404). A token
that reads or operates sees every job, so it cannot be confined: the config
refuses ``types`` or ``queues`` on one (make two tokens instead).

An HTTP worker using a named token works under ``NAME/worker_id``
(``Principal.worker_id``): its attempts name the token, and no other token
can heartbeat or finish its jobs by sending the same worker id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jobdeck.core.config import Config, ConfigError
from jobdeck.core.errors import InvalidField, JobdeckError

ENQUEUE = "enqueue"
WORK = "work"
READ = "read"
OPERATE = "operate"
SCOPES = (ENQUEUE, WORK, READ, OPERATE)
"""Every scope a token can hold, in the order the docs list them."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A token's name: it is a metric label, an audit actor and a worker id prefix."""
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
"""A TOML key that needs no quotes (a name with a dot does)."""
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_TOKEN_CHARS = 1024
"""A longer bearer token matches none (``jobdeck token create`` makes 43)."""
MAX_LIST = 1000
"""The most types or queues one token may list (a claim names as many)."""

LEGACY_LABEL = "api_token"
SESSION_LABEL = "session"
ANONYMOUS_LABEL = "anonymous"
INVALID_LABEL = "invalid"
FIXED_LABELS = (LEGACY_LABEL, SESSION_LABEL, ANONYMOUS_LABEL, INVALID_LABEL)
"""The ``token`` label of requests not made with a named token; no token may take one of these names."""


@dataclass(frozen=True)
class Principal:
    """Who a request's bearer token says is calling, and what it may do."""

    name: str
    scopes: frozenset[str]
    types: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None
    named: bool = True
    """False for the legacy ``api_token``: every scope, the actor ``api``."""

    @property
    def label(self) -> str:
        """The ``token`` label of its requests in ``/metrics``."""
        return self.name if self.named else LEGACY_LABEL

    @property
    def actor(self) -> str:
        """Who the audit log says acted."""
        return f"token:{self.name}" if self.named else "api"

    @property
    def confined(self) -> bool:
        return self.types is not None or self.queues is not None

    def sees(self, job_type: str, queue: str) -> bool:
        """Whether a job of this type and queue exists, for this token."""
        return (self.types is None or job_type in self.types) and (self.queues is None or queue in self.queues)

    def claim_filter(
        self, types: list[str] | None, queues: list[str] | None
    ) -> tuple[list[str] | None, list[str] | None]:
        """The types and queues a claim with this token takes: its own when
        the worker names none, those named when all are its own; naming
        another is refused (403), not silently emptied, so a misconfigured
        worker learns why it gets no jobs."""
        return _within(types, self.types, "types", self.name), _within(queues, self.queues, "queues", self.name)

    def worker_id(self, given: str, max_chars: int) -> str:
        """The worker id stored for ``given``: a named token's worker works
        under ``NAME/given`` (the attempts record the token)."""
        if not self.named:
            return given
        room = max_chars - len(self.name) - 1
        if len(given) > room:
            raise InvalidField(
                "worker_id", f"at most {room} characters with the token {self.name} (stored as {self.name}/worker_id)"
            )
        return f"{self.name}/{given}"


def _within(asked: list[str] | None, allowed: tuple[str, ...] | None, field: str, name: str) -> list[str] | None:
    if allowed is None:
        return asked
    if asked is None:
        return list(allowed)
    outside = [a for a in asked if a not in allowed]
    if outside:
        raise OutsideToken(field, outside[0], name, allowed)
    return asked


class ScopeRefused(JobdeckError):
    """The token is valid but does not hold the scope this operation needs."""

    status_code = 403

    def __init__(self, principal: Principal, needed: Sequence[str]) -> None:
        held = ", ".join(sorted(principal.scopes)) or "none"
        if needed:
            wanted = " or ".join(needed)
            message = f"the token {principal.name} lacks the scope {wanted} this operation needs (it has {held})"
        else:
            message = f"this operation declares no scope, so no named token may call it (the token {principal.name})"
        super().__init__(message)
        self.scope = needed[0] if needed else None

    def to_dict(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"error": str(self)}
        if self.scope:
            answer["scope"] = self.scope
        return answer


class OutsideToken(JobdeckError):
    """A claim named a type or queue the token is not confined to."""

    status_code = 403

    def __init__(self, field: str, value: str, name: str, allowed: tuple[str, ...]) -> None:
        shown = ", ".join(allowed[:10]) + (", ..." if len(allowed) > 10 else "")
        super().__init__(f"{field}: the token {name} works only {field} {shown}; {value[:200]!r} is not one")
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "field": self.field}


@dataclass(frozen=True)
class ApiTokens:
    """The configured tokens, looked up by the hash of the bearer token."""

    named: tuple[tuple[bytes, Principal], ...] = ()
    legacy: bytes | None = None

    @property
    def configured(self) -> bool:
        """Whether the API requires a bearer token (no open access)."""
        return bool(self.named) or self.legacy is not None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for _, p in self.named)

    def identify(self, given: str) -> Principal | None:
        """The principal whose token is ``given``, or None. Every hash is
        compared, whichever matches, in constant time."""
        if len(given) > MAX_TOKEN_CHARS:
            given = ""
        digest = hashlib.sha256(given.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for stored, principal in self.named:
            if hmac.compare_digest(digest, stored) and given:
                found = principal
        if self.legacy is not None and hmac.compare_digest(digest, self.legacy) and given:
            found = LEGACY
        return found


LEGACY = Principal("api_token", frozenset(SCOPES), named=False)


def load_tokens(config: Config) -> ApiTokens:
    """The ``[api_tokens]`` tables and ``api_token``, checked: a typo stops start-up with the key named."""
    table = config.extra.get("api_tokens", {}) or {}
    if not isinstance(table, dict):
        raise ConfigError("api_tokens: expected a table of tokens, e.g. [api_tokens.resize-worker]")
    legacy = hashlib.sha256(config.api_token.encode()).digest() if config.api_token else None
    named: list[tuple[bytes, Principal]] = []
    seen: dict[bytes, str] = {legacy: "api_token"} if legacy else {}
    for name, entry in table.items():
        key = f"api_tokens.{name}"
        if not NAME.fullmatch(name) or name in FIXED_LABELS:
            raise ConfigError(
                f"{key}: a token's name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or "
                f"digit, and not one of {', '.join(FIXED_LABELS)}"
            )
        if not isinstance(entry, dict):
            raise ConfigError(f"{key}: expected a table with token_sha256 and scopes")
        unknown = sorted(set(entry) - {"token_sha256", "scopes", "types", "queues"})
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}: unknown configuration key")
        digest = entry.get("token_sha256")
        if not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest.lower()):
            raise ConfigError(f"{key}.token_sha256: required, 64 hex digits; `jobdeck token create {name}` prints it")
        stored = bytes.fromhex(digest)
        if stored in seen:
            raise ConfigError(f"{key}.token_sha256: the same token as {seen[stored]}; each token has its own secret")
        seen[stored] = key
        scopes = _names(entry.get("scopes"), f"{key}.scopes")
        if not scopes:
            raise ConfigError(f"{key}.scopes: required, a list of one or more of {', '.join(SCOPES)}")
        unknown_scopes = [s for s in scopes if s not in SCOPES]
        if unknown_scopes:
            raise ConfigError(f"{key}.scopes: {unknown_scopes[0]!r} is not a scope; one of {', '.join(SCOPES)}")
        types = _names(entry.get("types"), f"{key}.types")
        queues = _names(entry.get("queues"), f"{key}.queues")
        if (types is not None or queues is not None) and not {WORK} <= set(scopes) <= {WORK, ENQUEUE}:
            raise ConfigError(
                f"{key}: types and queues confine a work token; a token that reads or operates sees every job "
                "(make a second token for that)"
            )
        principal = Principal(name, frozenset(scopes), _tuple(types), _tuple(queues))
        named.append((stored, principal))
    return ApiTokens(tuple(named), legacy)


def _names(value: Any, key: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "\x00" not in v for v in value):
        raise ConfigError(f"{key}: expected a list of non-empty strings, got {value!r}")
    if not value or len(value) > MAX_LIST:
        raise ConfigError(f"{key}: 1 to {MAX_LIST} names; leave the key out for all")
    return list(dict.fromkeys(value))


def _tuple(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


# -- making one ----------------------------------------------------------------------------------


def new_token() -> str:
    """A fresh secret: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def config_lines(name: str, token: str, scopes: Iterable[str], types: Sequence[str], queues: Sequence[str]) -> str:
    """The TOML table that configures ``token`` as ``name``."""
    key = name if BARE_KEY.fullmatch(name) else json.dumps(name)
    lines = [f"[api_tokens.{key}]", f'token_sha256 = "{sha256_hex(token)}"', f"scopes = {_toml_list(scopes)}"]
    if types:
        lines.append(f"types = {_toml_list(types)}")
    if queues:
        lines.append(f"queues = {_toml_list(queues)}")
    return "\n".join(lines)


def _toml_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in values) + "]"


def check_new(name: str, scopes: Sequence[str], types: Sequence[str], queues: Sequence[str]) -> None:
    """What ``load_tokens`` would refuse, said before a token is printed."""
    entry: dict[str, Any] = {"token_sha256": "0" * 64, "scopes": list(scopes)}
    if types:
        entry["types"] = list(types)
    if queues:
        entry["queues"] = list(queues)
    load_tokens(Config(extra={"api_tokens": {name: entry}}))
