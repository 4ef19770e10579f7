"""Sandboxes: create, connect, list, run commands, manage the lifecycle."""

from __future__ import annotations

import base64
import codecs
import json
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Type, Union

from ._http import Client
from .errors import AirlockError, SandboxNotFound, ServerError, error_for_code
from .files import Files
from .processes import Processes, Terminal
from .processes import decode_data as _decode

# Seconds the client waits beyond a command's own timeout before giving up on the answer.
_EXEC_GRACE_SECONDS = 30.0
_SERVER_DEFAULT_EXEC_TIMEOUT = 300.0


def exec_body(
    cmd: Union[str, Sequence[str]],
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    user: Optional[str] = None,
    timeout_seconds: Optional[float] = None,
    stdin: Union[bytes, str, None] = None,
) -> Dict[str, Any]:
    """The exec request's fields: a str is a shell line (`cmd`), a list an `argv`."""
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        body["cmd"] = cmd
    elif isinstance(cmd, (bytes, bytearray)):
        raise TypeError("a command is a str (shell line) or a list of str (argv), not bytes")
    else:
        body["argv"] = list(cmd)
    if cwd is not None:
        body["cwd"] = cwd
    if env is not None:
        body["env"] = dict(env)
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            body["stdin"] = base64.b64encode(bytes(stdin)).decode("ascii")
            body["stdin_encoding"] = "base64"
    if timeout_seconds is not None:
        body["timeout_seconds"] = timeout_seconds
    if user is not None:
        body["user"] = user
    return body


@dataclass
class ExecResult:
    """What a command did. `exit_code` is None when a signal ended it (then `signal` is set)."""

    exit_code: Optional[int]
    signal: Optional[int]
    stdout_bytes: bytes
    stderr_bytes: bytes
    duration_ms: int
    timed_out: bool
    oom_killed: bool
    truncated: bool
    stdout: str = field(init=False)
    stderr: str = field(init=False)

    def __post_init__(self) -> None:
        self.stdout = self.stdout_bytes.decode("utf-8", errors="replace")
        self.stderr = self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ExecResult":
        return cls(
            exit_code=body.get("exit_code"),
            signal=body.get("signal"),
            stdout_bytes=_decode(body.get("stdout"), body.get("stdout_encoding")),
            stderr_bytes=_decode(body.get("stderr"), body.get("stderr_encoding")),
            duration_ms=int(body.get("duration_ms", 0)),
            timed_out=bool(body.get("timed_out", False)),
            oom_killed=bool(body.get("oom_killed", False)),
            truncated=bool(body.get("truncated", False)),
        )


class Sandbox:
    """One sandbox on an airlockd. Use as a context manager to destroy it on leaving:

        with Sandbox.create(template="base", ttl_seconds=600) as sbx:
            print(sbx.exec("echo hi").stdout)
    """

    def __init__(self, client: Client, info: Mapping[str, Any]):
        self._client = client
        self._info: Dict[str, Any] = dict(info)
        self._id: str = str(info["id"])
        self.files = Files(self)
        self.processes = Processes(self)

    # --- construction ---

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        ttl_seconds: Optional[int] = None,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids_max: Optional[int] = None,
        disk_mb: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[Mapping[str, Any]] = None,
        engine: Optional[str] = None,
        auto_hibernate_seconds: Optional[int] = None,
        secrets: Optional[Sequence[Mapping[str, Any]]] = None,
        auto_pause: Optional[Mapping[str, Any]] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Creates a sandbox and returns it running. Unset values take the daemon's defaults
        (template base, TTL 3600 s, 1 CPU, 512 MiB, 256 pids, 1024 MiB disk, no network).
        `network` is the policy: {"mode": "none" | "allowlist" | "open", "allow": [...],
        "deny": [...]}, e.g. {"mode": "allowlist", "allow": ["pypi.org"]}. `engine` is the
        isolation engine (Client.engines() lists them; default: the template's, else the
        daemon's); one that is unavailable or lacks what the sandbox needs is refused
        (Conflict, naming what it lacks). `auto_hibernate_seconds` hibernates the sandbox
        (pause(memory=True)) after that long without a call that uses it; it needs an
        engine with memory_checkpoint (gVisor). `auto_pause` = {"idle_seconds": N, "memory":
        bool} pauses it (memory=True: hibernates it) after N seconds without a call that uses
        it and with no command running; the next exec, file or process call resumes it by
        itself (docs/design/metrics.md). `secrets` binds secrets of the caller's tenant
        (client.secrets): [{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"], "env":
        "GITHUB_TOKEN"}]; the sandbox gets placeholders, the egress proxy the values (network
        mode allowlist, docs/secrets.md)."""
        client = client or Client(url=url, api_key=api_key)
        body: Dict[str, Any] = {}
        for key, value in (
            ("template", template), ("ttl_seconds", ttl_seconds), ("cpus", cpus),
            ("memory_mb", memory_mb), ("pids_max", pids_max), ("disk_mb", disk_mb),
            ("engine", engine), ("auto_hibernate_seconds", auto_hibernate_seconds),
        ):
            if value is not None:
                body[key] = value
        if env is not None:
            body["env"] = dict(env)
        if metadata is not None:
            body["metadata"] = dict(metadata)
        if network is not None:
            body["network"] = dict(network)
        if secrets is not None:
            body["secrets"] = [dict(binding) for binding in secrets]
        if auto_pause is not None:
            body["auto_pause"] = dict(auto_pause)
        return cls(client, client.request("POST", "/v1/sandboxes", json_body=body).json())

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Attaches to an existing sandbox; SandboxNotFound if there is none with that id, or if
        it was destroyed (the error says why it ended: see end_reason)."""
        client = client or Client(url=url, api_key=api_key)
        info = client.request("GET", cls._path_of(sandbox_id)).json()
        if info.get("state") == "destroyed":
            raise SandboxNotFound(
                f"sandbox {sandbox_id} was destroyed ({info.get('end_reason', 'deleted')})",
                404, "not_found")
        return cls(client, info)

    @classmethod
    def list(
        cls,
        state: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        client: Optional[Client] = None,
        tenant: Optional[str] = None,
    ) -> "List[Sandbox]":
        """The sandboxes in `state` (if given) whose metadata holds every given key=value.
        A key sees its own tenant's sandboxes only; an admin key every tenant's, or `tenant`'s."""
        client = client or Client(url=url, api_key=api_key)
        query = []
        if state is not None:
            query.append(("state", state))
        if tenant is not None:
            query.append(("tenant", tenant))
        for key, value in (metadata or {}).items():
            query.append((f"metadata.{key}", value))
        body = client.request("GET", "/v1/sandboxes", query=query).json()
        return [cls(client, info) for info in body["sandboxes"]]

    # --- state ---

    @property
    def id(self) -> str:
        return self._id

    @property
    def client(self) -> Client:
        return self._client

    @property
    def info(self) -> Dict[str, Any]:
        """The sandbox object as last seen (refresh() fetches it again)."""
        return self._info

    @property
    def tenant(self) -> str:
        """The tenant that owns the sandbox (the creating key's)."""
        return str(self._info.get("tenant", ""))

    @property
    def engine(self) -> str:
        """The isolation engine the sandbox runs on ("jail", ...)."""
        return str(self._info.get("engine", ""))

    @property
    def state(self) -> str:
        """The state as last seen: creating, running, paused, destroying, destroyed, failed."""
        return str(self._info.get("state", ""))

    @property
    def metadata(self) -> Dict[str, str]:
        return dict(self._info.get("metadata") or {})

    @property
    def expires_at(self) -> Optional[str]:
        return self._info.get("expires_at")

    @property
    def end_reason(self) -> Optional[str]:
        """Why a destroyed or failed sandbox ended, as last seen: deleted, expired, failed or
        lost; None while it lives. refresh() sees it until the daemon purges the record."""
        reason = self._info.get("end_reason")
        return str(reason) if reason is not None else None

    def refresh(self) -> "Sandbox":
        """Fetches the sandbox's record again; a destroyed one's shows state "destroyed" and its
        end_reason until the daemon purges it (SandboxNotFound after)."""
        self._info = self._client.request("GET", self._path).json()
        return self

    @property
    def network(self) -> Dict[str, Any]:
        """The network policy as last seen (mode, allow, deny, and the sandbox's address)."""
        return dict(self._info.get("network") or {"mode": "none", "allow": [], "deny": []})

    def set_network(self, policy: Mapping[str, Any]) -> "Sandbox":
        """Changes the network policy at once; connections it no longer allows are closed.
        Only for a sandbox created with a network mode other than none."""
        self._info = self._client.request("PATCH", self._path,
                                          json_body={"network": dict(policy)}).json()
        return self

    @property
    def secrets(self) -> List[Dict[str, Any]]:
        """The secrets bound as last seen, each with its placeholder (never a value)."""
        return [dict(binding) for binding in self._info.get("secrets") or []]

    def set_secrets(self, bindings: Sequence[Mapping[str, Any]]) -> "Sandbox":
        """Replaces the secrets bound ([] unbinds all): the next command has their variables,
        the next request their values. A secret bound before keeps its placeholder."""
        self._info = self._client.request(
            "PATCH", self._path, json_body={"secrets": [dict(b) for b in bindings]}).json()
        return self

    def network_events(self, after: int = 0, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The sandbox's network verdicts (proxy and DNS) with a `seq` above `after`, oldest
        first: one page of at most `limit` (the server's default and largest is 1000). Use
        network_events_page to read on, or to see how many were dropped."""
        return list(self.network_events_page(after, limit)["events"])

    def network_events_page(self, after: int = 0, limit: Optional[int] = None) -> Dict[str, Any]:
        """One page of verdicts as the server answers it: `events`, `next_after` (the `after`
        of the next page), `has_more`, `last_seq`, and the counts `dropped` (verdicts lost
        before they were stored) and `trimmed` (removed to keep the newest)."""
        query = [("after", str(int(after)))]
        if limit is not None:
            query.append(("limit", str(int(limit))))
        return dict(self._client.request("GET", self._path + "/network/events", query=query).json())

    def events(
        self,
        after: int = 0,
        types: Optional[Sequence[str]] = None,
        follow: bool = False,
        timeout: Optional[float] = None,
    ) -> Iterator[Dict[str, Any]]:
        """The sandbox's flight recorder: every event with a `seq` above `after`, oldest first,
        each {"seq", "time", "type", "data"} (lifecycle, commands, files, network verdicts,
        processes started inside). `types` keeps only those types; a prefix before a dot takes
        them all ("exec" is exec.start and exec.end). With `follow`, the iterator goes on with
        each event as it is recorded and ends once the sandbox is destroyed (or `timeout`
        seconds pass: Timeout). Readable after the destroy until the daemon purges the record."""
        query = [("after", str(int(after))), ("format", "jsonl")]
        if types:
            query.append(("type", ",".join(types)))
        if follow:
            query.append(("follow", "1"))
        deadline = time.monotonic() + timeout if timeout is not None else float("inf")
        for line in self._client.stream_lines("GET", self._path + "/events", query=query,
                                              deadline=deadline):
            if line.strip():
                yield dict(json.loads(line))

    def events_page(self, after: int = 0, limit: Optional[int] = None,
                    types: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """One page of events as the server answers it: `events`, `next_after`, `has_more`,
        `last_seq`, and the counts `dropped` (lost before they were stored: the log also says
        where, with a recorder.dropped event) and `trimmed` (removed to keep the newest)."""
        query = [("after", str(int(after)))]
        if limit is not None:
            query.append(("limit", str(int(limit))))
        if types:
            query.append(("type", ",".join(types)))
        return dict(self._client.request("GET", self._path + "/events", query=query).json())

    def metrics(self, start: Optional[int] = None, end: Optional[int] = None,
                limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """What the sandbox used, sampled by the daemon every few seconds, oldest first: dicts
        with at_ms, cpu_seconds, cpu_cores, memory_bytes, memory_peak_bytes, pids, disk_bytes,
        net_rx_bytes and net_tx_bytes. `start` and `end` (unix milliseconds) bound them;
        `limit` keeps the newest (server default 1000). Readable after the sandbox is deleted,
        until its record is purged."""
        query = []
        for key, value in (("start", start), ("end", end), ("limit", limit)):
            if value is not None:
                query.append((key, str(int(value))))
        doc = self._client.request("GET", self._path + "/metrics", query=query).json()
        return list(doc["samples"])

    def __repr__(self) -> str:
        return f"Sandbox(id={self._id!r}, state={self.state!r})"

    # --- lifecycle ---

    def kill(self) -> None:
        """Destroys the sandbox. Destroying one that is already gone is not an error."""
        try:
            self._client.request("DELETE", self._path)
        except SandboxNotFound:
            pass
        self._info["state"] = "destroyed"

    def close(self) -> None:
        """Same as kill()."""
        self.kill()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.kill()
        except AirlockError:
            if exc_type is None:
                raise
            # Keep the exception that ended the block; the sandbox's TTL still reclaims it.

    def pause(self, memory: bool = False) -> "Sandbox":
        """Freezes every process in the sandbox (memory is kept in place). With memory=True
        the sandbox hibernates instead: its processes and memory are saved to disk and
        nothing of it runs (state "hibernated") until resume(), which restores it where it
        was. Needs an engine with memory_checkpoint (gVisor); Conflict otherwise, and while
        a command runs in the foreground."""
        body = {"memory": True} if memory else None
        self._info = self._client.request("POST", self._path + "/pause", json_body=body).json()
        return self

    def resume(self) -> "Sandbox":
        """Thaws a paused sandbox, or restores a hibernated one where it was."""
        self._info = self._client.request("POST", self._path + "/resume").json()
        return self

    def set_ttl(self, seconds: int) -> "Sandbox":
        """The sandbox now expires `seconds` from now."""
        self._info = self._client.request(
            "PATCH", self._path, json_body={"ttl_seconds": seconds}
        ).json()
        return self

    def set_limits(self, cpus: Optional[float] = None, memory_mb: Optional[int] = None,
                   pids_max: Optional[int] = None) -> "Sandbox":
        """Changes the limits of the running (or paused) sandbox; those not given stay. Needs an
        engine with live_limits (ConflictError otherwise); an increase must fit the tenant's
        quota (QuotaExceeded). Inside, nproc and /proc/meminfo follow on the jail."""
        limits: Dict[str, Any] = {}
        if cpus is not None:
            limits["cpus"] = cpus
        if memory_mb is not None:
            limits["memory_mb"] = int(memory_mb)
        if pids_max is not None:
            limits["pids_max"] = int(pids_max)
        self._info = self._client.request(
            "PATCH", self._path, json_body={"limits": limits}
        ).json()
        return self

    def set_metadata(self, metadata: Mapping[str, Optional[str]]) -> "Sandbox":
        """Merges `metadata` into the sandbox's: a string sets a key, None removes it."""
        self._info = self._client.request(
            "PATCH", self._path, json_body={"metadata": dict(metadata)}
        ).json()
        return self

    # --- commands ---

    def exec(
        self,
        cmd: Union[str, Sequence[str]],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[bytes, str, None] = None,
        timeout_seconds: Optional[float] = None,
        user: Optional[str] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> ExecResult:
        """Runs a command and waits for it. A string runs through /bin/sh -c; a list is an argv
        (the program looked up in PATH). A non-zero exit is a result, not an exception.

        With `on_stdout` / `on_stderr`, output is streamed: each callback gets text as soon as
        the daemon has it (decoded incrementally, so a character split between two pieces is
        not mangled), and the result still carries all of it. An exception raised by a
        callback stops the command."""
        body = exec_body(cmd, cwd=cwd, env=env, user=user, timeout_seconds=timeout_seconds,
                         stdin=stdin)
        wait = (timeout_seconds or _SERVER_DEFAULT_EXEC_TIMEOUT) + _EXEC_GRACE_SECONDS
        if on_stdout is not None or on_stderr is not None:
            body["stream"] = True
            return self._exec_streamed(body, max(self._client.timeout, wait), on_stdout, on_stderr)
        response = self._client.request(
            "POST", self._path + "/exec", json_body=body,
            timeout=max(self._client.timeout, wait),
        )
        return ExecResult.from_json(response.json())

    def _exec_streamed(
        self,
        body: Dict[str, Any],
        timeout: float,
        on_stdout: Optional[Callable[[str], None]],
        on_stderr: Optional[Callable[[str], None]],
    ) -> ExecResult:
        out = {"stdout": bytearray(), "stderr": bytearray()}
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        decoders = {k: codecs.getincrementaldecoder("utf-8")(errors="replace") for k in out}
        for line in self._client.stream_lines("POST", self._path + "/exec", body, timeout):
            try:
                event = json.loads(line)
            except ValueError as e:
                raise AirlockError(f"the daemon sent a line that is not JSON: {line[:80]!r}") from e
            kind = event.get("type")
            if kind in out:
                data = _decode(event.get("data"), event.get("data_encoding"))
                out[kind] += data
                callback = callbacks[kind]
                if callback is not None:
                    text = decoders[kind].decode(data)
                    if text:
                        callback(text)
            elif kind == "exit":
                for kind_, callback in callbacks.items():
                    rest = decoders[kind_].decode(b"", final=True)
                    if callback is not None and rest:
                        callback(rest)
                return ExecResult(
                    exit_code=event.get("exit_code"),
                    signal=event.get("signal"),
                    stdout_bytes=bytes(out["stdout"]),
                    stderr_bytes=bytes(out["stderr"]),
                    duration_ms=int(event.get("duration_ms", 0)),
                    timed_out=bool(event.get("timed_out")),
                    oom_killed=bool(event.get("oom_killed")),
                    truncated=bool(event.get("truncated")),
                )
            elif kind == "error":
                err = event.get("error") or {}
                raise error_for_code(err.get("code"), err.get("message", "exec failed"))
        raise ServerError("the exec stream ended without an exit event")

    def terminal(
        self,
        cmd: Union[str, Sequence[str]] = "bash",
        *,
        cols: int = 80,
        rows: int = 24,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Terminal:
        """Runs `cmd` on a new terminal of `cols` x `rows` and returns the interactive session
        (over the WebSocket GET .../exec/ws) once the command has started (`pid` is set); a
        command that cannot start raises like exec(). `timeout` (seconds) kills the command
        after that long; closing the session kills it too.

            with sbx.terminal("bash") as t:
                t.send("echo $((6*7))\n")
                t.read_until("42")
        """
        body = exec_body(cmd, cwd=cwd, env=env, user=user, timeout_seconds=timeout)
        body["pty"] = {"cols": int(cols), "rows": int(rows)}
        ws = self._client.websocket(self._path + "/exec/ws")
        session = Terminal(ws)
        try:
            session._send_json(body)
            session._wait_started(self._client.timeout)
        except BaseException:
            session.close()
            raise
        return session

    # --- snapshots and forks ---

    def snapshot(self, name: str) -> Any:
        """Makes template `name` from what this sandbox wrote to its file system (not /tmp);
        the sandbox goes on. Returns the Template."""
        from .templates import Template

        body = self._client.request("POST", self._path + "/snapshot",
                                    json_body={"name": name}).json()
        return Template.from_json(body)

    def fork(self, count: int = 1, ttl_seconds: Optional[int] = None,
             metadata: Optional[Mapping[str, str]] = None,
             memory: bool = False) -> "List[Sandbox]":
        """`count` new sandboxes that start with a copy of this one's file system
        (copy-on-write). Processes and memory are not carried: each fork starts fresh; with
        memory=True they are (each fork goes on from this sandbox's processes, memory and
        /tmp; needs an engine with memory_fork, gVisor, and a sandbox without a network)."""
        body: Dict[str, Any] = {"count": count}
        if memory:
            body["memory"] = True
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        if metadata is not None:
            body["metadata"] = dict(metadata)
        reply = self._client.request("POST", self._path + "/fork", json_body=body).json()
        return [Sandbox(self._client, info) for info in reply["sandboxes"]]

    # --- helpers ---

    @staticmethod
    def _path_of(sandbox_id: str) -> str:
        from urllib.parse import quote

        return "/v1/sandboxes/" + quote(sandbox_id, safe="")

    @property
    def _path(self) -> str:
        return self._path_of(self._id)
