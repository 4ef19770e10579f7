"""Exceptions raised by the SDK; each maps an HTTP status (or a transport failure)."""

from __future__ import annotations

from typing import Optional


class AirlockError(Exception):
    """Base of every SDK error. `status` is the HTTP status (None for transport failures),
    `code` the server's error code (e.g. "not_found"), `message` the server's message."""

    def __init__(self, message: str, status: Optional[int] = None, code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        if self.code:
            return f"{self.code}: {self.message}"
        return self.message


class SandboxNotFound(AirlockError):
    """404: no such sandbox, template, secret or file."""


class AuthError(AirlockError):
    """401/403: missing or invalid API key, or the sandbox refused the operation; also an
    admin.key file that exists but cannot be read."""


class InvalidRequest(AirlockError):
    """400, 405, 413: the request was refused as malformed, out of range or too large."""


class ConflictError(AirlockError):
    """409: the sandbox is in the wrong state for the call (e.g. exec while paused)."""


class QuotaExceeded(AirlockError):
    """429: a tenant quota (or a host limit) was hit; the message says what is used, what was
    asked and what is allowed ("tenant acme: memory 3072 MiB in use + 2048 asked > quota 4096
    MiB")."""


class Timeout(AirlockError):
    """The client gave up waiting (socket timeout), or the daemon answered 504."""


class ServerError(AirlockError):
    """5xx, or the daemon could not be reached."""


def error_for_status(status: int, code: Optional[str], message: str) -> AirlockError:
    """The exception class that matches an HTTP error status."""
    if status == 404:
        return SandboxNotFound(message, status, code)
    if status in (401, 403):
        return AuthError(message, status, code)
    if status in (400, 405, 413):
        return InvalidRequest(message, status, code)
    if status == 409:
        return ConflictError(message, status, code)
    if status == 429:
        return QuotaExceeded(message, status, code)
    if status == 504:
        return Timeout(message, status, code)
    if status >= 500:
        return ServerError(message, status, code)
    return AirlockError(message, status, code)


# The HTTP status of each error code (the daemon's ErrorCode table), for errors that arrive
# inside a 200 stream rather than as a status of their own.
_STATUS_OF_CODE = {
    "invalid_argument": 400,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "failed_precondition": 409,
    "resource_exhausted": 429,
    "too_large": 413,
    "unauthenticated": 401,
    "unimplemented": 501,
    "unavailable": 503,
    "deadline_exceeded": 504,
    "protocol": 502,
    "internal": 500,
}


def error_for_code(code: Optional[str], message: str) -> AirlockError:
    """The exception for an error code reported in a stream's "error" event."""
    return error_for_status(_STATUS_OF_CODE.get(code or "", 500), code, message)
