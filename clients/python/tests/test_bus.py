"""The bus end to end against the real broker: senders, receivers, handlers, bad input."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import pytest
from conftest import Broker, run

import ferrymq
from ferrymq import bus


@bus.message(key="order_id")
@dataclass
class OrderPlaced:
    order_id: int
    customer: str
    total: float


@bus.message(key="user_id", name="UserRenamed")
@dataclass
class Renamed:
    user_id: uuid.UUID
    name: str


class Orders(bus.Handler[OrderPlaced]):
    message_type = OrderPlaced

    def __init__(self) -> None:
        self.handled: list[tuple[OrderPlaced, bus.Context]] = []
        self.after: list[int] = []
        self.fail_first: set[int] = set()
        self.refuse: set[int] = set()

    async def before_handle(self, message: OrderPlaced, context: bus.Context) -> bool:
        return message.order_id not in self.refuse

    async def handle(self, message: OrderPlaced, context: bus.Context) -> None:
        if message.order_id in self.fail_first and context.attempt == 1:
            raise RuntimeError(f"order {message.order_id} failed once")
        if message.order_id < 0:
            raise ValueError("negative orders always fail")
        self.handled.append((message, context))

    def after_handle(self, message: OrderPlaced, context: bus.Context) -> None:
        self.after.append(message.order_id)


class Users(bus.Handler[Renamed]):
    message_type = Renamed

    def __init__(self) -> None:
        self.names: list[str] = []

    def handle(self, message: Renamed, context: bus.Context) -> None:
        self.names.append(message.name)


async def wait_for(cond, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("serializer", ["json", "deflate-json", "msgpack", "protobuf"])
def test_send_and_receive_every_serializer(broker: Broker, serializer: str) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            sender = bus.Sender(client, bus.Settings(identity="checkout", shard_count=4, serializer=serializer))
            orders, users = Orders(), Users()
            stats: list[bus.MessageStats] = []
            receiver = bus.Receiver(client, bus.Settings(identity="billing", shard_count=4), [orders, users], on_stats=stats.append)
            async with receiver:
                sent = [OrderPlaced(i, f"c{i}", i + 0.5) for i in range(20)]
                receipts = await sender.send_many(sent)
                assert sum(r.count for r in receipts) == 20
                uid = uuid.UUID("6f1c2a3e-9b7d-4c1e-8f00-123456789abc")
                r = await sender.send(Renamed(uid, "Jürgen ✓"))
                assert r.id.startswith(f"{sum(uid.bytes) % 4}-")
                await wait_for(lambda: len(orders.handled) == 20 and users.names)
            assert sorted(m.order_id for m, _ in orders.handled) == list(range(20))
            assert {m.order_id: m for m, _ in orders.handled}[7] == OrderPlaced(7, "c7", 7.5)
            for m, ctx in orders.handled:
                assert ctx.shard == m.order_id % 4 == ctx.delivery.partition
                assert ctx.sender == "checkout" and ctx.serializer == serializer
            assert users.names == ["Jürgen ✓"]
            assert sorted(orders.after) == list(range(20))
            assert receiver.counts["handled"] == 21
            s = stats[0]
            assert s.outcome == "handled" and s.size > 0 and s.sender == "checkout"
            assert s.prepared_at is not None and s.sent_at is not None
            assert s.prepared_at <= s.sent_at <= s.received_at <= s.handled_at

    run(main())


def test_listened_shards_refusal_failures_and_bad_input(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            settings = bus.Settings(identity="checkout", shard_count=8)
            sender = bus.Sender(client, settings)
            orders = Orders()
            orders.fail_first = {3}
            orders.refuse = {5}
            stats: list[bus.MessageStats] = []
            receiver = bus.Receiver(
                client, bus.Settings(identity="billing", shard_count=8, listen_shards="1,3,5-6,7"),
                [orders], on_stats=stats.append, max_attempts=2,
            )  # fmt: skip
            async with receiver:
                for i in range(8):
                    await sender.send(OrderPlaced(i, "c", 1.0))
                await sender.send(OrderPlaced(-9, "never", 1.0))  # shard of "-9" by FNV
                # Bytes no serializer can read, and a serializer nobody knows.
                bad = ferrymq.Message(b"{not json", key=b"1", headers=[
                    (bus.HEADER_TYPE, "OrderPlaced"), (bus.HEADER_SERIALIZER, "json"), (bus.HEADER_SENDER, "x")])
                odd = ferrymq.Message(b"{}", key=b"1", headers=[
                    (bus.HEADER_TYPE, "OrderPlaced"), (bus.HEADER_SERIALIZER, "xml"), (bus.HEADER_SENDER, "x")])
                await client.publish_batch("OrderPlaced", [bad, odd], partition=1)
                neg_listened = bus.shard_for_key(-9, 8) in {1, 3, 5, 6, 7}
                # Handled: 1, 3 (on its second attempt), 6, 7. Refused: 5. Failed: 3 once, and
                # -9 on each of its two attempts if its shard is listened to.
                want = {"handled": 4, "refused": 1, "failed": 1 + (2 if neg_listened else 0), "dead_lettered": 2, "skipped": 0}
                await wait_for(lambda: receiver.counts == want)
            assert sorted(m.order_id for m, _ in orders.handled) == [1, 3, 6, 7]
            assert all(ctx.shard in {1, 3, 5, 6, 7} for _, ctx in orders.handled)
            reasons = [s.error or "" for s in stats if s.outcome == "dead_lettered"]
            assert any("UnreadableBody" in r for r in reasons)
            assert any("UnknownSerializer" in r and "xml" in r for r in reasons)
            assert [s.error for s in stats if s.outcome == "failed"][0].startswith("Orders raised RuntimeError")
            # What was dead-lettered carries its reason in the dead-letter topic.
            dlq = await client.subscribe("OrderPlaced.dlq", "check", start="earliest")
            dead = []
            while len(dead) < 2 + (1 if neg_listened else 0):
                got = await dlq.next_batch(10, timeout=5)
                assert got
                dead += got
            assert {d.body for d in dead} >= {b"{not json", b"{}"}
            assert all(d.header("x-ferrymq-dead-reason") for d in dead)

    run(main())


def test_settings_from_arguments_and_environment() -> None:
    env = {
        "FERRYMQ_ADDR": "10.0.0.1:7070",
        "FERRYMQ_BUS_IDENTITY": "env-service",
        "FERRYMQ_BUS_SHARDS": "16",
        "FERRYMQ_BUS_LISTEN_SERVICES": "a, b",
        "FERRYMQ_BUS_LISTEN_SHARDS": "1,2,4-7",
        "FERRYMQ_BUS_SERIALIZER": "msgpack",
    }
    s = bus.Settings.load([], env)
    assert (s.addr, s.identity, s.shard_count, s.listen_services, s.listen_shards, s.serializer) == (
        "10.0.0.1:7070", "env-service", 16, ["a", "b"], "1,2,4-7", "msgpack")  # fmt: skip
    s = bus.Settings.load(["--identity", "cli", "--shards", "8", "--other-flag"], env)
    assert (s.identity, s.shard_count) == ("cli", 8)
    assert bus.Settings.load([], {}).identity == "NoIdentification"
    with pytest.raises(bus.BusError):
        bus.Settings.load([], {"FERRYMQ_BUS_SHARDS": "ten"})
    with pytest.raises(bus.BusError):
        bus.Settings(shard_count=4, listen_shards="1-4")
    with pytest.raises(ValueError):
        bus.Settings(listen_shards="4-1")


def test_custom_resolver_topic_override_and_schema_errors(broker: Broker) -> None:
    @bus.message(key="sku", topic="inventory")
    @dataclass
    class StockChanged:
        sku: str
        delta: int

    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            sender = bus.Sender(client, bus.Settings(identity="shop", shard_count=3))
            r = await sender.send(StockChanged("A-1", 5), shard_resolver=lambda key, n: 2)
            assert r.id == "2-0"
            assert (await client.describe_topic("inventory")).config.partitions == 3
            with pytest.raises(bus.BusError, match="resolver"):
                await sender.send(StockChanged("A-1", 5), shard_resolver=lambda key, n: 3)
            with pytest.raises(bus.SchemaError, match="delta"):
                await sender.send(StockChanged("A-1", "five"))  # type: ignore[arg-type]
            with pytest.raises(bus.SchemaError, match="not a bus message"):
                await sender.send(object())
            other = bus.Sender(client, bus.Settings(identity="shop", shard_count=5))
            with pytest.raises(bus.BusError, match="same shard count"):
                await other.send(StockChanged("A-1", 1))
            with pytest.raises(bus.SchemaError):
                bus.register(dict, key="x")

    run(main())


def test_listened_services(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            checkout = bus.Sender(client, bus.Settings(identity="checkout", shard_count=2))
            other = bus.Sender(client, bus.Settings(identity="other", shard_count=2))
            orders = Orders()
            receiver = bus.Receiver(client, bus.Settings(identity="billing", shard_count=2, listen_services=["checkout"]), [orders])
            async with receiver:
                await other.send(OrderPlaced(1, "from other", 1.0))
                await checkout.send(OrderPlaced(2, "from checkout", 1.0))
                await wait_for(lambda: receiver.counts["handled"] == 1 and receiver.counts["skipped"] == 1)
            assert [m.customer for m, _ in orders.handled] == ["from checkout"]

            # With per-sender topics, a receiver subscribes to each listened service's topic.
            per = bus.Settings(identity="shop", shard_count=2, topic_template="{sender}.{type}")
            r = await bus.Sender(client, per).send(OrderPlaced(3, "per sender", 1.0))
            assert r.id == "1-0"
            orders2 = Orders()
            recv2 = bus.Receiver(client, bus.Settings(identity="audit", shard_count=2, topic_template="{sender}.{type}",
                                                       listen_services=["shop"]), [orders2])  # fmt: skip
            async with recv2:
                await wait_for(lambda: recv2.counts["handled"] == 1)
            assert "shop.OrderPlaced" in [t.name for t in await client.list_topics()]

    run(main())
