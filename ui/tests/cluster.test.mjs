// The cluster view in a real browser against three real `ferrymq serve` nodes of one cluster:
// the nodes, a replicated topic's partitions with their leaders and replicas, served by a node
// that leads nothing where there is one; then a node killed with SIGKILL, and the page, still
// served by a live node, showing it down with the reason, the under-replicated partitions and
// the election that followed.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, beforeEach, describe, test } from "node:test";
import { ensureScreenshotDir, eventually, launchBrowser, startCluster, watchedPage } from "./harness.mjs";

let cluster;
let browser;
let page;
let problems;
/** The node serving the page, and the one killed. */
let serving;
let victim;

function assertClean(allowed = []) {
  const left = problems().filter((p) => !allowed.some((re) => re.test(p)));
  assert.deepEqual(left, [], "the page logged errors or reached another origin");
}

async function open(node, hash) {
  await page.goto("about:blank");
  await page.goto(`${node.base}/ui/${hash}`);
  await page.locator("#view-title").waitFor();
}

/** `GET /cluster` from `node`, failing on anything but 200. */
async function clusterState(node) {
  const answer = await node.api("GET", "/cluster");
  assert.equal(answer.status, 200, answer.text);
  return answer.body;
}

const rowText = (selector) => page.locator(selector).first().innerText();

describe("the cluster view", { timeout: 240_000 }, () => {
  before(async () => {
    cluster = await startCluster(3);
    browser = await launchBrowser();
  });

  beforeEach(() => problems?.());

  after(async () => {
    await browser?.close();
    await cluster?.stop();
  });

  test("a replicated topic's partitions, served by a follower, with every node up", async () => {
    const [first] = cluster.nodes;
    // The metadata group elects first; until it has a leader a topic change is refused.
    await eventually(
      async () => {
        const created = await first.api("POST", "/topics", { name: "orders", partitions: 2, replicas: 3 });
        return created.status === 201 || created.status === 409;
      },
      30_000,
      "the replicated topic orders being created",
    );
    const settled = await eventually(
      async () => {
        const state = await clusterState(first);
        const orders = state.partitions.filter((p) => p.topic === "orders");
        const ready = state.metadata_leader !== null && state.nodes.every((n) => n.up && n.addr) && orders.length === 2 && orders.every((p) => p.leader !== null);
        return ready && state;
      },
      30_000,
      "orders' two partitions having leaders on three nodes up",
    );
    // The page is served by the node that leads the fewest partitions, the metadata leader last:
    // with three groups on three nodes, often one that leads nothing.
    const ranked = [...settled.nodes].sort((a, b) => a.leader_of - b.leader_of || (a.id === settled.metadata_leader) - (b.id === settled.metadata_leader));
    serving = cluster.nodes[ranked[0].id - 1];
    const version = (await serving.api("GET", "/status")).body.version;
    ({ page, problems } = await watchedPage(browser.context, serving.base));

    await open(serving, "#/");
    const link = page.locator("header nav a", { hasText: "Cluster" });
    await link.waitFor({ timeout: 10_000 });
    await link.click();
    await eventually(async () => (await rowText("#view-title")) === "Cluster", 5_000, "the Cluster view");
    assert.equal(await page.evaluate(() => location.hash), "#/cluster");

    await eventually(async () => (await rowText("[data-testid=answered-by]")).startsWith(`node ${serving.id}`), 10_000, "the answering node named");
    await eventually(async () => (await rowText("[data-testid=nodes-up]")) === "3 of 3", 10_000, "three nodes up");
    for (const node of settled.nodes) {
      const row = await rowText(`tr[data-node='${node.id}']`);
      assert.match(row, /\bup\b/, `node ${node.id}: ${row}`);
      assert.ok(row.includes(version), `node ${node.id} shows version ${version}: ${row}`);
      assert.equal(node.addr, cluster.nodes[node.id - 1].tcp, "a node's address is where clients reach it");
      assert.ok(row.includes(node.addr), `node ${node.id} shows its address ${node.addr}: ${row}`);
      // Uptime, memory and disk with their units.
      assert.match(row, /\d+(\.\d)? (ms|s|min|h|d)\b/, row);
      assert.match(row, /\d (B|KiB|MiB|GiB)\b.*\d (B|KiB|MiB|GiB|TiB) of \d/s, row);
    }
    assert.match(await rowText(`tr[data-node='${serving.id}']`), /serving this page/);

    // Each partition with the leader and replicas the API gives, which the page polls into step.
    for (const partition of [0, 1]) {
      await eventually(
        async () => {
          const state = await clusterState(serving);
          const p = state.partitions.find((x) => x.topic === "orders" && x.partition === partition);
          const row = page.locator(`tr[data-partition='orders/${partition}']`);
          const leader = await row.locator("[data-testid=leader]").innerText();
          const replicas = await row.locator("[data-testid=replicas]").innerText();
          return leader === `node ${p.leader}` && replicas === [...p.replicas].join(", ") && p.replicas.length === 3 && (await row.innerText()).includes("in sync");
        },
        20_000,
        `orders partition ${partition} with its leader and three replicas in sync`,
      );
    }
    assert.equal(await page.locator("[data-testid=node-down]").count(), 0);
    assert.equal(await page.locator("[data-testid=under-replicated]").count(), 0);
    assertClean();
  });

  test("a node killed: shown down with the reason, under-replicated partitions and the election", async () => {
    assert.ok(serving, "the previous test chose the serving node");
    const before = await clusterState(serving);
    // The node to kill leads a partition (or, failing that, the metadata) and is not the one serving.
    const candidates = before.nodes.filter((n) => n.id !== serving.id).sort((a, b) => b.leader_of - a.leader_of);
    const led = before.partitions.filter((p) => p.topic === "orders" && p.leader === candidates[0].id);
    victim = cluster.nodes[candidates[0].id - 1];
    const ledGroups = led.length ? led.map((p) => p.group) : before.metadata_leader === victim.id ? [0] : [];
    assert.ok(ledGroups.length, `node ${victim.id} leads a group: ${JSON.stringify(before)}`);
    const termsBefore = new Map(before.elections.map((e) => [e.group, e.term]).reverse());

    await open(serving, "#/cluster");
    await eventually(async () => (await rowText("[data-testid=nodes-up]")) === "3 of 3", 10_000, "three nodes up before the kill");
    await victim.kill();

    // Down, with the API's own reason, on the page of a node still alive.
    const reason = await eventually(
      async () => {
        const state = await clusterState(serving);
        const node = state.nodes.find((n) => n.id === victim.id);
        return !node.up && node.error;
      },
      30_000,
      `node ${victim.id} reported down by the API`,
    );
    await eventually(async () => (await rowText("[data-testid=nodes-up]")) === "2 of 3", 20_000, "two nodes up on the page");
    const victimRow = await rowText(`tr[data-node='${victim.id}']`);
    assert.match(victimRow, /\bdown\b/, victimRow);
    const alert = await eventually(async () => (await page.locator("[data-testid=node-down]").count()) === 1 && rowText("[data-testid=node-down]"), 10_000, "the node-down call-out");
    assert.match(alert, new RegExp(`Node ${victim.id} is down`));
    // The reason as the API words it (what it says about the refused connection may vary by a
    // word between polls, so the first words are compared).
    const head = reason.split(":")[0];
    assert.ok(alert.includes(head) && victimRow.includes(head), `the page shows the API's reason "${reason}": ${alert} / ${victimRow}`);

    // Every orders partition keeps a replica on the dead node: all are under-replicated, called
    // out by name, and marked in the table.
    const callout = await eventually(
      async () => (await page.locator("[data-testid=under-replicated]").count()) === 1 && rowText("[data-testid=under-replicated]"),
      30_000,
      "the under-replicated call-out",
    );
    await eventually(
      async () => {
        const text = await rowText("[data-testid=under-replicated]");
        return /orders partition 0/.test(text) && /orders partition 1/.test(text) && /2 partitions under-replicated/.test(text);
      },
      20_000,
      `both orders partitions called out as under-replicated (last: ${callout})`,
    );
    for (const partition of [0, 1]) {
      const row = await rowText(`tr[data-partition='orders/${partition}']`);
      assert.match(row, /under-replicated/, row);
      assert.match(row, new RegExp(`node ${victim.id} down`), row);
    }

    // The groups the dead node led elect another leader: the page lists the election, newest
    // first, with the new leader and a later term, and calls it out as recent.
    for (const group of ledGroups) {
      await eventually(
        async () => {
          const rows = await page.locator(`tr[data-election-group='${group}']`).evaluateAll((trs) =>
            trs.map((tr) => ({ term: Number(tr.dataset.term), leader: tr.dataset.leader, text: tr.innerText })),
          );
          return rows.some((r) => r.leader !== "" && Number(r.leader) !== victim.id && r.term > (termsBefore.get(group) ?? 0) && r.text.includes(`node ${r.leader}`));
        },
        30_000,
        `an election of group ${group} after node ${victim.id} died`,
      );
    }
    assert.match(await rowText("[data-testid=recent-elections]"), /leader election/);
    if (led.length) {
      for (const p of led) {
        await eventually(
          async () => {
            const leader = await page.locator(`tr[data-partition='orders/${p.partition}'] [data-testid=leader]`).innerText();
            return leader.startsWith("node ") && leader !== `node ${victim.id}`;
          },
          30_000,
          `orders partition ${p.partition} led by a live node`,
        );
      }
    }
    assert.match(await rowText("[data-testid=answered-by]"), new RegExp(`^node ${serving.id}`));
    assertClean();
  });

  test("the Cluster view is reached by keyboard and fits 1280 and 390 px (screenshots in ui/screenshots)", async () => {
    assert.ok(serving, "the first test chose the serving node");
    await open(serving, "#/");
    await eventually(async () => (await page.evaluate(() => document.activeElement?.id)) === "view-title", 5_000, "the focus on the view's heading");
    let reached = false;
    for (let i = 0; i < 12 && !reached; i++) {
      await page.keyboard.press("Shift+Tab");
      reached = await page.evaluate(() => document.activeElement?.textContent === "Cluster");
    }
    assert.ok(reached, "Shift+Tab from the heading reaches the Cluster link");
    await page.keyboard.press("Enter");
    await eventually(async () => (await rowText("#view-title")) === "Cluster", 5_000, "the Cluster view");
    await page.locator("tr[data-node]").first().waitFor();
    // From the heading, Tab goes on into the view: a link of the call-outs, then the tables.
    let table = false;
    for (let i = 0; i < 20 && !table; i++) {
      await page.keyboard.press("Tab");
      table = await page.evaluate(() => document.activeElement?.getAttribute("aria-label") === "Nodes");
    }
    assert.ok(table, "Tab reaches the nodes table");

    const dir = ensureScreenshotDir();
    for (const width of [1280, 390]) {
      await page.setViewportSize({ width, height: width > 600 ? 900 : 844 });
      await open(serving, "#/cluster");
      await page.locator("tr[data-partition]").first().waitFor();
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 1, `the cluster view at ${width} px scrolls sideways by ${overflow} px`);
      await page.screenshot({ path: join(dir, `cluster-${width}.png`), fullPage: true });
    }
    await page.setViewportSize({ width: 1280, height: 900 });
    assertClean();
  });
});
