"""The asyncio FerryMQ client.

One ``Client`` is one TCP (or TLS) connection to a broker, shared by every publisher and
subscription of the application; requests are pipelined and matched to their answers by request
id, never by order.

Invariants:

- Every request with an id gets exactly one outcome: its answer, the broker's ERROR as
  ``BrokerError``, or ``ConnectionLost`` when the connection goes first. A publish that loses
  its connection raises ``ReceiptLost``: its messages may or may not be stored, and it is never
  reported as sent.
- Unconfirmed publishes are bounded by ``publish_window`` messages: a publisher waits for
  receipts before it sends more (one batch larger than the window still goes alone).
- A subscription buffers at most its credit window: credit is granted back as the application
  takes messages, in steps of half the window, as the Rust client does.
- Acks and nacks are fire-and-forget frames (request id 0). Acks are coalesced into ranges and
  written once per event-loop turn. An ack of a delivery from before a reconnect is dropped: the
  broker gave that message back when the old connection closed and delivers it again.
- After a lost connection the client reconnects with exponential backoff and subscribes again
  with the same options (a named subscription continues where it was; an ephemeral one starts
  afresh). Requests made while it is away wait up to ``connect_timeout`` for it to come back.
- In a cluster (several seed addresses, or a node that says it belongs to one) requests that
  need a leader (publishes, creating and deleting topics) go to it over a connection of their
  own, and follow it (see ``Client``); a subscription is attached on every node
  (``ClusterSubscription``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import ssl as _ssl
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Literal, Optional, Sequence, Union

from . import protocol as p
from .errors import (
    BrokerError,
    ClientClosed,
    ConnectionLost,
    FerryMQError,
    FirstConnectError,
    NotLeader,
    TopicConfigMismatch,
    ProtocolError,
    PublishWindowFull,
    ReceiptLost,
    broker_error,
)

__all__ = [
    "Client",
    "connect",
    "Subscription",
    "ClusterSubscription",
    "ReceivedMessage",
    "Receipt",
    "MessageTooLarge",
]

log = logging.getLogger("ferrymq")

CLIENT_NAME = "ferrymq-python/0.1"
#: Unconfirmed published messages per client before a publisher waits: enough batches of 1 000
#: in flight to hide a round trip, few enough to bound what a lost connection leaves uncertain.
PUBLISH_WINDOW_DEFAULT = 64 * 1024
#: Credit window of a subscription, as the Rust client's default.
CREDIT_WINDOW_DEFAULT = 1024
#: Pending transport bytes above which writers wait for the socket to drain.
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024

_HEADER = struct.Struct("<IHHI")
_U32 = struct.Struct("<I")
_RECORD_PREFIX = struct.Struct("<BBHHI")
_RANGE = struct.Struct("<IQI")
_ACK_HEAD = struct.Struct("<IHHIII")  # header + consumer_id + range_count
_CREDIT = struct.Struct("<IHHIII")

Body = Union[bytes, bytearray, memoryview]
#: Role bits: a ``Role``, an int, a name (``"monitor"``, ``"admin|monitor"``) or names.
Roles = Union[int, str, Iterable[str]]
#: Action bits: an ``Action``, an int, a name (``"publish|consume"``) or names.
Actions = Union[int, str, Iterable[str]]

#: The broker when no address is given and FERRYMQ_ADDR is not set.
DEFAULT_ADDR = "127.0.0.1:7070"


#: How long a request that needs a leader keeps following it in a cluster, by default.
LEADER_TIMEOUT_DEFAULT = 15.0
#: Backoff of a cluster subscription re-attaching to a node, first and longest.
REATTACH_DELAY_MIN = 0.05
REATTACH_DELAY_MAX = 1.0


def default_addr() -> str:
    """``$FERRYMQ_ADDR`` (one address, or the nodes of a cluster separated by commas), else
    127.0.0.1:7070."""
    return os.environ.get("FERRYMQ_ADDR") or DEFAULT_ADDR


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_seeds(addr: Union[str, Sequence[str]]) -> list[str]:
    """The seed addresses of ``"a:7070,b:7070"`` or ``["a:7070", "b:7070"]``, each as
    ``host:port``, in order, without repeats."""
    parts = addr.split(",") if isinstance(addr, str) else [a for x in addr for a in str(x).split(",")]
    out: list[str] = []
    for part in parts:
        part = part.strip()
        if not part:
            continue
        a = format_address(*parse_address(part))
        if a not in out:
            out.append(a)
    if not out:
        raise ValueError(f"no broker address in {addr!r}")
    return out


#: The record header of a message's deduplication id (the broker's reserved name).
DEDUP_ID_HEADER = "x-ferrymq-dedup-id"


def _bits(value: Union[int, str, Iterable[str]], flags: type[enum.IntFlag]) -> int:
    """The u8 of role or action bits given as an int or as names of ``flags`` members."""
    if isinstance(value, int):
        if not 0 <= value <= 0xFF:
            raise ValueError(f"{value} is not a u8 of {flags.__name__} bits")
        return int(value)
    names = value.split("|") if isinstance(value, str) else list(value)
    bits = 0
    for name in names:
        key = name.strip().upper()
        if not key:
            continue
        try:
            bits |= flags[key]
        except KeyError:
            known = ", ".join(m.name.lower() for m in flags if m.value)  # type: ignore[union-attr]
            raise ValueError(f"unknown {flags.__name__.lower()} {name!r}: one of {known}") from None
    return bits


_METADATA_ROUTE = ("", -2)
_PUBLISH_HEAD = struct.Struct("<H")


def _publish_partition(data: bytes) -> int:
    """The partition a PUBLISH frame names, -1 for the broker's choice."""
    (topic_len,) = _PUBLISH_HEAD.unpack_from(data, p.FRAME_HEADER_BYTES)
    (partition,) = _U32.unpack_from(data, p.FRAME_HEADER_BYTES + 2 + topic_len)
    return -1 if partition == p.NO_PARTITION else partition


def _all_deduplicated(data: bytes) -> bool:
    """Whether every message of a PUBLISH frame carries a deduplication id: then sending it
    again stores nothing twice."""
    (payload_len,) = _U32.unpack_from(data, 0)
    frame = p.decode_payload(p.Opcode.PUBLISH, bytes(data), p.FRAME_HEADER_BYTES, p.FRAME_HEADER_BYTES + payload_len)
    assert isinstance(frame, p.Publish)
    return bool(frame.messages) and all(any(n == DEDUP_ID_HEADER for n, _ in m.headers) for m in frame.messages)


class MessageTooLarge(FerryMQError, ValueError):
    """A message body above the broker's ``message_bytes_max``; nothing of its batch was sent."""

    def __init__(self, index: int, size: int, limit: int) -> None:
        super().__init__(
            f"message {index} of the batch has a {size}-byte body, above the broker's limit of "
            f"{limit} bytes (message_bytes_max); nothing was sent"
        )
        self.index = index
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Receipt:
    """What the broker assigned to a publish: the durability reached and, in message order, the
    ranges of offsets. ``ids`` are the message ids ``<partition>-<offset>``."""

    topic: str
    durability: p.Durability
    ranges: tuple[p.Range, ...]

    @property
    def count(self) -> int:
        return sum(r.count for r in self.ranges)

    @property
    def ids(self) -> list[str]:
        return [f"{r.partition}-{r.offset + i}" for r in self.ranges for i in range(r.count)]

    @property
    def id(self) -> str:
        """The id of the first (for a single publish, the only) message."""
        if not self.ranges:
            raise ValueError("an empty publish has no message id")
        r = self.ranges[0]
        return f"{r.partition}-{r.offset}"


def parse_message_id(message_id: str) -> tuple[int, int]:
    """``"3-1041"`` -> ``(3, 1041)``."""
    try:
        part, off = message_id.split("-", 1)
        return int(part), int(off)
    except ValueError:
        raise ValueError(f"a message id is <partition>-<offset>, got {message_id!r}") from None


def parse_address(addr: str, default_port: int = 7070) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, default_port
    if not port.isdigit():
        raise ValueError(f"an address is host:port, got {addr!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class ReceivedMessage(p.Delivery):
    """A delivery handed to the application, which settles it once: ``ack`` (optionally with a
    result), ``nack`` (now or after a delay) or ``dead_letter``.

    ``async with message:`` acks when the block ends normally and nacks (ready again at once)
    when it raises; the exception still propagates.
    """

    # Instances are made per subscription and connection by ``Subscription._bind``, whose
    # subclass carries these as class attributes, so decoding sets nothing per message.
    _sub: "Subscription"
    _epoch: int = 0
    settled: bool = False

    def ack(self, result: Optional[bytes] = None) -> None:
        """Acks this message (batched with other acks, no answer awaited). With ``result``, the
        broker keeps it with the message for status queries (at most 4096 bytes)."""
        if self.settled:
            raise FerryMQError(f"message {self.id} was already acked or nacked")
        self.settled = True
        if result is None:
            sub = self._sub
            if sub._foreign:
                sub._loop.call_soon_threadsafe(sub._queue_ack, self)
            else:
                sub._queue_ack(self)
        else:
            if len(result) > p.ACK_RESULT_BYTES_MAX:
                self.settled = False
                raise ValueError(f"an ack result is at most {p.ACK_RESULT_BYTES_MAX} bytes, got {len(result)}")
            self._sub._dispatch(self._sub._ack_result_nowait, self, bytes(result))

    async def ack_confirmed(self, result: Optional[bytes] = None) -> None:
        """Acks and waits until the broker has applied it."""
        self._settle()
        await self._sub._ack_confirmed([self], result)

    def nack(self, delay_ms: int = 0, reason: str = "") -> None:
        """Gives the message back: ready again at once, or after ``delay_ms``."""
        self._settle()
        self._sub._dispatch(self._sub._nack, [self], delay_ms, False, reason)

    def dead_letter(self, reason: str = "") -> None:
        """Moves the message to the subscription's dead-letter topic now, with ``reason``."""
        self._settle()
        self._sub._dispatch(self._sub._nack, [self], 0, True, reason)

    def release(self) -> None:
        """Gives the message back unprocessed (a consumer that stops early): ready again at once,
        and this delivery is not counted as an attempt."""
        self._settle()
        self._sub._dispatch(self._sub._nack, [self], 0, False, "", True)

    def _settle(self) -> None:
        if self.settled:
            raise FerryMQError(f"message {self.id} was already acked or nacked")
        self.settled = True

    def _exit(self, exc: Optional[BaseException]) -> None:
        if self.settled:
            return
        if exc is None:
            self.ack()
        else:
            reason = f"{type(exc).__name__}: {exc}".encode("utf-8")[: p.ERROR_MESSAGE_BYTES_MAX]
            self.nack(reason=reason.decode("utf-8", "ignore"))

    def __enter__(self) -> "ReceivedMessage":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self._exit(exc)
        return False

    async def __aenter__(self) -> "ReceivedMessage":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self._exit(exc)
        return False


class _Pending:
    __slots__ = ("future", "topic", "count", "sub")

    def __init__(self, future: asyncio.Future, topic: Optional[str], count: int, sub: Optional["Subscription"] = None) -> None:
        self.future = future
        self.topic = topic  # set for publishes: their loss is a ReceiptLost
        self.count = count
        # Set for SUBSCRIBE: the consumer is registered as SUBSCRIBED is read, because DELIVER
        # frames may follow in the same read, before the subscribing task runs again.
        self.sub = sub


class _Connection(asyncio.Protocol):
    def __init__(self, client: "Client") -> None:
        self.client = client
        self.transport: Optional[asyncio.Transport] = None
        self.decoder = p.Decoder(p.FRAME_BYTES_DEFAULT, client._deliver_class)
        self.closed = asyncio.get_running_loop().create_future()
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost_reason: Optional[BaseException] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)

    def data_received(self, data: bytes) -> None:
        self.client._on_data(self, data)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.writable.set()
        if not self.closed.done():
            self.closed.set_result(None)
        self.client._on_lost(self, exc or self.lost_reason)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def abort(self, reason: BaseException) -> None:
        self.lost_reason = reason
        if self.transport is not None:
            self.transport.abort()


class Client:
    """A connection to a FerryMQ broker, or to the nodes of a cluster. Create it with
    ``await Client.connect(...)`` or ``async with Client(...)``.

    ``addr`` is ``host:port``, or several (a list, or separated by commas; by default
    ``$FERRYMQ_ADDR``): the seeds of a cluster. The client connects to the first that answers
    and asks it for the cluster's nodes (CLUSTER_INFO). In a cluster, publishes,
    ``create_topic`` and ``delete_topic`` need a leader (of the partition, or of the cluster
    metadata): when a node answers ``not_leader``, or the connection to the leader is lost, the
    client finds the leader (from the answer, else CLUSTER_INFO from any node it reaches),
    connects to it and sends the request again, for up to ``leader_timeout`` seconds (negative:
    never; ``NotLeader`` then reaches the caller). A request whose outcome is unknown (sent, and
    the connection lost before the answer) is sent again only when that is safe:
    ``create_topic(..., if_not_exists=True)``, and a publish whose every message carries a
    deduplication id; another publish raises ``ReceiptLost``, as with a single broker.
    ``subscribe`` returns a ``ClusterSubscription``, attached on every node. Other requests use
    the connection to the first node that answered: any node serves them."""

    def __init__(
        self,
        addr: Union[str, Sequence[str], None] = None,
        *,
        user: str = "",
        password: str = "",
        token: Optional[str] = None,
        ssl: Optional[_ssl.SSLContext] = None,
        server_hostname: Optional[str] = None,
        client_name: str = CLIENT_NAME,
        heartbeat_ms: int = 0,
        publish_window: int = PUBLISH_WINDOW_DEFAULT,
        reconnect: bool = True,
        reconnect_delay_min: float = 0.05,
        reconnect_delay_max: float = 5.0,
        connect_timeout: float = 30.0,
        wait_on_first_connect: Optional[float] = None,
        leader_timeout: float = LEADER_TIMEOUT_DEFAULT,
    ) -> None:
        if token is not None and (user or password):
            raise ValueError("give either token= or user= and password=, not both")
        if publish_window < 1:
            raise ValueError("publish_window must be at least 1")
        self._seeds = parse_seeds(addr or default_addr())
        self.host, self.port = parse_address(self._seeds[0])
        self._leader_timeout = leader_timeout
        # A connection of a cluster client to one node (publishes to its leaders, legs of
        # cluster subscriptions): it neither discovers nor follows, and is not reconnected.
        self._is_peer = False
        self._clustered = False
        self._nodes: dict[int, str] = {}
        # (topic, partition) -> leader address; partition -1: any (picked by key), -2: metadata.
        self._routes: dict[tuple[str, int], str] = {}
        self._peers: dict[str, Client] = {}
        self._dial_locks: dict[str, asyncio.Lock] = {}
        self._cluster_subs: set[ClusterSubscription] = set()
        self._token = token
        # The protocol version of the connection (the highest both sides speak).
        self._version = p.PROTOCOL_VERSION
        self._wait_first = wait_on_first_connect
        self._user = "" if token is not None else user
        self._password = token if token is not None else password
        self._ssl = ssl
        self._server_hostname = server_hostname
        self._client_name = client_name
        self._heartbeat_ms = heartbeat_ms
        self._publish_window = publish_window
        self._reconnect = reconnect
        self._delay_min = reconnect_delay_min
        self._delay_max = reconnect_delay_max
        self._connect_timeout = connect_timeout

        self._conn: Optional[_Connection] = None
        self._epoch = 0
        self._connected = asyncio.Event()
        self._closed = False
        self._fatal: Optional[BaseException] = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._unconfirmed = 0
        self._window_waiters: deque[asyncio.Future] = deque()
        self._subs: dict[int, Subscription] = {}
        self._all_subs: set[Subscription] = set()
        self._tasks: set[asyncio.Task] = set()
        self._reconnecting: Optional[asyncio.Task] = None
        self._last_sent = 0.0
        self._last_received = 0.0
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._connected_once = False
        self._opening = False
        self.server_info: Optional[p.HelloOk] = None
        #: Called with a BrokerError the broker reports about a request sent without an id
        #: (acks, nacks, credit) or about a consumer; by default it is logged.
        self.on_error = lambda error: log.warning("broker reported: %s", error)
        self.reconnects = 0

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    async def connect(cls, addr: Union[str, Sequence[str], None] = None, **options: Any) -> "Client":
        client = cls(addr, **options)
        await client.open()
        return client

    async def open(self) -> None:
        """Connects and shakes hands. A connection that cannot be made raises
        ``FirstConnectError`` at once, or, with ``wait_on_first_connect=seconds``, after trying
        again with backoff for that long (for a broker that is not up yet). A refusal by the
        broker (bad credentials) raises its ``BrokerError`` at once."""
        if self._closed:
            raise ClientClosed("this client was closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._wait_first or 0.0)
        delay = self._delay_min
        self._opening = True
        if not self._connected_once:
            self._connected.clear()
        try:
            await self._open_retrying(loop, deadline, delay)
        finally:
            self._opening = False
            if not self._connected_once:
                self._connected.set()  # wakes requests that waited for this open: they see it failed

    async def _open_retrying(self, loop: asyncio.AbstractEventLoop, deadline: float, delay: float) -> None:
        while True:
            try:
                await self._establish_any()
                if self._discovers():
                    await self._discover()
                return
            except FirstConnectError:
                raise
            except ConnectionLost as e:
                left = deadline - loop.time()
                if self._wait_first is None or left <= 0 or self._closed:
                    raise FirstConnectError(str(e)) from e.__cause__
                log.info("waiting for %s: %s", ", ".join(self._seeds), e)
                await asyncio.sleep(min(left, delay * (0.5 + random.random())))
                delay = min(delay * 2, self._delay_max)

    async def __aenter__(self) -> "Client":
        if self._conn is None:
            await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Flushes queued acks, closes the connection and fails whatever still waits."""
        if self._closed:
            return
        for sub in list(self._all_subs):
            sub._flush_acks()
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        conn = self._conn
        if conn is not None and conn.transport is not None:
            conn.transport.close()
            try:
                await asyncio.wait_for(asyncio.shield(conn.closed), 2.0)
            except asyncio.TimeoutError:
                conn.transport.abort()
        self._fail_all(ClientClosed("the client was closed"))
        for sub in list(self._all_subs):
            sub._end(None)
        for csub in list(self._cluster_subs):
            csub._stop()
        for t in list(self._tasks):
            t.cancel()
        peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            await peer.close()

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._connected.is_set()

    @property
    def message_bytes_max(self) -> int:
        return self.server_info.message_bytes_max if self.server_info else 256 * 1024

    @property
    def addr(self) -> str:
        """The address of the node this client is (or was last) connected to."""
        return format_address(self.host, self.port)

    @property
    def seeds(self) -> list[str]:
        return list(self._seeds)

    async def _establish_any(self) -> None:
        """Connects to the first candidate that answers: the seeds, then the other nodes the
        cluster named. A refusal (bad credentials) is raised at once."""
        candidates = self._candidates()
        errors: list[str] = []
        for i, addr in enumerate(candidates):
            host, port = parse_address(addr)
            try:
                await self._establish(host, port)
                return
            except ConnectionLost as e:
                if len(candidates) == 1:
                    raise
                errors.append(str(e))
        raise ConnectionLost(f"no node answered: {'; '.join(errors)}")

    async def _establish(self, host: Optional[str] = None, port: Optional[int] = None) -> None:
        loop = self._loop = asyncio.get_running_loop()
        host = self.host if host is None else host
        port = self.port if port is None else port
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self),
                    host,
                    port,
                    ssl=self._ssl,
                    server_hostname=(self._server_hostname or host) if self._ssl else None,
                ),
                self._connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as e:
            raise ConnectionLost(f"cannot connect to {format_address(host, port)}: {e}") from e
        self.host, self.port = host, port
        self._epoch += 1
        self._conn = conn
        now = loop.time()
        self._last_sent = self._last_received = now
        try:
            hello = p.Hello(p.PROTOCOL_VERSION_MIN, p.PROTOCOL_VERSION, self._heartbeat_ms, self._client_name, self._user, self._password)
            rid = self._new_id()
            fut = loop.create_future()
            self._pending[rid] = _Pending(fut, None, 0)
            self._write(p.encode_frame(hello, rid))
            reply = await asyncio.wait_for(fut, self._connect_timeout)
        except BaseException as e:
            conn.abort(e if isinstance(e, Exception) else ConnectionLost("handshake cancelled"))
            if isinstance(e, asyncio.TimeoutError):
                raise ConnectionLost(f"no HELLO_OK from {self.host}:{self.port} within {self._connect_timeout} s") from e
            raise
        assert isinstance(reply, p.HelloOk)
        if not p.PROTOCOL_VERSION_MIN <= reply.version <= p.PROTOCOL_VERSION:
            error = ProtocolError(
                "InvalidValue", "hello_ok.version",
                f"{self.addr} chose protocol version {reply.version}, this client speaks "
                f"{p.PROTOCOL_VERSION_MIN}..={p.PROTOCOL_VERSION}",
            )  # fmt: skip
            conn.abort(error)
            raise error
        self.server_info = reply
        # Frames from here on are in the agreed version's layout.
        self._version = reply.version
        conn.decoder.version = reply.version
        conn.decoder.frame_bytes_max = reply.frame_bytes_max
        self._connected_once = True
        self._connected.set()
        self._spawn(self._heartbeat(conn, reply.heartbeat_ms / 1000))

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _heartbeat(self, conn: _Connection, interval: float) -> None:
        loop = asyncio.get_running_loop()
        ping = p.encode_frame(p.Ping(), 0)
        while self._conn is conn:
            await asyncio.sleep(interval / 4)
            if self._conn is not conn:
                return
            now = loop.time()
            if now - self._last_received > 3 * interval:
                conn.abort(ConnectionLost(f"nothing received from the broker for {3 * interval:.1f} s"))
                return
            if now - self._last_sent >= interval:
                self._write(ping)

    async def _wait_connected(self) -> _Connection:
        if self._closed:
            raise ClientClosed("this client was closed")
        if self._fatal is not None:
            raise ConnectionLost(f"the connection failed for good: {self._fatal}") from self._fatal
        conn = self._conn
        if conn is not None and self._connected.is_set():
            return conn
        if not self._reconnect and self._connected_once:
            raise ConnectionLost("the connection was lost and reconnect=False")
        if not self._connected_once and not self._opening:
            raise FirstConnectError(
                f"never connected to {self.host}:{self.port}: open() the client (or use async with) first"
            )
        try:
            await asyncio.wait_for(self._connected.wait(), self._connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectionLost(
                f"not connected to {self.host}:{self.port} within {self._connect_timeout} s"
            ) from None
        return await self._wait_connected()

    def _on_lost(self, conn: _Connection, exc: Optional[BaseException]) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        self._connected.clear()
        reason = exc if exc is not None else ConnectionLost("the broker closed the connection")
        self._fail_all(reason)
        for sub in self._all_subs:
            sub._detach()
        self._subs.clear()
        fatal = isinstance(exc, BrokerError) and exc.name in ("authentication_failed", "unsupported_version")
        if fatal:
            self._fatal = exc
        if self._closed or not self._reconnect or fatal or not self._connected_once:
            for sub in list(self._all_subs):
                sub._end(ConnectionLost(f"connection lost: {reason}"))
            return
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = self._spawn(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = self._delay_min
        while not self._closed:
            await asyncio.sleep(delay * (0.5 + random.random()))
            try:
                await self._establish_any()
            except BrokerError as e:
                if e.name in ("authentication_failed", "unsupported_version"):
                    self._fatal = e
                    for sub in list(self._all_subs):
                        sub._end(ConnectionLost(f"reconnect refused: {e}"))
                    self._connected.set()  # wakes waiters, who then see _fatal
                    return
                delay = min(delay * 2, self._delay_max)
                continue
            except (ConnectionLost, OSError) as e:
                log.info("reconnect to %s:%s failed: %s", self.host, self.port, e)
                delay = min(delay * 2, self._delay_max)
                continue
            self.reconnects += 1
            log.info("reconnected to %s:%s", self.host, self.port)
            if self._discovers():
                self._spawn(self._discover())
            for sub in list(self._all_subs):
                if not sub._closed:
                    try:
                        await sub._attach()
                    except FerryMQError as e:
                        sub._end(e)
            return

    def _fail_all(self, reason: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if entry.future.done():
                continue
            if entry.topic is not None:
                entry.future.set_exception(ReceiptLost(entry.topic, entry.count, reason))
            elif isinstance(reason, FerryMQError):
                entry.future.set_exception(reason)
            else:
                entry.future.set_exception(ConnectionLost(f"connection lost: {reason}"))
        self._unconfirmed = 0
        self._wake_window()

    # -- the cluster ---------------------------------------------------------------------------
    #
    # A node that is not the leader a request needs answers not_leader naming the leader; the
    # client records where leaders are (``_routes``, from those answers and from CLUSTER_INFO),
    # sends the request there over a connection of its own to that node (``_peers``: the main
    # connection serves it when it is to that node), and follows the leader for up to
    # ``leader_timeout`` seconds when it moves or its node goes away.

    def _discovers(self) -> bool:
        # A broker of protocol version 2 has no cluster.
        return not self._is_peer and self._leader_timeout >= 0 and self._version >= 3

    def _following(self) -> bool:
        """Whether requests that need a leader look for it: in a cluster, or with several
        seeds."""
        return self._discovers() and (self._clustered or len(self._seeds) > 1)

    def _candidates(self) -> list[str]:
        """The addresses to try for any node: the seeds, then the nodes the cluster named."""
        out = list(self._seeds)
        for node_id in sorted(self._nodes):
            a = self._nodes[node_id]
            if a not in out:
                out.append(a)
        return out

    async def _discover(self) -> Optional[p.ClusterInfoReply]:
        """Asks the connected node for the cluster; a failure is not the caller's (ignored)."""
        try:
            reply = await asyncio.wait_for(self._call(p.ClusterInfo()), self._connect_timeout)
        except (FerryMQError, asyncio.TimeoutError) as e:
            log.debug("CLUSTER_INFO from %s failed: %s", self.addr, e)
            return None
        assert isinstance(reply, p.ClusterInfoReply)
        self._learn(reply)
        return reply

    def _learn(self, info: p.ClusterInfoReply) -> None:
        """Records what a node said of the cluster."""
        if info.node_id == 0:
            return
        self._clustered = True
        for n in info.nodes:
            if n.addr:
                self._nodes[n.id] = format_address(*parse_address(n.addr))
        routes = self._routes

        def put(route: tuple[str, int], leader: int) -> None:
            a = self._nodes.get(leader, "") if leader else ""
            if a:
                routes[route] = a
            else:
                routes.pop(route, None)

        put(_METADATA_ROUTE, info.metadata_leader)
        by_topic: dict[str, int] = {}
        for part in info.partitions:
            put((part.topic, part.partition), part.leader)
            seen = by_topic.get(part.topic)
            # Partitions led by different nodes: let not_leader say which.
            by_topic[part.topic] = part.leader if seen is None or seen == part.leader else 0
        for topic, leader in by_topic.items():
            put((topic, -1), leader)

    def _learn_from(self, error: BaseException, route: tuple[str, int], tried: str) -> bool:
        """Records where an error says the leader is. True when a not_leader named a leader at
        another address than the one tried: worth trying at once."""
        if not isinstance(error, NotLeader):
            if tried and self._routes.get(route) == tried:
                del self._routes[route]
            return False
        self._clustered = True
        addr = format_address(*parse_address(error.leader_addr)) if error.leader_addr else ""
        if addr:
            self._nodes[error.leader] = addr
        elif error.leader:
            addr = self._nodes.get(error.leader, "")
        if not addr:
            self._routes.pop(route, None)
            return False
        self._routes[route] = addr
        if error.topic and error.partition >= 0:
            self._routes[(error.topic, error.partition)] = addr
        return addr != tried

    def _peer_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = dict(
            ssl=self._ssl, server_hostname=self._server_hostname, client_name=self._client_name,
            heartbeat_ms=self._heartbeat_ms, publish_window=self._publish_window, reconnect=False,
            connect_timeout=self._connect_timeout, leader_timeout=-1.0,
        )  # fmt: skip
        if self._token is not None:
            opts["token"] = self._token
        else:
            opts["user"], opts["password"] = self._user, self._password
        return opts

    async def _peer(self, addr: str) -> "Client":
        """The connection of this client to the node at ``addr`` (dialled when needed)."""
        if self._closed:
            raise ClientClosed("this client was closed")
        peer = self._peers.get(addr)
        if peer is not None and peer.connected:
            return peer
        lock = self._dial_locks.setdefault(addr, asyncio.Lock())
        async with lock:
            peer = self._peers.get(addr)
            if peer is not None and peer.connected:
                return peer
            if peer is not None:
                del self._peers[addr]
                await peer.close()
            peer = Client(addr, **self._peer_options())
            peer._is_peer = True
            peer.on_error = self.on_error
            try:
                await peer.open()
            except FirstConnectError as e:
                lost = ConnectionLost(str(e))
                lost.sent = False
                raise lost from e
            if self._closed:
                await peer.close()
                raise ClientClosed("this client was closed")
            self._peers[addr] = peer
            return peer

    async def _node(self, addr: str) -> "Client":
        """A connection to the node at ``addr``: the main one when it is to that node."""
        if self.connected and self.addr == addr:
            return self
        return await self._peer(addr)

    async def _any_node(self) -> "Client":
        """A connection to any node: the main one, a peer, or the first candidate that
        answers."""
        if self.connected:
            return self
        for peer in list(self._peers.values()):
            if peer.connected:
                return peer
        errors = []
        for addr in self._candidates():
            try:
                return await self._peer(addr)
            except ConnectionLost as e:
                errors.append(str(e))
        lost = ConnectionLost(f"no node answered: {'; '.join(errors)}")
        lost.sent = False
        raise lost

    async def _leader_node(self, route: tuple[str, int]) -> "Client":
        """The connection for a request that needs the leader of ``route``: where it was last
        found, else any node (which names the leader if it is not)."""
        addr = self._routes.get(route)
        if addr is None:
            return await self._any_node()
        return await self._node(addr)

    async def _refresh(self, timeout: Optional[float] = None) -> None:
        """Asks any node reachable for the cluster, within ``timeout`` (by default
        ``connect_timeout``)."""
        try:
            node = await asyncio.wait_for(self._any_node(), timeout or self._connect_timeout)
            reply = await asyncio.wait_for(node._call(p.ClusterInfo()), timeout or self._connect_timeout)
        except (FerryMQError, asyncio.TimeoutError):
            return
        if isinstance(reply, p.ClusterInfoReply):
            self._learn(reply)

    async def cluster_info(self) -> p.ClusterInfoReply:
        """The cluster's nodes, its metadata leader and each replicated partition's leader and
        replicas, as the node asked sees them. A broker that runs alone (or speaks protocol
        version 2) answers ``node_id`` 0 and empty lists. In a cluster a node that cannot be
        reached is skipped for another."""
        if self._version < 3:
            return p.ClusterInfoReply(0, 0, [], [])
        node = await self._any_node() if self._following() else self
        reply = await node._call(p.ClusterInfo())
        assert isinstance(reply, p.ClusterInfoReply)
        self._learn(reply)
        return reply

    @staticmethod
    def _followable(error: BaseException, safe: Any) -> bool:
        """Whether a request that failed with ``error`` may go to the leader again: it was not
        carried out (not_leader, shutting_down, never sent), or sending it twice is safe."""
        if isinstance(error, NotLeader):
            return True
        if isinstance(error, BrokerError):
            # shutting_down: the node stops and did nothing. storage_unavailable: nothing
            # stored (a resend that met its first attempt still being replicated), or a
            # replication whose outcome is unknown (the leader lost its lead meanwhile).
            return error.name == "shutting_down" or (error.name == "storage_unavailable" and safe())
        if isinstance(error, ConnectionLost):
            return not error.sent or safe()
        return False

    async def _follow(
        self,
        route: tuple[str, int],
        safe: Any,
        tried: str,
        error: BaseException,
        attempt: Any,
        publish: Optional[tuple[str, int]] = None,
    ) -> Any:
        """Sends a request that needs the leader of ``route`` again after ``error``, until it
        succeeds, fails in a way following cannot mend, or ``leader_timeout`` passes (then the
        last error is raised). ``attempt(node)`` sends it once; ``safe()`` says whether sending
        it twice is harmless. A publish (``publish`` = topic and count) whose outcome became
        unknown and is not sent again raises ``ReceiptLost``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._leader_timeout
        delay = 0.02
        quick = 0
        doubt = False
        is_safe: Optional[bool] = None

        def safe_now() -> bool:
            nonlocal is_safe
            if is_safe is None:
                is_safe = bool(safe())
            return is_safe

        while not self._closed and self._discovers():
            if (isinstance(error, ConnectionLost) and error.sent) or (
                isinstance(error, BrokerError) and error.name == "storage_unavailable" and "may or may not" in error.message
            ):
                doubt = True  # sent, and perhaps carried out: sent again only when safe
            if not self._followable(error, safe_now):
                break
            left = deadline - loop.time()
            if left <= 0:
                break
            if self._learn_from(error, route, tried) and quick < 3:
                quick += 1
            else:
                quick = 0
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)
                await self._refresh(max(deadline - loop.time(), 0.001))
            try:
                node = await self._leader_node(route)
            except (BrokerError, ConnectionLost) as e:  # a node refused or did not answer
                error, tried = e, ""
                continue
            tried = node.addr
            try:
                return await attempt(node)
            except ClientClosed:
                if self._closed:
                    raise
                lost = ConnectionLost("the connection to the leader was closed")
                lost.sent = False
                error = lost
            except (BrokerError, ConnectionLost) as e:
                error = e
        if publish is not None and doubt and not isinstance(error, ReceiptLost):
            raise ReceiptLost(publish[0], publish[1], error) from error
        raise error

    async def _leader_call(self, route: tuple[str, int], frame: p.Frame, safe: bool) -> p.Frame:
        """A request that needs the leader of ``route``, followed in a cluster."""
        if not self._following():
            try:
                return await self._call(frame)
            except NotLeader as e:
                if not self._discovers():
                    raise
                self._clustered = True  # a node of a cluster: follow from now on
                return await self._follow(route, lambda: safe, self.addr, e, lambda node: node._call(frame))
        tried = ""
        try:
            node = await self._leader_node(route)
            tried = node.addr
            return await node._call(frame)
        except (BrokerError, ConnectionLost) as e:
            return await self._follow(route, lambda: safe, tried, e, lambda node: node._call(frame))

    async def _start_publish_following(
        self, topic: str, data: bytes, count: int, window_timeout: Optional[float]
    ) -> "asyncio.Future[Receipt]":
        route = (topic, _publish_partition(data))
        tried = ""
        first: Optional[asyncio.Future] = None
        error: Optional[BaseException] = None
        try:
            node = await self._leader_node(route)
            tried = node.addr
            first = await node._start_publish_direct(topic, data, count, window_timeout)
        except (BrokerError, ConnectionLost) as e:
            error = e

        async def attempt(node: Client) -> Receipt:
            return await (await node._start_publish_direct(topic, data, count, window_timeout))

        async def outcome() -> Receipt:
            err = error
            if first is not None:
                try:
                    return await first
                except (BrokerError, ConnectionLost) as e:
                    err = e
            assert err is not None
            return await self._follow(route, lambda: _all_deduplicated(data), tried, err, attempt, (topic, count))

        return asyncio.ensure_future(outcome())

    # -- frames --------------------------------------------------------------------------------

    def _deliver_class(self, consumer_id: int) -> type:
        sub = self._subs.get(consumer_id)
        return p.Delivery if sub is None else sub._cls

    def _new_id(self) -> int:
        rid = self._next_id
        while True:
            rid = (rid + 1) & 0xFFFFFFFF
            if rid and rid not in self._pending:
                self._next_id = rid
                return rid

    def _write(self, data: Union[bytes, bytearray]) -> None:
        conn = self._conn
        if conn is None or conn.transport is None:
            raise ConnectionLost("not connected")
        conn.transport.write(data)
        self._last_sent = self._loop.time()

    def _on_data(self, conn: _Connection, data: bytes) -> None:
        if conn is not self._conn:
            return
        self._last_received = self._loop.time()
        decoder = conn.decoder
        decoder.feed(data)
        try:
            while True:
                got = decoder.next()
                if got is None:
                    return
                rid, frame = got
                if rid:
                    if isinstance(frame, p.Ping):
                        self._write(p.encode_frame(p.Pong(), rid))
                        continue
                    entry = self._pending.pop(rid, None)
                    if entry is None:
                        continue  # an answer to a request given up on (cancelled)
                    fut = entry.future
                    if isinstance(frame, p.Error):
                        error = broker_error(frame.code, frame.message)
                        if not fut.done():
                            fut.set_exception(error)
                        if frame.code in p.CLOSING_ERROR_CODES:
                            conn.abort(error)
                    elif fut.done():
                        pass
                    elif entry.sub is not None and isinstance(frame, p.Subscribed):
                        entry.sub._bind(frame, self._epoch)
                        fut.set_result(frame)
                    elif entry.topic is not None and isinstance(frame, p.Published):
                        fut.set_result(Receipt(entry.topic, frame.durability, tuple(frame.ranges)))
                    else:
                        fut.set_result(frame)
                    if entry.topic is not None:
                        # After the receipt is set, so that a publisher woken by the window
                        # sees the batch before it confirmed.
                        self._unconfirmed -= entry.count
                        if self._window_waiters:
                            self._wake_window()
                elif isinstance(frame, p.Deliver):
                    sub = self._subs.get(frame.consumer_id)
                    if sub is not None:
                        sub._push(frame.deliveries, self._epoch)
                elif isinstance(frame, p.Error):
                    error = broker_error(frame.code, frame.message)
                    if frame.code in p.CLOSING_ERROR_CODES:
                        conn.abort(error)
                        return
                    self.on_error(error)
                # PING and PONG with id 0 only show the peer is alive.
        except ProtocolError as e:
            log.error("malformed frame from the broker: %s", e)
            conn.abort(e)

    async def _request(
        self, frame_bytes: bytes, publish_topic: Optional[str] = None, count: int = 0, sub: Optional["Subscription"] = None
    ) -> p.Frame:
        """Sends an encoded frame (its request id patched in) and waits for its answer."""
        conn = await self._wait_unsent()
        if not conn.writable.is_set():
            await conn.writable.wait()
            conn = await self._wait_unsent()
        rid = self._new_id()
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(fut, publish_topic, count, sub)
        if publish_topic is not None:
            self._unconfirmed += count
        data = bytearray(frame_bytes)
        _U32.pack_into(data, 8, rid)
        self._write(data)
        return await fut

    async def _wait_unsent(self) -> _Connection:
        """``_wait_connected``, whose ConnectionLost says that nothing was sent."""
        try:
            return await self._wait_connected()
        except ConnectionLost as e:
            e.sent = False
            raise

    async def _call(self, frame: p.Frame) -> p.Frame:
        """Sends ``frame`` in the connection's protocol version and waits for its answer."""
        return await self._request(p.encode_frame(frame, 0, self._version))

    # -- publishing ----------------------------------------------------------------------------

    def _wake_window(self) -> None:
        while self._window_waiters:
            w = self._window_waiters.popleft()
            if not w.done():
                w.set_result(None)

    async def _reserve_window(self, count: int, timeout: Optional[float]) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._unconfirmed and self._unconfirmed + count > self._publish_window:
            w = loop.create_future()
            self._window_waiters.append(w)
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise PublishWindowFull(f"{self._unconfirmed} messages still unconfirmed after {timeout} s")
            try:
                await asyncio.wait_for(w, remaining)
            except asyncio.TimeoutError:
                raise PublishWindowFull(
                    f"{self._unconfirmed} messages still unconfirmed after {timeout} s"
                ) from None

    def encode_publish(self, topic: str, messages: Sequence[Union[Body, p.Message]], partition: Optional[int] = None) -> bytes:
        """The PUBLISH frame of ``messages`` (request id 0). Bodies given as bytes are the fast
        path: no key, headers, priority or delay. Raises before anything is sent when a message
        breaks a limit."""
        n = len(messages)
        if n > p.BATCH_COUNT_MAX:
            raise ValueError(f"a batch holds at most {p.BATCH_COUNT_MAX} messages, got {n}")
        limit = self.message_bytes_max
        topic_bytes = topic.encode("utf-8")
        if not 1 <= len(topic_bytes) <= p.NAME_BYTES_MAX:
            raise ValueError(f"a topic name is 1..={p.NAME_BYTES_MAX} bytes of UTF-8, got {topic!r}")
        if partition is not None and not 0 <= partition < p.NO_PARTITION:
            raise ValueError(f"partition must be 0..{p.NO_PARTITION - 1} or None, got {partition}")
        out = bytearray(_HEADER.pack(0, p.Opcode.PUBLISH, 0, 0))
        out += struct.pack("<H", len(topic_bytes))
        out += topic_bytes
        out += struct.pack("<II", p.NO_PARTITION if partition is None else partition, n)
        pack = _RECORD_PREFIX.pack
        for i, m in enumerate(messages):
            if isinstance(m, (bytes, bytearray, memoryview)):
                size = len(m)
                if size > limit:
                    raise MessageTooLarge(i, size, limit)
                out += pack(0, 0, 0, 0, size)
                out += m
            elif isinstance(m, p.Message):
                if len(m.body) > limit:
                    raise MessageTooLarge(i, len(m.body), limit)
                p.encode_record(out, m)
            else:
                raise TypeError(f"message {i}: expected bytes or ferrymq.Message, got {type(m).__name__}")
        if len(out) > (self.server_info.frame_bytes_max if self.server_info else p.FRAME_BYTES_DEFAULT):
            raise ValueError(f"the batch encodes to {len(out)} bytes, above the broker's frame limit: split it")
        _U32.pack_into(out, 0, len(out) - p.FRAME_HEADER_BYTES)
        return bytes(out)

    async def start_publish_batch(
        self,
        topic: str,
        messages: Sequence[Union[Body, p.Message]],
        *,
        partition: Optional[int] = None,
        window_timeout: Optional[float] = None,
    ) -> "asyncio.Future[Receipt]":
        """Sends a batch once the publish window has room and returns a future of its receipt,
        so that one task can keep many batches in flight."""
        data = self.encode_publish(topic, messages, partition)
        return await self._start_publish_frame(topic, data, len(messages), window_timeout)

    def _encode_publish_records(self, topic: str, body: bytes, n: int, partition: Optional[int] = None) -> bytes:
        """The PUBLISH frame of ``n`` records already encoded one after the other in ``body``
        (``protocol.encode_record``'s bytes, limits checked by whoever encoded them), as
        ``encode_publish`` frames messages."""
        if n > p.BATCH_COUNT_MAX:
            raise ValueError(f"a batch holds at most {p.BATCH_COUNT_MAX} messages, got {n}")
        topic_bytes = topic.encode("utf-8")
        if not 1 <= len(topic_bytes) <= p.NAME_BYTES_MAX:
            raise ValueError(f"a topic name is 1..={p.NAME_BYTES_MAX} bytes of UTF-8, got {topic!r}")
        if partition is not None and not 0 <= partition < p.NO_PARTITION:
            raise ValueError(f"partition must be 0..{p.NO_PARTITION - 1} or None, got {partition}")
        head = struct.pack("<H", len(topic_bytes)) + topic_bytes + struct.pack("<II", p.NO_PARTITION if partition is None else partition, n)
        total = p.FRAME_HEADER_BYTES + len(head) + len(body)
        if total > (self.server_info.frame_bytes_max if self.server_info else p.FRAME_BYTES_DEFAULT):
            raise ValueError(f"the batch encodes to {total} bytes, above the broker's frame limit: split it")
        return _HEADER.pack(total - p.FRAME_HEADER_BYTES, p.Opcode.PUBLISH, 0, 0) + head + body

    async def _start_publish_frame(self, topic: str, data: bytes, count: int, window_timeout: Optional[float]) -> "asyncio.Future[Receipt]":
        if not self._following():
            return await self._start_publish_direct(topic, data, count, window_timeout)
        return await self._start_publish_following(topic, data, count, window_timeout)

    async def _start_publish_direct(self, topic: str, data: bytes, count: int, window_timeout: Optional[float]) -> "asyncio.Future[Receipt]":
        await self._reserve_window(count, window_timeout)
        conn = await self._wait_unsent()
        if not conn.writable.is_set():
            await conn.writable.wait()
            await self._wait_unsent()
        rid = self._new_id()
        fut: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(fut, topic, count)
        self._unconfirmed += count
        buf = bytearray(data)
        _U32.pack_into(buf, 8, rid)
        self._write(buf)
        return fut

    async def publish_batch(
        self,
        topic: str,
        messages: Sequence[Union[Body, p.Message]],
        *,
        partition: Optional[int] = None,
        window_timeout: Optional[float] = None,
    ) -> Receipt:
        """Publishes a batch in one frame and waits for its receipt. The whole batch is stored
        or none of it."""
        return await (await self.start_publish_batch(topic, messages, partition=partition, window_timeout=window_timeout))

    async def publish(
        self,
        topic: str,
        body: Body,
        *,
        key: Union[bytes, str, None] = None,
        headers: Optional[Iterable[tuple[str, str]]] = None,
        priority: int = 0,
        delay_ms: Optional[int] = None,
        partition: Optional[int] = None,
        dedup_id: Optional[str] = None,
    ) -> Receipt:
        """Publishes one message and waits for its receipt (``receipt.id``). With ``dedup_id``
        (1 to 256 bytes) a retry within the topic's window is not stored again: its receipt
        carries the first message's id."""
        if dedup_id is not None:
            headers = [*(headers or ()), (DEDUP_ID_HEADER, dedup_id)]
        if key is None and not headers and not priority and delay_ms is None:
            msg: Union[Body, p.Message] = body
        else:
            msg = p.Message(
                bytes(body),
                key.encode("utf-8") if isinstance(key, str) else key,
                list(headers or ()),
                priority,
                delay_ms,
            )
        return await self.publish_batch(topic, [msg], partition=partition)

    # -- admin -----------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int = 0,
        storage: Union[p.Storage, str, None] = None,
        overflow: Union[p.Overflow, str, None] = None,
        max_messages: int = 0,
        max_bytes: int = 0,
        fsync: Union[p.Fsync, str, None] = None,
        fsync_interval_ms: int = 0,
        retention_ms: int = 0,
        retention_policy: Union[p.RetentionPolicy, str] = p.RetentionPolicy.DEFAULT,
        dedup_window_ms: int = 0,
        replicas: int = 0,
        if_not_exists: bool = False,
    ) -> None:
        """Creates a topic. Every setting left out is the broker's default: its storage (disk
        when it has a data dir), overflow, partitions, limits, fsync policy, retention and dedup
        window, and in a cluster ``replicas``, on how many nodes the partitions are kept (1, 3 or
        5; the default is 3 in a cluster of three nodes or more). In a cluster the request goes
        to the metadata leader. With ``if_not_exists``, an existing topic is accepted only with the
        configuration asked for: each field given is compared with the existing topic's, and a
        difference raises ``TopicConfigMismatch``. A user who may not inspect the topic gets no
        comparison."""

        def pick(enum_type, value):
            return enum_type[value.upper().replace("-", "_")] if isinstance(value, str) else value

        storage_v = pick(p.Storage, storage)
        overflow_v = pick(p.Overflow, overflow)
        fsync_v = pick(p.Fsync, fsync)
        config = p.TopicConfig(
            partitions,
            storage_v if storage_v is not None else p.Storage.DEFAULT,
            overflow_v if overflow_v is not None else p.Overflow.DEFAULT,
            max_messages,
            max_bytes,
            fsync_v if fsync_v is not None else p.Fsync.DEFAULT,
            fsync_interval_ms,
            retention_ms,
            pick(p.RetentionPolicy, retention_policy),
            dedup_window_ms,
            replicas,
        )
        # Sent again after a lost connection only when that is safe: with if_not_exists.
        await self._leader_call(_METADATA_ROUTE, p.CreateTopic(name, config, if_not_exists), if_not_exists)
        if not if_not_exists:
            return
        asked = {
            "partitions": partitions or None,
            "storage": storage_v if storage_v != p.Storage.DEFAULT else None,
            "overflow": overflow_v if overflow_v != p.Overflow.DEFAULT else None,
            "retention_policy": config.retention_policy if config.retention_policy != p.RetentionPolicy.DEFAULT else None,
            "dedup_window_ms": dedup_window_ms or None, "replicas": replicas or None,
            "max_messages": max_messages or None, "max_bytes": max_bytes or None,
            "fsync": fsync_v if fsync_v != p.Fsync.DEFAULT else None,
            "fsync_interval_ms": fsync_interval_ms or None, "retention_ms": retention_ms or None,
        }  # fmt: skip
        asked = {k: v for k, v in asked.items() if v is not None}
        if not asked:
            return
        try:
            existing = (await self.describe_topic(name)).config
        except BrokerError as e:
            if e.name == "forbidden":
                return
            raise
        differences = [
            f"{k} {getattr(existing, k)!s} (asked {v!s})" for k, v in asked.items() if getattr(existing, k) != v
        ]
        if differences:
            raise TopicConfigMismatch(name, existing, differences)

    async def delete_topic(self, name: str) -> None:
        """Deletes a topic; in a cluster on the metadata leader."""
        await self._leader_call(_METADATA_ROUTE, p.DeleteTopic(name), False)

    async def list_topics(self) -> list[p.TopicInfo]:
        reply = await self._call(p.ListTopics())
        assert isinstance(reply, p.TopicList)
        return reply.topics

    async def describe_topic(self, name: str) -> p.TopicInfo:
        reply = await self._call(p.DescribeTopic(name))
        assert isinstance(reply, p.TopicInfoFrame)
        return reply.info

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        await self._call(p.DeleteSubscription(topic, subscription))

    async def stats(self, topic: str = "") -> list[p.TopicStats]:
        """Statistics of one topic, or of every topic when ``topic`` is empty."""
        reply = await self._call(p.Stats(topic))
        assert isinstance(reply, p.StatsReply)
        return reply.topics

    async def message_status(self, topic: str, message_id: Union[str, tuple[int, int]]) -> p.MessageStatusReply:
        """Where one message stands in every subscription of its topic."""
        partition, offset = parse_message_id(message_id) if isinstance(message_id, str) else message_id
        reply = await self._call(p.MessageStatus(topic, partition, offset))
        assert isinstance(reply, p.MessageStatusReply)
        return reply

    async def list_messages(
        self,
        topic: str,
        subscription: str,
        kind: Union[p.ListKind, str] = p.ListKind.PENDING,
        *,
        limit: int = 100,
        page: bytes = b"",
    ) -> tuple[list[p.MessageEntry], bytes]:
        """One page of a subscription's messages of ``kind``; the second value is the token of
        the next page, empty at the end."""
        k = p.ListKind[kind.upper()] if isinstance(kind, str) else kind
        reply = await self._call(p.ListMessages(topic, subscription, k, page, limit))
        assert isinstance(reply, p.MessageList)
        return reply.entries, reply.next_page

    async def iter_messages(
        self, topic: str, subscription: str, kind: Union[p.ListKind, str] = p.ListKind.PENDING, *, page_size: int = 100
    ) -> AsyncIterator[p.MessageEntry]:
        """Every entry of a listing, page after page."""
        page = b""
        while True:
            entries, page = await self.list_messages(topic, subscription, kind, limit=page_size, page=page)
            for e in entries:
                yield e
            if not page:
                return

    async def requeue_dead(
        self,
        dead_letter_topic: str,
        *,
        partition: Optional[int] = None,
        first_offset: Optional[int] = None,
        last_offset: Optional[int] = None,
    ) -> p.Requeued:
        """Publishes dead letters again to the subscription they died in: all of them, or the
        offsets ``first_offset..=last_offset`` of one partition of the dead-letter topic."""
        given = (partition, first_offset, last_offset)
        if all(v is None for v in given):
            selection = None
        elif any(v is None for v in given):
            raise ValueError("a range selection needs partition, first_offset and last_offset")
        else:
            selection = (partition, first_offset, last_offset)  # type: ignore[assignment]
        reply = await self._call(p.RequeueDead(dead_letter_topic, selection))  # type: ignore[arg-type]
        assert isinstance(reply, p.Requeued)
        return reply

    # -- users, grants and tokens ----------------------------------------------------------------
    # Passwords and tokens go to the broker and nowhere else: they are never logged and are left
    # out of the frames' reprs. A user without the right gets BrokerError ``forbidden``.

    async def add_user(self, user: str, password: str, *, roles: Roles = p.Role.NONE) -> None:
        """Adds ``user`` with ``password`` (8..=1024 bytes, hashed by the broker) and ``roles``
        (``Role`` bits or names: ``"admin"``, ``"monitor"``). Admin only; an existing user is
        ``conflict``. The new user has no grant: give it some with ``grant``."""
        await self._call(p.UserAdd(user, password, _bits(roles, p.Role)))

    async def remove_user(self, user: str) -> None:
        """Removes ``user``, its grants and tokens. Admin only. Its open connections fail with
        ``authentication_failed`` at their next request."""
        await self._call(p.UserRemove(user))

    async def set_password(self, password: str, *, user: str = "") -> None:
        """Sets the password of ``user``; by default (``user`` empty) the connection's own.
        Another user's password needs admin."""
        await self._call(p.UserPasswd(user, password))

    async def list_users(self) -> list[p.UserEntry]:
        """Every user, by name, with its roles, number of tokens and grants. Admin only."""
        reply = await self._call(p.UserList())
        assert isinstance(reply, p.UserListReply)
        return reply.users

    async def grant(self, user: str, pattern: str = "", actions: Actions = p.Action.NONE, *, roles: Roles = p.Role.NONE) -> None:
        """Gives ``user`` the ``actions`` (``Action`` bits or names: ``"publish"``,
        ``"consume"``, ``"inspect"``, ``"manage"``) on ``pattern`` (a topic name, a prefix
        ending in ``*`` such as ``"orders.*"``, or ``"*"``; empty when only roles change),
        merged into its grant on the same pattern, and ``roles``. Admin only."""
        await self._call(p.Grant(user, pattern, _bits(actions, p.Action), _bits(roles, p.Role)))

    async def revoke(self, user: str, pattern: str = "", actions: Actions = p.Action.NONE, *, roles: Roles = p.Role.NONE) -> None:
        """Takes ``actions`` away from ``user``'s grant on exactly ``pattern`` (a grant left with
        none goes), and ``roles``. Admin only."""
        await self._call(p.Revoke(user, pattern, _bits(actions, p.Action), _bits(roles, p.Role)))

    async def create_token(self, name: str, *, user: str = "", expires_ms: int = 0) -> p.TokenCreated:
        """Creates the API token ``name`` (unique per user) for ``user``, by default the
        connection's own; ``expires_ms`` is the unix time in ms after which it is refused, 0 =
        never. The returned ``token`` is shown this once (the broker keeps only its hash): hand
        it to ``Client(token=...)``. Another user's token needs admin."""
        reply = await self._call(p.TokenCreate(user, name, expires_ms))
        assert isinstance(reply, p.TokenCreated)
        return reply

    async def list_tokens(self, user: str = "") -> list[p.TokenEntry]:
        """The API tokens of ``user`` (by default the connection's own): names and dates, never
        the tokens themselves. Another user's needs admin."""
        reply = await self._call(p.TokenList(user))
        assert isinstance(reply, p.TokenListReply)
        return reply.tokens

    async def revoke_token(self, name: str, *, user: str = "") -> None:
        """Revokes the API token ``name`` of ``user`` (by default the connection's own) at once:
        connections that use it fail at their next request. Another user's needs admin."""
        await self._call(p.TokenRevoke(user, name))

    async def ping(self) -> float:
        """Round trip to the broker, in seconds."""
        loop = asyncio.get_running_loop()
        t = loop.time()
        await self._call(p.Ping())
        return loop.time() - t

    # -- operating (protocol version 3) ---------------------------------------------------------

    async def purge_topic(self, name: str) -> int:
        """Drops every message ``name`` retains, for every subscription (they stay, and get
        what is published next). Needs the ``purge`` action. Returns how many messages it
        held."""
        reply = await self._call(p.PurgeTopic(name))
        assert isinstance(reply, p.Purged)
        return reply.messages

    async def pause_subscription(self, topic: str, subscription: str, paused: bool = True) -> None:
        """Pauses (or, with ``paused=False``, resumes) a subscription's deliveries: its
        consumers stay attached and messages wait. Needs the ``pause`` action."""
        await self._call(p.PauseSubscription(topic, subscription, paused))

    async def list_connections(self, *, after: int = 0, limit: int = 100) -> p.ConnectionList:
        """One page of the broker's open connections (ids above ``after``); pass
        ``next_after`` of the answer for the next page (0: the last). Monitor or admin."""
        reply = await self._call(p.ListConnections(after, limit))
        assert isinstance(reply, p.ConnectionList)
        return reply

    async def close_connection(self, connection_id: int) -> None:
        """Closes another connection of the broker (admin): its in-flight messages go back."""
        await self._call(p.CloseConnection(connection_id))

    # -- consuming -------------------------------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        subscription: str = "",
        *,
        start: Union[str, p.StartKind] = "latest",
        start_value: int = 0,
        credit: int = CREDIT_WINDOW_DEFAULT,
        ack_timeout_ms: int = 0,
        max_attempts: int = 0,
        auto_ack: bool = False,
        ordered: bool = False,
        partitions: Union[str, Sequence[tuple[int, int]], None] = None,
        dead_letter_topic: str = "",
    ) -> "Subscription":
        """Attaches a consumer. ``subscription`` empty = an ephemeral subscription of its own;
        a name joins (or creates) a shared one. ``partitions`` takes ``"1,2,4-7"`` or
        ``[(1, 2), (4, 7)]``; None = every partition. ``credit`` is the window of messages the
        broker may send ahead of the application (in a cluster, of each node).

        In a cluster (the client follows leaders, see ``Client``) this returns a
        ``ClusterSubscription``: attached on every node, since only a partition's leader
        delivers its messages, with the same interface."""
        if not 1 <= credit <= p.CONSUMER_CREDIT_MAX:
            raise ValueError(f"credit window must be 1..={p.CONSUMER_CREDIT_MAX}, got {credit}")
        kind = p.StartKind[start.upper()] if isinstance(start, str) else start
        if isinstance(partitions, str):
            ranges = parse_partition_ranges(partitions)
        else:
            ranges = [tuple(r) for r in (partitions or [])]  # type: ignore[misc]
        request = p.Subscribe(
            topic, subscription, kind, start_value, ack_timeout_ms, max_attempts, credit,
            auto_ack, ordered, ranges, dead_letter_topic,  # type: ignore[arg-type]
        )  # fmt: skip
        p.encode_frame(request)  # checks every field before anything is sent
        if self._following():
            if not self._clustered:
                await self._refresh()
            if self._clustered:
                return await ClusterSubscription._start(self, request)
        sub = Subscription(self, request)
        await sub._attach()
        self._all_subs.add(sub)
        return sub


def parse_partition_ranges(spec: str) -> list[tuple[int, int]]:
    """``"1,2,4-7"`` -> ``[(1, 1), (2, 2), (4, 7)]``."""
    out: list[tuple[int, int]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            a = int(first)
            b = int(last) if sep else a
        except ValueError:
            raise ValueError(f"partition ranges look like '1,2,4-7', got {spec!r}") from None
        if a < 0 or b < a:
            raise ValueError(f"partition range {part!r} in {spec!r} is empty or negative")
        out.append((a, b))
    if not out:
        raise ValueError(f"no partition in {spec!r}")
    return out


class Subscription:
    """One consumer: ``async for message in subscription`` yields ReceivedMessage objects."""

    def __init__(self, client: Client, request: p.Subscribe) -> None:
        self.client = client
        self.request = request
        self.consumer_id: Optional[int] = None
        self.name = request.subscription
        self.partitions = 0
        self._epoch = 0
        self._buffer: deque[ReceivedMessage] = deque()
        self._waiter: Optional[asyncio.Future] = None
        self._taken = 0
        self._step = max(1, request.credit // 2)
        # Offsets waiting to be acked, as (partition, offset, count) runs in ack order.
        self._acks: list[tuple[int, int, int]] = []
        self._flush_scheduled = False
        self._closed = False
        # Set by ``close_releasing``: no credit is granted any more.
        self._draining = False
        self._error: Optional[BaseException] = None
        self._cls: type = ReceivedMessage
        self._loop = client._loop
        # Set by the blocking client, whose application threads settle messages: their frames
        # are then handed to the event loop's thread.
        self._foreign = False

    def _dispatch(self, fn: Any, *args: Any) -> None:
        if self._foreign:
            self._loop.call_soon_threadsafe(fn, *args)
        else:
            fn(*args)

    async def _attach(self) -> None:
        reply = await self.client._request(p.encode_frame(self.request, 0), sub=self)
        assert isinstance(reply, p.Subscribed) and self.consumer_id == reply.consumer_id

    def _bind(self, reply: p.Subscribed, epoch: int) -> None:
        self._cls = type(
            "ReceivedMessage",
            (ReceivedMessage,),
            {"_sub": self, "_epoch": epoch, "settled": self.request.auto_ack, "__module__": __name__},
        )
        self.consumer_id = reply.consumer_id
        self.name = reply.subscription
        self.partitions = reply.partitions
        self._epoch = epoch
        self._taken = 0
        self.client._subs[reply.consumer_id] = self

    def _detach(self) -> None:
        # Buffered messages of the old connection go back to the broker with it; acks of them
        # would be meaningless on a new connection.
        self._flush_acks()
        self._buffer.clear()
        self._acks.clear()
        self.consumer_id = None

    def _end(self, error: Optional[BaseException]) -> None:
        self._closed = True
        self._error = error
        self.client._all_subs.discard(self)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _push(self, deliveries: list, epoch: int) -> None:
        self._buffer.extend(deliveries)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _took(self, n: int) -> None:
        self._taken += n
        if self._taken >= self._step and self.consumer_id is not None and not self._draining:
            credit, self._taken = self._taken, 0
            try:
                self.client._write(_CREDIT.pack(8, p.Opcode.CREDIT, 0, 0, self.consumer_id, credit))
            except ConnectionLost:
                pass  # the subscription is attached again with a full window

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> ReceivedMessage:
        while not self._buffer:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        self._took(1)
        return self._buffer.popleft()

    async def wait_buffered(self) -> bool:
        """Waits until a message is buffered (True) or the subscription has ended with none
        left (False; raises its error if it ended with one), without taking it."""
        while not self._buffer:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return True

    def take_nowait(self) -> Optional[ReceivedMessage]:
        """The next buffered message, or None when none is buffered."""
        if not self._buffer:
            return None
        self._took(1)
        return self._buffer.popleft()

    async def next_batch(self, max_count: int = 1024, timeout: Optional[float] = None) -> list[ReceivedMessage]:
        """Up to ``max_count`` messages, waiting for at least one (an empty list on timeout or
        when the subscription is closed)."""
        if not self._buffer and not self._closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            except asyncio.TimeoutError:
                return []
            finally:
                self._waiter = None
        buf = self._buffer
        if not buf:
            if self._error is not None:
                raise self._error
            return []
        if len(buf) <= max_count:
            out = list(buf)
            buf.clear()
        else:
            out = [buf.popleft() for _ in range(max_count)]
        self._took(len(out))
        return out

    # -- settling --------------------------------------------------------------------------------

    def _queue_ack(self, d: ReceivedMessage) -> None:
        if d._epoch != self._epoch:
            return
        self._acks.append((d[0], d[1], 1))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_acks)

    def ack_all(self, messages: Iterable[ReceivedMessage]) -> None:
        """Acks many messages at once (batched like ``message.ack()``)."""
        msgs = messages if isinstance(messages, list) else list(messages)
        for d in msgs:
            if d.settled:
                raise FerryMQError(f"message {d.id} was already acked or nacked")
        if self._foreign:
            for d in msgs:
                d.settled = True
            self._loop.call_soon_threadsafe(self._ack_all, msgs, False)
        else:
            self._ack_all(msgs, True)

    def _ack_all(self, messages: list[ReceivedMessage], mark: bool) -> None:
        epoch = self._epoch
        # One pass: mark each message settled (unless the caller's thread did), leave out stale
        # ones (from before a reconnect), join consecutive offsets of a partition into one run.
        runs = self._acks
        cur_p = cur_o = cur_n = -1
        for d in messages:
            if mark:
                d.settled = True
            if d._epoch != epoch:
                continue
            part, off = d[0], d[1]
            if off == cur_o + cur_n and part == cur_p:
                cur_n += 1
                continue
            if cur_n > 0:
                runs.append((cur_p, cur_o, cur_n))
            cur_p, cur_o, cur_n = part, off, 1
        if cur_n > 0:
            runs.append((cur_p, cur_o, cur_n))
        if runs and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_acks)

    @staticmethod
    def _ranges(messages: Iterable[ReceivedMessage]) -> list[p.Range]:
        return Subscription._merge((d[0], d[1], 1) for d in messages)

    @staticmethod
    def _merge(runs: Iterable[tuple[int, int, int]]) -> list[p.Range]:
        """Joins runs that continue one another into ranges, keeping their order."""
        out: list[p.Range] = []
        cur_p = cur_o = cur_n = -1
        for part, off, n in runs:
            if off == cur_o + cur_n and part == cur_p:
                cur_n += n
                continue
            if cur_n > 0:
                out.append(p.Range(cur_p, cur_o, cur_n))
            cur_p, cur_o, cur_n = part, off, n
        if cur_n > 0:
            out.append(p.Range(cur_p, cur_o, cur_n))
        return out

    def _encode_acks(self, ranges: list[p.Range], rid: int = 0) -> list[bytes]:
        frames = []
        cid = self.consumer_id
        for i in range(0, len(ranges), p.RANGES_COUNT_MAX):
            chunk = ranges[i : i + p.RANGES_COUNT_MAX]
            body = b"".join(_RANGE.pack(*r) for r in chunk)
            frames.append(_ACK_HEAD.pack(8 + len(body), p.Opcode.ACK, 0, rid, cid, len(chunk)) + body)
        return frames

    def _flush_acks(self) -> None:
        self._flush_scheduled = False
        acks, self._acks = self._acks, []
        if not acks or self.consumer_id is None:
            return
        try:
            for frame in self._encode_acks(self._merge(acks)):
                self.client._write(frame)
        except ConnectionLost:
            pass  # unacked messages go back to the broker with the connection

    def _live(self, messages: list[ReceivedMessage]) -> list[ReceivedMessage]:
        return [d for d in messages if d._epoch == self._epoch]

    def _ack_result_nowait(self, d: ReceivedMessage, result: bytes) -> None:
        if d._epoch != self._epoch or self.consumer_id is None:
            return
        self._flush_acks()
        frame = p.encode_frame(p.AckResult(self.consumer_id, bytes(result), [p.Range(d.partition, d.offset, 1)]))
        try:
            self.client._write(frame)
        except ConnectionLost:
            pass

    async def _ack_confirmed(self, messages: list[ReceivedMessage], result: Optional[bytes]) -> None:
        live = self._live(messages)
        if not live:
            raise ConnectionLost("the connection these messages came on is gone; they will be delivered again")
        self._flush_acks()  # queued acks go first: frames leave in order
        ranges = self._ranges(live)
        if result is None:
            frame = p.encode_frame(p.Ack(self.consumer_id or 0, ranges))
        else:
            frame = p.encode_frame(p.AckResult(self.consumer_id or 0, bytes(result), ranges))
        await self.client._request(frame)

    def _nack(
        self, messages: list[ReceivedMessage], delay_ms: int, dead_letter: bool, reason: str, release: bool = False
    ) -> None:
        live = self._live(messages)
        if not live or self.consumer_id is None:
            return
        self._flush_acks()
        frame = p.encode_frame(p.Nack(self.consumer_id, delay_ms, dead_letter, reason, self._ranges(live), release))
        try:
            self.client._write(frame)
        except ConnectionLost:
            pass

    def nack_all(self, messages: Iterable[ReceivedMessage], delay_ms: int = 0, reason: str = "", dead_letter: bool = False) -> None:
        msgs = list(messages)
        for d in msgs:
            d._settle()
        self._dispatch(self._nack, msgs, delay_ms, dead_letter, reason)

    async def close(self) -> None:
        """Unsubscribes: messages delivered and not acked go back to the subscription."""
        if self._closed:
            return
        self._flush_acks()
        cid = self.consumer_id
        self._end(None)
        if cid is not None and self.client.connected:
            self.client._subs.pop(cid, None)
            try:
                await self.client._call(p.Unsubscribe(cid))
            except ConnectionLost:
                pass

    async def close_releasing(self, unprocessed: Iterable[ReceivedMessage] = (), delay_ms: int = 0) -> int:
        """Unsubscribes like ``close``, first giving back ``unprocessed`` and every buffered
        message not yet taken with NACK's ``release`` flag: their delivery is not counted as an
        attempt, so stopping costs them nothing. No credit is granted once this is called.
        ``delay_ms`` keeps them from being ready again before the unsubscribe is through (else
        the broker may deliver them again to this consumer, and the unsubscribe would give them
        back counted). Returns how many were released. (A delivery still on its way when the
        broker unsubscribes goes back counted, as after any unsubscribe.)"""
        if self._closed:
            return 0
        self._draining = True
        taken = [d for d in unprocessed if not d.settled]
        buffered = list(self._buffer)
        self._buffer.clear()
        messages = self._live(taken + buffered) if not self.request.auto_ack else []
        for d in taken:
            d.settled = True
        self._flush_acks()
        cid = self.consumer_id
        released = 0
        if messages and cid is not None and self.client.connected:
            ranges = self._merge(sorted((d[0], d[1], 1) for d in messages))
            try:
                for i in range(0, len(ranges), p.RANGES_COUNT_MAX):
                    chunk = ranges[i : i + p.RANGES_COUNT_MAX]
                    await self.client._call(p.Nack(cid, delay_ms, False, "", chunk, True))
                released = len(messages)
            except ConnectionLost:
                pass  # they went back with the connection
        await self.close()
        return released

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class _Leg(Subscription):
    """A cluster subscription's consumer on one node: what it receives goes to the cluster
    subscription's buffer, and its messages settle on its node."""

    def __init__(self, client: Client, request: p.Subscribe, parent: "ClusterSubscription") -> None:
        super().__init__(client, request)
        self._parent = parent
        self._foreign = parent._foreign
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()

    def _push(self, deliveries: list, epoch: int) -> None:
        self._parent._push(deliveries)

    def _detach(self) -> None:
        super()._detach()
        self._parent._forget(self)

    def _end(self, error: Optional[BaseException]) -> None:
        super()._end(error)
        self._parent._forget(self)
        if not self.ended.done():
            self.ended.set_result(error)


class ClusterSubscription:
    """A subscription across the nodes of a cluster, as ``Client.subscribe`` returns it there.

    Only a partition's leader delivers its messages and takes their acks, so the subscription
    is attached on every node CLUSTER_INFO names; their deliveries are merged into one stream,
    and each message's ack, nack or release goes to the node that delivered it (by the message
    itself: ``message.ack()`` works as with one broker). A node whose connection breaks is
    attached to again, backing off from 50 ms to 1 s. Cursors are replicated: after a failover
    the new leader goes on from the acknowledged position, so a message acked with
    ``ack_confirmed`` is not delivered again (one acked without confirmation within the last
    moments may be). Messages delivered by a node that went away and not settled are
    delivered again by the next leader.

    It has ``Subscription``'s interface: ``async for``, ``next_batch``, ``take_nowait``,
    ``wait_buffered``, ``ack_all``, ``nack_all``, ``close`` and ``close_releasing``.
    """

    def __init__(self, client: Client, request: p.Subscribe) -> None:
        self.client = client
        self.request = request
        self.consumer_id: Optional[int] = None
        self.name = request.subscription
        self.partitions = 0
        self._buffer: deque[ReceivedMessage] = deque()
        self._waiter: Optional[asyncio.Future] = None
        self._closed = False
        self._draining = False
        self._error: Optional[BaseException] = None
        self._foreign_flag = False
        self._legs: dict[str, _Leg] = {}
        self._runs: dict[str, asyncio.Task] = {}

    @property
    def _foreign(self) -> bool:
        return self._foreign_flag

    @_foreign.setter
    def _foreign(self, value: bool) -> None:
        self._foreign_flag = value
        for leg in self._legs.values():
            leg._foreign = value

    @property
    def nodes(self) -> list[str]:
        """The addresses of the nodes it is attached on now."""
        return sorted(a for a, leg in self._legs.items() if not leg._closed)

    @classmethod
    async def _start(cls, client: Client, request: p.Subscribe) -> "ClusterSubscription":
        self = cls(client, request)
        addrs = sorted(set(client._nodes.values()))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(client._leader_timeout, 0.0)
        delay = REATTACH_DELAY_MIN
        while True:
            results = await asyncio.gather(*(self._attach(a) for a in addrs), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if len(errors) < len(results):
                break
            # Attached nowhere. A topic created a moment ago may not be on the nodes yet, and an
            # election may be under way: those are waited out, up to the leader timeout.
            passing = all(
                isinstance(e, ConnectionLost)
                or (isinstance(e, BrokerError) and e.name in ("unknown_topic", "not_leader", "shutting_down", "storage_unavailable"))
                for e in errors
            )
            if not addrs or not passing or loop.time() + delay > deadline:
                self._stop()
                broker = [e for e in errors if isinstance(e, BrokerError)]
                raise (broker or errors or [ConnectionLost("the cluster named no node")])[0]
            await asyncio.sleep(delay)
            delay = min(delay * 2, REATTACH_DELAY_MAX)
        for addr, result in zip(addrs, results):
            if isinstance(result, asyncio.CancelledError):
                raise result
            leg = None if isinstance(result, BaseException) else result
            self._runs[addr] = client._spawn(self._keep(addr, leg))
        client._cluster_subs.add(self)
        return self

    async def _attach(self, addr: str) -> _Leg:
        node = await self.client._peer(addr)
        leg = _Leg(node, self.request, self)
        await leg._attach()
        node._all_subs.add(leg)
        self._legs[addr] = leg
        if not self.partitions:
            self.partitions = leg.partitions
        if not self.name:
            self.name = leg.name
        return leg

    async def _keep(self, addr: str, leg: Optional[_Leg]) -> None:
        """Keeps the subscription attached on the node at ``addr`` while it is open."""
        delay = REATTACH_DELAY_MIN
        while not self._closed:
            if leg is None:
                try:
                    leg = await self._attach(addr)
                    delay = REATTACH_DELAY_MIN
                except FerryMQError as e:
                    log.debug("attaching %r on %s: %s", self.request.topic, addr, e)
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, REATTACH_DELAY_MAX)
                    continue
            await leg.ended
            if self._legs.get(addr) is leg:
                del self._legs[addr]
            leg = None
            if not self._closed:
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, REATTACH_DELAY_MAX)

    def _push(self, deliveries: list) -> None:
        self._buffer.extend(deliveries)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _forget(self, leg: _Leg) -> None:
        """Drops the buffered messages of a leg that went away: they go back to the broker
        with its connection (acks of them would settle nothing)."""
        buf = self._buffer
        if any(d._sub is leg for d in buf):
            keep = [d for d in buf if d._sub is not leg]
            buf.clear()  # in place: the bus reads this deque
            buf.extend(keep)

    def _stop(self) -> None:
        self._closed = True
        self.client._cluster_subs.discard(self)
        for task in self._runs.values():
            task.cancel()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _end(self, error: Optional[BaseException]) -> None:
        self._error = error
        self._stop()

    @staticmethod
    def _took(messages: Iterable[ReceivedMessage]) -> None:
        for d in messages:
            d._sub._took(1)

    def __aiter__(self) -> "ClusterSubscription":
        return self

    async def __anext__(self) -> ReceivedMessage:
        while not self._buffer:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        d = self._buffer.popleft()
        d._sub._took(1)
        return d

    async def wait_buffered(self) -> bool:
        while not self._buffer:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return True

    def take_nowait(self) -> Optional[ReceivedMessage]:
        if not self._buffer:
            return None
        d = self._buffer.popleft()
        d._sub._took(1)
        return d

    async def next_batch(self, max_count: int = 1024, timeout: Optional[float] = None) -> list[ReceivedMessage]:
        if not self._buffer and not self._closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            except asyncio.TimeoutError:
                return []
            finally:
                self._waiter = None
        buf = self._buffer
        if not buf:
            if self._error is not None:
                raise self._error
            return []
        if len(buf) <= max_count:
            out = list(buf)
            buf.clear()
        else:
            out = [buf.popleft() for _ in range(max_count)]
        self._took(out)
        return out

    @staticmethod
    def _by_leg(messages: Iterable[ReceivedMessage]) -> dict[Subscription, list[ReceivedMessage]]:
        out: dict[Subscription, list[ReceivedMessage]] = {}
        for d in messages:
            out.setdefault(d._sub, []).append(d)
        return out

    def ack_all(self, messages: Iterable[ReceivedMessage]) -> None:
        """Acks many messages at once, each on the node that delivered it."""
        msgs = list(messages)
        for d in msgs:
            if d.settled:
                raise FerryMQError(f"message {d.id} was already acked or nacked")
        for leg, group in self._by_leg(msgs).items():
            leg.ack_all(group)

    def nack_all(self, messages: Iterable[ReceivedMessage], delay_ms: int = 0, reason: str = "", dead_letter: bool = False) -> None:
        for leg, group in self._by_leg(list(messages)).items():
            leg.nack_all(group, delay_ms, reason, dead_letter)

    async def _ack_confirmed(self, messages: list[ReceivedMessage], result: Optional[bytes]) -> None:
        for leg, group in self._by_leg(messages).items():
            await leg._ack_confirmed(group, result)

    def _flush_acks(self) -> None:
        for leg in list(self._legs.values()):
            leg._flush_acks()

    async def close(self) -> None:
        """Unsubscribes on every node: messages delivered and not acked go back."""
        if self._closed:
            return
        legs = list(self._legs.values())
        self._stop()
        self._buffer.clear()
        for leg in legs:
            try:
                await leg.close()
            except FerryMQError as e:
                log.debug("unsubscribing on %s: %s", leg.client.addr, e)

    async def close_releasing(self, unprocessed: Iterable[ReceivedMessage] = (), delay_ms: int = 0) -> int:
        """As ``Subscription.close_releasing``, on every node: each message goes back to the
        node that delivered it."""
        if self._closed:
            return 0
        self._draining = True
        legs = list(self._legs.values())
        groups = self._by_leg([*unprocessed, *self._buffer])
        self._buffer.clear()
        self._stop()
        released = 0
        for leg in legs:
            try:
                released += await leg.close_releasing(groups.get(leg, []), delay_ms)
            except FerryMQError as e:
                log.debug("releasing on %s: %s", leg.client.addr, e)
        return released

    async def __aenter__(self) -> "ClusterSubscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def connect(addr: Union[str, Sequence[str], None] = None, **options: Any) -> Client:
    """``await ferrymq.connect("127.0.0.1:7070")``: a connected Client (by default at
    ``$FERRYMQ_ADDR``, else 127.0.0.1:7070). Several addresses (a list, or separated by
    commas) are the seeds of a cluster."""
    return await Client.connect(addr, **options)
