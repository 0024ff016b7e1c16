"""The bus against protocol/bus-vectors.json: bodies under every serializer, headers, shards."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, run

import ferrymq
from ferrymq import bus
from ferrymq.bus.core import Sender, Settings

REPO = Path(__file__).resolve().parents[3]
VECTORS = json.loads((REPO / "protocol" / "bus-vectors.json").read_text(encoding="utf-8"))


def as_int(v: Any) -> int:
    return int(v) if isinstance(v, str) else v


class Registered:
    """A plain class per vector schema, registered with the schema's fields (not a dataclass:
    any class with a registered schema is a bus message)."""


SCHEMAS: dict[str, bus.Schema] = {}
for s in VECTORS["schemas"]:
    cls = type(s["name"], (Registered,), {"__init__": lambda self, **kw: self.__dict__.update(kw)})
    SCHEMAS[s["name"]] = bus.register(
        cls, key=s["key"], fields=[(f["name"], f["type"]) for f in s["fields"]],
        numbers={f["name"]: f["number"] for f in s["fields"]},
    )  # fmt: skip


def values_of(m: dict) -> dict[str, Any]:
    schema = SCHEMAS[m["type"]]
    out = {}
    for f in schema.fields:
        v = m["values"][f.name]
        out[f.name] = {"int": as_int, "float": float, "uuid": uuid.UUID}.get(f.type, lambda x: x)(v)
    return out


def test_generator_is_up_to_date() -> None:
    subprocess.run([sys.executable, str(REPO / "protocol" / "gen_bus_vectors.py"), "--check"], check=True)


@pytest.mark.parametrize("m", VECTORS["messages"], ids=lambda m: m["name"])
@pytest.mark.parametrize("serializer", VECTORS["serializers"])
def test_serializer_bytes(m: dict, serializer: str) -> None:
    schema = SCHEMAS[m["type"]]
    values = values_of(m)
    ser = bus.Serializers().get(serializer)
    expected = bytes.fromhex(m["serialized"][serializer]["hex"])
    produced = ser.dumps(schema, values)
    if serializer == "deflate-json":
        # Compressors may choose other bytes: what counts is the JSON they inflate to.
        assert zlib.decompress(produced, -15) == m["json_utf8"].encode()
        assert zlib.decompress(expected, -15) == m["json_utf8"].encode()
    else:
        assert produced == expected
    assert ser.loads(schema, expected) == values


@pytest.mark.parametrize("m", VECTORS["messages"], ids=lambda m: m["name"])
def test_sender_headers_key_and_shard(m: dict) -> None:
    obj = SCHEMAS[m["type"]].build(values_of(m))
    for serializer in VECTORS["serializers"]:
        settings = Settings(identity=m["sender"], shard_count=m["shard_count"], serializer=serializer)
        sender = Sender(None, settings)  # type: ignore[arg-type]
        topic, shard, message = sender.prepare(obj)
        assert topic == m["type"]
        assert shard == m["shard"]
        assert message.key == bytes.fromhex(m["key_hex"])
        fixed = [list(h) for h in message.headers if h[0] != bus.HEADER_PREPARED]
        assert fixed == m["serialized"][serializer]["headers"]
        assert any(h[0] == bus.HEADER_PREPARED and h[1].isdigit() for h in message.headers)


@pytest.mark.parametrize("entry", VECTORS["shards"], ids=lambda e: f"{e['kind']}:{e['key']}")
def test_shard_table(entry: dict) -> None:
    key: Any = {"int": as_int, "uuid": uuid.UUID}.get(entry["kind"], lambda x: x)(entry["key"])
    assert bus.key_bytes(key) == bytes.fromhex(entry["key_hex"])
    for n, expected in entry["shards"].items():
        assert bus.shard_for_key(key, int(n)) == expected


def test_shards_agree_with_the_broker_partition_rule(broker: Broker) -> None:
    """For int and string keys, the broker (choosing the partition itself) lands each key on
    the shard the bus computes."""
    entries = [e for e in VECTORS["shards"] if e["kind"] != "uuid"]

    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            for n in (2, 7, 10, 16):
                topic = f"rule{n}"
                await client.create_topic(topic, partitions=n)
                messages = [ferrymq.Message(b"", key=bytes.fromhex(e["key_hex"])) for e in entries]
                receipt = await client.publish_batch(topic, messages)
                partitions = [int(i.split("-")[0]) for i in receipt.ids]
                assert partitions == [e["shards"][str(n)] for e in entries]

    run(main())


def test_protobuf_matches_the_schemas_proto_and_rejects_garbage() -> None:
    ser = bus.ProtobufSerializer()
    schema = SCHEMAS["OrderPlaced"]
    with pytest.raises(bus.UnreadableBody):
        ser.loads(schema, b"\xff\xff\xff")
    with pytest.raises(bus.UnreadableBody):
        bus.JsonSerializer().loads(schema, b'{"order_id":"x"}')
    with pytest.raises(bus.UnreadableBody):
        bus.DeflateJsonSerializer().loads(schema, b"not deflate")
    with pytest.raises(bus.UnreadableBody):
        bus.MsgpackSerializer().loads(schema, b"\xc1")
    with pytest.raises(bus.UnknownSerializer):
        bus.Serializers().get("xml")
