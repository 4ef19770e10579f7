"""Starts one real airlockd for the test session and points the SDK at it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))

BUILD_DIR = os.path.abspath(os.environ.get("AIRLOCK_BUILD_DIR") or os.path.join(REPO, "build"))
BINARIES = {
    "airlockd": os.path.join(BUILD_DIR, "src/daemon/server/airlockd"),
    "agent": os.path.join(BUILD_DIR, "src/agent/airlock-agent"),
    "launcher": os.path.join(BUILD_DIR, "src/runtime/jail/airlock-jail"),
}


def _skip_reason() -> str:
    if os.geteuid() != 0:
        return "airlockd's jail engine needs root; run the SDK tests as root"
    missing = [p for p in BINARIES.values() if not os.access(p, os.X_OK)]
    if missing:
        return f"airlockd binaries missing (set AIRLOCK_BUILD_DIR; build first): {', '.join(missing)}"
    return ""


class Daemon:
    def __init__(self, url: str, api_key: str, state_dir: str, proc: "subprocess.Popen[bytes]"):
        self.url = url
        self.api_key = api_key
        self.state_dir = state_dir
        self.proc = proc


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    state = tempfile.mkdtemp(prefix="airlock-sdk-test-")
    os.chmod(state, 0o711)
    proc = subprocess.Popen(
        [BINARIES["airlockd"], "--listen", "127.0.0.1:0", "--state-dir", state,
         "--on-shutdown", "destroy", "--log-level", "warn", "--metrics-interval-ms", "500",
         # Its own network id and subnet, and a DNS upstream on loopback: nothing leaves.
         "--network-id", "sdk", "--network-subnet", "10.216.0.0/24",
         "--network-dns", "127.0.0.1:9",
         "--agent", BINARIES["agent"], "--launcher", BINARIES["launcher"]],
        stdout=subprocess.PIPE, stderr=None,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"airlockd did not start (first line {line!r})")
        url = "http://" + line[len("listening on "):]
        with open(os.path.join(state, "admin.key")) as f:
            key = f.readline().strip()
        saved: Dict[str, str] = {k: os.environ[k] for k in ("AIRLOCK_URL", "AIRLOCK_API_KEY")
                                 if k in os.environ}
        os.environ["AIRLOCK_URL"] = url
        os.environ["AIRLOCK_API_KEY"] = key
        yield Daemon(url, key, state, proc)
        for k in ("AIRLOCK_URL", "AIRLOCK_API_KEY"):
            os.environ.pop(k, None)
        os.environ.update(saved)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def sbx(daemon: Daemon) -> Iterator["object"]:
    """A fresh sandbox, destroyed after the test."""
    from airlock import Sandbox

    s = Sandbox.create(template="base", ttl_seconds=600, metadata={"suite": "sdk-tests"})
    try:
        yield s
    finally:
        s.kill()


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Polls `check` until it holds or `timeout` passes (its final answer is returned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()
