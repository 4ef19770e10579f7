"""Airlock's Python SDK: run code in disposable, isolated sandboxes on an airlockd.

    from airlock import Sandbox
    with Sandbox.create(template="base", ttl_seconds=600) as sbx:
        print(sbx.exec("python3 -c 'print(6*7)'").stdout)
        server = sbx.processes.start("python3 -m http.server 8000")   # runs on in the background
        with sbx.terminal("bash") as t:                                # an interactive terminal
            t.send("echo $((6*7))\n"); t.read_until("42")
"""

from ._http import Client
from .errors import (
    AirlockError,
    AuthError,
    ConflictError,
    InvalidRequest,
    QuotaExceeded,
    SandboxNotFound,
    ServerError,
    Timeout,
)
from .files import FileEntry, Files, UnsafeArchive
from .keys import ApiKey, Keys
from .processes import ExitStatus, Process, Processes, ProcessOutput, Terminal
from .sandbox import ExecResult, Sandbox
from .secrets import SecretInfo, Secrets
from .templates import Template, Templates
from .tenants import TenantInfo, Tenants

__version__ = "0.1.0"

__all__ = [
    "AirlockError",
    "ApiKey",
    "AuthError",
    "Client",
    "ConflictError",
    "ExecResult",
    "ExitStatus",
    "FileEntry",
    "Files",
    "InvalidRequest",
    "Keys",
    "Process",
    "ProcessOutput",
    "Processes",
    "QuotaExceeded",
    "Sandbox",
    "Template",
    "Templates",
    "TenantInfo",
    "Tenants",
    "SandboxNotFound",
    "SecretInfo",
    "Secrets",
    "ServerError",
    "Terminal",
    "Timeout",
    "UnsafeArchive",
    "__version__",
]
