"""The flight recorder through the SDK against a real airlockd: a sandbox's events as pages, as
an iterator, followed live until the sandbox ends, and still readable after it is gone."""

from __future__ import annotations

import threading

import pytest

from airlock import InvalidRequest, Sandbox, SandboxNotFound


def _api_types(events):
    return [e["type"] for e in events if not e["type"].startswith(("net.", "proc."))]


def test_events_record_commands_and_files_and_outlive_the_sandbox(daemon) -> None:
    sbx = Sandbox.create(ttl_seconds=600, metadata={"suite": "sdk-tests"})
    try:
        assert sbx.exec("echo one", env={"TOKEN": "never-on-record"}).stdout == "one\n"
        sbx.files.write("/tmp/f.txt", b"abc")
        events = list(sbx.events())
        assert _api_types(events) == ["sandbox.created", "exec.start", "exec.end", "file.write"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        start = next(e for e in events if e["type"] == "exec.start")
        assert start["data"]["cmd"] == "echo one"
        assert start["data"]["env"] == ["TOKEN"]
        assert "never-on-record" not in str(events)
        write = next(e for e in events if e["type"] == "file.write")
        assert write["data"]["size"] == 3
        assert write["data"]["sha256"] == (
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        # A filter, and a page.
        assert [e["type"] for e in sbx.events(types=["exec"])] == ["exec.start", "exec.end"]
        page = sbx.events_page(limit=1)
        assert len(page["events"]) == 1 and page["has_more"] and page["dropped"] == 0
    finally:
        sbx.kill()
    # Gone, but its record and its log stay readable.
    assert sbx.refresh().state == "destroyed"
    assert sbx.end_reason == "deleted"
    tail = _api_types(sbx.events(after=0))[-2:]
    assert tail == ["sandbox.deleted", "sandbox.destroyed"]
    with pytest.raises(SandboxNotFound):
        sbx.exec("true")


def test_follow_yields_events_as_they_happen_and_ends_with_the_sandbox(daemon) -> None:
    sbx = Sandbox.create(ttl_seconds=600)
    seen = []
    started = threading.Event()

    def follow() -> None:
        for event in sbx.events(types=["sandbox", "exec"], follow=True, timeout=120):
            seen.append(event["type"])
            started.set()

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        assert started.wait(60), "the stream sent nothing"
        sbx.exec("true")
    finally:
        sbx.kill()
    reader.join(120)
    assert not reader.is_alive(), "the stream did not end with the sandbox"
    assert seen[0] == "sandbox.created"
    assert seen[-3:] == ["exec.end", "sandbox.deleted", "sandbox.destroyed"]


def test_a_bad_type_is_refused(sbx) -> None:
    with pytest.raises(InvalidRequest):
        sbx.events_page(types=["Not A Type"])
