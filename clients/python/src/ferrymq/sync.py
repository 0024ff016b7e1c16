"""The blocking FerryMQ client, for scripts and synchronous frameworks.

It is a thin wrapper that runs the asyncio client on an event loop of its own, in a daemon
thread, and waits for each operation's result. That choice, over a second implementation on
plain sockets, is deliberate: heartbeats must be answered while the application blocks in its
own code, reconnection and re-subscription run in the background, and pipelined requests,
receipts, credit and ack coalescing then behave exactly as in the asyncio client, from one
implementation tested once. The cost is a thread hop per call (tens of microseconds), which
batch operations (``publish_batch``, ``Subscription.next_batch``, ``ack_all``) amortise.

Every method may be called from any thread. Messages received here are settled with the same
methods as in the asyncio client (``ack``, ``nack``, ``dead_letter``), and ``with message:``
acks on success and nacks on an exception.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Coroutine, Iterable, Iterator, Optional, Sequence, TypeVar, Union

from . import aio
from . import protocol as p
from .aio import Body, Receipt, ReceivedMessage
from .errors import ClientClosed

__all__ = ["Client", "Subscription", "connect"]

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ferrymq-client", daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking FerryMQ call from the client's own event-loop thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class Client:
    """A blocking connection to a FerryMQ broker; takes the same options as
    ``ferrymq.Client``. Use it as a context manager or call ``close``."""

    def __init__(self, addr: Union[str, Sequence[str], None] = None, **options: Any) -> None:
        self._thread = _LoopThread()
        try:
            self._client: aio.Client = self._thread.run(aio.Client.connect(addr, **options))
        except BaseException:
            self._thread.stop()
            raise
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ClientClosed("this client was closed")
        return self._thread.run(coro)

    def close(self) -> None:
        if self._closed:
            return
        self._thread.run(self._client.close())
        self._closed = True
        self._thread.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def server_info(self) -> Optional[p.HelloOk]:
        return self._client.server_info

    @property
    def connected(self) -> bool:
        return self._client.connected

    @property
    def reconnects(self) -> int:
        return self._client.reconnects

    # Publishing

    def publish(self, topic: str, body: Body, **options: Any) -> Receipt:
        """Publishes one message and waits for its receipt; options as ``ferrymq.Client.publish``."""
        return self._run(self._client.publish(topic, body, **options))

    def publish_batch(self, topic: str, messages: Sequence[Union[Body, p.Message]], **options: Any) -> Receipt:
        return self._run(self._client.publish_batch(topic, messages, **options))

    def publish_batches(
        self, topic: str, batches: Iterable[Sequence[Union[Body, p.Message]]], **options: Any
    ) -> list[Receipt]:
        """Publishes many batches with several in flight at once (within the publish window)
        and returns their receipts in order; the first failure is raised after every batch
        has an outcome."""

        async def go() -> list[Receipt]:
            futures = [await self._client.start_publish_batch(topic, b, **options) for b in batches]
            results = await asyncio.gather(*futures, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            return results  # type: ignore[return-value]

        return self._run(go())

    # Admin, statistics, status

    def create_topic(self, name: str, **options: Any) -> None:
        self._run(self._client.create_topic(name, **options))

    def delete_topic(self, name: str) -> None:
        self._run(self._client.delete_topic(name))

    def list_topics(self) -> list[p.TopicInfo]:
        return self._run(self._client.list_topics())

    def describe_topic(self, name: str) -> p.TopicInfo:
        return self._run(self._client.describe_topic(name))

    def delete_subscription(self, topic: str, subscription: str) -> None:
        self._run(self._client.delete_subscription(topic, subscription))

    def stats(self, topic: str = "") -> list[p.TopicStats]:
        return self._run(self._client.stats(topic))

    def message_status(self, topic: str, message_id: Union[str, tuple[int, int]]) -> p.MessageStatusReply:
        return self._run(self._client.message_status(topic, message_id))

    def list_messages(self, topic: str, subscription: str, kind: Union[p.ListKind, str] = p.ListKind.PENDING, **options: Any) -> tuple[list[p.MessageEntry], bytes]:
        return self._run(self._client.list_messages(topic, subscription, kind, **options))

    def iter_messages(self, topic: str, subscription: str, kind: Union[p.ListKind, str] = p.ListKind.PENDING, page_size: int = 100) -> Iterator[p.MessageEntry]:
        page = b""
        while True:
            entries, page = self.list_messages(topic, subscription, kind, limit=page_size, page=page)
            yield from entries
            if not page:
                return

    def requeue_dead(self, dead_letter_topic: str, **options: Any) -> p.Requeued:
        return self._run(self._client.requeue_dead(dead_letter_topic, **options))

    # Users, grants and tokens: as ``ferrymq.Client``'s methods of the same names.

    def add_user(self, user: str, password: str, *, roles: aio.Roles = p.Role.NONE) -> None:
        """Adds ``user`` with ``password`` and ``roles``. Admin only."""
        self._run(self._client.add_user(user, password, roles=roles))

    def remove_user(self, user: str) -> None:
        """Removes ``user``, its grants and tokens. Admin only."""
        self._run(self._client.remove_user(user))

    def set_password(self, password: str, *, user: str = "") -> None:
        """Sets the password of ``user``, by default the connection's own."""
        self._run(self._client.set_password(password, user=user))

    def list_users(self) -> list[p.UserEntry]:
        """Every user with its roles, number of tokens and grants. Admin only."""
        return self._run(self._client.list_users())

    def grant(self, user: str, pattern: str = "", actions: aio.Actions = p.Action.NONE, *, roles: aio.Roles = p.Role.NONE) -> None:
        """Gives ``user`` the ``actions`` on ``pattern``, and ``roles``. Admin only."""
        self._run(self._client.grant(user, pattern, actions, roles=roles))

    def revoke(self, user: str, pattern: str = "", actions: aio.Actions = p.Action.NONE, *, roles: aio.Roles = p.Role.NONE) -> None:
        """Takes ``actions`` on exactly ``pattern``, and ``roles``, away from ``user``. Admin only."""
        self._run(self._client.revoke(user, pattern, actions, roles=roles))

    def create_token(self, name: str, *, user: str = "", expires_ms: int = 0) -> p.TokenCreated:
        """Creates an API token; its ``token`` is shown this once."""
        return self._run(self._client.create_token(name, user=user, expires_ms=expires_ms))

    def list_tokens(self, user: str = "") -> list[p.TokenEntry]:
        """The API tokens of ``user`` (names and dates, never the tokens)."""
        return self._run(self._client.list_tokens(user))

    def revoke_token(self, name: str, *, user: str = "") -> None:
        """Revokes the API token ``name`` of ``user`` at once."""
        self._run(self._client.revoke_token(name, user=user))

    def ping(self) -> float:
        return self._run(self._client.ping())

    def cluster_info(self) -> p.ClusterInfoReply:
        """The cluster's nodes and leaders (``node_id`` 0 from a broker that runs alone)."""
        return self._run(self._client.cluster_info())

    # Consuming

    def subscribe(self, topic: str, subscription: str = "", **options: Any) -> "Subscription":
        """Attaches a consumer; options as ``ferrymq.Client.subscribe``. Iterate it with
        ``for message in subscription``."""
        sub = self._run(self._client.subscribe(topic, subscription, **options))
        sub._foreign = True
        return Subscription(self, sub)


class Subscription:
    """A blocking consumer: ``for message in subscription`` blocks for each message."""

    def __init__(self, client: Client, sub: aio.Subscription) -> None:
        self._client = client
        self._sub = sub
        self._local: deque[ReceivedMessage] = deque()

    @property
    def name(self) -> str:
        return self._sub.name

    @property
    def partitions(self) -> int:
        return self._sub.partitions

    def next_batch(self, max_count: int = 1024, timeout: Optional[float] = None) -> list[ReceivedMessage]:
        """Up to ``max_count`` messages, waiting at most ``timeout`` seconds for the first one
        (an empty list then)."""
        if self._local:
            n = min(max_count, len(self._local))
            return [self._local.popleft() for _ in range(n)]
        return self._client._run(self._sub.next_batch(max_count, timeout))

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return self

    def __next__(self) -> ReceivedMessage:
        while not self._local:
            batch = self._client._run(self._sub.next_batch(self._sub.request.credit, None))
            if not batch:
                raise StopIteration
            self._local.extend(batch)
        return self._local.popleft()

    def ack_all(self, messages: Iterable[ReceivedMessage]) -> None:
        self._sub.ack_all(messages)

    def nack_all(self, messages: Iterable[ReceivedMessage], delay_ms: int = 0, reason: str = "", dead_letter: bool = False) -> None:
        self._sub.nack_all(messages, delay_ms, reason, dead_letter)

    def ack_confirmed(self, message: ReceivedMessage, result: Optional[bytes] = None) -> None:
        """Acks and waits until the broker has applied it."""
        message._settle()
        self._client._run(self._sub._ack_confirmed([message], result))

    def close(self) -> None:
        """Unsubscribes; messages taken and not yet acked go back to the subscription."""
        self._local.clear()
        self._client._run(self._sub.close())

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(addr: Union[str, Sequence[str], None] = None, **options: Any) -> Client:
    return Client(addr, **options)
