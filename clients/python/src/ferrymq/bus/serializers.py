"""Serializers of the bus, each named in the ``x-bus-serializer`` header so that a receiver
reads any of them. The byte forms are defined in ``protocol/bus-vectors.json`` (its ``notes``)
and shared with the Rust and TypeScript clients.

- ``json``: canonical JSON (declaration order, no spaces, ECMAScript number and string forms);
  standard library only.
- ``deflate-json``: that JSON as raw DEFLATE (RFC 1951); standard library ``zlib``.
- ``msgpack``: a map in declaration order; needs ``ferrymq[msgpack]``.
- ``protobuf``: proto3 with field numbers from the schema; needs ``ferrymq[protobuf]``.
"""

from __future__ import annotations

import json
import keyword
import uuid
import zlib
from decimal import Decimal
from typing import Any, Protocol

from ..errors import FerryMQError
from .schema import Schema, SchemaError, check_value


class UnknownSerializer(FerryMQError, LookupError):
    """A serializer name no serializer of this bus has (or one whose library is missing)."""


class SerializerUnavailable(UnknownSerializer):
    """A serializer this bus knows whose optional library is not installed here. A message in
    it is valid: a receiver leaves it for an instance that can read it instead of
    dead-lettering it."""


class UnreadableBody(FerryMQError, ValueError):
    """A body its serializer cannot read as the message type its headers name."""


class Serializer(Protocol):
    name: str

    def dumps(self, schema: Schema, values: dict[str, Any]) -> bytes: ...

    def loads(self, schema: Schema, body: bytes) -> dict[str, Any]: ...


def js_number(x: float) -> str:
    """ECMAScript Number::toString of a finite double: what JSON.stringify writes."""
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    t = Decimal(repr(abs(x))).as_tuple()
    assert isinstance(t.exponent, int)
    digits = "".join(map(str, t.digits)).rstrip("0") or "0"
    n = len(t.digits) + t.exponent
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def js_string(s: str) -> str:
    if s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    out = []
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_JSON_PLANS: dict[int, tuple[Schema, tuple[tuple[str, str, str], ...]]] = {}


def _json_plan(schema: Schema) -> tuple[tuple[str, str, str], ...]:
    """(field name, what goes before its value: ``{"name":`` or ``,"name":``, field type)."""
    cached = _JSON_PLANS.get(id(schema))
    if cached is None or cached[0] is not schema:
        plan = tuple((f.name, ("{" if i == 0 else ",") + js_string(f.name) + ":", f.type) for i, f in enumerate(schema.fields))
        cached = _JSON_PLANS[id(schema)] = (schema, plan)
    return cached[1]


def _json_value(ftype: str, v: Any) -> str:
    if ftype == "float":
        return js_number(v)
    if ftype == "bool":
        return "true" if v else "false"
    if ftype == "uuid":
        return '"' + str(v) + '"'
    if ftype == "int":
        return str(v)
    return js_string(v)


_INT_BOUNDS = (-(2**63), 2**63 - 1)
_ENCODERS: dict[int, tuple[Schema, Any]] = {}


def json_encoder(schema: Schema) -> Any:
    """A function ``obj -> (key value, JSON body)`` for the common shape of a message: a schema
    read by attribute (the default ``values``) whose fields are ints, strings and bools, each
    holding exactly that type (an int within 64 bits). It returns None for any other object,
    which then takes ``values``, ``check`` and ``dumps`` (and their errors); the bytes are
    ``dumps``'s. None when the schema has another shape."""
    cached = _ENCODERS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    fn = _make_json_encoder(schema)
    _ENCODERS[id(schema)] = (schema, fn)
    return fn


def _make_json_encoder(schema: Schema) -> Any:
    names = getattr(schema.values, "attribute_fields", None)
    if names is None or tuple(names) != tuple(f.name for f in schema.fields):
        return None
    lines = ["def encode(obj):"]
    parts = []
    for i, f in enumerate(schema.fields):
        if not f.name.isidentifier() or keyword.iskeyword(f.name) or f.name.startswith("__"):
            return None
        v = f"v{i}"
        lines.append(f"    {v} = obj.{f.name}")
        prefix = repr(("{" if i == 0 else ",") + js_string(f.name) + ":")
        if f.type == "int":
            lines.append(f"    if type({v}) is not int or not INT_MIN <= {v} <= INT_MAX: return None")
            parts.append(f"{prefix} + str({v})")
        elif f.type == "string":
            lines.append(f"    if type({v}) is not str: return None")
            lines.append(f"    s{i} = '\"' + {v} + '\"' if {v}.isprintable() and '\"' not in {v} and '\\\\' not in {v} else js_string({v})")
            parts.append(f"{prefix} + s{i}")
        elif f.type == "bool":
            lines.append(f"    if type({v}) is not bool: return None")
            parts.append(f"{prefix} + ('true' if {v} else 'false')")
        else:
            return None
    key = next(i for i, f in enumerate(schema.fields) if f.name == schema.key)
    body = " + ".join(parts) if parts else "'{'"
    lines.append(f"    return v{key}, ({body} + '}}').encode('utf-8')")
    namespace: dict[str, Any] = {"INT_MIN": _INT_BOUNDS[0], "INT_MAX": _INT_BOUNDS[1], "js_string": js_string}
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from field names checked above
    return namespace["encode"]


class JsonSerializer:
    name = "json"

    def dumps(self, schema: Schema, values: dict[str, Any]) -> bytes:
        text = ""
        for name, prefix, ftype in _json_plan(schema):
            v = values[name]
            if ftype == "string":
                if v.isprintable() and '"' not in v and "\\" not in v:
                    text += prefix + '"' + v + '"'
                else:
                    text += prefix + js_string(v)
            elif ftype == "int":
                text += prefix + str(v)
            else:
                text += prefix + _json_value(ftype, v)
        return (text + "}").encode("utf-8") if text else b"{}"

    def _dumps_reference(self, schema: Schema, values: dict[str, Any]) -> bytes:
        """The canonical form field by field, as the bus vectors define it (``dumps`` is the
        same, faster)."""
        parts = []
        for f in schema.fields:
            v = values[f.name]
            if f.type == "int":
                text = str(v)
            elif f.type == "float":
                text = js_number(v)
            elif f.type == "bool":
                text = "true" if v else "false"
            elif f.type == "uuid":
                text = '"' + str(v) + '"'
            else:
                text = js_string(v)
            parts.append(js_string(f.name) + ":" + text)
        return ("{" + ",".join(parts) + "}").encode("utf-8")

    def loads(self, schema: Schema, body: bytes) -> dict[str, Any]:
        try:
            obj = _json_loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise UnreadableBody(f"not JSON: {e}") from None
        return _from_mapping(schema, obj)


_scan_once = json.decoder.JSONDecoder().scan_once


def _json_loads(body: bytes) -> Any:
    """``json.loads(body)``, without its encoding detection and whitespace checks for the usual
    body: UTF-8 holding one JSON value from its first byte to its last. Anything else (and
    every error) goes through ``json.loads`` itself."""
    try:
        text = body.decode("utf-8")
        obj, end = _scan_once(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(body)
    if end != len(text):
        return json.loads(body)
    return obj


class DeflateJsonSerializer:
    name = "deflate-json"
    #: Bodies above this many bytes once inflated are refused: a small compressed body must not
    #: make a receiver allocate without bound.
    inflated_bytes_max = 64 * 1024 * 1024

    def __init__(self) -> None:
        self._json = JsonSerializer()

    def dumps(self, schema: Schema, values: dict[str, Any]) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(self._json.dumps(schema, values)) + c.flush()

    def loads(self, schema: Schema, body: bytes) -> dict[str, Any]:
        d = zlib.decompressobj(-15)
        try:
            data = d.decompress(body, self.inflated_bytes_max)
            if d.unconsumed_tail:
                raise UnreadableBody(f"inflates to more than {self.inflated_bytes_max} bytes")
            data += d.flush()
        except zlib.error as e:
            raise UnreadableBody(f"not raw DEFLATE: {e}") from None
        if not d.eof:
            raise UnreadableBody("the DEFLATE stream is truncated")
        return self._json.loads(schema, data)


class MsgpackSerializer:
    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError:
            raise SerializerUnavailable("the msgpack serializer needs: pip install 'ferrymq[msgpack]'") from None
        self._msgpack = msgpack

    def dumps(self, schema: Schema, values: dict[str, Any]) -> bytes:
        out = {}
        for f in schema.fields:
            v = values[f.name]
            out[f.name] = str(v) if f.type == "uuid" else v
        return self._msgpack.packb(out, use_bin_type=True)

    def loads(self, schema: Schema, body: bytes) -> dict[str, Any]:
        try:
            obj = self._msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as e:  # msgpack raises several unrelated types for bad input
            raise UnreadableBody(f"not MessagePack: {e}") from None
        return _from_mapping(schema, obj)


class ProtobufSerializer:
    name = "protobuf"

    def __init__(self) -> None:
        try:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        except ImportError:
            raise SerializerUnavailable("the protobuf serializer needs: pip install 'ferrymq[protobuf]'") from None
        self._descriptor_pb2 = descriptor_pb2
        self._pool = descriptor_pool.DescriptorPool()
        self._factory = message_factory
        self._classes: dict[str, Any] = {}

    def message_class(self, schema: Schema) -> Any:
        """The protobuf message class of ``schema`` (built once from its fields)."""
        cls = self._classes.get(schema.name)
        if cls is not None:
            return cls
        pb2 = self._descriptor_pb2
        fdp = pb2.FileDescriptorProto(name=f"ferrymq_bus_{schema.name}.proto", package="ferrymq.bus", syntax="proto3")
        mdp = fdp.message_type.add(name=schema.name)
        types = {
            "int": pb2.FieldDescriptorProto.TYPE_INT64,
            "float": pb2.FieldDescriptorProto.TYPE_DOUBLE,
            "string": pb2.FieldDescriptorProto.TYPE_STRING,
            "bool": pb2.FieldDescriptorProto.TYPE_BOOL,
            "uuid": pb2.FieldDescriptorProto.TYPE_STRING,
        }
        for f in schema.fields:
            mdp.field.add(name=f.name, number=f.number, type=types[f.type], label=pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        self._pool.Add(fdp)
        cls = self._factory.GetMessageClass(self._pool.FindMessageTypeByName(f"ferrymq.bus.{schema.name}"))
        self._classes[schema.name] = cls
        return cls

    def dumps(self, schema: Schema, values: dict[str, Any]) -> bytes:
        m = self.message_class(schema)()
        for f in schema.fields:
            v = values[f.name]
            setattr(m, f.name, str(v) if f.type == "uuid" else v)
        return m.SerializeToString(deterministic=True)

    def loads(self, schema: Schema, body: bytes) -> dict[str, Any]:
        m = self.message_class(schema)()
        try:
            m.ParseFromString(body)
        except Exception as e:  # DecodeError, or a RuntimeError from some backends
            raise UnreadableBody(f"not a {schema.name} in Protobuf: {e}") from None
        values = {}
        for f in schema.fields:
            v = getattr(m, f.name)
            if f.type == "uuid":
                try:
                    v = uuid.UUID(v)
                except ValueError:
                    raise UnreadableBody(f"{schema.name}.{f.name} is not a UUID: {v!r}") from None
            values[f.name] = v
        return values


#: The Python type a field's value already has when it needs no conversion and no check
#: beyond its range (ints).
_PLAIN = {"int": int, "string": str, "bool": bool}
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_PLAIN_FIELDS: dict[int, tuple[Schema, tuple[tuple[str, Any], ...]]] = {}


def _plain_fields(schema: Schema) -> tuple[tuple[str, Any], ...]:
    cached = _PLAIN_FIELDS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = (schema, tuple((f.name, _PLAIN.get(f.type)) for f in schema.fields))
        _PLAIN_FIELDS[id(schema)] = cached
    return cached[1]


def _from_mapping(schema: Schema, obj: Any) -> dict[str, Any]:
    if type(obj) is dict:
        # The common case, without a call per field: every field there with the Python type it
        # maps to (an int within 64 bits). Anything else takes the checks below.
        values = {}
        for name, plain in _plain_fields(schema):
            v = obj.get(name, obj)
            if type(v) is not plain or (plain is int and not _INT_MIN <= v <= _INT_MAX):
                break
            values[name] = v
        else:
            return values
    if not isinstance(obj, dict):
        raise UnreadableBody(f"a {schema.name} is an object/map, got {type(obj).__name__}")
    values = {}
    for f in schema.fields:
        if f.name not in obj:
            raise UnreadableBody(f"{schema.name}.{f.name} is missing")
        v = obj[f.name]
        if f.type == "float" and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)  # JSON writes 5.0 as 5
        try:
            values[f.name] = check_value(f"{schema.name}.{f.name}", f.type, v)
        except SchemaError as e:
            raise UnreadableBody(str(e)) from None
    return values


class Serializers:
    """The serializers a bus knows, by name. MessagePack and Protobuf are loaded on first use,
    so a bus without those extras still reads and writes JSON."""

    def __init__(self) -> None:
        self._made: dict[str, Serializer] = {"json": JsonSerializer(), "deflate-json": DeflateJsonSerializer()}
        self._lazy: dict[str, type] = {"msgpack": MsgpackSerializer, "protobuf": ProtobufSerializer}

    def add(self, serializer: Serializer) -> None:
        self._made[serializer.name] = serializer

    def unavailable(self) -> dict[str, str]:
        """The known serializers whose library is missing, with what to install."""
        out: dict[str, str] = {}
        for name in self._lazy:
            try:
                self.get(name)
            except SerializerUnavailable as e:
                out[name] = str(e)
        return out

    def names(self) -> list[str]:
        return sorted(set(self._made) | set(self._lazy))

    def get(self, name: str) -> Serializer:
        made = self._made.get(name)
        if made is not None:
            return made
        make = self._lazy.get(name)
        if make is None:
            raise UnknownSerializer(f"unknown serializer {name!r}; known: {', '.join(self.names())}")
        serializer: Serializer = make()
        self._made[name] = serializer
        return serializer
