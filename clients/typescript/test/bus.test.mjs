// The bus over the real broker: a TypeScript sender and receiver for every serializer, listened
// shards, refusals, failures and unreadable input; then across languages with the Python bus
// (a TypeScript sender with a Python receiver, and the reverse) when its sources are present.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client } from "../dist/index.js";
import { defineMessage, loadSettings, Receiver, Sender, Serializers, shardForKey } from "../dist/bus/index.js";
import { Broker, parseJsonLossless, repoRoot } from "./support.mjs";

const unhandled = [];
process.on("unhandledRejection", (e) => unhandled.push(e));

const OrderPlaced = defineMessage({
  name: "OrderPlaced",
  key: "order_id",
  fields: [["order_id", "int"], ["customer", "string"], ["total", "float"], ["express", "bool"]],
});
const UserRenamed = defineMessage({
  name: "UserRenamed",
  key: "user_id",
  fields: [["user_id", "uuid"], ["name", "string"], ["version", "int"]],
});

let broker;
let client;
before(async () => {
  broker = await Broker.start();
  client = await Client.connect({ url: broker.url });
});
after(async () => {
  await client?.close();
  await broker?.stop();
  assert.deepEqual(unhandled, [], "no unhandled promise rejection");
});

async function waitFor(what, predicate, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await predicate()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.fail(`timed out waiting for ${what}`);
}

class Collect {
  constructor(messageType) {
    this.messageType = messageType;
    this.handled = [];
    this.after = [];
  }
  handle(message, context) {
    this.handled.push([message, context]);
  }
  afterHandle(message) {
    this.after.push(message);
  }
}

for (const serializer of ["json", "deflate-json", "msgpack", "protobuf"]) {
  test(`send and receive with ${serializer}: shards, headers, statistics`, async () => {
    const prefix = `s-${serializer}`;
    const Orders = defineMessage({ ...OrderPlaced, name: "OrderPlaced", key: "order_id", fields: OrderPlaced.fields, topic: `${prefix}.orders` });
    const Users = defineMessage({ name: "UserRenamed", key: "user_id", fields: UserRenamed.fields, topic: `${prefix}.users` });
    const sender = await Sender.create(client, loadSettings({ identity: "checkout", shardCount: 4, serializer }, [], {}));
    const orders = new Collect(Orders);
    const users = new Collect(Users);
    const stats = [];
    const receiver = new Receiver(client, loadSettings({ identity: "billing", shardCount: 4 }, [], {}), [orders, users], {
      onStats: (s) => stats.push(s),
    });
    await receiver.start();
    const sent = Array.from({ length: 20 }, (_, i) => ({ order_id: i, customer: `c${i}`, total: i + 0.5, express: i % 2 === 0 }));
    const ids = await sender.sendMany(Orders, sent);
    assert.equal(ids.length, 20);
    ids.forEach((id, i) => assert.equal(id.split("-")[0], String(i % 4), "an int key's shard is key mod N"));
    const uid = "6f1c2a3e-9b7d-4c1e-8f00-123456789abc";
    const id = await sender.send(Users, { user_id: uid, name: "Jürgen ✓", version: 9007199254740993n });
    const byteSum = Buffer.from(uid.replace(/-/g, ""), "hex").reduce((a, b) => a + b, 0);
    assert.equal(id.split("-")[0], String(byteSum % 4));
    await waitFor("every message", () => orders.handled.length === 20 && users.handled.length === 1);
    await receiver.stop();

    assert.deepEqual(orders.handled.map(([m]) => m.order_id).sort((a, b) => a - b), [...Array(20).keys()]);
    const seven = orders.handled.find(([m]) => m.order_id === 7)[0];
    assert.deepEqual(seven, { order_id: 7, customer: "c7", total: 7.5, express: false });
    for (const [m, ctx] of orders.handled) {
      assert.equal(ctx.shard, m.order_id % 4);
      assert.equal(ctx.delivery.partition, ctx.shard);
      assert.equal(ctx.sender, "checkout");
      assert.equal(ctx.serializer, serializer);
    }
    assert.deepEqual(users.handled[0][0], { user_id: uid, name: "Jürgen ✓", version: 9007199254740993n });
    assert.equal(orders.after.length, 20);
    assert.equal(receiver.counts.handled, 21);
    const s = stats[0];
    assert.equal(s.outcome, "handled");
    assert.ok(s.size > 0);
    assert.equal(s.sender, "checkout");
    assert.ok(s.preparedAt <= s.sentAt && s.sentAt <= s.receivedAt && s.receivedAt <= s.handledAt);
  });
}

test("listened shards, refusals, failures and unreadable bodies", async () => {
  const Orders = defineMessage({ name: "OrderPlaced", key: "order_id", fields: OrderPlaced.fields, topic: "mixed.orders" });
  const sender = await Sender.create(client, loadSettings({ identity: "checkout", shardCount: 8 }, [], {}));
  const seen = [];
  const errors = [];
  const handler = {
    messageType: Orders,
    beforeHandle: (m) => m.customer !== "refuse me",
    handle(m, ctx) {
      seen.push([m.order_id, ctx.attempt, ctx.shard]);
      if (m.customer === "fail once" && ctx.attempt === 1) throw new Error("flaky downstream");
    },
  };
  const stats = [];
  const receiver = new Receiver(client, loadSettings({ identity: "billing", shardCount: 8, listenShards: "1,3,5-6" }, [], {}), [handler], {
    onStats: (s) => stats.push(s),
    onError: (e) => errors.push(e),
  });
  await receiver.start();
  // Shards 0..7: only 1, 3, 5 and 6 are received here.
  await sender.sendMany(Orders, Array.from({ length: 8 }, (_, i) => ({ order_id: i, customer: "ok", total: 1, express: false })));
  await sender.send(Orders, { order_id: 11, customer: "refuse me", total: 1, express: false }); // shard 3
  await sender.send(Orders, { order_id: 13, customer: "fail once", total: 1, express: false }); // shard 5
  // Bodies no serializer can read, an unknown serializer and an unknown type go to the dead letters.
  await client.publish("mixed.orders", { body: "{not json", headers: [["x-bus-type", "OrderPlaced"], ["x-bus-serializer", "json"]] }, { partition: 1 });
  await client.publish("mixed.orders", { body: "{}", headers: [["x-bus-type", "OrderPlaced"], ["x-bus-serializer", "yaml"]] }, { partition: 1 });
  await client.publish("mixed.orders", { body: "{}", headers: [["x-bus-type", "Nope"], ["x-bus-serializer", "json"]] }, { partition: 1 });
  await waitFor("every outcome", () => stats.length === 4 + 1 + 2 + 3);
  await receiver.stop();

  assert.deepEqual([...new Set(seen.filter(([id]) => id < 8).map(([id]) => id))].sort(), [1, 3, 5, 6]);
  assert.deepEqual(seen.filter(([id]) => id === 13).map(([, attempt]) => attempt), [1, 2]);
  assert.equal(receiver.counts.handled, 5);
  assert.equal(receiver.counts.refused, 1);
  assert.equal(receiver.counts.failed, 1);
  assert.equal(receiver.counts.dead_lettered, 3);
  assert.match(stats.find((s) => s.outcome === "failed").error, /flaky downstream/);
  const dlq = await client.subscribe("mixed.orders.dlq", { start: "earliest" });
  const reasons = [];
  for (let i = 0; i < 3; i++) {
    const m = await dlq.next();
    reasons.push(m.header("x-ferrymq-dead-reason"));
    m.ack();
  }
  await dlq.close();
  assert.ok(reasons.some((r) => /UnreadableBody: not JSON/.test(r)), reasons.join(" | "));
  assert.ok(reasons.some((r) => /UnknownSerializer: no serializer named "yaml"/.test(r)), reasons.join(" | "));
  assert.ok(reasons.some((r) => /no handler for message type "Nope"/.test(r)), reasons.join(" | "));
  // The one failure reaches onError, with the attempt it failed on.
  assert.deepEqual(errors.map((e) => [e.name, e.attempt, e.final]), [["HandlerError", 1, false]]);
});

test("settings: options, then arguments, then the environment, then defaults", () => {
  const env = { FERRYMQ_ADDR: "broker:7070", FERRYMQ_BUS_IDENTITY: "env-id", FERRYMQ_BUS_SHARDS: "6", FERRYMQ_BUS_LISTEN_SHARDS: "0-2", FERRYMQ_BUS_SERIALIZER: "msgpack", FERRYMQ_BUS_LISTEN_SERVICES: "a, b" };
  const s = loadSettings({}, [], env);
  assert.deepEqual(
    [s.addr, s.identity, s.shardCount, s.listenShards, s.serializer, s.listenServices],
    ["broker:7070", "env-id", 6, "0-2", "msgpack", ["a", "b"]],
  );
  const t = loadSettings({ serializer: "json" }, ["--identity", "cli", "--shards=8"], env);
  assert.deepEqual([t.identity, t.shardCount, t.serializer], ["cli", 8, "json"]);
  assert.equal(loadSettings({}, [], {}).identity, "NoIdentification");
  assert.throws(() => loadSettings({}, [], { FERRYMQ_BUS_SHARDS: "ten" }), /is a number/);
  assert.throws(() => loadSettings({ shardCount: 4, listenShards: "1-4" }, [], {}), /not below the shard count/);
  assert.throws(() => loadSettings({ listenShards: "4-1" }, [], {}), /N-M/);
});

test("a sender refuses a topic whose partitions differ from the shard count", async () => {
  const Orders = defineMessage({ name: "OrderPlaced", key: "order_id", fields: OrderPlaced.fields, topic: "shards.orders" });
  await Sender.create(client, loadSettings({ identity: "shop", shardCount: 3 }, [], {})).then((s) => s.send(Orders, { order_id: 1, customer: "", total: 0, express: false }));
  const other = await Sender.create(client, loadSettings({ identity: "shop", shardCount: 5 }, [], {}));
  await assert.rejects(other.send(Orders, { order_id: 1, customer: "", total: 0, express: false }), /has 3 partitions but the bus has 5 shards/);
  await assert.rejects(other.send(Orders, { order_id: "x", customer: "", total: 0, express: false }), /is an int/);
  await assert.rejects(other.send(Orders, { order_id: 1, customer: "", total: 0, express: false }, { shardResolver: () => 9 }), /a shard is 0..4/);
  // A custom resolver picks the partition itself.
  const three = await Sender.create(client, loadSettings({ identity: "shop", shardCount: 3 }, [], {}));
  const resolved = [];
  const ids = await three.sendMany(
    Orders,
    [10, 11, 12].map((order_id) => ({ order_id, customer: "", total: 0, express: false })),
    { shardResolver: (key, n) => (resolved.push([key, n]), 2) },
  );
  assert.deepEqual(resolved, [[10, 3], [11, 3], [12, 3]]);
  assert.deepEqual(ids.map((id) => id.split("-")[0]), ["2", "2", "2"]);
});

// --- across languages -------------------------------------------------------------------------

const pythonSrc = process.env.FERRYMQ_PYTHON_SRC ?? join(repoRoot, "clients", "python", "src");
const pythonSkip = existsSync(join(pythonSrc, "ferrymq", "bus"))
  ? false
  : `the Python bus is not at ${pythonSrc} (set FERRYMQ_PYTHON_SRC); the cross-language bus test is skipped`;

const PYTHON = `
import asyncio, dataclasses, json, sys
import ferrymq
from ferrymq import bus

@bus.message(key="order_id", topic="x.orders")
@dataclasses.dataclass
class OrderPlaced:
    order_id: int
    customer: str
    total: float
    express: bool

class Collect(bus.Handler):
    message_type = OrderPlaced
    def __init__(self):
        self.got = []
    def handle(self, m, ctx):
        self.got.append({"order_id": m.order_id, "customer": m.customer, "total": m.total,
                         "express": m.express, "serializer": ctx.serializer, "shard": ctx.shard,
                         "partition": ctx.delivery.partition})

def usable():
    out = []
    for name in ["json", "deflate-json", "msgpack", "protobuf"]:
        try:
            bus.Serializers().get(name)
            out.append(name)
        except Exception:
            pass
    return out

async def main():
    mode, addr = sys.argv[1], sys.argv[2]
    async with ferrymq.Client(addr) as client:
        if mode == "serializers":
            print(json.dumps(usable()))
        elif mode == "receive":
            n = int(sys.argv[3])
            h = Collect()
            async with bus.Receiver(client, bus.Settings(identity="py-billing", shard_count=4), [h]):
                print("ready", flush=True)
                while len(h.got) < n:
                    await asyncio.sleep(0.02)
            print(json.dumps(h.got), flush=True)
        else:
            for name in usable():
                sender = bus.Sender(client, bus.Settings(identity="py-checkout", shard_count=4, serializer=name))
                await sender.send_many([OrderPlaced(9007199254740993, "Zoë \\"Z\\" ✓", 0.1, True),
                                        OrderPlaced(-5, name, 5.0, False)])
            print(json.dumps(usable()), flush=True)

asyncio.run(main())
`;

function python(args, onLine) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.env.FERRYMQ_PYTHON ?? "python3", ["-c", PYTHON, ...args], {
      env: { ...process.env, PYTHONPATH: pythonSrc },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
    child.stdout.on("data", (c) => {
      out += c;
      for (const line of c.toString().split("\n")) if (line) onLine?.(line);
    });
    child.stderr.on("data", (c) => (err += c));
    child.on("exit", (code) => {
      clearTimeout(timer);
      if (code === 0) resolve(out.trim().split("\n").pop());
      else reject(new Error(`python3 exited with ${code}:\n${err}`));
    });
  });
}

test("a TypeScript sender with a Python receiver, and a Python sender with a TypeScript receiver", { skip: pythonSkip, timeout: 60_000 }, async () => {
  const Orders = defineMessage({ name: "OrderPlaced", key: "order_id", fields: OrderPlaced.fields, topic: "x.orders" });
  const serializers = JSON.parse(await python(["serializers", broker.url]));
  assert.ok(serializers.includes("json") && serializers.includes("deflate-json"));
  const local = await Serializers.load();

  // TypeScript -> Python.
  let ready;
  const isReady = new Promise((r) => (ready = r));
  const received = python(["receive", broker.url, String(2 * serializers.length)], (line) => line === "ready" && ready());
  await isReady;
  for (const serializer of serializers) {
    const sender = await Sender.create(client, loadSettings({ identity: "ts-checkout", shardCount: 4, serializer }, [], {}), { serializers: local });
    await sender.sendMany(Orders, [
      { order_id: 9007199254740993n, customer: 'Zoë "Z" ✓', total: 0.1, express: true },
      { order_id: -5, customer: serializer, total: 5, express: false },
    ]);
  }
  const got = parseJsonLossless(await received);
  assert.equal(got.length, 2 * serializers.length);
  for (const serializer of serializers) {
    const mine = got.filter((m) => m.serializer === serializer);
    const big = mine.find((m) => String(m.order_id) === "9007199254740993");
    assert.ok(big, `${serializer}: the big id arrived exact`);
    assert.equal(big.customer, 'Zoë "Z" ✓');
    assert.equal(big.total, 0.1);
    assert.equal(big.shard, big.partition);
    const small = mine.find((m) => m.order_id === -5);
    assert.deepEqual([small.customer, small.total, small.express, small.shard], [serializer, 5, false, shardForKey("int", -5, 4)]);
  }

  // Python -> TypeScript.
  const handler = new Collect(Orders);
  const receiver = new Receiver(client, loadSettings({ identity: "ts-billing", shardCount: 4 }, [], {}), [handler], { serializers: local });
  await receiver.start();
  await python(["send", broker.url]);
  await waitFor("the Python messages", () => handler.handled.filter(([, c]) => c.sender === "py-checkout").length === 2 * serializers.length);
  await receiver.stop();
  for (const serializer of serializers) {
    const mine = handler.handled.filter(([, c]) => c.sender === "py-checkout" && c.serializer === serializer).map(([m]) => m);
    assert.deepEqual(mine.find((m) => m.order_id === 9007199254740993n), { order_id: 9007199254740993n, customer: 'Zoë "Z" ✓', total: 0.1, express: true });
    assert.deepEqual(mine.find((m) => m.order_id === -5), { order_id: -5, customer: serializer, total: 5, express: false });
  }
});
