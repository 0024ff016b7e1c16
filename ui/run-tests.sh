#!/usr/bin/env bash
# The dashboard's browser tests, from a fresh machine with Node 20, npm and root for apt:
# installs Debian's Chromium when it is missing and the locked npm packages, then drives the
# real broker's page with playwright-core. Exits non-zero on any failure.
#
# The broker comes from FERRYMQ_BIN, else target/release/ferrymq, else target/debug/ferrymq,
# else `cargo build -p ferrymq` (it must be built from this tree: the tests check that it
# serves the files in ui/dist). Screenshots land in ui/screenshots/ (not committed).
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "ui/run-tests.sh needs Node 20 and npm" >&2
    exit 1
fi

chromium_bin="${CHROMIUM_BIN:-/usr/bin/chromium}"
if [ ! -x "$chromium_bin" ]; then
    echo "== installing Debian's chromium"
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

echo "== npm ci"
# The exact packages of package-lock.json; playwright-core downloads no browser of its own.
npm ci --no-audit --no-fund --loglevel=error

echo "== the built dashboard matches its source"
# The broker embeds ui/dist: a change to ui/src without a build would test and ship stale files.
if [ "${UI_SKIP_BUILD_CHECK:-}" != 1 ]; then
    before=$(cd dist && find . -type f ! -name '*.gz' ! -name '*.br' -exec sha256sum {} + | sort)
    npm run --silent build >/dev/null
    after=$(cd dist && find . -type f ! -name '*.gz' ! -name '*.br' -exec sha256sum {} + | sort)
    if [ "$before" != "$after" ]; then
        echo "ui/dist was not built from ui/src: run 'npm run build' in ui/ and commit ui/dist" >&2
        exit 1
    fi
fi

echo "== browser tests"
timeout 300 node --test --test-concurrency=1 --test-reporter=spec tests/
