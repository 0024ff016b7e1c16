// Writes a gzip and a brotli copy beside each built file (the broker serves them as they are),
// checks that the build made exactly the files the broker embeds, and that the whole page stays
// under its size budget.
import { readdirSync, readFileSync, writeFileSync, statSync, rmSync } from "node:fs";
import { join, relative } from "node:path";
import { gzipSync, brotliCompressSync, constants } from "node:zlib";

const dist = new URL("../dist/", import.meta.url).pathname;
// Keep in step with ASSETS in crates/ferrymq-http/src/ui.rs.
const expected = ["assets/app.css", "assets/app.js", "favicon.svg", "index.html"];
const budgetBytes = 150 * 1024;

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? walk(path) : [path];
  });
}

for (const path of walk(dist)) {
  if (path.endsWith(".gz") || path.endsWith(".br")) rmSync(path);
}
const built = walk(dist).map((p) => relative(dist, p)).sort();
if (JSON.stringify(built) !== JSON.stringify(expected)) {
  console.error(`the build made ${JSON.stringify(built)}, the broker embeds ${JSON.stringify(expected)}`);
  process.exit(1);
}
let total = { raw: 0, gzip: 0, brotli: 0 };
for (const name of built) {
  const data = readFileSync(join(dist, name));
  const gzip = gzipSync(data, { level: 9 });
  const brotli = brotliCompressSync(data, {
    params: {
      [constants.BROTLI_PARAM_QUALITY]: 11,
      [constants.BROTLI_PARAM_SIZE_HINT]: data.length,
    },
  });
  writeFileSync(join(dist, name + ".gz"), gzip);
  writeFileSync(join(dist, name + ".br"), brotli);
  total.raw += data.length;
  total.gzip += gzip.length;
  total.brotli += brotli.length;
  console.log(`${name.padEnd(16)} ${String(data.length).padStart(8)} B  gzip ${String(gzip.length).padStart(7)} B  brotli ${String(brotli.length).padStart(7)} B`);
}
console.log(`${"total".padEnd(16)} ${String(total.raw).padStart(8)} B  gzip ${String(total.gzip).padStart(7)} B  brotli ${String(total.brotli).padStart(7)} B`);
if (total.gzip > budgetBytes) {
  console.error(`the page is ${total.gzip} B gzip-compressed, over its budget of ${budgetBytes} B`);
  process.exit(1);
}
