"""The FerryMQ binary protocol, version 3: frames in, bytes out, no I/O.

This module is the codec of ``docs/protocol.md``. It never touches a socket: the clients feed it
bytes and send what it returns, so it can be tested byte by byte against
``protocol/vectors.json``.

Invariants:

- A decoder never trusts a length or a count to allocate: every read checks that its bytes are
  there first, and a count only bounds a loop that reads real bytes.
- A frame's payload must hold exactly its fields: a short payload is ``Truncated``, a long one
  ``TrailingBytes``; nothing is skipped.
- Decoding is canonical: whatever decodes re-encodes to the same bytes. Values the wire could
  carry but the protocol forbids (a start value with ``latest``, a dead-letter position without
  its flag...) are refused rather than dropped.
- Errors name the same kind and field as the Rust codec (``ProtocolError.kind`` is its variant).
"""

from __future__ import annotations

import enum
import operator
import struct
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple, Optional, Sequence, Union

from .errors import ProtocolError

# Limits, the same numbers as crates/ferrymq-protocol/src/limits.rs (the reasons are given there).
PROTOCOL_VERSION = 3
#: The oldest version this codec reads and writes: version 2 lays out the topic config without
#: ``replicas`` and STATS_REPLY without ``paused``, and has none of the version 3 opcodes.
PROTOCOL_VERSION_MIN = 2
FRAME_HEADER_BYTES = 12
FRAME_BYTES_DEFAULT = 16 * 1024 * 1024
NAME_BYTES_MAX = 255
KEY_BYTES_MAX = 1024
HEADERS_COUNT_MAX = 64
HEADER_BYTES_MAX = 4096
BATCH_COUNT_MAX = 65_536
RANGES_COUNT_MAX = 65_536
ACK_RESULT_BYTES_MAX = 4096
LIST_LIMIT_MAX = 1000
LIST_PAGE_BYTES_MAX = 64
PARTITIONS_MAX = 1024
PRIORITY_MAX = 9
DELAY_MS_MAX = 30 * 86_400_000
ERROR_MESSAGE_BYTES_MAX = 1024
LATENCY_BUCKETS = 272
CONSUMER_CREDIT_MAX = 1_000_000
U64_MAX = 2**64 - 1
NO_PARTITION = 0xFFFFFFFF

RECORD_PREFIX_BYTES = 10
DELIVERY_PREFIX_BYTES = 22
RANGE_BYTES = 16


class Opcode(enum.IntEnum):
    HELLO = 0x01
    PING = 0x02
    PONG = 0x03
    CREATE_TOPIC = 0x10
    DELETE_TOPIC = 0x11
    LIST_TOPICS = 0x12
    DESCRIBE_TOPIC = 0x13
    PURGE_TOPIC = 0x14
    PUBLISH = 0x20
    SUBSCRIBE = 0x30
    UNSUBSCRIBE = 0x31
    CREDIT = 0x32
    ACK = 0x33
    NACK = 0x34
    DELETE_SUBSCRIPTION = 0x35
    ACK_RESULT = 0x36
    PAUSE_SUBSCRIPTION = 0x37
    STATS = 0x40
    MESSAGE_STATUS = 0x41
    LIST_MESSAGES = 0x42
    REQUEUE_DEAD = 0x43
    LIST_CONNECTIONS = 0x44
    CLOSE_CONNECTION = 0x45
    USER_ADD = 0x50
    USER_REMOVE = 0x51
    USER_PASSWD = 0x52
    USER_LIST = 0x53
    GRANT = 0x54
    REVOKE = 0x55
    TOKEN_CREATE = 0x56
    TOKEN_LIST = 0x57
    TOKEN_REVOKE = 0x58
    CLUSTER_INFO = 0x60
    HELLO_OK = 0x81
    OK = 0x82
    ERROR = 0x83
    PUBLISHED = 0x84
    TOPIC_LIST = 0x85
    TOPIC_INFO = 0x86
    SUBSCRIBED = 0x87
    DELIVER = 0x88
    STATS_REPLY = 0x89
    MESSAGE_STATUS_REPLY = 0x8A
    MESSAGE_LIST = 0x8B
    REQUEUED = 0x8C
    USER_LIST_REPLY = 0x8D
    TOKEN_CREATED = 0x8E
    TOKEN_LIST_REPLY = 0x8F
    CONNECTION_LIST = 0x90
    PURGED = 0x91
    CLUSTER_INFO_REPLY = 0xA0


class ErrorCode(enum.IntEnum):
    """Error codes of ERROR frames. A peer may send codes this list does not know."""

    MALFORMED_FRAME = 1
    UNSUPPORTED_VERSION = 2
    FRAME_TOO_LARGE = 3
    MESSAGE_TOO_LARGE = 4
    UNKNOWN_TOPIC = 5
    TOPIC_EXISTS = 6
    TOPIC_FULL = 7
    UNKNOWN_CONSUMER = 8
    INVALID_ARGUMENT = 9
    AUTHENTICATION_FAILED = 10
    TOO_MANY_CONNECTIONS = 11
    HANDSHAKE_REQUIRED = 12
    INTERNAL = 13
    UNKNOWN_SUBSCRIPTION = 14
    UNKNOWN_OPCODE = 15
    SHUTTING_DOWN = 16
    LIMIT_EXCEEDED = 17
    STORAGE_UNAVAILABLE = 18
    CONFLICT = 19
    UNKNOWN_MESSAGE = 20
    #: The user may see the topic but not do this to it, or lacks the role the request needs.
    FORBIDDEN = 21
    #: A cluster node does not lead what the request needs; the message names the leader.
    NOT_LEADER = 22


#: Codes after which the server closes the connection.
CLOSING_ERROR_CODES = frozenset({1, 2, 3, 10, 11, 12, 15, 16})


class Storage(enum.IntEnum):
    MEMORY = 0
    DISK = 1
    #: The broker's default (disk when it has a data dir).
    DEFAULT = 2


class Overflow(enum.IntEnum):
    DROP_OLDEST = 0
    REJECT = 1
    #: The broker's default (drop-oldest unless it was started otherwise).
    DEFAULT = 2


class Fsync(enum.IntEnum):
    DEFAULT = 0
    ALWAYS = 1
    INTERVAL = 2
    NEVER = 3


class RetentionPolicy(enum.IntEnum):
    """Whether a topic keeps what every subscription settled: DEFAULT is the server's choice
    (STREAM for disk topics, WORK_QUEUE for memory topics)."""

    DEFAULT = 0
    STREAM = 1
    WORK_QUEUE = 2


class Durability(enum.IntEnum):
    MEMORY = 0
    WRITTEN = 1
    SYNCED_INTERVAL = 2
    SYNCED = 3


class StartKind(enum.IntEnum):
    LATEST = 0
    EARLIEST = 1
    OFFSET = 2
    TIME_MS = 3


class ListKind(enum.IntEnum):
    PENDING = 0
    IN_FLIGHT = 1
    ACKED = 2
    DEAD_LETTERED = 3


class MessageState(enum.IntEnum):
    PENDING = 0
    DELAYED = 1
    IN_FLIGHT = 2
    ACKED = 3
    DEAD_LETTERED = 4
    SETTLED = 5
    #: Published before the subscription existed: never this subscription's to deliver.
    BEFORE_START = 6


class Role(enum.IntFlag):
    """Role bits of a user (USER_ADD, GRANT, REVOKE, USER_LIST_REPLY)."""

    NONE = 0
    #: Everything, users included.
    ADMIN = 1
    #: Inspect every topic, and ``/metrics``.
    MONITOR = 2


class Action(enum.IntFlag):
    """Action bits of a grant on a topic pattern (GRANT, REVOKE, USER_LIST_REPLY)."""

    NONE = 0
    PUBLISH = 1
    #: Subscribe, ack, nack.
    CONSUME = 2
    #: Describe, stats, message status, listings.
    INSPECT = 4
    #: Create, delete, requeue, delete subscriptions (implies purge and pause).
    MANAGE = 8
    #: PURGE_TOPIC (version 3).
    PURGE = 16
    #: PAUSE_SUBSCRIPTION (version 3).
    PAUSE = 32


_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<IHHI")
_RECORD_PREFIX = struct.Struct("<BBHHI")
_DELIVERY_PREFIX = struct.Struct("<IQQH")
_RANGE = struct.Struct("<IQI")


# ---------------------------------------------------------------------------------------------
# Values carried by frames


class Range(NamedTuple):
    """A run of consecutive offsets of one partition: ``offset .. offset + count``."""

    partition: int
    offset: int
    count: int  # type: ignore[assignment]  # the protocol's name; shadows tuple.count


@dataclass(slots=True)
class Message:
    """One message as a publisher sends it (the wire's *record*)."""

    body: bytes
    key: Optional[bytes] = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    priority: int = 0
    deliver_after_ms: Optional[int] = None


class Delivery(tuple):
    """One message as a consumer receives it: where it is stored, when, which attempt, and the
    record's fields. ``headers`` is a tuple of ``(name, value)`` pairs in wire order.

    A tuple, built with one C call per message: decoding a DELIVER frame of thousands of
    messages is the hot path of a consumer, and a Python ``__init__`` per message cost more than
    the rest of the decoding together.
    """

    __slots__ = ()
    _FIELDS = ("partition", "offset", "timestamp_ms", "attempt", "priority", "key", "headers", "deliver_after_ms", "body")

    def __new__(
        cls,
        partition: int,
        offset: int,
        timestamp_ms: int,
        attempt: int,
        priority: int,
        key: Optional[bytes],
        headers: Sequence[tuple[str, str]],
        deliver_after_ms: Optional[int],
        body: bytes,
    ) -> "Delivery":
        return tuple.__new__(cls, (partition, offset, timestamp_ms, attempt, priority, key, tuple(headers), deliver_after_ms, body))

    partition = property(operator.itemgetter(0))
    offset = property(operator.itemgetter(1))
    timestamp_ms = property(operator.itemgetter(2))
    attempt = property(operator.itemgetter(3))
    priority = property(operator.itemgetter(4))
    key = property(operator.itemgetter(5))
    headers = property(operator.itemgetter(6))
    deliver_after_ms = property(operator.itemgetter(7))
    body = property(operator.itemgetter(8))

    @property
    def id(self) -> str:
        """The message id, ``<partition>-<offset>``."""
        return f"{self[0]}-{self[1]}"

    @property
    def message(self) -> Message:
        return Message(body=self[8], key=self[5], headers=list(self[6]), priority=self[4], deliver_after_ms=self[7])

    def header(self, name: str) -> Optional[str]:
        """The first value of header ``name``, or None."""
        for n, v in self[6]:
            if n == name:
                return v
        return None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, attempt={self[3]}, key={self[5]!r}, "
            f"headers={list(self[6])!r}, body={len(self[8])} bytes)"
        )


@dataclass(slots=True)
class TopicConfig:
    partitions: int = 0
    storage: Storage = Storage.DEFAULT
    overflow: Overflow = Overflow.DEFAULT
    max_messages: int = 0
    max_bytes: int = 0
    fsync: Fsync = Fsync.DEFAULT
    fsync_interval_ms: int = 0
    retention_ms: int = 0
    retention_policy: RetentionPolicy = RetentionPolicy.DEFAULT
    dedup_window_ms: int = 0
    #: On how many nodes of a cluster the partitions are kept (1, 3 or 5); 0 = the broker's
    #: default (3 in a cluster of three nodes or more, 1 on a single node).
    replicas: int = 0


@dataclass(slots=True)
class TopicInfo:
    name: str
    config: TopicConfig
    messages: int
    bytes: int
    subscriptions: list[str]


@dataclass(slots=True)
class Latency:
    """A histogram of microsecond values: ``(bucket, count)`` pairs, ascending, non-empty."""

    sum_us: int = 0
    buckets: list[tuple[int, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(c for _, c in self.buckets)


@dataclass(slots=True)
class SubscriptionStats:
    name: str
    ephemeral: bool
    consumers: int
    messages_out: int
    bytes_out: int
    acked: int
    redelivered: int
    backlog: int
    in_flight: int
    gave_up: int
    deliver_latency: Latency
    ack_latency: Latency
    #: Whether an operator paused the subscription's deliveries.
    paused: bool = False


@dataclass(slots=True)
class TopicStats:
    name: str
    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int
    depth: int
    depth_bytes: int
    dropped: int
    publishers: int
    subscribers: int
    subscriptions: list[SubscriptionStats]


@dataclass(slots=True)
class MessageEntry:
    """One message as one subscription sees it."""

    partition: int
    offset: int
    state: MessageState
    attempts: int
    published_ms: int
    first_delivered_ms: int
    settled_ms: int
    due_ms: int
    result: bytes
    reason: str
    #: ``(partition, offset)`` in the dead-letter topic, or None.
    dead_letter: Optional[tuple[int, int]]


@dataclass(slots=True)
class UserEntry:
    """One user of USER_LIST_REPLY: its roles, how many tokens it has, and its grants as
    ``(pattern, actions)`` pairs."""

    name: str
    roles: int
    tokens: int
    grants: list[tuple[str, int]] = field(default_factory=list)


@dataclass(slots=True)
class TokenEntry:
    """One API token of TOKEN_LIST_REPLY: its name and dates (unix ms; ``expires_ms`` 0 =
    never), never its value."""

    name: str
    created_ms: int
    expires_ms: int


@dataclass(slots=True)
class ConnectionEntry:
    """One open connection of CONNECTION_LIST."""

    id: int
    #: 0 binary protocol, 1 HTTP stream.
    listener: int
    tls: bool
    peer: str
    user: str
    client_name: str
    connected_ms: int
    subscriptions: int
    consumers: int
    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int
    credit: int
    unacked: int


@dataclass(slots=True)
class ClusterNode:
    id: int
    #: Its client address, empty while unknown.
    addr: str


@dataclass(slots=True)
class PartitionLeader:
    topic: str
    partition: int
    #: 0: unknown, or an election under way.
    leader: int
    #: The replicas' node ids, the preferred leader first.
    replicas: list[int]


# ---------------------------------------------------------------------------------------------
# Frames. Each has OPCODE, ``_encode(out)`` appending its payload, ``_decode(reader)``.


class Frame:
    OPCODE: ClassVar[Opcode]
    __slots__ = ()


@dataclass(slots=True)
class Hello(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.HELLO
    version_min: int = PROTOCOL_VERSION
    version_max: int = PROTOCOL_VERSION
    heartbeat_ms: int = 0
    client_name: str = ""
    user: str = ""
    password: str = field(default="", repr=False)


@dataclass(slots=True)
class Ping(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PING


@dataclass(slots=True)
class Pong(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PONG


@dataclass(slots=True)
class CreateTopic(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.CREATE_TOPIC
    name: str
    config: TopicConfig = field(default_factory=TopicConfig)
    if_not_exists: bool = False


@dataclass(slots=True)
class DeleteTopic(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.DELETE_TOPIC
    name: str


@dataclass(slots=True)
class ListTopics(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.LIST_TOPICS


@dataclass(slots=True)
class DescribeTopic(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.DESCRIBE_TOPIC
    name: str


@dataclass(slots=True)
class Publish(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PUBLISH
    topic: str
    partition: Optional[int]
    messages: list[Message]


@dataclass(slots=True)
class Subscribe(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.SUBSCRIBE
    topic: str
    subscription: str = ""
    start_kind: StartKind = StartKind.LATEST
    start_value: int = 0
    ack_timeout_ms: int = 0
    max_attempts: int = 0
    credit: int = 0
    auto_ack: bool = False
    ordered: bool = False
    #: Inclusive ``(first, last)`` partition ranges; empty = every partition.
    partitions: list[tuple[int, int]] = field(default_factory=list)
    dead_letter_topic: str = ""


@dataclass(slots=True)
class Unsubscribe(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.UNSUBSCRIBE
    consumer_id: int


@dataclass(slots=True)
class Credit(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.CREDIT
    consumer_id: int
    credit: int


@dataclass(slots=True)
class Ack(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.ACK
    consumer_id: int
    ranges: list[Range]


@dataclass(slots=True)
class Nack(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.NACK
    consumer_id: int
    delay_ms: int
    dead_letter: bool
    reason: str
    ranges: list[Range]
    #: Gives the messages back unprocessed: ready again, the delivery not counted as an attempt.
    release: bool = False


@dataclass(slots=True)
class DeleteSubscription(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.DELETE_SUBSCRIPTION
    topic: str
    subscription: str


@dataclass(slots=True)
class AckResult(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.ACK_RESULT
    consumer_id: int
    result: bytes
    ranges: list[Range]


@dataclass(slots=True)
class Stats(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.STATS
    topic: str = ""


@dataclass(slots=True)
class MessageStatus(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.MESSAGE_STATUS
    topic: str
    partition: int
    offset: int


@dataclass(slots=True)
class ListMessages(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.LIST_MESSAGES
    topic: str
    subscription: str
    kind: ListKind
    page: bytes
    limit: int


@dataclass(slots=True)
class RequeueDead(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.REQUEUE_DEAD
    dead_letter_topic: str
    #: None selects every dead letter; otherwise ``(partition, first_offset, last_offset)``.
    selection: Optional[tuple[int, int, int]] = None


@dataclass(slots=True)
class UserAdd(Frame):
    """Adds a user (admin only). ``roles`` holds ``Role`` bits."""

    OPCODE: ClassVar[Opcode] = Opcode.USER_ADD
    user: str
    password: str = field(repr=False)
    roles: int = 0


@dataclass(slots=True)
class UserRemove(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.USER_REMOVE
    user: str


@dataclass(slots=True)
class UserPasswd(Frame):
    """Sets a password: ``user`` empty = the connection's own user."""

    OPCODE: ClassVar[Opcode] = Opcode.USER_PASSWD
    user: str
    password: str = field(repr=False)


@dataclass(slots=True)
class UserList(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.USER_LIST


@dataclass(slots=True)
class Grant(Frame):
    """Adds ``actions`` (``Action`` bits) on ``pattern`` and ``roles`` (``Role`` bits)."""

    OPCODE: ClassVar[Opcode] = Opcode.GRANT
    user: str
    pattern: str = ""
    actions: int = 0
    roles: int = 0


@dataclass(slots=True)
class Revoke(Frame):
    """Takes ``actions`` away from the grant on exactly ``pattern``, and ``roles``."""

    OPCODE: ClassVar[Opcode] = Opcode.REVOKE
    user: str
    pattern: str = ""
    actions: int = 0
    roles: int = 0


@dataclass(slots=True)
class TokenCreate(Frame):
    """Creates an API token: ``user`` empty = the connection's own; ``expires_ms`` 0 = never."""

    OPCODE: ClassVar[Opcode] = Opcode.TOKEN_CREATE
    user: str
    name: str
    expires_ms: int = 0


@dataclass(slots=True)
class TokenList(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.TOKEN_LIST
    user: str = ""


@dataclass(slots=True)
class TokenRevoke(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.TOKEN_REVOKE
    user: str
    name: str


@dataclass(slots=True)
class HelloOk(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.HELLO_OK
    version: int
    heartbeat_ms: int
    frame_bytes_max: int
    message_bytes_max: int
    server: str


@dataclass(slots=True)
class Ok(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.OK


@dataclass(slots=True)
class Error(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.ERROR
    code: int
    message: str


@dataclass(slots=True)
class Published(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PUBLISHED
    durability: Durability
    ranges: list[Range]


@dataclass(slots=True)
class TopicList(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.TOPIC_LIST
    topics: list[TopicInfo]


@dataclass(slots=True)
class TopicInfoFrame(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.TOPIC_INFO
    info: TopicInfo


@dataclass(slots=True)
class Subscribed(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.SUBSCRIBED
    consumer_id: int
    subscription: str
    partitions: int


@dataclass(slots=True)
class Deliver(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.DELIVER
    consumer_id: int
    deliveries: list[Delivery]


@dataclass(slots=True)
class StatsReply(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.STATS_REPLY
    topics: list[TopicStats]


@dataclass(slots=True)
class MessageStatusReply(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.MESSAGE_STATUS_REPLY
    partition: int
    offset: int
    published_ms: int
    priority: int
    key: Optional[bytes]
    body_bytes: int
    subscriptions: list[tuple[str, MessageEntry]]


@dataclass(slots=True)
class MessageList(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.MESSAGE_LIST
    entries: list[MessageEntry]
    next_page: bytes


@dataclass(slots=True)
class Requeued(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.REQUEUED
    requeued: int
    skipped: int


@dataclass(slots=True)
class UserListReply(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.USER_LIST_REPLY
    users: list[UserEntry]


@dataclass(slots=True)
class TokenCreated(Frame):
    """A new API token. ``token`` is shown this once (the broker keeps only its hash) and is
    left out of the repr."""

    OPCODE: ClassVar[Opcode] = Opcode.TOKEN_CREATED
    name: str
    token: str = field(repr=False)
    expires_ms: int = 0


@dataclass(slots=True)
class TokenListReply(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.TOKEN_LIST_REPLY
    tokens: list[TokenEntry]


@dataclass(slots=True)
class PurgeTopic(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PURGE_TOPIC
    name: str


@dataclass(slots=True)
class Purged(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PURGED
    #: Messages the topic retained before the purge.
    messages: int


@dataclass(slots=True)
class PauseSubscription(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.PAUSE_SUBSCRIPTION
    topic: str
    subscription: str
    #: False resumes.
    paused: bool = True


@dataclass(slots=True)
class ListConnections(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.LIST_CONNECTIONS
    after: int = 0
    limit: int = 100


@dataclass(slots=True)
class ConnectionList(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.CONNECTION_LIST
    total: int
    next_after: int
    connections: list[ConnectionEntry]


@dataclass(slots=True)
class CloseConnection(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.CLOSE_CONNECTION
    id: int


@dataclass(slots=True)
class ClusterInfo(Frame):
    OPCODE: ClassVar[Opcode] = Opcode.CLUSTER_INFO


@dataclass(slots=True)
class ClusterInfoReply(Frame):
    """The cluster as one node sees it. ``node_id`` 0: a broker that runs alone (the lists are
    empty)."""

    OPCODE: ClassVar[Opcode] = Opcode.CLUSTER_INFO_REPLY
    node_id: int
    #: The node that creates and deletes topics; 0 while unknown.
    metadata_leader: int
    nodes: list[ClusterNode]
    partitions: list[PartitionLeader]

    def addr(self, node_id: int) -> str:
        """The client address of node ``node_id``, empty when unknown."""
        for n in self.nodes:
            if n.id == node_id:
                return n.addr
        return ""

    def leader(self, topic: str, partition: int) -> int:
        """The leader of a partition, 0 when unknown."""
        for pl in self.partitions:
            if pl.topic == topic and pl.partition == partition:
                return pl.leader
        return 0


AnyFrame = Union[
    Hello, Ping, Pong, CreateTopic, DeleteTopic, ListTopics, DescribeTopic, Publish, Subscribe,
    Unsubscribe, Credit, Ack, Nack, DeleteSubscription, AckResult, Stats, MessageStatus,
    ListMessages, RequeueDead, HelloOk, Ok, Error, Published, TopicList, TopicInfoFrame,
    Subscribed, Deliver, StatsReply, MessageStatusReply, MessageList, Requeued, UserAdd,
    UserRemove, UserPasswd, UserList, Grant, Revoke, TokenCreate, TokenList, TokenRevoke,
    UserListReply, TokenCreated, TokenListReply, PurgeTopic, Purged, PauseSubscription,
    ListConnections, ConnectionList, CloseConnection, ClusterInfo, ClusterInfoReply,
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Encoding


def _invalid(field_name: str, reason: str) -> ProtocolError:
    return ProtocolError("InvalidValue", field_name, f"invalid {field_name}: {reason}")


def _str16(out: bytearray, text: str, field_name: str, min_len: int = 0, max_len: int = 65535) -> None:
    data = text.encode("utf-8")
    if not min_len <= len(data) <= max_len:
        raise _invalid(field_name, f"{len(data)} bytes, must be {min_len}..={max_len}")
    out += _U16.pack(len(data))
    out += data


def _bytes16(out: bytearray, data: bytes, field_name: str, max_len: int) -> None:
    if len(data) > max_len:
        raise _invalid(field_name, f"{len(data)} bytes, above the limit of {max_len}")
    out += _U16.pack(len(data))
    out += data


def _check_u(value: int, bits: int, field_name: str) -> int:
    if not isinstance(value, int) or value < 0 or value >> bits:
        raise _invalid(field_name, f"{value!r} is not a u{bits}")
    return value


def check_message(message: Message, message_bytes_max: Optional[int] = None) -> None:
    """Raises ProtocolError if ``message`` breaks a protocol limit (the broker would refuse it)."""
    if not isinstance(message.body, (bytes, bytearray, memoryview)):
        raise _invalid("record.body", f"must be bytes, got {type(message.body).__name__}")
    if not 0 <= message.priority <= PRIORITY_MAX:
        raise _invalid("record.priority", f"{message.priority} is not within 0..={PRIORITY_MAX}")
    if message.key is not None and len(message.key) > KEY_BYTES_MAX:
        raise _invalid("record.key_len", f"{len(message.key)} bytes, limit {KEY_BYTES_MAX}")
    if len(message.headers) > HEADERS_COUNT_MAX:
        raise _invalid("record.header_count", f"{len(message.headers)}, limit {HEADERS_COUNT_MAX}")
    if message.deliver_after_ms is not None and not 0 <= message.deliver_after_ms <= DELAY_MS_MAX:
        raise _invalid(
            "record.deliver_after_ms", f"{message.deliver_after_ms} is not within 0..={DELAY_MS_MAX}"
        )
    if message_bytes_max is not None and len(message.body) > message_bytes_max:
        raise _invalid(
            "record.body", f"{len(message.body)} bytes, above the broker's limit of {message_bytes_max}"
        )


def encode_record(out: bytearray, message: Message) -> None:
    """Appends ``message`` as a record. Checks every limit the decoder checks."""
    check_message(message)
    key = message.key
    flags = (1 if key is not None else 0) | (2 if message.deliver_after_ms is not None else 0)
    headers = message.headers
    out += _RECORD_PREFIX.pack(
        message.priority, flags, len(key) if key is not None else 0, len(headers), len(message.body)
    )
    if message.deliver_after_ms is not None:
        out += _U64.pack(message.deliver_after_ms)
    if key is not None:
        out += key
    for name, value in headers:
        _str16(out, name, "record.header.name", 1, HEADER_BYTES_MAX)
        _str16(out, value, "record.header.value", 0, HEADER_BYTES_MAX)
    out += message.body


def _encode_ranges(out: bytearray, ranges: list[Range]) -> None:
    if len(ranges) > RANGES_COUNT_MAX:
        raise _invalid("ranges.count", f"{len(ranges)}, limit {RANGES_COUNT_MAX}")
    out += _U32.pack(len(ranges))
    pack = _RANGE.pack
    for p, o, c in ranges:
        if o + c > U64_MAX:
            raise _invalid("range", "offset + count overflows")
        out += pack(p, o, c)


def _encode_config(out: bytearray, c: TopicConfig, version: int = PROTOCOL_VERSION) -> None:
    out += struct.pack("<IBBQQBIQBQ", c.partitions, c.storage, c.overflow, c.max_messages,
                       c.max_bytes, c.fsync, c.fsync_interval_ms, c.retention_ms,
                       c.retention_policy, c.dedup_window_ms)  # fmt: skip
    if version >= 3:
        out += _U8.pack(_check_u(c.replicas, 8, "topic.replicas"))
    elif c.replicas:
        raise _invalid("topic.replicas", f"{c.replicas}: replicas needs protocol version 3, the connection speaks {version}")


def _encode_topic_info(out: bytearray, t: TopicInfo, version: int = PROTOCOL_VERSION) -> None:
    _str16(out, t.name, "topic_info.name")
    _encode_config(out, t.config, version)
    out += struct.pack("<QQI", t.messages, t.bytes, len(t.subscriptions))
    for s in t.subscriptions:
        _str16(out, s, "topic_info.subscription")


def _encode_latency(out: bytearray, h: Latency) -> None:
    out += struct.pack("<QH", h.sum_us, len(h.buckets))
    for b, c in h.buckets:
        out += struct.pack("<HQ", b, c)


def _encode_entry(out: bytearray, e: MessageEntry) -> None:
    out += struct.pack("<IQBHQQQQ", e.partition, e.offset, e.state, e.attempts, e.published_ms,
                       e.first_delivered_ms, e.settled_ms, e.due_ms)  # fmt: skip
    _bytes16(out, e.result, "message_entry.result", ACK_RESULT_BYTES_MAX)
    _str16(out, e.reason, "message_entry.reason")
    if e.dead_letter is None:
        out += struct.pack("<BIQ", 0, 0, 0)
    else:
        out += struct.pack("<BIQ", 1, e.dead_letter[0], e.dead_letter[1])


#: Opcodes of protocol version 3: refused on connections of older versions.
V3_OPCODES = frozenset({
    Opcode.PURGE_TOPIC, Opcode.PAUSE_SUBSCRIPTION, Opcode.LIST_CONNECTIONS, Opcode.CLOSE_CONNECTION,
    Opcode.CLUSTER_INFO, Opcode.CONNECTION_LIST, Opcode.PURGED, Opcode.CLUSTER_INFO_REPLY,
})  # fmt: skip


def _check_version(opcode: int, version: int) -> None:
    if version < 3 and opcode in V3_OPCODES:
        raise ProtocolError(
            "UnknownOpcode", None, f"{Opcode(opcode).name} needs protocol version 3; the connection speaks {version}"
        )


def encode_payload(frame: Frame, version: int = PROTOCOL_VERSION) -> bytes:
    """The payload of ``frame`` in the layout of protocol ``version``, without the header."""
    _check_version(frame.OPCODE, version)
    out = bytearray()
    f: object = frame
    if isinstance(f, (Ping, Pong, ListTopics, Ok, UserList, ClusterInfo)):
        pass
    elif isinstance(f, Hello):
        out += struct.pack("<HHI", f.version_min, f.version_max, f.heartbeat_ms)
        _str16(out, f.client_name, "hello.client_name")
        _str16(out, f.user, "hello.user")
        _str16(out, f.password, "hello.password")
    elif isinstance(f, CreateTopic):
        _str16(out, f.name, "create_topic.name", 1, NAME_BYTES_MAX)
        _encode_config(out, f.config, version)
        out += _U8.pack(1 if f.if_not_exists else 0)
    elif isinstance(f, DeleteTopic):
        _str16(out, f.name, "delete_topic.name", 1, NAME_BYTES_MAX)
    elif isinstance(f, DescribeTopic):
        _str16(out, f.name, "describe_topic.name", 1, NAME_BYTES_MAX)
    elif isinstance(f, Publish):
        if len(f.messages) > BATCH_COUNT_MAX:
            raise _invalid("batch.count", f"{len(f.messages)}, limit {BATCH_COUNT_MAX}")
        _str16(out, f.topic, "publish.topic", 1, NAME_BYTES_MAX)
        out += _U32.pack(NO_PARTITION if f.partition is None else f.partition)
        out += _U32.pack(len(f.messages))
        for m in f.messages:
            encode_record(out, m)
    elif isinstance(f, Subscribe):
        _str16(out, f.topic, "subscribe.topic", 1, NAME_BYTES_MAX)
        _str16(out, f.subscription, "subscribe.subscription", 0, NAME_BYTES_MAX)
        if f.start_kind in (StartKind.LATEST, StartKind.EARLIEST) and f.start_value != 0:
            raise _invalid("subscribe.start_value", "must be 0 for latest and earliest")
        if f.auto_ack and f.ordered:
            raise _invalid("subscribe.flags", "ordered delivery needs acks: not with auto_ack")
        if len(f.partitions) > PARTITIONS_MAX:
            raise _invalid("subscribe.partitions", f"{len(f.partitions)} ranges, limit {PARTITIONS_MAX}")
        flags = (1 if f.auto_ack else 0) | (2 if f.ordered else 0)
        out += struct.pack("<BQIIIBH", f.start_kind, f.start_value, f.ack_timeout_ms,
                           f.max_attempts, f.credit, flags, len(f.partitions))  # fmt: skip
        for first, last in f.partitions:
            if first > last:
                raise _invalid("subscribe.partitions", f"range {first}-{last} ends before it starts")
            out += struct.pack("<II", first, last)
        _str16(out, f.dead_letter_topic, "subscribe.dead_letter_topic", 0, NAME_BYTES_MAX)
    elif isinstance(f, Unsubscribe):
        out += _U32.pack(f.consumer_id)
    elif isinstance(f, Credit):
        out += struct.pack("<II", f.consumer_id, f.credit)
    elif isinstance(f, Ack):
        out += _U32.pack(f.consumer_id)
        _encode_ranges(out, f.ranges)
    elif isinstance(f, Nack):
        if f.dead_letter and f.release:
            raise _invalid("nack.flags", "a NACK either dead-letters or releases its messages, not both")
        out += struct.pack("<IIB", f.consumer_id, f.delay_ms, (1 if f.dead_letter else 0) | (2 if f.release else 0))
        _str16(out, f.reason, "nack.reason", 0, ERROR_MESSAGE_BYTES_MAX)
        _encode_ranges(out, f.ranges)
    elif isinstance(f, DeleteSubscription):
        _str16(out, f.topic, "delete_subscription.topic", 1, NAME_BYTES_MAX)
        _str16(out, f.subscription, "delete_subscription.subscription", 1, NAME_BYTES_MAX)
    elif isinstance(f, AckResult):
        out += _U32.pack(f.consumer_id)
        _bytes16(out, f.result, "ack_result.result", ACK_RESULT_BYTES_MAX)
        _encode_ranges(out, f.ranges)
    elif isinstance(f, Stats):
        _str16(out, f.topic, "stats.topic", 0, NAME_BYTES_MAX)
    elif isinstance(f, MessageStatus):
        _str16(out, f.topic, "message_status.topic", 1, NAME_BYTES_MAX)
        out += struct.pack("<IQ", f.partition, f.offset)
    elif isinstance(f, ListMessages):
        _str16(out, f.topic, "list_messages.topic", 1, NAME_BYTES_MAX)
        _str16(out, f.subscription, "list_messages.subscription", 1, NAME_BYTES_MAX)
        out += _U8.pack(f.kind)
        _bytes16(out, f.page, "list_messages.page", LIST_PAGE_BYTES_MAX)
        if not 1 <= f.limit <= LIST_LIMIT_MAX:
            raise _invalid("list_messages.limit", f"{f.limit} is not within 1..={LIST_LIMIT_MAX}")
        out += _U32.pack(f.limit)
    elif isinstance(f, RequeueDead):
        _str16(out, f.dead_letter_topic, "requeue_dead.dead_letter_topic", 1, NAME_BYTES_MAX)
        if f.selection is None:
            out += struct.pack("<BIQQ", 0, 0, 0, 0)
        else:
            p, first, last = f.selection
            if last < first:
                raise _invalid("requeue_dead.last_offset", f"range {first}..={last} ends before it starts")
            out += struct.pack("<BIQQ", 1, p, first, last)
    elif isinstance(f, HelloOk):
        out += struct.pack("<HIII", f.version, f.heartbeat_ms, f.frame_bytes_max, f.message_bytes_max)
        _str16(out, f.server, "hello_ok.server")
    elif isinstance(f, Error):
        out += _U16.pack(f.code)
        _str16(out, f.message, "error.message", 0, ERROR_MESSAGE_BYTES_MAX)
    elif isinstance(f, Published):
        out += _U8.pack(f.durability)
        _encode_ranges(out, f.ranges)
    elif isinstance(f, TopicList):
        out += _U32.pack(len(f.topics))
        for t in f.topics:
            _encode_topic_info(out, t, version)
    elif isinstance(f, TopicInfoFrame):
        _encode_topic_info(out, f.info, version)
    elif isinstance(f, Subscribed):
        out += _U32.pack(f.consumer_id)
        _str16(out, f.subscription, "subscribed.subscription")
        out += _U32.pack(f.partitions)
    elif isinstance(f, Deliver):
        out += struct.pack("<II", f.consumer_id, len(f.deliveries))
        for d in f.deliveries:
            out += _DELIVERY_PREFIX.pack(d.partition, d.offset, d.timestamp_ms, d.attempt)
            encode_record(out, d.message)
    elif isinstance(f, StatsReply):
        out += _U32.pack(len(f.topics))
        for ts in f.topics:
            _str16(out, ts.name, "stats.topic.name")
            out += struct.pack("<QQQQQQQIII", ts.messages_in, ts.bytes_in, ts.messages_out,
                               ts.bytes_out, ts.depth, ts.depth_bytes, ts.dropped, ts.publishers,
                               ts.subscribers, len(ts.subscriptions))  # fmt: skip
            for ss in ts.subscriptions:
                _str16(out, ss.name, "stats.subscription.name")
                out += struct.pack("<BIQQQQQQQ", 1 if ss.ephemeral else 0, ss.consumers,
                                   ss.messages_out, ss.bytes_out, ss.acked, ss.redelivered,
                                   ss.backlog, ss.in_flight, ss.gave_up)  # fmt: skip
                _encode_latency(out, ss.deliver_latency)
                _encode_latency(out, ss.ack_latency)
                if version >= 3:
                    out += _U8.pack(1 if ss.paused else 0)
    elif isinstance(f, MessageStatusReply):
        out += struct.pack("<IQQBB", f.partition, f.offset, f.published_ms, f.priority,
                           0 if f.key is None else 1)  # fmt: skip
        _bytes16(out, f.key or b"", "message_status.key", KEY_BYTES_MAX)
        out += struct.pack("<II", f.body_bytes, len(f.subscriptions))
        for name, entry in f.subscriptions:
            _str16(out, name, "message_status.subscription")
            _encode_entry(out, entry)
    elif isinstance(f, MessageList):
        out += _U32.pack(len(f.entries))
        for e in f.entries:
            _encode_entry(out, e)
        _bytes16(out, f.next_page, "message_list.next_page", LIST_PAGE_BYTES_MAX)
    elif isinstance(f, Requeued):
        out += struct.pack("<QQ", f.requeued, f.skipped)
    elif isinstance(f, UserAdd):
        _str16(out, f.user, "user_add.user")
        _str16(out, f.password, "user_add.password")
        out += _U8.pack(_check_u(f.roles, 8, "user_add.roles"))
    elif isinstance(f, UserRemove):
        _str16(out, f.user, "user_remove.user")
    elif isinstance(f, UserPasswd):
        _str16(out, f.user, "user_passwd.user")
        _str16(out, f.password, "user_passwd.password")
    elif isinstance(f, (Grant, Revoke)):
        prefix = "grant" if isinstance(f, Grant) else "revoke"
        _str16(out, f.user, prefix + ".user")
        _str16(out, f.pattern, prefix + ".pattern")
        out += _U8.pack(_check_u(f.actions, 8, prefix + ".actions"))
        out += _U8.pack(_check_u(f.roles, 8, prefix + ".roles"))
    elif isinstance(f, TokenCreate):
        _str16(out, f.user, "token_create.user")
        _str16(out, f.name, "token_create.name")
        out += _U64.pack(_check_u(f.expires_ms, 64, "token_create.expires_ms"))
    elif isinstance(f, TokenList):
        _str16(out, f.user, "token_list.user")
    elif isinstance(f, TokenRevoke):
        _str16(out, f.user, "token_revoke.user")
        _str16(out, f.name, "token_revoke.name")
    elif isinstance(f, UserListReply):
        out += _U32.pack(len(f.users))
        for u in f.users:
            _str16(out, u.name, "user_list_reply.name")
            out += struct.pack("<BIH", _check_u(u.roles, 8, "user_list_reply.roles"),
                               _check_u(u.tokens, 32, "user_list_reply.tokens"),
                               _check_u(len(u.grants), 16, "user_list_reply.grant_count"))  # fmt: skip
            for pattern, actions in u.grants:
                _str16(out, pattern, "user_list_reply.pattern")
                out += _U8.pack(_check_u(actions, 8, "user_list_reply.actions"))
    elif isinstance(f, TokenCreated):
        _str16(out, f.name, "token_created.name")
        _str16(out, f.token, "token_created.token")
        out += _U64.pack(f.expires_ms)
    elif isinstance(f, TokenListReply):
        out += _U32.pack(len(f.tokens))
        for t in f.tokens:
            _str16(out, t.name, "token_list_reply.name")
            out += struct.pack("<QQ", t.created_ms, t.expires_ms)
    elif isinstance(f, PurgeTopic):
        _str16(out, f.name, "purge_topic.name", 1, NAME_BYTES_MAX)
    elif isinstance(f, Purged):
        out += _U64.pack(_check_u(f.messages, 64, "purged.messages"))
    elif isinstance(f, PauseSubscription):
        _str16(out, f.topic, "pause_subscription.topic", 1, NAME_BYTES_MAX)
        _str16(out, f.subscription, "pause_subscription.subscription", 1, NAME_BYTES_MAX)
        out += _U8.pack(1 if f.paused else 0)
    elif isinstance(f, ListConnections):
        if not 1 <= f.limit <= LIST_LIMIT_MAX:
            raise _invalid("list_connections.limit", f"{f.limit} is not within 1..={LIST_LIMIT_MAX}")
        out += struct.pack("<QI", _check_u(f.after, 64, "list_connections.after"), f.limit)
    elif isinstance(f, ConnectionList):
        out += struct.pack("<QQI", f.total, f.next_after, len(f.connections))
        for c in f.connections:
            out += struct.pack("<QBB", c.id, _check_u(c.listener, 8, "connection.listener"), 1 if c.tls else 0)
            _str16(out, c.peer, "connection.peer")
            _str16(out, c.user, "connection.user")
            _str16(out, c.client_name, "connection.client_name")
            out += struct.pack("<QIIQQQQQQ", c.connected_ms, c.subscriptions, c.consumers, c.messages_in,
                               c.bytes_in, c.messages_out, c.bytes_out, c.credit, c.unacked)  # fmt: skip
    elif isinstance(f, CloseConnection):
        out += _U64.pack(_check_u(f.id, 64, "close_connection.id"))
    elif isinstance(f, ClusterInfoReply):
        out += struct.pack("<QQI", f.node_id, f.metadata_leader, len(f.nodes))
        for n in f.nodes:
            out += _U64.pack(n.id)
            _str16(out, n.addr, "cluster_info_reply.node.addr")
        out += _U32.pack(len(f.partitions))
        for pl in f.partitions:
            _str16(out, pl.topic, "cluster_info_reply.partition.topic")
            if len(pl.replicas) > 255:
                raise _invalid("cluster_info_reply.partition.replica_count", f"{len(pl.replicas)} replicas, at most 255")
            out += struct.pack("<IQB", pl.partition, pl.leader, len(pl.replicas))
            for rep_id in pl.replicas:
                out += _U64.pack(rep_id)
    else:
        raise TypeError(f"not a FerryMQ frame: {type(frame).__name__}")
    return bytes(out)


def encode_frame(frame: Frame, request_id: int = 0, version: int = PROTOCOL_VERSION) -> bytes:
    """One complete frame, header and payload, in the layout of protocol ``version``."""
    payload = encode_payload(frame, version)
    return _HEADER.pack(len(payload), frame.OPCODE, 0, request_id) + payload


def encode_header(payload_len: int, opcode: int, request_id: int) -> bytes:
    return _HEADER.pack(payload_len, opcode, 0, request_id)


# ---------------------------------------------------------------------------------------------
# Decoding


class _Reader:
    __slots__ = ("data", "pos", "end", "version")

    def __init__(self, data: bytes, pos: int = 0, end: Optional[int] = None, version: int = PROTOCOL_VERSION) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end
        self.version = version

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int, field_name: str) -> bytes:
        p = self.pos
        if self.end - p < n:
            raise ProtocolError("Truncated", field_name, f"frame truncated while reading {field_name}")
        self.pos = p + n
        return self.data[p : p + n]

    def _unpack(self, st: struct.Struct, field_name: str) -> int:
        p = self.pos
        if self.end - p < st.size:
            raise ProtocolError("Truncated", field_name, f"frame truncated while reading {field_name}")
        self.pos = p + st.size
        return st.unpack_from(self.data, p)[0]

    def u8(self, f: str) -> int:
        return self._unpack(_U8, f)

    def u16(self, f: str) -> int:
        return self._unpack(_U16, f)

    def u32(self, f: str) -> int:
        return self._unpack(_U32, f)

    def u64(self, f: str) -> int:
        return self._unpack(_U64, f)

    def bool(self, f: str) -> bool:
        b = self.u8(f)
        if b > 1:
            raise _invalid(f, f"{b} is not a boolean (0 or 1)")
        return b == 1

    def bytes16(self, f: str) -> bytes:
        return bytes(self.take(self.u16(f), f))

    def str16(self, f: str) -> str:
        raw = self.take(self.u16(f), f)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("InvalidUtf8", f, f"field {f} is not valid UTF-8") from None

    def name(self, f: str) -> str:
        name = self.str16(f)
        n = len(name.encode("utf-8")) if not name.isascii() else len(name)
        if n == 0 or n > NAME_BYTES_MAX:
            raise _invalid(f, f"must be 1..={NAME_BYTES_MAX} bytes")
        return name

    def flags(self, f: str, known: int) -> int:
        flags = self.u8(f)
        if flags & ~known:
            raise _invalid(f, f"unknown bits 0x{flags:02x}")
        return flags

    def finish(self, opcode_name: str) -> None:
        if self.pos != self.end:
            extra = self.end - self.pos
            raise ProtocolError(
                "TrailingBytes", None, f"{extra} unexpected bytes after the end of a {opcode_name} frame"
            )


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8"))


def _parse_record(data: bytes, p: int, end: int) -> tuple[int, int, Optional[bytes], list[tuple[str, str]], Optional[int], bytes]:
    """Parses the record at ``data[p:]``; returns (end position, priority, key, headers, delay,
    body), or raises ProtocolError with the Rust codec's field names."""
    if end - p < 1:
        raise ProtocolError("Truncated", "record.priority", "frame truncated while reading record.priority")
    if end - p < RECORD_PREFIX_BYTES:
        r = _Reader(data, p, end)
        priority = r.u8("record.priority")
        if priority > PRIORITY_MAX:
            raise _invalid("record.priority", f"{priority} is above {PRIORITY_MAX}")
        flags = r.u8("record.flags")
        if flags & ~3:
            raise _invalid("record.flags", f"unknown bits 0x{flags:02x}")
        r.u16("record.key_len")
        r.u16("record.header_count")
        r.u32("record.body_len")
        raise AssertionError("unreachable: a short prefix raised above")
    priority, flags, key_len, header_count, body_len = _RECORD_PREFIX.unpack_from(data, p)
    if priority > PRIORITY_MAX:
        raise _invalid("record.priority", f"{priority} is above {PRIORITY_MAX}")
    if flags & ~3:
        raise _invalid("record.flags", f"unknown bits 0x{flags:02x}")
    if not flags & 1 and key_len:
        raise _invalid("record.key_len", "non-zero without the key flag")
    if key_len > KEY_BYTES_MAX:
        raise _invalid("record.key_len", f"{key_len} bytes, limit {KEY_BYTES_MAX}")
    if header_count > HEADERS_COUNT_MAX:
        raise _invalid("record.header_count", f"{header_count}, limit {HEADERS_COUNT_MAX}")
    p += RECORD_PREFIX_BYTES
    delay = None
    if flags & 2:
        if end - p < 8:
            raise ProtocolError("Truncated", "record.deliver_after_ms", "frame truncated while reading record.deliver_after_ms")
        delay = _U64.unpack_from(data, p)[0]
        if delay > DELAY_MS_MAX:
            raise _invalid("record.deliver_after_ms", f"{delay} is above {DELAY_MS_MAX}")
        p += 8
    key = None
    if flags & 1:
        if end - p < key_len:
            raise ProtocolError("Truncated", "record.key", "frame truncated while reading record.key")
        key = bytes(data[p : p + key_len])
        p += key_len
    headers: list[tuple[str, str]] = []
    if header_count:
        r = _Reader(data, p, end)
        for _ in range(header_count):
            name_len = r.u16("record.header.name_len")
            if name_len == 0 or name_len > HEADER_BYTES_MAX:
                raise _invalid("record.header.name_len", f"must be 1..={HEADER_BYTES_MAX}")
            try:
                name = r.take(name_len, "record.header.name").decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("InvalidUtf8", "record.header.name", "field record.header.name is not valid UTF-8") from None
            value_len = r.u16("record.header.value_len")
            if value_len > HEADER_BYTES_MAX:
                raise _invalid("record.header.value_len", f"limit {HEADER_BYTES_MAX}")
            try:
                value = r.take(value_len, "record.header.value").decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("InvalidUtf8", "record.header.value", "field record.header.value is not valid UTF-8") from None
            headers.append((name, value))
        p = r.pos
    if end - p < body_len:
        raise ProtocolError("Truncated", "record.body", "frame truncated while reading record.body")
    body = bytes(data[p : p + body_len])
    return p + body_len, priority, key, headers, delay, body


_DELIVERY_AND_RECORD = struct.Struct("<IQQHBBHHI")  # the 22-byte prefix, then the record's 10
_EMPTY: tuple = ()


def decode_deliveries(data: bytes, p: int, end: int, count: int, make: type = Delivery) -> list:
    """Decodes ``count`` deliveries from ``data[p:end]``, which they must fill exactly. ``make``
    is Delivery or a subclass of it."""
    if count > BATCH_COUNT_MAX:
        raise _invalid("deliveries.count", f"{count}, limit {BATCH_COUNT_MAX}")
    out: list = []
    append = out.append
    unpack = _DELIVERY_AND_RECORD.unpack_from
    new = tuple.__new__
    startswith = data.startswith
    # Header blocks seen in this frame, as (header count, block bytes, decoded headers): the
    # records of one sender's batch carry byte-identical headers (the bus's type, serializer,
    # sender, shard and times), so a record whose block repeats one of these reuses its decoded
    # tuple after one comparison instead of being parsed header by header.
    blocks: list = []
    for _ in range(count):
        # The common record (no headers, no delay, a valid key flag) is read inline; any other
        # shape goes through the full parser, which validates as the Rust codec does.
        if end - p >= 32:
            partition, offset, ts, attempt, priority, flags, key_len, header_count, body_len = unpack(data, p)
            if header_count and priority <= PRIORITY_MAX and flags < 2 and key_len <= KEY_BYTES_MAX and (flags or not key_len):
                q = p + 32
                hs = q + key_len
                for n, block, headers in blocks:
                    if n == header_count and startswith(block, hs):
                        b = hs + len(block)
                        e = b + body_len
                        if e <= end:
                            key = data[q:hs] if flags else None
                            append(new(make, (partition, offset, ts, attempt, priority, key, headers, None, data[b:e])))
                            p = e
                            break
                else:
                    e, priority, key, header_list, delay, body = _parse_record(data, p + DELIVERY_PREFIX_BYTES, end)
                    headers = tuple(header_list)
                    if len(blocks) < 8:
                        blocks.append((header_count, data[hs : e - body_len], headers))
                    append(new(make, (partition, offset, ts, attempt, priority, key, headers, delay, body)))
                    p = e
                continue
            if header_count == 0 and priority <= PRIORITY_MAX:
                if flags == 0 and key_len == 0:
                    b = p + 32
                    e = b + body_len
                    if e <= end:
                        append(new(make, (partition, offset, ts, attempt, priority, None, _EMPTY, None, data[b:e])))
                        p = e
                        continue
                elif flags == 1 and key_len <= KEY_BYTES_MAX:
                    q = p + 32
                    b = q + key_len
                    e = b + body_len
                    if e <= end:
                        append(new(make, (partition, offset, ts, attempt, priority, data[q:b], _EMPTY, None, data[b:e])))
                        p = e
                        continue
        if end - p < DELIVERY_PREFIX_BYTES:
            raise ProtocolError("Truncated", "delivery.prefix", "frame truncated while reading delivery.prefix")
        partition, offset, ts, attempt = _DELIVERY_PREFIX.unpack_from(data, p)
        p, priority, key, headers, delay, body = _parse_record(data, p + DELIVERY_PREFIX_BYTES, end)
        append(new(make, (partition, offset, ts, attempt, priority, key, tuple(headers), delay, body)))
    if p != end:
        raise ProtocolError("TrailingBytes", None, f"{end - p} unexpected bytes after the end of a delivery batch frame")
    return out


def _decode_records(data: bytes, p: int, end: int, count: int) -> list[Message]:
    if count > BATCH_COUNT_MAX:
        raise _invalid("batch.count", f"{count}, limit {BATCH_COUNT_MAX}")
    out = []
    for _ in range(count):
        p, priority, key, headers, delay, body = _parse_record(data, p, end)
        out.append(Message(body=body, key=key, headers=headers, priority=priority, deliver_after_ms=delay))
    if p != end:
        raise ProtocolError("TrailingBytes", None, f"{end - p} unexpected bytes after the end of a record batch frame")
    return out


def _decode_ranges(r: _Reader) -> list[Range]:
    count = r.u32("ranges.count")
    if count > RANGES_COUNT_MAX:
        raise _invalid("ranges.count", f"{count}, limit {RANGES_COUNT_MAX}")
    if count * RANGE_BYTES > r.remaining():
        raise ProtocolError("Truncated", "ranges", "frame truncated while reading ranges")
    out = []
    unpack = _RANGE.unpack_from
    data, p = r.data, r.pos
    for _ in range(count):
        part, off, c = unpack(data, p)
        if off + c > U64_MAX:
            raise _invalid("range", "offset + count overflows")
        out.append(Range(part, off, c))
        p += RANGE_BYTES
    r.pos = p
    return out


def _decode_config(r: _Reader) -> TopicConfig:
    partitions = r.u32("topic.partitions")
    storage = r.u8("topic.storage")
    if storage > 2:
        raise _invalid("topic.storage", f"unknown storage {storage}")
    overflow = r.u8("topic.overflow")
    if overflow > 2:
        raise _invalid("topic.overflow", f"unknown policy {overflow}")
    max_messages = r.u64("topic.max_messages")
    max_bytes = r.u64("topic.max_bytes")
    kind = r.u8("topic.fsync")
    interval = r.u32("topic.fsync_interval_ms")
    if kind > 3:
        raise _invalid("topic.fsync", f"unknown fsync policy {kind}")
    if kind == 2 and interval == 0:
        raise _invalid("topic.fsync_interval_ms", "must be at least 1 for the interval policy")
    if kind != 2 and interval != 0:
        raise _invalid("topic.fsync_interval_ms", f"{interval} given for a policy without an interval: must be 0")
    retention_ms = r.u64("topic.retention_ms")
    policy = r.u8("topic.retention_policy")
    if policy > 2:
        raise _invalid("topic.retention_policy", f"unknown retention policy {policy}")
    return TopicConfig(partitions, Storage(storage), Overflow(overflow), max_messages, max_bytes,
                       Fsync(kind), interval, retention_ms, RetentionPolicy(policy),
                       r.u64("topic.dedup_window_ms"), r.u8("topic.replicas") if r.version >= 3 else 0)  # fmt: skip


def _decode_topic_info(r: _Reader) -> TopicInfo:
    name = r.str16("topic_info.name")
    config = _decode_config(r)
    messages = r.u64("topic_info.messages")
    nbytes = r.u64("topic_info.bytes")
    count = r.u32("topic_info.subscription_count")
    subs = [r.str16("topic_info.subscription") for _ in range(count)]
    return TopicInfo(name, config, messages, nbytes, subs)


def _decode_latency(r: _Reader, f: str) -> Latency:
    sum_us = r.u64(f)
    n = r.u16(f)
    if n > LATENCY_BUCKETS:
        raise _invalid(f, f"{n} buckets, above the {LATENCY_BUCKETS} there are")
    buckets: list[tuple[int, int]] = []
    for _ in range(n):
        b = r.u16(f)
        c = r.u64(f)
        if b >= LATENCY_BUCKETS:
            raise _invalid(f, f"bucket {b} is beyond the last, {LATENCY_BUCKETS - 1}")
        if buckets and buckets[-1][0] >= b:
            raise _invalid(f, f"bucket {b} is out of ascending order")
        if c == 0:
            raise _invalid(f, f"bucket {b} has a count of 0 (empty buckets are left out)")
        buckets.append((b, c))
    return Latency(sum_us, buckets)


def _decode_topic_stats(r: _Reader) -> TopicStats:
    name = r.str16("stats.topic.name")
    vals = [r.u64("stats.topic." + n) for n in ("messages_in", "bytes_in", "messages_out", "bytes_out", "depth", "depth_bytes", "dropped")]
    publishers = r.u32("stats.topic.publishers")
    subscribers = r.u32("stats.topic.subscribers")
    count = r.u32("stats.topic.subscription_count")
    subs = []
    for _ in range(count):
        sname = r.str16("stats.subscription.name")
        ephemeral = r.bool("stats.subscription.ephemeral")
        consumers = r.u32("stats.subscription.consumers")
        svals = [r.u64("stats.subscription." + n) for n in ("messages_out", "bytes_out", "acked", "redelivered", "backlog", "in_flight", "gave_up")]
        deliver = _decode_latency(r, "stats.subscription.deliver_latency")
        ack = _decode_latency(r, "stats.subscription.ack_latency")
        paused = r.bool("stats.subscription.paused") if r.version >= 3 else False
        subs.append(SubscriptionStats(sname, ephemeral, consumers, *svals, deliver, ack, paused))  # type: ignore[arg-type, call-arg]
    return TopicStats(name, *vals, publishers, subscribers, subs)  # type: ignore[arg-type, call-arg]


def _decode_entry(r: _Reader) -> MessageEntry:
    partition = r.u32("message_entry.partition")
    offset = r.u64("message_entry.offset")
    state = r.u8("message_entry.state")
    if state > MessageState.BEFORE_START:
        raise _invalid("message_entry.state", f"unknown state {state}")
    attempts = r.u16("message_entry.attempts")
    published = r.u64("message_entry.published_ms")
    first = r.u64("message_entry.first_delivered_ms")
    settled = r.u64("message_entry.settled_ms")
    due = r.u64("message_entry.due_ms")
    result = r.bytes16("message_entry.result")
    if len(result) > ACK_RESULT_BYTES_MAX:
        raise _invalid("message_entry.result", f"{len(result)} bytes, above the limit of {ACK_RESULT_BYTES_MAX}")
    reason = r.str16("message_entry.reason")
    present = r.bool("message_entry.dead_letter")
    dl_partition = r.u32("message_entry.dead_letter_partition")
    dl_offset = r.u64("message_entry.dead_letter_offset")
    if present:
        dead_letter: Optional[tuple[int, int]] = (dl_partition, dl_offset)
    elif dl_partition or dl_offset:
        raise _invalid("message_entry.dead_letter", f"{dl_partition}-{dl_offset} given without the present flag: must be 0-0")
    else:
        dead_letter = None
    return MessageEntry(partition, offset, MessageState(state), attempts, published, first,
                        settled, due, result, reason, dead_letter)  # fmt: skip


def _read_result(r: _Reader, f: str) -> bytes:
    result = r.bytes16(f)
    if len(result) > ACK_RESULT_BYTES_MAX:
        raise _invalid(f, f"{len(result)} bytes, above the limit of {ACK_RESULT_BYTES_MAX}")
    return result


def _read_page(r: _Reader, f: str) -> bytes:
    page = r.bytes16(f)
    if len(page) > LIST_PAGE_BYTES_MAX:
        raise _invalid(f, f"{len(page)} bytes, above the limit of {LIST_PAGE_BYTES_MAX}")
    return page


def decode_payload(
    opcode: int,
    data: bytes,
    p: int = 0,
    end: Optional[int] = None,
    deliver_class_for: Optional[Callable[[int], type]] = None,
    version: int = PROTOCOL_VERSION,
) -> Frame:
    """Decodes the payload ``data[p:end]`` of a frame with ``opcode`` in the layout of protocol
    ``version``; the payload must hold exactly the opcode's fields. ``deliver_class_for(consumer_id)``
    picks the Delivery subclass of a DELIVER frame's deliveries."""
    if version < 3 and opcode in V3_OPCODES:
        raise ProtocolError("UnknownOpcode", None, f"unknown opcode 0x{opcode:04x} in protocol version {version}")
    r = _Reader(data, p, end, version)
    op = opcode
    frame: Frame
    if op == Opcode.DELIVER:
        consumer_id = r.u32("deliver.consumer_id")
        count = r.u32("deliver.count")
        make = Delivery if deliver_class_for is None else deliver_class_for(consumer_id)
        return Deliver(consumer_id, decode_deliveries(data, r.pos, r.end, count, make))
    if op == Opcode.PUBLISHED:
        d = r.u8("published.durability")
        if d > 3:
            raise _invalid("published.durability", f"unknown durability {d}")
        frame = Published(Durability(d), _decode_ranges(r))
    elif op in (Opcode.PING, Opcode.PONG, Opcode.LIST_TOPICS, Opcode.OK, Opcode.USER_LIST, Opcode.CLUSTER_INFO):
        frame = {Opcode.PING: Ping, Opcode.PONG: Pong, Opcode.LIST_TOPICS: ListTopics, Opcode.OK: Ok,
                 Opcode.USER_LIST: UserList, Opcode.CLUSTER_INFO: ClusterInfo}[Opcode(op)]()  # fmt: skip
    elif op == Opcode.HELLO:
        frame = Hello(r.u16("hello.version_min"), r.u16("hello.version_max"), r.u32("hello.heartbeat_ms"),
                      r.str16("hello.client_name"), r.str16("hello.user"), r.str16("hello.password"))  # fmt: skip
    elif op == Opcode.CREATE_TOPIC:
        name = r.name("create_topic.name")
        config = _decode_config(r)
        frame = CreateTopic(name, config, r.flags("create_topic.flags", 1) != 0)
    elif op == Opcode.DELETE_TOPIC:
        frame = DeleteTopic(r.name("delete_topic.name"))
    elif op == Opcode.DESCRIBE_TOPIC:
        frame = DescribeTopic(r.name("describe_topic.name"))
    elif op == Opcode.PUBLISH:
        topic = r.name("publish.topic")
        partition = r.u32("publish.partition")
        count = r.u32("publish.count")
        return Publish(topic, None if partition == NO_PARTITION else partition, _decode_records(data, r.pos, r.end, count))
    elif op == Opcode.SUBSCRIBE:
        topic = r.name("subscribe.topic")
        subscription = r.str16("subscribe.subscription")
        if _utf8_len(subscription) > NAME_BYTES_MAX:
            raise _invalid("subscribe.subscription", f"longer than {NAME_BYTES_MAX} bytes")
        kind = r.u8("subscribe.start")
        value = r.u64("subscribe.start_value")
        if kind <= 1 and value != 0:
            raise _invalid("subscribe.start_value", f"{value} must be 0 for start kind {kind}")
        if kind > 3:
            raise _invalid("subscribe.start", f"unknown start kind {kind}")
        ack_timeout_ms = r.u32("subscribe.ack_timeout_ms")
        max_attempts = r.u32("subscribe.max_attempts")
        credit = r.u32("subscribe.credit")
        flags = r.flags("subscribe.flags", 3)
        if flags == 3:
            raise _invalid("subscribe.flags", "ordered delivery needs acks: it cannot be combined with auto_ack")
        count = r.u16("subscribe.partitions")
        if count > PARTITIONS_MAX:
            raise _invalid("subscribe.partitions", f"{count} ranges, above the limit of {PARTITIONS_MAX}")
        ranges = []
        for _ in range(count):
            first = r.u32("subscribe.partitions")
            last = r.u32("subscribe.partitions")
            if first > last:
                raise _invalid("subscribe.partitions", f"range {first}-{last} ends before it starts")
            ranges.append((first, last))
        dlt = r.str16("subscribe.dead_letter_topic")
        if _utf8_len(dlt) > NAME_BYTES_MAX:
            raise _invalid("subscribe.dead_letter_topic", f"must be empty (the default) or 1..={NAME_BYTES_MAX} bytes")
        frame = Subscribe(topic, subscription, StartKind(kind), value, ack_timeout_ms, max_attempts,
                          credit, bool(flags & 1), bool(flags & 2), ranges, dlt)  # fmt: skip
    elif op == Opcode.UNSUBSCRIBE:
        frame = Unsubscribe(r.u32("unsubscribe.consumer_id"))
    elif op == Opcode.CREDIT:
        frame = Credit(r.u32("credit.consumer_id"), r.u32("credit.credit"))
    elif op == Opcode.ACK:
        frame = Ack(r.u32("ack.consumer_id"), _decode_ranges(r))
    elif op == Opcode.NACK:
        consumer_id = r.u32("nack.consumer_id")
        delay_ms = r.u32("nack.delay_ms")
        flags = r.flags("nack.flags", 0b11)
        if flags == 0b11:
            raise _invalid("nack.flags", "a NACK either dead-letters or releases its messages, not both")
        reason = r.str16("nack.reason")
        if _utf8_len(reason) > ERROR_MESSAGE_BYTES_MAX:
            raise _invalid("nack.reason", f"longer than {ERROR_MESSAGE_BYTES_MAX} bytes")
        frame = Nack(consumer_id, delay_ms, flags & 1 != 0, reason, _decode_ranges(r), flags & 2 != 0)
    elif op == Opcode.DELETE_SUBSCRIPTION:
        frame = DeleteSubscription(r.name("delete_subscription.topic"), r.name("delete_subscription.subscription"))
    elif op == Opcode.ACK_RESULT:
        consumer_id = r.u32("ack_result.consumer_id")
        frame = AckResult(consumer_id, _read_result(r, "ack_result.result"), _decode_ranges(r))
    elif op == Opcode.STATS:
        frame = Stats(r.str16("stats.topic"))
    elif op == Opcode.MESSAGE_STATUS:
        frame = MessageStatus(r.name("message_status.topic"), r.u32("message_status.partition"), r.u64("message_status.offset"))
    elif op == Opcode.LIST_MESSAGES:
        topic = r.name("list_messages.topic")
        subscription = r.name("list_messages.subscription")
        kind = r.u8("list_messages.kind")
        if kind > 3:
            raise _invalid("list_messages.kind", f"unknown kind {kind}")
        page = _read_page(r, "list_messages.page")
        limit = r.u32("list_messages.limit")
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise _invalid("list_messages.limit", f"{limit} is not within 1..={LIST_LIMIT_MAX}")
        frame = ListMessages(topic, subscription, ListKind(kind), page, limit)
    elif op == Opcode.REQUEUE_DEAD:
        dlt = r.name("requeue_dead.dead_letter_topic")
        kind = r.u8("requeue_dead.selection")
        part = r.u32("requeue_dead.partition")
        first = r.u64("requeue_dead.first_offset")
        last = r.u64("requeue_dead.last_offset")
        if kind == 0:
            for fname, value in (("requeue_dead.partition", part), ("requeue_dead.first_offset", first), ("requeue_dead.last_offset", last)):
                if value:
                    raise _invalid(fname, f"{value} must be 0 when every dead letter is selected")
            frame = RequeueDead(dlt, None)
        elif kind == 1:
            if last < first:
                raise _invalid("requeue_dead.last_offset", f"range {first}..={last} ends before it starts")
            frame = RequeueDead(dlt, (part, first, last))
        else:
            raise _invalid("requeue_dead.selection", f"unknown selection {kind}")
    elif op == Opcode.HELLO_OK:
        frame = HelloOk(r.u16("hello_ok.version"), r.u32("hello_ok.heartbeat_ms"), r.u32("hello_ok.frame_bytes_max"),
                        r.u32("hello_ok.message_bytes_max"), r.str16("hello_ok.server"))  # fmt: skip
    elif op == Opcode.ERROR:
        frame = Error(r.u16("error.code"), r.str16("error.message"))
    elif op == Opcode.TOPIC_LIST:
        count = r.u32("topic_list.count")
        frame = TopicList([_decode_topic_info(r) for _ in range(count)])
    elif op == Opcode.TOPIC_INFO:
        frame = TopicInfoFrame(_decode_topic_info(r))
    elif op == Opcode.SUBSCRIBED:
        frame = Subscribed(r.u32("subscribed.consumer_id"), r.str16("subscribed.subscription"), r.u32("subscribed.partitions"))
    elif op == Opcode.STATS_REPLY:
        count = r.u32("stats_reply.count")
        frame = StatsReply([_decode_topic_stats(r) for _ in range(count)])
    elif op == Opcode.MESSAGE_STATUS_REPLY:
        partition = r.u32("message_status.partition")
        offset = r.u64("message_status.offset")
        published = r.u64("message_status.published_ms")
        priority = r.u8("message_status.priority")
        if priority > PRIORITY_MAX:
            raise _invalid("message_status.priority", f"{priority} is above {PRIORITY_MAX}")
        has_key = r.bool("message_status.has_key")
        key = r.bytes16("message_status.key")
        if len(key) > KEY_BYTES_MAX:
            raise _invalid("message_status.key", f"{len(key)} bytes, above the limit of {KEY_BYTES_MAX}")
        if not has_key and key:
            raise _invalid("message_status.key", f"{len(key)} bytes given with has_key 0: must be empty")
        body_bytes = r.u32("message_status.body_bytes")
        count = r.u32("message_status.subscription_count")
        subs = []
        for _ in range(count):
            name = r.str16("message_status.subscription")
            subs.append((name, _decode_entry(r)))
        frame = MessageStatusReply(partition, offset, published, priority, key if has_key else None, body_bytes, subs)
    elif op == Opcode.MESSAGE_LIST:
        count = r.u32("message_list.count")
        if count > LIST_LIMIT_MAX:
            raise _invalid("message_list.count", f"{count} entries, above the limit of {LIST_LIMIT_MAX}")
        entries = [_decode_entry(r) for _ in range(count)]
        frame = MessageList(entries, _read_page(r, "message_list.next_page"))
    elif op == Opcode.REQUEUED:
        frame = Requeued(r.u64("requeued.requeued"), r.u64("requeued.skipped"))
    elif op == Opcode.USER_ADD:
        frame = UserAdd(r.str16("user_add.user"), r.str16("user_add.password"), r.u8("user_add.roles"))
    elif op == Opcode.USER_REMOVE:
        frame = UserRemove(r.str16("user_remove.user"))
    elif op == Opcode.USER_PASSWD:
        frame = UserPasswd(r.str16("user_passwd.user"), r.str16("user_passwd.password"))
    elif op in (Opcode.GRANT, Opcode.REVOKE):
        prefix, cls = ("grant", Grant) if op == Opcode.GRANT else ("revoke", Revoke)
        frame = cls(r.str16(prefix + ".user"), r.str16(prefix + ".pattern"), r.u8(prefix + ".actions"),
                    r.u8(prefix + ".roles"))  # fmt: skip
    elif op == Opcode.TOKEN_CREATE:
        frame = TokenCreate(r.str16("token_create.user"), r.str16("token_create.name"), r.u64("token_create.expires_ms"))
    elif op == Opcode.TOKEN_LIST:
        frame = TokenList(r.str16("token_list.user"))
    elif op == Opcode.TOKEN_REVOKE:
        frame = TokenRevoke(r.str16("token_revoke.user"), r.str16("token_revoke.name"))
    elif op == Opcode.USER_LIST_REPLY:
        count = r.u32("user_list_reply.count")
        # A count only bounds a loop that reads real bytes: a lying one ends as Truncated.
        users = []
        for _ in range(count):
            name = r.str16("user_list_reply.name")
            roles = r.u8("user_list_reply.roles")
            tokens = r.u32("user_list_reply.tokens")
            grant_count = r.u16("user_list_reply.grant_count")
            grants = []
            for _ in range(grant_count):
                grants.append((r.str16("user_list_reply.pattern"), r.u8("user_list_reply.actions")))
            users.append(UserEntry(name, roles, tokens, grants))
        frame = UserListReply(users)
    elif op == Opcode.TOKEN_CREATED:
        frame = TokenCreated(r.str16("token_created.name"), r.str16("token_created.token"), r.u64("token_created.expires_ms"))
    elif op == Opcode.TOKEN_LIST_REPLY:
        count = r.u32("token_list_reply.count")
        tokens = []
        for _ in range(count):
            tokens.append(TokenEntry(r.str16("token_list_reply.name"), r.u64("token_list_reply.created_ms"),
                                     r.u64("token_list_reply.expires_ms")))  # fmt: skip
        frame = TokenListReply(tokens)
    elif op == Opcode.PURGE_TOPIC:
        frame = PurgeTopic(r.name("purge_topic.name"))
    elif op == Opcode.PURGED:
        frame = Purged(r.u64("purged.messages"))
    elif op == Opcode.PAUSE_SUBSCRIPTION:
        topic = r.name("pause_subscription.topic")
        subscription = r.name("pause_subscription.subscription")
        frame = PauseSubscription(topic, subscription, r.flags("pause_subscription.flags", 1) != 0)
    elif op == Opcode.LIST_CONNECTIONS:
        after = r.u64("list_connections.after")
        limit = r.u32("list_connections.limit")
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise _invalid("list_connections.limit", f"{limit} is not within 1..={LIST_LIMIT_MAX}")
        frame = ListConnections(after, limit)
    elif op == Opcode.CONNECTION_LIST:
        total = r.u64("connection_list.total")
        next_after = r.u64("connection_list.next_after")
        count = r.u32("connection_list.count")
        conns = []
        for _ in range(count):
            cid = r.u64("connection.id")
            listener = r.u8("connection.listener")
            tls = r.flags("connection.flags", 1) != 0
            peer = r.str16("connection.peer")
            user = r.str16("connection.user")
            client_name = r.str16("connection.client_name")
            connected_ms = r.u64("connection.connected_ms")
            subscriptions = r.u32("connection.subscriptions")
            consumers = r.u32("connection.consumers")
            rest = [r.u64("connection." + n) for n in ("messages_in", "bytes_in", "messages_out", "bytes_out", "credit", "unacked")]
            conns.append(ConnectionEntry(cid, listener, tls, peer, user, client_name, connected_ms, subscriptions, consumers, *rest))  # type: ignore[arg-type]
        frame = ConnectionList(total, next_after, conns)
    elif op == Opcode.CLOSE_CONNECTION:
        frame = CloseConnection(r.u64("close_connection.id"))
    elif op == Opcode.CLUSTER_INFO_REPLY:
        node_id = r.u64("cluster_info_reply.node_id")
        metadata_leader = r.u64("cluster_info_reply.metadata_leader")
        count = r.u32("cluster_info_reply.node_count")
        nodes = []
        for _ in range(count):
            nid = r.u64("cluster_info_reply.node.id")
            nodes.append(ClusterNode(nid, r.str16("cluster_info_reply.node.addr")))
        count = r.u32("cluster_info_reply.partition_count")
        parts = []
        for _ in range(count):
            topic = r.str16("cluster_info_reply.partition.topic")
            partition = r.u32("cluster_info_reply.partition.partition")
            leader = r.u64("cluster_info_reply.partition.leader")
            n = r.u8("cluster_info_reply.partition.replica_count")
            parts.append(PartitionLeader(topic, partition, leader, [r.u64("cluster_info_reply.partition.replicas") for _ in range(n)]))
        frame = ClusterInfoReply(node_id, metadata_leader, nodes, parts)
    else:
        raise ProtocolError("UnknownOpcode", None, f"unknown opcode 0x{op:04x}")
    r.finish(Opcode(op).name)
    return frame


class Decoder:
    """Splits a byte stream into frames.

    ``feed`` appends bytes; ``next`` returns ``(request_id, frame)`` for the next complete frame,
    or None until one is there. The header is checked as soon as it is complete, so an oversize
    frame is refused before its payload is buffered.
    """

    __slots__ = ("_buf", "_pos", "frame_bytes_max", "_deliver_class_for", "version")

    def __init__(
        self,
        frame_bytes_max: int = FRAME_BYTES_DEFAULT,
        deliver_class_for: Optional[Callable[[int], type]] = None,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        #: The protocol version whose layouts are read (the connection's, once agreed).
        self.version = version
        self._buf = bytearray()
        self._pos = 0
        self.frame_bytes_max = frame_bytes_max
        self._deliver_class_for = deliver_class_for

    def feed(self, data: bytes) -> None:
        if self._pos:
            # Drop consumed bytes only when they dominate, so a stream of small frames is not
            # copied once per frame.
            if self._pos > len(self._buf) // 2:
                del self._buf[: self._pos]
                self._pos = 0
        self._buf += data

    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def next(self) -> Optional[tuple[int, Frame]]:
        buf, p = self._buf, self._pos
        if len(buf) - p < FRAME_HEADER_BYTES:
            return None
        payload_len, opcode, flags, request_id = _HEADER.unpack_from(buf, p)
        if flags:
            raise ProtocolError("InvalidFlags", None, f"frame flags must be zero, got 0x{flags:04x}")
        total = FRAME_HEADER_BYTES + payload_len
        if total > self.frame_bytes_max:
            raise ProtocolError("FrameTooLarge", None, f"frame of {total} bytes exceeds the limit of {self.frame_bytes_max} bytes")
        if len(buf) - p < total:
            return None
        self._pos = p + total
        # One copy of the payload into immutable bytes: slices of it (bodies) are then cheap and
        # never alias the receive buffer, which is reused.
        with memoryview(buf) as view:
            payload = bytes(view[p + FRAME_HEADER_BYTES : p + total])
        return request_id, decode_payload(opcode, payload, 0, payload_len, self._deliver_class_for, self.version)


def decode_frame(data: bytes, frame_bytes_max: int = FRAME_BYTES_DEFAULT, version: int = PROTOCOL_VERSION) -> tuple[int, Frame, int]:
    """Decodes one frame at the start of ``data``: ``(request_id, frame, bytes consumed)``.
    Raises ProtocolError for a bad frame, and ``Truncated`` when ``data`` holds less than one
    whole frame."""
    d = Decoder(frame_bytes_max, version=version)
    d.feed(data)
    got = d.next()
    if got is None:
        raise ProtocolError("Truncated", "frame", "fewer bytes than one whole frame")
    return got[0], got[1], d._pos
