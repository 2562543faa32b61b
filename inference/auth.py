"""Client authentication for the data plane (spec 1, Authentication).

Keys are held as SHA-256 digests (:class:`common.secrets.DigestTable`) in a table built once from the
config. Keys never leave it: not in logs, errors or the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable

from common.secrets import DigestTable, bearer_token

__all__ = ["IdentityKind", "Identity", "KeyRing", "ANONYMOUS", "SHARED"]


class IdentityKind(StrEnum):
    SHARED = "shared"  # the shared --api-key
    TENANT = "tenant"  # a --tenant-api-key
    ANONYMOUS = "anonymous"  # no keys configured: the data plane is open


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the shared-key identity, a tenant, or anonymous (no keys configured)."""

    kind: IdentityKind
    tenant_id: str | None = None

    @property
    def rate_limited_tenant(self) -> str | None:
        """The tenant whose rate limit applies (only tenant keys are rate-limited)."""
        return self.tenant_id if self.kind is IdentityKind.TENANT else None


ANONYMOUS = Identity(IdentityKind.ANONYMOUS)
SHARED = Identity(IdentityKind.SHARED)


class KeyRing(DigestTable[Identity]):
    def __init__(self, api_key: str | None, tenant_keys: Iterable[tuple[str, str]]) -> None:
        super().__init__()
        for tenant_id, key in tenant_keys:
            self.add(key, Identity(IdentityKind.TENANT, tenant_id))
        if api_key:
            self.add(api_key, SHARED)
        self.enabled = bool(self._by_digest)

    def authenticate(self, authorization: bytes | None) -> Identity | None:
        """The identity for an ``Authorization`` header value, or None when it is missing or unknown."""
        if not self.enabled:
            return ANONYMOUS
        token = bearer_token(authorization)
        return None if token is None else self.find(token)
