#!/usr/bin/env python3
"""Hostile code in a sandbox: `rm -rf /`, reading the host's secrets, a fork bomb. Each attempt
fails or is contained, the host is untouched (a canary file made on the host beforehand is
intact) and the sandbox still answers.

Config comes from the environment like the SDK: AIRLOCK_URL, AIRLOCK_API_KEY (or the admin.key
file). Run it on the airlockd host (the canary and host checks are local). Exits 0 when every
expectation holds, 1 otherwise.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sys
import tempfile
from typing import List

try:
    from airlock import Sandbox
except ImportError:  # run from a checkout without installing the SDK
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk",
                                    "python"))
    from airlock import Sandbox

failures: List[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main() -> int:
    canary_dir = tempfile.mkdtemp(prefix="hostile-canary-")
    canary = os.path.join(canary_dir, "canary.txt")
    with open(canary, "w") as f:
        f.write(f"host canary {secrets.token_hex(16)}\n")
    canary_sum = digest(canary)
    host_python_sum = digest(sys.executable if os.path.exists(sys.executable) else "/bin/sh")
    print(f"host canary: {canary} (sha256 {canary_sum[:16]}...)")

    try:
        with Sandbox.create(template="base", ttl_seconds=300, pids_max=64, memory_mb=256,
                            metadata={"example": "hostile"}) as sbx:
            print(f"sandbox {sbx.id}\n")

            print("1. rm -rf --no-preserve-root /")
            r = sbx.exec("rm -rf --no-preserve-root / >/dev/null 2>&1; echo rm-exit=$?",
                         timeout_seconds=60)
            print(f"   {r.stdout.strip()}")
            check(r.stdout.strip() != "rm-exit=0", "rm -rf / fails inside the sandbox")
            r = sbx.exec("ls /usr/bin/python3 && touch /usr/bin/evil 2>&1; echo touch-exit=$?")
            print(f"   {r.stdout.strip().splitlines()[-1]}")
            check("/usr/bin/python3" in r.stdout, "the sandbox's /usr survived (read-only)")
            check("touch-exit=0" not in r.stdout, "/usr cannot be written")

            print("2. reading the host's secrets")
            r = sbx.exec("ls -la /root/.ssh 2>&1; echo exit=$?")
            print(f"   ls /root/.ssh -> {r.stdout.strip().splitlines()[-1]}")
            check(not r.stdout.strip().endswith("exit=0"), "/root/.ssh is not readable")
            r = sbx.exec("cat /etc/shadow 2>&1; echo exit=$?")
            print(f"   cat /etc/shadow -> {r.stdout.strip().splitlines()[-1]}")
            check(not r.stdout.strip().endswith("exit=0"), "/etc/shadow is not readable")
            r = sbx.exec(["cat", canary])
            print(f"   cat {canary} -> exit {r.exit_code}: {r.stderr.strip()}")
            check(r.exit_code != 0, "the host's canary is not visible inside the sandbox")

            print("3. a fork bomb (pids_max=64, 5 s timeout)")
            r = sbx.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout_seconds=5)
            print(f"   timed_out={r.timed_out} exit_code={r.exit_code} signal={r.signal} "
                  f"duration={r.duration_ms} ms")
            check(r.timed_out or r.exit_code != 0, "the fork bomb was stopped")
            check(r.duration_ms < 30000, "the fork bomb was stopped at its timeout")

            print("4. afterwards")
            r = sbx.exec("echo alive; ps -e | wc -l", timeout_seconds=30)
            lines = r.stdout.split()
            print(f"   sandbox says {lines[0] if lines else '?'}; processes left: "
                  f"{lines[1] if len(lines) > 1 else '?'}")
            check(r.exit_code == 0 and lines[:1] == ["alive"], "the sandbox still answers")
            check(len(lines) > 1 and int(lines[1]) < 20, "the fork bomb's processes are gone")
        check(os.path.exists(canary) and digest(canary) == canary_sum,
              "the host canary is intact")
        check(os.path.isdir("/usr/bin") and digest(sys.executable) == host_python_sum,
              "the host's /usr is intact")
        check(os.path.isdir("/root") and os.path.isfile("/etc/passwd"),
              "the host's /root and /etc are intact")
    finally:
        shutil.rmtree(canary_dir, ignore_errors=True)

    print()
    if failures:
        print(f"FAILED: {len(failures)} expectation(s): {'; '.join(failures)}")
        return 1
    print("result: OK, every attack was contained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
