"""The bus across languages: a Rust sender and a Python receiver, and the reverse, agreeing on
bodies, shards and serializers. The Rust side is the ignored test ``bus::tests::peer`` of
``ferrymq-client``, run with cargo (built on first use: the first run after a change to the Rust
code takes as long as that build)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest
from conftest import REPO, Broker, run

import ferrymq
from ferrymq import bus

SERIALIZERS = ["json", "deflate-json", "msgpack", "protobuf"]
COUNT = 12
SHARDS = 4

pytestmark = pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo builds the Rust side of the bus")


@bus.message(key="order_id")
@dataclass
class OrderPlaced:
    order_id: int
    customer: str
    total: float
    express: bool


def rust_peer(role: str, broker: Broker, identity: str) -> list[dict]:
    env = {
        **os.environ,
        "FERRYMQ_BUS_PEER": role,
        "FERRYMQ_BUS_PEER_COUNT": str(COUNT),
        "FERRYMQ_ADDR": broker.addr,
        "FERRYMQ_BUS_IDENTITY": identity,
        "FERRYMQ_BUS_SHARDS": str(SHARDS),
    }
    done = subprocess.run(
        # --workspace resolves features as `cargo test --workspace` does, so the test binary that
        # run built is reused rather than rebuilt for ferrymq-client alone.
        ["cargo", "test", "-q", "--workspace", "--lib", "bus::tests::peer", "--", "--ignored", "--exact", "--nocapture"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"the Rust peer failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("PEER ")]


class Collect(bus.Handler[OrderPlaced]):
    message_type = OrderPlaced

    def __init__(self) -> None:
        self.seen: list[tuple[OrderPlaced, bus.Context]] = []

    def handle(self, message: OrderPlaced, context: bus.Context) -> None:
        self.seen.append((message, context))


def test_rust_sender_python_receiver(broker: Broker) -> None:
    sent = rust_peer("send", broker, "rust-checkout")
    assert len(sent) == COUNT

    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            handler = Collect()
            settings = bus.Settings(identity="py-billing", shard_count=SHARDS)
            async with bus.Receiver(client, settings, [handler]) as receiver:
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while len(handler.seen) < COUNT and loop.time() < end:
                    await asyncio.sleep(0.02)
                assert receiver.counts["handled"] == COUNT, receiver.counts
        got = {m.order_id: (m, c) for m, c in handler.seen}
        for s in sent:
            m, c = got[s["order_id"]]
            assert (m.customer, m.total, m.express) == (s["customer"], s["total"], s["express"])
            assert c.shard == s["shard"] == bus.shard_for_key(s["order_id"], SHARDS) == c.delivery.partition
            assert c.serializer == s["serializer"] and c.sender == "rust-checkout"
            assert c.delivery.id == s["id"]
        assert {s["serializer"] for s in sent} == set(SERIALIZERS)

    run(main())


def test_python_sender_rust_receiver(broker: Broker) -> None:
    async def send() -> list[tuple[OrderPlaced, int, str]]:
        out = []
        async with ferrymq.Client(broker.addr) as client:
            for i in range(COUNT):
                ser = SERIALIZERS[i % 4]
                sender = bus.Sender(client, bus.Settings(identity="py-checkout", shard_count=SHARDS, serializer=ser))
                order = OrderPlaced(i * 104729 - 50, f"python ✓ \"{i}\"\n", i / 8, i % 3 == 0)
                await sender.send(order)
                out.append((order, bus.shard_for_key(order.order_id, SHARDS), ser))
        return out

    sent = run(send())
    received = {r["order_id"]: r for r in rust_peer("receive", broker, "rust-billing")}
    assert len(received) == COUNT
    for order, shard, ser in sent:
        r = received[order.order_id]
        assert (r["customer"], r["total"], r["express"]) == (order.customer, order.total, order.express)
        assert r["shard"] == shard == r["partition"]
        assert r["serializer"] == ser and r["sender"] == "py-checkout"
