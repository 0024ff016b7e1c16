// Throughput of the TypeScript client against a real broker, 100-byte bodies:
//   publish: batches of 1000 with receipts, several in flight (the publish window);
//   consume: a preloaded topic drained by one consumer that acks every message.
// Usage: node bench/bench.mjs [--messages N] [--storage disk|memory] [--url host:port] [--json]
//        node bench/bench.mjs --cluster [--messages N] ...
// Without --url it starts `ferrymq serve` (FERRYMQ_BIN, else the repository's build) on free
// loopback ports with a temporary data directory. `--url a:7070,b:7070,c:7070` measures a
// cluster (publishes go to the partition's leader; the consumer attaches on every node).
// `--cluster` starts one broker and a cluster of three nodes and measures both in the same run,
// with the cluster's rates as a share of the single node's. Runs under Bun too: `bun bench/bench.mjs`.
import { Client } from "../dist/index.js";
import { Broker, startCluster } from "../test/support.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const messages = Number(arg("messages", "2000000"));
const storage = arg("storage", "disk");
const batch = Number(arg("batch", "1000"));
const inFlight = Number(arg("in-flight", "16"));
const window = Number(arg("window", "10000"));
const runtime = typeof Bun !== "undefined" ? `bun ${Bun.version}` : `node ${process.version}`;

const body = new Uint8Array(100).fill(0x61);
const batchMessages = Array.from({ length: batch }, () => body);

/** Wall time and this process's CPU time (user + system), in seconds. */
function clock() {
  const cpu = process.cpuUsage();
  return { wall: performance.now() / 1000, cpu: (cpu.user + cpu.system) / 1e6 };
}

function since(start) {
  const now = clock();
  return { seconds: now.wall - start.wall, cpu: now.cpu - start.cpu };
}

async function publish(client, topic, total) {
  const started = clock();
  let sent = 0;
  const pending = new Set();
  while (sent < total) {
    const n = Math.min(batch, total - sent);
    const p = client.publishBatch(topic, n === batch ? batchMessages : batchMessages.slice(0, n));
    pending.add(p);
    p.then(() => pending.delete(p));
    sent += n;
    if (pending.size >= inFlight) await Promise.race(pending);
  }
  await Promise.all(pending);
  return since(started);
}

async function consume(url, topic, total) {
  // A consumer of its own, as a worker would be: not the publisher's connection.
  const consumer = await Client.connect({ url });
  const sub = await consumer.subscribe(topic, { subscription: "bench", start: "earliest", window });
  const started = clock();
  let n = 0;
  for await (const m of sub) {
    m.ack();
    if (++n === total) break;
  }
  const took = since(started);
  await consumer.close();
  return took;
}

/** Publishes then drains `messages` (after a warm-up) on the broker or cluster at `url`. */
async function measure(url) {
  const client = await Client.connect({ url, publishWindow: batch * inFlight });
  const topic = `bench-${storage}-${Date.now()}`;
  await client.createTopic(topic, { partitions: 1, storage });
  await publish(client, topic, Math.min(50_000, messages)); // warm-up: the JIT and the broker's first segment
  const published = await publish(client, topic, messages);
  // Everything published (warm-up included) is drained.
  const drained = messages + Math.min(50_000, messages);
  const consumed = await consume(url, topic, drained);
  await client.close();
  return {
    publish_msgs_per_s: Math.round(messages / published.seconds),
    consume_ack_msgs_per_s: Math.round(drained / consumed.seconds),
    // The client's own CPU per message: what the runtime spends, whatever the machine's load.
    publish_client_cpu_ns_per_msg: Math.round((published.cpu / messages) * 1e9),
    consume_client_cpu_ns_per_msg: Math.round((consumed.cpu / drained) * 1e9),
  };
}

function report(label, r) {
  console.log(`${label}publish with receipts: ${r.publish_msgs_per_s.toLocaleString("en")} msg/s (client CPU ${r.publish_client_cpu_ns_per_msg} ns/msg)`);
  console.log(`${label}consume with acks:     ${r.consume_ack_msgs_per_s.toLocaleString("en")} msg/s (client CPU ${r.consume_client_cpu_ns_per_msg} ns/msg)`);
}

const base = { runtime, storage, messages, body_bytes: body.length, batch };
if (process.argv.includes("--cluster")) {
  const broker = await Broker.start();
  const nodes = await startCluster(3);
  let single;
  let cluster;
  try {
    single = await measure(broker.url);
    cluster = await measure(nodes.map((n) => n.url).join(","));
  } finally {
    await broker.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  }
  const result = {
    ...base,
    single,
    cluster,
    cluster_publish_share: Number((cluster.publish_msgs_per_s / single.publish_msgs_per_s).toFixed(3)),
    cluster_consume_share: Number((cluster.consume_ack_msgs_per_s / single.consume_ack_msgs_per_s).toFixed(3)),
  };
  if (process.argv.includes("--json")) console.log(JSON.stringify(result));
  else {
    console.log(`${runtime}, ${storage} topic, ${messages} messages of ${body.length} B, batches of ${batch}`);
    report("one node: ", single);
    report("3 nodes:  ", cluster);
    console.log(`3 nodes against one: publish ${(result.cluster_publish_share * 100).toFixed(0)} %, consume ${(result.cluster_consume_share * 100).toFixed(0)} %`);
  }
} else {
  const broker = arg("url") ? null : await Broker.start();
  let result;
  try {
    result = { ...base, ...(await measure(arg("url") ?? broker.url)) };
  } finally {
    await broker?.stop();
  }
  if (process.argv.includes("--json")) console.log(JSON.stringify(result));
  else {
    console.log(`${runtime}, ${storage} topic, ${messages} messages of ${body.length} B, batches of ${batch}`);
    report("", result);
  }
}
