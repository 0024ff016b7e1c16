// Builds dist/ when the package is installed from a directory or a git checkout
// (`npm install ./clients/typescript`): dist/ is not in the repository, and npm installs such a
// package without its devDependencies, so the compiler is fetched here when it is missing.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

function run(command, args) {
  const result = spawnSync(command, args, { cwd: root, stdio: "inherit" });
  if (result.status !== 0) process.exit(result.status ?? 1);
}

if (!existsSync(tsc)) {
  const dev = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).devDependencies;
  console.error("ferrymq: installing the TypeScript compiler to build dist/");
  run(npm, ["install", "--no-save", "--no-audit", "--no-fund", "--ignore-scripts", `typescript@${dev.typescript}`, `@types/node@${dev["@types/node"]}`]);
}
run(process.execPath, [tsc, "-p", "tsconfig.json"]);
