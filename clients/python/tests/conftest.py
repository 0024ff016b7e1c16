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


_port_seq = 0


def reserved_port() -> int:
    """A loopback port nothing listens on, chosen before the process that will listen on it
    starts (the nodes of a cluster must know each other's addresses first). It comes from
    below the kernel's ephemeral range, where listeners bound to port 0 (the nodes' HTTP
    listeners) never land; the process id spreads concurrent runs apart."""
    global _port_seq
    base = 20000 + (os.getpid() * 131 + 3000) % 10000
    for _ in range(3000):
        port = base + _port_seq % 2700
        _port_seq += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Cluster:
    """Three (or ``size``) ``ferrymq serve`` nodes of one cluster on 127.0.0.1; each keeps its
    ports and data directory across restarts. ``addrs`` are their client addresses, node
    ``i + 1`` at ``addrs[i]``."""

    def __init__(self, binary: Path, root: Path, size: int = 3) -> None:
        self.nodes: list[Broker] = []
        last: Optional[Exception] = None
        for attempt in range(3):
            try:
                self._start(binary, root / f"try{attempt}", size)
                return
            except RuntimeError as e:  # a port taken in between: other ports
                last = e
                self.stop()
                self.nodes = []
        raise RuntimeError(f"a cluster of {size} did not start: {last}")

    def _start(self, binary: Path, root: Path, size: int) -> None:
        # Elections after 1 to 1.5 s of silence: on a loaded machine a shorter timeout lets
        # starved heartbeats start elections again and again.
        root.mkdir(parents=True)
        tcp = [reserved_port() for _ in range(size)]
        peers = [f"{i + 1}=127.0.0.1:{reserved_port()}" for i in range(size)]
        for i in range(size):
            b = Broker(binary, root / f"node{i + 1}", (
                "--node-id", str(i + 1), "--cluster-addr", peers[i].split("=", 1)[1],
                "--peers", ",".join(peers), "--election-timeout-ms", "1000",
            ))  # fmt: skip
            b.port = tcp[i]
            self.nodes.append(b)
            b.start()

    @property
    def addrs(self) -> list[str]:
        return [f"127.0.0.1:{b.port}" for b in self.nodes]

    def kill(self, node_id: int) -> None:
        """kill -9 of node ``node_id``."""
        self.nodes[node_id - 1].stop(kill=True)

    def stop(self) -> None:
        for b in self.nodes:
            b.stop(kill=True)

    def warnings(self) -> str:
        """What the nodes logged at WARN and ERROR, for a failure's message."""
        out = []
        for i, b in enumerate(self.nodes):
            if b.log_path.exists():
                for line in b.log_path.read_text("utf-8", "replace").splitlines():
                    if "WARN" in line or "ERROR" in line:
                        out.append(f"node {i + 1}: {line}")
        return "\n".join(out[-80:])


@pytest.fixture
def cluster(binary: Path) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="ferrymq-py-cluster-"))
    c = Cluster(binary, root)
    yield c
    c.stop()
    shutil.rmtree(root, ignore_errors=True)


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Runs a test coroutine with a bound on its time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
