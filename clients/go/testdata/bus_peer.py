"""The Python side of the Go client's cross-language bus test: sends or receives OrderPlaced
messages with the Python bus and prints each as a `PEER {json}` line.

    python bus_peer.py probe|send|receive ADDR COUNT SHARDS
"""

import asyncio
import json
import sys
from dataclasses import dataclass

import ferrymq
from ferrymq import bus


@bus.message(key="order_id")
@dataclass
class OrderPlaced:
    order_id: int
    customer: str
    total: float
    express: bool


def available() -> list:
    out = ["json", "deflate-json"]
    for name, module in (("msgpack", "msgpack"), ("protobuf", "google.protobuf")):
        try:
            __import__(module)
            out.append(name)
        except ImportError:
            pass
    return out


async def main() -> None:
    role, addr, count, shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    serializers = available()
    print("SERIALIZERS " + ",".join(serializers), flush=True)
    if role == "probe":
        return
    async with ferrymq.Client(addr) as client:
        if role == "send":
            for i in range(count):
                ser = serializers[i % len(serializers)]
                sender = bus.Sender(client, bus.Settings(identity="py-checkout", shard_count=shards, serializer=ser))
                o = OrderPlaced(i * 104729 - 50, f'python \u2713 "{i}"\n', i / 8, i % 3 == 0)
                await sender.send(o)
                print("PEER " + json.dumps({"order_id": o.order_id, "customer": o.customer, "total": o.total, "express": o.express, "serializer": ser}), flush=True)
            return
        seen = []

        class Collect(bus.Handler[OrderPlaced]):
            message_type = OrderPlaced

            def handle(self, m, c):
                seen.append((m, c))

        settings = bus.Settings(identity="py-billing", shard_count=shards)
        async with bus.Receiver(client, settings, [Collect()]):
            loop = asyncio.get_running_loop()
            end = loop.time() + 30
            while len(seen) < count and loop.time() < end:
                await asyncio.sleep(0.02)
        for m, c in seen:
            print("PEER " + json.dumps({"order_id": m.order_id, "customer": m.customer, "total": m.total, "express": m.express,
                                        "serializer": c.serializer, "sender": c.sender, "shard": c.shard, "partition": c.delivery.partition}), flush=True)


asyncio.run(main())
