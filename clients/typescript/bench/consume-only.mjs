// Drains a topic with one consumer acking every message and prints its rate and its CPU per
// message (user and system); for profiling the consume path alone against a broker filled
// beforehand:
//   node --cpu-prof bench/consume-only.mjs <host:port> <topic> <messages>
import { Client } from "../dist/index.js";

const [url, topic, count] = process.argv.slice(2);
const total = Number(count);
if (!url || !topic || !(total > 0)) {
  console.error("usage: node bench/consume-only.mjs <host:port> <topic> <messages>");
  process.exit(2);
}
const client = await Client.connect({ url });
const sub = await client.subscribe(topic, { subscription: "consume-only", start: "earliest", window: 10_000 });
const started = performance.now();
const cpu = process.cpuUsage();
let n = 0;
for await (const m of sub) {
  m.ack();
  if (++n === total) break;
}
const used = process.cpuUsage(cpu);
const seconds = (performance.now() - started) / 1000;
console.log(
  `consume with acks: ${Math.round(total / seconds).toLocaleString("en")} msg/s, ` +
    `client CPU user ${Math.round((used.user * 1000) / total)} ns/msg, system ${Math.round((used.system * 1000) / total)} ns/msg`,
);
await client.close();
