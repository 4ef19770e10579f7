"""API keys: create, list, revoke (docs/design/tenancy.md). Admin keys only.

    from airlock import Client
    admin = Client()                                   # AIRLOCK_API_KEY is an admin key
    made = admin.keys.create("ci", tenant="team-a")    # made.key is shown this once
    team_a = Client(api_key=made.key)                  # sees only team-a's sandboxes
    admin.keys.revoke(made.id)                         # 401 from its next call on
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ._http import Client


@dataclass
class ApiKey:
    """An API key as the daemon describes it; `key` only in what create() returns."""

    id: int
    name: str
    tenant: str
    admin: bool
    revoked: bool
    created_at: str
    key: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "ApiKey":
        return cls(id=int(body["id"]), name=body["name"], tenant=body["tenant"],
                   admin=bool(body.get("admin", False)), revoked=bool(body.get("revoked", False)),
                   created_at=body.get("created_at", ""), key=body.get("key"))


class Keys:
    """The API keys of one daemon: `Client().keys`. Every call needs an admin key (AuthError,
    status 403, otherwise)."""

    def __init__(self, client: Client):
        self._client = client

    def create(self, name: str, tenant: str, admin: bool = False) -> ApiKey:
        """A new key acting for `tenant` (1-64 of [A-Za-z0-9._-]); with `admin` it acts on every
        tenant's sandboxes and may manage keys and pools. Its `key` is not shown again."""
        body: Dict[str, Any] = {"name": name, "tenant": tenant, "admin": admin}
        return ApiKey.from_json(self._client.request("POST", "/v1/keys", json_body=body).json())

    def list(self) -> List[ApiKey]:
        """Every key, revoked ones too, oldest first (never a key itself)."""
        body = self._client.request("GET", "/v1/keys").json()
        return [ApiKey.from_json(k) for k in body["keys"]]

    def revoke(self, key_id: int) -> None:
        """Revokes a key; SandboxNotFound for an unknown id, ConflictError for the last admin
        key."""
        self._client.request("DELETE", "/v1/keys/" + str(int(key_id)))
