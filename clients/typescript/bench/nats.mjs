// The same two scenarios as bench.mjs against NATS JetStream with nats.js, for a side-by-side
// comparison: 100-byte bodies, file storage, acked publishes (kept `--in-flight` deep, as
// FerryMQ's batches are) and an acked pull consume. Needs `nats-server` (Debian: nats-server);
// starts it on a free loopback port with a temporary store.
// Usage: node bench/nats.mjs [--messages N] [--in-flight N] [--json]
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";

import { freePort } from "../test/support.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const messages = Number(arg("messages", "200000"));
const inFlight = Number(arg("in-flight", "1000"));
const runtime = typeof Bun !== "undefined" ? `bun ${Bun.version}` : `node ${process.version}`;

const port = await freePort();
const store = mkdtempSync(join(tmpdir(), "nats-bench-"));
const server = spawn(process.env.NATS_SERVER ?? "nats-server", ["-js", "-sd", store, "-a", "127.0.0.1", "-p", String(port)], { stdio: "ignore" });
let nc;
for (let i = 0; i < 100 && nc === undefined; i++) {
  nc = await connect({ servers: `127.0.0.1:${port}` }).catch(() => new Promise((r) => setTimeout(r, 100)));
}
if (nc === undefined) throw new Error("nats-server did not start");

const jsm = await jetstreamManager(nc);
await jsm.streams.add({ name: "BENCH", subjects: ["bench"], storage: "file" });
const js = jetstream(nc);
const body = new Uint8Array(100).fill(0x61);

function clock() {
  const cpu = process.cpuUsage();
  return { wall: performance.now() / 1000, cpu: (cpu.user + cpu.system) / 1e6 };
}
function since(s) {
  const now = clock();
  return { seconds: now.wall - s.wall, cpu: now.cpu - s.cpu };
}

async function publish(total) {
  const started = clock();
  // A counter, not Promise.race over the pending set: racing a thousand promises per publish
  // would cost the benchmark more than the client.
  let pending = 0;
  let wake = null;
  let failure = null;
  const done = () => {
    pending--;
    if (wake !== null) {
      const w = wake;
      wake = null;
      w();
    }
  };
  for (let i = 0; i < total; i++) {
    while (pending >= inFlight) await new Promise((r) => (wake = r));
    if (failure !== null) throw failure;
    pending++;
    js.publish("bench", body).then(done, (e) => {
      failure = e;
      done();
    });
  }
  while (pending > 0) await new Promise((r) => (wake = r));
  if (failure !== null) throw failure;
  return since(started);
}

async function consume(total) {
  await jsm.consumers.add("BENCH", { durable_name: "bench", ack_policy: "explicit" });
  const consumer = await js.consumers.get("BENCH", "bench");
  const started = clock();
  const iter = await consumer.consume({ max_messages: 1000 });
  let n = 0;
  for await (const m of iter) {
    m.ack();
    if (++n === total) break;
  }
  return since(started);
}

const warm = Math.min(20_000, messages);
await publish(warm);
const published = await publish(messages);
const consumed = await consume(messages + warm);
const result = {
  runtime,
  peer: "nats-jetstream-file",
  messages,
  body_bytes: 100,
  publish_msgs_per_s: Math.round(messages / published.seconds),
  consume_ack_msgs_per_s: Math.round((messages + warm) / consumed.seconds),
  publish_client_cpu_ns_per_msg: Math.round((published.cpu / messages) * 1e9),
  consume_client_cpu_ns_per_msg: Math.round((consumed.cpu / (messages + warm)) * 1e9),
};
await nc.close();
server.kill("SIGKILL");
rmSync(store, { recursive: true, force: true });
if (process.argv.includes("--json")) console.log(JSON.stringify(result));
else {
  console.log(`${runtime}, NATS JetStream (file storage), ${messages} messages of 100 B`);
  console.log(`acked publish:     ${result.publish_msgs_per_s.toLocaleString("en")} msg/s (client CPU ${result.publish_client_cpu_ns_per_msg} ns/msg)`);
  console.log(`acked pull consume: ${result.consume_ack_msgs_per_s.toLocaleString("en")} msg/s (client CPU ${result.consume_client_cpu_ns_per_msg} ns/msg)`);
}
