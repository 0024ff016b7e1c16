// The bus's fast paths give what the general ones gave: DELIVER records that share a header
// block decode to the same messages, a receiver whose handlers return no promise (or an already
// settled one) settles every message once, JSON without long digit runs parses as before.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, decodeFrame, encodeFrame, ProtocolError } from "../dist/index.js";
import { defineMessage, loadSettings, parseJsonLossless, Receiver, Sender } from "../dist/bus/index.js";
import { Broker } from "./support.mjs";

const enc = new TextEncoder();
const BUS_HEADERS = [
  ["x-bus-type", "FastJob"],
  ["x-bus-serializer", "json"],
  ["x-bus-sender", "s"],
  ["x-bus-shard", "3"],
  ["x-bus-prepared-ms", "1700000000000"],
  ["x-bus-sent-ms", "1700000000001"],
];

function deliveries() {
  const other = [...BUS_HEADERS.slice(0, 3), ["x-bus-shard", "4"], ...BUS_HEADERS.slice(4)];
  const out = [];
  for (let i = 0; i < 40; i++) {
    let headers = i % 3 ? BUS_HEADERS : other;
    if (i % 7 === 0) headers = headers.slice(0, 5); // a block that is a prefix of another
    out.push({
      partition: i % 2,
      offset: BigInt(i),
      timestampMs: 1_700_000_000_000n + BigInt(i),
      attempt: 1 + (i % 3),
      message: { body: enc.encode(`{"id":${i}}`), key: i % 11 === 5 ? null : enc.encode(`c${i % 5}`), headers, priority: i % 10, deliverAfterMs: null },
    });
  }
  out.push({ partition: 0, offset: 99n, timestampMs: 1n, attempt: 1, message: { body: enc.encode("x"), key: enc.encode("k"), headers: [["été", "☃"]], priority: 0, deliverAfterMs: null } });
  out.push({ partition: 0, offset: 100n, timestampMs: 1n, attempt: 1, message: { body: new Uint8Array(0), key: enc.encode("k"), headers: BUS_HEADERS, priority: 0, deliverAfterMs: 5 } });
  out.push({ partition: 0, offset: 101n, timestampMs: 1n, attempt: 1, message: { body: enc.encode("plain"), key: null, headers: [], priority: 0, deliverAfterMs: null } });
  return out;
}

/** A maker like the subscription's: the object reads the prefix and is filled with the record. */
const maker = () => (view, at) => ({
  partition: view.getUint32(at, true),
  offset: view.getBigUint64(at + 4, true),
  timestampMs: view.getBigUint64(at + 12, true),
  attempt: view.getUint16(at + 20, true),
  message: { key: null, headers: [], priority: 0, deliverAfterMs: null, body: new Uint8Array(0) },
});

const plain = (d) => ({
  partition: d.partition,
  offset: d.offset,
  timestampMs: d.timestampMs,
  attempt: d.attempt,
  message: {
    key: d.message.key === null ? null : [...d.message.key],
    headers: d.message.headers.map(([n, v]) => [n, v]),
    priority: d.message.priority,
    deliverAfterMs: d.message.deliverAfterMs,
    body: [...d.message.body],
  },
});

test("records sharing header blocks decode as each record alone does", () => {
  const bytes = encodeFrame({ type: "DELIVER", consumerId: 7, deliveries: deliveries() }, 0);
  const general = decodeFrame(bytes, 1 << 24, null).frame.deliveries;
  const fast = decodeFrame(bytes, 1 << 24, maker).frame.deliveries;
  assert.deepEqual(fast.map(plain), general.map(plain));
  assert.deepEqual(fast.map(plain), deliveries().map(plain));
  // Messages of one block share its headers, frozen so that no message changes another's.
  assert.equal(fast[1].message.headers, fast[2].message.headers);
  assert.ok(Object.isFrozen(fast[1].message.headers));
});

test("a truncated or invalid record after a shared block is refused", () => {
  const one = { partition: 0, offset: 1n, timestampMs: 1n, attempt: 1, message: { body: enc.encode("0123456789"), key: enc.encode("k"), headers: [["a", "b"]], priority: 0, deliverAfterMs: null } };
  const bytes = encodeFrame({ type: "DELIVER", consumerId: 7, deliveries: [one, one] }, 0);
  // The frame claims 3 bytes fewer: the second body is cut.
  const cut = bytes.slice(0, bytes.length - 3);
  new DataView(cut.buffer).setUint32(0, cut.length - 12, true);
  assert.throws(() => decodeFrame(cut, 1 << 24, maker), (e) => e instanceof ProtocolError && e.kind === "Truncated");
  const bad = bytes.slice();
  const second = bytes.length - (22 + 10 + 1 + 2 + 1 + 2 + 1 + 10);
  bad[second + 22 + 10 + 1 + 2] = 0xff; // the second record's header name is no longer UTF-8
  assert.throws(() => decodeFrame(bad, 1 << 24, maker), (e) => e instanceof ProtocolError && e.kind === "InvalidUtf8");
});

test("JSON without a run of 16 digits parses with JSON.parse; with one, the digits are kept", () => {
  for (const text of ['{"a":1,"b":"x"}', '{"a":-0,"b":1.5e300}', '[1,2,3]', '{"s":"123456789012345"}']) {
    assert.deepEqual(parseJsonLossless(text), JSON.parse(text));
  }
  assert.notEqual(parseJsonLossless('{"a":12345678901234567}').a, 12345678901234567);
});

let broker;
before(async () => {
  broker = await Broker.start();
});
after(async () => {
  await broker?.stop();
});

const FastJob = defineMessage({ name: "FastJob", key: "customer", fields: [["id", "int"], ["customer", "string"], ["pad", "string"]] });

for (const [kind, handle] of [
  ["a plain function", (seen) => (job) => void seen.push(job.id)],
  ["an async function that never waits", (seen) => async (job) => void seen.push(job.id)],
  [
    "a mix of plain results, waits and one failure",
    (seen) => (job, ctx) => {
      if (job.id === 13 && ctx.attempt === 1) throw new Error("thirteen fails once");
      if (job.id % 10 === 0) return new Promise((r) => setTimeout(r, 1)).then(() => void seen.push(job.id));
      seen.push(job.id);
      return undefined;
    },
  ],
]) {
  test(`a receiver with ${kind} as handler settles every message once`, async () => {
    const client = await Client.connect({ url: broker.url });
    try {
      const n = 1500;
      const identity = `fast-${kind.replace(/\W+/g, "-")}`;
      const settings = loadSettings({ addr: broker.url, identity, shardCount: 2, topicTemplate: identity }, [], {});
      await (await Sender.create(client, settings)).sendMany(FastJob, Array.from({ length: n }, (_, i) => ({ id: i, customer: `c${i % 7}`, pad: "x" })));
      const seen = [];
      const errors = [];
      const receiver = new Receiver(client, settings, [{ messageType: FastJob, handle: handle(seen) }], {
        concurrency: 8,
        prefetch: 512,
        retry: { initialDelayMs: 1, jitter: 0 },
        onError: (e) => errors.push(e),
      });
      await receiver.start();
      const deadline = Date.now() + 30_000;
      while (seen.length < n && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      await receiver.stop();
      assert.deepEqual([...seen].sort((a, b) => a - b), Array.from({ length: n }, (_, i) => i), "every message handled once");
      const failed = kind.startsWith("a mix") ? 1 : 0;
      assert.equal(receiver.counts.handled, n);
      assert.equal(receiver.counts.failed, failed);
      assert.equal(errors.length, failed);
      const [topic] = await client.stats(identity);
      const sub = topic.subscriptions.find((s) => s.name === identity);
      assert.equal(sub.acked, BigInt(n));
      assert.equal(sub.backlog, 0n);
      assert.equal(sub.inFlight, 0n);
      assert.equal(sub.redelivered, BigInt(failed));
    } finally {
      await client.close();
    }
  });
}
