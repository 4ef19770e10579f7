#!/usr/bin/env python3
"""A dev server in the background: start `python3 -m http.server` in a sandbox, wait for its
"Serving" line by following its output, fetch a page from a second command in the same sandbox,
then stop the server and show its log.

Everything stays inside the sandbox: the server listens on the sandbox's own loopback
(127.0.0.1 in its network namespace), so nothing leaves the machine.

Config comes from the environment like the SDK: AIRLOCK_URL, AIRLOCK_API_KEY (or the admin.key
file). Exits 0 when the page came back and the server ended as told, 1 otherwise.
"""

from __future__ import annotations

import os
import sys

try:
    from airlock import Sandbox
except ImportError:  # run from a checkout without installing the SDK
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk",
                                    "python"))
    from airlock import Sandbox

PAGE = "<h1>hello from inside the sandbox</h1>\n"
PORT = 8000


def show(prefix: str, text: str) -> None:
    for line in text.rstrip("\n").splitlines():
        print(f"{prefix}{line}")


def main() -> int:
    with Sandbox.create(template="base", ttl_seconds=600,
                        metadata={"example": "dev_server"}) as sbx:
        print(f"sandbox {sbx.id}\n")
        sbx.files.write("site/index.html", PAGE, parents=True)

        # -u: unbuffered, so "Serving ..." is written at once rather than when a buffer fills.
        server = sbx.processes.start(
            ["python3", "-u", "-m", "http.server", str(PORT), "--bind", "127.0.0.1"],
            cwd="/home/user/site")
        print(f"started pid {server.pid}: {server.command}")

        # Follow its output until the line that says it listens (it runs on after that).
        ready = server.output(follow=True, until="Serving", timeout=30,
                              on_stdout=lambda text: show("  server | ", text))
        if ready.ended:
            print(f"the server ended before listening: {ready.exit}")
            show("  server ! ", ready.stderr)
            return 1

        # A second command in the same sandbox talks to it over the sandbox's loopback.
        r = sbx.exec(["curl", "-sS", f"http://127.0.0.1:{PORT}/index.html"], timeout_seconds=30)
        print(f"\n$ curl -sS http://127.0.0.1:{PORT}/index.html   (exit code {r.exit_code})")
        show("  | ", r.stdout + r.stderr)

        print(f"\nlisted: {[(p.pid, p.state, p.command) for p in sbx.processes.list()]}")
        server.kill("TERM")
        server.wait(timeout=10)
        print(f"stopped: state {server.state}, signal {server.signal}")

        log = server.output()  # the ring keeps its output after it exited
        print("server log (stderr):")
        show("  | ", log.stderr)

        ok = (r.ok and r.stdout == PAGE and server.exited and server.signal == 15
              and '"GET /index.html HTTP/1.1" 200' in log.stderr)
    print("\nresult:", "OK" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
