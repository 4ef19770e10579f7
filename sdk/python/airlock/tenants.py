"""Tenant quotas and use (docs/design/tenancy.md, "Quotas").

    from airlock import Client
    admin = Client()                                        # an admin key
    admin.tenants.set_quota("team-a", sandboxes=10, memory_mb=16384)
    info = Client(api_key=team_a_key).tenants.get("team-a")  # its own tenant only
    print(info.usage["memory_mb"], "of", info.quota["memory_mb"])
    admin.tenants.remove_quota("team-a")

A create, fork or pool claim over a quota, and a live limit increase over it, raise
QuotaExceeded (429) with what is used, asked and allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ._http import Client


@dataclass
class TenantInfo:
    """A tenant's quota (0 in a field: unlimited) and what its sandboxes use now."""

    name: str
    quota: Dict[str, Any]  # sandboxes, cpus, memory_mb, disk_mb, creates_per_minute
    usage: Dict[str, Any]  # sandboxes, cpus, memory_mb, disk_mb, creates_last_minute

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "TenantInfo":
        return cls(name=body["name"], quota=dict(body["quota"]), usage=dict(body["usage"]))


class Tenants:
    """`Client().tenants`."""

    def __init__(self, client: Client):
        self._client = client

    def get(self, name: str) -> TenantInfo:
        """The tenant's quota and use. An admin key may ask about any tenant; another key
        about its own only (AuthError, status 403, otherwise)."""
        return TenantInfo.from_json(self._client.request("GET", "/v1/tenants/" + name).json())

    def set_quota(self, name: str, sandboxes: int = 0, cpus: float = 0, memory_mb: int = 0,
                  disk_mb: int = 0, creates_per_minute: int = 0) -> TenantInfo:
        """Replaces the tenant's whole quota (admin keys only): 0 is unlimited, all 0 removes
        it."""
        body: Dict[str, Any] = {"sandboxes": int(sandboxes), "cpus": cpus,
                                "memory_mb": int(memory_mb), "disk_mb": int(disk_mb),
                                "creates_per_minute": int(creates_per_minute)}
        return TenantInfo.from_json(
            self._client.request("PUT", "/v1/tenants/" + name + "/quota", json_body=body).json())

    def remove_quota(self, name: str) -> None:
        """Removes the tenant's quota (admin keys only); removing none is not an error."""
        self._client.request("DELETE", "/v1/tenants/" + name + "/quota")

    def quota(self, name: str) -> Optional[Dict[str, Any]]:
        """The tenant's quota, or None when it has none."""
        quota = self.get(name).quota
        return quota if any(v for v in quota.values()) else None
