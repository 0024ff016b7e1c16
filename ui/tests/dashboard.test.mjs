// The dashboard in a real browser against the real broker: every view, the actions an operator
// takes (publish, create, delete, look up, requeue), bad input, and both screen widths.

import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";
import { join } from "node:path";
import { writeFileSync } from "node:fs";
import { ensureScreenshotDir, eventually, launchBrowser, startBroker, uiDir, watchedPage } from "./harness.mjs";

let broker;
let browser;
let page;
let problems;
const figures = {};

/** Browser-logged failures of requests the test provoked on purpose (an API 4xx it shows). */
const expectedStatus = (code) => new RegExp(`Failed to load resource: the server responded with a status of ${code}`);

function assertClean(allowed = []) {
  const left = problems().filter((p) => !allowed.some((re) => re.test(p)));
  assert.deepEqual(left, [], "the page logged errors or reached another origin");
}

/**
 * A fresh load of the page at `hash`. Going through about:blank makes every open a real load,
 * never a same-document hash change: the heading waited for is then the new view's, not the one
 * the previous step left on screen.
 */
async function open(hash) {
  await page.goto("about:blank");
  await page.goto(`${broker.base}/ui/${hash}`);
  await page.locator("#view-title").waitFor();
}

const text = (selector) => page.locator(selector).first().innerText();

describe("the dashboard", { timeout: 150_000 }, () => {
  before(async () => {
    broker = await startBroker();
    browser = await launchBrowser();
    ({ page, problems } = await watchedPage(browser.context, broker.base));
  });

  // Each test answers for what its own steps logged.
  beforeEach(() => problems?.());

  after(async () => {
    await browser?.close();
    await broker?.stop();
    if (Object.keys(figures).length) writeFileSync(join(uiDir, "screenshots", "figures.json"), JSON.stringify(figures, null, 2));
  });

  test("is served by the broker with its own origin only, compressed, within its size budget", async () => {
    const redirect = await fetch(`${broker.base}/ui`, { redirect: "manual" });
    assert.equal(redirect.status, 308);
    assert.equal(redirect.headers.get("location"), "/ui/");

    let compressed = 0;
    for (const [path, type] of [
      ["/ui/", "text/html; charset=utf-8"],
      ["/ui/assets/app.js", "text/javascript; charset=utf-8"],
      ["/ui/assets/app.css", "text/css; charset=utf-8"],
      ["/ui/favicon.svg", "image/svg+xml"],
    ]) {
      const response = await fetch(broker.base + path, { headers: { "accept-encoding": "br" } });
      assert.equal(response.status, 200, path);
      assert.equal(response.headers.get("content-type"), type, path);
      assert.equal(response.headers.get("content-encoding"), "br", path);
      const csp = response.headers.get("content-security-policy");
      assert.match(csp, /default-src 'self'/, path);
      assert.doesNotMatch(csp, /unsafe|https?:|\*/, path);
      assert.equal(response.headers.get("x-content-type-options"), "nosniff");
      const etag = response.headers.get("etag");
      const again = await fetch(broker.base + path, { headers: { "if-none-match": etag } });
      assert.equal(again.status, 304, path);
      // Node's fetch decodes brotli itself; the declared length is what travelled.
      compressed += Number(response.headers.get("content-length"));
      await response.arrayBuffer();
    }
    assert.ok(compressed > 0 && compressed < 150 * 1024, `the page is ${compressed} B compressed`);
    figures.page_bytes_brotli = compressed;

    const missing = await broker.api("GET", "/ui/nothing.js");
    assert.equal(missing.status, 404);
    assert.equal(missing.body.error.code, "not_found");
  });

  test("the overview renders quickly and its counts move when messages are published over HTTP", async () => {
    await page.goto(`${broker.base}/ui/`);
    await page.waitForFunction(() => /^\d/.test(document.querySelector("[data-testid=topics-count]")?.textContent ?? ""));
    const firstRenderMs = await page.evaluate(() => performance.now());
    figures.first_render_ms = Math.round(firstRenderMs);
    assert.ok(firstRenderMs < 3000, `first render took ${firstRenderMs} ms`);
    assert.equal(await text("[data-testid=published]"), "0 msg");
    assert.match(await text(".ok-line"), /every partition takes writes/);
    assert.equal(await page.locator(".uplot canvas").count(), 2, "two live charts");
    assert.match(await text(".empty"), /No topics yet/);

    const messages = Array.from({ length: 25 }, (_, i) => ({ body: `order ${i}` }));
    const published = await broker.api("POST", "/topics/ui-orders/messages", { messages });
    assert.equal(published.status, 201, published.text);

    await eventually(async () => (await text("[data-testid=published]")) === "25 msg", 10_000, "the published count reaching 25");
    assert.equal(await text("[data-testid=topics-count]"), "1");
    // What the topics hold, each message once, beside the backlog added up over subscriptions.
    assert.equal(await text("[data-testid=retained]"), "25 msg");
    // The node serving the page: its memory, open files against the limit, the data dir's space.
    await page.locator("[data-testid=node]").waitFor();
    assert.match(await text("[data-testid=node-memory]"), /^\d[\d.,]* (KiB|MiB|GiB)$/);
    assert.match(await text("[data-testid=node-files]"), /^\d[\d,]* of \d[\d,]*$/);
    assert.match(await text("[data-testid=node-disk]"), / of .* %\)$/);
    await eventually(async () => /^[1-9][\d,.]* msg\/s$/.test(await text("[data-testid=rate-in]")), 10_000, "a non-zero rate in");
    await page.locator("a", { hasText: "ui-orders" }).first().waitFor();
    assertClean();
  });

  test("topics: create one, refuse a name with HTML as text, publish a test message, delete with confirmation", async () => {
    await open("#/topics");
    const create = page.locator("form", { has: page.locator("#create-title") });
    await create.getByLabel("Name").fill("ui-created");
    await create.getByLabel("Partitions").fill("2");
    await create.getByLabel("Storage").selectOption("disk");
    await create.getByRole("button", { name: "Create" }).click();
    await page.locator("tr[data-topic='ui-created']").waitFor();
    assert.match(await text(".notice"), /Created topic ui-created/);

    const hostile = `<img src=x onerror="window.__xss=1">`;
    await create.getByLabel("Name").fill(hostile);
    await create.getByRole("button", { name: "Create" }).click();
    const refusal = create.locator(".error");
    await refusal.waitFor();
    // The broker's own words, with the name shown as text, not markup.
    assert.match(await refusal.innerText(), /^Not created: invalid topic: "<img src=x onerror=.*" contains '<'/);
    assert.equal(await page.evaluate(() => window.__xss), undefined, "the name ran as HTML");
    assert.equal(await page.locator("img[src=x]").count(), 0);

    const publish = page.locator("form", { has: page.locator("#publish-title") });
    await publish.getByLabel("Topic").fill("ui-created");
    await publish.getByLabel("Body", { exact: true }).fill('{"order": 7, "items": [1, 2]}');
    await publish.getByLabel("The body is JSON").check();
    await publish.getByLabel("Key").fill("customer-7");
    await publish.getByLabel("Priority").selectOption("5");
    // A header line the page cannot read is refused before anything is sent.
    await publish.getByLabel(/Headers/).fill("trace abc");
    await publish.getByRole("button", { name: "Publish" }).click();
    assert.match(await publish.locator(".error").innerText(), /Not published: header line 1 is not "name: value"/);
    assert.equal((await broker.api("GET", "/topics/ui-created")).body.messages, 0);
    await publish.getByLabel(/Headers/).fill("trace: abc\nnote: <b>bold</b>");
    await publish.getByRole("button", { name: "Publish" }).click();
    const receipt = publish.locator(".notice a.mono");
    await receipt.waitFor();
    const id = await receipt.innerText();
    assert.match(id, /^[01]-0$/);
    assert.match(await text("form .notice"), /\(synced\)/);

    await receipt.click();
    await page.locator("[data-testid=lookup-result]").waitFor();
    const preview = page.locator(".preview");
    await preview.locator("pre.body").waitFor();
    const shown = await preview.locator("pre.body").innerText();
    assert.deepEqual(JSON.parse(shown), { order: 7, items: [1, 2] });
    assert.match(shown, /^\{\n  "/, "pretty-printed");
    assert.match(await preview.innerText(), /customer-7/);
    assert.match(await preview.innerText(), /note\s+<b>bold<\/b>/);
    assert.equal(await preview.locator("b").count(), 0, "a header value ran as HTML");

    await open("#/topics");
    const row = page.locator("tr[data-topic='ui-created']");
    await row.getByRole("button", { name: "Delete topic ui-created" }).click();
    const dialog = page.locator("dialog[open]");
    await dialog.waitFor();
    assert.match(await dialog.innerText(), /Delete topic ui-created\?/);
    await dialog.getByRole("button", { name: "Cancel" }).click();
    await dialog.waitFor({ state: "detached" }).catch(() => {});
    assert.equal(await page.locator("dialog[open]").count(), 0);
    assert.equal(await row.count(), 1, "cancel kept the topic");
    await row.getByRole("button", { name: "Delete topic ui-created" }).click();
    await page.locator("dialog[open]").waitFor();
    await page.keyboard.press("Escape");
    await eventually(async () => (await page.locator("dialog[open]").count()) === 0, 5_000, "Escape closing the question");
    assert.equal(await row.count(), 1, "Escape kept the topic");
    // A topic created elsewhere appears without a reload.
    assert.equal((await broker.api("POST", "/topics", { name: "ui-elsewhere" })).status, 201);
    await page.locator("tr[data-topic='ui-elsewhere']").waitFor({ timeout: 10_000 });
    await row.getByRole("button", { name: "Delete topic ui-created" }).click();
    await page.locator("dialog[open]").getByRole("button", { name: "Delete topic" }).click();
    await row.waitFor({ state: "detached" });
    assert.equal((await broker.api("GET", "/topics/ui-created")).status, 404);
    assertClean([expectedStatus(400)]);
  });

  test("a message is found by id with its state in every subscription; a bad id shows the API's error", async () => {
    const published = await broker.api("POST", "/topics/ui-jobs/messages", { body: "resize image 42", key: "img-42" });
    assert.equal(published.status, 201);
    const [id] = published.body.ids;
    const audit = await broker.api("POST", "/topics/ui-jobs/subscriptions/audit/poll?start=earliest&wait_ms=2000");
    assert.equal(audit.body.messages.length, 1, audit.text);
    const workers = await broker.api("POST", "/topics/ui-jobs/subscriptions/workers/poll?start=earliest&wait_ms=2000");
    assert.equal(workers.body.messages.length, 1, workers.text);
    const acked = await broker.api("POST", "/topics/ui-jobs/subscriptions/workers/ack", { consumer: workers.body.consumer, ids: [id], result: "resized in 12 ms" });
    assert.equal(acked.status, 200, acked.text);

    await open("#/lookup");
    const form = page.getByRole("search");
    await form.getByLabel("Topic").fill("ui-jobs");
    await form.getByLabel("Message id").fill("0-999");
    await form.getByLabel("Message id").press("Enter");
    const error = page.locator(".error");
    await error.waitFor();
    assert.match(await error.innerText(), /unknown_message/);

    await form.getByLabel("Message id").fill(id);
    await form.getByRole("button", { name: "Find" }).click();
    const workersRow = page.locator("tr[data-subscription=workers]");
    await workersRow.waitFor();
    assert.match(await workersRow.innerText(), /acked\s+1\s.*resized in 12 ms/s);
    assert.match(await page.locator("tr[data-subscription=audit]").innerText(), /in flight\s+1/);
    assert.equal(await page.locator("pre.body").innerText(), "resize image 42");
    assertClean([expectedStatus(404)]);
  });

  test("a dead letter shows its reason and is requeued by clicking", async () => {
    await broker.api("POST", "/topics/ui-payments/messages", { body: "pay 42", headers: { invoice: "991" } });
    const polled = await broker.api("POST", "/topics/ui-payments/subscriptions/billing/poll?start=earliest&wait_ms=2000");
    const [message] = polled.body.messages;
    const nacked = await broker.api("POST", "/topics/ui-payments/subscriptions/billing/nack", {
      consumer: polled.body.consumer,
      ids: [message.id],
      dead_letter: true,
      reason: "card declined <script>window.__xss=2</script>",
    });
    assert.equal(nacked.status, 200, nacked.text);
    await eventually(async () => (await broker.api("GET", "/topics/ui-payments.dlq")).body?.messages === 1, 10_000, "the dead letter being stored");

    await open("#/dead-letters");
    await page.getByRole("link", { name: "ui-payments", exact: true }).click();
    const letter = page.locator(`li.message[data-id='${message.id}']`);
    await letter.waitFor();
    // A compact row: its body's first line; opened, the whole letter.
    await eventually(async () => (await letter.locator(".snippet").innerText()) === "pay 42", 10_000, "the row's snippet");
    await letter.locator("summary").click();
    assert.match(await letter.locator(".reason").innerText(), /card declined <script>window.__xss=2<\/script>/);
    await letter.locator("pre.body").waitFor();
    assert.equal(await letter.locator("pre.body").innerText(), "pay 42");
    assert.match(await letter.innerText(), /x-ferrymq-dead-subscription\s+billing/);

    await letter.getByRole("button", { name: `Requeue ${message.id}` }).click();
    await eventually(async () => /1 sent back/.test(await text(".notice")), 10_000, "the requeue notice");
    // Marked requeued, with a link to its copy in place of the button.
    const requeuedAs = page.locator(`li.message[data-id='${message.id}'] [data-testid=requeued-as]`);
    await requeuedAs.waitFor();
    assert.equal(await page.locator(`li.message[data-id='${message.id}']`).getByRole("button", { name: `Requeue ${message.id}` }).count(), 0);
    assert.equal(await page.evaluate(() => window.__xss), undefined);

    const again = await broker.api("POST", `/topics/ui-payments/subscriptions/billing/poll?wait_ms=5000`);
    assert.equal(again.body.messages.length, 1, again.text);
    assert.equal(again.body.messages[0].body, "pay 42");
    assert.equal(await requeuedAs.locator("a").innerText(), again.body.messages[0].id);
    assert.match(await requeuedAs.locator("a").getAttribute("href"), new RegExp(`#/lookup/ui-payments/${again.body.messages[0].id}$`));
    assertClean();
  });

  test("a subscription's messages are listed page by page with text, JSON and binary previews", async () => {
    const first = await broker.api("POST", "/topics/ui-list/messages", [
      { body: "first" },
      { body_base64: Buffer.from([0, 1, 2, 255]).toString("base64") },
      { body: { kind: "json", n: 1 } },
      { body: "<script>window.__xss=3</script>" },
    ]);
    assert.equal(first.status, 201, first.text);
    const held = await broker.api("POST", "/topics/ui-list/subscriptions/readers/poll?start=earliest&max=1&wait_ms=2000");
    assert.equal(held.body.messages.length, 1);
    const more = Array.from({ length: 24 }, (_, i) => ({ body: `bulk ${i}` }));
    assert.equal((await broker.api("POST", "/topics/ui-list/messages", more)).status, 201);

    await open("#/topics/ui-list/subscriptions/readers");
    const items = page.locator("li.message");
    await eventually(async () => (await items.count()) === 20, 10_000, "a first page of 20");
    // Compact rows: each shows its body's first line, and opens to the whole message.
    const snippets = page.locator("li.message .snippet.mono");
    await eventually(async () => (await snippets.count()) === 20, 10_000, "20 body snippets");
    assert.equal(await page.locator("li.message[data-id='0-3'] .snippet").innerText(), "<script>window.__xss=3</script>");
    assert.equal(await page.locator("pre.body").count(), 0, "no body shown before its row opens");
    const tall = await page.evaluate(() => document.documentElement.scrollHeight);
    assert.ok(tall < 2000, `a page of 20 rows is ${tall} px tall`);
    for (const id of ["0-1", "0-2", "0-3"]) await page.locator(`li.message[data-id='${id}'] summary`).click();
    await eventually(async () => (await page.locator("pre.body").count()) === 3, 10_000, "the three opened bodies");
    assert.match(await page.locator("li.message[data-id='0-1'] pre.body").innerText(), /^000000  00 01 02 ff\s+\.\.\.\.$/);
    assert.equal(await page.locator("li.message[data-id='0-2'] pre.body").innerText(), '{\n  "kind": "json",\n  "n": 1\n}');
    assert.equal(await page.locator("li.message[data-id='0-3'] pre.body").innerText(), "<script>window.__xss=3</script>");
    assert.equal(await page.evaluate(() => window.__xss), undefined);

    await page.getByRole("button", { name: "Next page" }).click();
    await eventually(async () => (await items.count()) === 7, 10_000, "a second page of 7");
    assert.equal(await page.getByRole("button", { name: "Next page" }).isDisabled(), true);
    await page.getByRole("button", { name: "Previous page" }).click();
    await eventually(async () => (await items.count()) === 20, 10_000, "back to the first page");

    await page.getByRole("link", { name: "In flight" }).click();
    await eventually(async () => (await items.count()) === 1, 10_000, "one message in flight");
    assert.match(await items.first().innerText(), /in flight/);
    await page.locator("li.message[data-id='0-0'] summary").click();
    assert.equal(await page.locator("li.message[data-id='0-0'] pre.body").innerText(), "first");

    await open("#/topics/ui-list");
    const row = page.locator("tr[data-subscription=readers]");
    await row.waitFor();
    await eventually(async () => /27 msg/.test(await row.innerText()), 10_000, "a backlog of 27");
    await eventually(async () => /\d+(\.\d)? (ms|s)\b/.test(await row.locator("td").nth(3).innerText()), 10_000, "the age of the oldest waiting message");
    assert.match(await row.innerText(), /p50 \d/);
    assertClean();
  });

  test("faults from /status are shown plainly", async () => {
    await page.route("**/status", (route) =>
      route.fulfill({
        status: 200,
        contentType: "application/json",
        body: JSON.stringify({
          status: "degraded",
          version: "0.1.0",
          uptime_ms: 1000,
          topics: 1,
          faults: [{ topic: "ui-orders", partition: 0, damaged: false, reason: "No space left on device" }],
        }),
      }),
    );
    try {
      await open("#/");
      const alert = page.locator(".error", { hasText: "refuses writes" });
      await alert.waitFor();
      assert.match(await alert.innerText(), /ui-orders partition 0: No space left on device\. Reopened automatically/);
      assert.match(await text(".health"), /degraded/);
      await open("#/topics/ui-orders");
      const partition = page.locator(".partitions li.bad");
      await partition.waitFor();
      assert.equal(await partition.innerText(), "Partition 0: refuses writes (No space left on device)");
    } finally {
      await page.unroute("**/status");
    }
    assertClean();
  });

  test("the charts start from the broker's history, so a reload keeps the last minutes", async () => {
    // The broker samples every 5 s: wait for three samples, then load the page afresh.
    await eventually(async () => (await broker.api("GET", "/history")).body.samples.length >= 3, 20_000, "three samples in the broker's history");
    await open("#/");
    const points = async () => Number(await page.locator("figure.chart").first().getAttribute("data-points"));
    // The first poll draws the broker's samples with its own point: at least four at once,
    // where a page on its own would have one (a second comes only a poll, 2 s, later).
    for (const when of ["the first load", "a reload"]) {
      await open("#/");
      await eventually(async () => (await points()) >= 1, 10_000, `the chart's first points on ${when}`);
      const first = await points();
      assert.ok(first >= 3, `${first} points on ${when}: the broker's history is not drawn`);
    }
    assertClean();
  });

  test("a topic's page charts its last minutes from the broker's history, per subscription", async () => {
    await eventually(async () => (await broker.api("GET", "/topics/ui-list/history")).body.samples.length >= 2, 20_000, "two samples of ui-list");
    await open("#/topics/ui-list");
    const charts = page.locator("[data-testid=topic-charts] figure.chart");
    await eventually(async () => (await charts.count()) === 3, 10_000, "three charts: traffic, acks, backlog");
    assert.ok(Number(await charts.first().getAttribute("data-points")) >= 2, "the broker's samples drawn");
    assert.match(await charts.nth(2).locator("[role=img]").getAttribute("aria-label"), /readers: \d/, "a backlog line per subscription");
    assertClean();
  });

  test("the health badge says unreachable once /status stops answering, and recovers", async () => {
    await open("#/");
    await eventually(async () => /healthy/.test(await text(".health")), 10_000, "a healthy badge");
    await page.route("**/status", (route) => route.abort("connectionrefused"));
    try {
      await eventually(async () => /unreachable/.test(await text(".health")), 10_000, "the badge turning unreachable");
      assert.doesNotMatch(await text(".health"), /healthy/);
      assert.match(await text(".health"), /last answer \d+ s ago/);
    } finally {
      await page.unroute("**/status");
    }
    await eventually(async () => /healthy/.test(await text(".health")), 10_000, "the badge back to healthy");
    assertClean([/request failed: .*\/status/, /Failed to load resource/]);
  });

  test("a request the broker refuses for want of a session keeps what was typed", async () => {
    await open("#/topics/ui-orders");
    const publish = page.locator("form", { has: page.locator("#publish-title") });
    await publish.getByLabel("Body", { exact: true }).fill("keep me");
    await page.route("**/topics/ui-orders/messages", (route) =>
      route.fulfill({ status: 401, contentType: "application/json", body: JSON.stringify({ error: { code: "unauthenticated", message: "log in first" } }) }),
    );
    try {
      await publish.getByRole("button", { name: "Publish" }).click();
      await page.locator(".banner .error", { hasText: "asks for a login" }).waitFor();
      assert.match(await publish.locator(".error").innerText(), /log in first/);
      assert.equal(await publish.getByLabel("Body", { exact: true }).inputValue(), "keep me");
    } finally {
      await page.unroute("**/topics/ui-orders/messages");
    }
    assertClean([expectedStatus(401)]);
  });

  test("every view is reachable by keyboard", async () => {
    await open("#/");
    // A view puts the focus on its heading; the views' links are just before it.
    await eventually(async () => (await page.evaluate(() => document.activeElement?.id)) === "view-title", 5_000, "the focus on the view's heading");
    let reached = false;
    for (let i = 0; i < 8 && !reached; i++) {
      await page.keyboard.press("Shift+Tab");
      reached = await page.evaluate(() => document.activeElement?.textContent === "Topics");
    }
    assert.ok(reached, "Shift+Tab from the heading reaches the Topics link");
    await page.keyboard.press("Enter");
    await eventually(async () => (await text("#view-title")) === "Topics", 5_000, "the Topics view");
    assert.equal(await page.evaluate(() => location.hash), "#/topics");
    // Forward from the heading: the first control of the view, then on to the create form.
    let name = false;
    for (let i = 0; i < 60 && !name; i++) {
      await page.keyboard.press("Tab");
      name = await page.evaluate(() => document.activeElement?.getAttribute("name") === "name");
    }
    assert.ok(name, "Tab reaches the new topic's name field");
    await page.keyboard.type("ui-typed");
    await page.keyboard.press("Enter");
    await page.locator("tr[data-topic='ui-typed']").waitFor();
    assertClean();
  });

  test("a broker that runs alone has no Cluster link, and #/cluster shows the API's not_clustered", async () => {
    await open("#/cluster");
    const error = page.locator(".error");
    await error.waitFor();
    assert.match(await error.innerText(), /not_clustered/);
    // The header knows from GET /node that the broker runs alone: Connections, but no Cluster.
    await page.locator("header nav[data-cluster=false]").waitFor({ timeout: 10_000 });
    await page.locator("header nav a", { hasText: "Connections" }).waitFor();
    assert.equal(await page.locator("header nav a", { hasText: "Cluster" }).count(), 0);
    assertClean([expectedStatus(404)]);
  });

  test("looks right at 1280 and 390 px wide (screenshots in ui/screenshots)", async () => {
    const dir = ensureScreenshotDir();
    const views = [
      ["overview", "#/"],
      ["topics", "#/topics"],
      ["topic", "#/topics/ui-list"],
      ["subscription", "#/topics/ui-list/subscriptions/readers"],
      ["dead-letters", "#/dead-letters/ui-payments"],
      ["lookup", "#/lookup/ui-jobs/0-0"],
    ];
    for (const width of [1280, 390]) {
      await page.setViewportSize({ width, height: width > 600 ? 900 : 844 });
      for (const [name, hash] of views) {
        await open(hash);
        // Two statistics ticks: the charts have a rate to draw and the lists have arrived.
        await page.waitForTimeout(4_200);
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 1, `${name} at ${width} px scrolls sideways by ${overflow} px`);
        await page.screenshot({ path: join(dir, `${name}-${width}.png`), fullPage: true });
      }
    }
    await page.setViewportSize({ width: 1280, height: 900 });
    assertClean();
  });
});
