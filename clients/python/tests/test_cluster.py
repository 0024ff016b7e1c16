"""The client against a real three-node cluster: discovery, not_leader, leader-following for
topics and publishes, a kill -9 of a partition's leader while publishing and while consuming,
and seeds that are all dead."""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from conftest import Cluster, reserved_port, run

import ferrymq
from ferrymq import bus
from ferrymq import protocol as p

DEADLINE_S = 90.0
#: How long the clients of the kill tests follow a leader. Longer than the default: on a loaded
#: machine the debug build's elections may take several rounds, and what these tests check is
#: that nothing is lost or repeated, not how fast.
LEADER_TIMEOUT_S = 60.0


async def wait_info(client: ferrymq.Client, what: str, ok: Callable[[p.ClusterInfoReply], bool]) -> p.ClusterInfoReply:
    """Polls CLUSTER_INFO until ``ok`` holds (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    info: Any = None
    while loop.time() < deadline:
        try:
            info = await client.cluster_info()
            if ok(info):
                return info
        except ferrymq.FerryMQError as e:
            info = e
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}: {info}")


async def until(what: str, ok: Callable[[], bool], cluster: Cluster, seconds: float = DEADLINE_S) -> None:
    """Polls ``ok`` until it holds (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not ok():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{cluster.warnings()}")
        await asyncio.sleep(0.01)


def test_cluster_view_not_leader_and_topics_through_followers(cluster: Cluster) -> None:
    addrs = cluster.addrs

    async def main() -> None:
        async with ferrymq.Client(addrs[0]) as probe:
            assert probe.server_info is not None and probe.server_info.version == 3
            info = await wait_info(probe, "a metadata leader", lambda i: i.metadata_leader != 0)
            assert info.node_id == 1 and len(info.nodes) == 3
            assert {n.id: n.addr for n in info.nodes} == {i + 1: a for i, a in enumerate(addrs)}
        leader = addrs[info.metadata_leader - 1]
        followers = [a for a in addrs if a != leader]

        # Without following, a follower's not_leader reaches the caller, naming the leader.
        async with ferrymq.Client(followers[0], leader_timeout=-1) as c:
            with pytest.raises(ferrymq.NotLeader) as caught:
                await c.create_topic("never")
            e = caught.value
            assert (e.name, e.code, e.leader, e.leader_addr, e.topic) == ("not_leader", 22, info.metadata_leader, leader, "")
            assert e.node == addrs.index(followers[0]) + 1

        # Seeds that are followers only: the requests find the metadata leader.
        async with ferrymq.Client(followers) as c:
            c._routes.clear()  # forget what discovery learnt: the request meets not_leader
            await c.create_topic("orders", partitions=1, storage="disk")
            await c.create_topic("orders", partitions=1, storage="disk", if_not_exists=True)
            with pytest.raises(ferrymq.BrokerError) as caught:
                await c.create_topic("orders", partitions=1)
            assert caught.value.name == "topic_exists"
            ci = await wait_info(c, "a leader of orders/0", lambda i: i.leader("orders", 0) != 0)
            assert [len(x.replicas) for x in ci.partitions if x.topic == "orders"] == [3]
            # The main connection's node may apply the creation a moment after the leader.
            for _ in range(1500):
                try:
                    described = await c.describe_topic("orders")
                    break
                except ferrymq.BrokerError as e:
                    assert e.name == "unknown_topic", e
                    await asyncio.sleep(0.02)
            assert described.config.replicas == 3
            await c.create_topic("gone", partitions=1)
            c._routes.clear()
            await c.delete_topic("gone")
            names: list[str] = []

            async def refresh() -> None:
                names[:] = [t.name for t in await c.list_topics()]

            # A follower applies the deletion once the metadata leader committed it.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30.0
            await refresh()
            while "gone" in names:
                assert loop.time() < deadline, names
                await asyncio.sleep(0.02)
                await refresh()

    run(main())


def test_seeds_from_the_environment_and_dead_seeds(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    addrs = cluster.addrs
    dead = [f"127.0.0.1:{reserved_port()}", f"127.0.0.1:{reserved_port()}"]

    async def main() -> None:
        async with ferrymq.Client(addrs) as c:
            await wait_info(c, "a metadata leader", lambda i: i.metadata_leader != 0)
            await c.create_topic("orders", partitions=2)
        # The first seed is dead: the next one serves, and publishes find their leaders.
        monkeypatch.setenv("FERRYMQ_ADDR", f"{dead[0]}, {addrs[1]}")
        async with ferrymq.Client() as c:
            assert c.seeds == [dead[0], addrs[1]] and c.addr == addrs[1]
            for i in range(20):
                r = await c.publish("orders", f"seed-{i}".encode(), key=f"k{i}")
                assert r.count == 1
            # Each node's count follows its replicas' commits: polled.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30.0
            while sum(t.messages for t in await c.list_topics() if t.name == "orders") < 20:
                assert loop.time() < deadline, await c.list_topics()
                await asyncio.sleep(0.02)
        # Only dead addresses: a clear error naming them.
        with pytest.raises(ferrymq.FirstConnectError) as caught:
            await ferrymq.connect(dead)
        assert "no node answered" in str(caught.value)
        assert dead[0] in str(caught.value) and dead[1] in str(caught.value)

    run(main())


def test_publishes_through_a_kill_of_the_partition_leader(cluster: Cluster) -> None:
    """Four publishers, one publish each in flight, through kill -9 of the leader: every
    acknowledged publish is stored exactly once. Those with a dedup id are sent again when in
    doubt; those without fail as ReceiptLost when in doubt (and count as not acknowledged)."""
    addrs = cluster.addrs

    async def main() -> None:
        c = await ferrymq.connect([f"127.0.0.1:{reserved_port()}", *addrs], leader_timeout=LEADER_TIMEOUT_S)
        try:
            await wait_info(c, "a metadata leader", lambda i: i.metadata_leader != 0)
            await c.create_topic("orders", partitions=1)
            await wait_info(c, "a leader of orders/0", lambda i: i.leader("orders", 0) != 0)
            acked: set[str] = set()
            unknown = 0
            stop = asyncio.Event()

            async def publisher(w: int) -> None:
                nonlocal unknown
                i = 0
                while not stop.is_set():
                    body = f"w{w}-m{i}"
                    dedup = (w + i) % 2 == 0
                    try:
                        await c.publish("orders", body.encode(), dedup_id=uuid.uuid4().hex if dedup else None)
                        acked.add(body)
                    except ferrymq.ReceiptLost as e:
                        assert not dedup, f"{body} has a dedup id and was not sent again: {e.__cause__!r}"
                        unknown += 1
                    i += 1

            tasks = [asyncio.ensure_future(publisher(w)) for w in range(4)]

            def check() -> bool:
                for t in tasks:
                    if t.done():
                        t.result()  # raises what failed the publisher
                return True

            await until("100 publishes acknowledged", lambda: check() and len(acked) >= 100, cluster)
            info = await wait_info(c, "a leader of orders/0", lambda i: i.leader("orders", 0) != 0)
            killed = info.leader("orders", 0)
            before = len(acked)
            cluster.kill(killed)
            await until("200 acknowledged after the kill", lambda: check() and len(acked) >= before + 200, cluster)
            stop.set()
            await asyncio.gather(*tasks)
            after = await wait_info(c, "a new leader", lambda i: i.leader("orders", 0) not in (0, killed))
            assert after.leader("orders", 0) != killed
        finally:
            await c.close()

        # Read everything back from the new leader.
        async with ferrymq.Client(addrs[after.leader("orders", 0) - 1], leader_timeout=-1) as r:
            sub = await r.subscribe("orders", "check", start="earliest", credit=2000)
            seen: dict[str, int] = {}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while any(b not in seen for b in acked):
                assert loop.time() < deadline, f"{sum(b not in seen for b in acked)} of {len(acked)} acknowledged missing"
                batch = await sub.next_batch(2000, timeout=5.0)
                for d in batch:
                    seen[d.body.decode()] = seen.get(d.body.decode(), 0) + 1
                sub.ack_all(batch)
            # Whatever follows the last acknowledged one (a copy stored twice would be there).
            while batch := await sub.next_batch(2000, timeout=1.0):
                for d in batch:
                    seen[d.body.decode()] = seen.get(d.body.decode(), 0) + 1
                sub.ack_all(batch)
            twice = sorted(b for b in acked if seen[b] > 1)
            assert not twice, f"acknowledged publishes stored more than once: {twice[:10]}"
            await sub.close()

    run(main(), timeout=300.0)


def test_a_subscriber_keeps_receiving_through_a_kill_without_confirmed_redeliveries(cluster: Cluster) -> None:
    """A cluster subscription acking each message with confirmation goes on receiving after
    kill -9 of the partition's leader, and no message whose ack was confirmed is delivered
    again."""
    addrs = cluster.addrs

    async def main() -> None:
        async with ferrymq.Client(addrs, leader_timeout=LEADER_TIMEOUT_S) as pub, ferrymq.Client(addrs, leader_timeout=LEADER_TIMEOUT_S) as con:
            await wait_info(pub, "a metadata leader", lambda i: i.metadata_leader != 0)
            await pub.create_topic("jobs", partitions=1)
            await wait_info(pub, "a leader of jobs/0", lambda i: i.leader("jobs", 0) != 0)
            sub = await con.subscribe("jobs", "workers", start="earliest", credit=64)
            assert isinstance(sub, ferrymq.ClusterSubscription) and sub.partitions == 1
            await until("attached on every node", lambda: len(sub.nodes) == 3, cluster)
            stop = asyncio.Event()
            published = 0

            async def publisher() -> None:
                nonlocal published
                while not stop.is_set():
                    await pub.publish("jobs", f"job-{published}".encode(), dedup_id=f"job-{published}")
                    published += 1
                    await asyncio.sleep(0.002)

            confirmed: set[str] = set()
            redelivered: list[str] = []
            received = 0

            async def consumer() -> None:
                nonlocal received
                async for m in sub:
                    received += 1
                    if m.id in confirmed:
                        redelivered.append(m.id)
                    try:
                        await m.ack_confirmed()
                        confirmed.add(m.id)
                    except ferrymq.FerryMQError:
                        pass  # its outcome is unknown: it may come again

            tasks = [asyncio.ensure_future(publisher()), asyncio.ensure_future(consumer())]

            def check() -> bool:
                for t in tasks:
                    if t.done():
                        t.result()
                return True

            await until("50 confirmed acks", lambda: check() and len(confirmed) >= 50, cluster)
            info = await wait_info(pub, "a leader of jobs/0", lambda i: i.leader("jobs", 0) != 0)
            killed = info.leader("jobs", 0)
            before = len(confirmed)
            cluster.kill(killed)
            await until("100 confirmed acks after the kill", lambda: check() and len(confirmed) >= before + 100, cluster)
            stop.set()
            await tasks[0]
            assert not redelivered, (
                f"delivered again after a confirmed ack: {redelivered[:10]} ({len(confirmed)} confirmed, node "
                f"{killed} killed)\n{cluster.warnings()}"
            )
            after = await wait_info(pub, "a new leader", lambda i: i.leader("jobs", 0) not in (0, killed))
            assert after.leader("jobs", 0) != killed
            # The killed node back: the subscription is attached there again.
            gone = addrs[killed - 1]
            await until(f"no longer attached on {gone}", lambda: check() and gone not in sub.nodes, cluster)
            cluster.nodes[killed - 1].start()
            await until(f"attached again on {gone}", lambda: check() and gone in sub.nodes, cluster)
            await sub.close()
            await tasks[1]
            assert received >= len(confirmed)

    run(main(), timeout=300.0)


@bus.message(key="order_id")
@dataclass
class OrderPlaced:
    order_id: int
    customer: str


class Orders(bus.Handler[OrderPlaced]):
    message_type = OrderPlaced

    def __init__(self) -> None:
        self.handled: list[int] = []

    def handle(self, message: OrderPlaced, context: bus.Context) -> None:
        self.handled.append(message.order_id)


def test_the_bus_rides_on_a_cluster(cluster: Cluster) -> None:
    """A bus sender and receiver on a client given the cluster's seeds: the topic is created on
    the metadata leader, each shard's batch goes to its leader, and the receiver's
    subscriptions are attached on every node."""

    async def main() -> None:
        async with ferrymq.Client(cluster.addrs) as client:
            await wait_info(client, "a metadata leader", lambda i: i.metadata_leader != 0)
            sender = bus.Sender(client, bus.Settings(identity="checkout", shard_count=4))
            orders = Orders()
            receiver = bus.Receiver(client, bus.Settings(identity="billing", shard_count=4), [orders])
            async with receiver:
                assert all(isinstance(s, ferrymq.ClusterSubscription) for s in receiver._subs)
                receipts = await sender.send_many([OrderPlaced(i, f"c{i}") for i in range(200)])
                assert sum(r.count for r in receipts) == 200
                await until("200 handled", lambda: len(orders.handled) >= 200, cluster)
            assert sorted(orders.handled) == list(range(200))

    run(main(), timeout=120.0)


def test_the_readme_cluster_example_runs(cluster: Cluster) -> None:
    """examples/cluster.py, which the README shows, against the three nodes."""
    import subprocess
    import sys
    from pathlib import Path

    async def ready() -> None:
        async with ferrymq.Client(cluster.addrs) as c:
            await wait_info(c, "a metadata leader", lambda i: i.metadata_leader != 0)

    run(ready())
    example = Path(__file__).resolve().parents[1] / "examples" / "cluster.py"
    env = {**os.environ, "FERRYMQ_ADDR": ",".join(cluster.addrs)}
    out = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("stored as") == 10 and out.stdout.count("received") == 10, out.stdout


def test_the_blocking_client_on_a_cluster(cluster: Cluster) -> None:
    """ferrymq.sync.Client given the seeds: publishes find their leader and a subscription is
    read from every node, messages settled from the application's thread."""

    async def ready() -> None:
        async with ferrymq.Client(cluster.addrs) as c:
            await wait_info(c, "a metadata leader", lambda i: i.metadata_leader != 0)

    run(ready())
    with ferrymq.sync.Client(",".join(cluster.addrs)) as c:
        assert c.cluster_info().node_id in (1, 2, 3)
        c.create_topic("tasks", partitions=3)
        for i in range(30):
            c.publish("tasks", f"t{i}".encode(), key=f"k{i}")
        got: list[str] = []
        with c.subscribe("tasks", "workers", start="earliest") as sub:
            for _ in range(100):  # bounded: 30 messages come in a few batches
                batch = sub.next_batch(100, timeout=10.0)
                assert batch, f"only {len(got)} of 30 received"
                got += [m.body.decode() for m in batch]
                sub.ack_all(batch)
                if len(got) >= 30:
                    break
        assert sorted(got) == sorted(f"t{i}" for i in range(30))
