"""Client authentication for the data plane (spec 1, Authentication).

Keys are held as SHA-256 digests in a dict built once from the config: a lookup hashes the presented
key and compares digests with ``hmac.compare_digest``, so the time taken does not depend on how much
of a key matched. Keys never leave this module: not in logs, errors or the identity.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Generic, Iterable, TypeVar

__all__ = ["Identity", "KeyRing", "DigestTable", "bearer_token", "ANONYMOUS", "SHARED"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the shared-key identity, a tenant, or anonymous (no keys configured)."""

    kind: str  # "shared", "tenant" or "anonymous"
    tenant_id: str | None = None


ANONYMOUS = Identity("anonymous")
SHARED = Identity("shared")

_BEARER = b"bearer "


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value, or None when missing or another scheme."""
    if not authorization or len(authorization) <= 7 or authorization[:7].lower() != _BEARER:
        return None
    return authorization[7:].strip() or None


class DigestTable(Generic[T]):
    """Values looked up by a secret key, held only as its SHA-256 digest (also by the control plane)."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, tuple[bytes, T]] = {}

    def add(self, key: str, value: T) -> None:
        digest = hashlib.sha256(key.encode()).digest()
        self._by_digest[digest] = (digest, value)

    def find(self, presented: bytes) -> T | None:
        """The value stored under the presented key, compared digest to digest in constant time."""
        digest = hashlib.sha256(presented).digest()
        found = self._by_digest.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]

    def __len__(self) -> int:
        return len(self._by_digest)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {len(self)} keys>"


class KeyRing(DigestTable[Identity]):
    def __init__(self, api_key: str | None, tenant_keys: Iterable[tuple[str, str]]) -> None:
        super().__init__()
        for tenant_id, key in tenant_keys:
            self.add(key, Identity("tenant", tenant_id))
        if api_key:
            self.add(api_key, SHARED)
        self.enabled = bool(self._by_digest)

    def authenticate(self, authorization: bytes | None) -> Identity | None:
        """The identity for an ``Authorization`` header value, or None when it is missing or unknown."""
        if not self.enabled:
            return ANONYMOUS
        token = bearer_token(authorization)
        return None if token is None else self.find(token)
