"""The HTTP transport: configuration, one request per connection, error mapping, retries."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import time
import urllib.parse
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import AirlockError, AuthError, InvalidRequest, ServerError, Timeout, error_for_status

DEFAULT_URL = "http://127.0.0.1:7878"
DEFAULT_STATE_DIR = "/var/lib/airlock"
DEFAULT_TIMEOUT = 60.0

# Idempotent calls are retried this many times in all, sleeping RETRY_BACKOFF, then doubling.
RETRY_ATTEMPTS = 3
RETRY_BACKOFF = 0.1
RETRY_STATUSES = (502, 503, 504)

Query = Union[Mapping[str, str], Sequence[Tuple[str, str]], None]


def resolve_url(url: Optional[str] = None) -> str:
    """The daemon's URL: the argument, else $AIRLOCK_URL, else http://127.0.0.1:7878."""
    return url or os.environ.get("AIRLOCK_URL") or DEFAULT_URL


def resolve_api_key(api_key: Optional[str] = None) -> Optional[str]:
    """The API key: the argument, else $AIRLOCK_API_KEY, else the first line of
    $AIRLOCK_STATE_DIR/admin.key (state dir /var/lib/airlock). None when there is no key file;
    AuthError when the file exists but cannot be read."""
    if api_key:
        return api_key
    env_key = os.environ.get("AIRLOCK_API_KEY")
    if env_key:
        return env_key
    state_dir = os.environ.get("AIRLOCK_STATE_DIR") or DEFAULT_STATE_DIR
    path = os.path.join(state_dir, "admin.key")
    if not os.path.lexists(path):
        return None
    try:
        with open(path, "r", encoding="utf-8") as f:
            line = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise AuthError(
            f"cannot read the API key file {path}: {e}; set AIRLOCK_API_KEY or pass api_key="
        ) from e
    return line or None


class Response:
    """A finished HTTP exchange."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8")) if self.body else None


class Client:
    """A connection to one airlockd. Thread-safe: every request opens its own connection.

    `url` defaults to $AIRLOCK_URL (else http://127.0.0.1:7878), `api_key` to $AIRLOCK_API_KEY
    (else the admin.key file), `timeout` is the socket timeout in seconds for each request."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        self.url = resolve_url(url).rstrip("/")
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise InvalidRequest(f"the Airlock URL must be http://HOST:PORT, got {self.url!r}")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._prefix = parsed.path.rstrip("/")
        self.api_key = resolve_api_key(api_key)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"

    # --- convenience: the sandbox operations bound to this client ---

    def create(self, **kwargs: Any) -> "Any":
        """Sandbox.create(..., client=self)."""
        from .sandbox import Sandbox

        return Sandbox.create(client=self, **kwargs)

    def connect(self, sandbox_id: str) -> "Any":
        """Sandbox.connect(sandbox_id, client=self)."""
        from .sandbox import Sandbox

        return Sandbox.connect(sandbox_id, client=self)

    def list(
        self, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
        tenant: Optional[str] = None,
    ) -> "List[Any]":
        """Sandbox.list(state, metadata, tenant, client=self)."""
        from .sandbox import Sandbox

        return Sandbox.list(state=state, metadata=metadata, tenant=tenant, client=self)

    @property
    def templates(self) -> "Any":
        """The daemon's templates: build, list, get, delete (airlock.templates.Templates)."""
        from .templates import Templates

        return Templates(self)

    @property
    def keys(self) -> "Any":
        """The daemon's API keys: create, list, revoke (airlock.keys.Keys); admin keys only."""
        from .keys import Keys

        return Keys(self)

    @property
    def tenants(self) -> "Any":
        """Tenant quotas and use (airlock.tenants.Tenants): set and remove (admin keys), get
        (an admin key for any tenant, another key for its own)."""
        from .tenants import Tenants

        return Tenants(self)

    @property
    def secrets(self) -> "Any":
        """The tenant's secrets: create, list, get, update, delete (airlock.secrets.Secrets);
        values go in, never come back."""
        from .secrets import Secrets

        return Secrets(self)

    def engines(self) -> "List[Dict[str, Any]]":
        """The daemon's isolation engines (GET /v1/engines): for each, its name, whether it is
        available here (else the reason), whether it is the default, and its capabilities."""
        body = self.request("GET", "/v1/engines").json()
        return list(body.get("engines", []))

    def health(self) -> bool:
        """True when GET /healthz answers {"status": "ok"}."""
        r = self.request("GET", "/healthz")
        body = r.json()
        return isinstance(body, dict) and body.get("status") == "ok"

    # --- the transport ---

    def request(
        self,
        method: str,
        path: str,
        query: Query = None,
        json_body: Any = None,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
        idempotent: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> Response:
        """Sends one request and returns the response, or raises the AirlockError that matches
        its status. Idempotent calls (GET, PUT, DELETE unless told otherwise) are retried on
        connection errors and 502/503/504 with exponential backoff; POST never is."""
        if idempotent is None:
            idempotent = method in ("GET", "PUT", "DELETE", "HEAD")
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload: Optional[bytes] = body
        if json_body is not None:
            payload = json.dumps(json_body).encode("utf-8")
            content_type = "application/json"
        if payload is not None:
            headers["Content-Type"] = content_type or "application/octet-stream"
        attempts = RETRY_ATTEMPTS if idempotent else 1
        delay = RETRY_BACKOFF
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                response = self._send(method, target, headers, payload, timeout or self.timeout)
            except Timeout:
                raise
            except ServerError:
                if last:
                    raise
            else:
                if response.status < 400:
                    return response
                if last or response.status not in RETRY_STATUSES:
                    raise self._error(response)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # the loop returns or raises

    def stream_lines(
        self, method: str, path: str, json_body: Any = None, timeout: Optional[float] = None,
        query: Query = None, deadline: Optional[float] = None,
    ) -> Iterator[bytes]:
        """Sends one request whose answer is streamed (NDJSON) and yields its lines as they
        arrive. An error status raises like request(); never retried.

        `timeout` is the socket timeout (default the client's). With `deadline` (a
        time.monotonic() value, float("inf") for none), reads wait until then however long the
        stream is quiet, and Timeout is raised past it."""
        timeout = timeout or self.timeout
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        headers = {"Accept": "application/x-ndjson"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload: Optional[bytes] = None
        if json_body is not None:
            payload = json.dumps(json_body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        conn = self._connection(timeout)
        try:
            with self._transport_errors(method, target, timeout):
                conn.request(method, target, body=payload, headers=headers)
                sock = conn.sock  # getresponse() may drop conn.sock; the response reads from it
                raw = conn.getresponse()
                if raw.status >= 400:
                    body = raw.read()
                    raise self._error(
                        Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, body))
            while True:
                if deadline is not None and sock is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Timeout(f"{method} {target}: the stream did not end in time")
                    sock.settimeout(None if remaining == float("inf") else remaining)
                try:
                    with self._transport_errors(method, target, timeout):
                        line = raw.readline()
                except Timeout as e:
                    if deadline is not None:
                        raise Timeout(f"{method} {target}: the stream did not end in time") from e
                    raise
                if not line:
                    return
                yield line
        finally:
            conn.close()  # closing early (a consumer that stops) ends the command

    def websocket(self, path: str, query: Query = None, timeout: Optional[float] = None) -> Any:
        """Opens a WebSocket to `path` (the API key in the upgrade's Authorization header) and
        returns the connected _websocket.WebSocket. An error answer to the upgrade raises like
        request(); `timeout` bounds the connect, the handshake and each blocked send."""
        from . import _websocket

        timeout = timeout or self.timeout
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        headers = {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        host = f"[{self._host}]" if ":" in self._host else self._host
        default_port = 443 if self._scheme == "https" else 80
        if self._port != default_port:
            host += f":{self._port}"
        with self._transport_errors("GET", target, timeout):
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
            if self._scheme == "https":
                import ssl

                try:
                    sock = ssl.create_default_context().wrap_socket(
                        sock, server_hostname=self._host)
                except BaseException:
                    sock.close()
                    raise
            try:
                return _websocket.handshake(sock, host, target, headers, timeout)
            except _websocket.HandshakeRefused as e:
                raise self._error(Response(e.status, e.headers, e.body)) from None
            except _websocket.WebSocketError as e:
                raise ServerError(f"GET {target}: the WebSocket upgrade failed: {e}") from e

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn_class = (
            http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        )
        return conn_class(self._host, self._port, timeout=timeout)

    @contextlib.contextmanager
    def _transport_errors(self, method: str, target: str, timeout: float) -> Iterator[None]:
        """Turns socket failures into the SDK's Timeout and ServerError."""
        try:
            yield
        except socket.timeout as e:
            raise Timeout(
                f"{method} {target}: no answer from {self.url} within {timeout:g} s"
            ) from e
        except (OSError, http.client.HTTPException) as e:
            raise ServerError(f"{method} {target}: cannot reach airlockd at {self.url}: {e}") from e

    def _send(
        self, method: str, target: str, headers: Dict[str, str], payload: Optional[bytes],
        timeout: float,
    ) -> Response:
        conn = self._connection(timeout)
        try:
            with self._transport_errors(method, target, timeout):
                conn.request(method, target, body=payload, headers=headers)
                raw = conn.getresponse()
                data = raw.read()
                return Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, data)
        finally:
            conn.close()

    @staticmethod
    def _error(response: Response) -> AirlockError:
        code: Optional[str] = None
        message = ""
        try:
            err = response.json()["error"]
            code = err.get("code")
            message = err.get("message", "")
        except (ValueError, KeyError, TypeError, AttributeError):
            message = response.body.decode("utf-8", "replace").strip()
        if not message:
            message = f"HTTP {response.status}"
        return error_for_status(response.status, code, message)
