// First render of the overview in a cold browser profile, several times: first contentful paint,
// the moment the broker's figures are on screen, and the bytes that travelled for the page.
//
//   node scripts/bench-first-render.mjs [loads]     (the broker as in tests/harness.mjs)

import { launchBrowser, startBroker } from "../tests/harness.mjs";

const loads = Number(process.argv[2] ?? 5);
const broker = await startBroker();
await broker.api("POST", "/topics/first-render/messages", { body: "x" });
const samples = [];
for (let i = 0; i < loads; i++) {
  const browser = await launchBrowser();
  const page = await browser.context.newPage();
  await page.goto(`${broker.base}/ui/`);
  await page.waitForFunction(() => /^\d/.test(document.querySelector("[data-testid=topics-count]")?.textContent ?? ""));
  samples.push(
    await page.evaluate(() => {
      const data_ms = performance.now();
      const fcp = performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? null;
      const entries = [...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")];
      const page_bytes = entries.filter((e) => new URL(e.name).pathname.startsWith("/ui")).reduce((sum, e) => sum + e.transferSize, 0);
      return { fcp_ms: Math.round(fcp), data_ms: Math.round(data_ms), page_bytes };
    }),
  );
  await browser.close();
}
await broker.stop();
const median = (key) => [...samples].map((s) => s[key]).sort((a, b) => a - b)[Math.floor(samples.length / 2)];
console.log(JSON.stringify({ broker: broker.bin, samples, median_fcp_ms: median("fcp_ms"), median_data_ms: median("data_ms") }, null, 2));
