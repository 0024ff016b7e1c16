"""The FerryMQ message bus: typed messages, shards, senders, receivers and handlers.

```python
from dataclasses import dataclass
from ferrymq import bus

@bus.message(key="order_id")
@dataclass
class OrderPlaced:
    order_id: int
    customer: str
```

Byte forms and shard rules are shared with the other clients through
``protocol/bus-vectors.json``; see ``core`` for what a receiver does with each message.
"""

from .core import (
    HEADER_PREPARED,
    HEADER_SENDER,
    HEADER_SENT,
    HEADER_SERIALIZER,
    HEADER_SHARD,
    HEADER_TYPE,
    RELEASE_DELAY_MS,
    BusError,
    Context,
    Handler,
    HandlerError,
    RetryPolicy,
    ensure_topic,
    MessageStats,
    Receiver,
    Sender,
    Settings,
    key_bytes,
    parse_shards,
    partition_for_key,
    shard_for_key,
)
from .schema import Field, Schema, SchemaError, message, register, schema_of
from .serializers import (
    DeflateJsonSerializer,
    JsonSerializer,
    MsgpackSerializer,
    ProtobufSerializer,
    SerializerUnavailable,
    Serializers,
    UnknownSerializer,
    UnreadableBody,
)

__all__ = [
    "message", "register", "schema_of", "Schema", "Field", "SchemaError",
    "Sender", "Receiver", "Handler", "Context", "MessageStats", "Settings", "BusError",
    "HandlerError", "RetryPolicy", "ensure_topic", "RELEASE_DELAY_MS",
    "Serializers", "JsonSerializer", "DeflateJsonSerializer", "MsgpackSerializer", "ProtobufSerializer",
    "UnknownSerializer", "UnreadableBody", "SerializerUnavailable",
    "shard_for_key", "partition_for_key", "key_bytes", "parse_shards",
    "HEADER_TYPE", "HEADER_SERIALIZER", "HEADER_SENDER", "HEADER_SHARD", "HEADER_PREPARED", "HEADER_SENT",
]  # fmt: skip
