"""Tenant quotas and live limits through the SDK, against the session's real airlockd."""

from __future__ import annotations

import uuid

import pytest

from airlock import AuthError, Client, InvalidRequest, QuotaExceeded, Sandbox, TenantInfo


def _tenant() -> str:
    return f"sdk-q-{uuid.uuid4().hex[:8]}"


def test_a_quota_is_set_shown_enforced_and_removed(daemon: object) -> None:
    admin = Client()
    tenant = _tenant()
    user = Client(api_key=admin.keys.create("sdk-q", tenant=tenant).key)
    info = admin.tenants.set_quota(tenant, sandboxes=1, memory_mb=1024)
    assert isinstance(info, TenantInfo)
    assert info.quota["sandboxes"] == 1 and info.quota["cpus"] == 0
    assert user.tenants.quota(tenant) == info.quota
    with Sandbox.create(client=user, ttl_seconds=300, memory_mb=256) as first:
        shown = user.tenants.get(tenant)
        assert shown.usage["sandboxes"] == 1 and shown.usage["memory_mb"] == 256
        with pytest.raises(QuotaExceeded) as e:
            Sandbox.create(client=user, ttl_seconds=300)
        assert e.value.status == 429
        assert e.value.message == f"tenant {tenant}: sandboxes 1 in use + 1 asked > quota 1"
        # A live increase must fit too; a decrease always does.
        with pytest.raises(QuotaExceeded):
            first.set_limits(memory_mb=2048)
        assert first.set_limits(memory_mb=128, cpus=0.5).info["limits"]["memory_mb"] == 128
    admin.tenants.remove_quota(tenant)
    assert user.tenants.quota(tenant) is None
    with pytest.raises(AuthError):
        user.tenants.set_quota(tenant, sandboxes=5)
    with pytest.raises(InvalidRequest):
        admin.tenants.set_quota(tenant, sandboxes=-1)
