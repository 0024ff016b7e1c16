"""The bus receiver's lifecycle against the real broker: drain without lost or doubled work,
retries with backoff and the handler's error in the dead letter, order per key across retries,
and a bus user holding only the rights its job needs."""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, run

import ferrymq
from ferrymq import bus
from ferrymq.bus import core


@bus.message(key="order_id", name="DrainOrder")
@dataclass
class DrainOrder:
    order_id: int
    seq: int


async def wait_for(cond: Any, timeout: float = 15.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, f"{what} not met in time"
        await asyncio.sleep(0.01)


class Recorder(bus.Handler[DrainOrder]):
    message_type = DrainOrder

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.seen: list[tuple[int, int]] = []  # (order_id, attempt)
        self.gate = gate
        self.started = asyncio.Event()
        self.active = 0

    async def handle(self, message: DrainOrder, context: bus.Context) -> None:
        self.started.set()
        self.active += 1
        if self.gate is not None:
            await self.gate.wait()
        self.seen.append((message.order_id, context.attempt))


def test_drain_finishes_in_flight_and_releases_the_unstarted(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="drainer", shard_count=1)
            sender = bus.Sender(client, settings)
            await sender.send_many([DrainOrder(i, 0) for i in range(300)])
            gate = asyncio.Event()
            first = Recorder(gate)
            receiver = bus.Receiver(client, settings, [first], concurrency=2, prefetch=256)
            await receiver.start()
            sub = receiver._subs[0]
            # Two handlers hold their messages; the broker fills the prefetch window behind them.
            await wait_for(lambda: first.active == 2 and len(sub._buffer) >= 200, what="two handlers and a full buffer")
            draining = asyncio.ensure_future(receiver.drain(timeout=10))
            await asyncio.sleep(0)
            gate.set()  # the handlers in flight finish during the drain
            released = await draining
            handled_first = {oid for oid, _ in first.seen}
            assert len(first.seen) == 2 and len(handled_first) == 2, first.seen
            assert released >= 200
            assert receiver.counts["handled"] == 2

            second = Recorder()
            again = bus.Receiver(client, settings, [second], concurrency=4, prefetch=64)
            async with again:
                await wait_for(lambda: len(second.seen) >= 298, what="the rest handled")
            seen = [oid for oid, _ in second.seen]
            assert len(seen) == len(set(seen)) == 298, "no message handled twice by the second receiver"
            assert not handled_first & set(seen), "no message handled by both receivers"
            assert handled_first | set(seen) == set(range(300))
            # Released messages come back without an attempt counted.
            assert {attempt for _, attempt in second.seen} == {1}, second.seen

    run(main())


def test_drain_cancels_a_handler_past_the_timeout(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="slow", shard_count=1)
            await bus.Sender(client, settings).send_many([DrainOrder(i, 0) for i in range(3)])
            stuck = Recorder(asyncio.Event())  # never opened
            receiver = bus.Receiver(client, settings, [stuck])
            await receiver.start()
            await wait_for(stuck.started.is_set, what="the handler started")
            released = await receiver.drain(timeout=0.05)
            assert released == 2 and stuck.seen == []
            second = Recorder()
            async with bus.Receiver(client, settings, [second]):
                await wait_for(lambda: len(second.seen) == 3, what="all three again")
            # The cancelled one had started: its attempt counted; the released two did not.
            assert sorted(a for _, a in second.seen) == [1, 1, 2]

    run(main())


class Failing(bus.Handler[DrainOrder]):
    message_type = DrainOrder
    retry = bus.RetryPolicy(max_attempts=3, initial_delay_ms=150, multiplier=2.0, jitter=0.0)

    def __init__(self) -> None:
        self.times: list[float] = []

    def handle(self, message: DrainOrder, context: bus.Context) -> None:
        self.times.append(asyncio.get_running_loop().time())
        raise ValueError(f"order {message.order_id} is malformed")


def test_retry_backoff_and_the_error_in_the_dead_letter(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="retrier", shard_count=1)
            handler = Failing()
            errors: list[BaseException] = []
            async with bus.Receiver(client, settings, [handler], on_error=errors.append) as receiver:
                await bus.Sender(client, settings).send(DrainOrder(7, 0))
                await wait_for(lambda: len(errors) == 3, what="three failures reported")
                assert receiver.counts["failed"] == 3
            t = handler.times
            assert t[1] - t[0] >= 0.14 and t[2] - t[1] >= 0.29, t
            assert [e.attempt for e in errors] == [1, 2, 3]  # type: ignore[attr-defined]
            assert [e.final for e in errors] == [False, False, True]  # type: ignore[attr-defined]
            assert [e.delay_ms for e in errors] == [150, 300, 0]  # type: ignore[attr-defined]
            assert isinstance(errors[0], bus.HandlerError) and isinstance(errors[0].__cause__, ValueError)
            dlq = await client.subscribe("DrainOrder.dlq", "check", start="earliest")
            dead = await dlq.next_batch(10, timeout=10)
            assert len(dead) == 1
            reason = dead[0].header("x-ferrymq-dead-reason") or ""
            assert reason == "Failing raised ValueError: order 7 is malformed", reason
            assert dead[0].header("x-ferrymq-dead-attempts") == "3"

    run(main())


def test_retry_policy_delays() -> None:
    p = bus.RetryPolicy(initial_delay_ms=100, multiplier=3, max_delay_ms=1000, jitter=0.0)
    assert [p.delay_ms(a) for a in (1, 2, 3, 4)] == [100, 300, 900, 1000]
    j = bus.RetryPolicy(initial_delay_ms=1000, jitter=0.5)
    assert j.delay_ms(1, lambda: 0.0) == 500 and j.delay_ms(1, lambda: 1.0) == 1500
    assert not bus.RetryPolicy().is_last(99) and bus.RetryPolicy(max_attempts=2).is_last(2)
    with pytest.raises(bus.BusError):
        bus.RetryPolicy(max_attempts=0)
    assert len(core.bounded("é" * 600).encode()) <= 1024


class Sequencer(bus.Handler[DrainOrder]):
    message_type = DrainOrder
    retry = bus.RetryPolicy(initial_delay_ms=50, jitter=0.0)

    def __init__(self) -> None:
        self.done: dict[int, list[int]] = {}

    async def handle(self, message: DrainOrder, context: bus.Context) -> None:
        if message.seq == 2 and context.attempt == 1:
            raise RuntimeError("fails once")
        await asyncio.sleep(0.001)
        self.done.setdefault(message.order_id, []).append(message.seq)


def test_ordered_receiver_keeps_order_per_key_across_retries(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="sequencer", shard_count=1)
            handler = Sequencer()
            sender = bus.Sender(client, settings)
            await sender.send_many([DrainOrder(k, s) for s in range(8) for k in range(4)])
            async with bus.Receiver(client, settings, [handler], ordered=True, concurrency=4) as receiver:
                await wait_for(lambda: sum(map(len, handler.done.values())) == 32, what="all handled")
                assert receiver.counts["failed"] == 4
            assert handler.done == {k: list(range(8)) for k in range(4)}

    run(main())


ADMIN = "admin-pass-0123"


@pytest.fixture
def secure_broker(binary: Path, make_broker: Any, tmp_path: Path) -> Any:
    helptext = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True).stdout
    if "--admin-password-file" not in helptext:
        pytest.skip(f"{binary} predates users and grants")
    secret = tmp_path / "admin.pass"
    secret.write_text(ADMIN + "\n")
    return make_broker("--admin-password-file", str(secret))


def test_the_bus_with_least_privilege(secure_broker: Any) -> None:
    addr = secure_broker.addr

    async def main() -> None:
        async with ferrymq.Client(addr, user="admin", password=ADMIN, reconnect=False) as admin:
            # Topics are an administrator's job (manage); the services get publish or consume.
            await bus.ensure_topic(admin, "DrainOrder", 2)
            await admin.add_user("checkout", "checkout-pass-1")
            await admin.add_user("billing", "billing-pass-1")
            await admin.grant("checkout", "DrainOrder", "publish")
            await admin.grant("billing", "DrainOrder", "consume")
        settings = bus.Settings(identity="billing", shard_count=2)
        async with ferrymq.Client(addr, user="checkout", password="checkout-pass-1") as c:
            sender = bus.Sender(c, bus.Settings(identity="checkout", shard_count=2))
            await sender.send_many([DrainOrder(i, 0) for i in range(6)])
        async with ferrymq.Client(addr, user="billing", password="billing-pass-1") as c:
            handler = Recorder()
            async with bus.Receiver(c, settings, [handler]):
                await wait_for(lambda: len(handler.seen) == 6, what="six handled")
            # Without create_topics, not even the forbidden attempt is made.
            handler2 = Recorder()
            async with bus.Receiver(c, settings, [handler2], create_topics=False):
                pass
        async with ferrymq.Client(addr, user="billing", password="billing-pass-1") as c:
            with pytest.raises(ferrymq.BrokerError) as caught:
                await bus.Sender(c, bus.Settings(identity="billing", shard_count=2)).send(DrainOrder(1, 0))
            assert caught.value.name == "forbidden"

    run(main())


class _NoMsgpack:
    name = "msgpack"

    def __init__(self) -> None:
        raise bus.SerializerUnavailable("the msgpack serializer needs: pip install 'ferrymq[msgpack]'")


def test_a_receiver_without_a_serializer_library_gives_its_messages_back(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="packer", shard_count=1)
            await bus.Sender(client, bus.Settings(identity="checkout", shard_count=1, serializer="msgpack")).send(DrainOrder(5, 0))
            crippled = bus.Serializers()
            crippled._lazy["msgpack"] = _NoMsgpack
            errors: list[BaseException] = []
            blind = Recorder()
            receiver = bus.Receiver(client, settings, [blind], serializers=crippled, on_error=errors.append,
                                    retry=bus.RetryPolicy(initial_delay_ms=10, jitter=0.0))  # fmt: skip
            async with receiver:
                await wait_for(lambda: receiver.counts["failed"] >= 1, what="the message given back")
            assert receiver.counts["dead_lettered"] == 0 and blind.seen == []
            assert isinstance(errors[0], bus.SerializerUnavailable)
            assert any("cannot read msgpack messages" in r.getMessage() for r in caplog.records)
            able = Recorder()
            async with bus.Receiver(client, settings, [able]):
                await wait_for(lambda: len(able.seen) == 1, what="read where it can be")
            assert able.seen[0][0] == 5

    run(main())
