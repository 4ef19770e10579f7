"""Engines through the SDK, against the session's real airlockd (docs/design/engines.md): the
list with capabilities, a create's engine, and an unknown one refused."""

from __future__ import annotations

import pytest

from airlock import Client, InvalidRequest, Sandbox


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
