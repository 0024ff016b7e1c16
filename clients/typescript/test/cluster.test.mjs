// Against a real cluster of three `ferrymq serve` nodes on loopback: the cluster's view,
// not_leader naming the leader, topics created through followers, seeds of which some are dead,
// and kill -9 of a partition's leader while publishers publish and a subscriber acks with
// confirmation: every acknowledged publish is stored exactly once, and the subscriber keeps
// receiving without any message it acked with confirmation coming again. Every test has a
// timeout of its own above its bounded waits (Bun's default is 5 s).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, test } from "node:test";

import { ConnectionError, connect, NotLeaderError, ServerError } from "../dist/index.js";
import { defineMessage, loadSettings, Receiver, Sender } from "../dist/bus/index.js";
import { freePort, packageRoot, startCluster } from "./support.mjs";

/** Polls `check` until it returns a truthy value, at most `ms`; fails naming `what`. */
async function waitFor(what, check, ms = 30_000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      const value = await check();
      if (value) return value;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? `: ${last}` : ""}`);
}

let nodes = [];
let addrs = [];
const clients = [];

async function client(options) {
  const c = await connect(options);
  clients.push(c);
  return c;
}

// Started by the first test that needs it, under that test's timeout (Bun keeps hooks to 5 s).
let starting = null;
async function cluster() {
  starting ??= startCluster(3).then((started) => {
    nodes = started;
    addrs = started.map((b) => b.url);
  });
  await starting;
}

after(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => {})));
  await Promise.all(nodes.map((b) => b.stop()));
});

function leaderOf(info, topic, partition) {
  return info.partitions.find((p) => p.topic === topic && p.partition === partition)?.leader ?? 0n;
}

function addrOf(info, id) {
  return info.nodes.find((n) => n.id === id)?.addr ?? "";
}

test("a three-node cluster: discovery, not_leader, topics through followers, dead seeds", { timeout: 120_000 }, async (t) => {
  await cluster();
  const probe = await client({ url: addrs[0], onError: () => {} });
  assert.equal(probe.server.version, 3);
  const info = await waitFor("a metadata leader", async () => {
    const i = await probe.clusterInfo();
    return i.metadataLeader !== 0n && i;
  });
  assert.equal(info.nodeId, 1n);
  assert.deepEqual(
    info.nodes.map((n) => [n.id, n.addr]),
    addrs.map((a, i) => [BigInt(i + 1), a]),
  );
  const leader = addrOf(info, info.metadataLeader);
  const followers = addrs.filter((a) => a !== leader);

  await t.test("not_leader names the leader when following is off", async () => {
    const c = await client({ url: followers[0], leaderTimeoutMs: -1, onError: () => {} });
    await assert.rejects(c.createTopic("never"), (e) => {
      assert.ok(e instanceof NotLeaderError, String(e));
      assert.equal(e.code, "not_leader");
      assert.equal(e.leader, info.metadataLeader);
      assert.equal(e.leaderAddr, leader);
      assert.equal(e.node, BigInt(addrs.indexOf(followers[0]) + 1));
      assert.equal(e.topic, "");
      return true;
    });
  });

  await t.test("topics are created and ensured through followers", async () => {
    const c = await client({ urls: followers, onError: () => {} });
    await c.createTopic("events", { partitions: 1, storage: "disk" });
    await c.createTopic("events", { partitions: 1, storage: "disk" }, { ifNotExists: true });
    await assert.rejects(c.createTopic("events", { partitions: 1 }), (e) => e instanceof ServerError && e.code === "topic_exists");
    const ci = await waitFor("a leader of events/0", async () => {
      const i = await c.clusterInfo();
      return leaderOf(i, "events", 0) !== 0n && i;
    });
    assert.equal(ci.partitions.find((p) => p.topic === "events").replicas.length, 3);
    const each = await Promise.all(addrs.map((a) => client({ url: a, leaderTimeoutMs: -1, onError: () => {} })));
    await waitFor("events on every node", async () => {
      for (const n of each) await n.describeTopic("events");
      return true;
    });
  });

  await t.test("a client given only dead addresses says so, naming each", async () => {
    const dead = [`127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`];
    await assert.rejects(connect({ urls: dead, connectTimeoutMs: 2_000 }), (e) => {
      assert.ok(e instanceof ConnectionError, String(e));
      assert.equal(e.code, "connect_failed");
      for (const a of dead) assert.ok(e.message.includes(a), e.message);
      return true;
    });
  });

  await t.test("FERRYMQ_ADDR with commas, the first seed dead", async () => {
    const dead = `127.0.0.1:${await freePort()}`;
    const saved = process.env.FERRYMQ_ADDR;
    process.env.FERRYMQ_ADDR = `${dead}, ${followers[0]}`;
    let c;
    try {
      c = await client({ onError: () => {} });
    } finally {
      if (saved === undefined) delete process.env.FERRYMQ_ADDR;
      else process.env.FERRYMQ_ADDR = saved;
    }
    for (let i = 0; i < 20; i++) await c.publish("events", `seed-${i}`);
  });
});

test("the bus sends and receives across the cluster's partition leaders, unchanged", { timeout: 120_000 }, async () => {
  await cluster();
  const c = await client({ urls: addrs, onError: () => {} });
  const Orders = defineMessage({
    name: "OrderPlaced",
    key: "order_id",
    topic: "bus.orders",
    fields: [["order_id", "int"], ["customer", "string"]],
  });
  const sender = await Sender.create(c, loadSettings({ identity: "checkout", shardCount: 3 }, [], {}));
  const handled = [];
  const receiver = new Receiver(c, loadSettings({ identity: "billing", shardCount: 3 }, [], {}), [
    { messageType: Orders, handle: (m, ctx) => handled.push([m.order_id, ctx.shard]) },
  ]);
  await receiver.start();
  const ids = await sender.sendMany(Orders, Array.from({ length: 30 }, (_, i) => ({ order_id: i, customer: `c${i}` })));
  assert.equal(ids.length, 30);
  await waitFor("every bus message handled", () => handled.length >= 30);
  await receiver.stop();
  assert.deepEqual(handled.map(([id]) => id).sort((a, b) => a - b), [...Array(30).keys()]);
  for (const [id, shard] of handled) assert.equal(shard, id % 3);
  const info = await c.clusterInfo();
  const leaders = new Set(info.partitions.filter((p) => p.topic === "bus.orders").map((p) => p.leader));
  assert.ok(leaders.size >= 1 && !leaders.has(0n), `leaders ${[...leaders]}`);
});

test("kill -9 of the partition leader while publishing and consuming with confirmed acks", { timeout: 240_000 }, async () => {
  await cluster();
  const topic = "payments";
  const admin = await client({ urls: addrs, onError: () => {} });
  await admin.createTopic(topic, { partitions: 1, storage: "disk" }, { ifNotExists: true });
  await waitFor(`a leader of ${topic}/0`, async () => leaderOf(await admin.clusterInfo(), topic, 0) !== 0n);

  // The subscriber: acks each message with confirmation. A message whose confirmed ack
  // succeeded must never come again, before or after the failover.
  const consumer = await client({ urls: addrs, onError: () => {} });
  const sub = await consumer.subscribe(topic, { subscription: "workers", start: "earliest", window: 64 });
  const received = new Set();
  const confirmed = new Set();
  const redeliveredConfirmed = [];
  let confirmFailures = 0;
  const consuming = (async () => {
    for await (const m of sub) {
      const body = m.text();
      if (confirmed.has(body)) redeliveredConfirmed.push(body);
      received.add(body);
      try {
        await m.ackConfirmed();
        confirmed.add(body);
      } catch (e) {
        // In doubt (the node lost the lead, or its connection): it may come again.
        confirmFailures++;
      }
    }
  })();

  // Four publishers, one publish each in flight: at the kill some are in doubt. Those with a
  // dedup id are sent again; the others fail as outcome unknown and count as not acknowledged.
  const publisher = await client({ urls: addrs, onError: () => {} });
  const acked = new Set();
  let unknown = 0;
  let stop = false;
  const failures = [];
  const publish = async (w) => {
    for (let i = 0; !stop && i < 100_000; i++) {
      const body = `w${w}-m${i}`;
      const deduplicated = (w + i) % 2 === 0;
      try {
        await publisher.publish(topic, deduplicated ? { body, dedupId: `dedup-${body}` } : body);
        acked.add(body);
      } catch (e) {
        if (!deduplicated && e instanceof ConnectionError && e.outcomeUnknown) unknown++;
        else {
          failures.push(`${body}: ${e}`);
          return;
        }
      }
    }
  };
  const publishers = [0, 1, 2, 3].map(publish);
  const noFailure = () => {
    if (failures.length > 0) throw new Error(`publish failed: ${failures[0]}`);
  };

  await waitFor("100 publishes acknowledged", () => (noFailure(), acked.size >= 100));
  await waitFor("50 messages consumed", () => received.size >= 50);
  const info = await admin.clusterInfo();
  const killed = Number(leaderOf(info, topic, 0)) - 1;
  assert.ok(killed >= 0);
  const before = acked.size;
  const receivedBefore = received.size;
  await nodes[killed].kill("SIGKILL");
  const killedAt = Date.now();
  await waitFor("200 more publishes acknowledged after the kill", () => (noFailure(), acked.size >= before + 200), 45_000);
  stop = true;
  await Promise.all(publishers);
  noFailure();
  const publishMs = Date.now() - killedAt;

  // The subscriber keeps receiving: every acknowledged publish reaches it.
  await waitFor(
    "every acknowledged publish consumed",
    () => [...acked].every((b) => received.has(b)),
    45_000,
  );
  assert.ok(received.size > receivedBefore);
  assert.deepEqual(redeliveredConfirmed, [], "messages acked with confirmation came again");
  const after = await waitFor("a new leader", async () => {
    const i = await admin.clusterInfo();
    const l = leaderOf(i, topic, 0);
    return l !== 0n && Number(l) - 1 !== killed && i;
  });
  await sub.close();
  await consuming;

  // Every acknowledged publish is stored exactly once: read the whole log from the new leader.
  const leaderAddr = addrOf(after, leaderOf(after, topic, 0));
  const reader = await client({ url: leaderAddr, leaderTimeoutMs: -1, onError: () => {} });
  const total = (await reader.describeTopic(topic)).messages;
  const check = await reader.subscribe(topic, { subscription: "check", start: "earliest", window: 1000 });
  const seen = new Map();
  let count = 0n;
  const reading = (async () => {
    for await (const m of check) {
      seen.set(m.text(), (seen.get(m.text()) ?? 0) + 1);
      m.ack();
      if (++count >= total) return;
    }
  })();
  await waitFor(`all ${total} stored messages read`, () => count >= total, 30_000);
  await reading;
  await check.close();
  const missing = [...acked].filter((b) => !seen.has(b));
  const twice = [...acked].filter((b) => (seen.get(b) ?? 0) > 1);
  assert.deepEqual(missing, [], "acknowledged publishes missing");
  assert.deepEqual(twice, [], "acknowledged publishes stored twice");
  console.log(
    `node ${killed + 1} killed; node ${leaderOf(after, topic, 0)} leads; 200 more acknowledged within ${publishMs} ms; ` +
      `${acked.size} acknowledged, ${unknown} without dedup id left unknown; ${received.size} consumed, ` +
      `${confirmed.size} confirmed, ${confirmFailures} confirmations in doubt`,
  );
});

test("the README's cluster example runs as written against the cluster", { timeout: 120_000 }, async () => {
  await cluster();
  const readme = readFileSync(join(packageRoot, "README.md"), "utf8");
  const block = /```js\n(\/\/ cluster\.mjs[\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(block, "no cluster.mjs example in the README");
  const written = ["127.0.0.1:7071", "127.0.0.1:7072", "127.0.0.1:7073"];
  assert.ok(block.includes(JSON.stringify(written).replaceAll(",", ", ")), "the example's addresses changed");
  // Only the addresses (the test's nodes listen on free ports) and the package path differ.
  let code = block.replace(JSON.stringify(written).replaceAll(",", ", "), JSON.stringify(addrs));
  code = code.replace('from "ferrymq"', `from ${JSON.stringify(pathToFileURL(join(packageRoot, "dist", "index.js")).href)}`);
  const dir = mkdtempSync(join(tmpdir(), "ferrymq-ts-readme-"));
  try {
    const file = join(dir, "cluster.mjs");
    writeFileSync(file, code);
    const child = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    const code_ = await new Promise((r) => child.once("exit", r));
    clearTimeout(timer);
    assert.equal(code_, 0, out);
    assert.match(out, /^3 nodes, metadata leader [1-3]; orders led by .*\n$/, out);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
