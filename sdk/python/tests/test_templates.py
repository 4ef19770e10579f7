"""Templates, snapshots and forks through the SDK, against the session's real airlockd."""

from __future__ import annotations

import pytest

from airlock import Client, ConflictError, Sandbox, SandboxNotFound, Template


def test_build_use_and_delete_a_template(daemon: object) -> None:
    client = Client()
    out: list = []
    t = client.templates.build(
        "sdk-app",
        steps=[Template.run("mkdir -p /opt/app && echo built"),
               Template.copy("/opt/app/hello.sh", "#!/bin/sh\necho hello $WHO\n", mode=0o755),
               Template.copy("/opt/app/blob", b"\x00\xffbinary")],
        env={"WHO": "sdk"}, workdir="/opt/app", on_output=out.append)
    assert t.state == "ready" and len(t.layers) == 1 and t.env_keys == ["WHO"]
    assert "built\n" in "".join(out)
    assert "sdk-app" in [x.name for x in client.templates.list()]
    with Sandbox.create(template="sdk-app", ttl_seconds=300) as sbx:
        assert sbx.exec("./hello.sh && pwd && od -An -c blob | tr -d ' '").stdout == \
            "hello sdk\n/opt/app\n\\0377binary\n"
        with pytest.raises(ConflictError):
            client.templates.delete("sdk-app")
    client.templates.delete("sdk-app")
    with pytest.raises(SandboxNotFound):
        client.templates.get("sdk-app")


def test_a_failed_step_raises_with_its_output(daemon: object) -> None:
    with pytest.raises(ConflictError) as e:
        Client().templates.build("sdk-broken", steps=[Template.run("echo nope >&2; exit 4")])
    assert "exited 4" in str(e.value) and "nope" in str(e.value)
    assert Client().templates.get("sdk-broken").state == "failed"
    Client().templates.delete("sdk-broken")


def test_a_build_has_the_network_it_asks_for_and_its_template_none(daemon: object) -> None:
    client = Client()
    try:
        t = client.templates.build(
            "sdk-net",
            network={"mode": "allowlist", "allow": ["allowed.invalid"]},
            # The proxy answers (a 403 for a name not on the list): the step had the network.
            steps=[Template.run("test -n \"$HTTP_PROXY\" && mkdir -p /opt && "
                                "curl -s -m 10 -o /dev/null -w '%{http_code}' "
                                "http://other.invalid/ > /opt/code")])
    except Exception as e:  # the daemon could not set up networking (no nftables, not root)
        if "no sandbox networking" in str(e):
            pytest.skip(str(e))
        raise
    assert t.state == "ready" and t.env_keys == []
    with Sandbox.create(template="sdk-net", ttl_seconds=300) as sbx:
        assert sbx.network["mode"] == "none"
        assert sbx.exec("cat /opt/code").stdout == "403"
        assert sbx.exec("echo ${HTTP_PROXY:-unset}").stdout == "unset\n"
    client.templates.delete("sdk-net")


def test_snapshot_and_fork(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/state.txt", b"before\n")
    t = sbx.snapshot("sdk-snap")
    assert t.state == "ready" and t.source == "snapshot of " + sbx.id
    forks = sbx.fork(count=2, metadata={"suite": "sdk-tests"})
    try:
        assert len(forks) == 2
        for f in forks:
            assert f.files.read("/home/user/state.txt") == b"before\n"
        forks[0].files.write("/home/user/state.txt", b"mine\n")
        assert forks[1].files.read("/home/user/state.txt") == b"before\n"
        assert sbx.files.read("/home/user/state.txt") == b"before\n"
    finally:
        for f in forks:
            f.kill()
    with Sandbox.create(template="sdk-snap", ttl_seconds=300) as again:
        assert again.files.read("/home/user/state.txt") == b"before\n"
    Client().templates.delete("sdk-snap")
