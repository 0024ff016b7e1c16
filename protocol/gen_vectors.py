#!/usr/bin/env python3
"""Generates protocol/vectors.json: golden frames of the FerryMQ binary protocol, version 3.

This is a second, independent implementation of the wire format, written from docs/protocol.md
with nothing but the Python standard library. The Rust codec (crates/ferrymq-protocol) is tested
against the bytes written here, and every other client is tested against the same file, so a
mistake has to be made twice, the same way, to go unnoticed.

Usage:  python3 protocol/gen_vectors.py          # rewrites protocol/vectors.json
        python3 protocol/gen_vectors.py --check  # exits 1 when vectors.json is out of date

The output is deterministic; vectors.json is committed.

Conventions of the `fields` objects (see the "notes" in the output):
- byte strings (keys, bodies) are {"utf8": "..."} or {"hex": "..."};
- u64 values above 2^53 - 1 are decimal strings, so that JavaScript readers do not lose bits;
- enums are snake_case strings; optional values are null when absent;
- headers are a list of [name, value] pairs, in wire order (names may repeat).
"""

import json
import os
import struct
import sys

VERSION = 3
FRAME_HEADER_BYTES = 12
FRAME_BYTES_DEFAULT = 16 * 1024 * 1024
JS_SAFE_INTEGER_MAX = 2**53 - 1
NO_PARTITION = 0xFFFFFFFF

# The protocol version each opcode arrived in, for those newer than version 1. A connection on an
# older version refuses them as unknown_opcode; a client that speaks an older version skips their
# vectors.
OPCODE_SINCE = {
    "CLUSTER_INFO": 3,
    "CLUSTER_INFO_REPLY": 3,
    "PURGE_TOPIC": 3,
    "PAUSE_SUBSCRIPTION": 3,
    "LIST_CONNECTIONS": 3,
    "CLOSE_CONNECTION": 3,
    "CONNECTION_LIST": 3,
    "PURGED": 3,
}
# Likewise for error codes: an older connection is sent the nearest older code instead.
ERROR_CODE_SINCE = {"not_leader": 3}

OPCODES = {
    "HELLO": 0x01,
    "PING": 0x02,
    "PONG": 0x03,
    "CREATE_TOPIC": 0x10,
    "DELETE_TOPIC": 0x11,
    "LIST_TOPICS": 0x12,
    "DESCRIBE_TOPIC": 0x13,
    "PUBLISH": 0x20,
    "SUBSCRIBE": 0x30,
    "UNSUBSCRIBE": 0x31,
    "CREDIT": 0x32,
    "ACK": 0x33,
    "NACK": 0x34,
    "DELETE_SUBSCRIPTION": 0x35,
    "ACK_RESULT": 0x36,
    "STATS": 0x40,
    "MESSAGE_STATUS": 0x41,
    "LIST_MESSAGES": 0x42,
    "REQUEUE_DEAD": 0x43,
    "USER_ADD": 0x50,
    "USER_REMOVE": 0x51,
    "USER_PASSWD": 0x52,
    "USER_LIST": 0x53,
    "GRANT": 0x54,
    "REVOKE": 0x55,
    "TOKEN_CREATE": 0x56,
    "TOKEN_LIST": 0x57,
    "TOKEN_REVOKE": 0x58,
    "PURGE_TOPIC": 0x14,
    "PAUSE_SUBSCRIPTION": 0x37,
    "LIST_CONNECTIONS": 0x44,
    "CLOSE_CONNECTION": 0x45,
    "HELLO_OK": 0x81,
    "OK": 0x82,
    "ERROR": 0x83,
    "PUBLISHED": 0x84,
    "TOPIC_LIST": 0x85,
    "TOPIC_INFO": 0x86,
    "SUBSCRIBED": 0x87,
    "DELIVER": 0x88,
    "STATS_REPLY": 0x89,
    "MESSAGE_STATUS_REPLY": 0x8A,
    "MESSAGE_LIST": 0x8B,
    "REQUEUED": 0x8C,
    "USER_LIST_REPLY": 0x8D,
    "TOKEN_CREATED": 0x8E,
    "TOKEN_LIST_REPLY": 0x8F,
    "CLUSTER_INFO": 0x60,
    "CLUSTER_INFO_REPLY": 0xA0,
    "CONNECTION_LIST": 0x90,
    "PURGED": 0x91,
}

ERROR_CODES = {
    "malformed_frame": 1,
    "unsupported_version": 2,
    "frame_too_large": 3,
    "message_too_large": 4,
    "unknown_topic": 5,
    "topic_exists": 6,
    "topic_full": 7,
    "unknown_consumer": 8,
    "invalid_argument": 9,
    "authentication_failed": 10,
    "too_many_connections": 11,
    "handshake_required": 12,
    "internal": 13,
    "unknown_subscription": 14,
    "unknown_opcode": 15,
    "shutting_down": 16,
    "limit_exceeded": 17,
    "storage_unavailable": 18,
    "conflict": 19,
    "unknown_message": 20,
    "forbidden": 21,
    "not_leader": 22,
}

STORAGE = {"memory": 0, "disk": 1, "default": 2}
OVERFLOW = {"drop_oldest": 0, "reject": 1, "default": 2}
FSYNC = {"default": 0, "always": 1, "interval": 2, "never": 3}
RETENTION_POLICY = {"default": 0, "stream": 1, "work_queue": 2}
DURABILITY = {"memory": 0, "written": 1, "synced_interval": 2, "synced": 3}
START_KIND = {"latest": 0, "earliest": 1, "offset": 2, "time_ms": 3}
MESSAGE_STATE = {"pending": 0, "delayed": 1, "in_flight": 2, "acked": 3, "dead_lettered": 4, "settled": 5, "before_start": 6}
LIST_KIND = {"pending": 0, "in_flight": 1, "acked": 2, "dead_lettered": 3}
REQUEUE_SELECTION = {"all": 0, "range": 1}

RECORD_FLAG_KEY = 0x01
RECORD_FLAG_DELAY = 0x02
NACK_FLAG_DEAD_LETTER = 1
NACK_FLAG_RELEASE = 2
SUBSCRIBE_FLAG_AUTO_ACK = 0x01
SUBSCRIBE_FLAG_ORDERED = 0x02
ACK_RESULT_BYTES_MAX = 4096
LIST_LIMIT_MAX = 1000
CREATE_FLAG_IF_NOT_EXISTS = 0x01


# ---------------------------------------------------------------------------------------------
# Primitives: every integer little-endian, every string UTF-8 behind a u16 length.


def u8(v):
    return struct.pack("<B", v)


def u16(v):
    return struct.pack("<H", v)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def str16(s):
    raw = s.encode("utf-8")
    return u16(len(raw)) + raw


def bytes16(b):
    return u16(len(b)) + b


def header(payload_len, opcode, request_id, flags=0):
    return struct.pack("<IHHI", payload_len, opcode, flags, request_id)


def frame(opcode_name, request_id, payload):
    return header(len(payload), OPCODES[opcode_name], request_id) + payload


# ---------------------------------------------------------------------------------------------
# JSON value helpers.


def j64(v):
    """A u64 as JSON: a number when JavaScript can hold it exactly, else a decimal string."""
    return v if v <= JS_SAFE_INTEGER_MAX else str(v)


def json_u64s(value):
    """`value` with every integer above 2^53 - 1 written as a decimal string, at any depth.

    Encoders read the fields as Python integers; only the JSON form follows the rule, so a
    vector cannot forget it where a u64 is nested (a delivery's offset, a selection's range).
    """
    if isinstance(value, dict):
        return {key: json_u64s(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_u64s(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return j64(value)
    return value


def int_of(v):
    return int(v)


def utf8(s):
    return {"utf8": s}


def hexbytes(h):
    return {"hex": h}


def bytes_of(b):
    if "utf8" in b:
        return b["utf8"].encode("utf-8")
    return bytes.fromhex(b["hex"])


# ---------------------------------------------------------------------------------------------
# Payload encoders, one per frame, from `fields`.


def enc_message(m):
    key = None if m["key"] is None else bytes_of(m["key"])
    body = bytes_of(m["body"])
    delay = m["deliver_after_ms"]
    flags = 0
    if key is not None:
        flags |= RECORD_FLAG_KEY
    if delay is not None:
        flags |= RECORD_FLAG_DELAY
    out = u8(m["priority"]) + u8(flags)
    out += u16(0 if key is None else len(key)) + u16(len(m["headers"])) + u32(len(body))
    if delay is not None:
        out += u64(int_of(delay))
    if key is not None:
        out += key
    for name, value in m["headers"]:
        out += str16(name) + str16(value)
    return out + body


def enc_ranges(ranges):
    out = u32(len(ranges))
    for r in ranges:
        out += u32(r["partition"]) + u64(int_of(r["offset"])) + u32(r["count"])
    return out


def enc_topic_config(c):
    return (
        u32(c["partitions"])
        + u8(STORAGE[c["storage"]])
        + u8(OVERFLOW[c["overflow"]])
        + u64(int_of(c["max_messages"]))
        + u64(int_of(c["max_bytes"]))
        + u8(FSYNC[c["fsync"]])
        + u32(c["fsync_interval_ms"])
        + u64(int_of(c["retention_ms"]))
        + u8(RETENTION_POLICY[c["retention_policy"]])
        + u64(int_of(c["dedup_window_ms"]))
        # Version 3: copies kept in a cluster (0: the server's default).
        + u8(c["replicas"])
    )


def enc_topic_info(t):
    out = str16(t["name"]) + enc_topic_config(t["config"])
    out += u64(int_of(t["messages"])) + u64(int_of(t["bytes"]))
    out += u32(len(t["subscriptions"]))
    for s in t["subscriptions"]:
        out += str16(s)
    return out


def enc_topic_stats(t):
    out = str16(t["name"])
    for k in ("messages_in", "bytes_in", "messages_out", "bytes_out", "depth", "depth_bytes", "dropped"):
        out += u64(int_of(t[k]))
    out += u32(t["publishers"]) + u32(t["subscribers"]) + u32(len(t["subscriptions"]))
    for s in t["subscriptions"]:
        out += str16(s["name"]) + u8(1 if s["ephemeral"] else 0) + u32(s["consumers"])
        for k in ("messages_out", "bytes_out", "acked", "redelivered", "backlog", "in_flight", "gave_up"):
            out += u64(int_of(s[k]))
        out += enc_latency(s["deliver_latency"]) + enc_latency(s["ack_latency"])
        # Version 3: whether an operator paused the subscription's deliveries.
        out += u8(1 if s["paused"] else 0)
    return out


def enc_latency(h):
    out = u64(int_of(h["sum_us"])) + u16(len(h["buckets"]))
    for bucket, count in h["buckets"]:
        out += u16(bucket) + u64(int_of(count))
    return out


def enc_hello(f):
    return (
        u16(f["version_min"])
        + u16(f["version_max"])
        + u32(f["heartbeat_ms"])
        + str16(f["client_name"])
        + str16(f["user"])
        + str16(f["password"])
    )


def enc_empty(f):
    assert f == {}
    return b""


def enc_create_topic(f):
    return str16(f["name"]) + enc_topic_config(f["config"]) + u8(CREATE_FLAG_IF_NOT_EXISTS if f["if_not_exists"] else 0)


def enc_name(f):
    return str16(f["name"])


def enc_publish(f):
    partition = NO_PARTITION if f["partition"] is None else f["partition"]
    out = str16(f["topic"]) + u32(partition) + u32(len(f["messages"]))
    for m in f["messages"]:
        out += enc_message(m)
    return out


def enc_subscribe(f):
    start = f["start"]
    value = int_of(start.get("value", 0))
    return (
        str16(f["topic"])
        + str16(f["subscription"])
        + u8(START_KIND[start["kind"]])
        + u64(value)
        + u32(f["ack_timeout_ms"])
        + u32(f["max_attempts"])
        + u32(f["credit"])
        + u8((SUBSCRIBE_FLAG_AUTO_ACK if f["auto_ack"] else 0) | (SUBSCRIBE_FLAG_ORDERED if f["ordered"] else 0))
        + u16(len(f["partitions"]))
        + b"".join(u32(r["first"]) + u32(r["last"]) for r in f["partitions"])
        + str16(f["dead_letter_topic"])
    )


def enc_unsubscribe(f):
    return u32(f["consumer_id"])


def enc_credit(f):
    return u32(f["consumer_id"]) + u32(f["credit"])


def enc_ack(f):
    return u32(f["consumer_id"]) + enc_ranges(f["ranges"])


def enc_nack(f):
    return (
        u32(f["consumer_id"])
        + u32(f["delay_ms"])
        + u8((NACK_FLAG_DEAD_LETTER if f["dead_letter"] else 0) | (NACK_FLAG_RELEASE if f["release"] else 0))
        + str16(f["reason"])
        + enc_ranges(f["ranges"])
    )


def enc_delete_subscription(f):
    return str16(f["topic"]) + str16(f["subscription"])


def enc_stats(f):
    return str16(f["topic"])


def enc_ack_result(f):
    return u32(f["consumer_id"]) + bytes16(bytes_of(f["result"])) + enc_ranges(f["ranges"])


def enc_message_status(f):
    return str16(f["topic"]) + u32(f["partition"]) + u64(int_of(f["offset"]))


def enc_list_messages(f):
    return (
        str16(f["topic"])
        + str16(f["subscription"])
        + u8(LIST_KIND[f["kind"]])
        + bytes16(bytes_of(f["page"]))
        + u32(f["limit"])
    )


def enc_requeue_dead(f):
    sel = f["selection"]
    return (
        str16(f["dead_letter_topic"])
        + u8(REQUEUE_SELECTION[sel["kind"]])
        + u32(sel.get("partition", 0))
        + u64(int_of(sel.get("first_offset", 0)))
        + u64(int_of(sel.get("last_offset", 0)))
    )


def enc_message_entry(e):
    dead = e["dead_letter"]
    return (
        u32(e["partition"])
        + u64(int_of(e["offset"]))
        + u8(MESSAGE_STATE[e["state"]])
        + u16(e["attempts"])
        + u64(int_of(e["published_ms"]))
        + u64(int_of(e["first_delivered_ms"]))
        + u64(int_of(e["settled_ms"]))
        + u64(int_of(e["due_ms"]))
        + bytes16(bytes_of(e["result"]))
        + str16(e["reason"])
        + u8(0 if dead is None else 1)
        + u32(0 if dead is None else dead["partition"])
        + u64(0 if dead is None else int_of(dead["offset"]))
    )


def enc_message_status_reply(f):
    key = None if f["key"] is None else bytes_of(f["key"])
    out = u32(f["partition"]) + u64(int_of(f["offset"])) + u64(int_of(f["published_ms"])) + u8(f["priority"])
    out += u8(0 if key is None else 1) + bytes16(b"" if key is None else key)
    out += u32(f["body_bytes"]) + u32(len(f["subscriptions"]))
    for s in f["subscriptions"]:
        out += str16(s["subscription"]) + enc_message_entry(s["entry"])
    return out


def enc_message_list(f):
    out = u32(len(f["entries"]))
    for e in f["entries"]:
        out += enc_message_entry(e)
    return out + bytes16(bytes_of(f["next_page"]))


def enc_requeued(f):
    return u64(int_of(f["requeued"])) + u64(int_of(f["skipped"]))


def enc_user_add(f):
    return str16(f["user"]) + str16(f["password"]) + u8(f["roles"])


def enc_user(f):
    return str16(f["user"])


def enc_user_passwd(f):
    return str16(f["user"]) + str16(f["password"])


def enc_grant(f):
    return str16(f["user"]) + str16(f["pattern"]) + u8(f["actions"]) + u8(f["roles"])


def enc_token_create(f):
    return str16(f["user"]) + str16(f["name"]) + u64(int_of(f["expires_ms"]))


def enc_token_revoke(f):
    return str16(f["user"]) + str16(f["name"])


def enc_user_list_reply(f):
    out = u32(len(f["users"]))
    for u in f["users"]:
        out += str16(u["name"]) + u8(u["roles"]) + u32(u["tokens"]) + u16(len(u["grants"]))
        for g in u["grants"]:
            out += str16(g["pattern"]) + u8(g["actions"])
    return out


def enc_token_created(f):
    return str16(f["name"]) + str16(f["token"]) + u64(int_of(f["expires_ms"]))


def enc_token_list_reply(f):
    out = u32(len(f["tokens"]))
    for t in f["tokens"]:
        out += str16(t["name"]) + u64(int_of(t["created_ms"])) + u64(int_of(t["expires_ms"]))
    return out


def enc_cluster_info_reply(f):
    out = u64(int_of(f["node_id"])) + u64(int_of(f["metadata_leader"])) + u32(len(f["nodes"]))
    for n in f["nodes"]:
        out += u64(int_of(n["id"])) + str16(n["addr"])
    out += u32(len(f["partitions"]))
    for p in f["partitions"]:
        out += str16(p["topic"]) + u32(p["partition"]) + u64(int_of(p["leader"])) + u8(len(p["replicas"]))
        for r in p["replicas"]:
            out += u64(int_of(r))
    return out


def enc_list_connections(f):
    return u64(int_of(f["after"])) + u32(f["limit"])


def enc_close_connection(f):
    return u64(int_of(f["id"]))


def enc_pause_subscription(f):
    return str16(f["topic"]) + str16(f["subscription"]) + u8(1 if f["paused"] else 0)


def enc_purged(f):
    return u64(int_of(f["messages"]))


def enc_connection_list(f):
    out = u64(int_of(f["total"])) + u64(int_of(f["next_after"])) + u32(len(f["connections"]))
    for c in f["connections"]:
        out += u64(int_of(c["id"])) + u8(c["listener"]) + u8(1 if c["tls"] else 0)
        out += str16(c["peer"]) + str16(c["user"]) + str16(c["client_name"])
        out += u64(int_of(c["connected_ms"])) + u32(c["subscriptions"]) + u32(c["consumers"])
        for counter in ("messages_in", "bytes_in", "messages_out", "bytes_out", "credit", "unacked"):
            out += u64(int_of(c[counter]))
    return out


def enc_hello_ok(f):
    return (
        u16(f["version"])
        + u32(f["heartbeat_ms"])
        + u32(f["frame_bytes_max"])
        + u32(f["message_bytes_max"])
        + str16(f["server"])
    )


def enc_error(f):
    return u16(f["code"]) + str16(f["message"])


def enc_published(f):
    return u8(DURABILITY[f["durability"]]) + enc_ranges(f["ranges"])


def enc_topic_list(f):
    out = u32(len(f["topics"]))
    for t in f["topics"]:
        out += enc_topic_info(t)
    return out


def enc_subscribed(f):
    return u32(f["consumer_id"]) + str16(f["subscription"]) + u32(f["partitions"])


def enc_delivery(d):
    prefix = u32(d["partition"]) + u64(int_of(d["offset"])) + u64(int_of(d["timestamp_ms"])) + u16(d["attempt"])
    return prefix + enc_message(d["message"])


def enc_deliver(f):
    out = u32(f["consumer_id"]) + u32(len(f["deliveries"]))
    for d in f["deliveries"]:
        out += enc_delivery(d)
    return out


def enc_stats_reply(f):
    out = u32(len(f["topics"]))
    for t in f["topics"]:
        out += enc_topic_stats(t)
    return out


ENCODERS = {
    "HELLO": enc_hello,
    "PING": enc_empty,
    "PONG": enc_empty,
    "CREATE_TOPIC": enc_create_topic,
    "DELETE_TOPIC": enc_name,
    "LIST_TOPICS": enc_empty,
    "DESCRIBE_TOPIC": enc_name,
    "PUBLISH": enc_publish,
    "SUBSCRIBE": enc_subscribe,
    "UNSUBSCRIBE": enc_unsubscribe,
    "CREDIT": enc_credit,
    "ACK": enc_ack,
    "NACK": enc_nack,
    "DELETE_SUBSCRIPTION": enc_delete_subscription,
    "STATS": enc_stats,
    "ACK_RESULT": enc_ack_result,
    "MESSAGE_STATUS": enc_message_status,
    "LIST_MESSAGES": enc_list_messages,
    "REQUEUE_DEAD": enc_requeue_dead,
    "USER_ADD": enc_user_add,
    "USER_REMOVE": enc_user,
    "USER_PASSWD": enc_user_passwd,
    "USER_LIST": enc_empty,
    "GRANT": enc_grant,
    "REVOKE": enc_grant,
    "TOKEN_CREATE": enc_token_create,
    "TOKEN_LIST": enc_user,
    "TOKEN_REVOKE": enc_token_revoke,
    "PURGE_TOPIC": enc_name,
    "PAUSE_SUBSCRIPTION": enc_pause_subscription,
    "LIST_CONNECTIONS": enc_list_connections,
    "CLOSE_CONNECTION": enc_close_connection,
    "HELLO_OK": enc_hello_ok,
    "OK": enc_empty,
    "ERROR": enc_error,
    "PUBLISHED": enc_published,
    "TOPIC_LIST": enc_topic_list,
    "TOPIC_INFO": enc_topic_info,
    "SUBSCRIBED": enc_subscribed,
    "DELIVER": enc_deliver,
    "STATS_REPLY": enc_stats_reply,
    "MESSAGE_STATUS_REPLY": enc_message_status_reply,
    "MESSAGE_LIST": enc_message_list,
    "REQUEUED": enc_requeued,
    "USER_LIST_REPLY": enc_user_list_reply,
    "TOKEN_CREATED": enc_token_created,
    "TOKEN_LIST_REPLY": enc_token_list_reply,
    "CLUSTER_INFO": lambda f: b"",
    "CLUSTER_INFO_REPLY": enc_cluster_info_reply,
    "CONNECTION_LIST": enc_connection_list,
    "PURGED": enc_purged,
}

DIRECTION = {name: ("client_to_server" if code < 0x80 else "server_to_client") for name, code in OPCODES.items()}
# Heartbeats flow both ways: either side may PING, the other answers PONG.
DIRECTION["PING"] = "both"
DIRECTION["PONG"] = "both"


# ---------------------------------------------------------------------------------------------
# Builders for readable vector definitions.


def msg(body, key=None, headers=(), priority=0, deliver_after_ms=None):
    return {
        "key": key,
        "headers": [list(h) for h in headers],
        "priority": priority,
        "deliver_after_ms": None if deliver_after_ms is None else j64(deliver_after_ms),
        "body": body,
    }


def rng(partition, offset, count):
    return {"partition": partition, "offset": j64(offset), "count": count}


def topic_config(
    partitions=0,
    storage="default",
    overflow="default",
    max_messages=0,
    max_bytes=0,
    fsync="default",
    fsync_interval_ms=0,
    retention_ms=0,
    retention_policy="default",
    dedup_window_ms=0,
    replicas=0,
):
    return {
        "partitions": partitions,
        "storage": storage,
        "overflow": overflow,
        "max_messages": j64(max_messages),
        "max_bytes": j64(max_bytes),
        "fsync": fsync,
        "fsync_interval_ms": fsync_interval_ms,
        "retention_ms": j64(retention_ms),
        "retention_policy": retention_policy,
        "dedup_window_ms": j64(dedup_window_ms),
        "replicas": replicas,
    }


def latency(sum_us, buckets):
    """A latency histogram: the sum of its values and its non-empty (bucket, count) pairs."""
    return {"sum_us": j64(sum_us), "buckets": [[b, j64(c)] for b, c in buckets]}


NO_LATENCY = latency(0, [])


def sub_stats(
    name,
    ephemeral,
    consumers,
    messages_out,
    bytes_out,
    acked,
    redelivered,
    backlog,
    in_flight,
    gave_up,
    deliver_latency=NO_LATENCY,
    ack_latency=NO_LATENCY,
    paused=False,
):
    return {
        "name": name,
        "ephemeral": ephemeral,
        "consumers": consumers,
        "messages_out": j64(messages_out),
        "bytes_out": j64(bytes_out),
        "acked": j64(acked),
        "redelivered": j64(redelivered),
        "backlog": j64(backlog),
        "in_flight": j64(in_flight),
        "gave_up": j64(gave_up),
        "deliver_latency": deliver_latency,
        "ack_latency": ack_latency,
        "paused": paused,
    }


VALID = []


def valid(name, opcode_name, request_id, fields, description):
    VALID.append((name, opcode_name, request_id, fields, description))


# --- session -----------------------------------------------------------------------------------

valid(
    "hello_anonymous",
    "HELLO",
    1,
    {"version_min": 1, "version_max": 1, "heartbeat_ms": 0, "client_name": "ferrymq-python/0.1", "user": "", "password": ""},
    "First frame of an anonymous client: speaks version 1 only, heartbeat 0 asks for the server default.",
)
valid(
    "hello_with_credentials",
    "HELLO",
    1,
    {
        "version_min": 1,
        "version_max": 3,
        "heartbeat_ms": 10000,
        "client_name": "bench-worker-7",
        "user": "alice",
        "password": "s3cret ✓ pässword",
    },
    "HELLO offering versions 1..=3, a 10 s heartbeat, and a user with a non-ASCII password.",
)
valid("ping", "PING", 17, {}, "Heartbeat probe; the peer answers PONG with request_id 17.")
valid("ping_request_id_max", "PING", 0xFFFFFFFF, {}, "The request id is a full u32.")
valid("ping_no_reply", "PING", 0, {}, "A heartbeat PING with request_id 0: a sign of life that asks for no answer.")
valid("pong", "PONG", 17, {}, "Answer to the PING with request_id 17.")
valid(
    "hello_ok",
    "HELLO_OK",
    1,
    {"version": 1, "heartbeat_ms": 5000, "frame_bytes_max": 16777216, "message_bytes_max": 262144, "server": "ferrymq/0.1.0"},
    "Handshake accepted: version 1, heartbeat 5000 ms, the server's frame and message limits.",
)
valid("ok", "OK", 42, {}, "Success without a result (delete, credit, ack, nack, unsubscribe...).")
valid(
    "error_unknown_topic",
    "ERROR",
    9,
    {"code": ERROR_CODES["unknown_topic"], "message": "topic 'orders' does not exist"},
    "ERROR unknown_topic (5) answering request 9.",
)
valid(
    "error_malformed_frame_request_id_0",
    "ERROR",
    0,
    {"code": ERROR_CODES["malformed_frame"], "message": "invalid record.priority: 10 is above 9"},
    "ERROR malformed_frame (1) for a frame sent with request_id 0; the server then closes the connection.",
)
valid(
    "error_unknown_code",
    "ERROR",
    3,
    {"code": 500, "message": ""},
    "An error code this client does not know must still decode (treat it like internal).",
)

# --- topics -------------------------------------------------------------------------------------

valid(
    "create_topic_defaults",
    "CREATE_TOPIC",
    2,
    {"name": "orders", "config": topic_config(), "if_not_exists": False},
    "CREATE_TOPIC that leaves every setting to the server: partitions and limits 0, storage and overflow 2 (default).",
)
valid(
    "create_topic_disk_bounded",
    "CREATE_TOPIC",
    3,
    {
        "name": "events.eu-west_1",
        "config": topic_config(
            8, "disk", "reject", 1_000_000, 2**64 - 1, "interval", 50, 7 * 24 * 3600 * 1000, "work_queue", 300_000, 3
        ),
        "if_not_exists": True,
    },
    "8 partitions on disk, reject when full, a u64 max_bytes above 2^53 (written as a string), synced every 50 ms, kept a week, 3 replicas (version 3), if_not_exists.",
)
valid("delete_topic", "DELETE_TOPIC", 4, {"name": "orders"}, "DELETE_TOPIC orders.")
valid("list_topics", "LIST_TOPICS", 5, {}, "LIST_TOPICS has an empty payload.")
valid("describe_topic", "DESCRIBE_TOPIC", 6, {"name": "ünïcode-tøpic"}, "DESCRIBE_TOPIC with a UTF-8 name.")

TOPIC_ORDERS = {
    "name": "orders",
    "config": topic_config(4, "disk", "drop_oldest", 0, 1 << 30, "always", 0, 2**64 - 1, "stream", 120_000, 3),
    "messages": 1234,
    "bytes": 567890,
    "subscriptions": ["billing", "shipping"],
}
TOPIC_SCRATCH = {
    "name": "scratch",
    "config": topic_config(1, "memory", "reject", 100, 0, "never"),
    "messages": 0,
    "bytes": 0,
    "subscriptions": [],
}
valid("topic_info", "TOPIC_INFO", 6, TOPIC_ORDERS, "TOPIC_INFO answering DESCRIBE_TOPIC: config, sizes, subscription names.")
valid("topic_list_empty", "TOPIC_LIST", 5, {"topics": []}, "TOPIC_LIST of a broker without topics.")
valid(
    "topic_list_two_topics",
    "TOPIC_LIST",
    5,
    {"topics": [TOPIC_ORDERS, TOPIC_SCRATCH]},
    "TOPIC_LIST with two topic entries, each laid out exactly like a TOPIC_INFO payload.",
)

# --- publish ------------------------------------------------------------------------------------

valid(
    "publish_one_minimal",
    "PUBLISH",
    10,
    {"topic": "orders", "partition": None, "messages": [msg(utf8("hello"))]},
    "One message without key, headers or delay; partition u32::MAX lets the broker choose.",
)
valid(
    "publish_key_headers_priority_delay",
    "PUBLISH",
    11,
    {
        "topic": "orders",
        "partition": None,
        "messages": [
            msg(
                utf8('{"order":42,"total":"9.99"}'),
                key=utf8("customer-42"),
                headers=[("content-type", "application/json"), ("trace-id", "4bf92f3577b34da6")],
                priority=7,
                deliver_after_ms=60_000,
            ),
            msg(hexbytes("00ff10deadbeef"), key=hexbytes("00ff"), priority=9),
            msg(utf8(""), headers=[("ünïcode", "値"), ("dup", "1"), ("dup", "2"), ("empty", "")], deliver_after_ms=0),
            msg(utf8("keyed by number"), key=utf8("12345")),
        ],
    },
    "A batch of four records: key + headers + priority + delay; binary key and body at priority 9; "
    "no key, an empty body, UTF-8 and repeated headers, delay 0 (present but zero); a decimal key.",
)
valid(
    "publish_explicit_partition_empty_key",
    "PUBLISH",
    12,
    {
        "topic": "t",
        "partition": 3,
        "messages": [
            msg(utf8("a"), key=utf8("")),
            msg(utf8("b"), deliver_after_ms=30 * 86_400_000),
        ],
    },
    "Explicit partition 3; an empty key (flag set, key_len 0) differs from no key; the longest delay (30 days).",
)
valid(
    "published_memory",
    "PUBLISHED",
    10,
    {"durability": "memory", "ranges": [rng(0, 0, 1)]},
    "Receipt of one message on a memory topic: message id 0-0.",
)
valid(
    "published_synced_ranges",
    "PUBLISHED",
    11,
    {"durability": "synced", "ranges": [rng(2, 1000, 2), rng(0, 77, 1), rng(2, 1002, 1), rng(5, 2**53 + 1, 3)]},
    "Receipt of a 7-message batch after fsync: ranges in message order (ids 2-1000, 2-1001, 0-77, 2-1002, ...).",
)
valid(
    "published_written",
    "PUBLISHED",
    13,
    {"durability": "written", "ranges": [rng(1, 9, 1)]},
    "Durability written (1): in the log, not yet synced (fsync=never).",
)
valid(
    "published_synced_interval_no_ranges",
    "PUBLISHED",
    14,
    {"durability": "synced_interval", "ranges": []},
    "Durability synced_interval (2) with no ranges (the receipt of an empty publish).",
)

# --- subscriptions ------------------------------------------------------------------------------

valid(
    "subscribe_ephemeral_latest_auto_ack",
    "SUBSCRIBE",
    20,
    {
        "topic": "orders",
        "subscription": "",
        "start": {"kind": "latest"},
        "ack_timeout_ms": 0,
        "max_attempts": 0,
        "credit": 1000,
        "auto_ack": True,
        "ordered": False,
        "partitions": [],
        "dead_letter_topic": "",
    },
    "A plain subscriber: ephemeral subscription, from the latest message, at-most-once, 1000 credit.",
)
valid(
    "subscribe_shared_earliest",
    "SUBSCRIBE",
    21,
    {
        "topic": "orders",
        "subscription": "billing",
        "start": {"kind": "earliest"},
        "ack_timeout_ms": 30000,
        "max_attempts": 5,
        "credit": 64,
        "auto_ack": False,
        "ordered": False,
        "partitions": [],
        "dead_letter_topic": "",
    },
    "Joins (or creates) the shared subscription billing, starting at the earliest retained message.",
)
valid(
    "subscribe_from_offset",
    "SUBSCRIBE",
    22,
    {
        "topic": "orders",
        "subscription": "replay",
        "start": {"kind": "offset", "value": j64(0x0123456789ABCDEF)},
        "ack_timeout_ms": 10,
        "max_attempts": 1,
        "credit": 1_000_000,
        "auto_ack": False,
        "ordered": False,
        "partitions": [],
        "dead_letter_topic": "",
    },
    "Starts at an offset above 2^53 (a string in JSON), with the smallest ack timeout and the largest credit.",
)
valid(
    "subscribe_from_time",
    "SUBSCRIBE",
    23,
    {
        "topic": "orders",
        "subscription": "audit",
        "start": {"kind": "time_ms", "value": 1_795_000_000_000},
        "ack_timeout_ms": 86_400_000,
        "max_attempts": 10,
        "credit": 0,
        "auto_ack": False,
        "ordered": False,
        "partitions": [],
        "dead_letter_topic": "",
    },
    "Starts at the first message published at or after a Unix time in ms; credit 0 until CREDIT arrives.",
)
valid(
    "subscribe_chosen_partitions",
    "SUBSCRIBE",
    25,
    {
        "topic": "orders",
        "subscription": "shard-b",
        "start": {"kind": "earliest"},
        "ack_timeout_ms": 0,
        "max_attempts": 0,
        "credit": 256,
        "auto_ack": False,
        "ordered": False,
        "partitions": [{"first": 1, "last": 2}, {"first": 4, "last": 7}],
        "dead_letter_topic": "",
    },
    "A consumer of partitions 1,2,4-7 only: inclusive ranges; the subscription's other consumers serve the rest.",
)
valid(
    "subscribe_ordered_own_dead_letter_topic",
    "SUBSCRIBE",
    26,
    {
        "topic": "payments",
        "subscription": "ledger",
        "start": {"kind": "earliest"},
        "ack_timeout_ms": 60000,
        "max_attempts": 3,
        "credit": 32,
        "auto_ack": False,
        "ordered": True,
        "partitions": [{"first": 0, "last": 3}],
        "dead_letter_topic": "payments.failed",
    },
    "Ordered delivery (flags bit 1) of partitions 0-3, given-up messages to payments.failed instead of payments.dlq.",
)
valid(
    "subscribed",
    "SUBSCRIBED",
    20,
    {"consumer_id": 1, "subscription": "ephemeral#7", "partitions": 4},
    "SUBSCRIBED: the consumer id, the subscription name (server-chosen for an ephemeral one), the topic's partitions.",
)
valid("unsubscribe", "UNSUBSCRIBE", 24, {"consumer_id": 1}, "UNSUBSCRIBE consumer 1.")
valid("credit", "CREDIT", 0, {"consumer_id": 1, "credit": 500}, "500 more credit for consumer 1, no response wanted.")
valid(
    "ack_one_range",
    "ACK",
    0,
    {"consumer_id": 1, "ranges": [rng(0, 41, 1)]},
    "Acks message 0-41, request_id 0 (no response on success).",
)
valid(
    "ack_many_ranges",
    "ACK",
    30,
    {"consumer_id": 2, "ranges": [rng(0, 0, 100), rng(3, 7, 1), rng(0, 200, 50), rng(4294967295, 2**64 - 2**32, 4294967295)]},
    "Acks several ranges across partitions, including the largest partition, offset and count that do not overflow.",
)
valid("ack_no_ranges", "ACK", 31, {"consumer_id": 2, "ranges": []}, "An ACK with no ranges is valid and does nothing.")
valid(
    "nack_now",
    "NACK",
    32,
    {"consumer_id": 1, "delay_ms": 0, "dead_letter": False, "release": False, "reason": "", "ranges": [rng(1, 10, 3)]},
    "NACK 1-10..1-12 with delay 0: ready again at once.",
)
valid(
    "nack_delayed",
    "NACK",
    33,
    {"consumer_id": 1, "delay_ms": 5000, "dead_letter": False, "release": False, "reason": "", "ranges": [rng(0, 5, 1), rng(2, 9, 2)]},
    "NACK with a 5 s delay before redelivery.",
)
valid(
    "nack_dead_letter",
    "NACK",
    35,
    {"consumer_id": 1, "delay_ms": 0, "dead_letter": True, "release": False, "reason": "unparseable: missing field 'id'", "ranges": [rng(0, 7, 1)]},
    "NACK that moves 0-7 to the dead-letter topic now, with the reason it carries there.",
)
valid(
    "nack_release",
    "NACK",
    34,
    {"consumer_id": 1, "delay_ms": 0, "dead_letter": False, "release": True, "reason": "", "ranges": [rng(0, 8, 24)]},
    "NACK that releases 0-8..0-31 unprocessed: ready again at once, their delivery not counted as an attempt.",
)
valid(
    "ack_result",
    "ACK_RESULT",
    36,
    {"consumer_id": 1, "result": utf8('{"invoice":"INV-2026-0042"}'), "ranges": [rng(0, 41, 1), rng(2, 7, 3)]},
    "Acks 0-41 and 2-7..2-9, attaching a result the broker keeps with each of them for status queries.",
)
valid(
    "ack_result_empty_result",
    "ACK_RESULT",
    0,
    {"consumer_id": 3, "result": hexbytes(""), "ranges": [rng(1, 2**53 + 1, 1)]},
    "An empty result is valid (like ACK); request_id 0, an offset above 2^53.",
)
valid(
    "ack_result_largest_result",
    "ACK_RESULT",
    37,
    {"consumer_id": 2, "result": hexbytes("5a" * ACK_RESULT_BYTES_MAX), "ranges": [rng(0, 0, 1)]},
    "A result of 4096 bytes, the largest allowed.",
)
valid(
    "delete_subscription",
    "DELETE_SUBSCRIPTION",
    34,
    {"topic": "orders", "subscription": "billing"},
    "Deletes the shared subscription billing of orders.",
)

valid(
    "deliver_batch",
    "DELIVER",
    0,
    {
        "consumer_id": 1,
        "deliveries": [
            {
                "partition": 0,
                "offset": 41,
                "timestamp_ms": 1_795_000_000_123,
                "attempt": 1,
                "message": msg(
                    utf8('{"order":42}'),
                    key=utf8("customer-42"),
                    headers=[("content-type", "application/json")],
                    priority=7,
                    deliver_after_ms=60_000,
                ),
            },
            {
                "partition": 3,
                "offset": 2**53 + 5,
                "timestamp_ms": 1_795_000_000_456,
                "attempt": 2,
                "message": msg(hexbytes("000102")),
            },
            {
                "partition": 0,
                "offset": 42,
                "timestamp_ms": 0,
                "attempt": 65535,
                "message": msg(utf8(""), key=hexbytes(""), headers=[("x-dead-letter", "no")]),
            },
        ],
    },
    "A server push (request_id 0) of three deliveries: a full record, a redelivery (attempt 2) from partition 3 "
    "at an offset above 2^53, and an empty body with an empty key.",
)

valid("stats_one_topic", "STATS", 40, {"topic": "orders"}, "Statistics of one topic.")
valid("stats_all_topics", "STATS", 41, {"topic": ""}, "An empty topic name asks for the statistics of every topic.")
valid(
    "stats_reply",
    "STATS_REPLY",
    41,
    {
        "topics": [
            {
                "name": "orders",
                "messages_in": 1_000_000,
                "bytes_in": 100_000_000,
                "messages_out": 1_999_990,
                "bytes_out": 199_999_000,
                "depth": 10,
                "depth_bytes": 1000,
                "dropped": 0,
                "publishers": 2,
                "subscribers": 3,
                "subscriptions": [
                    sub_stats(
                        "billing",
                        False,
                        2,
                        999_995,
                        99_999_500,
                        999_990,
                        17,
                        5,
                        5,
                        3,
                        # Buckets 0 (0 µs), 40 ([128, 144) µs) and 271 (the last, 17.9 h and up).
                        latency(5_000_000_000_000_000_000, [(0, 7), (40, 999_980), (271, 8)]),
                        latency(123_456_789, [(100, 2**64 - 1)]),
                        paused=True,
                    ),
                    sub_stats("ephemeral#7", True, 1, 999_995, 99_999_500, 999_995, 0, 5, 0, 0),
                ],
            },
            {
                "name": "scratch",
                "messages_in": 2**64 - 1,
                "bytes_in": 0,
                "messages_out": 0,
                "bytes_out": 0,
                "depth": 0,
                "depth_bytes": 0,
                "dropped": 12,
                "publishers": 0,
                "subscribers": 0,
                "subscriptions": [],
            },
        ]
    },
    "STATS_REPLY with two topics, the first with two subscription entries (shared and ephemeral); "
    "billing is paused (version 3: each subscription entry ends with its paused byte).",
)


# --- message status, listings, dead letters ------------------------------------------------------


def entry(
    partition,
    offset,
    state,
    attempts=0,
    published_ms=0,
    first_delivered_ms=0,
    settled_ms=0,
    due_ms=0,
    result=None,
    reason="",
    dead_letter=None,
):
    return {
        "partition": partition,
        "offset": j64(offset),
        "state": state,
        "attempts": attempts,
        "published_ms": j64(published_ms),
        "first_delivered_ms": j64(first_delivered_ms),
        "settled_ms": j64(settled_ms),
        "due_ms": j64(due_ms),
        "result": hexbytes("") if result is None else result,
        "reason": reason,
        "dead_letter": None if dead_letter is None else {"partition": dead_letter[0], "offset": j64(dead_letter[1])},
    }


T0 = 1_795_000_000_000

valid(
    "message_status",
    "MESSAGE_STATUS",
    50,
    {"topic": "orders", "partition": 3, "offset": 1041},
    "Where message 3-1041 of orders stands in every subscription.",
)
valid(
    "message_status_reply",
    "MESSAGE_STATUS_REPLY",
    50,
    {
        "partition": 3,
        "offset": 1041,
        "published_ms": T0,
        "priority": 7,
        "key": utf8("customer-42"),
        "body_bytes": 512,
        "subscriptions": [
            {
                "subscription": "billing",
                "entry": entry(3, 1041, "acked", 1, T0, T0 + 5, T0 + 20, 0, utf8("ok")),
            },
            {
                "subscription": "shipping",
                "entry": entry(
                    3, 1041, "dead_lettered", 5, T0, T0 + 7, T0 + 9_000, 0, None, "gave up after 5 attempts", (0, 17)
                ),
            },
            {"subscription": "audit", "entry": entry(3, 1041, "in_flight", 2, T0, T0 + 3, 0, T0 + 30_003)},
            {"subscription": "replay", "entry": entry(3, 1041, "delayed", 0, T0, 0, 0, T0 + 60_000)},
            {"subscription": "late", "entry": entry(3, 1041, "pending", 0, T0)},
            {"subscription": "old", "entry": entry(3, 1041, "settled", 0, T0)},
            {"subscription": "newcomer", "entry": entry(3, 1041, "before_start", 0, T0)},
        ],
    },
    "MESSAGE_STATUS_REPLY: a keyed message at priority 7, and its entry in seven subscriptions, one per state: acked "
    "with a result, dead-lettered to 0-17 of the dead-letter topic with a reason, in flight until its ack deadline, "
    "delayed until due, pending, settled beyond the broker's history (outcome unknown), and before the start of a "
    "subscription created after it.",
)
valid(
    "message_status_reply_no_key_no_subscriptions",
    "MESSAGE_STATUS_REPLY",
    51,
    {
        "partition": 0,
        "offset": 2**64 - 1,
        "published_ms": 0,
        "priority": 0,
        "key": None,
        "body_bytes": 0,
        "subscriptions": [],
    },
    "A key-less message (has_key 0, an empty key field) in a topic without subscriptions; the largest offset.",
)
valid(
    "message_status_reply_empty_key",
    "MESSAGE_STATUS_REPLY",
    52,
    {"partition": 1, "offset": 0, "published_ms": T0, "priority": 9, "key": hexbytes(""), "body_bytes": 65536, "subscriptions": []},
    "An empty key (has_key 1, zero bytes) differs from no key.",
)
valid(
    "list_messages_first_page",
    "LIST_MESSAGES",
    53,
    {"topic": "orders", "subscription": "billing", "kind": "pending", "page": hexbytes(""), "limit": 100},
    "The first page (empty token) of at most 100 pending messages of billing, delayed ones included.",
)
valid(
    "list_messages_next_page",
    "LIST_MESSAGES",
    54,
    {"topic": "orders", "subscription": "shipping", "kind": "dead_lettered", "page": hexbytes("0300000011040000000000"), "limit": LIST_LIMIT_MAX},
    "The next page of dead-lettered messages, with the token the previous MESSAGE_LIST handed out; the largest limit.",
)
valid(
    "list_messages_in_flight",
    "LIST_MESSAGES",
    55,
    {"topic": "orders", "subscription": "audit", "kind": "in_flight", "page": hexbytes(""), "limit": 1},
    "One in-flight message of audit.",
)
valid(
    "list_messages_acked",
    "LIST_MESSAGES",
    56,
    {"topic": "orders", "subscription": "billing", "kind": "acked", "page": hexbytes(""), "limit": 10},
    "The ten most recently acked messages of billing.",
)
valid(
    "message_list",
    "MESSAGE_LIST",
    54,
    {
        "entries": [
            entry(3, 1041, "dead_lettered", 5, T0, T0 + 7, T0 + 9_000, 0, None, "gave up after 5 attempts", (0, 17)),
            entry(1, 2**53 + 3, "dead_lettered", 1, T0 - 5, T0, T0 + 1, 0, hexbytes("00ff"), "unparseable", (2, 2**53 + 9)),
        ],
        "next_page": hexbytes("0100000003000000"),
    },
    "Two dead-lettered entries, newest first, and the token of the next page.",
)
valid(
    "message_list_last_page",
    "MESSAGE_LIST",
    53,
    {"entries": [entry(0, 5, "pending", 0, T0), entry(0, 6, "delayed", 1, T0, T0 + 1, 0, T0 + 5_000)], "next_page": hexbytes("")},
    "The last page (empty next_page) of a pending listing: a pending and a delayed message, in offset order.",
)
valid("message_list_empty", "MESSAGE_LIST", 55, {"entries": [], "next_page": hexbytes("")}, "Nothing to list.")
valid(
    "requeue_dead_all",
    "REQUEUE_DEAD",
    57,
    {"dead_letter_topic": "orders.dlq", "selection": {"kind": "all"}},
    "Requeues every dead letter of orders.dlq; selection 0 carries zeros for partition and offsets.",
)
valid(
    "requeue_dead_range",
    "REQUEUE_DEAD",
    58,
    {"dead_letter_topic": "orders.dlq", "selection": {"kind": "range", "partition": 0, "first_offset": 10, "last_offset": 19}},
    "Requeues the dead letters at offsets 10..=19 of partition 0 of orders.dlq.",
)
valid(
    "requeue_dead_one",
    "REQUEUE_DEAD",
    59,
    {"dead_letter_topic": "payments.failed", "selection": {"kind": "range", "partition": 2, "first_offset": 2**53 + 1, "last_offset": 2**53 + 1}},
    "Requeues one dead letter: first_offset == last_offset.",
)
valid("requeued", "REQUEUED", 58, {"requeued": 8, "skipped": 2}, "8 dead letters published again; 2 selected offsets skipped.")
valid(
    "hello_token",
    "HELLO",
    1,
    {"version_min": 1, "version_max": 1, "heartbeat_ms": 5000, "client_name": "billing", "user": "", "password": "fmq_" + "0123456789abcdef" * 4},
    "HELLO with an API token: an empty user and the token as the password.",
)
valid("user_add", "USER_ADD", 60, {"user": "billing", "password": "s3cret-pass", "roles": 0}, "Adds user billing without roles.")
valid("user_add_monitor", "USER_ADD", 61, {"user": "grafana", "password": "watch-it-all", "roles": 2}, "Adds user grafana with the monitor role (bit 2).")
valid("user_remove", "USER_REMOVE", 62, {"user": "billing"}, "Removes user billing: its connections lose their rights at their next operation.")
valid("user_passwd_self", "USER_PASSWD", 63, {"user": "", "password": "new-pass-123"}, "Sets the connection's own password (empty user).")
valid("user_list", "USER_LIST", 64, {}, "Lists users (admin only).")
valid("grant", "GRANT", 65, {"user": "billing", "pattern": "orders.*", "actions": 3, "roles": 0}, "Grants publish and consume (1 | 2) on every topic starting with orders.")
valid("grant_role", "GRANT", 66, {"user": "grafana", "pattern": "", "actions": 0, "roles": 2}, "Grants the monitor role only: no pattern, no actions.")
valid(
    "grant_purge_pause",
    "GRANT",
    72,
    {"user": "oncall", "pattern": "orders", "actions": 48, "roles": 0},
    "Version 3: grants purge and pause (16 | 32) on orders, without manage.",
)
valid("revoke", "REVOKE", 67, {"user": "billing", "pattern": "orders.*", "actions": 2, "roles": 0}, "Takes consume away from the grant on orders.*.")
valid("token_create", "TOKEN_CREATE", 68, {"user": "", "name": "deploy", "expires_ms": 0}, "Creates the connection's own token named deploy, never expiring.")
valid("token_create_expiring", "TOKEN_CREATE", 69, {"user": "billing", "name": "ci", "expires_ms": T0 + 86_400_000}, "Creates token ci for billing, expiring a day after T0 (unix ms).")
valid("token_list", "TOKEN_LIST", 70, {"user": "billing"}, "Lists billing's tokens: names and dates, never values.")
valid("token_revoke", "TOKEN_REVOKE", 71, {"user": "billing", "name": "ci"}, "Revokes billing's token ci at once.")
valid(
    "user_list_reply",
    "USER_LIST_REPLY",
    64,
    {
        "users": [
            {"name": "admin", "roles": 1, "tokens": 0, "grants": []},
            {"name": "billing", "roles": 0, "tokens": 2, "grants": [{"pattern": "orders.*", "actions": 3}, {"pattern": "audit", "actions": 4}]},
        ]
    },
    "Two users, by name: an admin, and billing with two grants and two tokens.",
)
valid(
    "user_list_reply_purge_pause",
    "USER_LIST_REPLY",
    64,
    {"users": [{"name": "oncall", "roles": 0, "tokens": 0, "grants": [{"pattern": "orders", "actions": 20}, {"pattern": "audit.*", "actions": 32}]}]},
    "Version 3: oncall may inspect and purge (4 | 16) orders and pause subscriptions of audit.* (32). A version 2 "
    "connection is sent only the bits it knows, without a grant left with none: orders with 4, no audit.*.",
)
valid("token_created", "TOKEN_CREATED", 68, {"name": "deploy", "token": "fmq_" + "89abcdef01234567" * 4, "expires_ms": 0}, "The new token, shown this once.")
valid(
    "token_list_reply",
    "TOKEN_LIST_REPLY",
    70,
    {"tokens": [{"name": "ci", "created_ms": T0, "expires_ms": T0 + 86_400_000}, {"name": "deploy", "created_ms": T0 + 5, "expires_ms": 0}]},
    "Two tokens with their creation and expiry times (0: never).",
)
valid("list_connections", "LIST_CONNECTIONS", 80, {"after": 0, "limit": 100}, "The first page of up to 100 connections (version 3).")
valid("list_connections_next", "LIST_CONNECTIONS", 81, {"after": 1041, "limit": 2}, "The next page: connections with ids above 1041.")
valid(
    "connection_list",
    "CONNECTION_LIST",
    80,
    {
        "total": 2,
        "next_after": 0,
        "connections": [
            {
                "id": 7, "listener": 0, "tls": False, "peer": "127.0.0.1:50112", "user": "", "client_name": "ferrymq-python/0.1",
                "connected_ms": T0, "subscriptions": 1, "consumers": 2, "messages_in": 0, "bytes_in": 180,
                "messages_out": 1000, "bytes_out": 130000, "credit": 24, "unacked": 8,
            },
            {
                "id": 9, "listener": 0, "tls": True, "peer": "[::1]:50200", "user": "billing", "client_name": "ferrymq-rust/0.1",
                "connected_ms": T0 + 5, "subscriptions": 0, "consumers": 0, "messages_in": 500, "bytes_in": 64000,
                "messages_out": 0, "bytes_out": 96, "credit": 0, "unacked": 0,
            },
        ],
    },
    "Two connections, the last page: a plain consumer and a TLS publisher of user billing.",
)
valid("close_connection", "CLOSE_CONNECTION", 82, {"id": 9}, "Closes connection 9 (admin role); answered OK.")
valid("purge_topic", "PURGE_TOPIC", 83, {"name": "orders"}, "Drops every message topic orders retains (manage action).")
valid("purged", "PURGED", 83, {"messages": 3967}, "3967 messages dropped.")
valid("pause_subscription", "PAUSE_SUBSCRIPTION", 84, {"topic": "orders", "subscription": "billing", "paused": True}, "Pauses deliveries of orders/billing.")
valid("resume_subscription", "PAUSE_SUBSCRIPTION", 85, {"topic": "orders", "subscription": "billing", "paused": False}, "Resumes them.")

# --- cluster (version 3) -------------------------------------------------------------------------

valid("cluster_info", "CLUSTER_INFO", 80, {}, "Asks a node for the cluster's nodes and who leads each replicated partition.")
valid(
    "cluster_info_reply",
    "CLUSTER_INFO_REPLY",
    80,
    {
        "node_id": 1,
        "metadata_leader": 2,
        "nodes": [{"id": 1, "addr": "10.0.0.1:7070"}, {"id": 2, "addr": "10.0.0.2:7070"}, {"id": 3, "addr": ""}],
        "partitions": [
            {"topic": "orders", "partition": 0, "leader": 2, "replicas": [2, 3, 1]},
            {"topic": "orders", "partition": 1, "leader": 0, "replicas": [3, 1, 2]},
        ],
    },
    "Node 1 answers: node 2 leads the metadata and orders/0; orders/1 is electing (leader 0); node 3's address is not known yet.",
)
valid(
    "cluster_info_reply_single",
    "CLUSTER_INFO_REPLY",
    81,
    {"node_id": 0, "metadata_leader": 0, "nodes": [], "partitions": []},
    "A broker that runs alone, not in a cluster.",
)


# ---------------------------------------------------------------------------------------------
# Invalid frames. Each is complete as far as its header says (the decoder has all payload_len
# bytes), except frame_too_large, which must be refused from its header alone.

INVALID = []


def invalid(name, raw, error, field, description):
    INVALID.append((name, raw, error, field, description))


def with_record(records, count=1, topic="orders", partition=NO_PARTITION):
    """A PUBLISH frame around raw record bytes, so that each record can be broken on purpose."""
    return frame("PUBLISH", 7, str16(topic) + u32(partition) + u32(count) + records)


def record(priority=0, flags=0, key_len=0, header_count=0, body_len=0, rest=b""):
    return u8(priority) + u8(flags) + u16(key_len) + u16(header_count) + u32(body_len) + rest


invalid(
    "truncated_credit",
    header(6, OPCODES["CREDIT"], 1) + u32(1) + u16(5),
    "Truncated",
    "credit.credit",
    "CREDIT whose payload_len (6) is too short for consumer_id and credit (8).",
)
invalid(
    "truncated_record_body",
    with_record(record(body_len=10, rest=b"hello")),
    "Truncated",
    "record.body",
    "A record announcing a 10-byte body with only 5 bytes left in the frame.",
)
invalid(
    "truncated_ranges",
    header(4 + 4 + 16, OPCODES["ACK"], 1) + u32(1) + u32(2) + u32(0) + u64(1) + u32(1),
    "Truncated",
    "ranges",
    "ACK announcing two ranges but carrying one.",
)
invalid(
    "truncated_delivery_prefix",
    header(4 + 4 + 10, OPCODES["DELIVER"], 0) + u32(1) + u32(1) + bytes(10),
    "Truncated",
    "delivery.prefix",
    "DELIVER announcing one delivery with only 10 of its 22 prefix bytes.",
)
invalid(
    "unknown_opcode",
    header(0, 0x7F, 1),
    "UnknownOpcode",
    None,
    "Opcode 0x7f is not assigned.",
)
invalid(
    "unknown_opcode_zero",
    header(4, 0x00, 1) + u32(0),
    "UnknownOpcode",
    None,
    "Opcode 0 is not assigned; its payload is consumed and the frame refused.",
)
invalid(
    "non_zero_flags",
    header(0, OPCODES["PING"], 1, flags=0x0001),
    "InvalidFlags",
    None,
    "Header flags are reserved and must be zero.",
)
invalid(
    "frame_too_large",
    header(FRAME_BYTES_DEFAULT, OPCODES["PUBLISH"], 1),
    "FrameTooLarge",
    None,
    "A header announcing 12 + 16 MiB bytes is refused from the header alone by a decoder limited to 16 MiB.",
)
invalid(
    "trailing_bytes_ping",
    header(1, OPCODES["PING"], 1) + b"\x00",
    "TrailingBytes",
    None,
    "PING has an empty payload; one extra byte is an error, never ignored.",
)
invalid(
    "trailing_bytes_credit",
    header(12, OPCODES["CREDIT"], 1) + u32(1) + u32(10) + u32(0),
    "TrailingBytes",
    None,
    "CREDIT with four bytes after its last field.",
)
invalid(
    "trailing_bytes_after_records",
    with_record(record(body_len=1, rest=b"x") + b"\x00"),
    "TrailingBytes",
    None,
    "PUBLISH of one record followed by a stray byte.",
)
invalid(
    "priority_10",
    with_record(record(priority=10, body_len=1, rest=b"x")),
    "InvalidValue",
    "record.priority",
    "Priority is 0..=9.",
)
invalid(
    "unknown_record_flag_bits",
    with_record(record(flags=0x04, body_len=1, rest=b"x")),
    "InvalidValue",
    "record.flags",
    "Record flag bit 2 is not assigned.",
)
invalid(
    "key_len_without_key_flag",
    with_record(record(flags=0, key_len=2, body_len=0, rest=b"kk")),
    "InvalidValue",
    "record.key_len",
    "key_len must be 0 when the key flag is clear.",
)
invalid(
    "key_too_long",
    with_record(record(flags=RECORD_FLAG_KEY, key_len=1025, body_len=0, rest=b"k" * 1025)),
    "InvalidValue",
    "record.key_len",
    "Keys are at most 1024 bytes.",
)
invalid(
    "too_many_headers",
    with_record(record(header_count=65)),
    "InvalidValue",
    "record.header_count",
    "At most 64 headers per message.",
)
invalid(
    "empty_header_name",
    with_record(record(header_count=1, rest=u16(0) + u16(1) + b"v")),
    "InvalidValue",
    "record.header.name_len",
    "Header names are 1..=4096 bytes.",
)
invalid(
    "bad_utf8_header_name",
    with_record(record(header_count=1, rest=u16(2) + b"\xc3\x28" + u16(1) + b"v")),
    "InvalidUtf8",
    "record.header.name",
    "A header name that is not UTF-8 (0xc3 0x28).",
)
invalid(
    "bad_utf8_header_value",
    with_record(record(header_count=1, body_len=1, rest=u16(1) + b"h" + u16(3) + b"\xff\xfe\xfd" + b"x")),
    "InvalidUtf8",
    "record.header.value",
    "A header value that is not UTF-8.",
)
invalid(
    "delay_above_30_days",
    with_record(record(flags=RECORD_FLAG_DELAY, rest=u64(30 * 86_400_000 + 1))),
    "InvalidValue",
    "record.deliver_after_ms",
    "deliver_after_ms is at most 30 days.",
)
invalid(
    "batch_count_above_limit",
    with_record(b"", count=65_537),
    "InvalidValue",
    "batch.count",
    "At most 65536 records per PUBLISH.",
)
invalid(
    "publish_count_more_than_records",
    with_record(record(body_len=1, rest=b"x"), count=2),
    "Truncated",
    "record.priority",
    "PUBLISH announcing two records but carrying one.",
)
invalid(
    "empty_topic_name",
    with_record(record(body_len=1, rest=b"x"), topic=""),
    "InvalidValue",
    "publish.topic",
    "Topic names are 1..=255 bytes.",
)
invalid(
    "topic_name_256_bytes",
    frame("DELETE_TOPIC", 1, str16("t" * 256)),
    "InvalidValue",
    "delete_topic.name",
    "Topic names are 1..=255 bytes.",
)
invalid(
    "empty_topic_name_create",
    frame("CREATE_TOPIC", 1, str16("") + enc_topic_config(topic_config()) + u8(0)),
    "InvalidValue",
    "create_topic.name",
    "CREATE_TOPIC with an empty name.",
)
invalid(
    "bad_utf8_client_name",
    frame("HELLO", 1, u16(1) + u16(1) + u32(0) + u16(1) + b"\x80" + str16("") + str16("")),
    "InvalidUtf8",
    "hello.client_name",
    "Every str16 must be UTF-8.",
)
invalid(
    "unknown_storage",
    frame("CREATE_TOPIC", 1, str16("t") + u32(1) + u8(3) + u8(0) + u64(0) + u64(0) + u8(0)),
    "InvalidValue",
    "topic.storage",
    "Storage is 0 (memory), 1 (disk) or 2 (the server's default).",
)
invalid(
    "unknown_overflow_policy",
    frame("CREATE_TOPIC", 1, str16("t") + u32(1) + u8(0) + u8(3) + u64(0) + u64(0) + u8(0)),
    "InvalidValue",
    "topic.overflow",
    "Overflow is 0 (drop_oldest), 1 (reject) or 2 (the server's default).",
)
invalid(
    "subscribe_partition_range_backwards",
    frame(
        "SUBSCRIBE",
        1,
        str16("t") + str16("") + u8(0) + u64(0) + u32(0) + u32(0) + u32(1) + u8(0) + u16(1) + u32(7) + u32(4),
    ),
    "InvalidValue",
    "subscribe.partitions",
    "A partition range's first partition must not be above its last.",
)
invalid(
    "nack_unknown_flag",
    frame("NACK", 1, u32(1) + u32(0) + u8(4) + str16("") + u32(0)),
    "InvalidValue",
    "nack.flags",
    "NACK flag bit 0 asks for dead-lettering, bit 1 for a release; the other bits are not assigned.",
)
invalid(
    "nack_release_and_dead_letter",
    frame("NACK", 1, u32(1) + u32(0) + u8(3) + str16("") + u32(0)),
    "InvalidValue",
    "nack.flags",
    "A NACK either dead-letters or releases its messages, not both.",
)
invalid(
    "unknown_fsync_policy",
    frame("CREATE_TOPIC", 1, str16("t") + u32(1) + u8(1) + u8(0) + u64(0) + u64(0) + u8(4) + u32(0) + u64(0) + u8(0)),
    "InvalidValue",
    "topic.fsync",
    "The fsync policy is 0 (server default), 1 (always), 2 (interval) or 3 (never).",
)
invalid(
    "fsync_interval_zero",
    frame("CREATE_TOPIC", 1, str16("t") + u32(1) + u8(1) + u8(0) + u64(0) + u64(0) + u8(2) + u32(0) + u64(0) + u8(0)),
    "InvalidValue",
    "topic.fsync_interval_ms",
    "The interval policy needs an interval of at least 1 ms.",
)
invalid(
    "fsync_interval_without_interval_policy",
    frame("CREATE_TOPIC", 1, str16("t") + u32(1) + u8(1) + u8(0) + u64(0) + u64(0) + u8(1) + u32(5) + u64(0) + u8(0)),
    "InvalidValue",
    "topic.fsync_interval_ms",
    "Only the interval policy carries an interval; any other policy must send 0.",
)
invalid(
    "unknown_create_flags",
    frame("CREATE_TOPIC", 1, str16("t") + enc_topic_config(topic_config()) + u8(0x02)),
    "InvalidValue",
    "create_topic.flags",
    "CREATE_TOPIC flag bit 1 is not assigned.",
)
SUBSCRIBE_TAIL = u32(0) + u32(0) + u32(10)
invalid(
    "unknown_start_kind",
    frame("SUBSCRIBE", 1, str16("t") + str16("") + u8(4) + u64(0) + SUBSCRIBE_TAIL + u8(0)),
    "InvalidValue",
    "subscribe.start",
    "Start kinds are 0 latest, 1 earliest, 2 offset, 3 time_ms.",
)
invalid(
    "start_value_with_latest",
    frame("SUBSCRIBE", 1, str16("t") + str16("") + u8(0) + u64(5) + SUBSCRIBE_TAIL + u8(0)),
    "InvalidValue",
    "subscribe.start_value",
    "start_value must be 0 for latest and earliest.",
)
invalid(
    "unknown_subscribe_flags",
    frame("SUBSCRIBE", 1, str16("t") + str16("") + u8(0) + u64(0) + SUBSCRIBE_TAIL + u8(0x80)),
    "InvalidValue",
    "subscribe.flags",
    "SUBSCRIBE flag bit 7 is not assigned.",
)
invalid(
    "subscription_name_256_bytes",
    frame("SUBSCRIBE", 1, str16("t") + str16("s" * 256) + u8(0) + u64(0) + SUBSCRIBE_TAIL + u8(0)),
    "InvalidValue",
    "subscribe.subscription",
    "Subscription names are at most 255 bytes (empty = ephemeral).",
)
invalid(
    "range_overflow",
    frame("ACK", 1, u32(1) + u32(1) + u32(0) + u64(2**64 - 1) + u32(1)),
    "InvalidValue",
    "range",
    "offset + count must not overflow a u64.",
)
invalid(
    "ranges_count_above_limit",
    frame("NACK", 1, u32(1) + u32(0) + u8(0) + str16("") + u32(65_537)),
    "InvalidValue",
    "ranges.count",
    "At most 65536 ranges per ACK, NACK or PUBLISHED.",
)
invalid(
    "unknown_durability",
    frame("PUBLISHED", 1, u8(4) + u32(0)),
    "InvalidValue",
    "published.durability",
    "Durability is 0..=3.",
)
def stats_reply_of_one_subscription(ephemeral, rest):
    """A STATS_REPLY of one topic with one subscription: its `ephemeral` byte as given, zero
    counters, then `rest` raw."""
    return frame(
        "STATS_REPLY",
        1,
        u32(1)
        + str16("t")
        + bytes(7 * 8)
        + u32(0)
        + u32(0)
        + u32(1)
        + str16("s")
        + u8(ephemeral)
        + u32(0)
        + bytes(7 * 8)
        + rest,
    )


invalid(
    "ephemeral_not_boolean",
    stats_reply_of_one_subscription(2, b""),
    "InvalidValue",
    "stats.subscription.ephemeral",
    "Booleans are 0 or 1.",
)
invalid(
    "paused_not_boolean",
    stats_reply_of_one_subscription(0, u64(0) + u16(0) + u64(0) + u16(0) + u8(2)),
    "InvalidValue",
    "stats.subscription.paused",
    "Version 3: paused is a boolean, 0 or 1.",
)


def stats_reply_with_latency(deliver_latency_bytes):
    """A STATS_REPLY whose one subscription's deliver latency is given raw (its ack latency empty)."""
    return stats_reply_of_one_subscription(0, deliver_latency_bytes + u64(0) + u16(0))


invalid(
    "latency_bucket_beyond_last",
    stats_reply_with_latency(u64(0) + u16(1) + u16(272) + u64(1)),
    "InvalidValue",
    "stats.subscription.deliver_latency",
    "Latency buckets are 0..=271.",
)
invalid(
    "latency_buckets_out_of_order",
    stats_reply_with_latency(u64(0) + u16(2) + u16(9) + u64(1) + u16(9) + u64(1)),
    "InvalidValue",
    "stats.subscription.deliver_latency",
    "Latency buckets are listed once each, ascending.",
)
invalid(
    "latency_bucket_empty",
    stats_reply_with_latency(u64(0) + u16(1) + u16(3) + u64(0)),
    "InvalidValue",
    "stats.subscription.deliver_latency",
    "Empty latency buckets are left out, never sent with a count of 0.",
)
invalid(
    "latency_too_many_buckets",
    stats_reply_with_latency(u64(0) + u16(273)),
    "InvalidValue",
    "stats.subscription.deliver_latency",
    "A histogram has at most 272 non-empty buckets.",
)
invalid(
    "subscribe_ordered_with_auto_ack",
    frame(
        "SUBSCRIBE",
        1,
        str16("t")
        + str16("s")
        + u8(0)
        + u64(0)
        + SUBSCRIBE_TAIL
        + u8(SUBSCRIBE_FLAG_AUTO_ACK | SUBSCRIBE_FLAG_ORDERED)
        + u16(0)
        + str16(""),
    ),
    "InvalidValue",
    "subscribe.flags",
    "Ordered delivery needs acks: flags bits 0 (auto_ack) and 1 (ordered) together are refused.",
)
invalid(
    "subscribe_dead_letter_topic_256_bytes",
    frame("SUBSCRIBE", 1, str16("t") + str16("s") + u8(0) + u64(0) + SUBSCRIBE_TAIL + u8(0) + u16(0) + str16("d" * 256)),
    "InvalidValue",
    "subscribe.dead_letter_topic",
    "dead_letter_topic is empty (the default <topic>.dlq) or a topic name of 1..=255 bytes.",
)
invalid(
    "ack_result_result_too_long",
    frame("ACK_RESULT", 1, u32(1) + bytes16(b"r" * (ACK_RESULT_BYTES_MAX + 1)) + enc_ranges([rng(0, 0, 1)])),
    "InvalidValue",
    "ack_result.result",
    "An ack result is at most 4096 bytes.",
)
invalid(
    "list_messages_limit_zero",
    frame("LIST_MESSAGES", 1, str16("t") + str16("s") + u8(0) + bytes16(b"") + u32(0)),
    "InvalidValue",
    "list_messages.limit",
    "limit is 1..=1000.",
)
invalid(
    "list_messages_limit_above_max",
    frame("LIST_MESSAGES", 1, str16("t") + str16("s") + u8(0) + bytes16(b"") + u32(LIST_LIMIT_MAX + 1)),
    "InvalidValue",
    "list_messages.limit",
    "limit is 1..=1000.",
)
invalid(
    "list_messages_unknown_kind",
    frame("LIST_MESSAGES", 1, str16("t") + str16("s") + u8(4) + bytes16(b"") + u32(10)),
    "InvalidValue",
    "list_messages.kind",
    "Listing kinds are 0 pending, 1 in_flight, 2 acked, 3 dead_lettered.",
)
invalid(
    "list_messages_page_too_long",
    frame("LIST_MESSAGES", 1, str16("t") + str16("s") + u8(0) + bytes16(b"p" * 65) + u32(10)),
    "InvalidValue",
    "list_messages.page",
    "A page token is at most 64 bytes.",
)
invalid(
    "requeue_dead_last_before_first",
    frame("REQUEUE_DEAD", 1, str16("t.dlq") + u8(1) + u32(0) + u64(10) + u64(9)),
    "InvalidValue",
    "requeue_dead.last_offset",
    "A range selection's last_offset must not be below its first_offset.",
)
invalid(
    "requeue_dead_all_with_offsets",
    frame("REQUEUE_DEAD", 1, str16("t.dlq") + u8(0) + u32(0) + u64(5) + u64(5)),
    "InvalidValue",
    "requeue_dead.first_offset",
    "Selection 0 (all) must carry zeros for partition, first_offset and last_offset.",
)
invalid(
    "requeue_dead_unknown_selection",
    frame("REQUEUE_DEAD", 1, str16("t.dlq") + u8(2) + u32(0) + u64(0) + u64(0)),
    "InvalidValue",
    "requeue_dead.selection",
    "Selections are 0 all and 1 range.",
)
ENTRY_PREFIX = u32(0) + u64(1)
ENTRY_TAIL = u16(1) + u64(0) * 4 + bytes16(b"") + str16("") + u8(0) + u32(0) + u64(0)
invalid(
    "message_status_reply_unknown_state",
    frame(
        "MESSAGE_STATUS_REPLY",
        1,
        u32(0) + u64(1) + u64(0) + u8(0) + u8(0) + bytes16(b"") + u32(0) + u32(1) + str16("s") + ENTRY_PREFIX + u8(7) + ENTRY_TAIL,
    ),
    "InvalidValue",
    "message_entry.state",
    "Message states are 0 pending, 1 delayed, 2 in_flight, 3 acked, 4 dead_lettered, 5 settled, 6 before_start.",
)
invalid(
    "message_status_reply_key_without_has_key",
    frame("MESSAGE_STATUS_REPLY", 1, u32(0) + u64(1) + u64(0) + u8(0) + u8(0) + bytes16(b"k") + u32(0) + u32(0)),
    "InvalidValue",
    "message_status.key",
    "With has_key 0 the key field must be empty.",
)
invalid(
    "message_list_dead_letter_position_without_flag",
    frame("MESSAGE_LIST", 1, u32(1) + ENTRY_PREFIX + u8(3) + u16(1) + u64(0) * 4 + bytes16(b"") + str16("") + u8(0) + u32(0) + u64(7) + bytes16(b"")),
    "InvalidValue",
    "message_entry.dead_letter",
    "Without the present flag, the dead-letter partition and offset must be zeros.",
)


# ---------------------------------------------------------------------------------------------


def build():
    vectors = []
    seen = set()
    for name, opcode_name, request_id, fields, description in VALID:
        assert name not in seen, name
        seen.add(name)
        raw = frame(opcode_name, request_id, ENCODERS[opcode_name](fields))
        vectors.append(
            {
                "name": name,
                "description": description,
                "frame": opcode_name,
                "opcode": OPCODES[opcode_name],
                "direction": DIRECTION[opcode_name],
                "request_id": request_id,
                "fields": json_u64s(fields),
                "hex": raw.hex(),
            }
        )
    missing = set(OPCODES) - {v["frame"] for v in vectors}
    assert not missing, f"no vector for {sorted(missing)}"

    invalid_vectors = []
    for name, raw, error, field, description in INVALID:
        assert name not in seen, name
        seen.add(name)
        entry = {"name": name, "description": description, "error": error}
        if field is not None:
            entry["field"] = field
        entry["hex"] = raw.hex()
        invalid_vectors.append(entry)

    return {
        "version": VERSION,
        "generator": "protocol/gen_vectors.py",
        "notes": [
            "hex is one complete frame: the 12-byte header (u32 payload_len, u16 opcode, u16 flags, "
            "u32 request_id, little-endian) followed by the payload.",
            "Valid vectors: build the frame from fields, encode it with request_id, compare with hex; "
            "decode hex, compare with the frame built from fields, and check that every byte was consumed.",
            "Byte strings are {\"utf8\": ...} or {\"hex\": ...}. u64 values above 2^53-1 are decimal strings; "
            "readers accept a number or a string for every u64 field.",
            "Enums are snake_case strings; absent optional values are null; headers are [name, value] pairs in wire order.",
            "Invalid vectors must be refused with the named error (the ProtocolError variant of the Rust codec); "
            "field names the field at fault where the Rust codec reports one. Decode them with a frame limit of "
            "frame_bytes_max.",
        ],
        "frame_bytes_max": FRAME_BYTES_DEFAULT,
        "error_codes": ERROR_CODES,
        "error_code_since": ERROR_CODE_SINCE,
        "opcodes": OPCODES,
        "opcode_since": OPCODE_SINCE,
        "vectors": vectors,
        "invalid": invalid_vectors,
    }


def render():
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


# protocol/vectors-v1.json is version 1's set as it was released, kept byte for byte: a server
# that still speaks version 1 must still write and read exactly those frames. It is never
# regenerated; --check only proves it unchanged.
# protocol/vectors-v2.json likewise is version 2's set as released.
FROZEN_SHA256 = {
    "vectors-v1.json": "d44286834db41ff9bbf73c0fad0da461144b54cd3e50a10921ce613cfdab622e",
    "vectors-v2.json": "062eb84edd39ed9abd673478a74156b28e71a6edb6f96e57791b498e9032906c",
}


def check_frozen(directory):
    import hashlib

    for name, expected in FROZEN_SHA256.items():
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != expected:
            print(f"{path} changed (sha256 {digest}): a released version's vectors are frozen", file=sys.stderr)
            return False
    return True


def main():
    directory = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(directory, "vectors.json")
    text = render()
    if not check_frozen(directory):
        return 1
    if "--check" in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{path} is out of date: run python3 protocol/gen_vectors.py", file=sys.stderr)
                return 1
        return 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {len(VALID)} valid and {len(INVALID)} invalid vectors to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
