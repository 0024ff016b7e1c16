// A bus worker for bench/sdk/targets.py, the TypeScript twin of worker.py:
//   node worker.mjs ADDR TOPIC IDENTITY CONCURRENCY PREFETCH WORK_MS OUT
import { writeFileSync } from "node:fs";
import { connect } from "../../clients/typescript/dist/index.js";
import { defineMessage, loadSettings, Receiver } from "../../clients/typescript/dist/bus/index.js";

const [addr, topic, identity, concurrency, prefetch, workMs, out] = process.argv.slice(2);
const work = Number(workMs);
const Job = defineMessage({
  name: "Job",
  key: "customer",
  fields: [["id", "int"], ["customer", "string"], ["pad", "string"]],
});
const seen = [];
let first = 0;
let last = 0;
const client = await connect({ url: addr });
const settings = loadSettings({ addr, identity, topicTemplate: topic }, [], {});
const receiver = new Receiver(
  client,
  settings,
  [
    {
      messageType: Job,
      handle: async (job, ctx) => {
        if (work) await new Promise((resolve) => setTimeout(resolve, work));
        const now = performance.now();
        if (seen.length === 0) first = now;
        last = now;
        seen.push(`${job.id} ${ctx.attempt}`);
      },
    },
  ],
  { concurrency: Number(concurrency), prefetch: Number(prefetch), createTopics: false },
);
await receiver.start();
console.log("READY");
process.once("SIGTERM", async () => {
  const released = await receiver.drain();
  await client.close();
  writeFileSync(out, seen.length ? seen.join("\n") + "\n" : "");
  const seconds = (last - first) / 1000;
  console.log(JSON.stringify({ handled: seen.length, released, seconds, rate: seconds > 0 ? (seen.length - 1) / seconds : 0 }));
  process.exit(0);
});
