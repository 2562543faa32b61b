"""The ``encrypted_content`` of reasoning items (spec 2: with ``include: ["reasoning.encrypted_content"]``).

Not encrypted: an opaque, version-tagged base64 of the reasoning text, so a client that stores
nothing on the gateway (``store: false``) can send a reasoning item back and the model sees its
earlier reasoning again.
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["INCLUDE_ENCRYPTED_REASONING", "seal", "unseal"]

INCLUDE_ENCRYPTED_REASONING = "reasoning.encrypted_content"

_TAG = "gw1:"


def seal(text: str) -> str:
    return _TAG + base64.b64encode(text.encode("utf-8")).decode("ascii")


def unseal(blob: str) -> str | None:
    """The reasoning text of a blob :func:`seal` made; None for anything else."""
    if not blob.startswith(_TAG):
        return None
    try:
        return base64.b64decode(blob[len(_TAG):], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
