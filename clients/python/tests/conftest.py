"""Starts the real ``ferrymq`` broker for the tests, on 127.0.0.1 and free ports only.

The binary is ``$FERRYMQ_BIN``, else ``<repo>/target/release/ferrymq``, else
``<repo>/target/debug/ferrymq``, else built with ``cargo build --release -p ferrymq``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Coroutine, Iterator, Optional, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
STARTUP_S = 30.0
T = TypeVar("T")


def broker_binary() -> Path:
    env = os.environ.get("FERRYMQ_BIN")
    if env:
        path = Path(env)
        if not path.is_file():
            raise RuntimeError(f"FERRYMQ_BIN={env} is not a file")
        return path
    for profile in ("release", "debug"):
        path = REPO / "target" / profile / "ferrymq"
        if path.is_file():
            return path
    subprocess.run(["cargo", "build", "--release", "-p", "ferrymq"], cwd=REPO, check=True)
    return REPO / "target" / "release" / "ferrymq"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One ``ferrymq serve`` process with its own data directory; ``restart`` keeps the port and
    the data."""

    def __init__(self, binary: Path, data_dir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.extra_args = extra_args
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.port = 0
        self.addr = ""

    def start(self) -> "Broker":
        log = open(self.log_path, "ab")
        tcp = f"127.0.0.1:{self.port}"
        offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [str(self.binary), "serve", "--data-dir", str(self.data_dir), "--tcp-addr", tcp,
             "--http-addr", "127.0.0.1:0", "--log", "info", *self.extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env={k: v for k, v in os.environ.items() if not k.startswith("FERRYMQ_")},
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
            m = re.search(r"serving the binary protocol tcp=(\S+)", text)
            if m:
                self.addr = m.group(1)
                self.port = int(self.addr.rsplit(":", 1)[1])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"ferrymq serve exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"ferrymq serve did not listen within {STARTUP_S} s")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def binary() -> Path:
    return broker_binary()


@pytest.fixture
def make_broker(binary: Path) -> Iterator[Any]:
    root = Path(tempfile.mkdtemp(prefix="ferrymq-py-"))
    brokers: list[Broker] = []

    def make(*extra_args: str) -> Broker:
        b = Broker(binary, root / f"data{len(brokers)}", tuple(extra_args)).start()
        brokers.append(b)
        return b

    yield make
    for b in brokers:
        b.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def broker(make_broker: Any) -> Broker:
    return make_broker()


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Runs a test coroutine with a bound on its time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
