// Shared by the tests: the repository's paths, lossless JSON for the vectors files, and the real
// broker started on free loopback ports.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const repoRoot = resolve(packageRoot, "..", "..");

/**
 * Parses JSON keeping integers of 16 digits or more as strings, so that a u64 written as a JSON
 * number (above 2^53) is not rounded before a test reads it.
 */
export function parseJsonLossless(text) {
  let out = "";
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
    } else if (c === "-" || (c >= "0" && c <= "9")) {
      let j = i;
      while (j < text.length && /[-+0-9.eE]/.test(text[j])) j++;
      const literal = text.slice(i, j);
      out += /^[0-9]{16,}$/.test(literal) ? `"${literal}"` : literal;
      i = j;
    } else {
      out += c;
      i++;
    }
  }
  return JSON.parse(out);
}

export function readJson(path) {
  return parseJsonLossless(readFileSync(path, "utf8"));
}

export function hexToBytes(hex) {
  return new Uint8Array(Buffer.from(hex, "hex"));
}

export function bytesToHex(bytes) {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");
}

/** The broker binary: FERRYMQ_BIN, else the repository's release or debug build, else built. */
export function brokerBinary() {
  if (process.env.FERRYMQ_BIN) return process.env.FERRYMQ_BIN;
  for (const profile of ["release", "debug"]) {
    const path = join(repoRoot, "target", profile, "ferrymq");
    if (existsSync(path)) return path;
  }
  const built = spawnSync("cargo", ["build", "--release", "-p", "ferrymq"], { cwd: repoRoot, stdio: "inherit" });
  if (built.status !== 0) throw new Error("cargo build --release -p ferrymq failed; set FERRYMQ_BIN to a broker binary");
  return join(repoRoot, "target", "release", "ferrymq");
}

export async function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

function canConnect(port) {
  return new Promise((resolveConnect) => {
    const socket = connect({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolveConnect(true);
    });
    socket.once("error", () => resolveConnect(false));
  });
}

/**
 * A real `ferrymq serve` on free loopback ports with its own data directory. `restart()` stops
 * it and starts it again on the same ports and data; `stop()` ends it and removes the data.
 */
export class Broker {
  constructor(extraArgs = [], env = {}) {
    this.extraArgs = extraArgs;
    this.env = env;
    this.dataDir = mkdtempSync(join(tmpdir(), "ferrymq-ts-"));
    this.process = null;
    this.log = "";
  }

  static async start(extraArgs = [], env = {}) {
    const broker = new Broker(extraArgs, env);
    broker.port = await freePort();
    broker.httpPort = await freePort();
    await broker.spawn();
    return broker;
  }

  get url() {
    return `127.0.0.1:${this.port}`;
  }

  async spawn() {
    const args = [
      "serve",
      "--tcp-addr",
      `127.0.0.1:${this.port}`,
      "--http-addr",
      `127.0.0.1:${this.httpPort}`,
      "--data-dir",
      this.dataDir,
      ...this.extraArgs,
    ];
    const child = spawn(brokerBinary(), args, {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, ...this.env },
    });
    this.process = child;
    const keep = (chunk) => {
      this.log = (this.log + chunk.toString()).slice(-20_000);
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`ferrymq exited with ${child.exitCode}:\n${this.log}`);
      if (await canConnect(this.port)) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    child.kill("SIGKILL");
    throw new Error(`ferrymq did not listen on ${this.port} within 15 s:\n${this.log}`);
  }

  async kill(signal = "SIGKILL") {
    const child = this.process;
    if (child === null || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill(signal);
    await exited;
  }

  async restart() {
    await this.kill("SIGTERM");
    await this.spawn();
  }

  async stop() {
    await this.kill("SIGKILL");
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

/**
 * The nodes of one cluster (`size` `ferrymq serve` on free loopback ports, elections after 300 ms
 * of silence), each a Broker keeping its ports and data across restarts; `stop()` each when done.
 */
export async function startCluster(size = 3) {
  let lastError;
  for (let attempt = 0; attempt < 3; attempt++) {
    const nodes = [];
    try {
      const peers = [];
      for (let i = 0; i < size; i++) {
        const b = new Broker();
        b.port = await freePort();
        b.httpPort = await freePort();
        b.clusterPort = await freePort();
        peers.push(`${i + 1}=127.0.0.1:${b.clusterPort}`);
        nodes.push(b);
      }
      nodes.forEach((b, i) => {
        b.extraArgs = ["--node-id", String(i + 1), "--cluster-addr", `127.0.0.1:${b.clusterPort}`, "--peers", peers.join(","), "--election-timeout-ms", "300"];
      });
      for (const b of nodes) await b.spawn();
      return nodes;
    } catch (e) {
      lastError = e;
      await Promise.all(nodes.map((b) => b.stop()));
    }
  }
  throw lastError;
}
