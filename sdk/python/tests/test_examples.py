"""The examples run as users would run them, against the session's airlockd."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO

EXAMPLES = os.path.join(REPO, "examples")


def run(daemon, name: str, *args: str, cwd: "str | None" = None) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ, AIRLOCK_URL=daemon.url, AIRLOCK_API_KEY=daemon.api_key,
               PYTHONPATH=os.path.join(REPO, "sdk", "python"))
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def assert_no_sandbox_left(key: str, value: str) -> None:
    from airlock import Sandbox

    assert Sandbox.list(metadata={key: value}) == []


def test_agent_loop(daemon) -> None:
    out = run(daemon, "agent_loop.py").stdout
    assert "[1] model: $ uname -s && python3 --version" in out
    assert "      | Linux" in out
    assert re.search(r"\[3\] model: \$ python3 primes.py 1000\n      \| 168\n      exit code 0",
                     out)
    assert "FINAL ANSWER: There are 168 prime numbers below 1000." in out
    assert out.rstrip().endswith("result: OK")
    assert_no_sandbox_left("example", "agent_loop")


def test_data_analysis(daemon, tmp_path) -> None:
    out = run(daemon, "data_analysis.py", cwd=str(tmp_path)).stdout
    svg = tmp_path / "boxplot.svg"
    assert svg.is_file()
    size = svg.stat().st_size
    assert f"box plot: {svg} ({size} bytes)" in out
    text = svg.read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert text.count("<rect") == 4 and "latency_ms" in text
    assert re.search(r"^queue_len +0\.00 +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d +40\.00$", out, re.M)
    assert "MISMATCH" not in out and out.rstrip().endswith("result: OK")
    assert_no_sandbox_left("example", "data_analysis")


def test_hostile(daemon) -> None:
    out = run(daemon, "hostile.py").stdout
    assert "FAIL" not in out
    for line in ("[ok] rm -rf / fails inside the sandbox", "[ok] /usr cannot be written",
                 "[ok] /root/.ssh is not readable", "[ok] /etc/shadow is not readable",
                 "[ok] the fork bomb was stopped", "[ok] the sandbox still answers",
                 "[ok] the host canary is intact"):
        assert line in out
    assert out.rstrip().endswith("result: OK, every attack was contained")
    canary = re.search(r"host canary: (\S+)", out)
    assert canary and not os.path.exists(canary.group(1))  # cleaned up after itself
    assert_no_sandbox_left("example", "hostile")


def test_dev_server(daemon) -> None:
    out = run(daemon, "dev_server.py").stdout
    assert re.search(r"^started pid \d+: python3 -u -m http\.server 8000 --bind 127\.0\.0\.1$",
                     out, re.M)
    assert "  server | Serving HTTP on 127.0.0.1 port 8000" in out
    assert "  | <h1>hello from inside the sandbox</h1>" in out
    assert "stopped: state exited, signal 15" in out
    assert re.search(r'^  \| 127\.0\.0\.1 - - \[.*\] "GET /index\.html HTTP/1\.1" 200 -$', out, re.M)
    assert out.rstrip().endswith("result: OK")
    assert_no_sandbox_left("example", "dev_server")
