"""Senders, receivers, handlers and settings of the bus.

A sender publishes a typed message to the topic of its type (by default the type's name; a
template such as ``"{sender}.{type}"`` gives each sending service its own topics), into the
partition equal to the message's *shard*. A topic has as many partitions as the bus has shards.
A receiver subscribes to those topics under its own identity (so every receiving service gets
every message, and the instances of one service share them) and listens to chosen shards
(``"1,2,4-7"``), which become the subscription's partition ranges.

What a receiver does with each message, and why:

- unknown type, unknown serializer, or a body its serializer cannot read: the message is
  dead-lettered at once with the reason; delivering it again cannot help.
- from a sender service the receiver does not listen to (topics shared by every sender): acked
  without handling, counted as ``skipped``.
- ``before_handle`` returns False: the message is acked without handling (``refused``). A
  refusal is the handler's decision about a valid message, not a failure to retry.
- ``handle`` raises: the failure is logged and reported to ``on_error``, and the message is
  nacked with the exception (type and message) as reason and a delay from the handler's
  ``RetryPolicy`` (exponential backoff with jitter); on its last attempt it is dead-lettered
  with that reason, so the dead letter says why.
- otherwise ``after_handle`` runs and the message is acked (``handled``); an exception in
  ``after_handle`` is logged, since the message was handled.

The statistics hook gets every message's outcome, size and UTC times.

Up to ``concurrency`` handlers run at once, with ``prefetch`` messages delivered ahead of them;
``ordered=True`` keeps one message per key in flight (the broker's ordered subscription), so a
retry never overtakes later messages of its key. ``drain()`` (and ``stop()``) takes no new
message, lets the handlers in flight finish within a timeout and gives the messages no handler
started back with NACK's ``release`` flag, so that they come again without an attempt counted.

Rights: a sender needs ``publish`` on its topics, a receiver ``consume`` on its topics. Creating
missing topics needs ``manage``: without it the bus uses the topics an administrator made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import inspect
import logging
import os
import random
import struct
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Generic, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from ..aio import DEFAULT_ADDR, Client, MessageTooLarge, Receipt, ReceivedMessage, Subscription, default_addr, parse_partition_ranges
from ..errors import BrokerError, FerryMQError, TopicConfigMismatch
from .. import protocol as p
from ..protocol import Message
from .schema import Schema, schema_of
from .serializers import JsonSerializer, SerializerUnavailable, Serializers, UnknownSerializer, UnreadableBody, json_encoder

log = logging.getLogger("ferrymq.bus")

_RECORD_PREFIX = struct.Struct("<BBHHI")
_U64 = struct.Struct("<Q")
#: Keys whose shard a sender remembers; the memory is emptied when full.
_SHARD_CACHE_MAX = 65_536

HEADER_TYPE = "x-bus-type"
HEADER_SERIALIZER = "x-bus-serializer"
HEADER_SENDER = "x-bus-sender"
HEADER_SHARD = "x-bus-shard"
HEADER_PREPARED = "x-bus-prepared-ms"
HEADER_SENT = "x-bus-sent-ms"

T = TypeVar("T")
ShardResolver = Callable[[Any, int], int]


class BusError(FerryMQError):
    """A bus misconfiguration: a topic with the wrong partition count, a bad shard..."""


class HandlerError(BusError):
    """A handler raised: what ``on_error`` receives. ``final`` is True when the message was
    dead-lettered (its last attempt), False when it will be delivered again after
    ``delay_ms``."""

    def __init__(self, reason: str, *, message_id: str, type: str, attempt: int, final: bool, delay_ms: int, cause: BaseException) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message_id = message_id
        self.type = type
        self.attempt = attempt
        self.final = final
        self.delay_ms = delay_ms
        self.__cause__ = cause


#: A nack reason is at most this many bytes (the protocol's limit).
REASON_BYTES_MAX = 1024
#: Released messages become ready again after this pause, so that the broker does not deliver
#: them again to the consumer that is leaving before its unsubscribe is through.
RELEASE_DELAY_MS = 100


def bounded(text: str, max_bytes: int = REASON_BYTES_MAX) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, on a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[: max_bytes - 3].decode("utf-8", "ignore") + "..."


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed message is tried again: after ``initial_delay_ms``, multiplied by
    ``multiplier`` at each attempt up to ``max_delay_ms``, each delay spread by +-``jitter``
    (a fraction) so that failures do not come back in step. The delay travels in the NACK, so
    the broker holds the message meanwhile.

    ``max_attempts`` is the subscription's: None leaves it to the broker (its default), and the
    broker then dead-letters the message after its last attempt with its own reason; a number
    is sent in SUBSCRIBE and the receiver dead-letters the last failure itself, with the
    handler's error as the dead letter's ``x-ferrymq-dead-reason``. Every receiver of one
    subscription must use the same ``max_attempts`` (the broker refuses a different one)."""

    max_attempts: Optional[int] = None
    initial_delay_ms: int = 200
    multiplier: float = 2.0
    max_delay_ms: int = 60_000
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts is not None and not 1 <= self.max_attempts <= 0xFFFFFFFF:
            raise BusError(f"max_attempts is at least 1 (or None: the broker's), got {self.max_attempts}")
        if self.initial_delay_ms < 0 or self.max_delay_ms < 0 or self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise BusError("a retry policy has delays >= 0, a multiplier >= 1 and a jitter within 0..=1")

    def delay_ms(self, attempt: int, rand: Callable[[], float] = random.random) -> int:
        """The delay before attempt ``attempt + 1``, after attempt ``attempt`` (1-based) failed."""
        base = min(float(self.max_delay_ms), self.initial_delay_ms * self.multiplier ** max(0, attempt - 1))
        spread = base * self.jitter * (2 * rand() - 1)
        return max(0, min(int(base + spread), 0xFFFFFFFF))

    def is_last(self, attempt: int) -> bool:
        return self.max_attempts is not None and attempt >= self.max_attempts


# -- shards ----------------------------------------------------------------------------------------


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The broker's partition rule: 1..=20 ASCII digits that fit a u64 -> that number mod N;
    any other key -> FNV-1a-64 of its bytes mod N."""
    if 1 <= len(key) <= 20 and key.isdigit() and key.isascii():
        value = int(key)
        if value < 2**64:
            return value % partitions
    return fnv1a64(key) % partitions


def key_bytes(key: Union[int, str, uuid.UUID]) -> bytes:
    """The bytes a key is carried as: decimal ASCII for an int, UTF-8 for a string, the
    36-character form for a UUID."""
    if isinstance(key, bool):
        raise BusError("a bool cannot be a key")
    if isinstance(key, int):
        return str(key).encode("ascii")
    if isinstance(key, uuid.UUID):
        return str(key).encode("ascii")
    if isinstance(key, str):
        return key.encode("utf-8")
    raise BusError(f"a key is an int, a string or a UUID, got {type(key).__name__}")


def shard_for_key(key: Union[int, str, uuid.UUID], shard_count: int) -> int:
    """The default shard of a key: the sum of a UUID's 16 bytes mod N, the broker's partition
    rule for ints and strings."""
    if shard_count < 1:
        raise BusError(f"the shard count must be at least 1, got {shard_count}")
    if isinstance(key, uuid.UUID):
        return sum(key.bytes) % shard_count
    return partition_for_key(key_bytes(key), shard_count)


def parse_shards(spec: str) -> list[tuple[int, int]]:
    """``"1,2,4-7"`` -> inclusive ranges ``[(1, 1), (2, 2), (4, 7)]``."""
    return parse_partition_ranges(spec)


# -- settings --------------------------------------------------------------------------------------


@dataclass
class Settings:
    """Where the bus connects and who it is. ``Settings.load()`` reads arguments, then the
    environment, then the defaults:

    ==================  ==========================  ===============================
    argument            environment                 meaning
    ==================  ==========================  ===============================
    --addr              FERRYMQ_ADDR                broker, host:port
    --identity          FERRYMQ_BUS_IDENTITY        this service's name
    --shards            FERRYMQ_BUS_SHARDS          shard count, the same everywhere
    --listen-services   FERRYMQ_BUS_LISTEN_SERVICES sender services to receive from
    --listen-shards     FERRYMQ_BUS_LISTEN_SHARDS   shards to receive, e.g. 1,2,4-7
    --serializer        FERRYMQ_BUS_SERIALIZER      json, deflate-json, msgpack, protobuf
    ==================  ==========================  ===============================
    """

    #: ``$FERRYMQ_ADDR`` when not given, else 127.0.0.1:7070.
    addr: str = field(default_factory=default_addr)
    identity: str = "NoIdentification"
    shard_count: int = 10
    #: Sender services to receive from; empty = every sender.
    listen_services: list[str] = field(default_factory=list)
    #: Shards to receive, e.g. "1,2,4-7"; None = every shard.
    listen_shards: Optional[str] = None
    serializer: str = "json"
    #: The topic of a type: ``{type}`` is its name, ``{sender}`` the sending service.
    topic_template: str = "{type}"

    def __post_init__(self) -> None:
        if self.shard_count < 1 or self.shard_count > 1024:
            raise BusError(f"the shard count is 1..=1024 (a topic's partitions), got {self.shard_count}")
        if not self.identity or len(self.identity.encode()) > 200:
            raise BusError("the identity is 1..=200 bytes: it names subscriptions and appears in topics")
        if self.listen_shards is not None:
            for _, last in parse_shards(self.listen_shards):
                if last >= self.shard_count:
                    raise BusError(f"shard {last} in {self.listen_shards!r} is not below the shard count {self.shard_count}")

    @classmethod
    def load(cls, argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> "Settings":
        env = os.environ if environ is None else environ
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--addr")
        parser.add_argument("--identity")
        parser.add_argument("--shards", type=int)
        parser.add_argument("--listen-services")
        parser.add_argument("--listen-shards")
        parser.add_argument("--serializer")
        args, _ = parser.parse_known_args(list(argv) if argv is not None else [])

        def pick(arg: Any, var: str) -> Any:
            return arg if arg is not None else env.get(var)

        values: dict[str, Any] = {}
        values["addr"] = pick(args.addr, "FERRYMQ_ADDR") or DEFAULT_ADDR
        identity = pick(args.identity, "FERRYMQ_BUS_IDENTITY")
        if identity:
            values["identity"] = identity
        shards = pick(args.shards, "FERRYMQ_BUS_SHARDS")
        if shards is not None:
            try:
                values["shard_count"] = int(shards)
            except ValueError:
                raise BusError(f"FERRYMQ_BUS_SHARDS is a number, got {shards!r}") from None
        services = pick(args.listen_services, "FERRYMQ_BUS_LISTEN_SERVICES")
        if services:
            values["listen_services"] = [s.strip() for s in services.split(",") if s.strip()]
        listen = pick(args.listen_shards, "FERRYMQ_BUS_LISTEN_SHARDS")
        if listen:
            values["listen_shards"] = listen
        serializer = pick(args.serializer, "FERRYMQ_BUS_SERIALIZER")
        if serializer:
            values["serializer"] = serializer
        values.update(overrides)
        return cls(**values)

    def topic(self, schema: Schema, sender: str) -> str:
        if schema.topic is not None:
            return schema.topic
        return self.topic_template.format(type=schema.name, sender=sender)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


# -- sending ---------------------------------------------------------------------------------------


async def ensure_topic(
    client: Client, topic: str, shard_count: int, storage: str = "disk", create: bool = True, inspect: bool = True
) -> Optional[int]:
    """Creates ``topic`` with ``shard_count`` partitions unless it exists (``create``), and
    returns its partition count (with ``inspect``; None without). Creating needs ``manage`` and
    reading the count ``inspect`` on the topic: a user without them (a sender with only
    ``publish``) gets None, and the bus then relies on the topic an administrator made."""
    if create:
        try:
            await client.create_topic(topic, partitions=shard_count, storage=storage, if_not_exists=True)
        except TopicConfigMismatch as e:
            # Another storage is the administrator's choice; the partitions are checked by the caller.
            return e.existing.partitions  # type: ignore[attr-defined, no-any-return]
        except BrokerError as e:
            if e.name != "forbidden":
                raise
            log.debug("may not create topic %r (%s); using it as it is", topic, e.message)
    if not inspect:
        return None
    try:
        info = await client.describe_topic(topic)
    except BrokerError as e:
        if e.name != "forbidden":
            raise
        return None
    return info.config.partitions


class Sender:
    """Publishes typed messages; ``await sender.send(OrderPlaced(...))``."""

    def __init__(
        self, client: Client, settings: Settings, *, serializers: Optional[Serializers] = None, storage: str = "disk", create_topics: bool = True
    ) -> None:
        self.client = client
        self.settings = settings
        self.serializers = serializers or Serializers()
        self.serializers.get(settings.serializer)  # an unknown or missing serializer fails here
        self._storage = storage
        self._create_topics = create_topics
        self._topics_ready: set[str] = set()
        # key -> (its bytes, its shard) under the default shard rule.
        self._shards: dict[Any, tuple[bytes, int]] = {}
        self._shards_n = settings.shard_count

    def prepare(
        self,
        obj: Any,
        *,
        serializer: Optional[str] = None,
        shard_resolver: Optional[ShardResolver] = None,
        priority: int = 0,
        delay_ms: Optional[int] = None,
    ) -> tuple[str, int, Message]:
        """The topic, shard and broker message of ``obj``, without sending it."""
        schema = schema_of(obj)
        values = schema.check(schema.values(obj))
        key = values[schema.key]
        n = self.settings.shard_count
        if shard_resolver is None:
            shard = shard_for_key(key, n)
        else:
            shard = shard_resolver(key, n)
            if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
                raise BusError(f"the shard resolver returned {shard!r} for {key!r}: a shard is 0..{n - 1}")
        name = serializer or self.settings.serializer
        body = self.serializers.get(name).dumps(schema, values)
        headers = [
            (HEADER_TYPE, schema.name),
            (HEADER_SERIALIZER, name),
            (HEADER_SENDER, self.settings.identity),
            (HEADER_SHARD, str(shard)),
            (HEADER_PREPARED, str(_now_ms())),
        ]
        topic = self.settings.topic(schema, self.settings.identity)
        return topic, shard, Message(body, key_bytes(key), headers, priority, delay_ms)

    async def _ensure_topic(self, topic: str) -> None:
        if topic in self._topics_ready:
            return
        n = self.settings.shard_count
        partitions = await ensure_topic(self.client, topic, n, self._storage, self._create_topics)
        if partitions is not None and partitions != n:
            raise BusError(
                f"topic {topic!r} has {partitions} partitions but the bus has {n} shards: "
                f"every service must use the same shard count (FERRYMQ_BUS_SHARDS)"
            )
        self._topics_ready.add(topic)

    async def send(self, obj: Any, **options: Any) -> Receipt:
        """Publishes one message to its shard and waits for the broker's receipt."""
        topic, shard, message = self.prepare(obj, **options)
        await self._ensure_topic(topic)
        message.headers.append((HEADER_SENT, str(_now_ms())))
        return await self.client.publish_batch(topic, [message], partition=shard)

    def _header_block(self, type_name: str, serializer: str, shard: int, prepared: str, sent: str) -> bytes:
        """The encoded headers of a record, in ``prepare``'s order and then the sent time."""
        block = bytearray()
        for header, value in (
            (HEADER_TYPE, type_name), (HEADER_SERIALIZER, serializer), (HEADER_SENDER, self.settings.identity),
            (HEADER_SHARD, str(shard)), (HEADER_PREPARED, prepared), (HEADER_SENT, sent),
        ):  # fmt: skip
            p._str16(block, header, "record.header.name", 1, p.HEADER_BYTES_MAX)
            p._str16(block, value, "record.header.value", 0, p.HEADER_BYTES_MAX)
        return bytes(block)

    async def send_many(
        self,
        objs: Iterable[Any],
        *,
        serializer: Optional[str] = None,
        shard_resolver: Optional[ShardResolver] = None,
        priority: int = 0,
        delay_ms: Optional[int] = None,
    ) -> list[Receipt]:
        """Publishes many messages, one batch per (topic, shard), several in flight at once.

        The records are the ones ``prepare`` and ``send`` make, encoded for the whole call at
        once: the headers every message of a (type, shard) shares, with one prepared time for
        the call, are encoded once, and a key's shard is computed once."""
        limit = self.client.message_bytes_max
        name = serializer or self.settings.serializer
        ser = self.serializers.get(name)
        p.check_message(Message(b"", None, [], priority, delay_ms))  # the options' limits, as a record's
        flags = 1 | (2 if delay_ms is not None else 0)
        delay = _U64.pack(delay_ms) if delay_ms is not None else b""
        n = self.settings.shard_count
        identity = self.settings.identity
        prepared = str(_now_ms())
        # (topic, shard) -> [type name, record head, body, ...] in the order given, where the
        # head is the record up to its headers (prefix, delay, key); the type name's place
        # takes the encoded headers once the sent time is known.
        groups: dict[tuple[str, int], list[Any]] = {}
        pack = _RECORD_PREFIX.pack
        shards = self._shards if shard_resolver is None else {}
        last_cls: Any = None
        schema: Any = None
        encode: Any = None
        topic = ""
        type_name = ""
        plain_json = type(ser) is JsonSerializer
        for obj in objs:
            cls = type(obj)
            if cls is not last_cls:
                schema = schema_of(obj)
                topic = self.settings.topic(schema, identity)
                encode = json_encoder(schema) if plain_json else None
                type_name = schema.name
                last_cls = cls
            fast = encode(obj) if encode is not None else None
            if fast is None:
                values = schema.check(schema.values(obj))
                key = values[schema.key]
                body = None
            else:
                key, body = fast
            cached = shards.get(key) if type(key) is str or type(key) is int else None
            if cached is None:
                kb = key_bytes(key)
                if len(kb) > p.KEY_BYTES_MAX:
                    raise p._invalid("record.key_len", f"{len(kb)} bytes, limit {p.KEY_BYTES_MAX}")
                if shard_resolver is None:
                    shard = shard_for_key(key, n)
                    if type(key) is str or type(key) is int:
                        if len(shards) >= _SHARD_CACHE_MAX:
                            shards.clear()
                        shards[key] = (kb, shard)
                else:
                    shard = shard_resolver(key, n)
                    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
                        raise BusError(f"the shard resolver returned {shard!r} for {key!r}: a shard is 0..{n - 1}")
            else:
                kb, shard = cached
            if body is None:
                body = ser.dumps(schema, values)
            group = groups.get((topic, shard))
            if group is None:
                group = groups[(topic, shard)] = []
            if len(body) > limit:
                raise MessageTooLarge(len(group) // 3, len(body), limit)
            group.append(type_name)
            group.append(pack(priority, flags, len(kb), 6, len(body)) + delay + kb if delay else pack(priority, flags, len(kb), 6, len(body)) + kb)
            group.append(body)
        for topic, _ in groups:
            await self._ensure_topic(topic)
        sent = str(_now_ms())
        futures = []
        # Each batch goes out as soon as it is joined, so the broker stores one while the
        # next is joined.
        for (topic, shard), flat in groups.items():
            count = len(flat) // 3
            names = flat[0::3]
            first = names[0]
            if names.count(first) == count:
                flat[0::3] = [self._header_block(first, name, shard, prepared, sent)] * count
            else:  # several types on one topic
                blocks = {t: self._header_block(t, name, shard, prepared, sent) for t in set(names)}
                flat[0::3] = [blocks[t] for t in names]
            # Each record is its head, its headers, its body: the first two trade places.
            heads = flat[1::3]
            flat[1::3] = flat[0::3]
            flat[0::3] = heads
            data = self.client._encode_publish_records(topic, b"".join(flat), count, shard)
            futures.append(await self.client._start_publish_frame(topic, data, count, None))
        return list(await asyncio.gather(*futures))


# -- receiving -------------------------------------------------------------------------------------


@dataclass
class Context:
    """What a handler knows about the message it handles."""

    delivery: ReceivedMessage
    type: str
    sender: str
    shard: int
    serializer: str
    attempt: int


@dataclass
class MessageStats:
    """One message's statistics: its outcome (handled, refused, failed, dead_lettered,
    skipped), body size and UTC times (prepared and sent by the sender, received and handled
    here; None when unknown)."""

    message: Any
    type: str
    outcome: str
    size: int
    prepared_at: Optional[datetime]
    sent_at: Optional[datetime]
    received_at: datetime
    handled_at: datetime
    shard: Optional[int]
    sender: Optional[str]
    error: Optional[str] = None


class Handler(Generic[T]):
    """Handles one message type: set ``message_type`` and override ``handle`` (and, if needed,
    ``before_handle`` and ``after_handle``). Methods may be plain or ``async``."""

    message_type: type
    #: This handler's retry policy; None takes the receiver's.
    retry: Optional[RetryPolicy] = None

    def before_handle(self, message: T, context: Context) -> Union[bool, Awaitable[bool]]:
        """Return False to refuse the message: it is acked without handling."""
        return True

    def handle(self, message: T, context: Context) -> Union[None, Awaitable[None]]:
        raise NotImplementedError(f"{type(self).__name__} must implement handle()")

    def after_handle(self, message: T, context: Context) -> Union[None, Awaitable[None]]:
        return None


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        return await result
    return result


_BASE_BEFORE = Handler.before_handle
_BASE_AFTER = Handler.after_handle
#: How many messages a receiver handles in a row, when none of them suspends, before it lets
#: the event loop run.
_EAGER_RUN = 256


class _Resumed:
    """Drives a coroutine that was started outside a task (``coro.send(None)`` yielded
    ``first``) to its end inside the task that awaits this: what it yields goes to that task,
    what the task sends or throws goes to it."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Any, first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Any:
        coro, value = self.coro, self.first
        self.first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:
                try:
                    value = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _resume(coro: Any, first: Any) -> Any:
    return await _Resumed(coro, first)


class Receiver:
    """Receives the message types of ``handlers`` from the listened services and shards.

    ``concurrency`` handlers run at once (1 by default: one message at a time); ``prefetch``
    messages per topic are delivered ahead of them (by default 4 x ``concurrency``). ``ordered``
    keeps at most one message per key in flight, across retries and every instance of the
    service. ``retry`` is the policy of handlers without their own; ``on_error`` gets a
    ``HandlerError`` for each failure (they are logged on the ``ferrymq.bus`` logger either
    way). ``create_topics=False`` never creates topics (no ``manage`` right needed).
    ``drain_timeout`` bounds how long ``stop`` waits for handlers in flight."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        handlers: Sequence[Handler[Any]],
        *,
        on_stats: Optional[Callable[[MessageStats], Any]] = None,
        on_error: Optional[Callable[[BaseException], Any]] = None,
        serializers: Optional[Serializers] = None,
        concurrency: int = 1,
        prefetch: Optional[int] = None,
        ordered: bool = False,
        retry: Optional[RetryPolicy] = None,
        credit: Optional[int] = None,
        ack_timeout_ms: int = 0,
        max_attempts: int = 0,
        start: str = "earliest",
        storage: str = "disk",
        create_topics: bool = True,
        drain_timeout: float = 30.0,
    ) -> None:
        self.client = client
        self.settings = settings
        self.serializers = serializers or Serializers()
        self.on_stats = on_stats
        self.on_error = on_error
        self._handlers: dict[str, tuple[Schema, Handler[Any]]] = {}
        for h in handlers:
            schema = schema_of(h.message_type)
            if schema.name in self._handlers:
                raise BusError(f"two handlers for {schema.name}")
            self._handlers[schema.name] = (schema, h)
        if not self._handlers:
            raise BusError("a receiver needs at least one handler")
        # Handlers of the Handler class whose before_handle and after_handle are the base's.
        self._plain_handlers: frozenset[int] = frozenset(
            id(h) for _, h in self._handlers.values()
            if getattr(type(h), "before_handle", None) is Handler.before_handle and getattr(type(h), "after_handle", None) is Handler.after_handle
            and not {"before_handle", "after_handle"} & set(getattr(h, "__dict__", ()))
        )  # fmt: skip
        if concurrency < 1:
            raise BusError(f"concurrency is at least 1, got {concurrency}")
        if credit is not None and prefetch is None:
            prefetch = credit  # the older name of the setting
        self.concurrency = concurrency
        self.prefetch = prefetch if prefetch is not None else 4 * concurrency
        if not 1 <= self.prefetch <= 1_000_000:
            raise BusError(f"prefetch is 1..=1000000, got {self.prefetch}")
        self.retry = retry if retry is not None else RetryPolicy(max_attempts=max_attempts or None)
        self.ordered = ordered
        self.drain_timeout = drain_timeout
        self._options = dict(ack_timeout_ms=ack_timeout_ms, start=start)
        self._storage = storage
        self._create_topics = create_topics
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task] = []
        self._inflight: set[asyncio.Task] = set()
        # Handlers started and not finished, and the consumer's wait for one of them to end.
        self._busy = 0
        self._slot_free: Optional[asyncio.Future[None]] = None
        # The headers last read and what the bus read from them (see ``_meta``).
        self._meta_of: Optional[tuple] = None
        self._meta_value: tuple = ()
        self._stop_signal: Optional[asyncio.Future[None]] = None
        self._stopped = False
        self.counts: dict[str, int] = {k: 0 for k in ("handled", "refused", "failed", "dead_lettered", "skipped")}

    def _policy(self, handler: Handler[Any]) -> RetryPolicy:
        return handler.retry if handler.retry is not None else self.retry

    def _topics(self) -> list[tuple[str, Optional[str], Handler[Any]]]:
        """(topic, sender it is reserved to or None, handler) for every handled type."""
        out: list[tuple[str, Optional[str], Handler[Any]]] = []
        per_sender = "{sender}" in self.settings.topic_template
        for schema, handler in self._handlers.values():
            if per_sender and schema.topic is None:
                if not self.settings.listen_services:
                    raise BusError("with a {sender} topic template, listen_services must name the senders")
                out += [(self.settings.topic(schema, s), s, handler) for s in self.settings.listen_services]
            else:
                out.append((self.settings.topic(schema, ""), None, handler))
        return out

    async def start(self) -> None:
        """Subscribes to every topic; messages are handled from then on until ``stop``."""
        if self._subs:
            raise BusError("this receiver is already started")
        for name, why in self.serializers.unavailable().items():
            log.warning("receiver %r cannot read %s messages (%s): they are given back, not handled", self.settings.identity, name, why)
        self._stop_signal = asyncio.get_running_loop().create_future()
        self._stopped = False
        try:
            await self._subscribe_all()
        except BaseException:
            await self.drain(0)  # what was attached already is given back, unstarted
            raise

    async def _subscribe_all(self) -> None:
        n = self.settings.shard_count
        for topic, _, handler in self._topics():
            if self._create_topics:
                # The partition count comes with SUBSCRIBED: no inspect right needed.
                await ensure_topic(self.client, topic, n, self._storage, create=True, inspect=False)
            policy = self._policy(handler)
            sub = await self.client.subscribe(
                topic, self.settings.identity, partitions=self.settings.listen_shards, credit=self.prefetch,
                max_attempts=policy.max_attempts or 0, ordered=self.ordered, **self._options,  # type: ignore[arg-type]
            )  # fmt: skip
            if sub.partitions != n:
                await sub.close()
                raise BusError(f"topic {topic!r} has {sub.partitions} partitions but the bus has {n} shards")
            self._subs.append(sub)
            self._tasks.append(asyncio.get_running_loop().create_task(self._consume(sub)))

    async def run(self) -> None:
        """Starts (if needed) and handles messages until ``stop`` or a fatal error."""
        if not self._subs:
            await self.start()
        await asyncio.gather(*self._tasks)

    async def drain(self, timeout: Optional[float] = None) -> int:
        """Stops taking messages, waits up to ``timeout`` seconds (by default
        ``drain_timeout``) for the handlers in flight, gives back the messages no handler
        started (NACK ``release``: no attempt counted) and unsubscribes. A handler still running
        at the timeout is cancelled, and its message goes back counted as an attempt. Returns
        how many messages were given back unstarted."""
        if self._stopped or self._stop_signal is None:
            return 0
        self._stopped = True
        self._stop_signal.set_result(None)
        for task in self._tasks:
            # A consumer waiting for a handler slot stops here; one between awaits (taking a
            # message and starting its handler) has none, so it never leaves a message taken
            # and not started.
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        inflight = set(self._inflight)
        if inflight:
            _, late = await asyncio.wait(inflight, timeout=self.drain_timeout if timeout is None else timeout)
            for t in late:
                log.warning("a handler still ran when the receiver stopped; its message will be delivered again")
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        released = 0
        for sub in self._subs:
            try:
                released += await sub.close_releasing((), RELEASE_DELAY_MS)
            except FerryMQError as e:
                log.warning("giving back the unstarted messages of %r failed: %s", sub.request.topic, e)
        self._subs = []
        self._tasks = []
        return released

    async def stop(self) -> None:
        """``drain()`` with the receiver's ``drain_timeout``."""
        await self.drain()

    async def __aenter__(self) -> "Receiver":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def _until_stopped(self, aw: Awaitable[Any]) -> "asyncio.Future[Any]":
        """Runs ``aw`` until it completes or the receiver stops (then it is cancelled)."""
        assert self._stop_signal is not None
        fut = asyncio.ensure_future(aw)
        await asyncio.wait({fut, self._stop_signal}, return_when=asyncio.FIRST_COMPLETED)
        if not fut.done():
            fut.cancel()
            await asyncio.gather(fut, return_exceptions=True)
        return fut

    async def _consume(self, sub: Subscription) -> None:
        # A message is taken only once a handler slot is free: what is not taken stays in the
        # subscription's buffer, and ``drain`` gives it back unstarted.
        #
        # Each message's processing starts at once in this task (an eager start): a handler
        # that finishes without suspending (a plain function, or a coroutine that never waits)
        # costs no task, no callback and no trip through the event loop; one that suspends goes
        # on in a task of its own from where it stopped, holding its slot until it ends.
        loop = asyncio.get_running_loop()
        buffer = sub._buffer
        run = 0
        while not self._stopped:
            if not buffer:
                run = 0
                ready = await self._until_stopped(sub.wait_buffered())
                if ready.cancelled():
                    return
                if ready.exception() is not None:
                    self._report(ready.exception())  # type: ignore[arg-type]
                    return
                if not ready.result():
                    return
            if self._busy >= self.concurrency:
                # A plain wait: ``drain`` cancels this task. Waiting on the stop signal as well
                # (``_until_stopped``) cost a future and an ``asyncio.wait`` per message
                # whenever every slot was busy, which at concurrency 1 is every message.
                run = 0
                self._slot_free = loop.create_future()
                try:
                    await self._slot_free
                finally:
                    self._slot_free = None
                continue
            if run >= _EAGER_RUN:
                # Let the event loop run (acks go out, frames come in, other tasks get a turn)
                # between runs of messages handled without a pause. No message is taken.
                run = 0
                await asyncio.sleep(0)
                continue
            d = sub.take_nowait()
            if d is None:
                continue
            run += 1
            self._busy += 1
            context = contextvars.copy_context()
            coro = self._process(d)
            try:
                yielded = context.run(coro.send, None)
            except StopIteration:
                self._busy -= 1
                continue
            except BaseException as e:
                self._busy -= 1
                if not isinstance(e, asyncio.CancelledError):
                    self._report(e)
                continue
            task = loop.create_task(_resume(coro, yielded), context=context)
            self._inflight.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        self._busy -= 1
        waiter = self._slot_free
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if not task.cancelled() and task.exception() is not None:
            self._report(task.exception())  # type: ignore[arg-type]

    def _report(self, error: BaseException) -> None:
        if self.on_error is None:
            return
        try:
            result = self.on_error(error)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        except Exception:
            log.exception("the on_error hook raised")

    def _headers(self, d: ReceivedMessage) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in d.headers:
            out.setdefault(name, value)
        return out

    def _meta(self, headers: tuple) -> tuple:
        """What the bus reads from a message's headers: (type, sender, shard, serializer,
        handler entry or None, prepared ms, sent ms), the first value of each header. Records
        of one batch share their decoded headers, so this is computed once for all of them."""
        if headers is self._meta_of:
            return self._meta_value
        type_name = sender = shard_text = serializer_name = prepared = sent = None
        for name, value in headers:
            if name == HEADER_TYPE:
                if type_name is None:
                    type_name = value
            elif name == HEADER_SENDER:
                if sender is None:
                    sender = value
            elif name == HEADER_SHARD:
                if shard_text is None:
                    shard_text = value
            elif name == HEADER_SERIALIZER:
                if serializer_name is None:
                    serializer_name = value
            elif name == HEADER_PREPARED:
                if prepared is None:
                    prepared = value
            elif name == HEADER_SENT:
                if sent is None:
                    sent = value
        type_name = type_name or ""
        shard = int(shard_text) if shard_text and shard_text.isdigit() and shard_text.isascii() else None
        meta = (type_name, sender, shard, serializer_name or "", self._handlers.get(type_name), prepared, sent)
        self._meta_of = headers
        self._meta_value = meta
        return meta

    async def process(self, d: ReceivedMessage) -> str:
        """Handles one delivery and settles it; returns its outcome."""
        return await self._process(d)

    async def _process(self, d: ReceivedMessage) -> str:
        on_stats = self.on_stats
        received_ms = _now_ms() if on_stats is not None else 0
        type_name, sender, shard, serializer_name, entry, prepared, sent = self._meta(d[6])
        obj: Any = None
        error: Optional[str] = None
        outcome: str
        listen = self.settings.listen_services
        if listen and sender not in listen:
            d.ack()
            outcome = "skipped"
        elif entry is None:
            error = bounded(f"no handler for message type {type_name!r} in receiver {self.settings.identity!r}")
            d.dead_letter(error)
            outcome = "dead_lettered"
        else:
            schema, handler = entry
            try:
                obj = schema.build(self.serializers.get(serializer_name).loads(schema, d[8]))
            except SerializerUnavailable as e:
                # A valid message this installation cannot read: not the message's fault.
                error = bounded(f"receiver {self.settings.identity!r} cannot read {serializer_name}: {e}")
                policy = self._policy(handler)
                delay = policy.delay_ms(d.attempt)
                log.error("message %s: %s; given back to be read where it can be", d.id, error)
                d.nack(delay_ms=delay, reason=error)
                self._report(SerializerUnavailable(error))
                outcome = "failed"
            except (UnknownSerializer, UnreadableBody) as e:
                error = f"{type(e).__name__}: {e}"
                d.dead_letter(bounded(error))
                outcome = "dead_lettered"
            except Exception as e:  # the type's own constructor refused the values
                error = f"{schema.name} could not be built: {type(e).__name__}: {e}"
                d.dead_letter(bounded(error))
                outcome = "dead_lettered"
            else:
                ctx = Context(d, type_name, sender or "", shard if shard is not None else -1, serializer_name, d[3])
                if id(handler) in self._plain_handlers:
                    # Neither before_handle nor after_handle overridden: handle, then the ack,
                    # without a coroutine between.
                    try:
                        result = handler.handle(obj, ctx)
                        if result is not None and inspect.isawaitable(result):
                            await result
                    except Exception as e:
                        outcome, error = self._failed(handler, ctx, e)
                    else:
                        d.ack()
                        outcome = "handled"
                else:
                    outcome, error = await self._handle(handler, obj, ctx)
        self.counts[outcome] += 1
        if on_stats is not None:
            stats = MessageStats(
                obj, type_name, outcome, len(d[8]),
                _utc(int(prepared)) if prepared and prepared.isdigit() else None,
                _utc(int(sent)) if sent and sent.isdigit() else None,
                _utc(received_ms), _utc(_now_ms()), shard, sender, error,
            )  # fmt: skip
            try:
                await _call(on_stats, stats)
            except Exception:
                log.exception("the statistics hook raised")
        return outcome

    async def _handle(self, handler: Handler[Any], obj: Any, ctx: Context) -> tuple[str, Optional[str]]:
        d = ctx.delivery
        try:
            # The base class's before_handle (always True) is not called; an override is.
            before = handler.before_handle
            if getattr(before, "__func__", None) is not _BASE_BEFORE:
                if not await _call(before, obj, ctx):
                    d.ack()
                    return "refused", None
            result = handler.handle(obj, ctx)
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception as e:
            return self._failed(handler, ctx, e)
        after = handler.after_handle
        if getattr(after, "__func__", None) is not _BASE_AFTER:
            try:
                await _call(after, obj, ctx)
            except Exception:
                log.exception("after_handle of %s raised; the message was handled and is acked", type(handler).__name__)
        d.ack()
        return "handled", None

    def _failed(self, handler: Handler[Any], ctx: Context, e: Exception) -> tuple[str, Optional[str]]:
        """After ``handle`` raised: the nack with the error and the policy's delay, or the dead
        letter on the last attempt; logged and reported."""
        d = ctx.delivery
        reason = bounded(f"{type(handler).__name__} raised {type(e).__name__}: {e}")
        policy = self._policy(handler)
        final = policy.is_last(d.attempt)
        delay = 0 if final else policy.delay_ms(d.attempt)
        if final:
            log.warning("message %s (%s) failed on its last attempt %d, dead-lettered: %s", d.id, ctx.type, d.attempt, reason)
            d.dead_letter(reason)
        else:
            log.warning("message %s (%s, attempt %d) failed, retried in %d ms: %s", d.id, ctx.type, d.attempt, delay, reason)
            d.nack(delay_ms=delay, reason=reason)
        self._report(HandlerError(reason, message_id=d.id, type=ctx.type, attempt=d.attempt, final=final, delay_ms=delay, cause=e))
        return "failed", reason
