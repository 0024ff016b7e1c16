// The client against the real broker, started on free loopback ports with its own data.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, ConnectionError, FerryMQError, ServerError, TopicConfigMismatch } from "../dist/index.js";
import { Broker } from "./support.mjs";

const unhandled = [];
process.on("unhandledRejection", (e) => unhandled.push(e));

let broker;
let client;
const errors = [];

before(async () => {
  broker = await Broker.start(["--default-partitions", "1"]);
  client = await Client.connect({ url: broker.url, onError: (e) => errors.push(e) });
});

after(async () => {
  await client?.close();
  await broker?.stop();
  assert.deepEqual(unhandled, [], "no unhandled promise rejection");
});

const waitFor = async (what, predicate, timeoutMs = 10_000) => {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const value = await predicate();
    if (value) return value;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.fail(`timed out waiting for ${what}`);
};

/** Takes `n` messages from a subscription within a time limit. */
async function take(sub, n, timeoutMs = 10_000) {
  const out = [];
  const timer = setTimeout(() => sub.close(), timeoutMs);
  try {
    while (out.length < n) {
      const m = await sub.next();
      if (m === null) break;
      out.push(m);
    }
  } finally {
    clearTimeout(timer);
  }
  assert.equal(out.length, n, `expected ${n} messages within ${timeoutMs} ms`);
  return out;
}

test("handshake, ping and the server's limits", async () => {
  await client.ping();
  assert.match(client.server.server, /^ferrymq/);
  assert.ok(client.server.messageBytesMax >= 1024);
  assert.ok(client.server.frameBytesMax >= client.server.messageBytesMax);
});

test("topics: create, describe, list, delete; errors carry the protocol's code", async () => {
  await client.createTopic("admin-t", { partitions: 3, storage: "memory" });
  const info = await client.describeTopic("admin-t");
  assert.equal(info.name, "admin-t");
  assert.equal(info.config.partitions, 3);
  assert.equal(info.config.storage, "memory");
  assert.equal(typeof info.messages, "bigint");
  await assert.rejects(client.createTopic("admin-t", { partitions: 3 }), (e) => e instanceof ServerError && e.code === "topic_exists");
  await client.createTopic("admin-t", { partitions: 3 }, { ifNotExists: true });
  assert.ok((await client.listTopics()).some((t) => t.name === "admin-t"));
  await client.deleteTopic("admin-t");
  await assert.rejects(client.describeTopic("admin-t"), (e) => e instanceof ServerError && e.code === "unknown_topic");
});

test("a topic created with nothing set takes the broker's defaults", async () => {
  await client.createTopic("defaults-t");
  const info = await client.describeTopic("defaults-t");
  // This broker: a data dir (disk), --default-partitions 1, drop-oldest.
  assert.deepEqual([info.config.storage, info.config.overflow, info.config.partitions], ["disk", "drop_oldest", 1]);
  const tuned = await Broker.start(["--default-storage", "memory", "--topic-overflow", "reject"]);
  const other = await Client.connect({ url: tuned.url });
  try {
    await other.createTopic("defaults-t");
    const config = (await other.describeTopic("defaults-t")).config;
    assert.deepEqual([config.storage, config.overflow], ["memory", "reject"]);
  } finally {
    await other.close();
    await tuned.stop();
  }
  await client.deleteTopic("defaults-t");
});

test("publish one and a batch: receipts give each message its id, in order", async () => {
  await client.createTopic("pub-t", { partitions: 1, storage: "memory" });
  const one = await client.publish("pub-t", "hello");
  assert.equal(one.id, "0-0");
  assert.equal(one.durability, "memory");
  const batch = await client.publishBatch("pub-t", ["a", new Uint8Array([1, 2]), { body: "c", key: "k", headers: { h: "v" }, priority: 3 }]);
  assert.deepEqual(batch.ids(), ["0-1", "0-2", "0-3"]);
  const json = await client.publishJson("pub-t", { order: 42 });
  assert.equal(json.id, "0-4");
  const sub = await client.subscribe("pub-t", { start: "earliest" });
  // Higher priority is delivered first: order by id to compare with what was published.
  const got = (await take(sub, 5)).sort((a, b) => Number(a.offset - b.offset));
  assert.equal(got[0].text(), "hello");
  assert.deepEqual([...got[2].body], [1, 2]);
  assert.equal(got[3].keyText(), "k");
  assert.equal(got[3].header("h"), "v");
  assert.equal(got[3].priority, 3);
  assert.deepEqual(got[4].json(), { order: 42 });
  assert.equal(got[4].header("content-type"), "application/json");
  assert.equal(got[4].id, "0-4");
  for (const m of got) m.ack();
  await sub.close();
});

test("a retry with the same dedupId is stored once and answered with the first id", async () => {
  await client.createTopic("dedup-t", { partitions: 2, storage: "memory" });
  const first = await client.publish("dedup-t", { body: "charge 5", dedupId: "charge-5" });
  const again = await client.publish("dedup-t", { body: "charge 5", dedupId: "charge-5" });
  const other = await client.publish("dedup-t", { body: "charge 6", dedupId: "charge-6" });
  assert.equal(again.id, first.id);
  assert.notEqual(other.id, first.id);
  assert.equal((await client.describeTopic("dedup-t")).messages, 2n);
});

test("10 000 keyed messages over 4 partitions arrive in order per partition and per key", async () => {
  await client.createTopic("order-t", { partitions: 4, storage: "disk" });
  const sub = await client.subscribe("order-t", { subscription: "order-s", start: "earliest", window: 500 });
  const total = 10_000;
  const keys = 37;
  const publishes = [];
  for (let b = 0; b < total / 500; b++) {
    const batch = [];
    for (let i = b * 500; i < (b + 1) * 500; i++) batch.push({ key: `k${i % keys}`, body: String(i) });
    publishes.push(client.publishBatch("order-t", batch));
  }
  const receipts = await Promise.all(publishes);
  assert.equal(receipts.reduce((n, r) => n + r.count, 0), total);
  const lastOffset = new Map();
  const lastSeq = new Map();
  const partitionOfKey = new Map();
  const got = [];
  const deadline = setTimeout(() => sub.close(), 60_000);
  for await (const m of sub) {
    got.push(m);
    const prev = lastOffset.get(m.partition);
    assert.ok(prev === undefined || m.offset > prev, `partition ${m.partition} went back from ${prev} to ${m.offset}`);
    lastOffset.set(m.partition, m.offset);
    const key = m.keyText();
    const seq = Number(m.text());
    assert.ok((lastSeq.get(key) ?? -1) < seq, `key ${key} out of order`);
    lastSeq.set(key, seq);
    assert.equal(partitionOfKey.get(key) ?? m.partition, m.partition, `key ${key} changed partition`);
    partitionOfKey.set(key, m.partition);
    m.ack();
    if (got.length === total) break;
  }
  clearTimeout(deadline);
  assert.equal(got.length, total);
  assert.equal(new Set(got.map((m) => Number(m.text()))).size, total);
  assert.equal(lastOffset.size, 4, "the keys spread over every partition");
  // Leaving the loop with break closed the subscription after sending its acks.
  await waitFor("every ack", async () => {
    const [stats] = await client.stats("order-t");
    return stats.subscriptions.find((s) => s.name === "order-s")?.acked === BigInt(total);
  });
});

test("nack now and delayed, the ack timeout, dead letters and requeue", async () => {
  await client.createTopic("work-t", { partitions: 1, storage: "disk" });
  const sub = await client.subscribe("work-t", { subscription: "w", start: "earliest", ackTimeoutMs: 300, maxAttempts: 3 });
  const { id } = await client.publish("work-t", "job-1");

  const first = (await take(sub, 1))[0];
  assert.equal(first.attempt, 1);
  await first.nack();
  const second = (await take(sub, 1))[0];
  assert.equal(second.id, id);
  assert.equal(second.attempt, 2);

  const started = Date.now();
  await second.nack({ delayMs: 400 });
  const third = (await take(sub, 1))[0];
  assert.ok(Date.now() - started >= 350, "a delayed nack is not delivered before its delay");
  assert.equal(third.attempt, 3);

  // Not acked: after the ack timeout with max_attempts 3 reached, it is given up.
  const dlq = await client.subscribe("work-t.dlq", { start: "earliest" });
  const dead = (await take(dlq, 1))[0];
  assert.equal(dead.text(), "job-1");
  assert.equal(dead.header("x-ferrymq-dead-subscription"), "w");
  assert.equal(dead.header("x-ferrymq-dead-attempts"), "3");
  dead.ack();

  // A message nacked to the dead-letter topic carries the reason.
  const { id: id2 } = await client.publish("work-t", "job-2");
  const bad = (await take(sub, 1))[0];
  assert.equal(bad.id, id2);
  await bad.nack({ deadLetter: true, reason: "unparseable: missing field 'id'" });
  const dead2 = (await take(dlq, 1))[0];
  assert.equal(dead2.header("x-ferrymq-dead-reason"), "unparseable: missing field 'id'");
  dead2.ack();

  const listed = await waitFor("dead letters listed", async () => {
    const all = [];
    for await (const e of client.iterateMessages("work-t", "w", "dead_lettered", 1)) all.push(e);
    return all.length === 2 ? all : null;
  });
  assert.deepEqual(listed.map((e) => e.state), ["dead_lettered", "dead_lettered"]);
  const status = await client.messageStatus("work-t", id2);
  assert.equal(status.subscriptions[0].entry.state, "dead_lettered");
  assert.equal(status.subscriptions[0].entry.reason, "unparseable: missing field 'id'");

  const requeued = await client.requeueDead("work-t.dlq");
  assert.equal(requeued.requeued, 2n);
  const back = await take(sub, 2);
  assert.deepEqual(back.map((m) => m.text()).sort(), ["job-1", "job-2"]);
  await back[0].ackWithResult({ invoice: "INV-1" });
  back[1].ack();
  const again = await client.requeueDead("work-t.dlq");
  assert.equal(again.requeued, 0n);
  assert.equal(again.skipped, 2n);
  await sub.close();
  await dlq.close();
});

test("ack with a result is kept for status queries", async () => {
  await client.createTopic("result-t", { partitions: 2, storage: "disk" });
  const sub = await client.subscribe("result-t", { subscription: "r", start: "earliest" });
  const { id } = await client.publish("result-t", { body: "x", key: "7" });
  assert.equal(id.split("-")[0], "1", "a decimal key goes to key mod N");
  const [m] = await take(sub, 1);
  await m.ackWithResult('{"invoice":"INV-2026-0042"}');
  const status = await client.messageStatus("result-t", id);
  assert.equal(status.subscriptions.length, 1);
  assert.equal(status.subscriptions[0].entry.state, "acked");
  assert.equal(new TextDecoder().decode(status.subscriptions[0].entry.result), '{"invoice":"INV-2026-0042"}');
  assert.throws(() => m.ack(), (e) => e instanceof FerryMQError && e.code === "already_settled");
  await sub.close();
});

test("callback form: a handler that throws nacks with the reason, one that returns acks", async () => {
  await client.createTopic("cb-t", { partitions: 1, storage: "disk" });
  const seen = [];
  const sub = await client.subscribe("cb-t", {
    subscription: "cb",
    start: "earliest",
    handler: async (m) => {
      seen.push(m.attempt);
      if (m.attempt === 1) throw new Error("first try fails");
    },
  });
  const before = errors.length;
  const { id } = await client.publish("cb-t", "x");
  await waitFor("the handled retry", async () => {
    const s = await client.messageStatus("cb-t", id);
    return s.subscriptions[0]?.entry.state === "acked";
  });
  assert.deepEqual(seen, [1, 2]);
  assert.ok(errors.slice(before).some((e) => e.message === "first try fails"), "the handler's error reached onError");
  await sub.close();
  await sub.done();
});

test("bad input is refused before sending, with a typed error", async () => {
  const tooBig = new Uint8Array(client.server.messageBytesMax + 1);
  await assert.rejects(client.publish("any", tooBig), (e) => e instanceof FerryMQError && e.code === "message_too_large");
  await assert.rejects(client.publish("any", { body: "x", priority: 12 }), (e) => e.field === "record.priority");
  await assert.rejects(client.publish("", "x"), (e) => e.field === "publish.topic");
  await assert.rejects(client.messageStatus("any", "nope"), (e) => e.code === "invalid_argument");
  await assert.rejects(client.subscribe("any", { partitions: "3-1" }), (e) => e.code === "invalid_argument");
  await client.ping();
});

test("the publish window bounds unconfirmed messages", async () => {
  const windowed = await Client.connect({ url: broker.url, publishWindow: 1000 });
  await windowed.createTopic("win-t", { storage: "memory" });
  let peak = 0;
  const sends = [];
  for (let i = 0; i < 20; i++) {
    sends.push(windowed.publishBatch("win-t", Array.from({ length: 250 }, () => "m")));
    peak = Math.max(peak, windowed.unconfirmed);
  }
  await Promise.all(sends);
  assert.ok(peak <= 1000, `peak ${peak}`);
  assert.equal(windowed.unconfirmed, 0);
  await windowed.close();
});

test("partition ranges: a consumer takes only the partitions it names", async () => {
  await client.createTopic("parts-t", { partitions: 4, storage: "memory" });
  const sub = await client.subscribe("parts-t", { subscription: "p", start: "earliest", partitions: "1,3" });
  for (let p = 0; p < 4; p++) await client.publish("parts-t", `p${p}`, { partition: p });
  const got = await take(sub, 2);
  assert.deepEqual(got.map((m) => m.partition).sort(), [1, 3]);
  got.forEach((m) => m.ack());
  await sub.close();
});

test("reconnects after a broker restart and subscribes again", async () => {
  const reconnected = [];
  const c = await Client.connect({
    url: broker.url,
    heartbeatMs: 200,
    reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
    onReconnect: () => reconnected.push(Date.now()),
    onError: () => {},
  });
  await c.createTopic("restart-t", { partitions: 1, storage: "disk" });
  const durable = await c.subscribe("restart-t", { subscription: "rs", start: "earliest" });
  const ephemeral = await c.subscribe("restart-new-t", { start: "latest" });
  const { id } = await c.publish("restart-t", "in flight across the restart");
  const [m1] = await take(durable, 1);
  assert.equal(m1.attempt, 1);

  await broker.restart();
  await waitFor("the reconnection", () => reconnected.length > 0, 15_000);
  // The message in flight when the connection was lost is delivered again to the
  // subscription attached anew; an ack of the old delivery is moot.
  m1.ack();
  const [again] = await take(durable, 1);
  assert.equal(again.id, id);
  again.ack();
  // The ephemeral consumer was attached again too (its topic was auto-created anew).
  await c.publish("restart-new-t", "after");
  const [m2] = await take(ephemeral, 1);
  assert.equal(m2.text(), "after");
  m2.ack();
  const [stats] = await c.stats("restart-t");
  assert.equal(stats.subscriptions.find((s) => s.name === "rs").consumers, 1);
  await durable.close();
  await ephemeral.close();
  await c.close();
  // The shared client reconnected too.
  await waitFor("the shared client", async () => client.ping().then(() => true, () => false), 15_000);
});

test("a lost connection fails waiting requests with ConnectionError when reconnect is off", async () => {
  const c = await Client.connect({ url: broker.url, reconnect: false });
  await c.createTopic("lost-t", { storage: "memory" });
  const inFlight = [];
  for (let i = 0; i < 50; i++) inFlight.push(c.publishBatch("lost-t", Array.from({ length: 100 }, () => "x")).then(() => "ok", (e) => e));
  await broker.kill("SIGKILL");
  const outcomes = await Promise.all(inFlight);
  await broker.spawn();
  for (const o of outcomes) assert.ok(o === "ok" || o instanceof ConnectionError, `${o}`);
  await assert.rejects(c.ping(), (e) => e instanceof ConnectionError);
  await c.close();
  await waitFor("the shared client", async () => client.ping().then(() => true, () => false), 15_000);
});

test("createTopic with ifNotExists refuses an existing topic of another configuration", async () => {
  await client.createTopic("conf.check", { partitions: 3, storage: "memory" });
  await client.createTopic("conf.check", { partitions: 3 }, { ifNotExists: true });
  await client.createTopic("conf.check", {}, { ifNotExists: true });
  await assert.rejects(
    client.createTopic("conf.check", { partitions: 4, storage: "disk" }, { ifNotExists: true }),
    (e) =>
      e instanceof TopicConfigMismatch &&
      e.code === "conflict" &&
      e.existing.partitions === 3 &&
      e.differences.length === 2 &&
      /partitions 3 \(asked 4\)/.test(e.message),
  );
});
