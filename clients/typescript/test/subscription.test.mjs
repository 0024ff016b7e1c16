// A subscription's bookkeeping without a broker: deliveries decoded into Messages, 64-bit
// offsets and times on both sides of 2^53, acks coalesced into ranges, credit returned.
import assert from "node:assert/strict";
import { test } from "node:test";

import { encodeFrame, FrameStream, Subscription } from "../dist/index.js";

function deliverFrame(offsets, partition = 3) {
  const deliveries = offsets.map((offset, i) => ({
    partition,
    offset,
    timestampMs: 18446744073709551615n - BigInt(i),
    attempt: 1 + i,
    message: { key: null, headers: [], priority: 0, deliverAfterMs: null, body: new Uint8Array([i]) },
  }));
  return encodeFrame({ type: "DELIVER", consumerId: 7, deliveries }, 0).slice();
}

function harness(window = 100) {
  const sent = [];
  const fake = { isConnected: () => true, send: (f) => sent.push(f), flushWrites() {}, forget() {}, request: async () => ({}) };
  const sub = new Subscription(fake, "t", { window });
  sub.attached(7, "s", 4, 1);
  const stream = new FrameStream(1 << 24, () => sub.makeMessage);
  const push = (frame) => stream.push(frame, (id, f) => sub.deliver(f.deliveries));
  return { sub, sent, push };
}

test("offsets and times across 2^53 come out exact, and acks coalesce into one range", async () => {
  const { sub, sent, push } = harness();
  const offsets = [9007199254740990n, 9007199254740991n, 9007199254740992n, 9007199254740993n, 9007199254740994n];
  push(deliverFrame(offsets));
  const got = [];
  for (let i = 0; i < offsets.length; i++) got.push(await sub.next());
  assert.deepEqual(got.map((m) => m.offset), offsets);
  assert.deepEqual(got.map((m) => m.id), offsets.map((o) => `3-${o}`));
  assert.equal(got[0].timestampMs, 18446744073709551615n);
  assert.equal(got[4].timestampMs, 18446744073709551611n);
  assert.deepEqual(got.map((m) => m.attempt), [1, 2, 3, 4, 5]);
  got.forEach((m) => m.ack());
  sub.flush();
  const acks = sent.filter((f) => f.type === "ACK");
  assert.equal(acks.length, 1);
  assert.deepEqual(acks[0].ranges, [{ partition: 3, offset: 9007199254740990n, count: 5 }]);
  assert.deepEqual(sent.find((f) => f.type === "CREDIT"), { type: "CREDIT", consumerId: 7, credit: 5 });
});

test("acks out of order or across partitions make one range per run", async () => {
  const { sub, sent, push } = harness();
  push(deliverFrame([10n, 11n, 12n, 20n], 0));
  push(deliverFrame([10n, 11n], 1));
  const got = [];
  for (let i = 0; i < 6; i++) got.push(await sub.next());
  for (const i of [0, 1, 4, 5, 3, 2]) got[i].ack();
  sub.flush();
  assert.deepEqual(sent.find((f) => f.type === "ACK").ranges, [
    { partition: 0, offset: 10n, count: 2 },
    { partition: 1, offset: 10n, count: 2 },
    { partition: 0, offset: 20n, count: 1 },
    { partition: 0, offset: 12n, count: 1 },
  ]);
});

test("a quarter window of settled messages returns credit at once, without waiting for the tick", async () => {
  const { sub, sent, push } = harness(8);
  push(deliverFrame([0n, 1n, 2n, 3n, 4n, 5n, 6n, 7n]));
  (await sub.next()).ack();
  assert.equal(sent.length, 0, "one message is below a quarter of 8");
  (await sub.next()).ack();
  assert.deepEqual(sent.map((f) => f.type), ["ACK", "CREDIT"]);
  assert.equal(sent[1].credit, 2);
});

test("messages of a lost connection's generation are dropped and their acks are moot", async () => {
  const { sub, sent, push } = harness();
  push(deliverFrame([1n, 2n]));
  const old = await sub.next();
  sub.attached(9, "s", 4, 2); // attached again after a reconnect
  assert.equal(sub.buffered, 0, "the old connection's buffered message is dropped");
  old.ack();
  sub.flush();
  assert.deepEqual(sent, []);
});

test("a subscription on several nodes settles each message through the node that delivered it", async () => {
  const fakeNode = () => {
    const sent = [];
    const requests = [];
    return {
      sent,
      requests,
      isConnected: () => true,
      send: (f) => sent.push(f),
      flushWrites() {},
      forget() {},
      request: async (f) => {
        requests.push(f);
        return {};
      },
    };
  };
  const a = fakeNode();
  const b = fakeNode();
  const sub = new Subscription(a, "t", { window: 100 });
  const onA = sub.attachedOn(0, a, 7, "s", 2);
  const onB = sub.attachedOn(1, b, 9, "s", 2);
  const push = (attachment, frame) => new FrameStream(1 << 24, () => attachment.makeMessage).push(frame, (id, f) => sub.deliver(f.deliveries));
  push(onA, deliverFrame([1n, 2n], 0));
  push(onB, deliverFrame([5n], 1));
  const got = [await sub.next(), await sub.next(), await sub.next()];
  got[0].ack();
  got[2].ack();
  await got[1].ackConfirmed();
  sub.flush();
  assert.deepEqual(a.sent.find((f) => f.type === "ACK"), { type: "ACK", consumerId: 7, ranges: [{ partition: 0, offset: 1n, count: 1 }] });
  assert.deepEqual(b.sent.find((f) => f.type === "ACK"), { type: "ACK", consumerId: 9, ranges: [{ partition: 1, offset: 5n, count: 1 }] });
  assert.deepEqual(a.requests, [{ type: "ACK", consumerId: 7, ranges: [{ partition: 0, offset: 2n, count: 1 }] }]);
  assert.deepEqual(b.requests, []);

  // Node b's connection is lost: what it delivered and nobody took yet is dropped, its
  // messages' acks are moot and a confirmed one says so; node a's stay.
  push(onA, deliverFrame([3n], 0));
  push(onB, deliverFrame([6n, 7n], 1));
  const three = await sub.next(); // 3 of node a is first in the queue
  assert.equal(three.partition, 0);
  const six = await sub.next();
  assert.equal(six.offset, 6n);
  sub.retire(onB);
  assert.equal(sub.buffered, 0, "node b's buffered message is dropped");
  await assert.rejects(six.ackConfirmed(), /connection that delivered it was lost/);
  three.ack();
  sub.flush();
  assert.equal(b.sent.filter((f) => f.type === "ACK").length, 1, "nothing more goes to node b");
  assert.deepEqual(a.sent.filter((f) => f.type === "ACK").at(-1).ranges, [{ partition: 0, offset: 3n, count: 1 }]);
});
