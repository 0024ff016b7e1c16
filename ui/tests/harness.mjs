// What the browser tests share: the real `ferrymq` binary on free loopback ports with a data dir
// of its own, and Debian's Chromium driven by playwright-core, watched for console errors and for
// any request that leaves the broker's origin.

import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const uiDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const repoDir = resolve(uiDir, "..");
export const screenshotDir = join(uiDir, "screenshots");

/** FERRYMQ_BIN, else a release build, else a debug build, else one built now. */
export function brokerBinary() {
  if (process.env.FERRYMQ_BIN) return process.env.FERRYMQ_BIN;
  for (const profile of ["release", "debug"]) {
    const path = join(repoDir, "target", profile, "ferrymq");
    if (existsSync(path)) return path;
  }
  const built = spawnSync("cargo", ["build", "-p", "ferrymq"], { cwd: repoDir, stdio: "inherit" });
  if (built.status !== 0) throw new Error("cargo build -p ferrymq failed");
  return join(repoDir, "target", "debug", "ferrymq");
}

const ansi = /\x1b\[[0-9;]*m/g;

/**
 * The broker `bin` on free loopback ports with a fresh data dir, whatever it serves; `args` adds
 * to its command line and `tcpAddr` names its binary protocol listener (a free port otherwise).
 */
export async function startBrokerProcess(bin = brokerBinary(), env = {}, { args = [], tcpAddr = "127.0.0.1:0" } = {}) {
  const dataDir = mkdtempSync(join(tmpdir(), "ferrymq-ui-"));
  const child = spawn(bin, ["serve", "--data-dir", dataDir, "--tcp-addr", tcpAddr, "--http-addr", "127.0.0.1:0", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, FERRYMQ_LOG: "info", ...env },
  });
  const log = [];
  let tcp = null;
  const base = await new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error(`${bin} did not say where it serves HTTP in 20 s:\n${log.join("\n")}`)), 20_000);
    const onLine = (chunk) => {
      for (const line of chunk.toString().split("\n")) {
        const clean = line.replace(ansi, "");
        if (clean) log.push(clean);
        tcp = /serving the binary protocol.*tcp=(\S+)/.exec(clean)?.[1] ?? tcp;
        const match = /serving HTTP.*http=(\S+)/.exec(clean);
        if (match) {
          clearTimeout(timer);
          resolvePromise(`http://${match[1]}`);
        }
      }
    };
    child.stdout.on("data", onLine);
    child.stderr.on("data", onLine);
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${bin} exited with ${code} before serving:\n${log.join("\n")}`));
    });
  }).catch(async (error) => {
    // Not serving: neither the process nor its data dir may outlive the failed start.
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
    }
    rmSync(dataDir, { recursive: true, force: true });
    throw error;
  });
  const broker = {
    base,
    tcp,
    bin,
    pid: child.pid,
    log,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
        if (child.exitCode === null) child.kill("SIGKILL");
      }
      rmSync(dataDir, { recursive: true, force: true });
    },
    /** Kills the process at once (SIGKILL), as a crash or a pulled plug would; the data dir stays. */
    async kill() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGKILL");
        await exited;
      }
    },
    async api(method, path, body) {
      const response = await fetch(base + path, {
        method,
        headers: body === undefined ? {} : { "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await response.text();
      return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : null, text };
    },
  };
  return broker;
}

/** Fails, after stopping it, when `broker` does not serve the dashboard in ui/dist. */
async function checkServesDist(broker) {
  const { base, bin } = broker;
  // A binary built before the dashboard changed would test an older page than the one here.
  const served = await fetch(`${base}/ui/assets/app.js`, { headers: { "accept-encoding": "identity" } });
  const local = readFileSync(join(uiDir, "dist", "assets", "app.js"));
  const servedBytes = Buffer.from(await served.arrayBuffer());
  if (served.status !== 200 || !servedBytes.equals(local)) {
    await broker.stop();
    throw new Error(`${bin} does not serve the dashboard in ui/dist (status ${served.status}): rebuild it with cargo build -p ferrymq, or point FERRYMQ_BIN at a current build`);
  }
}

/**
 * The broker from `brokerBinary()`, checked to serve the dashboard in ui/dist; `env` adds to its
 * environment (FERRYMQ_ADMIN_PASSWORD starts it with users).
 */
export async function startBroker(env = {}) {
  const broker = await startBrokerProcess(undefined, env);
  await checkServesDist(broker);
  return broker;
}

let portSeq = 0;

/**
 * A loopback port nothing listens on now. The nodes of a cluster must know each other's
 * addresses before they start, so their ports are chosen up front, from below the kernel's
 * ephemeral range (32768 and up) where listeners bound to port 0 never land; the process id
 * spreads concurrent runs apart, and a collision at start is retried with other ports.
 */
export async function freePort() {
  const base = 20000 + ((process.pid * 131 + 7000) % 10000);
  for (let i = 0; i < 3000; i++) {
    const port = base + (portSeq++ % 2700);
    const free = await new Promise((resolvePromise) => {
      const server = createServer();
      server.once("error", () => resolvePromise(false));
      server.listen(port, "127.0.0.1", () => server.close(() => resolvePromise(true)));
    });
    if (free) return `127.0.0.1:${port}`;
  }
  throw new Error("no free loopback port below the ephemeral range");
}

/**
 * `size` nodes of one cluster (`ferrymq serve --node-id --cluster-addr --peers`) on loopback, each
 * with its own data dir and checked to serve the dashboard in ui/dist. A start that fails (a port
 * taken between choosing and binding it) is retried with other ports, three times at most.
 * `nodes[i]` is node `i + 1`.
 */
export async function startCluster(size = 3, env = {}) {
  const bin = brokerBinary();
  let last;
  for (let attempt = 0; attempt < 3; attempt++) {
    const tcp = [];
    const peers = [];
    for (let i = 0; i < size; i++) {
      tcp.push(await freePort());
      peers.push(`${i + 1}=${await freePort()}`);
    }
    const nodes = [];
    try {
      for (let i = 0; i < size; i++) {
        const args = ["--node-id", String(i + 1), "--cluster-addr", peers[i].split("=")[1], "--peers", peers.join(","), "--election-timeout-ms", "300"];
        const node = await startBrokerProcess(bin, env, { args, tcpAddr: tcp[i] });
        node.id = i + 1;
        nodes.push(node);
      }
      for (const node of nodes) await checkServesDist(node);
      return {
        nodes,
        async stop() {
          for (const node of nodes) await node.stop();
        },
      };
    } catch (error) {
      last = error;
      for (const node of nodes) await node.stop();
      if (/does not serve the dashboard/.test(error.message)) break;
    }
  }
  throw new Error(`a cluster of ${size} did not start: ${last?.message}`);
}

export async function launchBrowser() {
  const profile = mkdtempSync(join(tmpdir(), "ferrymq-ui-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM_BIN ?? "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 900 },
  });
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/**
 * A page that records every console error, uncaught exception, failed request and request to
 * another origin than `base`; `problems()` lists them.
 */
export async function watchedPage(context, base) {
  const page = await context.newPage();
  const origin = new URL(base).origin;
  const problems = [];
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(`console error: ${message.text()}`);
  });
  page.on("pageerror", (error) => problems.push(`uncaught: ${error.message}`));
  page.on("request", (request) => {
    const url = new URL(request.url());
    if (url.protocol !== "data:" && url.protocol !== "blob:" && url.origin !== origin) problems.push(`request to another origin: ${request.url()}`);
  });
  page.on("requestfailed", (request) => {
    // A request cut short by the page closing or moving on is not a failure of the page.
    const why = request.failure()?.errorText ?? "";
    if (!why.includes("ERR_ABORTED")) problems.push(`request failed: ${request.url()} ${why}`);
  });
  return { page, problems: () => problems.splice(0) };
}

export function ensureScreenshotDir() {
  mkdirSync(screenshotDir, { recursive: true });
  return screenshotDir;
}

/** Waits until `check()` is truthy, polling, for at most `ms`. */
export async function eventually(check, ms = 10_000, what = "the condition") {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await check();
      if (last) return last;
    } catch (error) {
      last = error;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what} did not hold within ${ms} ms (last: ${last})`);
}
