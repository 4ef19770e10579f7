"""Engines through the SDK, against the session's real airlockd (docs/design/engines.md): the
list with capabilities, a create's engine, and an unknown one refused."""

from __future__ import annotations

import pytest

from airlock import Client, ConflictError, InvalidRequest, Sandbox, Template


def test_the_engines_are_listed_with_what_they_can_do(daemon: object) -> None:
    engines = {e["name"]: e for e in Client().engines()}
    jail = engines["jail"]
    assert jail["available"] and jail["default"]
    assert jail["capabilities"]["pause"] and jail["capabilities"]["layer_snapshot"]
    assert not jail["capabilities"]["memory_fork"]
    # Said either way: whether the daemon could subscribe to the kernel's process events.
    assert isinstance(jail["capabilities"]["process_events"], bool)


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


def test_a_template_with_a_memory_snapshot_restores_its_processes(daemon: object) -> None:
    client = Client()
    engines = {e["name"]: e for e in client.engines()}
    if not engines.get("gvisor", {}).get("available"):
        pytest.skip("gVisor: " + engines.get("gvisor", {}).get("reason", "not listed"))
    # start_cmd draws a value that only its memory holds, and writes it on each SIGUSR1.
    holder = ("import os, signal, time\n"
              "v = os.urandom(6).hex()\n"
              "signal.signal(signal.SIGUSR1, lambda *_: open('/tmp/v', 'w').write(v))\n"
              "open('/tmp/ready', 'w').close()\n"
              "while True: time.sleep(3600)\n")
    t = client.templates.build(
        "sdk-warm", engine="gvisor", steps=[Template.copy("/opt/holder.py", holder)],
        start_cmd="exec python3 /opt/holder.py", ready_cmd="test -e /tmp/ready",
        snapshot_after="echo snapped > /home/user/snapped")
    try:
        assert t.state == "ready" and t.snapshot_after.startswith("echo snapped")
        assert t.memory_snapshot_bytes > 0
        assert client.templates.get("sdk-warm").memory_snapshot_bytes == t.memory_snapshot_bytes
        values = []
        for _ in range(2):
            with Sandbox.create(template="sdk-warm", ttl_seconds=120) as sbx:
                [p] = [p for p in sbx.processes.list() if "holder.py" in p.command]
                sbx.processes.kill(p.pid, "USR1")
                values.append(sbx.exec("for i in $(seq 100); do test -s /tmp/v && break; "
                                       "sleep 0.05; done; cat /tmp/v; echo; "
                                       "cat /home/user/snapped").stdout)
        assert values[0] == values[1] and values[0].endswith("snapped\n"), values
        assert len(values[0].split()[0]) == 12
    finally:
        client.templates.delete("sdk-warm")
    with pytest.raises(ConflictError) as e:
        client.templates.build("sdk-jail-warm", engine="jail", snapshot_after="true")
    assert "memory_fork" in str(e.value)
