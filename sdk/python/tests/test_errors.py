"""Every error status maps to its exception, with the server's code and message."""

from __future__ import annotations

import socket

import pytest

from airlock import (AirlockError, AuthError, Client, ConflictError, InvalidRequest, Sandbox,
                     SandboxNotFound, ServerError, Timeout)


def test_404_unknown_sandbox(daemon) -> None:
    with pytest.raises(SandboxNotFound) as e:
        Sandbox.connect("sbx-doesnotexist0000")
    assert isinstance(e.value, AirlockError)
    assert (e.value.status, e.value.code) == (404, "not_found")
    assert "sbx-doesnotexist0000" in e.value.message


def test_401_wrong_key(daemon) -> None:
    with pytest.raises(AuthError) as e:
        Sandbox.list(api_key="not-the-key")
    assert (e.value.status, e.value.code) == (401, "unauthenticated")
    assert e.value.message == "missing or invalid API key"
    with pytest.raises(AuthError):
        Sandbox.create(ttl_seconds=60, url=daemon.url, api_key="wrong")


def test_400_bad_value(daemon) -> None:
    with pytest.raises(InvalidRequest) as e:
        Sandbox.create(cpus=-1)
    assert (e.value.status, e.value.code) == (400, "invalid_argument")
    assert "cpus" in e.value.message
    assert str(e.value).startswith("invalid_argument: ")
    with pytest.raises(InvalidRequest):
        Sandbox.connect("-bad-id")
    with pytest.raises(InvalidRequest):
        Sandbox.list(state="sleeping")


def test_409_exec_on_paused(sbx) -> None:
    sbx.pause()
    with pytest.raises(ConflictError) as e:
        sbx.exec(["true"])
    assert e.value.status == 409
    sbx.resume()


def test_unreachable_daemon_is_server_error() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Client(url=f"http://127.0.0.1:{port}", api_key="k", timeout=5)
    with pytest.raises(ServerError) as e:
        client.list()
    assert e.value.status is None
    assert "cannot reach airlockd" in e.value.message
    with pytest.raises(ServerError):
        Sandbox.create(url=f"http://127.0.0.1:{port}", api_key="k")


def test_client_timeout(sbx, daemon) -> None:
    client = Client(url=daemon.url, api_key=daemon.api_key, timeout=0.5)
    slow = Sandbox.connect(sbx.id, client=client)
    # exec waits for the command's own timeout plus a grace; the client's timeout bounds the rest
    with pytest.raises(Timeout) as e:
        client.request("POST", f"/v1/sandboxes/{sbx.id}/exec",
                       json_body={"cmd": "sleep 3"}, timeout=0.5)
    assert "within 0.5 s" in e.value.message
    assert slow.exec("echo still-here").stdout == "still-here\n"


def test_bad_url() -> None:
    with pytest.raises(InvalidRequest):
        Client(url="ftp://example", api_key="k")
