"""Engines through the SDK, against the session's real airlockd (docs/design/engines.md): the
list with capabilities, a create's engine, and an unknown one refused."""

from __future__ import annotations

import pytest

from airlock import Client, ConflictError, InvalidRequest, Sandbox


def test_the_engines_are_listed_with_what_they_can_do(daemon: object) -> None:
    engines = {e["name"]: e for e in Client().engines()}
    jail = engines["jail"]
    assert jail["available"] and jail["default"]
    assert jail["capabilities"]["pause"] and jail["capabilities"]["layer_snapshot"]
    assert not jail["capabilities"]["memory_fork"]


def test_a_create_names_its_engine_and_the_sandbox_shows_it(daemon: object) -> None:
    with Sandbox.create(engine="jail", ttl_seconds=120) as sbx:
        assert sbx.engine == "jail"
        assert sbx.exec("echo on the jail").stdout == "on the jail\n"
    with Sandbox.create(ttl_seconds=120) as plain:
        assert plain.engine == "jail"  # the default
    with pytest.raises(InvalidRequest) as e:
        Sandbox.create(engine="no-such-engine")
    assert "no engine is called 'no-such-engine'" in str(e.value)


def test_a_gvisor_sandbox_hibernates_and_resumes_with_its_memory(daemon: object) -> None:
    engines = {e["name"]: e for e in Client().engines()}
    if not engines.get("gvisor", {}).get("available"):
        pytest.skip("gVisor: " + engines.get("gvisor", {}).get("reason", "not listed"))
    with Sandbox.create(engine="gvisor", ttl_seconds=120) as sbx:
        # A value that lives only in a background process's memory and in /tmp (memory too).
        sbx.processes.start("v=$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \\n'); "
                            "echo $v > /tmp/v; while :; do echo $v > /tmp/seen; sleep 0.05; done")
        value = sbx.exec("sleep 0.3; cat /tmp/v").stdout
        assert len(value.strip()) == 12
        assert sbx.pause(memory=True).state == "hibernated"
        assert sbx.info["memory_image_bytes"] > 0
        with pytest.raises(ConflictError):
            sbx.exec("true")
        assert sbx.resume().state == "running"
        assert sbx.exec("rm /tmp/seen; sleep 0.3; cat /tmp/seen").stdout == value
        forks = sbx.fork(count=2, memory=True)
        try:
            for f in forks:
                assert f.exec("rm /tmp/seen; sleep 0.3; cat /tmp/seen").stdout == value
        finally:
            for f in forks:
                f.kill()
    with Sandbox.create(engine="jail", ttl_seconds=120) as jail:
        with pytest.raises(ConflictError) as e:
            jail.pause(memory=True)
        assert "memory_checkpoint" in str(e.value)
