// The codec against every valid and invalid frame of protocol/vectors.json: each valid vector
// encodes from its fields to its exact bytes and decodes back to the same frame, whole, split
// at every byte and truncated; each invalid vector is refused with the named error and field.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { decodeFrame, encodeFrame, FrameStream, PROTOCOL_VERSION, ProtocolError, Writer } from "../dist/index.js";
import { bytesToHex, hexToBytes, readJson, repoRoot } from "./support.mjs";

// The client speaks version 3 only, whose vectors are the newest file, protocol/vectors.json.
// The frozen file of the version this client speaks (protocol/vectors-v<N>.json) while it speaks an
// older one than the newest: a later version may lay out a frame differently (version 3 extends
// STATS_REPLY), so the newest file, protocol/vectors.json, is not this client's.
const own = join(repoRoot, "protocol", `vectors-v${PROTOCOL_VERSION}.json`);
const vectors = readJson(existsSync(own) ? own : join(repoRoot, "protocol", "vectors.json"));
// Frames of a protocol version newer than this client's are not its own: it never offers that
// version, so the server never sends them to it.
const spoken = (name) => ((vectors.opcode_since ?? {})[name] ?? 1) <= PROTOCOL_VERSION;
vectors.vectors = vectors.vectors.filter((v) => spoken(v.frame));
vectors.opcodes = Object.fromEntries(Object.entries(vectors.opcodes).filter(([name]) => spoken(name)));

const U64_FIELDS = new Set([
  "offset", "max_messages", "max_bytes", "retention_ms", "dedup_window_ms", "messages", "bytes", "messages_in",
  "bytes_in", "messages_out", "bytes_out", "depth", "depth_bytes", "dropped", "acked",
  "redelivered", "backlog", "in_flight", "gave_up", "sum_us", "published_ms",
  "first_delivered_ms", "settled_ms", "due_ms", "timestamp_ms", "requeued", "skipped",
  "first_offset", "last_offset", "value", "expires_ms", "created_ms", "id", "leader", "unacked",
  "connected_ms", "after", "total", "next_after", "node_id", "metadata_leader",
]);

const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

function isByteString(v) {
  const keys = Object.keys(v);
  return keys.length === 1 && (keys[0] === "utf8" || keys[0] === "hex");
}

/** The vectors' field notation as the decoded frame is expected to look. */
function convert(key, value) {
  if (value === null) return null;
  if (Array.isArray(value)) {
    if (key === "headers") return value.map(([n, v]) => [n, v]);
    if (key === "buckets") return value.map(([b, c]) => [Number(b), BigInt(c)]);
    // CLUSTER_INFO_REPLY's replicas are node ids (u64); a topic config's `replicas` is a count.
    if (key === "replicas") return value.map((id) => BigInt(id));
    return value.map((item) => convert(key, item));
  }
  if (typeof value === "object") {
    if (isByteString(value)) {
      return "utf8" in value ? new TextEncoder().encode(value.utf8) : hexToBytes(value.hex);
    }
    const out = {};
    for (const [k, v] of Object.entries(value)) out[camel(k)] = convert(k, v);
    return out;
  }
  if ((typeof value === "number" || typeof value === "string") && U64_FIELDS.has(key) && /^[0-9]+$/.test(String(value))) {
    return BigInt(value);
  }
  return value;
}

function expectedFrame(vector) {
  const fields = convert("", vector.fields);
  // CREDIT's and SUBSCRIBE's credit is a u32; a connection's (CONNECTION_LIST) a u64.
  if (vector.frame === "CONNECTION_LIST") for (const c of fields.connections) c.credit = BigInt(c.credit);
  if (vector.frame === "TOPIC_INFO") return { type: vector.frame, topic: fields };
  if (vector.frame === "MESSAGE_STATUS_REPLY") return { type: vector.frame, status: fields };
  return { type: vector.frame, ...fields };
}

test("the vectors file covers every opcode in both directions", () => {
  const covered = new Set(vectors.vectors.map((v) => v.frame));
  for (const name of Object.keys(vectors.opcodes)) assert.ok(covered.has(name), `no vector for ${name}`);
  assert.ok(vectors.invalid.length > 0);
});

for (const vector of vectors.vectors) {
  test(`valid vector ${vector.name}: encodes to its bytes and decodes back`, () => {
    const expected = expectedFrame(vector);
    const encoded = encodeFrame(expected, vector.request_id);
    assert.equal(bytesToHex(encoded), vector.hex);

    const decoded = decodeFrame(hexToBytes(vector.hex), vectors.frame_bytes_max);
    assert.equal(decoded.requestId, vector.request_id);
    assert.deepStrictEqual(decoded.frame, expected);
    // What decodes re-encodes to the same bytes.
    assert.equal(bytesToHex(encodeFrame(decoded.frame, decoded.requestId)), vector.hex);
  });

  test(`valid vector ${vector.name}: every truncated payload is refused`, () => {
    const bytes = hexToBytes(vector.hex);
    const payloadLen = bytes.length - 12;
    for (let cut = 0; cut < payloadLen; cut++) {
      const truncated = bytes.slice(0, 12 + cut);
      new DataView(truncated.buffer).setUint32(0, cut, true);
      assert.throws(
        () => decodeFrame(truncated, vectors.frame_bytes_max),
        (e) => e instanceof ProtocolError && (e.kind === "Truncated" || e.kind === "InvalidValue"),
        `${vector.name} cut to ${cut} of ${payloadLen} payload bytes`,
      );
    }
  });
}

for (const vector of vectors.invalid) {
  test(`invalid vector ${vector.name}: refused with ${vector.error}${vector.field ? ` at ${vector.field}` : ""}`, () => {
    const bytes = hexToBytes(vector.hex);
    for (const decode of [
      () => decodeFrame(bytes, vectors.frame_bytes_max),
      () => new FrameStream(vectors.frame_bytes_max).push(bytes, () => assert.fail("decoded an invalid frame")),
    ]) {
      assert.throws(decode, (e) => {
        assert.ok(e instanceof ProtocolError, `${e}`);
        assert.equal(e.kind, vector.error, e.message);
        if (vector.field) assert.equal(e.field, vector.field, e.message);
        return true;
      });
    }
  });
}

test("a stream of every valid vector, split at seeded random points, decodes frame by frame", () => {
  const seed = Number(process.env.FERRYMQ_TEST_SEED ?? Date.now() % 1_000_000);
  let state = seed;
  const random = () => {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    return state / 2 ** 31;
  };
  const all = Buffer.concat(vectors.vectors.map((v) => hexToBytes(v.hex)));
  for (let round = 0; round < 20; round++) {
    const stream = new FrameStream(vectors.frame_bytes_max);
    const seen = [];
    let at = 0;
    while (at < all.length) {
      const n = 1 + Math.floor(random() * (round < 5 ? 16 : 400));
      stream.push(new Uint8Array(all.subarray(at, at + n)), (requestId, frame) => seen.push({ requestId, frame }));
      at += n;
    }
    assert.equal(seen.length, vectors.vectors.length, `seed ${seed}`);
    assert.equal(stream.buffered(), 0);
    seen.forEach(({ requestId, frame }, i) => {
      const v = vectors.vectors[i];
      assert.equal(requestId, v.request_id, `seed ${seed}`);
      assert.deepStrictEqual(frame, expectedFrame(v), `seed ${seed}, ${v.name}`);
    });
  }
});

test("encoding refuses values the protocol cannot carry, naming the field", () => {
  const cases = [
    [{ type: "PUBLISH", topic: "t", partition: null, messages: [{ body: new Uint8Array(1), priority: 10 }] }, "record.priority"],
    [{ type: "PUBLISH", topic: "", partition: null, messages: [] }, "publish.topic"],
    [{ type: "PUBLISH", topic: "t", partition: null, messages: [{ body: new Uint8Array(1), key: new Uint8Array(1025) }] }, "record.key_len"],
    [{ type: "PUBLISH", topic: "t", partition: null, messages: [{ body: new Uint8Array(1), headers: [["", "v"]] }] }, "record.header.name_len"],
    [{ type: "PUBLISH", topic: "t", partition: null, messages: [{ body: new Uint8Array(1), deliverAfterMs: 2_592_000_001 }] }, "record.deliver_after_ms"],
    [{ type: "MESSAGE_STATUS", topic: "t", partition: 0, offset: 2 ** 53 }, "message_status.offset"],
    [{ type: "MESSAGE_STATUS", topic: "t", partition: 0, offset: "18446744073709551616" }, "message_status.offset"],
    [{ type: "ACK", consumerId: 1, ranges: [{ partition: 0, offset: (1n << 64n) - 1n, count: 2 }] }, "range"],
    [{ type: "LIST_MESSAGES", topic: "t", subscription: "s", kind: "pending", page: new Uint8Array(0), limit: 0 }, "list_messages.limit"],
    [{ type: "USER_ADD", user: "u", password: "password", roles: 4 }, "user_add.roles"],
    [{ type: "GRANT", user: "u", pattern: "t", actions: 64, roles: 0 }, "grant.actions"],
    [{ type: "REVOKE", user: "u", pattern: "t", actions: 1, roles: 1.5 }, "revoke.roles"],
    [{ type: "TOKEN_CREATE", user: "", name: "n", expiresMs: -1 }, "token_create.expires_ms"],
  ];
  for (const [frame, field] of cases) {
    assert.throws(() => encodeFrame(frame, 1), (e) => e instanceof ProtocolError && e.field === field, field);
  }
});

test("u64 fields take a bigint, a safe number or a decimal string, and decode as bigint", () => {
  const w = new Writer();
  for (const offset of [9007199254740993n, "9007199254740993"]) {
    const bytes = encodeFrame({ type: "MESSAGE_STATUS", topic: "t", partition: 1, offset }, 7, w);
    const { frame } = decodeFrame(bytes.slice(), 1 << 24);
    assert.equal(frame.offset, 9007199254740993n);
  }
});
