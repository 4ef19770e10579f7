"""Network policies through the SDK against a real airlockd: create with one, read it, change it
live, read the verdicts. The allowlist names nothing real and the daemon's DNS upstream is on
loopback, so no packet leaves the machine."""

from __future__ import annotations

import pytest

from airlock import Client, ConflictError, InvalidRequest, Sandbox


def _networked(daemon) -> Sandbox:
    try:
        return Sandbox.create(ttl_seconds=600,
                              network={"mode": "allowlist", "allow": ["allowed.invalid"]})
    except Exception as e:  # the daemon could not set up networking (no nftables, not root)
        if "no sandbox networking" in str(e):
            pytest.skip(str(e))
        raise


def test_allowlist_is_enforced_changed_live_and_on_record(daemon) -> None:
    with _networked(daemon) as sbx:
        assert sbx.network["mode"] == "allowlist"
        assert sbx.network["allow"] == ["allowed.invalid"]
        assert sbx.network["address"].startswith("10.216.0.")
        # A name not on the list: no address, and the proxy refuses it with a reason.
        assert sbx.exec("getent hosts other.invalid").exit_code != 0
        r = sbx.exec("curl -s -m 10 -w ' %{http_code}' http://other.invalid/")
        assert "not in this sandbox's allowlist" in r.stdout and r.stdout.endswith(" 403")
        sbx.set_network({"mode": "allowlist", "allow": ["allowed.invalid", "other.invalid"]})
        assert sbx.network["allow"] == ["allowed.invalid", "other.invalid"]
        events = sbx.network_events()
        assert any(e["name"] == "other.invalid" and e["verdict"] == "denied" for e in events)


def test_verdicts_are_numbered_and_read_in_pages(daemon) -> None:
    with _networked(daemon) as sbx:
        for i in range(3):
            r = sbx.exec(f"curl -s -m 10 -w ' %{{http_code}}' http://denied-{i}.invalid/")
            assert r.stdout.endswith(" 403")
        everything = sbx.network_events()
        assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
        assert {f"denied-{i}.invalid" for i in range(3)} <= {e["name"] for e in everything}
        first = sbx.network_events_page(limit=2)
        assert len(first["events"]) == 2 and first["has_more"]
        assert first["next_after"] == 2 and first["dropped"] == 0
        rest = sbx.network_events(after=first["next_after"])
        assert first["events"] + rest == everything
        last = sbx.network_events_page(after=everything[-1]["seq"])
        assert last["events"] == [] and not last["has_more"]
        assert last["last_seq"] == everything[-1]["seq"]


def test_a_sandbox_without_a_network_cannot_be_given_one(daemon) -> None:
    with Sandbox.create(ttl_seconds=600) as sbx:
        assert sbx.network["mode"] == "none"
        assert sbx.exec("cat /proc/net/dev | grep -c eth0").stdout.strip() == "0"
        with pytest.raises(ConflictError):
            sbx.set_network({"mode": "open"})


def test_secrets_are_bound_as_placeholders_and_unbound(daemon) -> None:
    name = "SDK_BOUND_SECRET"
    value = "ghp_sdk_value_never_in_the_sandbox_5e1"
    client = Client()
    client.secrets.create(name, value)
    try:
        try:
            sbx = Sandbox.create(ttl_seconds=600,
                                 network={"mode": "allowlist", "allow": ["api.invalid"]},
                                 secrets=[{"name": name, "hosts": ["api.invalid"],
                                           "env": "API_TOKEN"}])
        except Exception as e:
            if "no sandbox networking" in str(e):
                pytest.skip(str(e))
            raise
        with sbx:
            [bound] = sbx.secrets
            assert bound["name"] == name and bound["hosts"] == ["api.invalid"]
            placeholder = bound["placeholder"]
            assert placeholder.startswith("airlock-secret-")
            assert sbx.exec("echo $API_TOKEN").stdout == placeholder + "\n"
            assert value not in sbx.exec("env").stdout
            # A host the network does not allow cannot be bound (the value could never go).
            with pytest.raises(InvalidRequest):
                sbx.set_secrets([{"name": name, "hosts": ["other.invalid"]}])
            sbx.set_secrets([])
            assert sbx.secrets == []
            assert sbx.exec("echo ${API_TOKEN:-unset}").stdout == "unset\n"
    finally:
        client.secrets.delete(name)
