"""The codec against every golden frame of its protocol version, byte-exact both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ferrymq import protocol as p
from ferrymq.errors import ProtocolError

REPO = Path(__file__).resolve().parents[3]
# The frozen file of the version this client speaks (protocol/vectors-v<N>.json) while it speaks an
# older one than the newest: a later version may lay out a frame differently (version 3 extends
# STATS_REPLY), so the newest file is not this client's. The newest is protocol/vectors.json.
_OWN = REPO / "protocol" / f"vectors-v{p.PROTOCOL_VERSION}.json"
VECTORS = json.loads((_OWN if _OWN.exists() else REPO / "protocol" / "vectors.json").read_text(encoding="utf-8"))


def _spoken(since: dict[str, int], name: str) -> bool:
    return since.get(name, 1) <= p.PROTOCOL_VERSION


# Frames and codes of a protocol version newer than this client's are not its own: it never
# offers that version, so the server never sends them to it.
_OPCODE_SINCE = VECTORS.get("opcode_since", {})
_ERROR_CODE_SINCE = VECTORS.get("error_code_since", {})
VECTORS["vectors"] = [v for v in VECTORS["vectors"] if _spoken(_OPCODE_SINCE, v["frame"])]
VECTORS["opcodes"] = {n: c for n, c in VECTORS["opcodes"].items() if _spoken(_OPCODE_SINCE, n)}
VECTORS["error_codes"] = {n: c for n, c in VECTORS["error_codes"].items() if _spoken(_ERROR_CODE_SINCE, n)}


def u64(v: Any) -> int:
    """A u64 is a JSON number or, above 2^53, a decimal string."""
    if isinstance(v, str):
        if not v.isdigit():
            raise ValueError(f"not a decimal u64: {v!r}")
        return int(v)
    assert isinstance(v, int) and not isinstance(v, bool), v
    return v


def byte_string(v: Any) -> bytes:
    if "utf8" in v:
        return v["utf8"].encode("utf-8")
    return bytes.fromhex(v["hex"])


def opt_bytes(v: Any) -> bytes | None:
    return None if v is None else byte_string(v)


def config(c: dict) -> p.TopicConfig:
    return p.TopicConfig(
        partitions=c["partitions"],
        storage=p.Storage[c["storage"].upper()],
        overflow=p.Overflow[c["overflow"].upper()],
        max_messages=u64(c["max_messages"]),
        max_bytes=u64(c["max_bytes"]),
        fsync=p.Fsync[c["fsync"].upper()],
        fsync_interval_ms=c["fsync_interval_ms"],
        retention_ms=u64(c["retention_ms"]),
        retention_policy=p.RetentionPolicy[c["retention_policy"].upper()],
        dedup_window_ms=u64(c["dedup_window_ms"]),
        replicas=c.get("replicas", 0),  # version 3
    )


def topic_info(t: dict) -> p.TopicInfo:
    return p.TopicInfo(t["name"], config(t["config"]), u64(t["messages"]), u64(t["bytes"]), list(t["subscriptions"]))


def message(m: dict) -> p.Message:
    return p.Message(
        body=byte_string(m["body"]),
        key=opt_bytes(m["key"]),
        headers=[(n, v) for n, v in m["headers"]],
        priority=m["priority"],
        deliver_after_ms=None if m["deliver_after_ms"] is None else u64(m["deliver_after_ms"]),
    )


def ranges(rs: list) -> list[p.Range]:
    return [p.Range(r["partition"], u64(r["offset"]), r["count"]) for r in rs]


def latency(h: dict) -> p.Latency:
    return p.Latency(u64(h["sum_us"]), [(b, u64(c)) for b, c in h["buckets"]])


def entry(e: dict) -> p.MessageEntry:
    dl = e["dead_letter"]
    return p.MessageEntry(
        e["partition"], u64(e["offset"]), p.MessageState[e["state"].upper()], e["attempts"],
        u64(e["published_ms"]), u64(e["first_delivered_ms"]), u64(e["settled_ms"]), u64(e["due_ms"]),
        byte_string(e["result"]), e["reason"], None if dl is None else (dl["partition"], u64(dl["offset"])),
    )  # fmt: skip


def build(name: str, f: dict) -> p.Frame:
    """The frame a vector's ``fields`` describe."""
    if name in ("PING", "PONG", "LIST_TOPICS", "OK"):
        return {"PING": p.Ping, "PONG": p.Pong, "LIST_TOPICS": p.ListTopics, "OK": p.Ok}[name]()
    if name == "HELLO":
        return p.Hello(f["version_min"], f["version_max"], f["heartbeat_ms"], f["client_name"], f["user"], f["password"])
    if name == "HELLO_OK":
        return p.HelloOk(f["version"], f["heartbeat_ms"], f["frame_bytes_max"], f["message_bytes_max"], f["server"])
    if name == "ERROR":
        return p.Error(f["code"], f["message"])
    if name == "CREATE_TOPIC":
        return p.CreateTopic(f["name"], config(f["config"]), f["if_not_exists"])
    if name == "DELETE_TOPIC":
        return p.DeleteTopic(f["name"])
    if name == "DESCRIBE_TOPIC":
        return p.DescribeTopic(f["name"])
    if name == "TOPIC_INFO":
        return p.TopicInfoFrame(topic_info(f))
    if name == "TOPIC_LIST":
        return p.TopicList([topic_info(t) for t in f["topics"]])
    if name == "PUBLISH":
        return p.Publish(f["topic"], f["partition"], [message(m) for m in f["messages"]])
    if name == "PUBLISHED":
        return p.Published(p.Durability[f["durability"].upper()], ranges(f["ranges"]))
    if name == "SUBSCRIBE":
        start = f["start"]
        return p.Subscribe(
            f["topic"], f["subscription"], p.StartKind[start["kind"].upper()], u64(start.get("value", 0)),
            f["ack_timeout_ms"], f["max_attempts"], f["credit"], f["auto_ack"], f["ordered"],
            [(r["first"], r["last"]) for r in f["partitions"]], f["dead_letter_topic"],
        )  # fmt: skip
    if name == "SUBSCRIBED":
        return p.Subscribed(f["consumer_id"], f["subscription"], f["partitions"])
    if name == "UNSUBSCRIBE":
        return p.Unsubscribe(f["consumer_id"])
    if name == "CREDIT":
        return p.Credit(f["consumer_id"], f["credit"])
    if name == "ACK":
        return p.Ack(f["consumer_id"], ranges(f["ranges"]))
    if name == "NACK":
        return p.Nack(f["consumer_id"], f["delay_ms"], f["dead_letter"], f["reason"], ranges(f["ranges"]), f["release"])
    if name == "ACK_RESULT":
        return p.AckResult(f["consumer_id"], byte_string(f["result"]), ranges(f["ranges"]))
    if name == "DELETE_SUBSCRIPTION":
        return p.DeleteSubscription(f["topic"], f["subscription"])
    if name == "DELIVER":
        out = []
        for d in f["deliveries"]:
            m = message(d["message"])
            out.append(p.Delivery(d["partition"], u64(d["offset"]), u64(d["timestamp_ms"]), d["attempt"],
                                  m.priority, m.key, m.headers, m.deliver_after_ms, m.body))  # fmt: skip
        return p.Deliver(f["consumer_id"], out)
    if name == "STATS":
        return p.Stats(f["topic"])
    if name == "STATS_REPLY":
        topics = []
        for t in f["topics"]:
            subs = [
                p.SubscriptionStats(
                    s["name"], s["ephemeral"], s["consumers"], *(u64(s[k]) for k in
                    ("messages_out", "bytes_out", "acked", "redelivered", "backlog", "in_flight", "gave_up")),
                    latency(s["deliver_latency"]), latency(s["ack_latency"]), s.get("paused", False),
                )  # fmt: skip
                for s in t["subscriptions"]
            ]
            topics.append(p.TopicStats(
                t["name"], *(u64(t[k]) for k in ("messages_in", "bytes_in", "messages_out", "bytes_out", "depth", "depth_bytes", "dropped")),
                t["publishers"], t["subscribers"], subs,
            ))  # fmt: skip
        return p.StatsReply(topics)
    if name == "MESSAGE_STATUS":
        return p.MessageStatus(f["topic"], f["partition"], u64(f["offset"]))
    if name == "MESSAGE_STATUS_REPLY":
        return p.MessageStatusReply(
            f["partition"], u64(f["offset"]), u64(f["published_ms"]), f["priority"], opt_bytes(f["key"]),
            f["body_bytes"], [(s["subscription"], entry(s["entry"])) for s in f["subscriptions"]],
        )  # fmt: skip
    if name == "LIST_MESSAGES":
        return p.ListMessages(f["topic"], f["subscription"], p.ListKind[f["kind"].upper()], byte_string(f["page"]), f["limit"])
    if name == "MESSAGE_LIST":
        return p.MessageList([entry(e) for e in f["entries"]], byte_string(f["next_page"]))
    if name == "REQUEUE_DEAD":
        s = f["selection"]
        sel = None if s["kind"] == "all" else (s["partition"], u64(s["first_offset"]), u64(s["last_offset"]))
        return p.RequeueDead(f["dead_letter_topic"], sel)
    if name == "REQUEUED":
        return p.Requeued(u64(f["requeued"]), u64(f["skipped"]))
    if name == "USER_ADD":
        return p.UserAdd(f["user"], f["password"], f["roles"])
    if name == "USER_REMOVE":
        return p.UserRemove(f["user"])
    if name == "USER_PASSWD":
        return p.UserPasswd(f["user"], f["password"])
    if name == "USER_LIST":
        return p.UserList()
    if name in ("GRANT", "REVOKE"):
        return (p.Grant if name == "GRANT" else p.Revoke)(f["user"], f["pattern"], f["actions"], f["roles"])
    if name == "TOKEN_CREATE":
        return p.TokenCreate(f["user"], f["name"], u64(f["expires_ms"]))
    if name == "TOKEN_LIST":
        return p.TokenList(f["user"])
    if name == "TOKEN_REVOKE":
        return p.TokenRevoke(f["user"], f["name"])
    if name == "USER_LIST_REPLY":
        return p.UserListReply([
            p.UserEntry(u["name"], u["roles"], u["tokens"], [(g["pattern"], g["actions"]) for g in u["grants"]])
            for u in f["users"]
        ])  # fmt: skip
    if name == "TOKEN_CREATED":
        return p.TokenCreated(f["name"], f["token"], u64(f["expires_ms"]))
    if name == "TOKEN_LIST_REPLY":
        return p.TokenListReply([p.TokenEntry(t["name"], u64(t["created_ms"]), u64(t["expires_ms"])) for t in f["tokens"]])
    if name == "PURGE_TOPIC":
        return p.PurgeTopic(f["name"])
    if name == "PURGED":
        return p.Purged(u64(f["messages"]))
    if name == "PAUSE_SUBSCRIPTION":
        return p.PauseSubscription(f["topic"], f["subscription"], f["paused"])
    if name == "LIST_CONNECTIONS":
        return p.ListConnections(u64(f["after"]), f["limit"])
    if name == "CLOSE_CONNECTION":
        return p.CloseConnection(u64(f["id"]))
    if name == "CONNECTION_LIST":
        return p.ConnectionList(u64(f["total"]), u64(f["next_after"]), [
            p.ConnectionEntry(
                u64(c["id"]), c["listener"], c["tls"], c["peer"], c["user"], c["client_name"], u64(c["connected_ms"]),
                c["subscriptions"], c["consumers"], *(u64(c[k]) for k in
                ("messages_in", "bytes_in", "messages_out", "bytes_out", "credit", "unacked")),
            )  # fmt: skip
            for c in f["connections"]
        ])  # fmt: skip
    if name == "CLUSTER_INFO":
        return p.ClusterInfo()
    if name == "CLUSTER_INFO_REPLY":
        return p.ClusterInfoReply(
            u64(f["node_id"]), u64(f["metadata_leader"]), [p.ClusterNode(u64(n["id"]), n["addr"]) for n in f["nodes"]],
            [p.PartitionLeader(x["topic"], x["partition"], u64(x["leader"]), [u64(r) for r in x["replicas"]]) for x in f["partitions"]],
        )  # fmt: skip
    raise AssertionError(f"no builder for {name}")


def test_every_opcode_has_a_vector() -> None:
    assert {v["frame"] for v in VECTORS["vectors"]} == set(VECTORS["opcodes"])
    assert VECTORS["opcodes"] == {o.name: o.value for o in p.Opcode}
    assert VECTORS["error_codes"] == {c.name.lower(): c.value for c in p.ErrorCode}


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_valid_vector(vector: dict) -> None:
    expected = bytes.fromhex(vector["hex"])
    frame = build(vector["frame"], vector["fields"])
    assert frame.OPCODE == vector["opcode"]
    assert p.encode_frame(frame, vector["request_id"]) == expected
    request_id, decoded, consumed = p.decode_frame(expected, VECTORS["frame_bytes_max"])
    assert consumed == len(expected)
    assert request_id == vector["request_id"]
    assert decoded == frame
    # Through the stream decoder, one byte at a time: a frame is only returned once whole.
    d = p.Decoder(VECTORS["frame_bytes_max"])
    for i in range(len(expected) - 1):
        d.feed(expected[i : i + 1])
        assert d.next() is None
    d.feed(expected[-1:])
    assert d.next() == (request_id, frame)
    assert d.buffered() == 0


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_every_truncated_payload_is_refused(vector: dict) -> None:
    """A payload cut anywhere (with the header's length adjusted) is never accepted."""
    raw = bytes.fromhex(vector["hex"])
    payload = raw[12:]
    for cut in range(len(payload)):
        short = p.encode_header(cut, vector["opcode"], 1) + payload[:cut]
        with pytest.raises(ProtocolError):
            p.decode_frame(short)


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vector(vector: dict) -> None:
    with pytest.raises(ProtocolError) as caught:
        p.decode_frame(bytes.fromhex(vector["hex"]), VECTORS["frame_bytes_max"])
    assert caught.value.kind == vector["error"], str(caught.value)
    if vector.get("field") is not None:
        assert caught.value.field == vector["field"], str(caught.value)


def test_encoder_refuses_what_the_decoder_refuses() -> None:
    with pytest.raises(ProtocolError, match="record.priority"):
        p.encode_frame(p.Publish("t", None, [p.Message(b"x", priority=10)]))
    with pytest.raises(ProtocolError, match="record.key_len"):
        p.encode_frame(p.Publish("t", None, [p.Message(b"x", key=b"k" * 1025)]))
    with pytest.raises(ProtocolError, match="publish.topic"):
        p.encode_frame(p.Publish("", None, [p.Message(b"x")]))
    with pytest.raises(ProtocolError, match="record.header.name"):
        p.encode_frame(p.Publish("t", None, [p.Message(b"x", headers=[("", "v")])]))
    with pytest.raises(ProtocolError, match="subscribe.flags"):
        p.encode_frame(p.Subscribe("t", auto_ack=True, ordered=True))


def test_secrets_stay_out_of_reprs() -> None:
    """A password or token never shows in a frame's repr (and so in a log line)."""
    for frame in (
        p.Hello(user="alice", password="hunter2-secret"),
        p.UserAdd("alice", "hunter2-secret", p.Role.MONITOR),
        p.UserPasswd("", "hunter2-secret"),
        p.TokenCreated("deploy", "fmq_hunter2-secret", 0),
    ):
        assert "hunter2-secret" not in repr(frame), repr(frame)


def test_u64_reader_accepts_numbers_and_strings() -> None:
    assert u64(5) == 5
    assert u64("18446744073709551615") == 2**64 - 1
    with pytest.raises(ValueError):
        u64("-1")


# Version 2, which the client still speaks to a broker that has no version 3: its frozen file.
V2 = json.loads((REPO / "protocol" / "vectors-v2.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", V2["vectors"], ids=lambda v: v["name"])
def test_valid_vector_of_version_2(vector: dict) -> None:
    expected = bytes.fromhex(vector["hex"])
    frame = build(vector["frame"], vector["fields"])
    assert p.encode_frame(frame, vector["request_id"], version=2) == expected
    request_id, decoded, consumed = p.decode_frame(expected, V2["frame_bytes_max"], version=2)
    assert (request_id, decoded, consumed) == (vector["request_id"], frame, len(expected))


@pytest.mark.parametrize("vector", V2["invalid"], ids=lambda v: v["name"])
def test_invalid_vector_of_version_2(vector: dict) -> None:
    with pytest.raises(ProtocolError) as caught:
        p.decode_frame(bytes.fromhex(vector["hex"]), V2["frame_bytes_max"], version=2)
    assert caught.value.kind == vector["error"], str(caught.value)


def test_version_2_has_no_version_3_frames_or_fields() -> None:
    for name, since in _OPCODE_SINCE.items():
        if since == 3:
            (vector,) = [v for v in VECTORS["vectors"] if v["frame"] == name][:1]
            with pytest.raises(ProtocolError) as caught:
                p.decode_frame(bytes.fromhex(vector["hex"]), version=2)
            assert caught.value.kind == "UnknownOpcode"
            with pytest.raises(ProtocolError):
                p.encode_frame(build(name, vector["fields"]), version=2)
    with pytest.raises(ProtocolError, match="replicas"):
        p.encode_frame(p.CreateTopic("t", p.TopicConfig(replicas=3)), version=2)


def test_version_3_frames_are_among_the_vectors() -> None:
    """The cluster and operator frames, not_leader and the new fields are tested above, and the
    cluster's view reads as a client follows leaders with."""
    assert p.PROTOCOL_VERSION == 3
    frames = {v["frame"] for v in VECTORS["vectors"]}
    for name, since in _OPCODE_SINCE.items():
        if since == 3:
            assert name in frames and name in VECTORS["opcodes"], name
    assert VECTORS["error_codes"]["not_leader"] == p.ErrorCode.NOT_LEADER == 22
    (vector,) = [v for v in VECTORS["vectors"] if v["name"] == "cluster_info_reply"]
    _, info, _ = p.decode_frame(bytes.fromhex(vector["hex"]))
    assert isinstance(info, p.ClusterInfoReply)
    assert (info.node_id, info.metadata_leader, info.addr(2), info.addr(3)) == (1, 2, "10.0.0.2:7070", "")
    assert (info.leader("orders", 0), info.leader("orders", 1), len(info.partitions[1].replicas)) == (2, 0, 3)
    (vector,) = [v for v in VECTORS["vectors"] if v["name"] == "create_topic_disk_bounded"]
    _, create, _ = p.decode_frame(bytes.fromhex(vector["hex"]))
    assert isinstance(create, p.CreateTopic) and create.config.replicas == 3
