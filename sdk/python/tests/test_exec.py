"""Commands: shell strings and argv, stdin, env, cwd, users, timeouts, binary output."""

from __future__ import annotations

import pytest

from airlock import ExecResult, InvalidRequest


def test_shell_string(sbx) -> None:
    r = sbx.exec("python3 -c 'print(6*7)'", timeout_seconds=30)
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (0, None, "42\n", "")
    assert r.ok and not r.timed_out and not r.oom_killed and not r.truncated
    assert r.duration_ms >= 0
    assert r.stdout_bytes == b"42\n"


def test_argv_is_not_a_shell(sbx) -> None:
    r = sbx.exec(["echo", "$HOME", "a b"])
    assert r.stdout == "$HOME a b\n"


def test_exit_code_and_stderr(sbx) -> None:
    r = sbx.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.ok


def test_signal(sbx) -> None:
    r = sbx.exec("kill -9 $$")
    assert r.exit_code is None and r.signal == 9


def test_stdin_text_and_bytes(sbx) -> None:
    assert sbx.exec("tr a-z A-Z", stdin="hello").stdout == "HELLO"
    blob = bytes(range(256))
    r = sbx.exec(["od", "-An", "-tx1", "-v"], stdin=blob)
    assert r.stdout.split() == [f"{b:02x}" for b in blob]


def test_env_cwd_user(sbx) -> None:
    r = sbx.exec("echo $FOO; pwd; id -un", env={"FOO": "bar"}, cwd="/tmp")
    assert r.stdout.splitlines() == ["bar", "/tmp", "user"]
    assert sbx.exec("id -u", user="root").stdout.strip() == "0"


def test_binary_output_is_decoded(sbx) -> None:
    r = sbx.exec("printf '\\377\\000\\001ok'")
    assert r.stdout_bytes == b"\xff\x00\x01ok"
    assert r.stdout == "\ufffd\x00\x01ok"


def test_timeout(sbx) -> None:
    r = sbx.exec("sleep 30", timeout_seconds=0.5)
    assert r.timed_out
    assert r.exit_code is None and r.signal is not None
    assert r.duration_ms < 10000


def test_missing_program_is_invalid_request(sbx) -> None:
    with pytest.raises(InvalidRequest) as e:
        sbx.exec(["no-such-program-xyz"])
    assert e.value.status == 400
    assert sbx.exec("no-such-program-xyz").exit_code == 127


def test_streamed_output_arrives_while_the_command_runs(sbx) -> None:
    # The command waits for a file that the callback writes on seeing the first line: the
    # callback must run before the command ends, or this would time out.
    seen = []

    def on_stdout(text: str) -> None:
        seen.append(("out", text))
        if "first" in text:
            sbx.files.write("/tmp/go", b"1")

    r = sbx.exec(
        "echo first; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo second >&2; exit 5",
        timeout_seconds=20,
        on_stdout=on_stdout,
        on_stderr=lambda text: seen.append(("err", text)),
    )
    assert (r.exit_code, r.stdout, r.stderr) == (5, "first\n", "second\n")
    assert seen == [("out", "first\n"), ("err", "second\n")]
    assert not r.timed_out


def test_streamed_utf8_split_across_pieces_is_not_mangled(sbx) -> None:
    pieces = []
    r = sbx.exec("printf '\\303'; sleep 0.2; printf '\\251\\n'", on_stdout=pieces.append)
    assert r.stdout == "é\n"
    assert "".join(pieces) == "é\n"
    assert "\ufffd" not in "".join(pieces)


def test_streamed_timeout_and_errors(sbx) -> None:
    r = sbx.exec("sleep 30", timeout_seconds=0.5, on_stdout=lambda _: None)
    assert r.timed_out and r.exit_code is None and r.signal is not None
    with pytest.raises(InvalidRequest):
        sbx.exec(["/nonexistent"], on_stdout=lambda _: None)
    # The sandbox still serves plain calls afterwards.
    assert sbx.exec("echo ok").stdout == "ok\n"
