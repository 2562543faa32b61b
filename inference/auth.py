"""Client authentication for the data plane (spec 1, Authentication).

Keys are held as SHA-256 digests in a dict built once from the config: a lookup hashes the presented
key and compares digests with ``hmac.compare_digest``, so the time taken does not depend on how much
of a key matched. Keys never leave this module: not in logs, errors or the identity.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Identity", "KeyRing", "ANONYMOUS", "SHARED"]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the shared-key identity, a tenant, or anonymous (no keys configured)."""

    kind: str  # "shared", "tenant" or "anonymous"
    tenant_id: str | None = None


ANONYMOUS = Identity("anonymous")
SHARED = Identity("shared")

_BEARER = b"bearer "


class KeyRing:
    def __init__(self, api_key: str | None, tenant_keys: Iterable[tuple[str, str]]) -> None:
        self._by_digest: dict[bytes, tuple[bytes, Identity]] = {}
        for tenant_id, key in tenant_keys:
            self._add(key, Identity("tenant", tenant_id))
        if api_key:
            self._add(api_key, SHARED)
        self.enabled = bool(self._by_digest)

    def _add(self, key: str, identity: Identity) -> None:
        digest = hashlib.sha256(key.encode()).digest()
        self._by_digest[digest] = (digest, identity)

    def authenticate(self, authorization: bytes | None) -> Identity | None:
        """The identity for an ``Authorization`` header value, or None when it is missing or unknown."""
        if not self.enabled:
            return ANONYMOUS
        if not authorization or len(authorization) <= 7 or authorization[:7].lower() != _BEARER:
            return None
        digest = hashlib.sha256(authorization[7:].strip()).digest()
        found = self._by_digest.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]
