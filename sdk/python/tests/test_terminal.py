"""Terminals over the WebSocket routes against a real airlockd: an interactive bash, resize,
signals, exit codes, and attaching to a background process."""

from __future__ import annotations

import re

import pytest

from airlock import AirlockError, InvalidRequest, Terminal

from conftest import eventually

# The prompt is set through the environment (bash --norc keeps it); no typed command line
# contains it, so reading up to it means the command has finished. --noediting: lines are read
# by the terminal's own line discipline, not readline, which would redraw the prompt on its own
# (on SIGWINCH, say) and so show a prompt that no command's end produced.
PROMPT = "READY$ "
BASH = ["bash", "--norc", "--noprofile", "--noediting"]



def run(t: Terminal, line: str) -> str:
    """Types `line` and returns what the terminal showed up to the next prompt, without the
    prompt, control sequences (such as bash's bracketed-paste switches) and carriage returns."""
    t.send(line + "\n")
    raw = t.read_until(PROMPT, timeout=15)
    assert b"\r\n" in raw  # a terminal's line discipline, not a pipe
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode("utf-8", "replace")[: -len(PROMPT)])
    return text.replace("\r", "")


def test_bash_session(sbx) -> None:
    with sbx.terminal(BASH, cols=80, rows=24, env={"PS1": PROMPT}) as t:
        assert t.pid is not None and t.pid > 1
        t.read_until(PROMPT, timeout=15)
        out = run(t, "echo $((6*7))")
        assert out.splitlines() == ["echo $((6*7))", "42"]  # the terminal echoes the input
        assert run(t, "stty size").splitlines()[-1] == "24 80"
        assert run(t, "echo $TERM; test -t 0 && test -t 1 && echo tty").splitlines()[-2:] == [
            "xterm-256color", "tty"]
        t.resize(100, 30)
        assert run(t, "stty size").splitlines()[-1] == "30 100"
        # Ctrl-C through the terminal interrupts the foreground job, not the shell.
        t.send("sleep 100\n")
        assert eventually(lambda: sbx.exec("pgrep -x sleep").ok)
        t.send(b"\x03")
        t.read_until(PROMPT, timeout=15)
        assert run(t, "echo $?").splitlines()[-1] == "130"
        assert sbx.exec("pgrep -x sleep").exit_code == 1
        t.send("exit 4\n")
        status = t.wait(15)
        assert (status.exit_code, status.signal, status.timed_out) == (4, None, False)
        while t.recv(5):
            pass  # what came before the exit
        assert t.ended and t.exit_status == status


def test_default_command_is_bash(sbx) -> None:
    with sbx.terminal() as t:
        t.send("echo $((6*7)); exit 0\n")
        t.read_until("42\r\n", timeout=15)  # the echoed line has no 42: this is the output
        assert t.wait(15).exit_code == 0


def test_signal_int_ends_sleep(sbx) -> None:
    with sbx.terminal(["sleep", "100"], cols=40, rows=10) as t:
        t.signal("INT")
        status = t.wait(15)
        assert (status.exit_code, status.signal) == (None, 2)
        assert status.duration_ms < 100_000


def test_closing_the_terminal_kills_its_command(sbx) -> None:
    t = sbx.terminal(["sleep", "100"])
    pid = t.pid
    assert any(p.pid == pid and p.running for p in sbx.processes.list())
    t.close()
    t.close()
    assert eventually(lambda: all(p.pid != pid or not p.running for p in sbx.processes.list()))
    with pytest.raises(AirlockError):
        t.wait(1)


def test_a_command_that_cannot_start(sbx) -> None:
    with pytest.raises(InvalidRequest):
        sbx.terminal(["no-such-program-xyz"])
    with pytest.raises(InvalidRequest):
        sbx.terminal("bash", cols=0)


def test_attach_to_a_background_process(sbx) -> None:
    p = sbx.processes.start("echo hello; cat; echo bye", stdin=True)
    try:
        p.output(follow=True, until="hello", timeout=10)
        with sbx.processes.attach(p.pid) as a:
            assert a.read_until("hello\n", timeout=15) == b"hello\n"  # the replay
            a.send("ping\n")
            assert a.read_until("ping\n", timeout=15) == b"ping\n"  # live, through cat
            a.close_stdin()
            status = a.wait(15)
            assert status.exit_code == 0
            assert a.read_until("bye\n", timeout=5) == b"bye\n"
        assert p.refresh().exited and p.exit_code == 0
    finally:
        _kill_quietly(sbx, p.pid)


def test_detaching_leaves_the_process_running(sbx) -> None:
    p = sbx.processes.start("echo one; sleep 1000")
    try:
        with p.attach() as a:
            assert a.read_until("one\n", timeout=15) == b"one\n"
        assert p.refresh().running
        # Attach without the replay: nothing of the past comes back; a signal ends it.
        with sbx.processes.attach(p.pid, replay=False) as a:
            a.signal("TERM")
            status = a.wait(15)
            assert (status.exit_code, status.signal) == (None, 15)
            assert a.recv(5) == b""
    finally:
        _kill_quietly(sbx, p.pid)


def test_background_process_on_a_terminal(sbx) -> None:
    p = sbx.processes.start("stty size; read x; stty size; cat", pty=(100, 30))
    try:
        assert p.pty and p.running
        assert "30 100" in p.output(follow=True, until="30 100", timeout=15).stdout
        with p.attach(replay=False) as a:
            a.resize(120, 40)
            a.send("go\n")
            a.read_until("40 120\r\n", timeout=15)
            a.send("typed\n")
            assert b"typed" in a.read_until("typed\r\n", timeout=15)  # the terminal's echo
            a.send(b"\x04")  # ^D: end of file on a terminal
            assert a.wait(15).exit_code == 0
    finally:
        _kill_quietly(sbx, p.pid)


def _kill_quietly(sbx, pid: int) -> None:
    try:
        if sbx.processes.get(pid).running:
            sbx.processes.kill(pid)
            sbx.processes.wait(pid, 10)
    except Exception:  # noqa: BLE001 - cleanup must not hide the test's own failure
        pass
