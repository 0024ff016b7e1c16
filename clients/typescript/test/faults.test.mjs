// The client against a scripted server on loopback: malformed frames, a refused handshake, a
// silent peer, credentials in HELLO. Each failure is a typed error, never an unhandled rejection.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer as createTlsServer } from "node:tls";
import { after, test } from "node:test";

import { Client, ConnectionError, decodeFrame, encodeFrame, FrameStream, ProtocolError, ServerError } from "../dist/index.js";

const unhandled = [];
process.on("unhandledRejection", (e) => unhandled.push(e));
after(() => assert.deepEqual(unhandled, [], "no unhandled promise rejection"));

const HELLO_OK = (heartbeatMs = 5000) => ({
  type: "HELLO_OK",
  version: 2,
  heartbeatMs,
  frameBytesMax: 1 << 20,
  messageBytesMax: 1024,
  server: "scripted",
});

/** A server that hands each frame it receives to `script(frame, requestId, socket)`. */
async function scripted(script) {
  const received = [];
  const server = createServer((socket) => {
    const stream = new FrameStream(1 << 24);
    socket.on("error", () => {});
    socket.on("data", (chunk) => {
      stream.push(new Uint8Array(chunk), (requestId, frame) => {
        received.push(frame);
        script(frame, requestId, socket);
      });
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { url: `127.0.0.1:${server.address().port}`, received, close: () => new Promise((r) => server.close(r)) };
}

test("credentials and tokens travel in HELLO as the protocol carries them", async () => {
  const server = await scripted((frame, id, socket) => {
    if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(), id));
  });
  const a = await Client.connect({ url: server.url, user: "alice", password: "s3cret", clientName: "t1" });
  const b = await Client.connect({ url: server.url, token: "fmq_tok" });
  assert.deepEqual(
    server.received.map((f) => [f.clientName, f.user, f.password]),
    [["t1", "alice", "s3cret"], ["ferrymq-typescript/0.1", "", "fmq_tok"]],
  );
  await a.close();
  await b.close();
  await assert.rejects(Client.connect({ url: server.url, token: "x", user: "u" }), (e) => e.code === "invalid_argument");
  await server.close();
});

const opensslSkip = spawnSync("openssl", ["version"]).status === 0 ? false : "no openssl to make a test certificate with";

test("TLS: the handshake runs over node:tls with the caller's options", { skip: opensslSkip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "ferrymq-tls-"));
  try {
    execFileSync("openssl", [
      "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
      "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
      "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"),
    ], { stdio: "ignore" });
    const cert = readFileSync(join(dir, "cert.pem"));
    const received = [];
    const names = [];
    const server = createTlsServer({ key: readFileSync(join(dir, "key.pem")), cert }, (socket) => {
      names.push(socket.servername);
      const stream = new FrameStream(1 << 24);
      socket.on("error", () => {});
      socket.on("data", (chunk) =>
        stream.push(new Uint8Array(chunk), (id, frame) => {
          received.push(frame.type);
          if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(), id));
          if (frame.type === "PING") socket.write(encodeFrame({ type: "PONG" }, id));
        }),
      );
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const url = `localhost:${server.address().port}`;
    const c = await Client.connect({ url, tls: { ca: cert }, reconnect: false });
    await c.ping();
    assert.deepEqual(received, ["HELLO", "PING"]);
    await c.close();
    // SNI names a host; an IP address sends none (RFC 6066).
    const byIp = await Client.connect({ url: `127.0.0.1:${server.address().port}`, tls: { ca: cert }, reconnect: false });
    await byIp.ping();
    await byIp.close();
    assert.deepEqual(names, ["localhost", false]);
    // A certificate the client does not trust fails the connect, with the reason.
    await assert.rejects(
      Client.connect({ url, tls: true, reconnect: false }),
      (e) => e instanceof ConnectionError && e.code === "connect_failed" && /certificate/.test(e.message),
    );
    await new Promise((r) => server.close(r));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a refused handshake fails connect with the server's error", async () => {
  const server = await scripted((frame, id, socket) => {
    socket.end(encodeFrame({ type: "ERROR", code: 10, message: "authentication failed" }, id));
  });
  await assert.rejects(
    Client.connect({ url: server.url, user: "mallory", password: "guess", reconnect: false }),
    (e) => e instanceof ServerError && e.code === "authentication_failed" && e.closesConnection,
  );
  await server.close();
});

test("a malformed frame from the server fails waiting requests with a ProtocolError", async () => {
  const server = await scripted((frame, id, socket) => {
    if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(), id));
    // A PUBLISHED with an unknown durability.
    if (frame.type === "PUBLISH") socket.write(Buffer.from("0500000084000000" + Buffer.from(new Uint32Array([id]).buffer).toString("hex") + "0400000000", "hex"));
  });
  const errors = [];
  const c = await Client.connect({ url: server.url, reconnect: false, onError: (e) => errors.push(e) });
  await assert.rejects(c.publish("t", "x"), (e) => e instanceof ProtocolError && e.field === "published.durability");
  await assert.rejects(c.ping(), (e) => e instanceof ConnectionError);
  await c.close();
  await server.close();
});

test("a server that goes silent is detected within three heartbeats", async () => {
  const server = await scripted((frame, id, socket) => {
    if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(100), id));
  });
  const c = await Client.connect({ url: server.url, reconnect: false, requestTimeoutMs: 0 });
  const started = Date.now();
  await assert.rejects(c.ping(), (e) => e instanceof ConnectionError && /3 heartbeats/.test(e.message));
  const waited = Date.now() - started;
  assert.ok(waited >= 250 && waited < 2000, `detected after ${waited} ms`);
  // The client sent its own heartbeats meanwhile.
  assert.ok(server.received.some((f) => f.type === "PING"));
  await c.close();
  await server.close();
});

test("while reconnecting, a request waits at most the request timeout for the connection", async () => {
  const sockets = [];
  const server = await scripted((frame, id, socket) => {
    sockets.push(socket);
    if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(), id));
  });
  const errors = [];
  const c = await Client.connect({ url: server.url, requestTimeoutMs: 300, reconnect: { initialDelayMs: 50, maxDelayMs: 100 }, onError: (e) => errors.push(e) });
  // No new connections from now on; the server's close completes once its connections end.
  const closed = server.close();
  sockets.forEach((s) => s.destroy());
  await closed;
  await new Promise((r) => setTimeout(r, 50));
  const started = Date.now();
  await assert.rejects(c.ping(), (e) => e instanceof ConnectionError && /not reconnected/.test(e.message));
  assert.ok(Date.now() - started < 2000);
  assert.ok(errors.some((e) => e.code === "connection_lost"), "the loss reached onError");
  await c.close();
});

test("a request without an answer times out with a TimeoutError", async () => {
  const server = await scripted((frame, id, socket) => {
    if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(), id));
  });
  const c = await Client.connect({ url: server.url, reconnect: false, requestTimeoutMs: 200 });
  await assert.rejects(c.ping(), (e) => e.code === "timeout");
  await c.close();
  await server.close();
});

test("an ERROR pushed with request id 0 reaches onError", async () => {
  const server = await scripted((frame, id, socket) => {
    if (frame.type === "HELLO") socket.write(encodeFrame(HELLO_OK(), id));
    if (frame.type === "PING" && id !== 0) {
      socket.write(encodeFrame({ type: "ERROR", code: 5, message: "topic 'gone' was deleted" }, 0));
      socket.write(encodeFrame({ type: "PONG" }, id));
    }
  });
  const errors = [];
  const c = await Client.connect({ url: server.url, reconnect: false, onError: (e) => errors.push(e) });
  await c.ping();
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, "unknown_topic");
  await c.close();
  await server.close();
});

test("decodeFrame is total: random bytes give a ProtocolError or a frame, never another error", () => {
  const seed = Number(process.env.FERRYMQ_TEST_SEED ?? Date.now() % 1_000_000);
  let state = seed;
  const random = () => (state = (state * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const opcodes = [1, 2, 3, 0x10, 0x11, 0x12, 0x13, 0x20, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x40, 0x41, 0x42, 0x43, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x8b, 0x8c];
  for (let i = 0; i < 5000; i++) {
    const len = Math.floor(random() * 64);
    const bytes = new Uint8Array(12 + len);
    for (let j = 12; j < bytes.length; j++) bytes[j] = random() < 0.5 ? 0 : Math.floor(random() * 256);
    const view = new DataView(bytes.buffer);
    view.setUint32(0, len, true);
    view.setUint16(4, opcodes[Math.floor(random() * opcodes.length)], true);
    try {
      decodeFrame(bytes, 1 << 24);
    } catch (e) {
      assert.ok(e instanceof ProtocolError, `seed ${seed}: ${e}`);
    }
  }
});

/** Connections and HELLOs a scripted server sees; `answer(n)` gives the n-th HELLO's reply. */
async function counting(answer, port = 0) {
  const state = { connections: 0, sockets: [] };
  const server = createServer((socket) => {
    state.connections++;
    state.sockets.push(socket);
    const n = state.connections;
    const stream = new FrameStream(1 << 24);
    socket.on("error", () => {});
    socket.on("data", (chunk) =>
      stream.push(new Uint8Array(chunk), (id, frame) => {
        if (frame.type === "HELLO") {
          const reply = answer(n);
          if (reply.type === "ERROR") socket.end(encodeFrame(reply, id));
          else socket.write(encodeFrame(reply, id));
        }
        if (frame.type === "PING") socket.write(encodeFrame({ type: "PONG" }, id));
      }),
    );
  });
  await new Promise((r) => server.listen(port, "127.0.0.1", r));
  state.url = `127.0.0.1:${server.address().port}`;
  state.close = () => {
    state.sockets.forEach((s) => s.destroy());
    return new Promise((r) => server.close(r));
  };
  return state;
}

const REFUSED = { type: "ERROR", code: 10, message: "authentication failed" };

test("a connect refused for its credentials does not go on reconnecting", async () => {
  const server = await counting(() => REFUSED);
  await assert.rejects(Client.connect({ url: server.url, user: "mallory", password: "guess" }), (e) => e.code === "authentication_failed");
  // Nothing knocks again: a reconnection would come within its first delay (100 ms).
  const until = Date.now() + 400;
  while (Date.now() < until) {
    assert.equal(server.connections, 1);
    await new Promise((r) => setTimeout(r, 20));
  }
  await server.close();
});

test("reconnection stops after the same refusal twice", async () => {
  const server = await counting((n) => (n === 1 ? HELLO_OK() : REFUSED));
  const errors = [];
  const c = await Client.connect({ url: server.url, reconnect: { initialDelayMs: 10, maxDelayMs: 20 }, onError: (e) => errors.push(e) });
  server.sockets[0].destroy();
  const deadline = Date.now() + 10_000;
  while (errors.filter((e) => e.code === "authentication_failed").length < 2) {
    assert.ok(Date.now() < deadline, "two refusals seen");
    await new Promise((r) => setTimeout(r, 10));
  }
  await assert.rejects(c.ping(), (e) => e.code === "authentication_failed");
  assert.equal(server.connections, 3);
  await c.close();
  await server.close();
});

test("the address comes from FERRYMQ_ADDR when none is given", async () => {
  const server = await counting(() => HELLO_OK());
  const before = process.env.FERRYMQ_ADDR;
  process.env.FERRYMQ_ADDR = server.url;
  try {
    const c = await Client.connect({ reconnect: false });
    await c.ping();
    await c.close();
    assert.equal(server.connections, 1);
  } finally {
    if (before === undefined) delete process.env.FERRYMQ_ADDR;
    else process.env.FERRYMQ_ADDR = before;
    await server.close();
  }
});

test("waitOnFirstConnectMs waits for a broker that is not up yet, within its bound", async () => {
  const probe = await counting(() => HELLO_OK());
  const port = Number(probe.url.split(":")[1]);
  await probe.close();
  const connecting = Client.connect({ url: `127.0.0.1:${port}`, waitOnFirstConnectMs: 20_000, reconnect: { initialDelayMs: 20, maxDelayMs: 100 } });
  let done = false;
  connecting.then(() => (done = true), () => (done = true));
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(done, false);
  const server = await counting(() => HELLO_OK(), port);
  const c = await connecting;
  await c.ping();
  await c.close();
  await server.close();
  // Without the option, or past it, the connect fails as before.
  await assert.rejects(Client.connect({ url: `127.0.0.1:${port}`, waitOnFirstConnectMs: 200 }), (e) => e instanceof ConnectionError && e.code === "connect_failed");
});
