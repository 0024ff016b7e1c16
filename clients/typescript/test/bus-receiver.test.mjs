// The bus receiver's lifecycle over the real broker: drain without lost or doubled work, retries
// with backoff and the handler's error in the dead letter, order per key across retries, and a
// bus user holding only the rights its job needs.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client } from "../dist/index.js";
import {
  defineMessage,
  ensureTopic,
  HandlerError,
  loadSettings,
  Receiver,
  retryDelayMs,
  Sender,
  SerializerUnavailable,
  Serializers,
} from "../dist/bus/index.js";
import { Broker } from "./support.mjs";

const ADMIN_PASSWORD = "admin-pass-for-bus-tests";
const unhandled = [];
process.on("unhandledRejection", (e) => unhandled.push(e));

let broker;
let admin;
before(async () => {
  broker = await Broker.start([], { FERRYMQ_ADMIN_PASSWORD: ADMIN_PASSWORD });
  admin = await Client.connect({ url: broker.url, user: "admin", password: ADMIN_PASSWORD });
});
after(async () => {
  await admin?.close();
  await broker?.stop();
  assert.deepEqual(unhandled, [], "no unhandled promise rejection");
});

async function waitFor(what, predicate, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await predicate()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail(`timed out waiting for ${what}`);
}

function orderType(name) {
  return defineMessage({ name, key: "order_id", fields: [["order_id", "int"], ["seq", "int"]] });
}

class Recorder {
  constructor(messageType, gate = null) {
    this.messageType = messageType;
    this.gate = gate;
    this.seen = [];
    this.active = 0;
  }
  async handle(message, context) {
    this.active++;
    if (this.gate !== null) await this.gate;
    this.seen.push([message.order_id, context.attempt]);
  }
}

test("drain finishes the handlers in flight and releases the unstarted messages", async () => {
  const Order = orderType("DrainOrder");
  const settings = loadSettings({ identity: "drainer", shardCount: 1 }, [], {});
  const sender = await Sender.create(admin, settings);
  await sender.sendMany(Order, Array.from({ length: 300 }, (_, i) => ({ order_id: i, seq: 0 })));
  let open;
  const gate = new Promise((r) => (open = r));
  const first = new Recorder(Order, gate);
  const receiver = new Receiver(admin, settings, [first], { concurrency: 2, prefetch: 256 });
  await receiver.start();
  const sub = receiver.subscriptions[0];
  await waitFor("two handlers and a full buffer", () => first.active === 2 && sub.buffered >= 200);
  const draining = receiver.drain(10_000);
  open();
  const released = await draining;
  const handledFirst = new Set(first.seen.map(([id]) => id));
  assert.equal(first.seen.length, 2);
  assert.equal(handledFirst.size, 2);
  assert.ok(released >= 200, `released ${released}`);
  assert.equal(receiver.counts.handled, 2);

  const second = new Recorder(Order);
  const again = new Receiver(admin, settings, [second], { concurrency: 4, prefetch: 64 });
  await again.start();
  await waitFor("the rest handled", () => second.seen.length >= 298);
  await again.stop();
  const seen = second.seen.map(([id]) => id);
  assert.equal(new Set(seen).size, 298, "no message handled twice by the second receiver");
  assert.equal(seen.length, 298);
  assert.ok(seen.every((id) => !handledFirst.has(id)), "no message handled by both receivers");
  assert.deepEqual([...new Set(second.seen.map(([, a]) => a))], [1], "released messages come back without an attempt counted");
});

test("a handler still running at the drain timeout: its message comes again, counted", async () => {
  const Order = orderType("SlowOrder");
  const settings = loadSettings({ identity: "slow", shardCount: 1 }, [], {});
  await (await Sender.create(admin, settings)).sendMany(Order, [0, 1, 2].map((i) => ({ order_id: i, seq: 0 })));
  const stuck = new Recorder(Order, new Promise(() => {})); // never opens
  const errors = [];
  const receiver = new Receiver(admin, settings, [stuck], { onError: (e) => errors.push(e) });
  await receiver.start();
  await waitFor("the handler started", () => stuck.active === 1 && receiver.subscriptions[0].buffered === 2);
  assert.equal(await receiver.drain(50), 2);
  assert.match(String(errors[0]?.message), /still ran after 50 ms/);
  const second = new Recorder(Order);
  const again = new Receiver(admin, settings, [second]);
  await again.start();
  await waitFor("all three again", () => second.seen.length === 3);
  await again.stop();
  // The one that had started counts an attempt; the two released do not.
  assert.deepEqual(second.seen.map(([, a]) => a).sort(), [1, 1, 2]);
});

test("a stopped subscription's handler form handles no buffered message", async () => {
  await admin.createTopic("plain.stop", { partitions: 1 });
  await admin.publishBatch("plain.stop", Array.from({ length: 50 }, (_, i) => `m${i}`));
  const handled = [];
  let open;
  const gate = new Promise((r) => (open = r));
  const sub = await admin.subscribe("plain.stop", {
    subscription: "s",
    start: "earliest",
    window: 50,
    handler: async (m) => {
      handled.push(m.text());
      await gate;
    },
  });
  await waitFor("a full buffer", () => handled.length === 1 && sub.buffered === 49);
  const released = await sub.closeReleasing();
  open();
  await sub.done();
  assert.equal(released, 49);
  assert.deepEqual(handled, ["m0"]);
  const again = await admin.subscribe("plain.stop", { subscription: "s", window: 100 });
  const attempts = [];
  for await (const m of again) {
    attempts.push(m.attempt);
    m.ack();
    if (attempts.length === 50) break;
  }
  // m0 was started and not settled before the unsubscribe: its attempt counted; the rest not.
  assert.deepEqual(attempts.slice().sort(), [...Array(49).fill(1), 2]);
});

test("retries back off, and the dead letter carries the handler's error", async () => {
  const Order = orderType("RetryOrder");
  const settings = loadSettings({ identity: "retrier", shardCount: 1 }, [], {});
  const times = [];
  class Failing {
    messageType = Order;
    retry = { maxAttempts: 3, initialDelayMs: 150, multiplier: 2, jitter: 0 };
    handle(message) {
      times.push(Date.now());
      throw new TypeError(`order ${message.order_id} is malformed`);
    }
  }
  const errors = [];
  const receiver = new Receiver(admin, settings, [new Failing()], { onError: (e) => errors.push(e) });
  await receiver.start();
  await (await Sender.create(admin, settings)).send(Order, { order_id: 7, seq: 0 });
  await waitFor("three failures reported", () => errors.length === 3);
  await receiver.stop();
  assert.ok(times[1] - times[0] >= 140 && times[2] - times[1] >= 290, String(times));
  assert.ok(errors.every((e) => e instanceof HandlerError));
  assert.deepEqual(errors.map((e) => [e.attempt, e.final, e.delayMs]), [[1, false, 150], [2, false, 300], [3, true, 0]]);
  assert.ok(errors[0].cause instanceof TypeError);
  const dlq = await admin.subscribe("RetryOrder.dlq", { start: "earliest" });
  const dead = await dlq.next();
  const reason = dead.headers.find(([n]) => n === "x-ferrymq-dead-reason")[1];
  assert.equal(reason, "Failing raised TypeError: order 7 is malformed");
  assert.equal(dead.headers.find(([n]) => n === "x-ferrymq-dead-attempts")[1], "3");
  await dlq.close();
});

test("a failing handler is not silent without onError", async () => {
  const Order = orderType("LoudOrder");
  const settings = loadSettings({ identity: "loud", shardCount: 1 }, [], {});
  const reported = [];
  const client = await Client.connect({ url: broker.url, user: "admin", password: ADMIN_PASSWORD, onError: (e) => reported.push(e) });
  const receiver = new Receiver(client, settings, [{ messageType: Order, retry: { maxAttempts: 1 }, handle: () => { throw new Error("no"); } }]);
  await receiver.start();
  await (await Sender.create(client, settings)).send(Order, { order_id: 1, seq: 0 });
  await waitFor("the failure reported", () => reported.some((e) => e instanceof HandlerError));
  assert.match(reported.find((e) => e instanceof HandlerError).reason, /^LoudOrder handler raised Error: no$/);
  await receiver.stop();
  await client.close();
});

test("retry delays grow, are capped and spread by the jitter", () => {
  const p = { initialDelayMs: 100, multiplier: 3, maxDelayMs: 1000, jitter: 0 };
  assert.deepEqual([1, 2, 3, 4].map((a) => retryDelayMs(p, a)), [100, 300, 900, 1000]);
  const j = { initialDelayMs: 1000, jitter: 0.5 };
  assert.equal(retryDelayMs(j, 1, () => 0), 500);
  assert.equal(retryDelayMs(j, 1, () => 1), 1500);
});

test("an ordered receiver keeps the order per key across retries", async () => {
  const Order = orderType("SeqOrder");
  const settings = loadSettings({ identity: "sequencer", shardCount: 1 }, [], {});
  const done = new Map();
  let failed = 0;
  const handler = {
    messageType: Order,
    retry: { initialDelayMs: 50, jitter: 0 },
    async handle(m, ctx) {
      if (m.seq === 2 && ctx.attempt === 1) {
        failed++;
        throw new Error("fails once");
      }
      await new Promise((r) => setTimeout(r, 1));
      if (!done.has(m.order_id)) done.set(m.order_id, []);
      done.get(m.order_id).push(m.seq);
    },
  };
  const msgs = [];
  for (let s = 0; s < 8; s++) for (let k = 0; k < 4; k++) msgs.push({ order_id: k, seq: s });
  await (await Sender.create(admin, settings)).sendMany(Order, msgs);
  const receiver = new Receiver(admin, settings, [handler], { ordered: true, concurrency: 4, onError: () => {} });
  await receiver.start();
  await waitFor("all handled", () => [...done.values()].reduce((n, l) => n + l.length, 0) === 32);
  await receiver.stop();
  assert.equal(failed, 4);
  for (let k = 0; k < 4; k++) assert.deepEqual(done.get(k), [0, 1, 2, 3, 4, 5, 6, 7]);
});

test("the bus works with publish to send and consume to receive", async () => {
  const Order = orderType("GrantOrder");
  assert.equal(await ensureTopic(admin, "GrantOrder", 2), 2);
  await admin.addUser("checkout", "checkout-pass-1");
  await admin.addUser("billing", "billing-pass-1");
  await admin.grant("checkout", "GrantOrder", ["publish"]);
  await admin.grant("billing", "GrantOrder", ["consume"]);
  const checkout = await Client.connect({ url: broker.url, user: "checkout", password: "checkout-pass-1" });
  const billing = await Client.connect({ url: broker.url, user: "billing", password: "billing-pass-1" });
  try {
    const sender = await Sender.create(checkout, loadSettings({ identity: "checkout", shardCount: 2 }, [], {}));
    await sender.sendMany(Order, Array.from({ length: 6 }, (_, i) => ({ order_id: i, seq: 0 })));
    const handler = new Recorder(Order);
    const receiver = new Receiver(billing, loadSettings({ identity: "billing", shardCount: 2 }, [], {}), [handler]);
    await receiver.start();
    await waitFor("six handled", () => handler.seen.length === 6);
    await receiver.stop();
    const quiet = new Receiver(billing, loadSettings({ identity: "billing", shardCount: 2 }, [], {}), [new Recorder(Order)], { createTopics: false });
    await quiet.start();
    await quiet.stop();
    const wrong = await Sender.create(billing, loadSettings({ identity: "billing", shardCount: 2 }, [], {}));
    await assert.rejects(wrong.send(Order, { order_id: 1, seq: 0 }), (e) => e.code === "forbidden");
  } finally {
    await checkout.close();
    await billing.close();
  }
});

test("a receiver without a serializer's package gives its messages back, and says so", async () => {
  const Order = orderType("PackedOrder");
  const settings = loadSettings({ identity: "packer", shardCount: 1 }, [], {});
  const missing = "npm install @msgpack/msgpack";
  const crippled = await Serializers.load([
    {
      name: "msgpack",
      unavailable: missing,
      dumps() {
        throw new SerializerUnavailable(missing);
      },
      loads() {
        throw new SerializerUnavailable(missing);
      },
    },
  ]);
  await (await Sender.create(admin, loadSettings({ identity: "checkout", shardCount: 1, serializer: "msgpack" }, [], {}))).send(Order, { order_id: 5, seq: 0 });
  const errors = [];
  const blind = new Recorder(Order);
  const receiver = new Receiver(admin, settings, [blind], { serializers: crippled, onError: (e) => errors.push(e), retry: { initialDelayMs: 10, jitter: 0 } });
  await receiver.start();
  assert.match(String(errors[0]?.message), /cannot read msgpack messages/);
  await waitFor("the message given back", () => receiver.counts.failed >= 1);
  await receiver.stop();
  assert.equal(receiver.counts.dead_lettered, 0);
  assert.deepEqual(blind.seen, []);
  assert.ok(errors.some((e) => e instanceof SerializerUnavailable));
  const able = new Recorder(Order);
  const again = new Receiver(admin, settings, [able]);
  await again.start();
  await waitFor("read where it can be", () => able.seen.length === 1);
  await again.stop();
  assert.equal(able.seen[0][0], 5);
});
