// The dashboard of a broker with users, in a real browser against the real broker: the login,
// the users and tokens pages, what a limited user and a monitor see and may do, CSRF, logout
// ending the session on the server, and a session that ends under a half-filled form.

import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";
import { join } from "node:path";
import { ensureScreenshotDir, eventually, launchBrowser, startBroker, watchedPage } from "./harness.mjs";

const ADMIN_PASSWORD = "the admin's passphrase";
const SHOP_PASSWORD = "the shop's passphrase";
const MONITOR_PASSWORD = "the monitor's passphrase";

let broker;
let browser;
let page;
let problems;
/** Every secret the run used: none may appear in the broker's log. */
const secrets = new Set([ADMIN_PASSWORD, SHOP_PASSWORD, MONITOR_PASSWORD]);

const expectedStatus = (code) => new RegExp(`Failed to load resource: the server responded with a status of ${code}`);

function assertClean(allowed = []) {
  const left = problems().filter((p) => !allowed.some((re) => re.test(p)));
  assert.deepEqual(left, [], "the page logged errors or reached another origin");
}

const basic = (user, password) => "Basic " + Buffer.from(`${user}:${password}`).toString("base64");

/** A call to the broker from outside the browser, as `authorization` (or with `headers`). */
async function api(method, path, { body, authorization = basic("admin", ADMIN_PASSWORD), headers = {} } = {}) {
  const response = await fetch(broker.base + path, {
    method,
    headers: { ...(authorization ? { authorization } : {}), ...(body === undefined ? {} : { "content-type": "application/json" }), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

const text = (selector) => page.locator(selector).first().innerText();
const navLinks = async () => (await page.locator("header nav a").allInnerTexts()).map((t) => t.trim());

/**
 * A fresh load of the page at `hash`. Going through about:blank makes every open a real load,
 * never a same-document hash change: the heading waited for is then the new view's, not the one
 * the previous step left on screen.
 */
async function open(hash) {
  await page.goto("about:blank");
  await page.goto(`${broker.base}/ui/${hash}`);
  await page.locator("#view-title, #login-title").first().waitFor();
}

async function logIn(user, password) {
  await page.locator("#login-title").waitFor();
  const form = page.locator(".login form");
  await page.getByLabel("User", { exact: true }).fill(user);
  await page.getByLabel("Password", { exact: true }).fill(password);
  await page.getByRole("button", { name: "Log in" }).click();
  await eventually(async () => (await page.locator("[data-testid=user]").count()) === 1 || (await form.locator(".error").count()) > 0, 10_000, "the login's answer");
}

async function logOut() {
  await page.getByRole("button", { name: "Log out" }).click();
  await page.locator("#login-title").waitFor();
}

/** The session cookie as the browser holds it. */
async function sessionCookie() {
  const cookies = await browser.context.cookies(broker.base);
  return cookies.find((c) => c.name === "ferrymq_session");
}

describe("the dashboard with users", { timeout: 180_000 }, () => {
  before(async () => {
    broker = await startBroker({ FERRYMQ_ADMIN_PASSWORD: ADMIN_PASSWORD });
    browser = await launchBrowser();
    ({ page, problems } = await watchedPage(browser.context, broker.base));
    for (const name of ["orders.eu", "orders.us", "payments"]) {
      assert.equal((await api("POST", "/topics", { body: { name } })).status, 201);
    }
    // A dead letter on orders.eu, so that its page has a Requeue button to show or hide.
    assert.equal((await api("POST", "/topics/orders.eu/messages", { body: { messages: [{ body: "order 7" }] } })).status, 201);
    const polled = await api("POST", "/topics/orders.eu/subscriptions/billing/poll?start=earliest&wait_ms=2000", { body: {} });
    assert.equal(polled.status, 200);
    const nacked = await api("POST", "/topics/orders.eu/subscriptions/billing/nack", {
      body: { consumer: polled.body.consumer, ids: [polled.body.messages[0].id], dead_letter: true, reason: "out of stock" },
    });
    assert.equal(nacked.status, 200, JSON.stringify(nacked.body));
    await eventually(async () => (await api("GET", "/topics/orders.eu.dlq")).body?.messages === 1, 10_000, "the dead letter being stored");
    assert.equal((await api("POST", "/users", { body: { name: "grafana", password: MONITOR_PASSWORD, roles: ["monitor"] } })).status, 201);
  });

  beforeEach(() => problems?.());

  after(async () => {
    await browser?.close();
    await broker?.stop();
    // What the broker logged during the whole run holds none of the secrets it was given.
    for (const line of broker?.log ?? []) {
      for (const secret of secrets) assert.ok(!line.includes(secret), `a secret in the log: ${line}`);
    }
  });

  test("the login page comes first; a wrong password shows the API's error", async () => {
    await open("#/topics");
    assert.deepEqual(await navLinks(), [], "no views before a login");
    assert.equal(await page.locator("#view-title").count(), 0, "no view is rendered");
    // A first visit is quiet: no poll before the login, so no refusal and no "session ended".
    await page.waitForLoadState("networkidle");
    assert.equal(await page.locator(".login .notice").count(), 0, "a first visit is told of no ended session");
    assert.deepEqual(problems(), [], "no request refused before the login");
    const refusal = await api("POST", "/login", { authorization: null, body: { user: "admin", password: "not the password" } });
    assert.equal(refusal.status, 401);
    await logIn("admin", "not the password");
    const error = page.locator(".login form .error");
    await error.waitFor();
    assert.match(await error.innerText(), /Not logged in/);
    assert.ok((await error.innerText()).includes(refusal.body.error.message), `${await error.innerText()} shows "${refusal.body.error.message}"`);
    assert.equal(await sessionCookie(), undefined, "a refused login sets no cookie");

    await logIn("admin", ADMIN_PASSWORD);
    await eventually(async () => (await text("#view-title")) === "Topics", 10_000, "the Topics view after the login");
    assert.equal(await text("[data-testid=user]"), "admin");
    assert.deepEqual(await navLinks(), ["Overview", "Topics", "Dead letters", "Message lookup", "Connections", "Users"]);
    const cookie = await sessionCookie();
    assert.ok(cookie, "the session cookie is set");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    assert.equal(await page.evaluate(() => document.cookie), "", "no script can read the cookie");
    secrets.add(cookie.value);
    assertClean([expectedStatus(401)]);
  });

  test("an admin adds a user and grants it a topic prefix through the page", async () => {
    await page.getByRole("link", { name: "Users" }).click();
    await eventually(async () => (await text("#view-title")) === "Users", 5_000, "the Users view");
    await page.locator("tr[data-user=admin]").waitFor();
    assert.match(await page.locator("tr[data-user=grafana]").innerText(), /monitor/);

    const form = page.locator("form", { has: page.locator("#add-user-title") });
    await form.getByLabel("Name").fill("shop");
    await form.getByLabel("Password", { exact: true }).fill(SHOP_PASSWORD);
    await form.getByLabel("Password again").fill(SHOP_PASSWORD + "!");
    await form.getByRole("button", { name: "Add user" }).click();
    assert.match(await form.locator(".error").innerText(), /the two passwords differ/);
    await form.getByLabel("Password again").fill(SHOP_PASSWORD);
    await form.getByRole("button", { name: "Add user" }).click();
    await page.locator("tr[data-user=shop]").waitFor();

    await page.locator("tr[data-user=shop] a").click();
    await eventually(async () => (await text("#view-title")) === "User shop", 5_000, "the user's view");
    const grant = page.locator("form", { has: page.locator("#grant-title") });
    await grant.getByLabel("Topic pattern").fill("orders.*");
    await grant.getByLabel("publish").check();
    await grant.getByLabel("inspect").check();
    await grant.getByRole("button", { name: "Grant" }).click();
    await page.locator("li[data-grant='orders.*']").waitFor();
    assert.match(await page.locator("li[data-grant='orders.*']").innerText(), /orders\.\*: publish, inspect/);
    const users = await api("GET", "/users");
    const shop = users.body.users.find((u) => u.name === "shop");
    assert.deepEqual(shop.grants, [{ pattern: "orders.*", actions: ["publish", "inspect"] }]);
    assertClean();
  });

  test("the last admin is asked before taking its own role, and the broker refuses it", async () => {
    await open("#/users/admin");
    await page.locator("ul.grants").waitFor();
    await page.getByRole("button", { name: "Revoke role admin" }).click();
    const dialog = page.getByRole("dialog");
    await dialog.waitFor();
    assert.match(await dialog.innerText(), /Take the admin role from yourself\?/);
    await dialog.getByRole("button", { name: "Revoke my role" }).click();
    const error = page.locator(".error", { hasText: "last admin" });
    await error.waitFor();
    assert.match(await error.innerText(), /'admin' is the last admin/);
    const users = await api("GET", "/users");
    assert.deepEqual(users.body.users.find((u) => u.name === "admin").roles, ["admin"], "still an admin");
    assertClean([expectedStatus(409)]);
  });

  test("a token's secret is shown once, works, and is gone once revoked", async () => {
    const tokens = page.locator("section", { has: page.locator("#tokens-title") });
    await tokens.getByLabel("Token name").fill("deploy");
    await tokens.getByRole("button", { name: "Create token" }).click();
    const secret = (await page.locator("[data-testid=token-secret]").innerText()).trim();
    assert.match(secret, /^fmq_[0-9a-f]{64}$/);
    secrets.add(secret);
    assert.match(await page.locator("[data-testid=new-token]").innerText(), /you will not see it again/);
    assert.equal((await api("GET", "/topics", { authorization: `Bearer ${secret}` })).status, 200);
    await page.getByRole("button", { name: "Done" }).click();
    await page.reload();
    await page.locator("tr[data-token=deploy]").waitFor();
    assert.ok(!(await page.locator("body").innerText()).includes(secret), "the secret is not shown again");
    assert.ok(!JSON.stringify((await api("GET", "/users/shop/tokens")).body).includes(secret));

    await page.getByRole("button", { name: "Revoke token deploy" }).click();
    await page.locator("dialog[open]").getByRole("button", { name: "Revoke token" }).click();
    await eventually(async () => (await page.locator("tr[data-token=deploy]").count()) === 0, 5_000, "the token's row to go");
    assert.equal((await api("GET", "/topics", { authorization: `Bearer ${secret}` })).status, 401);
    assertClean();
  });

  test("logout ends the session on the server: the old cookie is refused", async () => {
    const cookie = await sessionCookie();
    assert.equal((await api("GET", "/topics", { authorization: null, headers: { cookie: `ferrymq_session=${cookie.value}` } })).status, 200);
    await logOut();
    assert.equal(await sessionCookie(), undefined, "the browser forgot the cookie");
    const refused = await api("GET", "/topics", { authorization: null, headers: { cookie: `ferrymq_session=${cookie.value}` } });
    assert.equal(refused.status, 401);
    assert.equal(refused.body.error.code, "authentication_failed");
    assertClean();
  });

  test("a user granted orders.* sees only those topics, and no admin page", async () => {
    await logIn("shop", SHOP_PASSWORD);
    assert.deepEqual(await navLinks(), ["Overview", "Topics", "Dead letters", "Message lookup"]);
    await open("#/topics");
    await page.locator("tr[data-topic='orders.eu']").waitFor();
    const listed = await page.locator("tr[data-topic]").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-topic")));
    assert.deepEqual(listed.sort(), ["orders.eu", "orders.eu.dlq", "orders.us"]);
    assert.equal(await page.locator("#create-title").count(), 0, "no create form without manage");
    assert.equal(await page.getByRole("button", { name: /^Delete topic/ }).count(), 0, "no delete without manage");
    assert.equal(await page.locator("#publish-title").count(), 1, "the publish form: it may publish");

    // The users page by its address: the broker refuses, and the page says so.
    await open("#/users");
    await page.locator(".error", { hasText: "Cannot list the users" }).waitFor();
    assert.match(await text(".error"), /admin/);
    await logOut();
    assertClean([expectedStatus(403)]);
  });

  test("a monitor sees every topic but no write button; a write without the CSRF header is refused", async () => {
    await logIn("grafana", MONITOR_PASSWORD);
    await open("#/topics");
    await page.locator("tr[data-topic='payments']").waitFor();
    assert.equal(await page.locator("tr[data-topic]").count(), 4);
    for (const form of ["#create-title", "#publish-title"]) assert.equal(await page.locator(form).count(), 0, form);
    assert.equal(await page.getByRole("button", { name: /Delete/ }).count(), 0);
    await open("#/topics/orders.eu");
    await page.locator("tr[data-subscription='billing']").waitFor();
    assert.equal(await page.locator("#publish-title").count(), 0);
    assert.equal(await page.getByRole("button", { name: /Delete|Publish|Requeue/ }).count(), 0);
    await open("#/dead-letters/orders.eu");
    await page.locator("li.message").first().waitFor();
    assert.equal(await page.getByRole("button", { name: /Requeue/ }).count(), 0);

    // The cookie alone does not make a write: the broker wants the session's CSRF token.
    const bare = await page.evaluate(async () => {
      const r = await fetch("/topics", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ name: "forged" }) });
      return { status: r.status, body: await r.json() };
    });
    assert.equal(bare.status, 403);
    assert.equal(bare.body.error.code, "csrf_failed");
    // With the token, the monitor's role decides: it may not create topics.
    const tokened = await page.evaluate(async () => {
      const session = await (await fetch("/session")).json();
      const r = await fetch("/topics", {
        method: "POST",
        headers: { "content-type": "application/json", "x-csrf-token": session.csrf_token },
        body: JSON.stringify({ name: "forged" }),
      });
      return { status: r.status, body: await r.json() };
    });
    assert.equal(tokened.status, 403);
    assert.equal(tokened.body.error.code, "forbidden");
    assert.equal((await api("GET", "/topics/forged")).status, 404);
    await logOut();
    assertClean([expectedStatus(403)]);
  });

  test("a user granted only purge and pause may purge and pause, and is shown no delete", async () => {
    const password = "the on-call passphrase";
    secrets.add(password);
    assert.equal((await api("POST", "/users", { body: { name: "oncall", password } })).status, 201);
    const granted = await api("POST", "/users/oncall/grants", { body: { pattern: "orders.eu", actions: ["inspect", "purge", "pause"] } });
    assert.equal(granted.status, 204, JSON.stringify(granted.body));
    await logIn("oncall", password);
    await open("#/topics/orders.eu");
    await page.locator("tr[data-subscription='billing']").waitFor();
    await page.getByRole("button", { name: "Purge all messages" }).waitFor();
    assert.equal(await page.getByRole("button", { name: /Delete/ }).count(), 0, "no delete without manage");
    await page.getByRole("button", { name: "Pause subscription billing" }).click();
    await page.getByRole("button", { name: "Resume subscription billing" }).waitFor();
    await eventually(async () => (await api("GET", "/topics/orders.eu/stats")).body.subscriptions.find((s) => s.name === "billing")?.paused === true, 5_000, "billing paused");
    await page.getByRole("button", { name: "Resume subscription billing" }).click();
    await page.getByRole("button", { name: "Pause subscription billing" }).waitFor();
    // The broker decides: the same user may not delete the topic.
    const refused = await api("DELETE", "/topics/orders.eu", { authorization: basic("oncall", password) });
    assert.equal(refused.status, 403);
    assert.match(refused.body.error.message, /may not manage topic 'orders.eu'/);
    await logOut();
    assertClean();
  });

  test("a session that ends under a half-filled form sends to the login and back with the text kept", async () => {
    await logIn("admin", ADMIN_PASSWORD);
    await open("#/topics/orders.eu");
    const publish = page.locator("form", { has: page.locator("#publish-title") });
    await publish.getByLabel("Body", { exact: true }).fill("keep me");

    // The session ends on the server (as at its expiry), while the page still shows the form.
    const cookie = await sessionCookie();
    const session = await api("GET", "/session", { authorization: null, headers: { cookie: `ferrymq_session=${cookie.value}` } });
    const ended = await api("POST", "/logout", { authorization: null, headers: { cookie: `ferrymq_session=${cookie.value}`, "x-csrf-token": session.body.csrf_token } });
    assert.equal(ended.status, 204);

    await publish.getByRole("button", { name: "Publish" }).click();
    await page.locator("#login-title").waitFor();
    assert.match(await text(".login .notice"), /session has ended/);
    assert.equal(await page.locator("#main").isVisible(), false, "the view is hidden, not dropped");
    await logIn("admin", ADMIN_PASSWORD);
    await page.locator("#main").waitFor({ state: "visible" });
    assert.equal(await text("#view-title"), "orders.eu");
    assert.equal(await publish.getByLabel("Body", { exact: true }).inputValue(), "keep me");
    await publish.getByRole("button", { name: "Publish" }).click();
    await eventually(async () => /Published/.test(await publish.innerText()), 10_000, "the publish after logging in again");
    const status = await api("GET", "/topics/orders.eu/stats");
    assert.ok(status.body.messages_in >= 1, JSON.stringify(status.body));
    assertClean([expectedStatus(401)]);
  });

  test("looks right at 1280 and 390 px wide (screenshots in ui/screenshots)", async () => {
    const dir = ensureScreenshotDir();
    // The admin, unlike the monitor above, is offered the dead letter's requeue.
    await open("#/dead-letters/orders.eu");
    await page.locator("li.message").first().waitFor();
    assert.ok((await page.getByRole("button", { name: /^Requeue/ }).count()) >= 2);
    for (const width of [1280, 390]) {
      await page.setViewportSize({ width, height: width > 600 ? 900 : 844 });
      for (const [name, hash] of [
        ["users", "#/users"],
        ["user", "#/users/shop"],
      ]) {
        await open(hash);
        await page.locator("table, .empty").first().waitFor();
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 1, `${name} at ${width} px scrolls sideways by ${overflow} px`);
        await page.screenshot({ path: join(dir, `${name}-${width}.png`), fullPage: true });
      }
    }
    await logOut();
    for (const width of [1280, 390]) {
      await page.setViewportSize({ width, height: width > 600 ? 900 : 844 });
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 1, `login at ${width} px scrolls sideways by ${overflow} px`);
      await page.screenshot({ path: join(dir, `login-${width}.png`), fullPage: true });
    }
    await page.setViewportSize({ width: 1280, height: 900 });
    assertClean();
  });
});

describe("a broker without users", { timeout: 60_000 }, () => {
  let openBroker;
  let openBrowser;

  before(async () => {
    openBroker = await startBroker();
    openBrowser = await launchBrowser();
  });

  after(async () => {
    await openBrowser?.close();
    await openBroker?.stop();
  });

  test("takes only an admin as its first user, then asks for a login", async () => {
    const { page: p, problems: openProblems } = await watchedPage(openBrowser.context, openBroker.base);
    await p.goto(`${openBroker.base}/ui/#/users`);
    const form = p.locator("form", { has: p.locator("#add-user-title") });
    await p.locator("[data-testid=first-user-note]").waitFor();
    assert.equal(await form.getByLabel("Role").inputValue(), "admin");
    assert.ok(await form.getByLabel("Role").isDisabled(), "no other role to pick");
    // The rule holds on the broker too, for anyone who skips the page.
    const refused = await fetch(`${openBroker.base}/users`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "nobody", password: "long enough password", roles: [] }),
    });
    assert.equal(refused.status, 409);
    assert.match((await refused.json()).error.message, /first user must have the admin role/);

    await form.getByLabel("Name").fill("root");
    await form.getByLabel("Password", { exact: true }).fill(ADMIN_PASSWORD);
    await form.getByLabel("Password again").fill(ADMIN_PASSWORD);
    await form.getByRole("button", { name: "Add user" }).click();
    // The broker now asks for credentials: the page shows its login, and root logs in.
    await p.locator("#login-title").waitFor();
    await p.getByLabel("User", { exact: true }).fill("root");
    await p.getByLabel("Password", { exact: true }).fill(ADMIN_PASSWORD);
    await p.getByRole("button", { name: "Log in" }).click();
    await p.locator("[data-testid=user]").waitFor();
    await p.locator("tr[data-user=root]").waitFor();
    assert.match(await p.locator("tr[data-user=root]").innerText(), /admin/);
    const left = openProblems().filter((x) => !expectedStatus(401).test(x));
    assert.deepEqual(left, [], "the page logged errors or reached another origin");
    await p.close();
  });
});

describe("a dashboard session that expires", { timeout: 60_000 }, () => {
  const LIFETIME_MS = 4_000;
  let shortBroker;
  let shortBrowser;
  let shortPage;
  let shortProblems;

  before(async () => {
    shortBroker = await startBroker({ FERRYMQ_ADMIN_PASSWORD: ADMIN_PASSWORD, FERRYMQ_SESSION_LIFETIME_MS: String(LIFETIME_MS) });
    shortBrowser = await launchBrowser();
    ({ page: shortPage, problems: shortProblems } = await watchedPage(shortBrowser.context, shortBroker.base));
    const created = await fetch(`${shortBroker.base}/topics`, {
      method: "POST",
      headers: { authorization: basic("admin", ADMIN_PASSWORD), "content-type": "application/json" },
      body: JSON.stringify({ name: "orders" }),
    });
    assert.equal(created.status, 201);
  });

  after(async () => {
    await shortBrowser?.close();
    await shortBroker?.stop();
  });

  test("sends to the login when it expires, and back to the form with its text", async () => {
    const p = shortPage;
    const logInHere = async () => {
      await p.locator("#login-title").waitFor();
      await p.getByLabel("User", { exact: true }).fill("admin");
      await p.getByLabel("Password", { exact: true }).fill(ADMIN_PASSWORD);
      await p.getByRole("button", { name: "Log in" }).click();
      await p.locator("[data-testid=user]").waitFor();
    };
    await p.goto(`${shortBroker.base}/ui/#/topics/orders`);
    await logInHere();
    const cookie = (await shortBrowser.context.cookies(shortBroker.base)).find((c) => c.name === "ferrymq_session");
    assert.ok(cookie.expires * 1000 - Date.now() <= LIFETIME_MS + 1_000, "the cookie's Max-Age is the session's lifetime");
    const publish = p.locator("form", { has: p.locator("#publish-title") });
    await publish.getByLabel("Body", { exact: true }).fill("typed before the expiry");
    // Past the lifetime the broker refuses the session, whatever the browser still holds: the
    // page's next statistics poll meets the 401 and the login takes the view's place.
    const typedAt = Date.now();
    await p.locator("#login-title").waitFor({ timeout: LIFETIME_MS + 5_000 });
    assert.ok(Date.now() - typedAt >= LIFETIME_MS - 1_500, "not before the session's end");
    assert.match(await p.locator(".login .notice").innerText(), /session has ended/);
    await logInHere();
    await p.locator("#main").waitFor({ state: "visible" });
    assert.equal(await publish.getByLabel("Body", { exact: true }).inputValue(), "typed before the expiry");
    await publish.getByRole("button", { name: "Publish" }).click();
    await eventually(async () => /Published/.test(await publish.innerText()), 3_000, "the publish after logging in again");
    const left = shortProblems().filter((problem) => !expectedStatus(401).test(problem));
    assert.deepEqual(left, []);
  });
});
