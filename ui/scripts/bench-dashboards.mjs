// What open dashboards cost the broker: its CPU while idle with 0 and with N dashboards open, and
// the memory-topic throughput of `ferrymq bench` without and with them, run alternately.
//
//   FERRYMQ_BIN=../target/release/ferrymq node scripts/bench-dashboards.mjs [dashboards] [idle_s] [runs]
//
// A broker built before the dashboard existed (to compare with an older release) works too: the
// page's files are then handed to the browser from ui/dist, and its API calls still go to the
// broker, which is all that costs the broker anything after the first load.

import { spawn, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { launchBrowser, startBrokerProcess, uiDir } from "../tests/harness.mjs";

const dashboards = Number(process.argv[2] ?? 10);
const idleSeconds = Number(process.argv[3] ?? 30);
const runs = Number(process.argv[4] ?? 5);
const ticksPerSecond = Number(spawnSync("getconf", ["CLK_TCK"]).stdout.toString().trim() || 100);

function cpuSeconds(pid) {
  // Fields 14 and 15 of /proc/<pid>/stat (after the parenthesised name): user and system ticks.
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / ticksPerSecond;
}

async function idleCpuPercent(pid) {
  const before = cpuSeconds(pid);
  const started = Date.now();
  await new Promise((r) => setTimeout(r, idleSeconds * 1000));
  return (100 * (cpuSeconds(pid) - before)) / ((Date.now() - started) / 1000);
}

function bench(bin, tcp) {
  const out = spawnSync(bin, ["bench", "--addr", tcp, "--storage", "memory", "--producers", "1", "--consumers", "1", "--size", "100", "--count", "2000000", "--json"], {
    encoding: "utf8",
    timeout: 120_000,
  });
  if (out.status !== 0) throw new Error(`bench failed: ${out.stderr}`);
  return Math.round(JSON.parse(out.stdout).consumer.msgs_per_s);
}

const broker = await startBrokerProcess();
const { pid, base, tcp, bin } = broker;
console.log(`broker ${bin} pid ${pid} http ${base} tcp ${tcp}`);
// Something for /stats to report: 20 topics with two subscriptions each.
for (let i = 0; i < 20; i++) {
  await broker.api("POST", `/topics/bench-ui-${i}/messages`, { messages: [{ body: "a" }, { body: "b" }] });
  for (const sub of ["audit", "workers"]) await broker.api("POST", `/topics/bench-ui-${i}/subscriptions/${sub}/poll?start=earliest&max=1&wait_ms=0`);
}
await new Promise((r) => setTimeout(r, 2000));

const results = { dashboards, idle_seconds: idleSeconds, broker: bin };
results.idle_cpu_percent_without = await idleCpuPercent(pid);

const browser = await launchBrowser();
const served = (await fetch(`${base}/ui/`)).status === 200;
let apiRequests = 0;
const pages = [];
for (let i = 0; i < dashboards; i++) {
  const page = await browser.context.newPage();
  if (!served) {
    await page.route("**/ui/**", (route) => {
      const path = new URL(route.request().url()).pathname.replace(/^\/ui\/?/, "") || "index.html";
      const types = { html: "text/html", js: "text/javascript", css: "text/css", svg: "image/svg+xml" };
      route.fulfill({ body: readFileSync(join(uiDir, "dist", path)), contentType: types[path.split(".").pop()] });
    });
  }
  page.on("request", (request) => {
    if (!new URL(request.url()).pathname.startsWith("/ui")) apiRequests++;
  });
  await page.goto(`${base}/ui/`);
  pages.push(page);
}
await new Promise((r) => setTimeout(r, 5000));
const requestsBefore = apiRequests;
results.idle_cpu_percent_with = await idleCpuPercent(pid);
results.api_requests_per_second_with = (apiRequests - requestsBefore) / idleSeconds;
results.page_files_served_by = served ? "broker" : "ui/dist through the browser (broker without /ui/)";

// Throughput side by side: without, with, alternately, so that drift hits both.
results.bench_msg_per_s_without = [];
results.bench_msg_per_s_with = [];
for (let run = 0; run < runs; run++) {
  results.bench_msg_per_s_with.push(bench(bin, tcp));
  await Promise.all(pages.map((p) => p.goto("about:blank")));
  results.bench_msg_per_s_without.push(bench(bin, tcp));
  await Promise.all(pages.map((p) => p.goto(`${base}/ui/`)));
  await new Promise((r) => setTimeout(r, 3000));
}
await browser.close();
await broker.stop();
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
results.bench_median_without = median(results.bench_msg_per_s_without);
results.bench_median_with = median(results.bench_msg_per_s_with);
console.log(JSON.stringify(results, null, 2));
