// What the browser tests share: the real `ferrymq` binary on free loopback ports with a data dir
// of its own, and Debian's Chromium driven by playwright-core, watched for console errors and for
// any request that leaves the broker's origin.

import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, mkdirSync } from "node:fs";
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

/** The broker `bin` on free loopback ports with a fresh data dir, whatever it serves. */
export async function startBrokerProcess(bin = brokerBinary(), env = {}) {
  const dataDir = mkdtempSync(join(tmpdir(), "ferrymq-ui-"));
  const child = spawn(bin, ["serve", "--data-dir", dataDir, "--tcp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"], {
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
  });
  const broker = {
    base,
    tcp,
    bin,
    pid: child.pid,
    log,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
        if (child.exitCode === null) child.kill("SIGKILL");
      }
      rmSync(dataDir, { recursive: true, force: true });
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

/**
 * The broker from `brokerBinary()`, checked to serve the dashboard in ui/dist; `env` adds to its
 * environment (FERRYMQ_ADMIN_PASSWORD starts it with users).
 */
export async function startBroker(env = {}) {
  const broker = await startBrokerProcess(undefined, env);
  const { base, bin } = broker;
  // A binary built before the dashboard changed would test an older page than the one here.
  const served = await fetch(`${base}/ui/assets/app.js`, { headers: { "accept-encoding": "identity" } });
  const local = readFileSync(join(uiDir, "dist", "assets", "app.js"));
  const servedBytes = Buffer.from(await served.arrayBuffer());
  if (served.status !== 200 || !servedBytes.equals(local)) {
    await broker.stop();
    throw new Error(`${bin} does not serve the dashboard in ui/dist (status ${served.status}): rebuild it with cargo build -p ferrymq, or point FERRYMQ_BIN at a current build`);
  }
  return broker;
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
