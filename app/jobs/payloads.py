"""Typed payloads, optional: a handler whose payload parameter is annotated
with a dataclass, a ``TypedDict`` or a pydantic model gets its payload
checked and converted before it is called, and an enqueue of its type
checks the same shape, so a bad payload is an ``InvalidField`` naming the
field (``payload.items[1].sku: required``) at enqueue, not a dead job later::

    @dataclass
    class Charge:
        order_id: int
        amount_cents: int
        note: str | None = None

    @handler("billing.charge")
    def charge(payload: Charge, ctx): ...

Inside a shape, fields may be ``str``, ``int``, ``float``, ``bool``,
``None``, ``datetime`` and ``date`` (ISO 8601 text in the payload), an
``Enum`` (its value), ``Literal``, unions and ``Optional``, ``list``,
``tuple``, ``set`` and ``dict`` of those, ``Any``, and other dataclasses,
``TypedDict``s and pydantic models; any other annotation is passed through
unchecked. A pydantic model is checked by pydantic itself. Jobdeck never
imports pydantic: a model is recognised when its program already has."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import sys
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict

from jobdeck.core.errors import InvalidField

Load = Callable[[Any, str], Any]
"""A converter: a JSON value and where it is (``payload.items[1]``) to the
typed value, or ``InvalidField`` naming that place."""

Schema = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PayloadShape:
    """The payload type of one handler, compiled once at registration."""

    cls: type
    kind: str
    """``dataclass``, ``TypedDict`` or ``pydantic``."""
    load: Load = dataclasses.field(repr=False)
    schema: Schema = dataclasses.field(repr=False)
    """Its JSON Schema, as the OpenAPI document shows it."""

    def check(self, payload: Any) -> None:
        """Raise ``InvalidField`` unless ``payload`` (JSON) has this shape."""
        self.load({} if payload is None else payload, "payload")

    def to_payload(self, value: Any) -> dict[str, Any]:
        """What an enqueue of ``value`` (an instance of the type, or a mapping
        in its JSON form) stores, checked: ``InvalidField`` if it does not fit."""
        try:
            payload = to_json(value)
        except RecursionError:
            raise InvalidField("payload", "holds itself or is nested too deep to be JSON") from None
        if not isinstance(payload, dict):
            raise InvalidField("payload", f"must be a {self.cls.__name__} or a mapping, not {type(value).__name__}")
        self.check(payload)
        return payload

    @property
    def converts_mappings(self) -> bool:
        """Whether a mapping is not already a value of the type (a TypedDict is one)."""
        return self.kind != "TypedDict"


def shape_of(fn: Callable[..., Any]) -> PayloadShape | None:
    """The shape of ``fn``'s first parameter, if it is annotated with a
    dataclass, a TypedDict or a pydantic model (None otherwise, and when its
    annotation does not resolve). Raises ``TypeError`` when a field inside
    the shape cannot be resolved: the handler would fail every job."""
    tp = _payload_annotation(fn)
    kind = _kind(tp)
    if tp is None or kind is None:
        return None
    load, schema = _compile(tp, {})
    return PayloadShape(tp, kind, load, schema)


def typed_call(fn: Callable[..., Any], shape: PayloadShape, is_async: bool) -> Callable[..., Any]:
    """``fn`` as the executors call it, ``(payload, ctx)``: its JSON payload
    converted to the shape first (``InvalidField`` is not retried)."""
    if is_async:

        @functools.wraps(fn)
        async def run_async(payload: Any, ctx: Any) -> Any:
            return await fn(shape.load(payload, "payload"), ctx)

        return run_async

    @functools.wraps(fn)
    def run(payload: Any, ctx: Any) -> Any:
        return fn(shape.load(payload, "payload"), ctx)

    return run


def to_json(value: Any) -> Any:
    """A typed value in its JSON form (the inverse of a shape's ``load``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and _is_pydantic(type(value)):
        return dump(mode="json", by_alias=True)  # as ``model_validate`` reads it back
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, date):  # a datetime too
        return value.isoformat()
    if isinstance(value, Mapping):
        return {_json_key(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(item) for item in value]
    return value


def _json_key(key: Any) -> Any:
    """A mapping's key as JSON holds it, text: an int as its digits, an Enum or a date as its JSON form."""
    text = to_json(key)
    if isinstance(text, int) and not isinstance(text, bool):
        return str(text)
    return text if isinstance(text, str) else key  # no text: left for the JSON check to refuse


def _payload_annotation(fn: Callable[..., Any]) -> Any:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if not params or params[0].annotation is inspect.Parameter.empty:
        return None
    annotation = params[0].annotation
    if isinstance(annotation, str):  # ``from __future__ import annotations``: read in the handler's module
        target = inspect.unwrap(fn)
        names = getattr(target, "__globals__", None) or getattr(type(target).__call__, "__globals__", {})
        try:
            annotation = eval(annotation, dict(names))
        except Exception:
            return None
    return annotation


def _is_pydantic(tp: Any) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _kind(tp: Any) -> str | None:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "dataclass"
    if is_typeddict(tp):
        return "TypedDict"
    return "pydantic" if _is_pydantic(tp) else None


def _shown(value: Any) -> str:
    """A JSON value's kind, as a refusal names it."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (Mapping, "an object")):  # fmt: skip
        if isinstance(value, kind):
            return name
    return f"a {type(value).__name__}"


def _keep(value: Any, path: str) -> Any:
    return value


def _scalar(kinds: tuple[type, ...], what: str, make: Callable[[Any], Any] = lambda v: v) -> Load:
    def load(value: Any, path: str) -> Any:
        if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
            try:
                return make(value)
            except OverflowError:  # an integer past a float's range
                raise InvalidField(path, f"must be {what} a float can hold (at most about 1.8e308)") from None
        raise InvalidField(path, f"must be {what}, not {_shown(value)}")

    return load


def _parsed(parse: Callable[[str], Any], what: str) -> Load:
    def load(value: Any, path: str) -> Any:
        if isinstance(value, str):
            try:
                return parse(value)
            except ValueError:
                pass
        raise InvalidField(path, f"must be {what}")

    return load


SCALARS: dict[Any, tuple[Load, Schema]] = {
    bool: (_scalar((bool,), "a boolean"), {"type": "boolean"}),
    int: (_scalar((int,), "an integer"), {"type": "integer"}),
    float: (_scalar((int, float), "a number", float), {"type": "number"}),
    str: (_scalar((str,), "a string"), {"type": "string"}),
    datetime: (_parsed(datetime.fromisoformat, "an ISO 8601 date and time"), {"type": "string", "format": "date-time"}),
    date: (_parsed(date.fromisoformat, "an ISO 8601 date (YYYY-MM-DD)"), {"type": "string", "format": "date"}),
}

_SEQUENCES = {list, set, frozenset, abc.Sequence, abc.MutableSequence, abc.Set, abc.MutableSet, abc.Collection,
              abc.Iterable}  # fmt: skip
_MAPPINGS = {dict, abc.Mapping, abc.MutableMapping}


def _compile(tp: Any, seen: dict[type, Any]) -> tuple[Load, Schema]:
    """The converter and the JSON Schema of the annotation ``tp``."""
    if tp is Any or tp is object:
        return _keep, {}
    if tp is None or tp is type(None):
        return _scalar((type(None),), "null"), {"type": "null"}
    if tp in SCALARS:
        return SCALARS[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin is typing.Annotated:
        return _compile(args[0], seen)
    if origin is Union or origin is types.UnionType:
        return _union([_compile(arm, seen) for arm in args])
    if origin is Literal:
        return _literal(args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _literal(tuple(member.value for member in tp), tp)
    if tp in _SEQUENCES or origin in _SEQUENCES or tp is tuple or origin is tuple:
        return _sequence(tp, origin, args, seen)
    if tp in _MAPPINGS or origin in _MAPPINGS:
        typed = len(args) == 2
        return _mapping(_key(args[0], seen) if typed else _keep, _compile(args[1], seen) if typed else (_keep, {}))
    kind = _kind(tp)
    if kind is None:
        return _keep, {}
    if tp in seen:  # a shape that holds itself: compiled once, read when used
        return (lambda value, path: seen[tp][0](value, path)), {"type": "object", "title": tp.__name__}
    seen[tp] = (_keep, {})
    seen[tp] = _pydantic(tp) if kind == "pydantic" else _object(tp, kind, seen)
    return seen[tp]  # type: ignore[no-any-return]


def _union(arms: list[tuple[Load, Schema]]) -> tuple[Load, Schema]:
    def load(value: Any, path: str) -> Any:
        first: InvalidField | None = None
        for arm, _ in arms:
            try:
                return arm(value, path)
            except InvalidField as exc:
                first = first or exc
        assert first is not None
        raise first

    return load, {"anyOf": [schema for _, schema in arms]}


def _literal(values: tuple[Any, ...], make: Callable[[Any], Any] = lambda v: v) -> tuple[Load, Schema]:
    def load(value: Any, path: str) -> Any:
        for allowed in values:
            if value == allowed and type(value) is type(allowed):
                return make(value)
        raise InvalidField(path, "must be one of " + ", ".join(repr(v) for v in values))

    return load, {"enum": list(values)}


def _sequence(tp: Any, origin: Any, args: tuple[Any, ...], seen: dict[type, Any]) -> tuple[Load, Schema]:
    kind = origin or tp
    fixed = kind is tuple and args and args[-1] is not Ellipsis
    items = [_compile(arg, seen) for arg in args] if fixed else [_compile(args[0], seen) if args else (_keep, {})]
    make: Callable[[list[Any]], Any] = {tuple: tuple, set: set, frozenset: frozenset, abc.Set: frozenset}.get(
        kind, set if kind is abc.MutableSet else list
    )

    def load(value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise InvalidField(path, f"must be an array, not {_shown(value)}")
        if fixed and len(value) != len(items):
            raise InvalidField(path, f"must hold {len(items)} items, not {len(value)}")
        return make([items[i if fixed else 0][0](v, f"{path}[{i}]") for i, v in enumerate(value)])

    if fixed:
        n = len(items)
        return load, {"type": "array", "prefixItems": [s for _, s in items], "minItems": n, "maxItems": n}
    return load, {"type": "array", "items": items[0][1]}


def _key(tp: Any, seen: dict[type, Any]) -> Load:
    """A JSON object key (text) as the key type: an int from its digits, others as that type's text (Enum, date)."""
    if tp is not int:
        return _compile(tp, seen)[0]

    def load(key: Any, path: str) -> Any:
        if isinstance(key, str) and key.isascii() and key.removeprefix("-").isdigit():
            return int(key)
        raise InvalidField(path, "must be an integer key (its digits)")

    return load


def _mapping(key: Load, values: tuple[Load, Schema]) -> tuple[Load, Schema]:
    item = values[0]

    def load(value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            raise InvalidField(path, f"must be an object, not {_shown(value)}")
        return {key(k, f"{path}.{k}"): item(v, f"{path}.{k}") for k, v in value.items()}

    return load, {"type": "object", "additionalProperties": values[1]}


def _object(cls: type, kind: str, seen: dict[type, Any]) -> tuple[Load, Schema]:
    """A dataclass or a TypedDict: its fields, the required ones, no others."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:
        raise TypeError(f"payload type {cls.__qualname__}: its annotations do not resolve ({exc})") from None
    for name, hint in hints.items():  # given to __init__, never kept: an enqueued instance would run with its default
        if isinstance(hint, dataclasses.InitVar):
            raise TypeError(
                f"payload type {cls.__qualname__}: its InitVar {name} is not kept, so no payload carries it"
            )
    if kind == "dataclass":
        fields = [f for f in dataclasses.fields(cls) if f.init]
        names = [f.name for f in fields]
        missing = dataclasses.MISSING
        required = {f.name for f in fields if f.default is missing and f.default_factory is missing}
    else:
        names, required = list(hints), _required_keys(cls)
    loads = {name: _compile(hints.get(name, Any), seen) for name in names}
    build: Callable[..., Any] = cls if kind == "dataclass" else dict

    def load(value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            raise InvalidField(path, f"must be an object, not {_shown(value)}")
        for key in value:
            if key not in loads:
                raise InvalidField(f"{path}.{key}", f"unknown field ({cls.__name__} has {', '.join(names)})")
        for name in names:
            if name in required and name not in value:
                raise InvalidField(f"{path}.{name}", "required")
        fields = {name: loads[name][0](value[name], f"{path}.{name}") for name in names if name in value}
        try:
            return build(**fields)
        except (TypeError, ValueError) as exc:  # a __post_init__ that refuses the values
            raise InvalidField(path, str(exc)) from None
        except Exception as exc:  # any other refusal too: the same payload fails the same way every time
            raise InvalidField(path, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None

    schema: Schema = {"type": "object", "title": cls.__name__, "additionalProperties": False,
                      "properties": {name: loads[name][1] for name in names}}  # fmt: skip
    if required:
        schema["required"] = [name for name in names if name in required]
    return load, schema


def _required_keys(cls: Any) -> set[str]:
    """A TypedDict's required keys, read from its annotations too: with
    ``from __future__ import annotations`` Python cannot see ``NotRequired``
    in the text when it builds ``__required_keys__``."""
    marked = typing.get_type_hints(cls, include_extras=True)
    required = set(cls.__required_keys__)
    for name, hint in marked.items():
        if get_origin(hint) is typing.NotRequired:
            required.discard(name)
        elif get_origin(hint) is typing.Required:
            required.add(name)
    return required


def _pydantic(cls: Any) -> tuple[Load, Schema]:
    errors = sys.modules["pydantic"].ValidationError

    def load(value: Any, path: str) -> Any:
        try:
            return cls.model_validate(value)
        except errors as exc:
            first = exc.errors()[0]
            where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
            raise InvalidField(path + where, first["msg"]) from None
        except Exception as exc:  # a validator's own exception, which pydantic lets through
            raise InvalidField(path, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None

    try:
        return load, cls.model_json_schema(ref_template="#/components/schemas/{model}")
    except Exception:  # a field of a type pydantic cannot describe (arbitrary_types_allowed): any object
        return load, {"type": "object", "title": cls.__name__}
