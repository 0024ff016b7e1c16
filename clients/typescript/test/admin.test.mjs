// Users, grants and tokens against a real broker with authentication on (an admin from
// FERRYMQ_ADMIN_PASSWORD). Skipped against a broker from before users, which refuses the frames.
import assert from "node:assert/strict";
import { inspect } from "node:util";
import { after, before, test } from "node:test";

import { Client, CreatedToken, ForbiddenError, ServerError } from "../dist/index.js";
import { Broker } from "./support.mjs";

const ADMIN_PASSWORD = "admin-pass-for-tests";

let broker;
let admin;
let skip = false;

before(async () => {
  broker = await Broker.start(["--default-partitions", "1"], { FERRYMQ_ADMIN_PASSWORD: ADMIN_PASSWORD });
  try {
    admin = await Client.connect({ url: broker.url, user: "admin", password: ADMIN_PASSWORD, reconnect: false });
    await admin.listUsers();
  } catch (e) {
    // A broker without users refuses credentials, or (older still) the user frames themselves
    // with unknown_opcode: nothing here applies to it.
    if (e instanceof ServerError && (e.code === "authentication_failed" || e.code === "unknown_opcode")) skip = true;
    else throw e;
  }
});

after(async () => {
  await admin?.close();
  await broker?.stop();
});

test("users, grants and tokens round-trip through the broker", async (t) => {
  if (skip) return t.skip("the broker has no users");
  await admin.addUser("billing", "billing-pass-1");
  await admin.addUser("grafana", "grafana-pass-1", ["monitor"]);
  await admin.grant("billing", "orders.*", ["publish", "consume"]);
  await admin.grant("billing", "audit", 4);

  const users = await admin.listUsers();
  const billing = users.find((u) => u.name === "billing");
  assert.deepEqual(billing.roles, 0);
  assert.deepEqual(
    [...billing.grants].sort((a, b) => a.pattern.localeCompare(b.pattern)),
    [{ pattern: "audit", actions: 4 }, { pattern: "orders.*", actions: 3 }],
  );
  assert.equal(users.find((u) => u.name === "grafana").roles, 2);

  await admin.revoke("billing", "orders.*", ["consume"]);
  const after = (await admin.listUsers()).find((u) => u.name === "billing");
  assert.ok(after.grants.some((g) => g.pattern === "orders.*" && g.actions === 1));

  const created = await admin.createToken("ci", { user: "billing" });
  assert.ok(created instanceof CreatedToken);
  assert.match(created.token, /^fmq_[0-9a-f]{64}$/);
  assert.equal(created.expiresMs, 0n);
  // The token is never shown by logging or serialising the result.
  for (const shown of [String(created), `${created}`, inspect(created), JSON.stringify(created)]) {
    assert.ok(!shown.includes(created.token), shown);
  }
  assert.deepEqual(Object.keys(created).sort(), ["expiresMs", "name"]);

  const tokens = await admin.listTokens("billing");
  assert.deepEqual(tokens.map((x) => x.name), ["ci"]);
  assert.equal(tokens[0].expiresMs, 0n);
  assert.equal(typeof tokens[0].createdMs, "bigint");

  // The token connects as billing, which may manage its own tokens and password only.
  const asBilling = await Client.connect({ url: broker.url, token: created.token, reconnect: false });
  try {
    assert.deepEqual((await asBilling.listTokens()).map((x) => x.name), ["ci"]);
    await assert.rejects(asBilling.listUsers(), (e) => e instanceof ForbiddenError && e.code === "forbidden" && e.codeNumber === 21);
    await assert.rejects(asBilling.addUser("intruder", "intruder-pass"), ForbiddenError);
    await asBilling.setPassword("billing-pass-2");
  } finally {
    await asBilling.close();
  }
  const withPassword = await Client.connect({ url: broker.url, user: "billing", password: "billing-pass-2", reconnect: false });
  await withPassword.close();

  await admin.revokeToken("ci", "billing");
  assert.deepEqual(await admin.listTokens("billing"), []);
  await admin.removeUser("billing");
  assert.ok(!(await admin.listUsers()).some((u) => u.name === "billing"));
});

test("a bad password length is the broker's invalid_argument, without the password", async (t) => {
  if (skip) return t.skip("the broker has no users");
  await assert.rejects(admin.addUser("shorty", "short"), (e) => {
    assert.ok(e instanceof ServerError && e.code === "invalid_argument", String(e));
    assert.ok(!e.message.includes("short\""), e.message);
    return true;
  });
  await assert.rejects(admin.addUser("x", "long-enough-pass", ["root"]), (e) => e.code === "invalid_argument");
});

test("operator frames: purge a topic, pause a subscription, list and close connections", async (t) => {
  if (skip) return t.skip("the broker has no users");
  await admin.createTopic("ops", { partitions: 1 });
  await admin.publishBatch("ops", ["a", "b", "c"]);
  const sub = await admin.subscribe("ops", { subscription: "ops-sub", start: "earliest", window: 10 });
  await sub.close();
  assert.equal(await admin.purgeTopic("ops"), 3n);
  assert.equal((await admin.describeTopic("ops")).messages, 0n);

  await admin.pauseSubscription("ops", "ops-sub");
  let stats = (await admin.stats("ops"))[0].subscriptions.find((s) => s.name === "ops-sub");
  assert.equal(stats.paused, true);
  await admin.pauseSubscription("ops", "ops-sub", false);
  stats = (await admin.stats("ops"))[0].subscriptions.find((s) => s.name === "ops-sub");
  assert.equal(stats.paused, false);
  await assert.rejects(admin.pauseSubscription("ops", "nobody"), (e) => e instanceof ServerError && e.code === "unknown_subscription");

  const other = await Client.connect({ url: broker.url, user: "admin", password: ADMIN_PASSWORD, clientName: "ops-victim", reconnect: false, onError: () => {} });
  try {
    const page = await admin.listConnections({ limit: 1000 });
    assert.ok(page.total >= 2n);
    assert.equal(page.nextAfter, 0n);
    const victim = page.connections.find((c) => c.clientName === "ops-victim");
    assert.ok(victim, JSON.stringify(page.connections.map((c) => c.clientName)));
    assert.equal(victim.user, "admin");
    assert.equal(victim.tls, false);
    await admin.closeConnection(victim.id);
    const deadline = Date.now() + 10_000;
    while (other.isConnected() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    assert.equal(other.isConnected(), false, "the closed connection is gone");
    await assert.rejects(admin.closeConnection(victim.id + 1_000_000n), (e) => e instanceof ServerError && e.code === "invalid_argument");
  } finally {
    await other.close();
  }
});
