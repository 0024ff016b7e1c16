"""The bus's fast paths give what the general ones gave: DELIVER records that share a header
block decode to the same deliveries, handlers run without a task of their own settle every
message once, and ``send_many`` puts the same bytes on the wire as ``prepare`` and
``encode_record``."""

from __future__ import annotations

import asyncio
import contextvars
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import Broker, run

import ferrymq
from ferrymq import bus
from ferrymq import protocol as p
from ferrymq.bus import core
from ferrymq.bus.serializers import JsonSerializer
from ferrymq.errors import ProtocolError


@bus.message(key="customer", name="FastJob")
@dataclass
class FastJob:
    id: int
    customer: str
    pad: str


@bus.message(key="id", name="FastOther", topic="FastJob")
@dataclass
class FastOther:
    id: int
    ok: bool


# -- decoding ------------------------------------------------------------------------------------


def _record(key: bytes | None, headers: list[tuple[str, str]], body: bytes, priority: int = 0, delay: int | None = None) -> bytes:
    out = bytearray()
    p.encode_record(out, p.Message(body, key, headers, priority, delay))
    return bytes(out)


def _delivery(partition: int, offset: int, attempt: int, record: bytes) -> bytes:
    return struct.pack("<IQQH", partition, offset, 1_700_000_000_000 + offset, attempt) + record


def _reference(data: bytes, count: int) -> list[tuple]:
    """Every record through the full parser, one by one."""
    out = []
    pos = 0
    for _ in range(count):
        partition, offset, ts, attempt = struct.unpack_from("<IQQH", data, pos)
        pos, priority, key, headers, delay, body = p._parse_record(data, pos + p.DELIVERY_PREFIX_BYTES, len(data))
        out.append((partition, offset, ts, attempt, priority, key, tuple(headers), delay, body))
    assert pos == len(data)
    return out


BUS_HEADERS = [("x-bus-type", "FastJob"), ("x-bus-serializer", "json"), ("x-bus-sender", "s"), ("x-bus-shard", "3"),
               ("x-bus-prepared-ms", "1700000000000"), ("x-bus-sent-ms", "1700000000001")]  # fmt: skip


def test_records_sharing_header_blocks_decode_as_the_full_parser_does() -> None:
    other = BUS_HEADERS[:3] + [("x-bus-shard", "4")] + BUS_HEADERS[4:]
    records = []
    for i in range(40):
        headers = BUS_HEADERS if i % 3 else other
        if i % 7 == 0:
            headers = headers[:5]  # one header fewer: a block that is a prefix of another
        key = None if i % 11 == 5 else f"c{i % 5}".encode()
        records.append(_delivery(i % 2, i, 1 + i % 3, _record(key, headers, b'{"id":%d}' % i, priority=i % 10)))
    records.append(_delivery(0, 99, 1, _record(b"k", [("\u00e9t\u00e9", "\u2603")], b"x")))
    records.append(_delivery(0, 100, 1, _record(b"k", BUS_HEADERS, b"", delay=5)))
    records.append(_delivery(0, 101, 1, _record(None, [], b"plain")))
    data = b"".join(records)
    got = p.decode_deliveries(data, 0, len(data), len(records))
    want = _reference(data, len(records))
    assert [tuple(d) for d in got] == want
    assert all(type(d.headers) is tuple for d in got)
    # Records of one block share its decoded headers.
    assert got[1].headers is got[2].headers


def test_a_truncated_record_after_a_shared_block_is_refused() -> None:
    one = _delivery(0, 1, 1, _record(b"k", BUS_HEADERS, b"0123456789"))
    data = one + one[:-3]
    with pytest.raises(ProtocolError) as e:
        p.decode_deliveries(data, 0, len(data), 2)
    assert e.value.kind == "Truncated"


def test_a_bad_header_block_is_refused_even_after_a_good_one() -> None:
    good = _delivery(0, 1, 1, _record(b"k", [("a", "b")], b"x"))
    bad = bytearray(good)
    bad[22 + 10 + 1 + 2] = 0xFF  # the header name "a" is no longer UTF-8
    data = good + bytes(bad)
    with pytest.raises(ProtocolError) as e:
        p.decode_deliveries(data, 0, len(data), 2)
    assert e.value.kind == "InvalidUtf8"


# -- handling ------------------------------------------------------------------------------------


class Plain(bus.Handler[FastJob]):
    """A plain function: never a coroutine."""

    message_type = FastJob

    def __init__(self) -> None:
        self.seen: list[int] = []

    def handle(self, message: FastJob, context: bus.Context) -> None:
        self.seen.append(message.id)


class NoWait(Plain):
    """A coroutine that never suspends, and one message in ten that does."""

    var: contextvars.ContextVar[int] = contextvars.ContextVar("fast_paths_var", default=0)

    async def handle(self, message: FastJob, context: bus.Context) -> None:
        assert self.var.get() == 0, "a handler's context variables do not leak into the next one"
        self.var.set(message.id)
        if message.id % 10 == 0:
            await asyncio.sleep(0)
        if message.id == 13 and context.attempt == 1:
            raise RuntimeError("thirteen fails once")
        self.seen.append(message.id)


@pytest.mark.parametrize("handler_class", [Plain, NoWait])
def test_handlers_without_a_task_settle_every_message_once(broker: Broker, handler_class: type) -> None:
    async def main() -> None:
        n = 1500
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity=f"fast-{handler_class.__name__}", shard_count=2)
            await bus.Sender(client, settings).send_many([FastJob(i, f"c{i % 7}", "x") for i in range(n)])
            handler = handler_class()
            errors: list[BaseException] = []
            retry = bus.RetryPolicy(initial_delay_ms=1, jitter=0)
            receiver = bus.Receiver(client, settings, [handler], concurrency=8, prefetch=512, retry=retry, on_error=errors.append)
            async with receiver:
                loop = asyncio.get_running_loop()
                end = loop.time() + 30
                while len(handler.seen) < n:
                    assert loop.time() < end, f"{len(handler.seen)} of {n} handled"
                    await asyncio.sleep(0.01)
                stats = await client.stats("FastJob")
            assert sorted(handler.seen) == list(range(n)), "every message handled once"
            expected_failed = 1 if handler_class is NoWait else 0
            assert receiver.counts["handled"] == n and receiver.counts["failed"] == expected_failed
            assert len(errors) == expected_failed
            sub = next(s for t in stats for s in t.subscriptions if s.name == settings.identity)
            # Every message acked exactly once: nothing left, none redelivered but the failure.
            assert sub.acked == n and sub.backlog == 0 and sub.in_flight == 0
            assert sub.redelivered == expected_failed

    run(main())


def test_a_frame_of_plain_handlers_acks_in_ranges(broker: Broker) -> None:
    """The acks of messages handled in one run leave as few ACK frames with merged ranges."""

    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="ranges", shard_count=1, topic_template="FastRanges")
            await bus.Sender(client, settings).send_many([FastJob(i, "c", "x") for i in range(500)])
            written: list[bytes] = []
            real_write = client._write

            def spy(data: Any) -> None:
                written.append(bytes(data))
                real_write(data)

            client._write = spy  # type: ignore[method-assign]
            handler = Plain()
            async with bus.Receiver(client, settings, [handler], concurrency=4, prefetch=1000):
                while len(handler.seen) < 500:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
            acks = [w for w in written if struct.unpack_from("<H", w, 4)[0] == p.Opcode.ACK]
            acked = 0
            ranges = 0
            for frame in acks:
                count = struct.unpack_from("<I", frame, 16)[0]
                ranges += count
                acked += sum(struct.unpack_from("<IQI", frame, 20 + 16 * i)[2] for i in range(count))
            assert acked == 500
            assert len(acks) < 50 and ranges < 50, (len(acks), ranges)

    run(main())


# -- sending ---------------------------------------------------------------------------------------


class _Capture:
    """A client that keeps the frames a sender would publish."""

    def __init__(self) -> None:
        self.real = ferrymq.Client("127.0.0.1:1")
        self.frames: list[tuple[str, bytes, int]] = []
        self.message_bytes_max = self.real.message_bytes_max

    def _encode_publish_records(self, *args: Any) -> bytes:
        return self.real._encode_publish_records(*args)

    async def _start_publish_frame(self, topic: str, data: bytes, count: int, timeout: Any) -> Any:
        self.frames.append((topic, data, count))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def test_send_many_puts_the_bytes_prepare_and_encode_record_make(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "_now_ms", lambda: 1_700_000_000_123)
    objs: list[Any] = [FastJob(i, f"c{i % 5}", "p\u00e9\"\\\n" if i % 4 == 0 else "pad") for i in range(60)]
    objs[10:10] = [FastOther(7, True), FastOther(8, False)]
    objs.append(FastJob(1, "123", "numeric key"))

    async def main() -> None:
        capture = _Capture()
        settings = bus.Settings(identity="cap", shard_count=4)
        sender = bus.Sender(capture, settings, create_topics=False)  # type: ignore[arg-type]
        sender._topics_ready.add("FastJob")
        for options in ({}, {"priority": 3, "delay_ms": 250}, {"serializer": "deflate-json"}):
            capture.frames.clear()
            await sender.send_many(objs, **options)
            # The same messages the one-at-a-time path makes, grouped the same way.
            groups: dict[tuple[str, int], list[p.Message]] = {}
            for obj in objs:
                topic, shard, message = sender.prepare(obj, **options)
                message.headers.append((core.HEADER_SENT, str(core._now_ms())))
                groups.setdefault((topic, shard), []).append(message)
            want = [(topic, capture.real.encode_publish(topic, ms, shard), len(ms)) for (topic, shard), ms in groups.items()]
            assert capture.frames == want

    run(main())


def test_send_many_refuses_what_encode_record_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        capture = _Capture()
        sender = bus.Sender(capture, bus.Settings(identity="cap"), create_topics=False)  # type: ignore[arg-type]
        with pytest.raises(ProtocolError):
            await sender.send_many([FastJob(1, "c", "x")], priority=10)
        with pytest.raises(ProtocolError):
            await sender.send_many([FastJob(1, "k" * 1025, "x")])
        with pytest.raises(bus.SchemaError):
            await sender.send_many([FastJob("1", "c", "x")])  # type: ignore[arg-type]
        assert capture.frames == []

    run(main())


def test_json_dumps_matches_the_reference_form() -> None:
    ser = JsonSerializer()
    schema = bus.schema_of(FastJob)
    for s in ["", "plain", "quote\"", "back\\slash", "ctl\x01\x1f", "tab\t\n\r\b\f", "\u00e9\u2028\u2029\U0001f600", "\x7f\x80\xa0"]:
        values = {"id": -(2**63), "customer": s, "pad": s[::-1]}
        assert ser.dumps(schema, values) == ser._dumps_reference(schema, values), s
