#!/usr/bin/env bash
# Runs the Python SDK's whole test suite in its own virtual environment.
#
# Needs Python 3.10+ with pip; creates clients/python/.venv, installs the package with its extras
# and pytest, and runs pytest. The broker is $FERRYMQ_BIN, else target/release/ferrymq, else
# target/debug/ferrymq, else it is built with cargo (see tests/conftest.py).
# Extra arguments go to pytest, e.g. ./run-tests.sh -k vectors
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[msgpack,protobuf,test]"
cd "$here"
exec "$venv/bin/python" -m pytest -q "$@"
