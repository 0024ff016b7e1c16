// The typed bus at compile time: tsc on test/types/bus-typed.ts, whose @ts-expect-error lines
// (a misspelled field, a wrong key, a wrong type) must each fail to compile, and nothing else.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";

import { packageRoot } from "./support.mjs";

test("a misspelled field of a typed message fails to compile", () => {
  const tsc = join(packageRoot, "node_modules", "typescript", "bin", "tsc");
  const run = spawnSync(process.execPath, [tsc, "-p", join(packageRoot, "test", "types", "tsconfig.json")], { encoding: "utf8" });
  assert.equal(run.status, 0, `tsc reported:\n${run.stdout}${run.stderr}`);
});
