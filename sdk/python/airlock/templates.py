"""Templates: build one from steps, list, get, delete (docs/design/templates.md).

    from airlock import Client, Sandbox, Template
    Client().templates.build(
        "app", workdir="/opt/app", on_output=print,
        steps=[Template.run("mkdir -p /opt/app"),
               Template.copy("/opt/app/main.py", open("main.py").read())])
    with Sandbox.create(template="app") as sbx:
        print(sbx.exec("python3 main.py").stdout)
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from ._http import Client
from .errors import AirlockError, error_for_code


@dataclass
class Template:
    """A template as the daemon describes it."""

    name: str
    state: str  # building, ready, failed
    source: str
    base: str
    layers: List[str]
    root: str = "base"  # "rootfs" when the bottom layer is a Debian or image root file system
    workdir: str = ""
    env_keys: List[str] = field(default_factory=list)
    steps: List[Dict[str, Any]] = field(default_factory=list)
    error: Optional[str] = None
    tenant: Optional[str] = None  # the owning tenant; None for a shared template
    snapshot_after: Optional[str] = None  # the build's, when it made a memory snapshot
    # The memory snapshot its creates restore, in bytes on the daemon's disk (0: they boot).
    memory_snapshot_bytes: int = 0
    info: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Template":
        return cls(name=body["name"], state=body["state"], source=body.get("source", ""),
                   base=body.get("base", "base"), layers=list(body.get("layers", [])),
                   root=body.get("root", "base"), workdir=body.get("workdir", ""), env_keys=list(body.get("env_keys", [])),
                   steps=list(body.get("steps", [])), error=body.get("error"),
                   tenant=body.get("tenant"), snapshot_after=body.get("snapshot_after"),
                   memory_snapshot_bytes=int(body.get("memory_snapshot", {}).get("bytes", 0)),
                   info=dict(body))

    # --- steps, for build() ---

    @staticmethod
    def run(command: str, user: Optional[str] = None,
            timeout_seconds: Optional[float] = None) -> Dict[str, Any]:
        """A step that runs a shell command (as root unless `user` is given)."""
        step: Dict[str, Any] = {"run": command}
        if user is not None:
            step["user"] = user
        if timeout_seconds is not None:
            step["timeout_seconds"] = timeout_seconds
        return step

    @staticmethod
    def copy(path: str, content: Union[bytes, str], mode: Union[int, str, None] = None) -> Dict[str, Any]:
        """A step that writes a file at `path` (absolute) with `content`."""
        copy: Dict[str, Any] = {"path": path}
        if isinstance(content, str):
            copy["content"] = content
        else:
            copy["content"] = base64.b64encode(bytes(content)).decode("ascii")
            copy["encoding"] = "base64"
        if mode is not None:
            copy["mode"] = mode if isinstance(mode, str) else format(mode, "04o")
        return {"copy": copy}


class Templates:
    """The templates of one daemon: `Client().templates`."""

    def __init__(self, client: Client):
        self._client = client

    def build(
        self,
        name: str,
        steps: Sequence[Mapping[str, Any]] = (),
        base: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        start_cmd: Optional[str] = None,
        ready_cmd: Optional[str] = None,
        ready_timeout_seconds: Optional[float] = None,
        snapshot_after: Optional[str] = None,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids_max: Optional[int] = None,
        disk_mb: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        engine: Optional[str] = None,
        on_output: Optional[Callable[[str], None]] = None,
    ) -> Template:
        """Builds a template and returns it ready; a failed step raises (the error names the
        step and ends with its output). `base` is "base", a template, "debian:<suite>" or the
        absolute path of an OCI image archive on the daemon's host (below its image_dir).
        `on_output` gets each piece of the steps' output (decoded text) as the build runs,
        and mmdebstrap's while a Debian base is made. `network` is the build sandbox's policy,
        as Sandbox.create takes it (e.g. {"mode": "allowlist", "allow": ["pypi.org"]}, so that
        a step can install from an index); the template keeps no trace of it, and its
        sandboxes get the network their own create asks for. `engine` is the engine the build
        runs on, and the template's sandboxes' unless their create names another.
        `snapshot_after` makes a memory snapshot (an engine with memory_fork: gVisor): after the
        steps a sandbox of the template runs start_cmd, ready_cmd and then this command; once it
        exits 0 its processes and memory are saved, and every create of the template (and its
        warm pool) restores them instead of booting."""
        body: Dict[str, Any] = {"name": name, "steps": [dict(s) for s in steps], "stream": True}
        for key, value in (("base", base), ("workdir", workdir), ("start_cmd", start_cmd),
                           ("ready_cmd", ready_cmd), ("ready_timeout_seconds", ready_timeout_seconds),
                           ("snapshot_after", snapshot_after),
                           ("cpus", cpus), ("memory_mb", memory_mb), ("pids_max", pids_max),
                           ("disk_mb", disk_mb), ("engine", engine)):
            if value is not None:
                body[key] = value
        if env is not None:
            body["env"] = dict(env)
        if network is not None:
            body["network"] = dict(network)
        for line in self._client.stream_lines("POST", "/v1/templates", json_body=body,
                                              deadline=float("inf")):
            event = json.loads(line)
            kind = event.get("type")
            if kind in ("stdout", "stderr") and on_output is not None:
                data = event.get("data", "")
                if event.get("data_encoding") == "base64":
                    data = base64.b64decode(data).decode("utf-8", errors="replace")
                on_output(data)
            elif kind == "done":
                return Template.from_json(event["template"])
            elif kind == "error":
                err = event.get("error", {})
                raise error_for_code(err.get("code"), err.get("message", "the build failed"))
        raise AirlockError("the daemon's build stream ended without a result")

    def list(self) -> List[Template]:
        body = self._client.request("GET", "/v1/templates").json()
        return [Template.from_json(t) for t in body["templates"]]

    def get(self, name: str) -> Template:
        return Template.from_json(
            self._client.request("GET", "/v1/templates/" + quote(name, safe="")).json())

    def delete(self, name: str) -> None:
        """Deletes a template; ConflictError while a sandbox uses it."""
        self._client.request("DELETE", "/v1/templates/" + quote(name, safe=""))
