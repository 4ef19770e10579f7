"""Secrets through the SDK, against the session's real airlockd: values go in and never come
back (not in an answer, a repr or an error), a rotation bumps the version, and another tenant's
secret is SandboxNotFound while its owner can use it."""

from __future__ import annotations

import uuid

import pytest

from airlock import (
    AuthError,
    Client,
    ConflictError,
    InvalidRequest,
    SandboxNotFound,
    SecretInfo,
    Secrets,
)


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8].upper()}"


def _value(label: str) -> str:
    """A value nobody else would write, so that finding it anywhere means it leaked."""
    return f"ghp_{label}_{uuid.uuid4().hex}"


def test_a_secret_is_created_listed_rotated_and_deleted(daemon: object) -> None:
    client = Client()
    assert isinstance(client.secrets, Secrets)
    name, value = _name("TOKEN"), _value("sdk")
    made = client.secrets.create(name, value)
    assert isinstance(made, SecretInfo)
    assert made.name == name and made.version == 1
    assert made.created_at == made.updated_at and made.created_at.endswith("Z")
    assert value not in repr(made)
    assert client.secrets.get(name) == made
    assert name in [s.name for s in client.secrets.list()]

    rotated = client.secrets.update(name, _value("rotated"))
    assert rotated.version == 2
    assert rotated.created_at == made.created_at and rotated.updated_at >= made.updated_at
    assert client.secrets.get(name).version == 2

    with pytest.raises(ConflictError):
        client.secrets.create(name, "another")
    client.secrets.delete(name)
    for attempt in (lambda: client.secrets.get(name),
                    lambda: client.secrets.update(name, "v"),
                    lambda: client.secrets.delete(name)):
        with pytest.raises(SandboxNotFound) as e:
            attempt()
        assert e.value.status == 404
    assert name not in [s.name for s in client.secrets.list()]


def test_no_answer_holds_the_value(daemon: object) -> None:
    client = Client()
    name, value = _name("RAW"), _value("raw")
    created = client.request("POST", "/v1/secrets", json_body={"name": name, "value": value})
    answers = [created.body]
    answers.append(client.request("GET", "/v1/secrets").body)
    answers.append(client.request("GET", "/v1/secrets/" + name).body)
    answers.append(client.request("PUT", "/v1/secrets/" + name, json_body={"value": value}).body)
    answers.append(client.request("GET", "/metrics").body)
    assert all(value.encode() not in body for body in answers)
    assert set(created.json()) == {"name", "version", "created_at", "updated_at"}
    client.secrets.delete(name)


def test_bad_values_and_names_are_refused_without_showing_them(daemon: object) -> None:
    client = Client()
    value = _value("bad")
    for bad in (value + "\n", value + "\r\nX-Injected: 1", value + "\0", "", value * 2000):
        with pytest.raises(InvalidRequest) as e:
            client.secrets.create(_name("BAD"), bad)
        assert e.value.status == 400
        assert value not in str(e.value) and value not in e.value.message
    with pytest.raises(InvalidRequest) as e:
        client.secrets.create("9-not-a-name", value)
    assert "secret name" in e.value.message
    # The control: the same value, as it should be, is taken.
    name = _name("GOOD")
    assert client.secrets.create(name, value).version == 1
    with pytest.raises(InvalidRequest):
        client.secrets.update(name, value + "\n")
    assert client.secrets.get(name).version == 1
    client.secrets.delete(name)


def test_another_tenants_secret_does_not_exist_for_it(daemon: object) -> None:
    admin = Client()
    tenant_a, tenant_b = f"sdk-a-{uuid.uuid4().hex[:8]}", f"sdk-b-{uuid.uuid4().hex[:8]}"
    a = Client(api_key=admin.keys.create("sdk-a", tenant=tenant_a).key)
    b = Client(api_key=admin.keys.create("sdk-b", tenant=tenant_b).key)
    a.secrets.create("TOKEN", _value("team-a"))
    for attempt in (lambda: b.secrets.get("TOKEN"),
                    lambda: b.secrets.update("TOKEN", "b's"),
                    lambda: b.secrets.delete("TOKEN")):
        with pytest.raises(SandboxNotFound):
            attempt()
    assert b.secrets.list() == []
    with pytest.raises(AuthError) as e:
        b.secrets.list(tenant=tenant_a)
    assert e.value.status == 403
    # The positive control: A's calls work, and A's secret is as A left it.
    assert a.secrets.get("TOKEN").version == 1
    assert a.secrets.update("TOKEN", _value("team-a-2")).version == 2
    assert [s.name for s in a.secrets.list()] == ["TOKEN"]
    # B's own secret of that name is another one; an admin reaches A's by naming the tenant.
    assert b.secrets.create("TOKEN", "b's own").version == 1
    assert admin.secrets.get("TOKEN", tenant=tenant_a).version == 2
    admin.secrets.delete("TOKEN", tenant=tenant_a)
    with pytest.raises(SandboxNotFound):
        a.secrets.get("TOKEN")
    assert b.secrets.get("TOKEN").version == 1
