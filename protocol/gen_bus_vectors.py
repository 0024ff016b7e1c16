#!/usr/bin/env python3
"""Generates protocol/bus-vectors.json, the shared test vectors of the FerryMQ message bus.

The bus (Python ``ferrymq.bus``, Rust ``ferrymq_client::bus``, TypeScript later) turns typed
messages into broker messages: a serialized body, a few headers, and a shard (the partition it
is published to). Every language must agree byte for byte, so this script is a second,
independent implementation of those rules using only the standard library (``struct``, ``json``,
``zlib``): MessagePack and Protobuf are written out by hand here, while the clients use their
ecosystem's libraries, and each client's tests compare its output with this file.

    python3 protocol/gen_bus_vectors.py           # rewrite the file
    python3 protocol/gen_bus_vectors.py --check   # fail if the committed file is out of date
"""

from __future__ import annotations

import json
import struct
import sys
import uuid
import zlib
from decimal import Decimal
from pathlib import Path

OUT = Path(__file__).resolve().parent / "bus-vectors.json"

HEADER_TYPE = "x-bus-type"
HEADER_SERIALIZER = "x-bus-serializer"
HEADER_SENDER = "x-bus-sender"
HEADER_SHARD = "x-bus-shard"
HEADER_PREPARED = "x-bus-prepared-ms"
HEADER_SENT = "x-bus-sent-ms"
SERIALIZERS = ["json", "deflate-json", "msgpack", "protobuf"]

NOTES = [
    "A bus message is a typed record with an ordered list of fields, one of them the key. Field "
    "types: int (a signed 64-bit integer), float (an IEEE 754 double), string (UTF-8), bool, uuid. "
    "In this file an int above 2^53-1 or below -(2^53-1) is a decimal string; readers accept a "
    "number or a string for every int, as in vectors.json.",
    "schemas gives each sample type: its name (also the default topic), its fields in declaration "
    "order with their Protobuf field numbers, and its key field.",
    "Headers the sender sets, in this order: x-bus-type (the type name), x-bus-serializer (json, "
    "deflate-json, msgpack or protobuf), x-bus-sender (the sending service's identity), x-bus-shard "
    "(the shard, decimal), x-bus-prepared-ms and x-bus-sent-ms (UTC milliseconds since the Unix "
    "epoch when the body was serialized and when it was handed to the broker client). The two times "
    "differ from run to run, so the vectors leave them out of headers; everything else is exact. "
    "The message's key is the key field's key bytes (see shards), and it is published to the "
    "partition equal to its shard.",
    "json: a UTF-8 JSON object, no whitespace, keys in declaration order, every field present. int "
    "is a JSON integer; string is escaped as ECMAScript JSON.stringify does (only \\\" \\\\ and control "
    "characters below U+0020 are escaped, as \\b \\f \\n \\r \\t or \\u00XX lowercase; everything else "
    "is literal UTF-8); bool is true/false; uuid is its lowercase hyphenated 36-character string; "
    "float is written as ECMAScript Number.prototype.toString writes it (the shortest decimal that "
    "round-trips, 5.0 as 5, exponents only below 1e-6 or from 1e21). NaN and infinities cannot be "
    "sent.",
    "deflate-json: the json bytes compressed as raw DEFLATE (RFC 1951, no zlib or gzip wrapper). "
    "Compressors differ in the bytes they choose, so a reader inflates deflate-json and compares "
    "with json; the bytes here come from zlib at level 9 and need not be reproduced by a writer.",
    "msgpack: a map with the fields in declaration order as string keys; int in its smallest "
    "MessagePack form (positive fixint, uint8..64 for non-negative values, negative fixint, "
    "int8..64 for negative ones), float always as float64 (0xcb), string as fixstr/str8/16/32, bool "
    "as 0xc2/0xc3, uuid as its 36-character string.",
    "protobuf: proto3 with implicit presence, fields in field-number order, default values (0, 0.0, "
    "false, empty string) omitted: int as int64 (varint, a negative value in ten bytes), float as "
    "double (fixed64), string and uuid as string (the 36-character form), bool as bool. The "
    "equivalent .proto of each schema is in its proto member.",
    "shards: the shard of a key for a shard count N. int: the key bytes are its decimal ASCII form "
    "(a minus sign for negatives); string: its UTF-8 bytes; then the broker's partition rule: key "
    "bytes of 1..=20 ASCII digits that parse as a u64 give that number mod N, any other key bytes "
    "give FNV-1a-64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) of the bytes mod N. uuid: "
    "the sum of its 16 bytes mod N (byte order does not change a sum), and its key bytes are the "
    "36-character string. key_hex is the key bytes the message carries.",
    "A custom resolver (key, shard_count) -> shard replaces the rule; the vectors do not cover it.",
    "Each entry of messages: name; type (a schema); sender (the sending service's identity); "
    "shard_count; values (field name -> value); json_utf8 (the json body as text); key_hex (the key "
    "bytes); shard; and serialized, which maps each serializer to hex (the body) and headers (the "
    "header pairs in order, without the two times). Each entry of shards: kind (int, string or "
    "uuid), key, key_hex, and shards (shard count -> shard).",
]

SCHEMAS = [
    {
        "name": "OrderPlaced",
        "key": "order_id",
        "fields": [
            {"name": "order_id", "type": "int", "number": 1},
            {"name": "customer", "type": "string", "number": 2},
            {"name": "total", "type": "float", "number": 3},
            {"name": "express", "type": "bool", "number": 4},
        ],
    },
    {
        "name": "UserRenamed",
        "key": "user_id",
        "fields": [
            {"name": "user_id", "type": "uuid", "number": 1},
            {"name": "name", "type": "string", "number": 2},
            {"name": "version", "type": "int", "number": 3},
        ],
    },
    {
        "name": "InvoiceIssued",
        "key": "invoice",
        "fields": [
            {"name": "invoice", "type": "string", "number": 1},
            {"name": "amount_cents", "type": "int", "number": 2},
            {"name": "paid", "type": "bool", "number": 3},
            {"name": "note", "type": "string", "number": 4},
            {"name": "rate", "type": "float", "number": 5},
        ],
    },
]

MESSAGES = [
    ("order_small", "OrderPlaced", "checkout", 8,
     {"order_id": 42, "customer": "customer-42", "total": 12.5, "express": True}),
    ("order_big_id_fractions", "OrderPlaced", "checkout", 10,
     {"order_id": 9007199254740993, "customer": "Zoë \"Z\" O'Brien\n", "total": 0.1, "express": False}),
    ("order_negative_id_tiny_total", "OrderPlaced", "checkout-2", 7,
     {"order_id": -5, "customer": "", "total": 1e-7, "express": True}),
    ("order_integral_float_huge_total", "OrderPlaced", "checkout", 16,
     {"order_id": 2**63 - 1, "customer": "tab\tand\u0001control", "total": 1e21, "express": False}),
    ("user_renamed", "UserRenamed", "accounts", 10,
     {"user_id": "6f1c2a3e-9b7d-4c1e-8f00-123456789abc", "name": "Jürgen Müller ✓", "version": 3}),
    ("user_renamed_nil_uuid", "UserRenamed", "accounts", 4,
     {"user_id": "00000000-0000-0000-0000-000000000000", "name": "x" * 40, "version": 0}),
    ("invoice_defaults", "InvoiceIssued", "billing", 3,
     {"invoice": "INV-2026-0042", "amount_cents": 0, "paid": False, "note": "", "rate": 0.0}),
    ("invoice_full", "InvoiceIssued", "billing", 5,
     {"invoice": "12345", "amount_cents": -123456789012, "paid": True, "note": "n" * 300, "rate": -3.25}),
]  # fmt: skip

SHARD_COUNTS = [1, 2, 7, 10, 16, 1024]
INT_KEYS = [0, 1, 7, 11, 12345, 9007199254740993, 2**63 - 1, -1, -5]
STRING_KEYS = ["customer-42", "12345", "00042", "", "ü", "18446744073709551615", "18446744073709551616",
               "123456789012345678901", "+5", " 5"]  # fmt: skip
UUID_KEYS = ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
             "6f1c2a3e-9b7d-4c1e-8f00-123456789abc", "01234567-89ab-cdef-0123-456789abcdef"]  # fmt: skip


# -- shard rules ---------------------------------------------------------------------------------


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def partition_for_key(key: bytes, n: int) -> int:
    if 1 <= len(key) <= 20 and all(0x30 <= b <= 0x39 for b in key):
        value = int(key)
        if value < 2**64:
            return value % n
    return fnv1a64(key) % n


def key_bytes(kind: str, value: object) -> bytes:
    if kind == "int":
        return str(value).encode("ascii")
    if kind == "string":
        return str(value).encode("utf-8")
    return str(uuid.UUID(str(value))).encode("ascii")


def shard(kind: str, value: object, n: int) -> int:
    if kind == "uuid":
        return sum(uuid.UUID(str(value)).bytes) % n
    return partition_for_key(key_bytes(kind, value), n)


# -- JSON ----------------------------------------------------------------------------------------


def js_number(x: float) -> str:
    """ECMAScript Number::toString of a finite double."""
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("NaN and infinities have no JSON form")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    d = Decimal(repr(abs(x)))
    digits_t, exp = d.as_tuple().digits, d.as_tuple().exponent
    digits = "".join(map(str, digits_t)).rstrip("0") or "0"
    assert isinstance(exp, int)
    # value = 0.digits × 10^n
    n = len(digits_t) + exp
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


def js_string(s: str) -> str:
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif c < 0x20:
            out.append({8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t"}.get(c, f"\\u{c:04x}"))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def to_json(schema: dict, values: dict) -> bytes:
    parts = []
    for f in schema["fields"]:
        v = values[f["name"]]
        t = f["type"]
        if t == "int":
            text = str(int(v))
        elif t == "float":
            text = js_number(float(v))
        elif t == "bool":
            text = "true" if v else "false"
        elif t == "uuid":
            text = js_string(str(uuid.UUID(v)))
        else:
            text = js_string(v)
        parts.append(js_string(f["name"]) + ":" + text)
    return ("{" + ",".join(parts) + "}").encode("utf-8")


def deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


# -- MessagePack ---------------------------------------------------------------------------------


def mp_str(s: str) -> bytes:
    b = s.encode("utf-8")
    n = len(b)
    if n < 32:
        return bytes([0xA0 | n]) + b
    if n < 256:
        return b"\xd9" + struct.pack(">B", n) + b
    if n < 65536:
        return b"\xda" + struct.pack(">H", n) + b
    return b"\xdb" + struct.pack(">I", n) + b


def mp_int(v: int) -> bytes:
    if 0 <= v < 128:
        return bytes([v])
    if v >= 0:
        for tag, fmt, limit in ((0xCC, ">B", 2**8), (0xCD, ">H", 2**16), (0xCE, ">I", 2**32), (0xCF, ">Q", 2**64)):
            if v < limit:
                return bytes([tag]) + struct.pack(fmt, v)
        raise ValueError("int above u64")
    if v >= -32:
        return struct.pack(">b", v)
    for tag, fmt, limit in ((0xD0, ">b", 2**7), (0xD1, ">h", 2**15), (0xD2, ">i", 2**31), (0xD3, ">q", 2**63)):
        if v >= -limit:
            return bytes([tag]) + struct.pack(fmt, v)
    raise ValueError("int below i64")


def to_msgpack(schema: dict, values: dict) -> bytes:
    fields = schema["fields"]
    assert len(fields) < 16
    out = bytearray([0x80 | len(fields)])
    for f in fields:
        out += mp_str(f["name"])
        v = values[f["name"]]
        t = f["type"]
        if t == "int":
            out += mp_int(int(v))
        elif t == "float":
            out += b"\xcb" + struct.pack(">d", float(v))
        elif t == "bool":
            out += b"\xc3" if v else b"\xc2"
        elif t == "uuid":
            out += mp_str(str(uuid.UUID(v)))
        else:
            out += mp_str(v)
    return bytes(out)


# -- Protobuf ------------------------------------------------------------------------------------


def varint(v: int) -> bytes:
    v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def to_protobuf(schema: dict, values: dict) -> bytes:
    out = bytearray()
    for f in sorted(schema["fields"], key=lambda f: f["number"]):
        v = values[f["name"]]
        t = f["type"]
        num = f["number"]
        if t == "int":
            if int(v) != 0:
                out += varint(num << 3 | 0) + varint(int(v))
        elif t == "float":
            if float(v) != 0.0 or str(float(v)).startswith("-"):
                out += varint(num << 3 | 1) + struct.pack("<d", float(v))
        elif t == "bool":
            if v:
                out += varint(num << 3 | 0) + b"\x01"
        else:
            s = str(uuid.UUID(v)) if t == "uuid" else v
            if s:
                b = s.encode("utf-8")
                out += varint(num << 3 | 2) + varint(len(b)) + b
    return bytes(out)


def proto_text(schema: dict) -> str:
    types = {"int": "int64", "float": "double", "string": "string", "bool": "bool", "uuid": "string"}
    lines = [f"  {types[f['type']]} {f['name']} = {f['number']};" for f in schema["fields"]]
    return 'syntax = "proto3";\nmessage ' + schema["name"] + " {\n" + "\n".join(lines) + "\n}\n"


# -- the file ------------------------------------------------------------------------------------


def json_int(v: int) -> object:
    return str(v) if abs(v) > 2**53 - 1 else v


def build() -> dict:
    schemas = {s["name"]: s for s in SCHEMAS}
    messages = []
    for name, type_name, sender, shard_count, values in MESSAGES:
        schema = schemas[type_name]
        key_field = next(f for f in schema["fields"] if f["name"] == schema["key"])
        kind = key_field["type"]
        key_value = values[schema["key"]]
        s = shard(kind, key_value, shard_count)
        body_json = to_json(schema, values)
        serialized = {}
        for ser, body in (
            ("json", body_json),
            ("deflate-json", deflate_raw(body_json)),
            ("msgpack", to_msgpack(schema, values)),
            ("protobuf", to_protobuf(schema, values)),
        ):
            serialized[ser] = {
                "hex": body.hex(),
                "headers": [
                    [HEADER_TYPE, type_name],
                    [HEADER_SERIALIZER, ser],
                    [HEADER_SENDER, sender],
                    [HEADER_SHARD, str(s)],
                ],
            }
        assert zlib.decompress(bytes.fromhex(serialized["deflate-json"]["hex"]), -15) == body_json
        messages.append({
            "name": name,
            "type": type_name,
            "sender": sender,
            "shard_count": shard_count,
            "values": {k: json_int(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in values.items()},
            "json_utf8": body_json.decode("utf-8"),
            "key_hex": key_bytes(kind, key_value).hex(),
            "shard": s,
            "serialized": serialized,
        })  # fmt: skip
    shards = []
    for kind, keys in (("int", INT_KEYS), ("string", STRING_KEYS), ("uuid", UUID_KEYS)):
        for key in keys:
            shards.append({
                "kind": kind,
                "key": json_int(key) if kind == "int" else key,
                "key_hex": key_bytes(kind, key).hex(),
                "shards": {str(n): shard(kind, key, n) for n in SHARD_COUNTS},
            })  # fmt: skip
    return {
        "version": 1,
        "generator": "protocol/gen_bus_vectors.py",
        "notes": NOTES,
        "headers": {
            "type": HEADER_TYPE,
            "serializer": HEADER_SERIALIZER,
            "sender": HEADER_SENDER,
            "shard": HEADER_SHARD,
            "prepared_ms": HEADER_PREPARED,
            "sent_ms": HEADER_SENT,
        },
        "serializers": SERIALIZERS,
        "schemas": [dict(s, proto=proto_text(s)) for s in SCHEMAS],
        "messages": messages,
        "shard_counts": SHARD_COUNTS,
        "shards": shards,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


# protocol/bus-vectors-v1.json is the bus's byte forms as first released, frozen: the bus only
# grows, so every message and shard entry in it must stay in the current file unchanged (new
# ones may be added). Never regenerated; its sha256 proves it unchanged.
RELEASED = OUT.with_name("bus-vectors-v1.json")
RELEASED_SHA256 = "b323955ea0034f17a169cbff362137df1339ab23623c0cc01824e20529047d7c"


def check_released(current: dict) -> list[str]:
    import hashlib

    data = RELEASED.read_bytes()
    if hashlib.sha256(data).hexdigest() != RELEASED_SHA256:
        return [f"{RELEASED} changed: the released byte forms are frozen"]
    released = json.loads(data)
    problems = []
    for group, key in (("messages", "name"), ("shards", None), ("schemas", "name")):
        ident = (lambda e: e[key]) if key else (lambda e: (e["kind"], json.dumps(e["key"])))
        now = {ident(e): e for e in current[group]}
        for entry in released[group]:
            if now.get(ident(entry)) != entry:
                problems.append(f"{group} entry {ident(entry)} of the released bus vectors changed or is gone")
    for name in ("serializers", "headers"):
        if released[name] != current[name] and not _extends(released[name], current[name]):
            problems.append(f"{name} of the released bus vectors changed")
    return problems


def _extends(old, new) -> bool:
    if isinstance(old, list) and isinstance(new, list):
        return new[: len(old)] == old
    if isinstance(old, dict) and isinstance(new, dict):
        return all(new.get(k) == v for k, v in old.items())
    return False


def main() -> int:
    text = render()
    problems = check_released(json.loads(text))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is out of date: run python3 protocol/gen_bus_vectors.py", file=sys.stderr)
            return 1
        print(f"{OUT} is up to date")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
