"""The blocking client against the real broker."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import Broker

import ferrymq
from ferrymq import sync


def test_blocking_publish_consume_ack_and_admin(broker: Broker) -> None:
    with sync.Client(broker.addr) as client:
        client.create_topic("s", partitions=2, storage="disk", fsync="never")
        sub = client.subscribe("s", "work", start="earliest", credit=64)
        r = client.publish("s", b"one", key="1")
        assert r.id == "1-0"
        receipts = client.publish_batches("s", [[b"b%d" % i for i in range(100)] for _ in range(5)])
        assert [x.count for x in receipts] == [100] * 5
        got = []
        for m in sub:
            got.append(m)
            if len(got) == 501:
                break
        assert got[0].body == b"one" or b"one" in [m.body for m in got]
        # Settled from another thread than the client's loop, as a worker pool would.
        t = threading.Thread(target=lambda: sub.ack_all(got[1:]))
        t.start()
        t.join()
        sub.ack_confirmed(got[0], result=b"done")
        status = client.message_status("s", got[0].id)
        assert status.subscriptions[0][1].state == ferrymq.MessageState.ACKED
        [stats] = client.stats("s")
        assert stats.messages_in == 501
        assert [t.name for t in client.list_topics()] == ["s"]
        assert client.ping() < 1.0


def test_blocking_delivery_context_manager_and_nack(broker: Broker) -> None:
    with sync.Client(broker.addr) as client:
        sub = client.subscribe("c", "w", start="earliest")
        client.publish("c", b"x")
        [m] = sub.next_batch(1, timeout=5)
        with pytest.raises(ValueError):
            with m:
                raise ValueError("bad body")
        [again] = sub.next_batch(1, timeout=5)
        assert (again.body, again.attempt) == (b"x", 2)
        again.dead_letter("gave up")
        dlq = client.subscribe("c.dlq", "d", start="earliest")
        [dead] = dlq.next_batch(1, timeout=5)
        assert dead.header("x-ferrymq-dead-reason") == "gave up"
        with dead:
            pass
        assert sub.next_batch(1, timeout=0.3) == []
        sub.close()
        # UNSUBSCRIBE is answered before the consumer is detached everywhere (see test_client).
        for _ in range(100):
            try:
                client.delete_subscription("c", "w")
                break
            except ferrymq.BrokerError as e:
                assert e.name == "conflict"
                time.sleep(0.01)
        else:
            raise AssertionError("the subscription kept its consumer after UNSUBSCRIBE")


def test_blocking_errors(broker: Broker) -> None:
    with sync.Client(broker.addr) as client:
        with pytest.raises(ferrymq.BrokerError) as err:
            client.delete_topic("nope")
        assert err.value.name == "unknown_topic"
    with pytest.raises(ferrymq.ClientClosed):
        client.publish("t", b"x")
    from conftest import free_port

    with pytest.raises(ferrymq.ConnectionLost):
        sync.Client(f"127.0.0.1:{free_port()}", connect_timeout=2)
