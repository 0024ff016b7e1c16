"""Where a client connects and what happens when it cannot: FERRYMQ_ADDR, a failed first
connection, and waiting for a broker that is not up yet."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import Broker, free_port, run

import ferrymq
from ferrymq import bus, sync


def test_every_constructor_honours_ferrymq_addr(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRYMQ_ADDR", broker.addr)

    async def main() -> None:
        async with ferrymq.Client() as client:
            assert (client.host, client.port) == ("127.0.0.1", broker.port)
            await client.ping()
        client = await ferrymq.connect()
        await client.close()

    run(main())
    with sync.Client() as c:
        c.ping()
    assert bus.Settings().addr == broker.addr
    assert bus.Settings.load([], {}).addr == "127.0.0.1:7070"


def test_a_failed_first_connection_is_named_so() -> None:
    async def main() -> None:
        with pytest.raises(ferrymq.FirstConnectError, match="cannot connect") as caught:
            await ferrymq.connect(f"127.0.0.1:{free_port()}", connect_timeout=2)
        assert isinstance(caught.value, ferrymq.ConnectionLost)
        # A request on a client that never connected says so at once.
        with pytest.raises(ferrymq.FirstConnectError, match="never connected"):
            await ferrymq.Client(f"127.0.0.1:{free_port()}").ping()
        # One that waits for an open in progress gets its outcome.
        c = ferrymq.Client(f"127.0.0.1:{free_port()}", wait_on_first_connect=0.2)
        opening = asyncio.ensure_future(c.open())
        await asyncio.sleep(0)
        with pytest.raises(ferrymq.FirstConnectError, match="never connected"):
            await c.ping()
        with pytest.raises(ferrymq.FirstConnectError, match="cannot connect"):
            await opening

    run(main())


def test_wait_on_first_connect_waits_for_the_broker(binary: Path, tmp_path: Path) -> None:
    port = free_port()
    later = Broker(binary, tmp_path / "data")
    later.port = port

    async def main() -> None:
        connecting = asyncio.ensure_future(ferrymq.connect(f"127.0.0.1:{port}", wait_on_first_connect=30, reconnect_delay_max=0.2))
        await asyncio.sleep(0.3)
        assert not connecting.done()
        await asyncio.get_running_loop().run_in_executor(None, later.start)
        client = await asyncio.wait_for(connecting, 30)
        await client.ping()
        await client.close()
        # A bounded wait ends with the error.
        with pytest.raises(ferrymq.FirstConnectError):
            await ferrymq.connect(f"127.0.0.1:{free_port()}", wait_on_first_connect=0.3)

    try:
        run(main())
    finally:
        later.stop()


def test_create_topic_if_not_exists_refuses_another_configuration(broker: Broker) -> None:
    async def main() -> None:
        async with ferrymq.Client(broker.addr) as client:
            await client.create_topic("conf.check", partitions=3)
            await client.create_topic("conf.check", partitions=3, if_not_exists=True)
            await client.create_topic("conf.check", if_not_exists=True)
            with pytest.raises(ferrymq.TopicConfigMismatch, match=r"partitions 3 \(asked 4\)") as caught:
                await client.create_topic("conf.check", partitions=4, storage="memory", if_not_exists=True)
            assert caught.value.existing.partitions == 3 and len(caught.value.differences) == 2

    run(main())
