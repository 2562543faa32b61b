"""Secret keys held only as SHA-256 digests, for the data plane's client keys and the control plane's
operator keys alike.

A lookup hashes the presented key and compares digests with ``hmac.compare_digest``, so the time
taken does not depend on how much of a key matched. The keys themselves are never kept: nothing can
reach a log, an error or a read path.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Generic, TypeVar

__all__ = ["DigestTable", "bearer_token", "header_bytes"]

T = TypeVar("T")

_BEARER = b"bearer "


def header_bytes(value: str | None) -> bytes | None:
    """An ``Authorization`` value as the client sent it: Django decodes header bytes as latin-1, so
    encoding back gives those bytes (UTF-8 for a value latin-1 cannot hold)."""
    if value is None:
        return None
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode()


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value, or None when missing or another scheme."""
    if not authorization or len(authorization) <= 7 or authorization[:7].lower() != _BEARER:
        return None
    return authorization[7:].strip() or None


class DigestTable(Generic[T]):
    """Values looked up by a secret key, held only as its SHA-256 digest."""

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
