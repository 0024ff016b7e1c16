"""Exceptions raised by the FerryMQ client. Every one says what was wrong and what to do."""

from __future__ import annotations

import re
from typing import Optional


class FerryMQError(Exception):
    """Base class of every FerryMQ exception."""


class ProtocolError(FerryMQError):
    """Bytes that are not a valid frame, or a value a frame cannot carry.

    ``kind`` is the Rust codec's variant name (``Truncated``, ``FrameTooLarge``,
    ``UnknownOpcode``, ``InvalidFlags``, ``InvalidUtf8``, ``InvalidValue``, ``TrailingBytes``);
    ``field`` the field at fault, when there is one.
    """

    def __init__(self, kind: str, field: Optional[str], message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.field = field


class BrokerError(FerryMQError):
    """The broker answered a request with ERROR. ``code`` is the numeric code, ``name`` its
    snake_case name (``internal`` for a code this client does not know)."""

    def __init__(self, code: int, message: str) -> None:
        from .protocol import ErrorCode

        try:
            self.name = ErrorCode(code).name.lower()
        except ValueError:
            self.name = "internal"
        self.code = code
        self.message = message
        super().__init__(f"{self.name} ({code}): {message}")


class NotLeader(BrokerError):
    """ERROR ``not_leader`` (22): a cluster node does not lead what the request needs (a
    partition, for a publish; the cluster metadata, to create or delete a topic); nothing was
    done. What the message says is parsed: ``node`` answered, ``leader`` is the node it names
    (0: unknown, an election is under way) at ``leader_addr`` (empty when unknown), for
    ``partition`` of ``topic`` (``""`` and -1 for the metadata, or when the message does not
    say). A client following leaders (see ``Client``) handles it itself."""

    _NAMED = re.compile(r"^node (\d+) does not lead (.*): node (\d+)(?: at (\S+))? does$")
    _NONE = re.compile(r"^(.*) has no leader at the moment")
    _PART_OF = re.compile(r"^partition (\d+) of '(.*)'$")

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.node = 0
        self.leader = 0
        self.leader_addr = ""
        self.topic = ""
        self.partition = -1
        what = ""
        m = self._NAMED.match(message)
        if m:
            self.node, self.leader = int(m.group(1)), int(m.group(3))
            self.leader_addr = m.group(4) or ""
            what = m.group(2)
        else:
            m = self._NONE.match(message)
            if m:
                what = m.group(1)
        m = self._PART_OF.match(what)
        if m:
            self.partition, self.topic = int(m.group(1)), m.group(2)


def broker_error(code: int, message: str) -> BrokerError:
    """The exception of an ERROR frame: ``NotLeader`` for code 22, else ``BrokerError``."""
    return NotLeader(code, message) if code == 22 else BrokerError(code, message)


class ConnectionLost(FerryMQError):
    """The connection closed, or was never made. Requests waiting for an answer fail with it.

    ``sent`` says whether the request that failed with it may have reached the broker (False
    when it failed before it was written)."""

    sent = True


class FirstConnectError(ConnectionLost):
    """The first connection of a client could not be made (refused, timed out, TLS failed):
    there never was a connection to lose. ``Client(wait_on_first_connect=seconds)`` keeps
    trying for that long before raising it."""

    sent = False


class ReceiptLost(ConnectionLost):
    """A publish was sent but its receipt never came: the connection went away in between.

    The messages may or may not be stored. Publish them again if duplicates are acceptable, or
    look them up (for example by a key or a header the application set) before retrying.
    """

    def __init__(self, topic: str, count: int, cause: BaseException | None) -> None:
        super().__init__(
            f"the receipt of a publish of {count} message(s) to {topic!r} was lost with the "
            f"connection ({cause}); they may or may not be stored"
        )
        self.topic = topic
        self.count = count


class PublishWindowFull(FerryMQError):
    """The bounded window of unconfirmed publishes did not free up in time."""


class ClientClosed(FerryMQError):
    """An operation on a client that was closed."""


class TopicConfigMismatch(FerryMQError):
    """``create_topic(..., if_not_exists=True)`` found the topic with another configuration.
    ``existing`` is its ``TopicConfig``; ``differences`` name each field that differs."""

    name = "conflict"

    def __init__(self, topic: str, existing: object, differences: list[str]) -> None:
        super().__init__(f"topic {topic!r} exists with another configuration: {', '.join(differences)}")
        self.topic = topic
        self.existing = existing
        self.differences = differences
