"""The transport against a scripted local HTTP server: retries, backoff, timeouts, config."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from typing import Iterator, List, Tuple

import pytest

from airlock import AuthError, Client, InvalidRequest, Sandbox, ServerError, Timeout
from airlock import _http


class Script:
    """Answers requests from a list of (status, body, delay) in turn; records each request."""

    def __init__(self) -> None:
        self.answers: List[Tuple[int, object, float]] = []
        self.requests: List[Tuple[str, str, dict]] = []


@pytest.fixture
def fake() -> Iterator[Tuple[str, Script]]:
    script = Script()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            script.requests.append((self.command, self.path, dict(self.headers)))
            status, body, delay = script.answers.pop(0) if script.answers else (200, {}, 0.0)
            if delay:
                time.sleep(delay)
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


def _unavailable() -> Tuple[int, object, float]:
    return (503, {"error": {"code": "unavailable", "message": "try later"}}, 0.0)


SBX = {"id": "sbx-fake", "state": "running", "metadata": {}}


def test_get_retried_after_two_503s(fake) -> None:
    url, script = fake
    script.answers = [_unavailable(), _unavailable(), (200, SBX, 0.0)]
    start = time.monotonic()
    sbx = Sandbox.connect("sbx-fake", url=url, api_key="k")
    elapsed = time.monotonic() - start
    assert sbx.id == "sbx-fake"
    assert [r[0] for r in script.requests] == ["GET"] * 3
    assert script.requests[0][2]["Authorization"] == "Bearer k"
    assert elapsed >= 0.1 + 0.2 - 0.02  # backoff 0.1 s, then 0.2 s


def test_get_gives_up_after_three_attempts(fake) -> None:
    url, script = fake
    script.answers = [_unavailable()] * 4
    with pytest.raises(ServerError) as e:
        Sandbox.connect("sbx-fake", url=url, api_key="k")
    assert (e.value.status, e.value.code, e.value.message) == (503, "unavailable", "try later")
    assert len(script.requests) == 3


def test_post_is_never_retried(fake) -> None:
    url, script = fake
    script.answers = [_unavailable(), (201, SBX, 0.0)]
    with pytest.raises(ServerError):
        Sandbox.create(url=url, api_key="k")
    assert [r[0] for r in script.requests] == ["POST"]
    script.answers = [(502, {"error": {"code": "protocol_error", "message": "x"}}, 0.0)]
    sbx = Sandbox(Client(url=url, api_key="k"), SBX)
    with pytest.raises(ServerError):
        sbx.exec("true")
    assert [r[0] for r in script.requests] == ["POST", "POST"]


def test_file_put_and_delete_are_retried(fake) -> None:
    url, script = fake
    sbx = Sandbox(Client(url=url, api_key="k"), SBX)
    script.answers = [_unavailable(), (200, {"name": "f", "type": "file", "mode": "0644",
                                             "size": 1, "mtime": "t"}, 0.0)]
    assert sbx.files.write("/f", b"x").name == "f"
    script.answers = [_unavailable(), (204, {}, 0.0)]
    sbx.files.remove("/f")
    assert [r[0] for r in script.requests] == ["PUT", "PUT", "DELETE", "DELETE"]
    assert script.requests[0][1] == "/v1/sandboxes/sbx-fake/files?path=%2Ff"


def test_504_is_timeout_and_other_statuses_map(fake) -> None:
    url, script = fake
    client = Client(url=url, api_key="k")
    script.answers = [(504, {"error": {"code": "deadline_exceeded", "message": "slow"}}, 0.0)]
    with pytest.raises(Timeout) as e:
        client.request("POST", "/v1/sandboxes")
    assert e.value.status == 504 and e.value.message == "slow"
    for status in (405, 413):
        script.answers = [(status, {"error": {"code": "x", "message": "m"}}, 0.0)]
        with pytest.raises(InvalidRequest):
            client.request("POST", "/v1/sandboxes")
    script.answers = [(403, {"error": {"code": "permission_denied", "message": "no"}}, 0.0)]
    with pytest.raises(AuthError):
        client.request("POST", "/v1/sandboxes")
    script.answers = [(500, "not an error body", 0.0)]
    with pytest.raises(ServerError) as e5:
        client.request("POST", "/v1/sandboxes")
    assert e5.value.status == 500 and "not an error body" in e5.value.message


def test_client_socket_timeout(fake) -> None:
    url, script = fake
    script.answers = [(200, SBX, 2.0)]
    start = time.monotonic()
    with pytest.raises(Timeout) as e:
        Client(url=url, api_key="k", timeout=0.3).connect("sbx-fake")
    assert time.monotonic() - start < 1.5  # a timeout is not retried
    assert e.value.status is None
    assert len(script.requests) == 1


def test_connection_refused_is_retried_then_server_error(monkeypatch) -> None:
    calls = []
    real = Client._send

    def counting(self, *args, **kwargs):
        calls.append(args[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Client, "_send", counting)
    with pytest.raises(ServerError):
        Client(url="http://127.0.0.1:1", api_key="k").request("GET", "/healthz")
    assert calls == ["GET"] * 3
    calls.clear()
    with pytest.raises(ServerError):
        Client(url="http://127.0.0.1:1", api_key="k").request("POST", "/v1/sandboxes")
    assert calls == ["POST"]


def test_config_from_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AIRLOCK_URL", "http://10.1.2.3:9999")
    monkeypatch.setenv("AIRLOCK_API_KEY", "env-key")
    c = Client()
    assert (c.url, c.api_key) == ("http://10.1.2.3:9999", "env-key")
    assert Client(url="http://h:1", api_key="arg").api_key == "arg"

    monkeypatch.delenv("AIRLOCK_URL")
    monkeypatch.delenv("AIRLOCK_API_KEY")
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path))
    assert Client().url == _http.DEFAULT_URL
    assert Client().api_key is None  # no key file: no key, the daemon will answer 401
    (tmp_path / "admin.key").write_text("file-key\nsecond line\n")
    assert Client().api_key == "file-key"


def test_unreadable_key_file_is_auth_error(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("AIRLOCK_API_KEY", raising=False)
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path))
    # A directory in its place is unreadable as a file even for root.
    os.mkdir(tmp_path / "admin.key")
    with pytest.raises(AuthError) as e:
        Client()
    assert "cannot read the API key file" in e.value.message
    assert str(tmp_path / "admin.key") in e.value.message
