"""What ``@handler`` returns: the function, still callable as it was, with a
way to enqueue its jobs, as Procrastinate's ``.defer()`` or Celery's
``.delay()`` let a caller name the task rather than spell its type::

    @handler("billing.charge")
    def charge(payload, ctx): ...

    charge.enqueue(order_id=7, idempotency_key="charge:7")
    charge.enqueue_many([{"order_id": 8}, {"order_id": 9}], delay=60)

An enqueue goes through the deck given as ``deck=``, else this process's
deck: the one built from the config last (``Jobdeck.from_config``,
``create_app``, ``jobdeck serve`` and ``jobdeck worker`` build one) or
started (``deck.start()``); ``use_deck`` names another. With none, it
raises ``NoDeck`` saying how to give one. Arrows point down: the deck
registers itself here, and this module never imports it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from jobdeck.core.errors import InvalidField

if TYPE_CHECKING:
    from jobdeck.jobs.handlers import HandlerSpec, Registry
    from jobdeck.jobs.payloads import PayloadShape
    from jobdeck.store.records import Enqueued

P = ParamSpec("P")
R = TypeVar("R")


class Deck(Protocol):
    """What a handle needs of a deck (``jobdeck.deck.Jobdeck``)."""

    def enqueue(
        self,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        priority: int | str | None = None,
        queue: str | None = None,
        max_retries: int | None = None,
        idempotency_key: str | None = None,
        run_at: datetime | str | None = None,
        delay_seconds: float | None = None,
        unique: Any = None,
    ) -> Enqueued: ...

    def enqueue_each(self, items: Sequence[Any]) -> list[Enqueued]: ...


class NoDeck(RuntimeError):
    """A handle's enqueue found no deck to go through."""

    def __init__(self, job_type: str) -> None:
        super().__init__(
            f"{job_type}: no Jobdeck to enqueue through in this process. Pass one (.enqueue(..., deck=deck)), "
            "or build this process's deck first: Jobdeck.from_config(...), create_app(), or deck.start() "
            "make it the one handles use (jobdeck.use_deck(deck) names any other)"
        )


_current: Deck | None = None


def use_deck(deck: Deck | None) -> Deck | None:
    """Make ``deck`` the one handles enqueue through when given none (None:
    no deck); returns the one it replaces, for a caller to put back."""
    global _current
    before, _current = _current, deck
    return before


def current_deck() -> Deck | None:
    return _current


class Handle(Generic[P, R]):
    """A registered handler: call it as the function (``inspect`` sees the
    function, ``async def`` included), or enqueue its jobs."""

    def __init__(
        self, fn: Callable[P, R], job_type: str, registry: Registry, shape: PayloadShape | None = None
    ) -> None:
        functools.update_wrapper(self, fn)
        for name in ("__code__", "__defaults__", "__kwdefaults__"):  # so inspect reads an async def as one
            if hasattr(fn, name):
                setattr(self, name, getattr(fn, name))
        self.type = job_type
        self.registry = registry
        self.shape = shape
        """Its payload's type, if annotated (``jobdeck.jobs.payloads``)."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The function; given a mapping for a typed payload (as a job's
        payload is, and as a process executor's child calls it), the
        mapping is converted first, as for a job."""
        shape = self.shape
        if shape is not None and shape.converts_mappings and args and isinstance(args[0], Mapping):
            return self.__wrapped__(shape.load(args[0], "payload"), *args[1:], **kwargs)  # type: ignore[arg-type]
        return self.__wrapped__(*args, **kwargs)

    __wrapped__: Callable[P, R]

    def __repr__(self) -> str:
        return f"<handler {self.type!r} {getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!r}>"

    def __reduce__(self) -> str:
        """Pickled (and copied) by its module and name, as the function was: a
        process pool gets the handle its module holds, not a copy of the registry."""
        return str(getattr(self, "__qualname__", self.type))

    @property
    def spec(self) -> HandlerSpec | None:
        """Its options as registered (None once another function took its type)."""
        return self.registry.get(self.type)

    def enqueue(
        self,
        payload: Any = None,
        /,
        *,
        delay: float | timedelta | None = None,
        run_at: datetime | str | None = None,
        priority: int | str | None = None,
        queue: str | None = None,
        max_retries: int | None = None,
        idempotency_key: str | None = None,
        unique: Any = None,
        deck: Deck | None = None,
        **fields: Any,
    ) -> Enqueued:
        """Enqueue one job of this type; its payload is ``payload`` (a mapping)
        or the keyword ``fields``, not both. Returns ``(job, created)`` as
        ``Jobdeck.enqueue`` does. A field named like an option (``priority``)
        goes in ``payload``."""
        if payload is not None and fields:
            raise TypeError(f"{self.type}.enqueue(): give the payload as one object or as fields, not both")
        options = _options(delay, run_at, priority, queue, max_retries, idempotency_key, unique)
        body = self.payload_of(fields if payload is None else payload)
        return self._deck(deck).enqueue(self.type, body, **options)

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        /,
        *,
        delay: float | timedelta | None = None,
        run_at: datetime | str | None = None,
        priority: int | str | None = None,
        queue: str | None = None,
        max_retries: int | None = None,
        unique: Any = None,
        deck: Deck | None = None,
    ) -> list[Enqueued]:
        """Enqueue one job per payload, in one transaction, with the same
        options: at most ``max_bulk_jobs`` of them, and one refused refuses
        all (``ItemRefused`` naming its index); nothing is inserted then."""
        options = _options(delay, run_at, priority, queue, max_retries, None, unique)
        items = [{"type": self.type, "payload": self.payload_of(p), **options} for p in payloads]
        return self._deck(deck).enqueue_each(items)

    def payload_of(self, payload: Any) -> dict[str, Any]:
        """``payload`` as a job carries it: a mapping as a dict (None: ``{}``),
        and for a typed payload an instance of its type in its JSON form,
        checked (``InvalidField`` naming the field)."""
        if self.shape is not None:
            return self.shape.to_payload({} if payload is None else payload)
        if payload is None:
            return {}
        if not isinstance(payload, Mapping):
            raise InvalidField("payload", f"must be a JSON object (a mapping), not {type(payload).__name__}")
        return dict(payload)

    def _deck(self, deck: Deck | None) -> Deck:
        found = deck if deck is not None else _current
        if found is None:
            raise NoDeck(self.type)
        return found


def _options(
    delay: float | timedelta | None,
    run_at: datetime | str | None,
    priority: int | str | None,
    queue: str | None,
    max_retries: int | None,
    idempotency_key: str | None,
    unique: Any,
) -> dict[str, Any]:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    given = {
        "delay_seconds": seconds, "run_at": run_at, "priority": priority, "queue": queue,
        "max_retries": max_retries, "idempotency_key": idempotency_key, "unique": unique,
    }  # fmt: skip
    return {key: value for key, value in given.items() if value is not None}
