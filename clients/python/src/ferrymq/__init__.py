"""FerryMQ client for Python: an asyncio client (``ferrymq.Client``), a blocking one
(``ferrymq.sync.Client``), the protocol codec (``ferrymq.protocol``) and a typed message bus
(``ferrymq.bus``)."""

from .aio import (
    Client,
    ClusterSubscription,
    MessageTooLarge,
    Receipt,
    ReceivedMessage,
    Subscription,
    connect,
    parse_message_id,
    parse_partition_ranges,
)
from .errors import (
    BrokerError,
    ClientClosed,
    ConnectionLost,
    FirstConnectError,
    NotLeader,
    TopicConfigMismatch,
    FerryMQError,
    ProtocolError,
    PublishWindowFull,
    ReceiptLost,
)
from .protocol import (
    Action,
    ClusterInfoReply,
    Durability,
    Fsync,
    RetentionPolicy,
    ListKind,
    Message,
    MessageState,
    Overflow,
    Role,
    StartKind,
    Storage,
    TokenCreated,
    TokenEntry,
    UserEntry,
)

from . import bus, sync  # noqa: E402  (after the names they import from this package)

__version__ = "0.1.0"

__all__ = [
    "bus",
    "sync",
    "Client",
    "connect",
    "Subscription",
    "ClusterSubscription",
    "ReceivedMessage",
    "Receipt",
    "Message",
    "MessageTooLarge",
    "parse_message_id",
    "parse_partition_ranges",
    "FerryMQError",
    "BrokerError",
    "ConnectionLost",
    "FirstConnectError",
    "NotLeader",
    "TopicConfigMismatch",
    "ReceiptLost",
    "ProtocolError",
    "PublishWindowFull",
    "ClientClosed",
    "Action",
    "ClusterInfoReply",
    "Durability",
    "Fsync",
    "RetentionPolicy",
    "ListKind",
    "MessageState",
    "Overflow",
    "Role",
    "StartKind",
    "Storage",
    "TokenCreated",
    "TokenEntry",
    "UserEntry",
]
