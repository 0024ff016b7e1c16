#!/usr/bin/env bash
# Installs, builds and runs the TypeScript client's whole suite under Node, then under Bun when
# the `bun` package installs. Tests start the real broker: FERRYMQ_BIN, else the repository's
# target/release or target/debug build, else `cargo build --release -p ferrymq`.
set -euo pipefail
cd "$(dirname "$0")"

npm ci --no-audit --no-fund
npm run build

node --test --test-concurrency=1 test/*.test.mjs
