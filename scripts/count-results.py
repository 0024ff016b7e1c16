#!/usr/bin/env python3
"""Adds up the passed and failed counts a test runner printed: cargo test, pytest, node --test,
bun test, and the plain `N passed, N failed` line of FerryMQ's own scripts. Prints `passed failed`."""
import re
import sys

passed = failed = 0
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    line = line.strip()
    m = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed", line)  # cargo
    if m:
        passed += int(m[1]); failed += int(m[2]); continue
    m = re.match(r"^(?:=+ )?((?:\d+ \w+, )*\d+ \w+) in [\d.]+s", line)  # pytest's closing line
    if m:
        p = re.search(r"(\d+) passed", m[1]); f = re.search(r"(\d+) failed", m[1])
        e = re.search(r"(\d+) errors?", m[1])
        passed += int(p[1]) if p else 0
        failed += (int(f[1]) if f else 0) + (int(e[1]) if e else 0)
        continue
    m = re.match(r"^(?:#|ℹ) pass (\d+)$", line)  # node --test (TAP or spec summary)
    if m:
        passed += int(m[1]); continue
    m = re.match(r"^(?:#|ℹ) fail (\d+)$", line)
    if m:
        failed += int(m[1]); continue
    m = re.match(r"^(\d+) pass$", line)  # bun test
    if m:
        passed += int(m[1]); continue
    m = re.match(r"^(\d+) fail$", line)
    if m:
        failed += int(m[1]); continue
    m = re.match(r"^(?:\w+: )?(\d+) passed, (\d+) failed", line)  # FerryMQ's scripts
    if m:
        passed += int(m[1]); failed += int(m[2]); continue
print(passed, failed)
