"""Secrets: named values (tokens, passwords) the daemon keeps sealed for your tenant, for the
egress proxy to put into the requests sandboxes make (docs/secrets.md). A value is sent with
create() or update() and never comes back: every answer is a SecretInfo, without it.

    import os
    from airlock import Client
    secrets = Client().secrets
    secrets.create("GITHUB_TOKEN", os.environ["GITHUB_TOKEN"])
    secrets.update("GITHUB_TOKEN", new_token)         # rotate: version + 1
    print([(s.name, s.version) for s in secrets.list()])
    secrets.delete("GITHUB_TOKEN")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional
from urllib.parse import quote

from ._http import Client


@dataclass(frozen=True)
class SecretInfo:
    """A secret as the daemon describes it: never its value."""

    name: str
    version: int  # 1 at create, one more at every update
    created_at: str
    updated_at: str  # the last create or update

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "SecretInfo":
        return cls(name=body["name"], version=int(body["version"]),
                   created_at=body.get("created_at", ""), updated_at=body.get("updated_at", ""))


class Secrets:
    """The secrets of the client's tenant: `Client().secrets`. Another tenant's secret is
    SandboxNotFound (404), exactly as one that does not exist. `tenant=` names another tenant's
    (admin keys only; AuthError, status 403, otherwise).

    Names are 1-128 letters, digits and "_", not starting with a digit (they are also
    environment variable names). Values are 1-65536 bytes without CR, LF or NUL: they go into
    HTTP headers. A refused value raises InvalidRequest whose message does not hold it."""

    def __init__(self, client: Client):
        self._client = client

    @staticmethod
    def _query(tenant: Optional[str]) -> Optional[Dict[str, str]]:
        return {"tenant": tenant} if tenant is not None else None

    @staticmethod
    def _path(name: str) -> str:
        return "/v1/secrets/" + quote(name, safe="")

    def create(self, name: str, value: str, tenant: Optional[str] = None) -> SecretInfo:
        """Stores `value` as secret `name`, version 1; ConflictError if the name is taken."""
        body = {"name": name, "value": value}
        r = self._client.request("POST", "/v1/secrets", query=self._query(tenant), json_body=body)
        return SecretInfo.from_json(r.json())

    def list(self, tenant: Optional[str] = None) -> List[SecretInfo]:
        """The tenant's secrets, by name."""
        body = self._client.request("GET", "/v1/secrets", query=self._query(tenant)).json()
        return [SecretInfo.from_json(s) for s in body["secrets"]]

    def get(self, name: str, tenant: Optional[str] = None) -> SecretInfo:
        """One secret's metadata; SandboxNotFound if there is none of that name."""
        r = self._client.request("GET", self._path(name), query=self._query(tenant))
        return SecretInfo.from_json(r.json())

    def update(self, name: str, value: str, tenant: Optional[str] = None) -> SecretInfo:
        """Rotates: `value` replaces the secret's and its version goes up by one; every use of
        the secret from the answer on gets the new value. SandboxNotFound if there is none."""
        r = self._client.request("PUT", self._path(name), query=self._query(tenant),
                                 json_body={"value": value})
        return SecretInfo.from_json(r.json())

    def delete(self, name: str, tenant: Optional[str] = None) -> None:
        """Deletes the secret; SandboxNotFound if there is none (a retried delete that the
        first attempt already did raises it too)."""
        self._client.request("DELETE", self._path(name), query=self._query(tenant))
