"""Processes in a sandbox: background commands, their stdin, signals and output; terminals.

A background command belongs to the sandbox's agent, not to the client that started it: it runs
on when the client goes away, and any client can list it, feed it, signal it or read its
output (docs/design/processes.md).
"""

from __future__ import annotations

import base64
import codecs
import json
import socket
import time
from collections import abc
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Type, Union)

from . import _websocket
from .errors import AirlockError, InvalidRequest, ServerError, Timeout, error_for_code

if TYPE_CHECKING:
    from .sandbox import Sandbox

# The daemon answers one wait call after at most this long (a longer timeout_seconds is refused);
# longer waits take several calls.
_SERVER_MAX_WAIT_SECONDS = 300.0
# Seconds the client waits beyond a wait call's own timeout before giving up on the answer.
_WAIT_GRACE_SECONDS = 30.0
# Stdin is sent in pieces of at most this many bytes (the daemon takes 4 MiB per request).
_STDIN_CHUNK_BYTES = 1 << 20

PtySize = Union[None, bool, Tuple[int, int], Sequence[int], Mapping[str, int]]


def decode_data(value: Optional[str], encoding: Optional[str]) -> bytes:
    """The bytes of an event's `data` (UTF-8 text, or base64 when `encoding` says so)."""
    if not value:
        return b""
    if encoding == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except (ValueError, TypeError) as e:
            raise AirlockError(f"the daemon sent invalid base64 output: {e}") from e
    return value.encode("utf-8")


def encode_data(data: bytes) -> Dict[str, str]:
    """`data` and `encoding` fields for bytes: UTF-8 text when they are, else base64."""
    try:
        return {"data": data.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"data": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def pty_body(pty: PtySize) -> Optional[Dict[str, int]]:
    """The request's `pty` object from None, True, (cols, rows) or {"cols": .., "rows": ..}."""
    if pty is None or pty is False:
        return None
    if pty is True:
        return {"cols": 80, "rows": 24}
    if isinstance(pty, Mapping):
        unknown = set(pty) - {"cols", "rows"}
        if unknown:
            raise ValueError(f"pty takes cols and rows, not {sorted(unknown)}")
        return {k: int(v) for k, v in pty.items()}
    cols, rows = pty
    return {"cols": int(cols), "rows": int(rows)}


def _signal_value(signal: Union[str, int]) -> Union[str, int]:
    if isinstance(signal, bool) or not isinstance(signal, (str, int)):
        raise TypeError(f"a signal is a name like 'TERM' or a number, got {signal!r}")
    return signal


def _pid(pid: Union[int, "Process"]) -> int:
    if isinstance(pid, Process):
        return pid.pid
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"a pid is a positive int, got {pid!r}")
    return pid


@dataclass
class ExitStatus:
    """How a process ended. `exit_code` is None when a signal ended it (then `signal` is set)."""

    exit_code: Optional[int]
    signal: Optional[int]
    duration_ms: int = 0
    timed_out: bool = False
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """The process exited with status 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ExitStatus":
        return cls(
            exit_code=body.get("exit_code"),
            signal=body.get("signal"),
            duration_ms=int(body.get("duration_ms") or 0),
            timed_out=bool(body.get("timed_out", False)),
            oom_killed=bool(body.get("oom_killed", False)),
        )


@dataclass
class ProcessOutput:
    """What output() read: the output bytes of each stream, `exit` when the process had ended
    (None while it runs on), and `dropped`, the bytes overwritten in the ring before they could
    be read."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    exit: Optional[ExitStatus]
    dropped: int = 0

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ended(self) -> bool:
        return self.exit is not None


@dataclass
class Process:
    """A process in the sandbox as last seen (docs/design/processes.md). `state` is running or
    exited; the exit fields are set once it has exited (`exit_code` None when a signal ended
    it). The methods act on the process through the sandbox it came from and update this
    object with the answer."""

    pid: int
    command: str = ""
    state: str = "running"
    background: bool = False
    pty: bool = False
    stdin_open: bool = False
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    duration_ms: int = 0
    _processes: Optional["Processes"] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any],
                  processes: Optional["Processes"] = None) -> "Process":
        return cls(
            pid=int(body["pid"]),
            command=str(body.get("command", "")),
            state=str(body.get("state", "")),
            background=bool(body.get("background", False)),
            pty=bool(body.get("pty", False)),
            stdin_open=bool(body.get("stdin_open", False)),
            started_at=body.get("started_at"),
            ended_at=body.get("ended_at"),
            exit_code=body.get("exit_code"),
            signal=body.get("signal"),
            timed_out=bool(body.get("timed_out", False)),
            oom_killed=bool(body.get("oom_killed", False)),
            duration_ms=int(body.get("duration_ms") or 0),
            _processes=processes,
        )

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def exited(self) -> bool:
        return self.state == "exited"

    @property
    def ok(self) -> bool:
        """The process exited with status 0."""
        return self.exited and self.exit_code == 0

    @property
    def exit_status(self) -> Optional[ExitStatus]:
        if not self.exited:
            return None
        return ExitStatus(self.exit_code, self.signal, self.duration_ms, self.timed_out,
                          self.oom_killed)

    # --- bound to the sandbox ---

    def _bound(self) -> "Processes":
        if self._processes is None:
            raise AirlockError("this Process is not bound to a sandbox")
        return self._processes

    def _update(self, other: "Process") -> "Process":
        for f in fields(self):
            if f.name != "_processes":
                setattr(self, f.name, getattr(other, f.name))
        return self

    def refresh(self) -> "Process":
        """Fetches the process's entry again."""
        return self._update(self._bound().get(self.pid))

    def wait(self, timeout: Optional[float] = 30.0) -> "Process":
        """Waits until the process exits (Timeout if it still runs after `timeout` seconds;
        None waits as long as it takes)."""
        return self._update(self._bound().wait(self.pid, timeout))

    def kill(self, signal: Union[str, int] = "KILL") -> "Process":
        """Sends `signal` (a name like "TERM", or a number) to the process's group."""
        return self._update(self._bound().kill(self.pid, signal))

    def send_stdin(self, data: Union[str, bytes], *, close: bool = False) -> "Process":
        """Writes to the process's stdin (started with stdin=True), then closes it with
        close=True."""
        return self._update(self._bound().send_stdin(self.pid, data, close=close))

    def close_stdin(self) -> "Process":
        return self._update(self._bound().close_stdin(self.pid))

    def output(
        self,
        *,
        follow: bool = False,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        until: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
    ) -> ProcessOutput:
        """Processes.output() for this process: its recent output, then with follow=True live
        output until it exits (or until `until` appears)."""
        return self._bound().output(self.pid, follow=follow, on_stdout=on_stdout,
                                    on_stderr=on_stderr, until=until, timeout=timeout)

    def attach(self, replay: bool = True) -> "Terminal":
        """Processes.attach(pid) for this process."""
        return self._bound().attach(self.pid, replay=replay)


class Processes:
    """`sandbox.processes`: start background commands and act on any process by pid."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    @property
    def _path(self) -> str:
        return self._sandbox._path + "/processes"

    def _process(self, body: Any) -> Process:
        return Process.from_json(body, self)

    def start(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        pty: PtySize = None,
        stdin: Union[bool, str, bytes] = False,
    ) -> Process:
        """Starts a command in the background and returns at once with its Process.

        A string runs through /bin/sh -c; a list is an argv. Without `timeout` (seconds) it runs
        until it ends or is killed. `pty` = (cols, rows) or {"cols", "rows"} runs it on a
        terminal (stdout and stderr are then one stream). `stdin=True` keeps its stdin open for
        send_stdin(); str or bytes are fed to it and then it is closed; False: /dev/null."""
        from .sandbox import exec_body

        body = exec_body(cmd, cwd=cwd, env=env, user=user, timeout_seconds=timeout,
                         stdin=None if isinstance(stdin, bool) else stdin)
        body["background"] = True
        if stdin is True:
            body["stdin_open"] = True
        size = pty_body(pty)
        if size is not None:
            body["pty"] = size
        r = self._sandbox.client.request("POST", self._sandbox._path + "/exec", json_body=body)
        return self._process(r.json())

    def list(self) -> List[Process]:
        """Running processes (background and foreground), then the exited background ones the
        sandbox still remembers (the last 64)."""
        body = self._sandbox.client.request("GET", self._path).json()
        return [self._process(p) for p in body["processes"]]

    def get(self, pid: Union[int, Process]) -> Process:
        """The process's entry; SandboxNotFound (404) when the sandbox does not know the pid."""
        return self._process(
            self._sandbox.client.request("GET", f"{self._path}/{_pid(pid)}").json())

    def wait(self, pid: Union[int, Process], timeout: Optional[float] = 30.0) -> Process:
        """Waits until the process has exited and returns its entry. Timeout if it still runs
        after `timeout` seconds (None: as long as it takes; 0: just look)."""
        pid = _pid(pid)
        deadline = None if timeout is None else time.monotonic() + timeout
        client = self._sandbox.client
        while True:
            if deadline is None:
                chunk = _SERVER_MAX_WAIT_SECONDS
            else:
                chunk = min(_SERVER_MAX_WAIT_SECONDS, round(deadline - time.monotonic(), 3))
            if chunk <= 0:
                process = self.get(pid)
            else:
                process = self._process(client.request(
                    "POST", f"{self._path}/{pid}/wait", json_body={"timeout_seconds": chunk},
                    timeout=max(client.timeout, chunk + _WAIT_GRACE_SECONDS)).json())
            if process.exited:
                return process
            if deadline is not None and time.monotonic() >= deadline - 0.001:
                raise Timeout(f"process {pid} is still running after {timeout:g} s")

    def kill(self, pid: Union[int, Process], signal: Union[str, int] = "KILL") -> Process:
        """Sends `signal` ("TERM", "SIGINT", 9, ...) to the process's group; its entry after.
        The process may take a moment to end: wait() for it."""
        return self._process(self._sandbox.client.request(
            "POST", f"{self._path}/{_pid(pid)}/signal",
            json_body={"signal": _signal_value(signal)}).json())

    def send_stdin(self, pid: Union[int, Process], data: Union[str, bytes], *,
                   close: bool = False) -> Process:
        """Writes `data` to the process's stdin (text as UTF-8; bytes that are not UTF-8 go as
        base64), then closes it with close=True. ConflictError (409) when its stdin is not
        open. Large data is sent in several requests, in order."""
        pid = _pid(pid)
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        pieces = [raw[i:i + _STDIN_CHUNK_BYTES]
                  for i in range(0, len(raw), _STDIN_CHUNK_BYTES)] or [b""]
        process: Optional[Process] = None
        for i, piece in enumerate(pieces):
            body: Dict[str, Any] = encode_data(piece)
            body["close"] = close and i == len(pieces) - 1
            process = self._process(self._sandbox.client.request(
                "POST", f"{self._path}/{pid}/stdin", json_body=body).json())
        assert process is not None
        return process

    def close_stdin(self, pid: Union[int, Process]) -> Process:
        """Closes the process's stdin (it reads end-of-file)."""
        return self.send_stdin(pid, b"", close=True)

    def output(
        self,
        pid: Union[int, Process],
        *,
        follow: bool = False,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        until: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
    ) -> ProcessOutput:
        """A background process's output: what its ring buffer holds (the last 1 MiB), then,
        with follow=True, live output until it exits.

        The callbacks get text as it arrives (decoded incrementally, like exec's). With `until`,
        reading stops (the process runs on) as soon as stdout or stderr contains that text.
        `timeout` (seconds) bounds the whole call and raises Timeout; without it a follow waits
        as long as the process runs, and a plain read uses the client's timeout. The result has
        `exit` set when the process had ended."""
        pid = _pid(pid)
        pattern = until.encode("utf-8") if isinstance(until, str) else until
        if pattern == b"":
            raise ValueError("until must not be empty")
        out = {"stdout": bytearray(), "stderr": bytearray()}
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        decoders = {k: codecs.getincrementaldecoder("utf-8")(errors="replace") for k in out}
        dropped = 0
        exit_status: Optional[ExitStatus] = None
        if timeout is not None:
            deadline: Optional[float] = time.monotonic() + timeout
        else:
            deadline = float("inf") if follow else None
        query = [("follow", "true" if follow else "false")]

        def flush() -> None:
            for kind, callback in callbacks.items():
                rest = decoders[kind].decode(b"", final=True)
                if callback is not None and rest:
                    callback(rest)

        lines = self._sandbox.client.stream_lines(
            "GET", f"{self._path}/{pid}/output", query=query, deadline=deadline)
        try:
            for line in lines:
                event = _parse_event(line)
                kind = event.get("type")
                if kind in out:
                    data = decode_data(event.get("data"), event.get("data_encoding"))
                    seen = len(out[kind])
                    out[kind] += data
                    callback = callbacks[kind]
                    if callback is not None:
                        text = decoders[kind].decode(data)
                        if text:
                            callback(text)
                    if pattern is not None and out[kind].find(
                            pattern, max(0, seen - len(pattern) + 1)) >= 0:
                        break
                elif kind == "dropped":
                    dropped += int(event.get("bytes") or 0)
                elif kind == "exit":
                    exit_status = ExitStatus.from_json(event)
                    break
                elif kind == "error":
                    err = event.get("error") or {}
                    raise error_for_code(err.get("code"), err.get("message", "output failed"))
        finally:
            if hasattr(lines, "close"):
                lines.close()  # detaches: the process runs on
        flush()
        return ProcessOutput(bytes(out["stdout"]), bytes(out["stderr"]), exit_status, dropped)

    def attach(self, pid: Union[int, Process], *, replay: bool = True,
               timeout: Optional[float] = None) -> "Terminal":
        """A Terminal on a running process (over GET .../processes/{pid}/ws): with replay, its
        ring buffer's output first (background processes), then live output; send() writes to
        its stdin. Closing it detaches: the process runs on."""
        ws = self._sandbox.client.websocket(
            f"{self._path}/{_pid(pid)}/ws", query=[("replay", "true" if replay else "false")],
            timeout=timeout)
        return Terminal(ws, pid=_pid(pid))


def _parse_event(line: Union[bytes, str]) -> Dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as e:
        raise AirlockError(f"the daemon sent an event that is not JSON: {line[:80]!r}") from e
    if not isinstance(event, dict):
        raise AirlockError(f"the daemon sent an event that is not an object: {line[:80]!r}")
    return event


class Terminal:
    """An interactive session over a WebSocket: a command on a terminal (Sandbox.terminal), or
    an attachment to a running process (Processes.attach).

    send() writes to the command's stdin; recv() returns its output as it comes (stdout and
    stderr together; on a terminal they are one stream anyway); wait() returns its ExitStatus.
    Closing the session of Sandbox.terminal kills the command; closing an attachment only
    detaches. Use it as a context manager to close it on leaving. Output that wait() or
    read_until() read past stays buffered for the next recv()."""

    def __init__(self, ws: "_websocket.WebSocket", pid: Optional[int] = None):
        self._ws = ws
        self.pid = pid
        self.dropped = 0
        self._pending = bytearray()
        self._exit: Optional[ExitStatus] = None
        self._error: Optional[AirlockError] = None
        self._ended = False

    # --- state ---

    @property
    def exit_status(self) -> Optional[ExitStatus]:
        """How the command ended, once the session has seen it (else None)."""
        return self._exit

    @property
    def ended(self) -> bool:
        """The session has seen the command's end (or an error, or the connection closing)."""
        return self._ended

    # --- input ---

    def _send_json(self, message: Mapping[str, Any]) -> None:
        self._guard(lambda: self._ws.send_text(json.dumps(message)))

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except socket.timeout as e:
            raise Timeout("the terminal's connection did not take the message in time") from e
        except (OSError, _websocket.WebSocketError) as e:
            raise ServerError(f"the terminal's connection is closed: {e}") from e

    def send(self, data: Union[str, bytes]) -> None:
        """Writes `data` to the command's stdin (text as UTF-8), as one binary message."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._guard(lambda: self._ws.send_binary(raw))

    def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal's size (the command gets SIGWINCH)."""
        self._send_json({"type": "resize", "cols": int(cols), "rows": int(rows)})

    def signal(self, signal: Union[str, int]) -> None:
        """Sends `signal` ("INT", "TERM", 9, ...) to the command's process group."""
        self._send_json({"type": "signal", "signal": _signal_value(signal)})

    def close_stdin(self) -> None:
        """Closes the command's stdin (on a terminal: sends end-of-file)."""
        self._send_json({"type": "stdin_close"})

    # --- output ---

    def _next_event(self, deadline: Optional[float]) -> None:
        """Reads one message and applies it; Timeout past `deadline`."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            message = self._ws.recv(timeout)
        except socket.timeout as e:
            raise Timeout("no output from the terminal in time") from e
        except (OSError, _websocket.WebSocketError) as e:
            self._end(ServerError(f"the terminal's connection failed: {e}"))
            return
        if message is None:
            if self._exit is None and self._error is None:
                code = self._ws.close_code
                reason = self._ws.close_reason
                self._error = ServerError(
                    f"the terminal's connection closed (code {code}"
                    + (f": {reason}" if reason else "") + ") before the command's exit")
            self._ended = True
            return
        opcode, payload = message
        if opcode == _websocket.OP_BINARY:
            self._pending += payload  # the contract sends JSON; raw bytes are taken as output
            return
        # One event per message; a message holding several NDJSON lines is taken line by line.
        for line in payload.split(b"\n"):
            if line.strip():
                self._apply(_parse_event(line))

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "start":
            if event.get("pid") is not None:
                self.pid = int(event["pid"])
        elif kind in ("stdout", "stderr"):
            self._pending += decode_data(event.get("data"), event.get("data_encoding"))
        elif kind == "dropped":
            self.dropped += int(event.get("bytes") or 0)
        elif kind == "exit":
            self._exit = ExitStatus.from_json(event)
            self._ended = True
        elif kind == "error":
            err = event.get("error") or {}
            self._end(error_for_code(err.get("code"), err.get("message", "the command failed")))

    def _wait_started(self, timeout: float) -> None:
        """Reads events until the "start" event (which sets pid); the session's error if the
        command could not start. Output that came with it stays for recv()."""
        deadline = time.monotonic() + timeout
        while self.pid is None and not self._ended:
            self._next_event(deadline)
        if self.pid is None and self._error is not None:
            raise self._error

    def _end(self, error: AirlockError) -> None:
        if self._error is None and self._exit is None:
            self._error = error
        self._ended = True

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next output bytes: those waiting, else the next to arrive. b"" once the command
        has ended and everything was read. Timeout when nothing came within `timeout` seconds
        (None: wait as long as it takes). A session that failed (the command could not start,
        the connection broke) raises its error once its output is read."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return b""
            self._next_event(deadline)
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def read_until(self, pattern: Union[str, bytes], timeout: Optional[float] = 10.0) -> bytes:
        """Reads until `pattern` (text as UTF-8) has appeared, and returns everything read
        through it; what came after it stays for the next recv(). Timeout when it did not appear
        within `timeout` seconds; AirlockError when the command ended first (the bytes read
        stay for recv() in both cases)."""
        needle = pattern.encode("utf-8") if isinstance(pattern, str) else bytes(pattern)
        if not needle:
            raise ValueError("pattern must not be empty")
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = bytearray()
        while True:
            start = max(0, len(seen) - len(needle) + 1)
            try:
                chunk = self.recv(None if deadline is None
                                  else max(0.0, deadline - time.monotonic()))
            except Timeout:
                self._pending[:0] = seen
                raise Timeout(f"{needle!r} did not appear within {timeout:g} s; the last output "
                              f"was {bytes(seen[-200:])!r}") from None
            except AirlockError:
                self._pending[:0] = seen
                raise
            if not chunk:
                self._pending[:0] = seen
                raise AirlockError(f"the command ended before {needle!r} appeared; its last "
                                   f"output was {bytes(seen[-200:])!r}")
            seen += chunk
            found = seen.find(needle, start)
            if found >= 0:
                end = found + len(needle)
                self._pending[:0] = seen[end:]
                return bytes(seen[:end])

    def wait(self, timeout: Optional[float] = 30.0) -> ExitStatus:
        """Waits for the command's end and returns how it ended (output that arrives meanwhile
        is kept for recv()). Timeout if it still runs after `timeout` seconds (None: wait as
        long as it takes); the session's error if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended:
            try:
                self._next_event(deadline)
            except Timeout:
                raise Timeout(f"the command still runs after {timeout:g} s") from None
        if self._exit is None:
            assert self._error is not None
            raise self._error
        return self._exit

    def __iter__(self) -> Iterator[bytes]:
        """The output, piece by piece, until the command ends."""
        while True:
            data = self.recv()
            if not data:
                return
            yield data

    # --- closing ---

    def close(self) -> None:
        """Closes the session (the close handshake). For Sandbox.terminal this ends the
        command if it still runs; for an attachment the process runs on. Idempotent."""
        self._ws.close()
        self._ended = True
        if self._exit is None and self._error is None:
            self._error = AirlockError("the terminal was closed")

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Terminal(pid={self.pid!r}, ended={self._ended!r})"
