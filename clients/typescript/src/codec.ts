// The FerryMQ binary protocol, version 3 (docs/protocol.md): every frame in both directions,
// encoded into fresh bytes and decoded from a whole frame. The codec never touches a socket.
//
// Invariants:
// - decoding checks the header (flags, size limit) before the payload is needed, and every count
//   against the bytes present before allocating for it;
// - a decoded frame consumed every byte of its payload (TrailingBytes otherwise);
// - what decodes re-encodes to the same bytes (the canonical rules of the Rust codec: zero
//   start value for latest/earliest, zero dead-letter position when absent...);
// - every u64 decodes as a bigint; encoders accept a bigint, a safe integer or a decimal string.

import {
  ACK_RESULT_BYTES_MAX,
  BATCH_COUNT_MAX,
  DELAY_MS_MAX,
  DELIVERY_PREFIX_BYTES,
  ERROR_MESSAGE_BYTES_MAX,
  FRAME_HEADER_BYTES,
  HEADER_BYTES_MAX,
  HEADERS_COUNT_MAX,
  KEY_BYTES_MAX,
  LATENCY_BUCKETS,
  LIST_LIMIT_MAX,
  LIST_PAGE_BYTES_MAX,
  NAME_BYTES_MAX,
  NO_PARTITION,
  PARTITIONS_MAX,
  PRIORITY_MAX,
  RANGES_COUNT_MAX,
  RECORD_PREFIX_BYTES,
} from "./limits.js";
import { checkU32, decodeUtf8, ProtocolError, Reader, toU64, Writer } from "./wire.js";

export { ProtocolError } from "./wire.js";
export type { ProtocolErrorKind } from "./wire.js";

export const Opcode = {
  HELLO: 0x01,
  PING: 0x02,
  PONG: 0x03,
  CREATE_TOPIC: 0x10,
  DELETE_TOPIC: 0x11,
  LIST_TOPICS: 0x12,
  DESCRIBE_TOPIC: 0x13,
  PUBLISH: 0x20,
  SUBSCRIBE: 0x30,
  UNSUBSCRIBE: 0x31,
  CREDIT: 0x32,
  ACK: 0x33,
  NACK: 0x34,
  DELETE_SUBSCRIPTION: 0x35,
  ACK_RESULT: 0x36,
  STATS: 0x40,
  MESSAGE_STATUS: 0x41,
  LIST_MESSAGES: 0x42,
  REQUEUE_DEAD: 0x43,
  LIST_CONNECTIONS: 0x44,
  CLOSE_CONNECTION: 0x45,
  PURGE_TOPIC: 0x14,
  PAUSE_SUBSCRIPTION: 0x37,
  CLUSTER_INFO: 0x60,
  USER_ADD: 0x50,
  USER_REMOVE: 0x51,
  USER_PASSWD: 0x52,
  USER_LIST: 0x53,
  GRANT: 0x54,
  REVOKE: 0x55,
  TOKEN_CREATE: 0x56,
  TOKEN_LIST: 0x57,
  TOKEN_REVOKE: 0x58,
  HELLO_OK: 0x81,
  OK: 0x82,
  ERROR: 0x83,
  PUBLISHED: 0x84,
  TOPIC_LIST: 0x85,
  TOPIC_INFO: 0x86,
  SUBSCRIBED: 0x87,
  DELIVER: 0x88,
  STATS_REPLY: 0x89,
  MESSAGE_STATUS_REPLY: 0x8a,
  MESSAGE_LIST: 0x8b,
  REQUEUED: 0x8c,
  USER_LIST_REPLY: 0x8d,
  TOKEN_CREATED: 0x8e,
  TOKEN_LIST_REPLY: 0x8f,
  CONNECTION_LIST: 0x90,
  PURGED: 0x91,
  CLUSTER_INFO_REPLY: 0xa0,
} as const;

export type FrameType = keyof typeof Opcode;

const OPCODE_NAMES = new Map<number, FrameType>(
  Object.entries(Opcode).map(([name, op]) => [op, name as FrameType]),
);

/** Error codes of ERROR frames by name; a client must accept codes it does not know. */
export const ErrorCode = {
  malformed_frame: 1,
  unsupported_version: 2,
  frame_too_large: 3,
  message_too_large: 4,
  unknown_topic: 5,
  topic_exists: 6,
  topic_full: 7,
  unknown_consumer: 8,
  invalid_argument: 9,
  authentication_failed: 10,
  too_many_connections: 11,
  handshake_required: 12,
  internal: 13,
  unknown_subscription: 14,
  unknown_opcode: 15,
  shutting_down: 16,
  limit_exceeded: 17,
  storage_unavailable: 18,
  conflict: 19,
  unknown_message: 20,
  /** The user may see the topic but not do this to it, or the request needs a role it lacks. */
  forbidden: 21,
  /**
   * A cluster node does not lead what the request needs (a partition, or the cluster metadata);
   * nothing was done. The message names the leader and its address when the node knows them.
   */
  not_leader: 22,
} as const;

export type ErrorCodeName = keyof typeof ErrorCode;

const ERROR_CODE_NAMES = new Map<number, ErrorCodeName>(
  Object.entries(ErrorCode).map(([name, code]) => [code, name as ErrorCodeName]),
);

/** The name of an error code; unknown codes are treated like `internal`, as the protocol says. */
export function errorCodeName(code: number): ErrorCodeName | "unknown" {
  return ERROR_CODE_NAMES.get(code) ?? "unknown";
}

/** Codes after which the server closes the connection. */
export const CLOSING_ERROR_CODES: ReadonlySet<number> = new Set([1, 2, 3, 10, 11, 12, 15, 16]);

/** A u64 as callers may give it: decoded values are always bigint. */
export type U64Input = bigint | number | string;

export interface Range {
  partition: number;
  offset: bigint;
  count: number;
}

export interface RangeInput {
  partition: number;
  offset: U64Input;
  count: number;
}

/** One message as published and delivered (the record). */
export interface MessageRecord {
  key: Uint8Array | null;
  headers: [string, string][];
  priority: number;
  deliverAfterMs: number | null;
  body: Uint8Array;
}

export interface MessageInput {
  key?: Uint8Array | null;
  headers?: [string, string][];
  priority?: number;
  deliverAfterMs?: number | null;
  body: Uint8Array;
}

export interface DeliveryRecord {
  partition: number;
  offset: bigint;
  timestampMs: bigint;
  attempt: number;
  message: MessageRecord;
}

/** `default`: the broker's default storage (disk when it has a data dir). */
export type Storage = "memory" | "disk" | "default";
/** `default`: the broker's default policy (drop_oldest unless it was started otherwise). */
export type Overflow = "drop_oldest" | "reject" | "default";
export type FsyncKind = "default" | "always" | "interval" | "never";
export type RetentionPolicyKind = "default" | "stream" | "work_queue";
export type Durability = "memory" | "written" | "synced_interval" | "synced";
export type ListKind = "pending" | "in_flight" | "acked" | "dead_lettered";
/** `before_start`: published before the subscription existed; it was never this subscription's to deliver. */
export type MessageState = "pending" | "delayed" | "in_flight" | "acked" | "dead_lettered" | "settled" | "before_start";

export interface TopicConfig {
  partitions: number;
  storage: Storage;
  overflow: Overflow;
  maxMessages: bigint;
  maxBytes: bigint;
  fsync: FsyncKind;
  fsyncIntervalMs: number;
  retentionMs: bigint;
  /** "stream": settled messages stay until the limits; "work_queue": they go once settled. */
  retentionPolicy: RetentionPolicyKind;
  /** How long deduplication ids are remembered; 0 = the server's default. */
  dedupWindowMs: bigint;
  /** On how many nodes of a cluster the partitions are kept (1, 3 or 5); 0 = the server's default. */
  replicas: number;
}

export type TopicConfigInput = {
  partitions?: number;
  storage?: Storage;
  overflow?: Overflow;
  maxMessages?: U64Input;
  maxBytes?: U64Input;
  fsync?: FsyncKind;
  fsyncIntervalMs?: number;
  retentionMs?: U64Input;
  retentionPolicy?: RetentionPolicyKind;
  dedupWindowMs?: U64Input;
  replicas?: number;
};

export interface TopicInfo {
  name: string;
  config: TopicConfig;
  messages: bigint;
  bytes: bigint;
  subscriptions: string[];
}

export interface Latency {
  sumUs: bigint;
  /** `[bucket index, count]`, ascending, every count at least 1. */
  buckets: [number, bigint][];
}

export interface SubscriptionStats {
  name: string;
  ephemeral: boolean;
  consumers: number;
  messagesOut: bigint;
  bytesOut: bigint;
  acked: bigint;
  redelivered: bigint;
  backlog: bigint;
  inFlight: bigint;
  gaveUp: bigint;
  deliverLatency: Latency;
  ackLatency: Latency;
  /** Whether an operator paused the subscription's deliveries. */
  paused: boolean;
}

export interface TopicStats {
  name: string;
  messagesIn: bigint;
  bytesIn: bigint;
  messagesOut: bigint;
  bytesOut: bigint;
  depth: bigint;
  depthBytes: bigint;
  dropped: bigint;
  publishers: number;
  subscribers: number;
  subscriptions: SubscriptionStats[];
}

export interface MessageEntry {
  partition: number;
  offset: bigint;
  state: MessageState;
  attempts: number;
  publishedMs: bigint;
  firstDeliveredMs: bigint;
  settledMs: bigint;
  dueMs: bigint;
  result: Uint8Array;
  reason: string;
  deadLetter: { partition: number; offset: bigint } | null;
}

export interface MessageStatusInfo {
  partition: number;
  offset: bigint;
  publishedMs: bigint;
  priority: number;
  key: Uint8Array | null;
  bodyBytes: number;
  subscriptions: { subscription: string; entry: MessageEntry }[];
}

export type StartPosition =
  | { kind: "latest" }
  | { kind: "earliest" }
  | { kind: "offset"; value: bigint }
  | { kind: "time_ms"; value: bigint };

export type StartInput =
  | { kind: "latest" }
  | { kind: "earliest" }
  | { kind: "offset"; value: U64Input }
  | { kind: "time_ms"; value: U64Input };

export type RequeueSelection =
  | { kind: "all" }
  | { kind: "range"; partition: number; firstOffset: bigint; lastOffset: bigint };

/** Role bits of USER_ADD, GRANT and REVOKE: `admin` may do everything, users included. */
export const Role = {
  admin: 1,
  /** Inspect every topic, and `/metrics`. */
  monitor: 2,
} as const;

export type RoleName = keyof typeof Role;

/** Action bits of a grant on a topic pattern. */
export const Action = {
  publish: 1,
  /** Subscribe, ack, nack. */
  consume: 2,
  /** Describe, stats, status, listings. */
  inspect: 4,
  /** Create, delete, requeue, delete subscriptions; implies purge and pause. */
  manage: 8,
  /** Purge a topic (PURGE_TOPIC). */
  purge: 16,
  /** Pause and resume a subscription (PAUSE_SUBSCRIPTION). */
  pause: 32,
} as const;

export type ActionName = keyof typeof Action;

/** A user as USER_LIST_REPLY carries it: never a password or a hash. */
export interface UserEntry {
  name: string;
  /** {@link Role} bits. */
  roles: number;
  /** How many API tokens the user holds. */
  tokens: number;
  /** The user's grants: a topic pattern and its {@link Action} bits. */
  grants: { pattern: string; actions: number }[];
}

/** A token as TOKEN_LIST_REPLY carries it: its name and dates, never its value. */
export interface TokenEntry {
  name: string;
  /** Unix ms. */
  createdMs: bigint;
  /** Unix ms after which the token is refused; 0 = never. */
  expiresMs: bigint;
}

/** A connection as CONNECTION_LIST carries it. */
export interface ConnectionEntry {
  /** Never reused while the server runs. */
  id: bigint;
  /** 0 the binary protocol, 1 an HTTP stream. */
  listener: number;
  tls: boolean;
  /** `ip:port` */
  peer: string;
  /** Empty: anonymous. */
  user: string;
  clientName: string;
  connectedMs: bigint;
  subscriptions: number;
  consumers: number;
  messagesIn: bigint;
  bytesIn: bigint;
  messagesOut: bigint;
  bytesOut: bigint;
  credit: bigint;
  unacked: bigint;
}

/** A node of a cluster: its id and client address (empty while unknown). */
export interface ClusterNode {
  id: bigint;
  addr: string;
}

/** A replicated partition: its leader (0n: unknown, or an election under way) and replicas. */
export interface PartitionLeader {
  topic: string;
  partition: number;
  leader: bigint;
  /** The first is the preferred leader. */
  replicas: bigint[];
}

/** What CLUSTER_INFO answers; `nodeId` 0n is a broker that runs alone (every list empty). */
export interface ClusterInfo {
  nodeId: bigint;
  /** The node that creates and deletes topics; 0n while unknown. */
  metadataLeader: bigint;
  nodes: ClusterNode[];
  partitions: PartitionLeader[];
}

export interface SubscribeRequest {
  topic: string;
  subscription: string;
  start: StartPosition;
  ackTimeoutMs: number;
  maxAttempts: number;
  credit: number;
  autoAck: boolean;
  ordered: boolean;
  partitions: { first: number; last: number }[];
  deadLetterTopic: string;
}

/** Every frame of the protocol, decoded. */
export type Frame =
  | {
      type: "HELLO";
      versionMin: number;
      versionMax: number;
      heartbeatMs: number;
      clientName: string;
      user: string;
      password: string;
    }
  | { type: "PING" }
  | { type: "PONG" }
  | { type: "CREATE_TOPIC"; name: string; config: TopicConfig; ifNotExists: boolean }
  | { type: "DELETE_TOPIC"; name: string }
  | { type: "LIST_TOPICS" }
  | { type: "DESCRIBE_TOPIC"; name: string }
  | { type: "PUBLISH"; topic: string; partition: number | null; messages: MessageRecord[] }
  | ({ type: "SUBSCRIBE" } & SubscribeRequest)
  | { type: "UNSUBSCRIBE"; consumerId: number }
  | { type: "CREDIT"; consumerId: number; credit: number }
  | { type: "ACK"; consumerId: number; ranges: Range[] }
  | { type: "NACK"; consumerId: number; delayMs: number; deadLetter: boolean; release: boolean; reason: string; ranges: Range[] }
  | { type: "DELETE_SUBSCRIPTION"; topic: string; subscription: string }
  | { type: "ACK_RESULT"; consumerId: number; result: Uint8Array; ranges: Range[] }
  | { type: "STATS"; topic: string }
  | { type: "MESSAGE_STATUS"; topic: string; partition: number; offset: bigint }
  | { type: "LIST_MESSAGES"; topic: string; subscription: string; kind: ListKind; page: Uint8Array; limit: number }
  | { type: "REQUEUE_DEAD"; deadLetterTopic: string; selection: RequeueSelection }
  | { type: "USER_ADD"; user: string; password: string; roles: number }
  | { type: "USER_REMOVE"; user: string }
  | { type: "USER_PASSWD"; user: string; password: string }
  | { type: "USER_LIST" }
  | { type: "GRANT"; user: string; pattern: string; actions: number; roles: number }
  | { type: "REVOKE"; user: string; pattern: string; actions: number; roles: number }
  | { type: "TOKEN_CREATE"; user: string; name: string; expiresMs: bigint }
  | { type: "TOKEN_LIST"; user: string }
  | { type: "TOKEN_REVOKE"; user: string; name: string }
  | { type: "HELLO_OK"; version: number; heartbeatMs: number; frameBytesMax: number; messageBytesMax: number; server: string }
  | { type: "OK" }
  | { type: "ERROR"; code: number; message: string }
  | { type: "PUBLISHED"; durability: Durability; ranges: Range[] }
  | { type: "TOPIC_LIST"; topics: TopicInfo[] }
  | { type: "TOPIC_INFO"; topic: TopicInfo }
  | { type: "SUBSCRIBED"; consumerId: number; subscription: string; partitions: number }
  | { type: "DELIVER"; consumerId: number; deliveries: DeliveryRecord[] }
  | { type: "STATS_REPLY"; topics: TopicStats[] }
  | { type: "MESSAGE_STATUS_REPLY"; status: MessageStatusInfo }
  | { type: "MESSAGE_LIST"; entries: MessageEntry[]; nextPage: Uint8Array }
  | { type: "REQUEUED"; requeued: bigint; skipped: bigint }
  | { type: "USER_LIST_REPLY"; users: UserEntry[] }
  | { type: "TOKEN_CREATED"; name: string; token: string; expiresMs: bigint }
  | { type: "TOKEN_LIST_REPLY"; tokens: TokenEntry[] }
  | { type: "PURGE_TOPIC"; name: string }
  | { type: "PURGED"; messages: bigint }
  | { type: "PAUSE_SUBSCRIPTION"; topic: string; subscription: string; paused: boolean }
  | { type: "LIST_CONNECTIONS"; after: bigint; limit: number }
  | { type: "CONNECTION_LIST"; total: bigint; nextAfter: bigint; connections: ConnectionEntry[] }
  | { type: "CLOSE_CONNECTION"; id: bigint }
  | { type: "CLUSTER_INFO" }
  | ({ type: "CLUSTER_INFO_REPLY" } & ClusterInfo);

/** What callers hand to `encodeFrame`: decoded frames, with looser u64s and optional fields. */
export type FrameInput =
  | Exclude<
      Frame,
      {
        type:
          | "CREATE_TOPIC"
          | "PUBLISH"
          | "SUBSCRIBE"
          | "ACK"
          | "NACK"
          | "ACK_RESULT"
          | "MESSAGE_STATUS"
          | "REQUEUE_DEAD"
          | "PUBLISHED"
          | "REQUEUED"
          | "TOKEN_CREATE"
          | "TOKEN_CREATED"
          | "TOKEN_LIST_REPLY"
          | "PURGED"
          | "LIST_CONNECTIONS"
          | "CONNECTION_LIST"
          | "CLOSE_CONNECTION"
          | "CLUSTER_INFO_REPLY";
      }
    >
  | { type: "CREATE_TOPIC"; name: string; config: TopicConfigInput; ifNotExists: boolean }
  | { type: "PUBLISH"; topic: string; partition: number | null; messages: MessageInput[] }
  | ({ type: "SUBSCRIBE" } & Omit<SubscribeRequest, "start"> & { start: StartInput })
  | { type: "ACK"; consumerId: number; ranges: RangeInput[] }
  | { type: "NACK"; consumerId: number; delayMs: number; deadLetter: boolean; release?: boolean; reason: string; ranges: RangeInput[] }
  | { type: "ACK_RESULT"; consumerId: number; result: Uint8Array; ranges: RangeInput[] }
  | { type: "MESSAGE_STATUS"; topic: string; partition: number; offset: U64Input }
  | {
      type: "REQUEUE_DEAD";
      deadLetterTopic: string;
      selection:
        | { kind: "all" }
        | { kind: "range"; partition: number; firstOffset: U64Input; lastOffset: U64Input };
    }
  | { type: "PUBLISHED"; durability: Durability; ranges: RangeInput[] }
  | { type: "REQUEUED"; requeued: U64Input; skipped: U64Input }
  | { type: "TOKEN_CREATE"; user: string; name: string; expiresMs: U64Input }
  | { type: "TOKEN_CREATED"; name: string; token: string; expiresMs: U64Input }
  | {
      type: "TOKEN_LIST_REPLY";
      tokens: { name: string; createdMs: U64Input; expiresMs: U64Input }[];
    }
  | { type: "PURGED"; messages: U64Input }
  | { type: "LIST_CONNECTIONS"; after: U64Input; limit: number }
  | {
      type: "CONNECTION_LIST";
      total: U64Input;
      nextAfter: U64Input;
      connections: (Omit<ConnectionEntry, "id" | "connectedMs" | "messagesIn" | "bytesIn" | "messagesOut" | "bytesOut" | "credit" | "unacked"> & {
        id: U64Input;
        connectedMs: U64Input;
        messagesIn: U64Input;
        bytesIn: U64Input;
        messagesOut: U64Input;
        bytesOut: U64Input;
        credit: U64Input;
        unacked: U64Input;
      })[];
    }
  | { type: "CLOSE_CONNECTION"; id: U64Input }
  | {
      type: "CLUSTER_INFO_REPLY";
      nodeId: U64Input;
      metadataLeader: U64Input;
      nodes: { id: U64Input; addr: string }[];
      partitions: { topic: string; partition: number; leader: U64Input; replicas: U64Input[] }[];
    };

// ---------------------------------------------------------------------------------------------
// Enums

const STORAGES: Storage[] = ["memory", "disk", "default"];
const OVERFLOWS: Overflow[] = ["drop_oldest", "reject", "default"];
const FSYNCS: FsyncKind[] = ["default", "always", "interval", "never"];
const RETENTION_POLICIES: RetentionPolicyKind[] = ["default", "stream", "work_queue"];
const DURABILITIES: Durability[] = ["memory", "written", "synced_interval", "synced"];
const LIST_KINDS: ListKind[] = ["pending", "in_flight", "acked", "dead_lettered"];
const STATES: MessageState[] = ["pending", "delayed", "in_flight", "acked", "dead_lettered", "settled", "before_start"];
const START_KINDS = ["latest", "earliest", "offset", "time_ms"] as const;

function enumIndex<T extends string>(values: readonly T[], v: T, field: string): number {
  const i = values.indexOf(v);
  if (i < 0) throw ProtocolError.invalid(field, `unknown value ${String(v)}; one of ${values.join(", ")}`);
  return i;
}

const RECORD_FLAG_KEY = 1;
const RECORD_FLAG_DELAY = 2;
const SUBSCRIBE_FLAG_AUTO_ACK = 1;
const SUBSCRIBE_FLAG_ORDERED = 2;
const NACK_FLAG_DEAD_LETTER = 1;
/** Gives messages back unprocessed: ready again, the delivery not counted as an attempt. */
const NACK_FLAG_RELEASE = 2;
const CREATE_FLAG_IF_NOT_EXISTS = 1;
const ROLES_ALL = Role.admin | Role.monitor;
const ACTIONS_ALL = Action.publish | Action.consume | Action.inspect | Action.manage | Action.purge | Action.pause;
const PAUSE_FLAG_PAUSED = 1;
const CONNECTION_FLAG_TLS = 1;

/** Checks a bit set before it is encoded: an integer using only the bits of `known`. */
function checkBits(v: number, known: number, field: string): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xff || (v & ~known) !== 0) {
    throw ProtocolError.invalid(field, `${v} has bits outside 0x${known.toString(16).padStart(2, "0")}`);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Header and stream decoding

export interface FrameHeader {
  payloadLen: number;
  opcode: number;
  requestId: number;
}

/** Reads a header from the first 12 bytes at `at`; checks the flags and the frame limit. */
export function peekHeader(buf: Uint8Array, at: number, frameBytesMax: number): FrameHeader | null {
  if (buf.length - at < FRAME_HEADER_BYTES) return null;
  const view = new DataView(buf.buffer, buf.byteOffset + at, FRAME_HEADER_BYTES);
  const payloadLen = view.getUint32(0, true);
  const opcode = view.getUint16(4, true);
  const flags = view.getUint16(6, true);
  const requestId = view.getUint32(8, true);
  if (flags !== 0) {
    throw new ProtocolError("InvalidFlags", undefined, `frame flags must be zero, got 0x${flags.toString(16).padStart(4, "0")}`);
  }
  const len = FRAME_HEADER_BYTES + payloadLen;
  if (len > frameBytesMax) {
    throw new ProtocolError("FrameTooLarge", undefined, `frame of ${len} bytes exceeds the limit of ${frameBytesMax} bytes`);
  }
  return { payloadLen, opcode, requestId };
}

export interface DecodedFrame {
  requestId: number;
  frame: Frame;
}

/** Decodes exactly one whole frame (header included). */
export function decodeFrame(bytes: Uint8Array, frameBytesMax: number, maker: DeliveryMaker | null = null): DecodedFrame {
  const header = peekHeader(bytes, 0, frameBytesMax);
  if (header === null) throw ProtocolError.truncated("header");
  const len = FRAME_HEADER_BYTES + header.payloadLen;
  if (bytes.length < len) throw ProtocolError.truncated("payload");
  if (bytes.length > len) {
    throw new ProtocolError("TrailingBytes", undefined, `${bytes.length - len} unexpected bytes after the frame`);
  }
  const r = new Reader(bytes, FRAME_HEADER_BYTES, len);
  return { requestId: header.requestId, frame: decodePayload(header.opcode, r, maker) };
}

/**
 * Splits a byte stream into frames. Each `push` returns the whole frames completed so far.
 *
 * Decoded views (bodies, keys) point into the chunks pushed or into a buffer allocated for one
 * frame; neither is ever written again, so they stay valid for as long as the caller holds them.
 */
export class FrameStream {
  private frameBytesMax: number;
  /** A frame whose header is known and whose bytes are arriving: sized exactly, filled up. */
  private partial: Uint8Array | null = null;
  private filled = 0;
  /** Fewer than 12 bytes left over from the last chunk. */
  private leftover: Uint8Array | null = null;

  private readonly maker: DeliveryMaker | null;

  constructor(frameBytesMax: number, maker: DeliveryMaker | null = null) {
    this.frameBytesMax = frameBytesMax;
    this.maker = maker;
  }

  setFrameBytesMax(frameBytesMax: number): void {
    this.frameBytesMax = frameBytesMax;
  }

  /** Bytes received but not yet part of a whole frame. */
  buffered(): number {
    return (this.partial ? this.filled : 0) + (this.leftover?.length ?? 0);
  }

  push(chunk: Uint8Array, out: (requestId: number, frame: Frame) => void): void {
    let off = 0;
    if (this.partial !== null) {
      const n = Math.min(this.partial.length - this.filled, chunk.length);
      this.partial.set(chunk.subarray(0, n), this.filled);
      this.filled += n;
      off = n;
      if (this.filled < this.partial.length) return;
      const whole = this.partial;
      this.partial = null;
      const d = decodeFrame(whole, this.frameBytesMax, this.maker);
      out(d.requestId, d.frame);
    }
    if (this.leftover !== null) {
      const joined = new Uint8Array(this.leftover.length + chunk.length - off);
      joined.set(this.leftover);
      joined.set(chunk.subarray(off), this.leftover.length);
      this.leftover = null;
      chunk = joined;
      off = 0;
    }
    while (chunk.length - off >= FRAME_HEADER_BYTES) {
      const header = peekHeader(chunk, off, this.frameBytesMax)!;
      const len = FRAME_HEADER_BYTES + header.payloadLen;
      if (chunk.length - off < len) {
        this.partial = new Uint8Array(len);
        this.partial.set(chunk.subarray(off));
        this.filled = chunk.length - off;
        return;
      }
      const r = new Reader(chunk, off + FRAME_HEADER_BYTES, off + len);
      off += len;
      out(header.requestId, decodePayload(header.opcode, r, this.maker));
    }
    if (off < chunk.length) this.leftover = chunk.slice(off);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding payloads

function readName(r: Reader, field: string): string {
  return readStrMax(r, field, NAME_BYTES_MAX, `must be 1..=${NAME_BYTES_MAX} bytes`, 1);
}

function readStrMax(r: Reader, field: string, max: number, reason: string, min = 0): string {
  const len = r.u16(field);
  const s = decodeUtf8(r.bytes(len, field), field);
  if (len < min || len > max) throw ProtocolError.invalid(field, reason);
  return s;
}

function readFlags(r: Reader, field: string, known: number): number {
  const flags = r.u8(field);
  if ((flags & ~known) !== 0) {
    throw ProtocolError.invalid(field, `unknown bits 0x${flags.toString(16).padStart(2, "0")}`);
  }
  return flags;
}

function readBool(r: Reader, field: string): boolean {
  const b = r.u8(field);
  if (b > 1) throw ProtocolError.invalid(field, `${b} is not a boolean (0 or 1)`);
  return b === 1;
}

function readBounded(r: Reader, field: string, max: number): Uint8Array {
  const b = r.bytes16(field);
  if (b.length > max) throw ProtocolError.invalid(field, `${b.length} bytes, above the limit of ${max}`);
  return b;
}

const U64_MAX = (1n << 64n) - 1n;

function readRanges(r: Reader): Range[] {
  const count = r.u32("ranges.count");
  if (count > RANGES_COUNT_MAX) throw ProtocolError.invalid("ranges.count", `${count}, limit ${RANGES_COUNT_MAX}`);
  if (count * 16 > r.remaining()) throw ProtocolError.truncated("ranges");
  const ranges: Range[] = new Array(count);
  for (let i = 0; i < count; i++) {
    const partition = r.u32("range.partition");
    const offset = r.u64("range.offset");
    const n = r.u32("range.count");
    if (offset + BigInt(n) > U64_MAX) throw ProtocolError.invalid("range", "offset + count overflows");
    ranges[i] = { partition, offset, count: n };
  }
  return ranges;
}

function readTopicConfig(r: Reader): TopicConfig {
  const partitions = r.u32("topic.partitions");
  const s = r.u8("topic.storage");
  if (s > 2) throw ProtocolError.invalid("topic.storage", `unknown storage ${s}`);
  const o = r.u8("topic.overflow");
  if (o > 2) throw ProtocolError.invalid("topic.overflow", `unknown policy ${o}`);
  const maxMessages = r.u64("topic.max_messages");
  const maxBytes = r.u64("topic.max_bytes");
  const kind = r.u8("topic.fsync");
  const interval = r.u32("topic.fsync_interval_ms");
  if (kind > 3) throw ProtocolError.invalid("topic.fsync", `unknown fsync policy ${kind}`);
  if (kind === 2 && interval === 0) {
    throw ProtocolError.invalid("topic.fsync_interval_ms", "must be at least 1 for the interval policy");
  }
  if (kind !== 2 && interval !== 0) {
    throw ProtocolError.invalid("topic.fsync_interval_ms", `${interval} given for a policy without an interval: must be 0`);
  }
  return {
    partitions,
    storage: STORAGES[s]!,
    overflow: OVERFLOWS[o]!,
    maxMessages,
    maxBytes,
    fsync: FSYNCS[kind]!,
    fsyncIntervalMs: interval,
    retentionMs: r.u64("topic.retention_ms"),
    retentionPolicy: readRetentionPolicy(r),
    dedupWindowMs: r.u64("topic.dedup_window_ms"),
    replicas: r.u8("topic.replicas"),
  };
}

function readRetentionPolicy(r: Reader): RetentionPolicyKind {
  const policy = r.u8("topic.retention_policy");
  if (policy >= RETENTION_POLICIES.length) {
    throw ProtocolError.invalid("topic.retention_policy", `unknown retention policy ${policy}`);
  }
  return RETENTION_POLICIES[policy]!;
}

function readTopicInfo(r: Reader): TopicInfo {
  const name = r.str16("topic_info.name");
  const config = readTopicConfig(r);
  const messages = r.u64("topic_info.messages");
  const bytes = r.u64("topic_info.bytes");
  const count = r.u32("topic_info.subscription_count");
  const subscriptions: string[] = [];
  for (let i = 0; i < count; i++) subscriptions.push(r.str16("topic_info.subscription"));
  return { name, config, messages, bytes, subscriptions };
}

function readLatency(r: Reader, field: string): Latency {
  const sumUs = r.u64(field);
  const n = r.u16(field);
  if (n > LATENCY_BUCKETS) throw ProtocolError.invalid(field, `${n} buckets, above the ${LATENCY_BUCKETS} there are`);
  const buckets: [number, bigint][] = [];
  for (let i = 0; i < n; i++) {
    const bucket = r.u16(field);
    const count = r.u64(field);
    if (bucket >= LATENCY_BUCKETS) {
      throw ProtocolError.invalid(field, `bucket ${bucket} is beyond the last, ${LATENCY_BUCKETS - 1}`);
    }
    if (buckets.length > 0 && buckets[buckets.length - 1]![0] >= bucket) {
      throw ProtocolError.invalid(field, `bucket ${bucket} is out of ascending order`);
    }
    if (count === 0n) {
      throw ProtocolError.invalid(field, `bucket ${bucket} has a count of 0 (empty buckets are left out)`);
    }
    buckets.push([bucket, count]);
  }
  return { sumUs, buckets };
}

function readTopicStats(r: Reader): TopicStats {
  const t: TopicStats = {
    name: r.str16("stats.topic.name"),
    messagesIn: r.u64("stats.topic.messages_in"),
    bytesIn: r.u64("stats.topic.bytes_in"),
    messagesOut: r.u64("stats.topic.messages_out"),
    bytesOut: r.u64("stats.topic.bytes_out"),
    depth: r.u64("stats.topic.depth"),
    depthBytes: r.u64("stats.topic.depth_bytes"),
    dropped: r.u64("stats.topic.dropped"),
    publishers: r.u32("stats.topic.publishers"),
    subscribers: r.u32("stats.topic.subscribers"),
    subscriptions: [],
  };
  const count = r.u32("stats.topic.subscription_count");
  for (let i = 0; i < count; i++) {
    t.subscriptions.push({
      name: r.str16("stats.subscription.name"),
      ephemeral: readBool(r, "stats.subscription.ephemeral"),
      consumers: r.u32("stats.subscription.consumers"),
      messagesOut: r.u64("stats.subscription.messages_out"),
      bytesOut: r.u64("stats.subscription.bytes_out"),
      acked: r.u64("stats.subscription.acked"),
      redelivered: r.u64("stats.subscription.redelivered"),
      backlog: r.u64("stats.subscription.backlog"),
      inFlight: r.u64("stats.subscription.in_flight"),
      gaveUp: r.u64("stats.subscription.gave_up"),
      deliverLatency: readLatency(r, "stats.subscription.deliver_latency"),
      ackLatency: readLatency(r, "stats.subscription.ack_latency"),
      paused: readBool(r, "stats.subscription.paused"),
    });
  }
  return t;
}

function readEntry(r: Reader): MessageEntry {
  const partition = r.u32("message_entry.partition");
  const offset = r.u64("message_entry.offset");
  const s = r.u8("message_entry.state");
  if (s >= STATES.length) throw ProtocolError.invalid("message_entry.state", `unknown state ${s}`);
  const attempts = r.u16("message_entry.attempts");
  const publishedMs = r.u64("message_entry.published_ms");
  const firstDeliveredMs = r.u64("message_entry.first_delivered_ms");
  const settledMs = r.u64("message_entry.settled_ms");
  const dueMs = r.u64("message_entry.due_ms");
  const result = readBounded(r, "message_entry.result", ACK_RESULT_BYTES_MAX);
  const reason = r.str16("message_entry.reason");
  const present = readBool(r, "message_entry.dead_letter");
  const dlPartition = r.u32("message_entry.dead_letter_partition");
  const dlOffset = r.u64("message_entry.dead_letter_offset");
  if (!present && (dlPartition !== 0 || dlOffset !== 0n)) {
    throw ProtocolError.invalid(
      "message_entry.dead_letter",
      `${dlPartition}-${dlOffset} given without the present flag: must be 0-0`,
    );
  }
  return {
    partition,
    offset,
    state: STATES[s]!,
    attempts,
    publishedMs,
    firstDeliveredMs,
    settledMs,
    dueMs,
    result,
    reason,
    deadLetter: present ? { partition: dlPartition, offset: dlOffset } : null,
  };
}

function readMessageStatus(r: Reader): MessageStatusInfo {
  const partition = r.u32("message_status.partition");
  const offset = r.u64("message_status.offset");
  const publishedMs = r.u64("message_status.published_ms");
  const priority = r.u8("message_status.priority");
  if (priority > PRIORITY_MAX) throw ProtocolError.invalid("message_status.priority", `${priority} is above ${PRIORITY_MAX}`);
  const hasKey = readBool(r, "message_status.has_key");
  const key = r.bytes16("message_status.key");
  if (key.length > KEY_BYTES_MAX) {
    throw ProtocolError.invalid("message_status.key", `${key.length} bytes, above the limit of ${KEY_BYTES_MAX}`);
  }
  if (!hasKey && key.length > 0) {
    throw ProtocolError.invalid("message_status.key", `${key.length} bytes given with has_key 0: must be empty`);
  }
  const bodyBytes = r.u32("message_status.body_bytes");
  const count = r.u32("message_status.subscription_count");
  const subscriptions: MessageStatusInfo["subscriptions"] = [];
  for (let i = 0; i < count; i++) {
    subscriptions.push({ subscription: r.str16("message_status.subscription"), entry: readEntry(r) });
  }
  return { partition, offset, publishedMs, priority, key: hasKey ? key : null, bodyBytes, subscriptions };
}

const NO_HEADERS: [string, string][] = Object.freeze([]) as unknown as [string, string][];
const EMPTY_BYTES = new Uint8Array(0);

/**
 * Makes the object a delivery of consumer `consumerId` is decoded into, or null for plain
 * DeliveryRecords. The made object reads the 22-byte delivery prefix at `at` of `view` itself
 * (so that it may keep 64-bit values as numbers until asked for them); its `message` is the
 * record the codec then fills in.
 */
export type DeliveryMaker = (consumerId: number) => ((view: DataView, at: number) => DeliveryRecord) | null;

/** Reads one record, validating it as the broker does. */
export function readRecord(r: Reader): MessageRecord {
  return readRecordInto(r, { key: null, headers: NO_HEADERS, priority: 0, deliverAfterMs: null, body: EMPTY_BYTES });
}

/** Reads one record into `out` (a delivered message fills itself, without an object between). */
export function readRecordInto<T extends MessageRecord>(r: Reader, out: T): T {
  const priority = r.u8("record.priority");
  if (priority > PRIORITY_MAX) throw ProtocolError.invalid("record.priority", `${priority} is above ${PRIORITY_MAX}`);
  const flags = r.u8("record.flags");
  if ((flags & ~(RECORD_FLAG_KEY | RECORD_FLAG_DELAY)) !== 0) {
    throw ProtocolError.invalid("record.flags", `unknown bits 0x${flags.toString(16).padStart(2, "0")}`);
  }
  const keyLen = r.u16("record.key_len");
  const headerCount = r.u16("record.header_count");
  const bodyLen = r.u32("record.body_len");
  if ((flags & RECORD_FLAG_KEY) === 0 && keyLen !== 0) {
    throw ProtocolError.invalid("record.key_len", "non-zero without the key flag");
  }
  if (keyLen > KEY_BYTES_MAX) throw ProtocolError.invalid("record.key_len", `${keyLen} bytes, limit ${KEY_BYTES_MAX}`);
  if (headerCount > HEADERS_COUNT_MAX) {
    throw ProtocolError.invalid("record.header_count", `${headerCount}, limit ${HEADERS_COUNT_MAX}`);
  }
  let deliverAfterMs: number | null = null;
  if ((flags & RECORD_FLAG_DELAY) !== 0) {
    const delay = r.u64("record.deliver_after_ms");
    if (delay > BigInt(DELAY_MS_MAX)) {
      throw ProtocolError.invalid("record.deliver_after_ms", `${delay} is above ${DELAY_MS_MAX}`);
    }
    deliverAfterMs = Number(delay);
  }
  const key = (flags & RECORD_FLAG_KEY) !== 0 ? r.bytes(keyLen, "record.key") : null;
  // Most messages carry no headers: they share one empty list rather than allocate one each.
  const headers: [string, string][] = headerCount === 0 ? NO_HEADERS : [];
  for (let i = 0; i < headerCount; i++) {
    const nameLen = r.u16("record.header.name_len");
    if (nameLen === 0 || nameLen > HEADER_BYTES_MAX) {
      throw ProtocolError.invalid("record.header.name_len", `must be 1..=${HEADER_BYTES_MAX}`);
    }
    const name = decodeUtf8(r.bytes(nameLen, "record.header.name"), "record.header.name");
    const valueLen = r.u16("record.header.value_len");
    if (valueLen > HEADER_BYTES_MAX) throw ProtocolError.invalid("record.header.value_len", `limit ${HEADER_BYTES_MAX}`);
    const value = decodeUtf8(r.bytes(valueLen, "record.header.value"), "record.header.value");
    headers.push([name, value]);
  }
  out.key = key;
  out.headers = headers;
  out.priority = priority;
  out.deliverAfterMs = deliverAfterMs;
  out.body = r.bytes(bodyLen, "record.body");
  return out;
}

function readRecords(r: Reader, count: number): MessageRecord[] {
  if (count > BATCH_COUNT_MAX) throw ProtocolError.invalid("batch.count", `${count}, limit ${BATCH_COUNT_MAX}`);
  const out: MessageRecord[] = [];
  for (let i = 0; i < count; i++) out.push(readRecord(r));
  if (r.remaining() !== 0) {
    throw new ProtocolError("TrailingBytes", undefined, `${r.remaining()} unexpected bytes after the end of a record batch`);
  }
  return out;
}

function readDeliveries(r: Reader, count: number, consumerId: number, maker: DeliveryMaker | null): DeliveryRecord[] {
  if (count > BATCH_COUNT_MAX) throw ProtocolError.invalid("deliveries.count", `${count}, limit ${BATCH_COUNT_MAX}`);
  const make = maker === null ? null : maker(consumerId);
  const out: DeliveryRecord[] = [];
  const buf = r.buf;
  const blocks: HeaderBlock[] = [];
  for (let i = 0; i < count; i++) {
    const at = r.need(DELIVERY_PREFIX_BYTES, "delivery.prefix");
    const v = r.view;
    if (make === null) {
      out.push({
        partition: v.getUint32(at, true),
        offset: v.getBigUint64(at + 4, true),
        timestampMs: v.getBigUint64(at + 12, true),
        attempt: v.getUint16(at + 20, true),
        message: readRecord(r),
      });
    } else {
      const d = make(v, at);
      const m = d.message;
      // A record with headers whose header block repeats one already read in this frame (a
      // sender's batch carries byte-identical headers) shares that block's decoded headers:
      // one byte comparison instead of a decode per name and value.
      const rec = r.pos;
      const end = r.end;
      if (end - rec >= RECORD_PREFIX_BYTES) {
        const priority = buf[rec]!;
        const flags = buf[rec + 1]!;
        const keyLen = v.getUint16(rec + 2, true);
        const headerCount = v.getUint16(rec + 4, true);
        const bodyLen = v.getUint32(rec + 6, true);
        if (
          headerCount !== 0 &&
          priority <= PRIORITY_MAX &&
          flags <= RECORD_FLAG_KEY &&
          keyLen <= KEY_BYTES_MAX &&
          (flags !== 0 || keyLen === 0)
        ) {
          const hs = rec + RECORD_PREFIX_BYTES + keyLen;
          let hit: HeaderBlock | null = null;
          for (const b of blocks) {
            if (b.count === headerCount && hs + b.bytes.length + bodyLen <= end && sameBytes(buf, hs, b.bytes)) {
              hit = b;
              break;
            }
          }
          if (hit !== null) {
            const bs = hs + hit.bytes.length;
            m.key = flags !== 0 ? buf.subarray(rec + RECORD_PREFIX_BYTES, hs) : null;
            m.headers = hit.headers;
            m.priority = priority;
            m.deliverAfterMs = null;
            m.body = buf.subarray(bs, bs + bodyLen);
            r.pos = bs + bodyLen;
            out.push(d);
            continue;
          }
          readRecordInto(r, m);
          if (blocks.length < HEADER_BLOCKS_MAX) {
            blocks.push({ count: headerCount, bytes: buf.subarray(hs, r.pos - bodyLen), headers: Object.freeze(m.headers) as [string, string][] });
          }
          out.push(d);
          continue;
        }
      }
      readRecordInto(r, m);
      out.push(d);
    }
  }
  if (r.remaining() !== 0) {
    throw new ProtocolError("TrailingBytes", undefined, `${r.remaining()} unexpected bytes after the end of a delivery batch`);
  }
  return out;
}

interface HeaderBlock {
  count: number;
  bytes: Uint8Array;
  /** Frozen: every message of the block shares it. */
  headers: [string, string][];
}

/** How many distinct header blocks of one DELIVER frame are remembered. */
const HEADER_BLOCKS_MAX = 8;

function sameBytes(buf: Uint8Array, at: number, block: Uint8Array): boolean {
  const n = block.length;
  for (let i = 0; i < n; i++) if (buf[at + i] !== block[i]) return false;
  return true;
}

function readSubscribe(r: Reader): Frame {
  const topic = readName(r, "subscribe.topic");
  const subscription = readStrMax(r, "subscribe.subscription", NAME_BYTES_MAX, `longer than ${NAME_BYTES_MAX} bytes`);
  const kind = r.u8("subscribe.start");
  const value = r.u64("subscribe.start_value");
  if (kind <= 1 && value !== 0n) {
    throw ProtocolError.invalid("subscribe.start_value", `${value} must be 0 for start kind ${kind}`);
  }
  let start: StartPosition;
  if (kind === 0) start = { kind: "latest" };
  else if (kind === 1) start = { kind: "earliest" };
  else if (kind === 2) start = { kind: "offset", value };
  else if (kind === 3) start = { kind: "time_ms", value };
  else throw ProtocolError.invalid("subscribe.start", `unknown start kind ${kind}`);
  const ackTimeoutMs = r.u32("subscribe.ack_timeout_ms");
  const maxAttempts = r.u32("subscribe.max_attempts");
  const credit = r.u32("subscribe.credit");
  const flags = readFlags(r, "subscribe.flags", SUBSCRIBE_FLAG_AUTO_ACK | SUBSCRIBE_FLAG_ORDERED);
  const autoAck = (flags & SUBSCRIBE_FLAG_AUTO_ACK) !== 0;
  const ordered = (flags & SUBSCRIBE_FLAG_ORDERED) !== 0;
  if (autoAck && ordered) {
    throw ProtocolError.invalid("subscribe.flags", "ordered delivery needs acks: it cannot be combined with auto_ack");
  }
  const count = r.u16("subscribe.partitions");
  if (count > PARTITIONS_MAX) {
    throw ProtocolError.invalid("subscribe.partitions", `${count} ranges, above the limit of ${PARTITIONS_MAX}`);
  }
  const partitions: { first: number; last: number }[] = [];
  for (let i = 0; i < count; i++) {
    const first = r.u32("subscribe.partitions");
    const last = r.u32("subscribe.partitions");
    if (first > last) throw ProtocolError.invalid("subscribe.partitions", `range ${first}-${last} ends before it starts`);
    partitions.push({ first, last });
  }
  const deadLetterTopic = readStrMax(
    r,
    "subscribe.dead_letter_topic",
    NAME_BYTES_MAX,
    `must be empty (the default) or 1..=${NAME_BYTES_MAX} bytes`,
  );
  return {
    type: "SUBSCRIBE",
    topic,
    subscription,
    start,
    ackTimeoutMs,
    maxAttempts,
    credit,
    autoAck,
    ordered,
    partitions,
    deadLetterTopic,
  };
}

function readRequeueSelection(r: Reader): RequeueSelection {
  const kind = r.u8("requeue_dead.selection");
  const partition = r.u32("requeue_dead.partition");
  const first = r.u64("requeue_dead.first_offset");
  const last = r.u64("requeue_dead.last_offset");
  if (kind === 0) {
    const fields: [string, bigint][] = [
      ["requeue_dead.partition", BigInt(partition)],
      ["requeue_dead.first_offset", first],
      ["requeue_dead.last_offset", last],
    ];
    for (const [field, v] of fields) {
      if (v !== 0n) throw ProtocolError.invalid(field, `${v} must be 0 when every dead letter is selected`);
    }
    return { kind: "all" };
  }
  if (kind === 1) {
    if (last < first) throw ProtocolError.invalid("requeue_dead.last_offset", `range ${first}..=${last} ends before it starts`);
    return { kind: "range", partition, firstOffset: first, lastOffset: last };
  }
  throw ProtocolError.invalid("requeue_dead.selection", `unknown selection ${kind}`);
}

function decodePayload(opcode: number, r: Reader, maker: DeliveryMaker | null = null): Frame {
  let frame: Frame;
  switch (opcode) {
    case Opcode.HELLO:
      frame = {
        type: "HELLO",
        versionMin: r.u16("hello.version_min"),
        versionMax: r.u16("hello.version_max"),
        heartbeatMs: r.u32("hello.heartbeat_ms"),
        clientName: r.str16("hello.client_name"),
        user: r.str16("hello.user"),
        password: r.str16("hello.password"),
      };
      break;
    case Opcode.PING:
      frame = { type: "PING" };
      break;
    case Opcode.PONG:
      frame = { type: "PONG" };
      break;
    case Opcode.CREATE_TOPIC:
      frame = {
        type: "CREATE_TOPIC",
        name: readName(r, "create_topic.name"),
        config: readTopicConfig(r),
        ifNotExists: readFlags(r, "create_topic.flags", CREATE_FLAG_IF_NOT_EXISTS) !== 0,
      };
      break;
    case Opcode.DELETE_TOPIC:
      frame = { type: "DELETE_TOPIC", name: readName(r, "delete_topic.name") };
      break;
    case Opcode.LIST_TOPICS:
      frame = { type: "LIST_TOPICS" };
      break;
    case Opcode.DESCRIBE_TOPIC:
      frame = { type: "DESCRIBE_TOPIC", name: readName(r, "describe_topic.name") };
      break;
    case Opcode.PUBLISH: {
      const topic = readName(r, "publish.topic");
      const p = r.u32("publish.partition");
      const count = r.u32("publish.count");
      frame = { type: "PUBLISH", topic, partition: p === NO_PARTITION ? null : p, messages: readRecords(r, count) };
      break;
    }
    case Opcode.SUBSCRIBE:
      frame = readSubscribe(r);
      break;
    case Opcode.UNSUBSCRIBE:
      frame = { type: "UNSUBSCRIBE", consumerId: r.u32("unsubscribe.consumer_id") };
      break;
    case Opcode.CREDIT:
      frame = { type: "CREDIT", consumerId: r.u32("credit.consumer_id"), credit: r.u32("credit.credit") };
      break;
    case Opcode.ACK:
      frame = { type: "ACK", consumerId: r.u32("ack.consumer_id"), ranges: readRanges(r) };
      break;
    case Opcode.NACK: {
      const consumerId = r.u32("nack.consumer_id");
      const delayMs = r.u32("nack.delay_ms");
      const flags = readFlags(r, "nack.flags", NACK_FLAG_DEAD_LETTER | NACK_FLAG_RELEASE);
      if ((flags & NACK_FLAG_DEAD_LETTER) !== 0 && (flags & NACK_FLAG_RELEASE) !== 0) {
        throw ProtocolError.invalid("nack.flags", "a NACK either dead-letters or releases its messages, not both");
      }
      frame = {
        type: "NACK",
        consumerId,
        delayMs,
        deadLetter: (flags & NACK_FLAG_DEAD_LETTER) !== 0,
        release: (flags & NACK_FLAG_RELEASE) !== 0,
        reason: readStrMax(r, "nack.reason", ERROR_MESSAGE_BYTES_MAX, `above the limit of ${ERROR_MESSAGE_BYTES_MAX} bytes`),
        ranges: readRanges(r),
      };
      break;
    }
    case Opcode.DELETE_SUBSCRIPTION:
      frame = {
        type: "DELETE_SUBSCRIPTION",
        topic: readName(r, "delete_subscription.topic"),
        subscription: readName(r, "delete_subscription.subscription"),
      };
      break;
    case Opcode.ACK_RESULT:
      frame = {
        type: "ACK_RESULT",
        consumerId: r.u32("ack_result.consumer_id"),
        result: readBounded(r, "ack_result.result", ACK_RESULT_BYTES_MAX),
        ranges: readRanges(r),
      };
      break;
    case Opcode.STATS:
      frame = { type: "STATS", topic: r.str16("stats.topic") };
      break;
    case Opcode.MESSAGE_STATUS:
      frame = {
        type: "MESSAGE_STATUS",
        topic: readName(r, "message_status.topic"),
        partition: r.u32("message_status.partition"),
        offset: r.u64("message_status.offset"),
      };
      break;
    case Opcode.LIST_MESSAGES: {
      const topic = readName(r, "list_messages.topic");
      const subscription = readName(r, "list_messages.subscription");
      const k = r.u8("list_messages.kind");
      if (k >= LIST_KINDS.length) throw ProtocolError.invalid("list_messages.kind", `unknown kind ${k}`);
      const page = readBounded(r, "list_messages.page", LIST_PAGE_BYTES_MAX);
      const limit = r.u32("list_messages.limit");
      if (limit === 0 || limit > LIST_LIMIT_MAX) {
        throw ProtocolError.invalid("list_messages.limit", `${limit} is not within 1..=${LIST_LIMIT_MAX}`);
      }
      frame = { type: "LIST_MESSAGES", topic, subscription, kind: LIST_KINDS[k]!, page, limit };
      break;
    }
    case Opcode.REQUEUE_DEAD:
      frame = {
        type: "REQUEUE_DEAD",
        deadLetterTopic: readName(r, "requeue_dead.dead_letter_topic"),
        selection: readRequeueSelection(r),
      };
      break;
    case Opcode.HELLO_OK:
      frame = {
        type: "HELLO_OK",
        version: r.u16("hello_ok.version"),
        heartbeatMs: r.u32("hello_ok.heartbeat_ms"),
        frameBytesMax: r.u32("hello_ok.frame_bytes_max"),
        messageBytesMax: r.u32("hello_ok.message_bytes_max"),
        server: r.str16("hello_ok.server"),
      };
      break;
    case Opcode.OK:
      frame = { type: "OK" };
      break;
    case Opcode.ERROR:
      frame = { type: "ERROR", code: r.u16("error.code"), message: r.str16("error.message") };
      break;
    case Opcode.PUBLISHED: {
      const d = r.u8("published.durability");
      if (d >= DURABILITIES.length) throw ProtocolError.invalid("published.durability", `unknown value ${d}`);
      frame = { type: "PUBLISHED", durability: DURABILITIES[d]!, ranges: readRanges(r) };
      break;
    }
    case Opcode.TOPIC_LIST: {
      const count = r.u32("topic_list.count");
      const topics: TopicInfo[] = [];
      for (let i = 0; i < count; i++) topics.push(readTopicInfo(r));
      frame = { type: "TOPIC_LIST", topics };
      break;
    }
    case Opcode.TOPIC_INFO:
      frame = { type: "TOPIC_INFO", topic: readTopicInfo(r) };
      break;
    case Opcode.SUBSCRIBED:
      frame = {
        type: "SUBSCRIBED",
        consumerId: r.u32("subscribed.consumer_id"),
        subscription: r.str16("subscribed.subscription"),
        partitions: r.u32("subscribed.partitions"),
      };
      break;
    case Opcode.DELIVER: {
      const consumerId = r.u32("deliver.consumer_id");
      const count = r.u32("deliver.count");
      frame = { type: "DELIVER", consumerId, deliveries: readDeliveries(r, count, consumerId, maker) };
      break;
    }
    case Opcode.STATS_REPLY: {
      const count = r.u32("stats_reply.count");
      const topics: TopicStats[] = [];
      for (let i = 0; i < count; i++) topics.push(readTopicStats(r));
      frame = { type: "STATS_REPLY", topics };
      break;
    }
    case Opcode.MESSAGE_STATUS_REPLY:
      frame = { type: "MESSAGE_STATUS_REPLY", status: readMessageStatus(r) };
      break;
    case Opcode.MESSAGE_LIST: {
      const count = r.u32("message_list.count");
      if (count > LIST_LIMIT_MAX) {
        throw ProtocolError.invalid("message_list.count", `${count} entries, above the limit of ${LIST_LIMIT_MAX}`);
      }
      const entries: MessageEntry[] = [];
      for (let i = 0; i < count; i++) entries.push(readEntry(r));
      frame = { type: "MESSAGE_LIST", entries, nextPage: readBounded(r, "message_list.next_page", LIST_PAGE_BYTES_MAX) };
      break;
    }
    case Opcode.REQUEUED:
      frame = { type: "REQUEUED", requeued: r.u64("requeued.requeued"), skipped: r.u64("requeued.skipped") };
      break;
    // User administration: the codec checks the layout only; the broker judges names,
    // password lengths and bits (invalid_argument), as the Rust codec does.
    case Opcode.USER_ADD:
      frame = {
        type: "USER_ADD",
        user: r.str16("user_add.user"),
        password: r.str16("user_add.password"),
        roles: r.u8("user_add.roles"),
      };
      break;
    case Opcode.USER_REMOVE:
      frame = { type: "USER_REMOVE", user: r.str16("user_remove.user") };
      break;
    case Opcode.USER_PASSWD:
      frame = { type: "USER_PASSWD", user: r.str16("user_passwd.user"), password: r.str16("user_passwd.password") };
      break;
    case Opcode.USER_LIST:
      frame = { type: "USER_LIST" };
      break;
    case Opcode.GRANT:
      frame = {
        type: "GRANT",
        user: r.str16("grant.user"),
        pattern: r.str16("grant.pattern"),
        actions: r.u8("grant.actions"),
        roles: r.u8("grant.roles"),
      };
      break;
    case Opcode.REVOKE:
      frame = {
        type: "REVOKE",
        user: r.str16("revoke.user"),
        pattern: r.str16("revoke.pattern"),
        actions: r.u8("revoke.actions"),
        roles: r.u8("revoke.roles"),
      };
      break;
    case Opcode.TOKEN_CREATE:
      frame = {
        type: "TOKEN_CREATE",
        user: r.str16("token_create.user"),
        name: r.str16("token_create.name"),
        expiresMs: r.u64("token_create.expires_ms"),
      };
      break;
    case Opcode.TOKEN_LIST:
      frame = { type: "TOKEN_LIST", user: r.str16("token_list.user") };
      break;
    case Opcode.TOKEN_REVOKE:
      frame = { type: "TOKEN_REVOKE", user: r.str16("token_revoke.user"), name: r.str16("token_revoke.name") };
      break;
    case Opcode.USER_LIST_REPLY: {
      // Not preallocated from the count: every entry takes bytes, so a lying count fails as
      // truncated before it costs memory.
      const count = r.u32("user_list_reply.count");
      const users: UserEntry[] = [];
      for (let i = 0; i < count; i++) {
        const name = r.str16("user_list_reply.name");
        const roles = r.u8("user_list_reply.roles");
        const tokens = r.u32("user_list_reply.tokens");
        const grantCount = r.u16("user_list_reply.grant_count");
        const grants: UserEntry["grants"] = [];
        for (let j = 0; j < grantCount; j++) {
          grants.push({ pattern: r.str16("user_list_reply.pattern"), actions: r.u8("user_list_reply.actions") });
        }
        users.push({ name, roles, tokens, grants });
      }
      frame = { type: "USER_LIST_REPLY", users };
      break;
    }
    case Opcode.TOKEN_CREATED:
      frame = {
        type: "TOKEN_CREATED",
        name: r.str16("token_created.name"),
        token: r.str16("token_created.token"),
        expiresMs: r.u64("token_created.expires_ms"),
      };
      break;
    case Opcode.TOKEN_LIST_REPLY: {
      const count = r.u32("token_list_reply.count");
      const tokens: TokenEntry[] = [];
      for (let i = 0; i < count; i++) {
        tokens.push({
          name: r.str16("token_list_reply.name"),
          createdMs: r.u64("token_list_reply.created_ms"),
          expiresMs: r.u64("token_list_reply.expires_ms"),
        });
      }
      frame = { type: "TOKEN_LIST_REPLY", tokens };
      break;
    }
    case Opcode.PURGE_TOPIC:
      frame = { type: "PURGE_TOPIC", name: readName(r, "purge_topic.name") };
      break;
    case Opcode.PURGED:
      frame = { type: "PURGED", messages: r.u64("purged.messages") };
      break;
    case Opcode.PAUSE_SUBSCRIPTION: {
      const topic = readName(r, "pause_subscription.topic");
      const subscription = readName(r, "pause_subscription.subscription");
      const flags = r.u8("pause_subscription.flags");
      if ((flags & ~PAUSE_FLAG_PAUSED) !== 0) throw new ProtocolError("InvalidFlags", "pause_subscription.flags", `unknown flag bits 0x${flags.toString(16)}`);
      frame = { type: "PAUSE_SUBSCRIPTION", topic, subscription, paused: flags === PAUSE_FLAG_PAUSED };
      break;
    }
    case Opcode.LIST_CONNECTIONS: {
      const after = r.u64("list_connections.after");
      const limit = r.u32("list_connections.limit");
      if (limit < 1 || limit > LIST_LIMIT_MAX) throw ProtocolError.invalid("list_connections.limit", `${limit} is not within 1..=${LIST_LIMIT_MAX}`);
      frame = { type: "LIST_CONNECTIONS", after, limit };
      break;
    }
    case Opcode.CONNECTION_LIST: {
      const total = r.u64("connection_list.total");
      const nextAfter = r.u64("connection_list.next_after");
      const count = r.u32("connection_list.count");
      const connections: ConnectionEntry[] = [];
      for (let i = 0; i < count; i++) {
        const id = r.u64("connection.id");
        const listener = r.u8("connection.listener");
        const flags = r.u8("connection.flags");
        if ((flags & ~CONNECTION_FLAG_TLS) !== 0) throw new ProtocolError("InvalidFlags", "connection.flags", `unknown flag bits 0x${flags.toString(16)}`);
        connections.push({
          id,
          listener,
          tls: flags === CONNECTION_FLAG_TLS,
          peer: r.str16("connection.peer"),
          user: r.str16("connection.user"),
          clientName: r.str16("connection.client_name"),
          connectedMs: r.u64("connection.connected_ms"),
          subscriptions: r.u32("connection.subscriptions"),
          consumers: r.u32("connection.consumers"),
          messagesIn: r.u64("connection.messages_in"),
          bytesIn: r.u64("connection.bytes_in"),
          messagesOut: r.u64("connection.messages_out"),
          bytesOut: r.u64("connection.bytes_out"),
          credit: r.u64("connection.credit"),
          unacked: r.u64("connection.unacked"),
        });
      }
      frame = { type: "CONNECTION_LIST", total, nextAfter, connections };
      break;
    }
    case Opcode.CLOSE_CONNECTION:
      frame = { type: "CLOSE_CONNECTION", id: r.u64("close_connection.id") };
      break;
    case Opcode.CLUSTER_INFO:
      frame = { type: "CLUSTER_INFO" };
      break;
    case Opcode.CLUSTER_INFO_REPLY: {
      const nodeId = r.u64("cluster_info_reply.node_id");
      const metadataLeader = r.u64("cluster_info_reply.metadata_leader");
      const nodeCount = r.u32("cluster_info_reply.node_count");
      const nodes: ClusterNode[] = [];
      for (let i = 0; i < nodeCount; i++) nodes.push({ id: r.u64("cluster_info_reply.node.id"), addr: r.str16("cluster_info_reply.node.addr") });
      const partitionCount = r.u32("cluster_info_reply.partition_count");
      const partitions: PartitionLeader[] = [];
      for (let i = 0; i < partitionCount; i++) {
        const topic = r.str16("cluster_info_reply.partition.topic");
        const partition = r.u32("cluster_info_reply.partition.partition");
        const leader = r.u64("cluster_info_reply.partition.leader");
        const n = r.u8("cluster_info_reply.partition.replica_count");
        const replicas: bigint[] = [];
        for (let j = 0; j < n; j++) replicas.push(r.u64("cluster_info_reply.partition.replica"));
        partitions.push({ topic, partition, leader, replicas });
      }
      frame = { type: "CLUSTER_INFO_REPLY", nodeId, metadataLeader, nodes, partitions };
      break;
    }
    default:
      throw new ProtocolError("UnknownOpcode", undefined, `unknown opcode 0x${opcode.toString(16).padStart(4, "0")}`);
  }
  r.finish(OPCODE_NAMES.get(opcode)!);
  return frame;
}

// ---------------------------------------------------------------------------------------------
// Encoding

/** Checks one message against the protocol's limits; the error names the field at fault. */
export function validateMessage(m: MessageInput, messageBytesMax = Infinity): void {
  const priority = m.priority ?? 0;
  if (!Number.isInteger(priority) || priority < 0 || priority > PRIORITY_MAX) {
    throw ProtocolError.invalid("record.priority", `${priority} is not within 0..=${PRIORITY_MAX}`);
  }
  if (!(m.body instanceof Uint8Array)) throw ProtocolError.invalid("record.body", "must be a Uint8Array");
  if (m.body.length > messageBytesMax) {
    throw ProtocolError.invalid("record.body", `${m.body.length} bytes, above the server's limit of ${messageBytesMax}`);
  }
  if (m.key != null && m.key.length > KEY_BYTES_MAX) {
    throw ProtocolError.invalid("record.key_len", `${m.key.length} bytes, limit ${KEY_BYTES_MAX}`);
  }
  const headers = m.headers ?? [];
  if (headers.length > HEADERS_COUNT_MAX) {
    throw ProtocolError.invalid("record.header_count", `${headers.length}, limit ${HEADERS_COUNT_MAX}`);
  }
  const d = m.deliverAfterMs;
  if (d != null && (!Number.isInteger(d) || d < 0 || d > DELAY_MS_MAX)) {
    throw ProtocolError.invalid("record.deliver_after_ms", `${d} is not within 0..=${DELAY_MS_MAX}`);
  }
}

/** Writes one record; header names and values are checked while they are written. */
export function writeRecord(w: Writer, m: MessageInput): void {
  const headers = m.headers ?? [];
  const key = m.key ?? null;
  const delay = m.deliverAfterMs ?? null;
  w.ensure(18);
  w.buf[w.pos] = m.priority ?? 0;
  w.buf[w.pos + 1] = (key !== null ? RECORD_FLAG_KEY : 0) | (delay !== null ? RECORD_FLAG_DELAY : 0);
  w.view.setUint16(w.pos + 2, key !== null ? key.length : 0, true);
  w.view.setUint16(w.pos + 4, headers.length, true);
  w.view.setUint32(w.pos + 6, m.body.length, true);
  w.pos += 10;
  if (delay !== null) w.u64(delay);
  if (key !== null) w.bytes(key);
  for (const [name, value] of headers) {
    w.str16(name, "record.header.name_len", HEADER_BYTES_MAX, 1);
    w.str16(value, "record.header.value_len", HEADER_BYTES_MAX);
  }
  w.bytes(m.body);
}

function writeName(w: Writer, name: string, field: string): void {
  w.str16(name, field, NAME_BYTES_MAX, 1);
}

function writeRanges(w: Writer, ranges: RangeInput[]): void {
  if (ranges.length > RANGES_COUNT_MAX) {
    throw ProtocolError.invalid("ranges.count", `${ranges.length}, limit ${RANGES_COUNT_MAX}`);
  }
  w.ensure(4 + ranges.length * 16);
  w.u32(ranges.length);
  for (const range of ranges) {
    w.u32(checkU32(range.partition, "range.partition"));
    const offset = toU64(range.offset, "range.offset");
    const count = checkU32(range.count, "range.count");
    if (BigInt(offset) + BigInt(count) > U64_MAX) throw ProtocolError.invalid("range", "offset + count overflows");
    w.u64(offset);
    w.u32(count);
  }
}

function writeTopicConfig(w: Writer, c: TopicConfigInput | TopicConfig): void {
  w.u32(checkU32(c.partitions ?? 0, "topic.partitions"));
  // A setting left out is the broker's to choose.
  w.u8(enumIndex(STORAGES, c.storage ?? "default", "topic.storage"));
  w.u8(enumIndex(OVERFLOWS, c.overflow ?? "default", "topic.overflow"));
  w.u64(toU64(c.maxMessages ?? 0, "topic.max_messages"));
  w.u64(toU64(c.maxBytes ?? 0, "topic.max_bytes"));
  const fsync = c.fsync ?? "default";
  const interval = checkU32(c.fsyncIntervalMs ?? 0, "topic.fsync_interval_ms");
  if ((fsync === "interval") !== (interval > 0)) {
    throw ProtocolError.invalid("topic.fsync_interval_ms", "is given (at least 1) for the interval policy only");
  }
  w.u8(enumIndex(FSYNCS, fsync, "topic.fsync"));
  w.u32(interval);
  w.u64(toU64(c.retentionMs ?? 0, "topic.retention_ms"));
  w.u8(enumIndex(RETENTION_POLICIES, c.retentionPolicy ?? "default", "topic.retention_policy"));
  w.u64(toU64(c.dedupWindowMs ?? 0, "topic.dedup_window_ms"));
  const replicas = c.replicas ?? 0;
  if (!Number.isInteger(replicas) || replicas < 0 || replicas > 0xff) throw ProtocolError.invalid("topic.replicas", `${replicas} is not within 0..=255`);
  w.u8(replicas);
}

function writeTopicInfo(w: Writer, t: TopicInfo): void {
  w.str16(t.name, "topic_info.name");
  writeTopicConfig(w, t.config);
  w.u64(toU64(t.messages, "topic_info.messages"));
  w.u64(toU64(t.bytes, "topic_info.bytes"));
  w.u32(t.subscriptions.length);
  for (const s of t.subscriptions) w.str16(s, "topic_info.subscription");
}

function writeLatency(w: Writer, h: Latency): void {
  w.u64(toU64(h.sumUs, "latency.sum_us"));
  w.u16(h.buckets.length);
  for (const [bucket, count] of h.buckets) {
    w.u16(bucket);
    w.u64(toU64(count, "latency.count"));
  }
}

function writeEntry(w: Writer, e: MessageEntry): void {
  w.u32(e.partition);
  w.u64(toU64(e.offset, "message_entry.offset"));
  w.u8(enumIndex(STATES, e.state, "message_entry.state"));
  w.u16(e.attempts);
  w.u64(toU64(e.publishedMs, "message_entry.published_ms"));
  w.u64(toU64(e.firstDeliveredMs, "message_entry.first_delivered_ms"));
  w.u64(toU64(e.settledMs, "message_entry.settled_ms"));
  w.u64(toU64(e.dueMs, "message_entry.due_ms"));
  w.bytes16(e.result, "message_entry.result");
  w.str16(e.reason, "message_entry.reason");
  w.u8(e.deadLetter ? 1 : 0);
  w.u32(e.deadLetter?.partition ?? 0);
  w.u64(toU64(e.deadLetter?.offset ?? 0, "message_entry.dead_letter_offset"));
}

/** Writes the 12-byte header of a frame whose payload follows; returns where it starts. */
export function beginFrame(w: Writer, opcode: number, requestId: number): number {
  const at = w.pos;
  w.ensure(FRAME_HEADER_BYTES);
  w.view.setUint16(at + 4, opcode, true);
  w.view.setUint16(at + 6, 0, true);
  w.view.setUint32(at + 8, requestId, true);
  w.pos += FRAME_HEADER_BYTES;
  return at;
}

/** Fills in the payload length of the frame begun at `at`. */
export function endFrame(w: Writer, at: number): void {
  w.view.setUint32(at, w.pos - at - FRAME_HEADER_BYTES, true);
}

/** Encodes one frame with its header into `w` (a fresh writer when not given). */
export function encodeFrame(frame: FrameInput, requestId: number, w: Writer = new Writer()): Uint8Array {
  checkU32(requestId, "request_id");
  const start = w.pos;
  const at = beginFrame(w, Opcode[frame.type], requestId);
  switch (frame.type) {
    case "HELLO":
      w.u16(frame.versionMin);
      w.u16(frame.versionMax);
      w.u32(checkU32(frame.heartbeatMs, "hello.heartbeat_ms"));
      w.str16(frame.clientName, "hello.client_name");
      w.str16(frame.user, "hello.user");
      w.str16(frame.password, "hello.password");
      break;
    case "PING":
    case "PONG":
    case "LIST_TOPICS":
    case "OK":
      break;
    case "CREATE_TOPIC":
      writeName(w, frame.name, "create_topic.name");
      writeTopicConfig(w, frame.config);
      w.u8(frame.ifNotExists ? CREATE_FLAG_IF_NOT_EXISTS : 0);
      break;
    case "DELETE_TOPIC":
      writeName(w, frame.name, "delete_topic.name");
      break;
    case "DESCRIBE_TOPIC":
      writeName(w, frame.name, "describe_topic.name");
      break;
    case "PUBLISH":
      if (frame.messages.length > BATCH_COUNT_MAX) {
        throw ProtocolError.invalid("batch.count", `${frame.messages.length}, limit ${BATCH_COUNT_MAX}`);
      }
      writeName(w, frame.topic, "publish.topic");
      w.u32(frame.partition === null ? NO_PARTITION : checkU32(frame.partition, "publish.partition", 0, NO_PARTITION - 1));
      w.u32(frame.messages.length);
      for (const m of frame.messages) {
        validateMessage(m);
        writeRecord(w, m);
      }
      break;
    case "SUBSCRIBE": {
      writeName(w, frame.topic, "subscribe.topic");
      w.str16(frame.subscription, "subscribe.subscription", NAME_BYTES_MAX);
      const kind = START_KINDS.indexOf(frame.start.kind);
      if (kind < 0) throw ProtocolError.invalid("subscribe.start", `unknown start kind ${String(frame.start.kind)}`);
      w.u8(kind);
      w.u64("value" in frame.start ? toU64(frame.start.value, "subscribe.start_value") : 0);
      w.u32(checkU32(frame.ackTimeoutMs, "subscribe.ack_timeout_ms"));
      w.u32(checkU32(frame.maxAttempts, "subscribe.max_attempts"));
      w.u32(checkU32(frame.credit, "subscribe.credit"));
      if (frame.autoAck && frame.ordered) {
        throw ProtocolError.invalid("subscribe.flags", "ordered delivery needs acks: it cannot be combined with auto_ack");
      }
      w.u8((frame.autoAck ? SUBSCRIBE_FLAG_AUTO_ACK : 0) | (frame.ordered ? SUBSCRIBE_FLAG_ORDERED : 0));
      if (frame.partitions.length > PARTITIONS_MAX) {
        throw ProtocolError.invalid("subscribe.partitions", `${frame.partitions.length} ranges, above the limit of ${PARTITIONS_MAX}`);
      }
      w.u16(frame.partitions.length);
      for (const { first, last } of frame.partitions) {
        checkU32(first, "subscribe.partitions");
        checkU32(last, "subscribe.partitions");
        if (first > last) throw ProtocolError.invalid("subscribe.partitions", `range ${first}-${last} ends before it starts`);
        w.u32(first);
        w.u32(last);
      }
      w.str16(frame.deadLetterTopic, "subscribe.dead_letter_topic", NAME_BYTES_MAX);
      break;
    }
    case "UNSUBSCRIBE":
      w.u32(frame.consumerId);
      break;
    case "CREDIT":
      w.u32(frame.consumerId);
      w.u32(checkU32(frame.credit, "credit.credit"));
      break;
    case "ACK":
      w.u32(frame.consumerId);
      writeRanges(w, frame.ranges);
      break;
    case "NACK":
      w.u32(frame.consumerId);
      w.u32(checkU32(frame.delayMs, "nack.delay_ms"));
      if (frame.deadLetter && frame.release) {
        throw ProtocolError.invalid("nack.flags", "a NACK either dead-letters or releases its messages, not both");
      }
      w.u8((frame.deadLetter ? NACK_FLAG_DEAD_LETTER : 0) | (frame.release ? NACK_FLAG_RELEASE : 0));
      w.str16(frame.reason, "nack.reason", ERROR_MESSAGE_BYTES_MAX);
      writeRanges(w, frame.ranges);
      break;
    case "DELETE_SUBSCRIPTION":
      writeName(w, frame.topic, "delete_subscription.topic");
      writeName(w, frame.subscription, "delete_subscription.subscription");
      break;
    case "ACK_RESULT":
      if (frame.result.length > ACK_RESULT_BYTES_MAX) {
        throw ProtocolError.invalid("ack_result.result", `${frame.result.length} bytes, above the limit of ${ACK_RESULT_BYTES_MAX}`);
      }
      w.u32(frame.consumerId);
      w.bytes16(frame.result, "ack_result.result");
      writeRanges(w, frame.ranges);
      break;
    case "STATS":
      w.str16(frame.topic, "stats.topic", NAME_BYTES_MAX);
      break;
    case "MESSAGE_STATUS":
      writeName(w, frame.topic, "message_status.topic");
      w.u32(checkU32(frame.partition, "message_status.partition"));
      w.u64(toU64(frame.offset, "message_status.offset"));
      break;
    case "LIST_MESSAGES":
      writeName(w, frame.topic, "list_messages.topic");
      writeName(w, frame.subscription, "list_messages.subscription");
      w.u8(enumIndex(LIST_KINDS, frame.kind, "list_messages.kind"));
      if (frame.page.length > LIST_PAGE_BYTES_MAX) {
        throw ProtocolError.invalid("list_messages.page", `${frame.page.length} bytes, above the limit of ${LIST_PAGE_BYTES_MAX}`);
      }
      w.bytes16(frame.page, "list_messages.page");
      w.u32(checkU32(frame.limit, "list_messages.limit", 1, LIST_LIMIT_MAX));
      break;
    case "REQUEUE_DEAD": {
      writeName(w, frame.deadLetterTopic, "requeue_dead.dead_letter_topic");
      const s = frame.selection;
      if (s.kind === "all") {
        w.u8(0);
        w.u32(0);
        w.u64(0);
        w.u64(0);
      } else if (s.kind === "range") {
        const first = toU64(s.firstOffset, "requeue_dead.first_offset");
        const last = toU64(s.lastOffset, "requeue_dead.last_offset");
        if (BigInt(last) < BigInt(first)) {
          throw ProtocolError.invalid("requeue_dead.last_offset", `range ${first}..=${last} ends before it starts`);
        }
        w.u8(1);
        w.u32(checkU32(s.partition, "requeue_dead.partition"));
        w.u64(first);
        w.u64(last);
      } else {
        throw ProtocolError.invalid("requeue_dead.selection", "must be all or range");
      }
      break;
    }
    case "HELLO_OK":
      w.u16(frame.version);
      w.u32(frame.heartbeatMs);
      w.u32(frame.frameBytesMax);
      w.u32(frame.messageBytesMax);
      w.str16(frame.server, "hello_ok.server");
      break;
    case "ERROR":
      w.u16(frame.code);
      w.str16(frame.message, "error.message");
      break;
    case "PUBLISHED":
      w.u8(enumIndex(DURABILITIES, frame.durability, "published.durability"));
      writeRanges(w, frame.ranges);
      break;
    case "TOPIC_LIST":
      w.u32(frame.topics.length);
      for (const t of frame.topics) writeTopicInfo(w, t);
      break;
    case "TOPIC_INFO":
      writeTopicInfo(w, frame.topic);
      break;
    case "SUBSCRIBED":
      w.u32(frame.consumerId);
      w.str16(frame.subscription, "subscribed.subscription");
      w.u32(frame.partitions);
      break;
    case "DELIVER":
      w.u32(frame.consumerId);
      w.u32(frame.deliveries.length);
      for (const d of frame.deliveries) {
        w.u32(d.partition);
        w.u64(toU64(d.offset, "delivery.offset"));
        w.u64(toU64(d.timestampMs, "delivery.timestamp_ms"));
        w.u16(d.attempt);
        validateMessage(d.message);
        writeRecord(w, d.message);
      }
      break;
    case "STATS_REPLY":
      w.u32(frame.topics.length);
      for (const t of frame.topics) {
        w.str16(t.name, "stats.topic.name");
        for (const v of [t.messagesIn, t.bytesIn, t.messagesOut, t.bytesOut, t.depth, t.depthBytes, t.dropped]) {
          w.u64(toU64(v, "stats.topic"));
        }
        w.u32(t.publishers);
        w.u32(t.subscribers);
        w.u32(t.subscriptions.length);
        for (const s of t.subscriptions) {
          w.str16(s.name, "stats.subscription.name");
          w.u8(s.ephemeral ? 1 : 0);
          w.u32(s.consumers);
          for (const v of [s.messagesOut, s.bytesOut, s.acked, s.redelivered, s.backlog, s.inFlight, s.gaveUp]) {
            w.u64(toU64(v, "stats.subscription"));
          }
          writeLatency(w, s.deliverLatency);
          writeLatency(w, s.ackLatency);
          w.u8(s.paused ? 1 : 0);
        }
      }
      break;
    case "MESSAGE_STATUS_REPLY": {
      const s = frame.status;
      w.u32(s.partition);
      w.u64(toU64(s.offset, "message_status.offset"));
      w.u64(toU64(s.publishedMs, "message_status.published_ms"));
      w.u8(s.priority);
      w.u8(s.key !== null ? 1 : 0);
      w.bytes16(s.key ?? new Uint8Array(0), "message_status.key");
      w.u32(s.bodyBytes);
      w.u32(s.subscriptions.length);
      for (const sub of s.subscriptions) {
        w.str16(sub.subscription, "message_status.subscription");
        writeEntry(w, sub.entry);
      }
      break;
    }
    case "MESSAGE_LIST":
      w.u32(frame.entries.length);
      for (const e of frame.entries) writeEntry(w, e);
      w.bytes16(frame.nextPage, "message_list.next_page");
      break;
    case "REQUEUED":
      w.u64(toU64(frame.requeued, "requeued.requeued"));
      w.u64(toU64(frame.skipped, "requeued.skipped"));
      break;
    case "USER_ADD":
      w.str16(frame.user, "user_add.user");
      w.str16(frame.password, "user_add.password");
      w.u8(checkBits(frame.roles, ROLES_ALL, "user_add.roles"));
      break;
    case "USER_REMOVE":
      w.str16(frame.user, "user_remove.user");
      break;
    case "USER_PASSWD":
      w.str16(frame.user, "user_passwd.user");
      w.str16(frame.password, "user_passwd.password");
      break;
    case "USER_LIST":
      break;
    case "GRANT":
    case "REVOKE": {
      const prefix = frame.type === "GRANT" ? "grant" : "revoke";
      w.str16(frame.user, `${prefix}.user`);
      w.str16(frame.pattern, `${prefix}.pattern`);
      w.u8(checkBits(frame.actions, ACTIONS_ALL, `${prefix}.actions`));
      w.u8(checkBits(frame.roles, ROLES_ALL, `${prefix}.roles`));
      break;
    }
    case "TOKEN_CREATE":
      w.str16(frame.user, "token_create.user");
      w.str16(frame.name, "token_create.name");
      w.u64(toU64(frame.expiresMs, "token_create.expires_ms"));
      break;
    case "TOKEN_LIST":
      w.str16(frame.user, "token_list.user");
      break;
    case "TOKEN_REVOKE":
      w.str16(frame.user, "token_revoke.user");
      w.str16(frame.name, "token_revoke.name");
      break;
    case "USER_LIST_REPLY":
      w.u32(frame.users.length);
      for (const u of frame.users) {
        w.str16(u.name, "user_list_reply.name");
        w.u8(checkBits(u.roles, 0xff, "user_list_reply.roles"));
        w.u32(checkU32(u.tokens, "user_list_reply.tokens"));
        if (u.grants.length > 0xffff) {
          throw ProtocolError.invalid("user_list_reply.grant_count", `${u.grants.length} grants do not fit a u16`);
        }
        w.u16(u.grants.length);
        for (const g of u.grants) {
          w.str16(g.pattern, "user_list_reply.pattern");
          w.u8(checkBits(g.actions, 0xff, "user_list_reply.actions"));
        }
      }
      break;
    case "TOKEN_CREATED":
      w.str16(frame.name, "token_created.name");
      w.str16(frame.token, "token_created.token");
      w.u64(toU64(frame.expiresMs, "token_created.expires_ms"));
      break;
    case "TOKEN_LIST_REPLY":
      w.u32(frame.tokens.length);
      for (const t of frame.tokens) {
        w.str16(t.name, "token_list_reply.name");
        w.u64(toU64(t.createdMs, "token_list_reply.created_ms"));
        w.u64(toU64(t.expiresMs, "token_list_reply.expires_ms"));
      }
      break;
    case "PURGE_TOPIC":
      w.str16(frame.name, "purge_topic.name", NAME_BYTES_MAX, 1);
      break;
    case "PURGED":
      w.u64(toU64(frame.messages, "purged.messages"));
      break;
    case "PAUSE_SUBSCRIPTION":
      w.str16(frame.topic, "pause_subscription.topic", NAME_BYTES_MAX, 1);
      w.str16(frame.subscription, "pause_subscription.subscription", NAME_BYTES_MAX, 1);
      w.u8(frame.paused ? PAUSE_FLAG_PAUSED : 0);
      break;
    case "LIST_CONNECTIONS":
      w.u64(toU64(frame.after, "list_connections.after"));
      w.u32(checkU32(frame.limit, "list_connections.limit", 1, LIST_LIMIT_MAX));
      break;
    case "CONNECTION_LIST":
      w.u64(toU64(frame.total, "connection_list.total"));
      w.u64(toU64(frame.nextAfter, "connection_list.next_after"));
      w.u32(frame.connections.length);
      for (const c of frame.connections) {
        w.u64(toU64(c.id, "connection.id"));
        w.u8(c.listener);
        w.u8(c.tls ? CONNECTION_FLAG_TLS : 0);
        w.str16(c.peer, "connection.peer");
        w.str16(c.user, "connection.user");
        w.str16(c.clientName, "connection.client_name");
        w.u64(toU64(c.connectedMs, "connection.connected_ms"));
        w.u32(c.subscriptions);
        w.u32(c.consumers);
        for (const v of [c.messagesIn, c.bytesIn, c.messagesOut, c.bytesOut, c.credit, c.unacked]) w.u64(toU64(v, "connection"));
      }
      break;
    case "CLOSE_CONNECTION":
      w.u64(toU64(frame.id, "close_connection.id"));
      break;
    case "CLUSTER_INFO":
      break;
    case "CLUSTER_INFO_REPLY":
      w.u64(toU64(frame.nodeId, "cluster_info_reply.node_id"));
      w.u64(toU64(frame.metadataLeader, "cluster_info_reply.metadata_leader"));
      w.u32(frame.nodes.length);
      for (const n of frame.nodes) {
        w.u64(toU64(n.id, "cluster_info_reply.node.id"));
        w.str16(n.addr, "cluster_info_reply.node.addr");
      }
      w.u32(frame.partitions.length);
      for (const p of frame.partitions) {
        if (p.replicas.length > 0xff) throw ProtocolError.invalid("cluster_info_reply.partition.replica_count", `${p.replicas.length} replicas, at most 255`);
        w.str16(p.topic, "cluster_info_reply.partition.topic");
        w.u32(p.partition);
        w.u64(toU64(p.leader, "cluster_info_reply.partition.leader"));
        w.u8(p.replicas.length);
        for (const r of p.replicas) w.u64(toU64(r, "cluster_info_reply.partition.replica"));
      }
      break;
    default: {
      const never: never = frame;
      throw ProtocolError.invalid("opcode", `unknown frame ${JSON.stringify(never)}`);
    }
  }
  endFrame(w, at);
  return w.buf.subarray(start, w.pos);
}
