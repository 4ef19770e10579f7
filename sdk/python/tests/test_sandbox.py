"""Sandbox lifecycle against a real airlockd: create, connect, list, pause, TTL, metadata."""

from __future__ import annotations

import pytest

from airlock import Client, ConflictError, Sandbox, SandboxNotFound


def test_create_with_every_option_and_context_manager_destroys(daemon) -> None:
    with Sandbox.create(template="base", ttl_seconds=600, cpus=0.5, memory_mb=256,
                        pids_max=64, disk_mb=128, env={"GREETING": "hello"},
                        metadata={"suite": "sdk-tests", "case": "create"}) as sbx:
        assert sbx.id.startswith("sbx-")
        assert sbx.state == "running"
        limits = sbx.info["limits"]
        assert limits == {"cpus": 0.5, "memory_mb": 256, "pids_max": 64, "disk_mb": 128}
        assert sbx.info["template"] == "base"
        assert sbx.metadata == {"suite": "sdk-tests", "case": "create"}
        assert "env" not in sbx.info  # never returned
        assert sbx.exec("echo $GREETING").stdout == "hello\n"
        sid = sbx.id
    with pytest.raises(SandboxNotFound):
        Sandbox.connect(sid)


def test_context_manager_destroys_on_exception(daemon) -> None:
    sid = None
    with pytest.raises(RuntimeError, match="boom"):
        with Sandbox.create(ttl_seconds=600) as sbx:
            sid = sbx.id
            raise RuntimeError("boom")
    assert sid is not None
    with pytest.raises(SandboxNotFound):
        Sandbox.connect(sid)


def test_kill_is_idempotent(daemon) -> None:
    sbx = Sandbox.create(ttl_seconds=600)
    sbx.kill()
    sbx.kill()
    sbx.close()
    assert sbx.state == "destroyed"
    # The record stays readable, with why it ended; connecting to it is refused.
    assert sbx.refresh().state == "destroyed"
    assert sbx.end_reason == "deleted"
    with pytest.raises(SandboxNotFound, match="destroyed"):
        Sandbox.connect(sbx.id)


def test_connect_and_refresh(sbx) -> None:
    other = Sandbox.connect(sbx.id)
    assert other.id == sbx.id
    assert other.info["created_at"] == sbx.info["created_at"]
    other.pause()
    assert sbx.state == "running"  # as last seen
    assert sbx.refresh().state == "paused"
    other.resume()


def test_list_filters_by_state_and_metadata(daemon) -> None:
    with Sandbox.create(ttl_seconds=600, metadata={"suite": "sdk-tests", "team": "a"}) as a, \
            Sandbox.create(ttl_seconds=600, metadata={"suite": "sdk-tests", "team": "b"}) as b:
        ids = {s.id for s in Sandbox.list()}
        assert {a.id, b.id} <= ids
        only_a = Sandbox.list(metadata={"suite": "sdk-tests", "team": "a"})
        assert [s.id for s in only_a] == [a.id]
        b.pause()
        paused = {s.id for s in Sandbox.list(state="paused", metadata={"suite": "sdk-tests"})}
        assert paused == {b.id}
        running = {s.id for s in Sandbox.list(state="running")}
        assert a.id in running and b.id not in running


def test_pause_resume_and_exec_on_paused_is_conflict(sbx) -> None:
    assert sbx.pause().state == "paused"
    with pytest.raises(ConflictError) as e:
        sbx.exec("true")
    assert e.value.status == 409
    assert e.value.code == "failed_precondition"
    assert "paused" in e.value.message
    with pytest.raises(ConflictError):
        sbx.pause()
    assert sbx.resume().state == "running"
    assert sbx.exec("echo back").stdout == "back\n"


def test_set_ttl_moves_the_deadline(sbx) -> None:
    before = sbx.expires_at
    sbx.set_ttl(30)
    assert sbx.expires_at is not None and before is not None
    assert sbx.expires_at < before  # 30 s from now is sooner than 600 s from creation
    sbx.set_ttl(7200)
    assert sbx.expires_at > before


def test_set_metadata_merges_and_removes(sbx) -> None:
    sbx.set_metadata({"owner": "alice", "stage": "1"})
    assert sbx.metadata == {"suite": "sdk-tests", "owner": "alice", "stage": "1"}
    sbx.set_metadata({"stage": None, "owner": "bob"})
    assert sbx.metadata == {"suite": "sdk-tests", "owner": "bob"}
    assert Sandbox.connect(sbx.id).metadata == sbx.metadata


def test_client_object_directly(daemon) -> None:
    client = Client(url=daemon.url, api_key=daemon.api_key, timeout=30)
    assert client.health()
    sbx = client.create(ttl_seconds=600)
    try:
        assert sbx.client is client
        assert client.connect(sbx.id).id == sbx.id
        assert sbx.id in {s.id for s in client.list(state="running")}
        r = client.request("GET", f"/v1/sandboxes/{sbx.id}")
        assert r.status == 200 and r.json()["id"] == sbx.id
    finally:
        sbx.kill()
