"""FerryMQ client for Python: an asyncio client (``ferrymq.Client``), a blocking one
(``ferrymq.sync.Client``), the protocol codec (``ferrymq.protocol``) and a typed message bus
(``ferrymq.bus``)."""

from .aio import (
    Client,
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
    TopicConfigMismatch,
    FerryMQError,
    ProtocolError,
    PublishWindowFull,
    ReceiptLost,
)
from .protocol import (
    Action,
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
    "TopicConfigMismatch",
    "ReceiptLost",
    "ProtocolError",
    "PublishWindowFull",
    "ClientClosed",
    "Action",
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
