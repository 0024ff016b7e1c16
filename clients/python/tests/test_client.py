"""The asyncio client against the real broker."""

from __future__ import annotations

import asyncio
import shutil
import signal
import ssl
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import Broker, run

import ferrymq
from ferrymq import protocol as p

#: What a broker that runs alone answers to CLUSTER_INFO, for the fake brokers below.
ALONE = p.ClusterInfoReply(0, 0, [], [])


def test_publish_and_consume_10000_in_order_per_partition(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            await client.create_topic("orders", partitions=4)
            sub = await client.subscribe("orders", "billing", start="earliest", credit=500)
            keys = [f"customer-{i % 37}" for i in range(10_000)]
            sent_by_key: dict[str, list[bytes]] = defaultdict(list)
            batch = []
            futures = []
            for i, key in enumerate(keys):
                body = f"{key}:{i}".encode()
                sent_by_key[key].append(body)
                batch.append(ferrymq.Message(body, key=key.encode()))
                if len(batch) == 1000:
                    futures.append(await client.start_publish_batch("orders", batch))
                    batch = []
            receipts = await asyncio.gather(*futures)
            assert sum(r.count for r in receipts) == 10_000
            assert len({i for r in receipts for i in r.ids}) == 10_000

            got_by_key: dict[str, list[bytes]] = defaultdict(list)
            last_offset: dict[int, int] = {}
            received = 0
            while received < 10_000:
                msgs = await sub.next_batch(1000, timeout=10)
                assert msgs, f"stalled after {received} messages"
                for m in msgs:
                    assert m.offset > last_offset.get(m.partition, -1), "offsets go backwards"
                    last_offset[m.partition] = m.offset
                    assert m.attempt == 1
                    got_by_key[m.key.decode()].append(m.body)
                sub.ack_all(msgs)
                received += len(msgs)
            assert got_by_key == sent_by_key
            assert set(last_offset) == {0, 1, 2, 3}
            await asyncio.sleep(0.2)
            [stats] = await client.stats("orders")
            [billing] = stats.subscriptions
            assert billing.acked == 10_000
            assert billing.in_flight == 0 and billing.backlog == 0

    run(main())


def test_single_publish_fields_and_receipt(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            # A memory topic: the delivery order across partitions checked below is its own.
            await client.create_topic("t", partitions=3, storage="memory")
            sub = await client.subscribe("t", start="earliest")
            r = await client.publish("t", b"hello", key="12345", headers=[("a", "1"), ("a", "2")], priority=7)
            # A decimal key goes to key mod N, as the broker's partition rule says.
            assert r.id == "0-0" and r.count == 1
            r2 = await client.publish("t", b"there", partition=2)
            assert r2.id == "2-0"
            r3 = await client.publish("t", b"later", delay_ms=300)
            # Partitions 0 and 2 are delivered independently: either may come first.
            first_two = {}
            while len(first_two) < 2:
                got = await sub.next_batch(2 - len(first_two), timeout=5)
                assert got, f"only {sorted(first_two)} of 0-0 and 2-0"
                first_two.update((m.id, m) for m in got)
            assert sorted(first_two) == ["0-0", "2-0"]
            m = first_two["0-0"]
            assert (m.id, m.body, m.key, m.priority) == ("0-0", b"hello", b"12345", 7)
            assert m.headers == (("a", "1"), ("a", "2")) and m.header("a") == "1"
            await m.ack_confirmed()
            first_two["2-0"].ack()
            t0 = time.monotonic()
            [m] = await sub.next_batch(1, timeout=5)
            assert m.id == r3.id and m.deliver_after_ms == 300
            assert time.monotonic() - t0 > 0.15
            m.ack()
            with pytest.raises(ferrymq.FerryMQError, match="already"):
                m.ack()

    run(main())


def test_a_retry_with_the_same_dedup_id_is_stored_once(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            await client.create_topic("dedup", partitions=2)
            first = await client.publish("dedup", b"charge 5", dedup_id="charge-5")
            again = await client.publish("dedup", b"charge 5", dedup_id="charge-5")
            other = await client.publish("dedup", b"charge 6", dedup_id="charge-6")
            assert again.id == first.id and other.id != first.id
            assert (await client.describe_topic("dedup")).messages == 2

    run(main())


def test_publish_window_bounds_unconfirmed_messages(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr, publish_window=100) as client:
            first = await client.start_publish_batch("w", [b"x"] * 100)
            assert not first.done()
            second = await client.start_publish_batch("w", [b"y"] * 60)
            # The window (100) was full: the second batch waited for the first receipt.
            assert first.done()
            assert client._unconfirmed <= 100
            assert (await second).count == 60
            # One batch larger than the window goes alone.
            assert (await client.publish_batch("w", [b"z"] * 250)).count == 250
            with pytest.raises(ferrymq.PublishWindowFull):
                f = await client.start_publish_batch("w", [b"a"] * 100)
                try:
                    client._unconfirmed += 1000  # as if receipts never came
                    await client.start_publish_batch("w", [b"b"], window_timeout=0.2)
                finally:
                    client._unconfirmed -= 1000
                    await f

    run(main())


def test_message_too_large_and_bad_input(make_broker) -> None:
    broker = make_broker("--message-max-bytes", "1000")

    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            assert client.message_bytes_max == 1000
            with pytest.raises(ferrymq.MessageTooLarge) as caught:
                await client.publish_batch("t", [b"ok", b"x" * 1001])
            assert caught.value.index == 1
            with pytest.raises(ferrymq.ProtocolError, match="priority"):
                await client.publish("t", b"x", priority=10)
            with pytest.raises(ValueError, match="topic name"):
                await client.publish("", b"x")
            with pytest.raises(TypeError):
                await client.publish_batch("t", ["not bytes"])  # type: ignore[list-item]
            with pytest.raises(ferrymq.BrokerError) as err:
                await client.describe_topic("missing")
            assert err.value.name == "unknown_topic"
            # Nothing of the refused batches was stored.
            assert (await client.publish("t", b"ok")).id == "0-0"

    run(main())


def test_admin_stats_and_listings(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            await client.create_topic("a", partitions=2, storage="disk", fsync="never", max_messages=1000)
            with pytest.raises(ferrymq.BrokerError) as err:
                await client.create_topic("a")
            assert err.value.name == "topic_exists"
            await client.create_topic("a", if_not_exists=True)
            info = await client.describe_topic("a")
            assert info.config.partitions == 2 and info.config.storage == p.Storage.DISK
            assert info.config.fsync == p.Fsync.NEVER and info.config.max_messages == 1000
            sub = await client.subscribe("a", "s1", start="earliest")
            r = await client.publish_batch("a", [ferrymq.Message(b"m%d" % i, key=b"%d" % i) for i in range(4)])
            assert r.durability == p.Durability.WRITTEN
            assert "a" in [t.name for t in await client.list_topics()]
            assert (await client.describe_topic("a")).subscriptions == ["s1"]
            msgs = await sub.next_batch(4, timeout=5)
            while len(msgs) < 4:
                msgs += await sub.next_batch(4, timeout=5)
            msgs.sort(key=lambda m: (m.partition, m.offset))
            msgs[0].ack(result=b'{"invoice":1}')
            await msgs[1].ack_confirmed(result=b"second")
            pending, _ = await client.list_messages("a", "s1", "in_flight", limit=10)
            assert {(e.partition, e.offset) for e in pending} == {(m.partition, m.offset) for m in msgs[2:]}
            status = await client.message_status("a", msgs[0].id)
            assert status.key == msgs[0].key and status.body_bytes == 2
            [(name, entry)] = status.subscriptions
            assert name == "s1" and entry.state == p.MessageState.ACKED and entry.result == b'{"invoice":1}'
            acked = [e async for e in client.iter_messages("a", "s1", "acked", page_size=1)]
            assert sorted(e.result for e in acked) == sorted([b'{"invoice":1}', b"second"])
            [stats] = await client.stats("a")
            assert stats.messages_in == 4 and stats.subscriptions[0].acked == 2
            assert stats.subscriptions[0].in_flight == 2
            with pytest.raises(ferrymq.BrokerError) as err:
                await client.delete_subscription("a", "s1")
            assert err.value.name == "conflict"
            await sub.close()
            # The broker answers UNSUBSCRIBE before the consumer is detached everywhere: a
            # DELETE_SUBSCRIPTION right after it may still meet `conflict` for a moment.
            for _ in range(100):
                try:
                    await client.delete_subscription("a", "s1")
                    break
                except ferrymq.BrokerError as e:
                    assert e.name == "conflict"
                    await asyncio.sleep(0.01)
            else:
                raise AssertionError("the subscription kept its consumer after UNSUBSCRIBE")
            await client.delete_topic("a")
            assert "a" not in [t.name for t in await client.list_topics()]
            assert await client.ping() < 1.0

    run(main())


def test_nack_ack_timeout_dead_letters_and_requeue(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            sub = await client.subscribe("jobs", "workers", start="earliest", ack_timeout_ms=200, max_attempts=3)
            for i in range(4):
                await client.publish("jobs", b"job%d" % i)

            async def take(n: int = 1) -> list[ferrymq.ReceivedMessage]:
                out: list = []
                while len(out) < n:
                    got = await sub.next_batch(n - len(out), timeout=5)
                    assert got, "no delivery within 5 s"
                    out += got
                return out

            first = await take(4)
            by_body = {m.body: m for m in first}
            by_body[b"job0"].nack()  # ready again at once
            by_body[b"job1"].nack(delay_ms=400)
            by_body[b"job2"].dead_letter("unparseable")
            # job3 is not acked: redelivered after the 200 ms ack timeout.
            t0 = time.monotonic()
            again = {}
            while len(again) < 3:
                for m in await take():
                    assert m.body not in again, f"{m.body!r} delivered again too early"
                    again[m.body] = (m, time.monotonic() - t0)
                    if m.body != b"job3":
                        m.ack()
            assert again[b"job0"][0].attempt == 2
            assert again[b"job3"][0].attempt == 2 and again[b"job3"][1] >= 0.15
            assert again[b"job1"][0].attempt == 2 and again[b"job1"][1] >= 0.35
            # job3 keeps timing out: given up after 3 attempts, it goes to jobs.dlq.
            [third] = await take()
            assert (third.body, third.attempt) == (b"job3", 3)
            dlq = await client.subscribe("jobs.dlq", "inspect", start="earliest")
            dead = await dlq.next_batch(2, timeout=5)
            while len(dead) < 2:
                dead += await dlq.next_batch(2, timeout=5)
            reasons = {m.body: m.header("x-ferrymq-dead-reason") for m in dead}
            assert reasons[b"job2"] == "unparseable"
            assert b"job3" in reasons
            dlq.ack_all(dead)
            requeued = await client.requeue_dead("jobs.dlq")
            assert (requeued.requeued, requeued.skipped) == (2, 0)
            back = await take(2)
            assert sorted(m.body for m in back) == [b"job2", b"job3"]
            sub.ack_all(back)
            again_requeued = await client.requeue_dead("jobs.dlq", partition=0, first_offset=0, last_offset=1)
            assert (again_requeued.requeued, again_requeued.skipped) == (0, 2)

    run(main())


def test_delivery_context_manager(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            sub = await client.subscribe("cm", "s", start="earliest")
            await client.publish("cm", b"bad")
            await client.publish("cm", b"good")
            seen = []
            async for m in sub:
                seen.append((m.body, m.attempt))
                try:
                    async with m:
                        if m.body == b"bad" and m.attempt == 1:
                            raise RuntimeError("handler failed")
                except RuntimeError:
                    pass
                if len(seen) == 3:
                    break
            assert (b"bad", 1) in seen and (b"bad", 2) in seen and (b"good", 1) in seen
            await asyncio.sleep(0.2)
            [stats] = await client.stats("cm")
            assert stats.subscriptions[0].acked == 2 and stats.subscriptions[0].redelivered == 1

    run(main())


def test_reconnect_after_broker_restart_and_lost_receipt(broker: Broker) -> None:
    async def main() -> None:
        client = await ferrymq.connect(
            broker.addr, reconnect_delay_min=0.02, reconnect_delay_max=0.2, connect_timeout=1.0
        )
        try:
            await client.create_topic("m", storage="memory")
            sub = await client.subscribe("m", "keep", start="earliest")
            await client.publish("m", b"before")
            [m] = await sub.next_batch(1, timeout=5)
            m.ack()
            await asyncio.sleep(0.05)
            # A publish whose receipt is lost with the connection raises, never succeeds silently.
            # The broker is frozen first, so that these publishes are surely in flight.
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGSTOP)
            # A signal takes effect asynchronously: wait until every thread is stopped.
            tasks = Path(f"/proc/{broker.proc.pid}/task")
            for _ in range(200):
                states = {(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()}
                if states == {"T"}:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the broker did not stop on SIGSTOP")
            pending = [await client.start_publish_batch("m", [b"x"] * 100) for _ in range(5)]
            await asyncio.sleep(0.05)
            broker.stop(kill=True)
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
            assert all(isinstance(o, ferrymq.ReceiptLost) for o in outcomes), outcomes
            assert "may or may not be stored" in str(outcomes[0])
            # While the broker is away, a request waits connect_timeout, then fails clearly.
            with pytest.raises(ferrymq.ConnectionLost, match="not connected"):
                await client.ping()
        except BaseException:
            await client.close()
            raise
        broker.start()
        try:
            # Reconnecting takes backoff (at most 0.2 s here) plus the broker's start-up.
            for _ in range(500):
                if client.connected:
                    break
                await asyncio.sleep(0.02)
            r = await client.publish("m", b"after")
            assert client.reconnects == 1
            # The subscription was attached again by itself (the memory topic is new after the restart).
            [m] = await sub.next_batch(1, timeout=5)
            assert (m.body, m.id) == (b"after", r.id)
            m.ack()
        finally:
            await client.close()

    run(main())


def test_recovered_named_subscription_delivers_new_messages(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            await client.create_topic("d", storage="disk")
            sub = await client.subscribe("d", "keep", start="earliest")
            await client.publish("d", b"one")
            sub.ack_all(await sub.next_batch(1, timeout=5))
            await asyncio.sleep(0.1)
        broker.restart()
        async with ferrymq.Client(broker.addr) as client:
            sub = await client.subscribe("d", "keep")
            await client.publish("d", b"two")
            got = await sub.next_batch(1, timeout=3)
            assert [m.body for m in got] == [b"two"]

    run(main())


def test_connection_refused_is_a_clear_error() -> None:
    async def main() -> None:
        from conftest import free_port

        with pytest.raises(ferrymq.ConnectionLost, match="cannot connect"):
            await ferrymq.connect(f"127.0.0.1:{free_port()}", connect_timeout=2)

    run(main())


def test_credentials_and_token_are_sent_in_hello() -> None:
    """HELLO carries user and password; a token goes as the password with an empty user."""

    async def main() -> None:
        seen: list[p.Hello] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            d = p.Decoder()
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                d.feed(data)
                while got := d.next():
                    rid, frame = got
                    if isinstance(frame, p.ClusterInfo):
                        writer.write(p.encode_frame(ALONE, rid))
                        continue
                    assert isinstance(frame, p.Hello)
                    seen.append(frame)
                    writer.write(p.encode_frame(p.HelloOk(p.PROTOCOL_VERSION, 5000, 1 << 24, 1 << 18, "fake/1"), rid))
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            async with ferrymq.Client(f"127.0.0.1:{port}", user="alice", password="s3cret"):
                pass
            async with ferrymq.Client(f"127.0.0.1:{port}", token="tok-123") as c:
                assert c.server_info is not None and c.server_info.server == "fake/1"
        assert (seen[0].user, seen[0].password) == ("alice", "s3cret")
        assert (seen[1].user, seen[1].password) == ("", "tok-123")
        assert "s3cret" not in repr(seen[0])
        with pytest.raises(ValueError):
            ferrymq.Client("127.0.0.1:1", token="t", user="u")

    run(main())


def test_partition_ranges_parse() -> None:
    assert ferrymq.parse_partition_ranges("1,2,4-7") == [(1, 1), (2, 2), (4, 7)]
    for bad in ("", "a", "3-1", "-1"):
        with pytest.raises(ValueError):
            ferrymq.parse_partition_ranges(bad)


def test_subscribe_to_chosen_partitions(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            await client.create_topic("sh", partitions=8)
            sub = await client.subscribe("sh", "s", start="earliest", partitions="1,2,4-7")
            for part in range(8):
                await client.publish("sh", b"p%d" % part, partition=part)
            got = []
            while len(got) < 6:
                more = await sub.next_batch(10, timeout=5)
                assert more, f"only {len(got)} of 6 messages"
                got += more
            got += await sub.next_batch(10, timeout=0.3)
            assert sorted(m.partition for m in got) == [1, 2, 4, 5, 6, 7]

    run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_tls_with_an_ssl_context(tmp_path) -> None:
    """``ssl=`` speaks TLS and checks the server's certificate (a local TLS endpoint stands in
    for the broker's TLS listener)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip

    async def main() -> None:
        hellos: list[p.Hello] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            d = p.Decoder()
            while data := await reader.read(65536):
                d.feed(data)
                while got := d.next():
                    rid, frame = got
                    if isinstance(frame, p.Hello):
                        hellos.append(frame)
                        writer.write(p.encode_frame(p.HelloOk(p.PROTOCOL_VERSION, 5000, 1 << 24, 1 << 18, "tls/1"), rid))
                    elif isinstance(frame, p.Ping) and rid:
                        writer.write(p.encode_frame(p.Pong(), rid))
                    elif isinstance(frame, p.ClusterInfo):
                        writer.write(p.encode_frame(ALONE, rid))
                await writer.drain()

        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        names: list[object] = []
        server_ctx.sni_callback = lambda sock, name, ctx: names.append(name)
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        async with server:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with ferrymq.Client(f"127.0.0.1:{port}", ssl=trusting, token="t0k") as client:
                assert await client.ping() < 1.0
            assert hellos[0].password == "t0k"
            async with ferrymq.Client(f"localhost:{port}", ssl=trusting) as client:
                await client.ping()
            # SNI names a host; an IP address sends none (RFC 6066).
            assert names == [None, "localhost"], names
            # A client that does not trust the certificate refuses the connection.
            with pytest.raises(ferrymq.ConnectionLost, match="cannot connect"):
                await ferrymq.connect(f"127.0.0.1:{port}", ssl=ssl.create_default_context(), connect_timeout=5)

    run(main())


def test_heartbeats_are_sent_and_a_silent_broker_is_detected() -> None:
    async def main() -> None:
        pings: list[int] = []
        silent = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            d = p.Decoder()
            while data := await reader.read(65536):
                d.feed(data)
                while got := d.next():
                    rid, frame = got
                    if isinstance(frame, p.Hello):
                        # The smallest interval the protocol allows, so that the test is short.
                        writer.write(p.encode_frame(p.HelloOk(p.PROTOCOL_VERSION, 100, 1 << 24, 1 << 18, "quiet/1"), rid))
                    elif isinstance(frame, p.ClusterInfo):
                        writer.write(p.encode_frame(ALONE, rid))
                    elif isinstance(frame, p.Ping):
                        pings.append(rid)
                        if not silent.is_set():
                            writer.write(p.encode_frame(p.Ping(), 0))  # a sign of life back
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            client = await ferrymq.connect(f"127.0.0.1:{port}", reconnect=False)
            try:
                await asyncio.sleep(0.5)
                # Idle for 5 intervals: the client sent heartbeat PINGs (request id 0) and, hearing
                # the server's, kept the connection.
                assert len(pings) >= 3 and set(pings) == {0}
                assert client.connected
                silent.set()
                await asyncio.sleep(0.6)
                # Nothing received for 3 intervals: the connection is declared dead.
                assert not client.connected
                with pytest.raises(ferrymq.ConnectionLost):
                    await client.ping()
            finally:
                await client.close()

    run(main())


def test_a_topic_created_with_defaults_takes_the_brokers_defaults(make_broker) -> None:
    """Every setting left out is the broker's: a topic survives a restart when the broker keeps
    topics on disk, and follows `--default-storage memory` and `--topic-overflow` when set."""

    async def created(addr: str) -> p.TopicInfo:
        async with ferrymq.Client(addr) as client:
            await client.create_topic("plain")
            return await client.describe_topic("plain")

    info = run(created(make_broker().addr))
    assert (info.config.storage, info.config.overflow) == (p.Storage.DISK, p.Overflow.DROP_OLDEST)
    assert info.config.partitions == 1
    tuned = make_broker("--default-storage", "memory", "--topic-overflow", "reject")
    info = run(created(tuned.addr))
    assert (info.config.storage, info.config.overflow) == (p.Storage.MEMORY, p.Overflow.REJECT)


def test_a_broker_of_protocol_version_2_is_spoken_to_in_its_layout() -> None:
    """HELLO offers 2..=3; a broker that picks 2 gets the version 2 layouts (a topic config
    without replicas, STATS_REPLY without paused) and never a version 3 frame: cluster_info
    answers a broker alone without asking it."""

    async def main() -> None:
        hellos: list[p.Hello] = []
        opcodes: list[int] = []
        info = p.TopicInfo("orders", p.TopicConfig(4, p.Storage.DISK, p.Overflow.REJECT, 10, 20, p.Fsync.ALWAYS), 5, 6, ["billing"])
        latency = p.Latency(0, [])
        stats = p.TopicStats("orders", 1, 2, 3, 4, 5, 6, 0, 1, 1, [
            p.SubscriptionStats("billing", False, 1, 1, 2, 3, 0, 0, 0, 0, latency, latency),
        ])  # fmt: skip

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            d = p.Decoder(version=2)
            while data := await reader.read(65536):
                d.feed(data)
                while got := d.next():
                    rid, frame = got
                    opcodes.append(frame.OPCODE)
                    if isinstance(frame, p.Hello):
                        hellos.append(frame)
                        reply: p.Frame = p.HelloOk(2, 5000, 1 << 24, 1 << 18, "old/2")
                    elif isinstance(frame, p.CreateTopic):
                        assert frame.config.replicas == 0
                        reply = p.Ok()
                    elif isinstance(frame, p.DescribeTopic):
                        reply = p.TopicInfoFrame(info)
                    elif isinstance(frame, p.Stats):
                        reply = p.StatsReply([stats])
                    else:
                        reply = p.Error(15, "unknown")
                    writer.write(p.encode_frame(reply, rid, version=2))
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            async with ferrymq.Client(f"127.0.0.1:{port}") as c:
                assert c.server_info is not None and c.server_info.version == 2
                await c.create_topic("orders", partitions=4)
                assert await c.describe_topic("orders") == info
                assert await c.stats("orders") == [stats]
                assert (await c.cluster_info()).node_id == 0
                with pytest.raises(ferrymq.ProtocolError, match="version 3"):
                    await c.purge_topic("orders")
        assert (hellos[0].version_min, hellos[0].version_max) == (2, 3)
        assert p.Opcode.CLUSTER_INFO not in opcodes and p.Opcode.PURGE_TOPIC not in opcodes

    run(main())
