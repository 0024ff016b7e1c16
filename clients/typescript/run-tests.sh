#!/usr/bin/env bash
# Installs, builds and runs the TypeScript client's whole suite under Node (node --test), then
# the same suite under Bun when the `bun` package installs from npm. Exits non-zero on failure.
#
# The tests start the real broker: FERRYMQ_BIN, else the repository's target/release or
# target/debug build, else this script builds it (cargo build --release -p ferrymq).
# The cross-language bus test uses the Python bus at ../python/src (FERRYMQ_PYTHON_SRC) with
# python3 (FERRYMQ_PYTHON), and skips with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)

npm ci --no-audit --no-fund
npm run build

if [[ -z "${FERRYMQ_BIN:-}" ]]; then
  for candidate in "$repo/target/release/ferrymq" "$repo/target/debug/ferrymq"; do
    if [[ -x "$candidate" ]]; then
      export FERRYMQ_BIN="$candidate"
      break
    fi
  done
  if [[ -z "${FERRYMQ_BIN:-}" ]]; then
    (cd "$repo" && cargo build --release -p ferrymq)
    export FERRYMQ_BIN="$repo/target/release/ferrymq"
  fi
fi
echo "typescript: broker $FERRYMQ_BIN"

echo "typescript: the suite under $(node --version)"
node --test --test-concurrency=1 test/*.test.mjs

# Bun comes from npm as a package that carries its binary; it is kept out of package.json so
# that the Node install stays small and a failed Bun install cannot fail the Node suite.
bun_dir=.bun-runtime
if [[ ! -x "$bun_dir/node_modules/.bin/bun" ]]; then
  mkdir -p "$bun_dir"
  if ! npm install --prefix "$bun_dir" --no-audit --no-fund --no-save bun@1.4.5 >/dev/null 2>&1; then
    echo "typescript: the bun package did not install; the suite under Bun is skipped"
    exit 0
  fi
fi
bun="$bun_dir/node_modules/.bin/bun"
if ! "$bun" --version >/dev/null 2>&1; then
  echo "typescript: the bun binary does not run here; the suite under Bun is skipped"
  exit 0
fi
echo "typescript: the suite under bun $("$bun" --version)"
"$bun" test $(printf './%s ' test/*.test.mjs)
