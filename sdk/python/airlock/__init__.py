"""Airlock's Python SDK: run code in disposable, isolated sandboxes on an airlockd.

    from airlock import Sandbox
    with Sandbox.create(template="base", ttl_seconds=600) as sbx:
        print(sbx.exec("python3 -c 'print(6*7)'").stdout)
"""

from ._http import Client
from .errors import (
    AirlockError,
    AuthError,
    ConflictError,
    InvalidRequest,
    SandboxNotFound,
    ServerError,
    Timeout,
)
from .files import FileEntry, Files, UnsafeArchive
from .sandbox import ExecResult, Sandbox

__version__ = "0.1.0"

__all__ = [
    "AirlockError",
    "AuthError",
    "Client",
    "ConflictError",
    "ExecResult",
    "FileEntry",
    "Files",
    "InvalidRequest",
    "Sandbox",
    "SandboxNotFound",
    "ServerError",
    "Timeout",
    "UnsafeArchive",
    "__version__",
]
