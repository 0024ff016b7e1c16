"""Message schemas of the bus: a type name, fields in declaration order, and the key field.

A schema comes from a dataclass (``@bus.message(key="order_id")``) or is registered for any
class (``bus.register(cls, fields=[...], key=...)``). Field types are the five the bus vectors
define: ``int`` (signed 64-bit), ``float`` (double), ``string``, ``bool`` and ``uuid``; every
serializer and every language maps exactly these, which keeps the bytes comparable.
"""

from __future__ import annotations

import dataclasses
import math
import typing
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar

from ..errors import FerryMQError

FIELD_TYPES = ("int", "float", "string", "bool", "uuid")
_PY_TYPES: dict[Any, str] = {int: "int", float: "float", str: "string", bool: "bool", uuid.UUID: "uuid"}
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

T = TypeVar("T")


class SchemaError(FerryMQError, TypeError):
    """A class that cannot be a bus message, or a value that does not fit its field."""


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    #: Protobuf field number: the 1-based declaration position unless given.
    number: int


@dataclass(frozen=True)
class Schema:
    name: str
    cls: type
    fields: tuple[Field, ...]
    key: str
    #: The topic; None = the bus's topic template (by default the type name).
    topic: Optional[str]
    build: Callable[[dict[str, Any]], Any]
    values: Callable[[Any], dict[str, Any]]

    @property
    def key_field(self) -> Field:
        return next(f for f in self.fields if f.name == self.key)

    def check(self, values: dict[str, Any]) -> dict[str, Any]:
        """Checks every field's value against its type; returns them in declaration order."""
        out = {}
        for f in self.fields:
            name = f.name
            v = values.get(name, values)
            t = type(v)
            # The common cases inline: a str for a string, an int within 64 bits for an int.
            if (t is str and f.type == "string") or (t is int and f.type == "int" and INT_MIN <= v <= INT_MAX):
                out[name] = v
                continue
            if name not in values:
                raise SchemaError(f"{self.name}.{name} is missing")
            out[name] = check_value(f"{self.name}.{name}", f.type, v)
        return out


def check_value(where: str, type_name: str, v: Any) -> Any:
    if type_name == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise SchemaError(f"{where} is an int, got {type(v).__name__}")
        if not INT_MIN <= v <= INT_MAX:
            raise SchemaError(f"{where} = {v} does not fit a signed 64-bit integer")
    elif type_name == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SchemaError(f"{where} is a float, got {type(v).__name__}")
        v = float(v)
        if not math.isfinite(v):
            raise SchemaError(f"{where} = {v}: NaN and infinities cannot be sent")
    elif type_name == "string":
        if not isinstance(v, str):
            raise SchemaError(f"{where} is a string, got {type(v).__name__}")
    elif type_name == "bool":
        if not isinstance(v, bool):
            raise SchemaError(f"{where} is a bool, got {type(v).__name__}")
    elif type_name == "uuid":
        if isinstance(v, str):
            try:
                v = uuid.UUID(v)
            except ValueError:
                raise SchemaError(f"{where} is a UUID, got {v!r}") from None
        if not isinstance(v, uuid.UUID):
            raise SchemaError(f"{where} is a UUID, got {type(v).__name__}")
    else:
        raise SchemaError(f"{where}: unknown field type {type_name!r}")
    return v


_REGISTRY: dict[type, Schema] = {}


def register(
    cls: type,
    *,
    key: str,
    fields: Optional[Sequence[tuple[str, str]]] = None,
    name: Optional[str] = None,
    topic: Optional[str] = None,
    numbers: Optional[dict[str, int]] = None,
    build: Optional[Callable[[dict[str, Any]], Any]] = None,
    values: Optional[Callable[[Any], dict[str, Any]]] = None,
) -> Schema:
    """Registers ``cls`` as a bus message. ``fields`` are ``(name, type)`` pairs in order; for a
    dataclass they default to its fields and type hints. ``build`` makes an instance from a dict
    of field values (default ``cls(**values)``), ``values`` reads them (default ``getattr``)."""
    if fields is None:
        if not dataclasses.is_dataclass(cls):
            raise SchemaError(f"{cls.__name__} is not a dataclass: give its fields as (name, type) pairs")
        hints = typing.get_type_hints(cls)
        pairs = []
        for f in dataclasses.fields(cls):
            t = _PY_TYPES.get(hints.get(f.name))
            if t is None:
                raise SchemaError(
                    f"{cls.__name__}.{f.name}: type {hints.get(f.name)!r} is not one of int, float, str, bool, uuid.UUID"
                )
            pairs.append((f.name, t))
        fields = pairs
    field_list = []
    seen_numbers = set()
    for i, (fname, ftype) in enumerate(fields):
        if ftype not in FIELD_TYPES:
            raise SchemaError(f"{cls.__name__}.{fname}: type {ftype!r} is not one of {', '.join(FIELD_TYPES)}")
        number = (numbers or {}).get(fname, i + 1)
        if number in seen_numbers or not 1 <= number < 2**29:
            raise SchemaError(f"{cls.__name__}.{fname}: Protobuf field number {number} is taken or out of range")
        seen_numbers.add(number)
        field_list.append(Field(fname, ftype, number))
    if key not in [f.name for f in field_list]:
        raise SchemaError(f"{cls.__name__} has no field {key!r} to be its key")
    key_type = next(f.type for f in field_list if f.name == key)
    if key_type not in ("int", "string", "uuid"):
        raise SchemaError(f"{cls.__name__}.{key}: a key is an int, a string or a UUID, not a {key_type}")
    names = [f.name for f in field_list]

    def read_values(obj: Any) -> dict[str, Any]:
        return {n: getattr(obj, n) for n in names}

    # Marks the default reader: a serializer may then read the attributes itself.
    read_values.attribute_fields = tuple(names)  # type: ignore[attr-defined]
    schema = Schema(
        name=name or cls.__name__,
        cls=cls,
        fields=tuple(field_list),
        key=key,
        topic=topic,
        build=build or (lambda v: cls(**v)),
        values=values or read_values,
    )
    _REGISTRY[cls] = schema
    return schema


def message(*, key: str, name: Optional[str] = None, topic: Optional[str] = None) -> Callable[[type[T]], type[T]]:
    """Class decorator for a dataclass bus message: ``@message(key="order_id")``."""

    def wrap(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            cls = dataclasses.dataclass(cls)  # type: ignore[assignment]
        register(cls, key=key, name=name, topic=topic)
        return cls

    return wrap


def schema_of(obj_or_cls: Any) -> Schema:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    try:
        return _REGISTRY[cls]
    except KeyError:
        raise SchemaError(
            f"{cls.__name__} is not a bus message: decorate it with @ferrymq.bus.message(key=...) or register it"
        ) from None
