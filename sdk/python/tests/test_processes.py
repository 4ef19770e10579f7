"""Background processes against a real airlockd: start, list, get, wait, signals, stdin, output
replay and follow, and a process that outlives the client that started it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import List

import pytest

from airlock import (AirlockError, Client, ConflictError, InvalidRequest, Process,
                     ProcessOutput, Sandbox, SandboxNotFound, Timeout)

from conftest import REPO, eventually

# A command that blocks until the test creates /tmp/go (so its state is the test's to decide).
GATE = "while [ ! -e /tmp/go ]; do sleep 0.02; done"



def test_background_start_list_get_wait(sbx) -> None:
    command = f"echo started; {GATE}; echo $FOO $(pwd); exit 3"
    p = sbx.processes.start(command, cwd="/tmp", env={"FOO": "bar"})
    try:
        assert isinstance(p, Process) and p.pid > 1
        assert (p.state, p.background, p.pty, p.stdin_open) == ("running", True, False, False)
        assert p.command == command and p.started_at
        assert (p.exit_code, p.signal, p.ended_at) == (None, None, None)
        assert p.running and not p.exited and p.exit_status is None

        listed = {q.pid: q for q in sbx.processes.list()}
        assert listed[p.pid].running and listed[p.pid].command == command
        got = sbx.processes.get(p.pid)
        assert (got.pid, got.command, got.state, got.started_at) == (
            p.pid, command, "running", p.started_at)
        assert got.refresh().running

        # It cannot end before /tmp/go exists, so the wait must give up.
        with pytest.raises(Timeout, match=f"process {p.pid} is still running"):
            sbx.processes.wait(p.pid, timeout=0.3)
        with pytest.raises(Timeout):
            p.wait(timeout=0)
        sbx.files.write("/tmp/go", b"")
        assert p.wait(timeout=30) is p  # updated in place
        assert (p.state, p.exit_code, p.signal, p.timed_out, p.oom_killed) == (
            "exited", 3, None, False, False)
        assert p.ended_at and p.ended_at >= p.started_at and p.duration_ms >= 0
        assert p.exit_status is not None and p.exit_status.exit_code == 3 and not p.ok

        # Exited background processes stay listed with their status, after the running ones.
        listed_after = sbx.processes.list()
        mine = [q for q in listed_after if q.pid == p.pid]
        assert len(mine) == 1 and mine[0].exited and mine[0].exit_code == 3
        states = [q.state for q in listed_after]
        assert states == sorted(states, key=lambda s: s != "running")
        out = sbx.processes.output(p.pid)
        assert isinstance(out, ProcessOutput)
        assert (out.stdout, out.stderr) == ("started\nbar /tmp\n", "")
        assert out.exit is not None and out.exit.exit_code == 3 and out.ended
    finally:
        _kill_quietly(sbx, p.pid)


def test_argv_user_and_timeout(sbx) -> None:
    p = sbx.processes.start(["sh", "-c", "id -un; echo $0", "argv0"], user="root")
    assert p.command == "sh -c id -un; echo $0 argv0"  # argv joined with spaces
    p.wait(30)
    assert p.ok and sbx.processes.output(p).stdout == "root\nargv0\n"

    slow = sbx.processes.start("sleep 30", timeout=0.5)
    slow.wait(30)
    assert slow.timed_out and slow.exit_code is None and slow.signal is not None


def test_long_waits_are_a_loop_of_calls(sbx, monkeypatch) -> None:
    # The daemon caps one wait call (300 s); a longer wait is several calls. With the cap made
    # small here, the gate opens only at the third call: one call could not have seen the end.
    from airlock import processes as processes_module

    monkeypatch.setattr(processes_module, "_SERVER_MAX_WAIT_SECONDS", 0.2)
    p = sbx.processes.start(GATE)
    calls: List[float] = []
    real = sbx.client.request

    def counting(method, path, *args, **kwargs):
        if path.endswith("/wait"):
            calls.append(kwargs["json_body"]["timeout_seconds"])
            if len(calls) == 3:
                sbx.files.write("/tmp/go", b"")
        return real(method, path, *args, **kwargs)

    monkeypatch.setattr(sbx.client, "request", counting)
    try:
        assert p.wait(timeout=60).exit_code == 0
        assert len(calls) >= 3 and all(0 < c <= 0.2 for c in calls)
    finally:
        monkeypatch.undo()
        _kill_quietly(sbx, p.pid)


def test_unknown_pid_and_bad_requests(sbx) -> None:
    with pytest.raises(SandboxNotFound) as e:
        sbx.processes.get(999999)
    assert (e.value.status, e.value.code) == (404, "not_found")
    with pytest.raises(SandboxNotFound):
        sbx.processes.kill(999999)
    with pytest.raises(InvalidRequest):
        sbx.processes.start("true", pty=(0, 24))
    with pytest.raises(InvalidRequest):
        sbx.processes.start(["no-such-program-xyz"])
    with pytest.raises(ValueError):
        sbx.processes.get(0)


def test_kill_with_term_and_with_kill(sbx) -> None:
    p = sbx.processes.start(["sleep", "100"])
    try:
        assert p.kill("TERM").pid == p.pid
        p.wait(10)
        assert (p.exit_code, p.signal) == (None, 15)
    finally:
        _kill_quietly(sbx, p.pid)

    # TERM can be ignored, KILL cannot: the process is still there after TERM.
    q = sbx.processes.start("trap '' TERM; echo ready; while :; do sleep 0.05; done")
    try:
        q.output(follow=True, until="ready", timeout=10)
        q.kill("SIGTERM")
        with pytest.raises(Timeout):
            q.wait(0.5)
        assert q.refresh().running
        sbx.processes.kill(q.pid, 9)
        q.wait(10)
        assert (q.exit_code, q.signal) == (None, 9)
    finally:
        _kill_quietly(sbx, q.pid)


def test_stdin_send_and_close_round_trip(sbx) -> None:
    p = sbx.processes.start("cat", stdin=True)
    try:
        assert p.stdin_open
        p.send_stdin("hello ")
        p.send_stdin(b"\xff\x00binary\n")  # not UTF-8: sent as base64
        # cat echoes what it got while its stdin is still open.
        seen = p.output(follow=True, until=b"binary\n", timeout=10)
        assert seen.stdout_bytes == b"hello \xff\x00binary\n" and seen.exit is None
        assert p.refresh().running
        assert p.close_stdin().pid == p.pid
        p.wait(10)
        assert p.exit_code == 0
        assert sbx.processes.output(p.pid).stdout_bytes == b"hello \xff\x00binary\n"
        with pytest.raises(ConflictError) as e:
            p.send_stdin("late")
        assert e.value.code == "failed_precondition"
    finally:
        _kill_quietly(sbx, p.pid)


def test_stdin_without_stdin_open_is_conflict(sbx) -> None:
    p = sbx.processes.start(f"{GATE}")
    try:
        assert not p.stdin_open
        with pytest.raises(ConflictError):
            p.send_stdin("x")
    finally:
        _kill_quietly(sbx, p.pid)


def test_large_stdin_in_pieces(sbx) -> None:
    blob = os.urandom(3 * (1 << 20) + 12345)
    p = sbx.processes.start("sha256sum", stdin=True)
    try:
        p.send_stdin(blob, close=True)
        p.wait(30)
        assert p.ok
        out = sbx.processes.output(p.pid).stdout
        assert out.split()[0] == hashlib.sha256(blob).hexdigest()
    finally:
        _kill_quietly(sbx, p.pid)


def test_initial_stdin_data_is_fed_then_closed(sbx) -> None:
    p = sbx.processes.start("tr a-z A-Z", stdin="hello")
    p.wait(10)
    assert sbx.processes.output(p.pid).stdout == "HELLO"


def test_output_replay_and_follow(sbx) -> None:
    p = sbx.processes.start(f"echo one; echo err1 >&2; {GATE}; echo two; exit 5")
    try:
        p.output(follow=True, until="err1", timeout=10)
        assert eventually(lambda: sbx.processes.output(p.pid).stdout == "one\n")
        replay = sbx.processes.output(p.pid)  # the ring so far; ends while it runs
        assert (replay.stdout, replay.stderr, replay.exit, replay.dropped) == (
            "one\n", "err1\n", None, 0)

        # Follow: the replay, then live output (the callback opens the gate), then the exit.
        pieces: List[str] = []
        errs: List[str] = []

        def on_stdout(text: str) -> None:
            pieces.append(text)
            if "one" in text:
                sbx.files.write("/tmp/go", b"")

        res = p.output(follow=True, on_stdout=on_stdout, on_stderr=errs.append, timeout=30)
        assert (res.stdout, res.stderr) == ("one\ntwo\n", "err1\n")
        assert "".join(pieces) == "one\ntwo\n" and "".join(errs) == "err1\n"
        assert res.exit is not None and (res.exit.exit_code, res.exit.signal) == (5, None)

        after = sbx.processes.output(p.pid)  # follow=False on an exited process: all, then exit
        assert (after.stdout, after.stderr) == ("one\ntwo\n", "err1\n")
        assert after.exit is not None and after.exit.exit_code == 5
    finally:
        _kill_quietly(sbx, p.pid)


def test_follow_stops_at_until_and_detaches(sbx) -> None:
    p = sbx.processes.start("echo alive; sleep 1000")
    try:
        res = p.output(follow=True, until="alive", timeout=10)
        assert res.stdout == "alive\n" and res.exit is None
        assert p.refresh().running  # reading its output and stopping did not end it
        with pytest.raises(Timeout):
            p.output(follow=True, until="never printed", timeout=0.5)
        assert p.refresh().running
    finally:
        _kill_quietly(sbx, p.pid)


def test_ring_keeps_the_last_mebibyte(sbx) -> None:
    total = 3 * (1 << 20)
    p = sbx.processes.start(f"head -c {total} /dev/zero | tr '\\0' a; echo END")
    try:
        p.wait(30)
        out = sbx.processes.output(p.pid)
        assert out.stdout_bytes.endswith(b"aEND\n")
        assert 0 < len(out.stdout_bytes) <= 1 << 20
        assert out.dropped + len(out.stdout_bytes) == total + 4
    finally:
        _kill_quietly(sbx, p.pid)


def test_foreground_exec_is_listed_while_it_runs(sbx) -> None:
    seen: List[List[Process]] = []

    def on_stdout(text: str) -> None:
        if "first" in text:
            seen.append(sbx.processes.list())
            sbx.files.write("/tmp/go", b"")

    r = sbx.exec(f"echo first; {GATE}", timeout_seconds=30, on_stdout=on_stdout)
    assert r.ok and len(seen) == 1
    foreground = [q for q in seen[0] if not q.background and q.running]
    assert any(q.command == f"echo first; {GATE}" for q in foreground)
    assert all(q.command != f"echo first; {GATE}" for q in sbx.processes.list())


def test_a_process_outlives_its_client(sbx, daemon) -> None:
    # Another Python process starts it and exits: nothing of that client is left.
    script = ("import sys\nfrom airlock import Sandbox\n"
              "p = Sandbox.connect(sys.argv[1]).processes.start('echo alive; sleep 1000')\n"
              "print(p.pid)\n")
    env = dict(os.environ, AIRLOCK_URL=daemon.url, AIRLOCK_API_KEY=daemon.api_key,
               PYTHONPATH=os.path.join(REPO, "sdk", "python"))
    proc = subprocess.run([sys.executable, "-c", script, sbx.id], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout)
    try:
        fresh = Sandbox.connect(sbx.id, client=Client(url=daemon.url, api_key=daemon.api_key))
        listed = {q.pid: q for q in fresh.processes.list()}
        assert pid in listed
        p = listed[pid]
        assert p.running and p.background and p.command == "echo alive; sleep 1000"
        assert p.output(follow=True, until="alive", timeout=10).stdout == "alive\n"
        fresh.processes.kill(pid)
        p.wait(10)
        assert (p.state, p.signal) == ("exited", 9)
    finally:
        _kill_quietly(sbx, pid)


def test_process_methods_need_a_sandbox() -> None:
    p = Process(pid=5)
    with pytest.raises(AirlockError, match="not bound"):
        p.refresh()


def _kill_quietly(sbx: Sandbox, pid: int) -> None:
    """Cleanup: ends the process if it still runs (the sandbox fixture destroys the rest)."""
    try:
        if sbx.processes.get(pid).running:
            sbx.processes.kill(pid)
            sbx.processes.wait(pid, 10)
    except Exception:  # noqa: BLE001 - cleanup must not hide the test's own failure
        pass
