// The operator's views in a real browser against the real broker: connections listed with the
// name their client gave and closed with a confirmation, a topic purged, a subscription paused
// and resumed; and the first view with 1 000 topics and 1 000 connections, timed.

import assert from "node:assert/strict";
import { connect } from "node:net";
import { after, before, beforeEach, describe, test } from "node:test";
import { eventually, launchBrowser, startBroker, watchedPage } from "./harness.mjs";

let broker;
let browser;
let page;
let problems;

/** A HELLO frame of protocol version 3 naming the client `name`, anonymous. */
function hello(name) {
  const str16 = (s) => {
    const bytes = Buffer.from(s, "utf8");
    const out = Buffer.alloc(2 + bytes.length);
    out.writeUInt16LE(bytes.length, 0);
    bytes.copy(out, 2);
    return out;
  };
  const fixed = Buffer.alloc(8);
  fixed.writeUInt16LE(3, 0);
  fixed.writeUInt16LE(3, 2);
  fixed.writeUInt32LE(60_000, 4);
  const payload = Buffer.concat([fixed, str16(name), str16(""), str16("")]);
  const header = Buffer.alloc(12);
  header.writeUInt32LE(payload.length, 0);
  header.writeUInt16LE(0x01, 4);
  header.writeUInt16LE(0, 6);
  header.writeUInt32LE(1, 8);
  return Buffer.concat([header, payload]);
}

/** A binary protocol connection that said HELLO as `name`; resolves once connected. */
function client(name) {
  const [host, port] = broker.tcp.split(":");
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port: Number(port) }, () => {
      socket.write(hello(name));
      resolve(socket);
    });
    socket.on("error", reject);
    socket.on("data", () => {});
  });
}

async function open(hash) {
  await page.goto("about:blank");
  await page.goto(`${broker.base}/ui/${hash}`);
  await page.locator("#view-title").waitFor();
}

describe("the operator's views", { timeout: 150_000 }, () => {
  before(async () => {
    broker = await startBroker();
    browser = await launchBrowser();
    ({ page, problems } = await watchedPage(browser.context, broker.base));
  });

  beforeEach(() => problems?.());

  after(async () => {
    await browser?.close();
    await broker?.stop();
  });

  test("connections: listed with their client's name, closed after a confirmation", async () => {
    const socket = await client("ui-test/1.0");
    const closed = new Promise((resolve) => socket.on("close", resolve));
    await eventually(async () => (await broker.api("GET", "/connections")).body.total === 1, 10_000, "the connection being listed");
    await open("#/connections");
    const row = page.locator("tr", { hasText: "ui-test/1.0" });
    await row.waitFor();
    assert.match(await row.innerText(), /anonymous/);
    await row.getByRole("button", { name: /Close connection/ }).click();
    const dialog = page.locator("dialog[open]");
    await dialog.waitFor();
    await dialog.getByRole("button", { name: "Close connection" }).click();
    await page.locator(".notice", { hasText: /Closed connection/ }).waitFor();
    await closed;
    await eventually(async () => (await broker.api("GET", "/connections")).body.total === 0, 10_000, "the connection going");
    assert.deepEqual(problems(), []);
  });

  test("a topic is purged after a confirmation and a subscription paused and resumed", async () => {
    const messages = Array.from({ length: 3 }, (_, i) => ({ body: `job ${i}` }));
    assert.equal((await broker.api("POST", "/topics/ui-purge/messages", { messages })).status, 201);
    const polled = await broker.api("POST", "/topics/ui-purge/subscriptions/workers/poll?start=earliest&max=1&wait_ms=0");
    assert.equal(polled.status, 200, polled.text);
    await open("#/topics/ui-purge");
    const row = page.locator("tr[data-subscription=workers]");
    await row.waitFor();
    await row.getByRole("button", { name: "Pause subscription workers" }).click();
    await row.locator(".badge.paused").waitFor();
    const stats = await broker.api("GET", "/topics/ui-purge/stats");
    assert.equal(stats.body.subscriptions[0].paused, true);
    await row.getByRole("button", { name: "Resume subscription workers" }).click();
    await row.locator(".badge.paused").waitFor({ state: "detached" });

    await page.getByRole("button", { name: "Purge all messages" }).click();
    const dialog = page.locator("dialog[open]");
    await dialog.waitFor();
    await dialog.getByRole("button", { name: "Purge topic" }).click();
    await page.locator(".notice", { hasText: "3 messages dropped" }).waitFor();
    await eventually(async () => (await broker.api("GET", "/topics/ui-purge/stats")).body.depth === 0, 10_000, "the topic being empty");
    assert.deepEqual(problems(), []);
  });

  test("the first view with 1 000 topics and 1 000 connections renders in under 1 s", async () => {
    const sockets = [];
    for (let i = 0; i < 1000; i += 50) {
      sockets.push(...(await Promise.all(Array.from({ length: 50 }, (_, j) => client(`bench/${i + j}`)))));
    }
    for (let i = 0; i < 1000; i += 50) {
      await Promise.all(
        Array.from({ length: 50 }, (_, j) => broker.api("POST", "/topics", { name: `bench-${i + j}`, storage: "memory" })),
      );
    }
    await eventually(async () => (await broker.api("GET", "/connections?limit=1")).body.total >= 1000, 20_000, "1 000 connections");
    const timings = [];
    for (let run = 0; run < 3; run++) {
      await page.goto("about:blank");
      await page.goto(`${broker.base}/ui/`);
      await page.waitForFunction(() => /^1,?0\d\d$/.test(document.querySelector("[data-testid=topics-count]")?.textContent ?? ""));
      timings.push(await page.evaluate(() => performance.now()));
      await page.goto(`${broker.base}/ui/#/connections`);
      await page.locator("tr[data-connection]").first().waitFor();
    }
    const best = Math.min(...timings);
    console.log(`first view with 1000 topics and 1000 connections: ${timings.map(Math.round).join(", ")} ms`);
    assert.ok(best < 1000, `first render took ${best} ms`);
    for (const socket of sockets) socket.destroy();
    assert.deepEqual(problems(), []);
  });
});
