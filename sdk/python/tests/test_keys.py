"""API keys and tenancy through the SDK, against the session's real airlockd: keys made by the
admin key act for their tenant only; the others' sandboxes are SandboxNotFound."""

from __future__ import annotations

import uuid

import pytest

from airlock import ApiKey, AuthError, Client, ConflictError, InvalidRequest, Sandbox, SandboxNotFound


def _tenant(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_keys_are_made_listed_and_revoked_by_the_admin(daemon: object) -> None:
    admin = Client()
    made = admin.keys.create("sdk-ci", tenant=_tenant("sdk-a"))
    assert isinstance(made, ApiKey)
    assert made.key is not None and made.key.startswith("al_") and not made.admin
    listed = {k.id: k for k in admin.keys.list()}
    assert made.id in listed and listed[made.id].key is None  # never shown again
    assert listed[made.id].tenant == made.tenant and not listed[made.id].revoked
    user = Client(api_key=made.key)
    assert user.list() == []  # a new tenant has no sandboxes
    admin.keys.revoke(made.id)
    with pytest.raises(AuthError) as e:
        user.list()
    assert e.value.status == 401
    assert [k.revoked for k in admin.keys.list() if k.id == made.id] == [True]
    with pytest.raises(SandboxNotFound):
        admin.keys.revoke(10**9)
    with pytest.raises(InvalidRequest):
        admin.keys.create("bad", tenant="not a tenant")


def test_the_last_admin_key_cannot_be_revoked(daemon: object) -> None:
    admin = Client()
    admins = [k for k in admin.keys.list() if k.admin and not k.revoked]
    assert len(admins) == 1
    with pytest.raises(ConflictError):
        admin.keys.revoke(admins[0].id)
    assert admin.health() and admin.keys.list()  # still an admin key


def test_a_tenant_sees_only_its_own_sandboxes(daemon: object) -> None:
    admin = Client()
    a = Client(api_key=admin.keys.create("sdk-a", tenant=_tenant("sdk-a")).key)
    b_key = admin.keys.create("sdk-b", tenant=_tenant("sdk-b"))
    b = Client(api_key=b_key.key)
    with Sandbox.create(client=a, ttl_seconds=300) as mine:
        mine.files.write("/tmp/secret", b"a's\n")
        assert mine.tenant != "" and mine.tenant != b_key.tenant
        assert [s.id for s in a.list()] == [mine.id]
        assert mine.id not in [s.id for s in b.list()]
        assert mine.id in [s.id for s in admin.list(tenant=mine.tenant)]
        for attempt in (lambda: b.connect(mine.id),
                        lambda: Sandbox(b, {"id": mine.id}).exec("true"),
                        lambda: Sandbox(b, {"id": mine.id}).files.read("/tmp/secret"),
                        lambda: b.request("DELETE", "/v1/sandboxes/" + mine.id)):
            with pytest.raises(SandboxNotFound):
                attempt()
        assert mine.files.read("/tmp/secret") == b"a's\n"  # positive control, and untouched
        assert admin.connect(mine.id).exec("cat /tmp/secret").stdout == "a's\n"
        with pytest.raises(AuthError) as e:
            b.keys.list()
        assert e.value.status == 403
