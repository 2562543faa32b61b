"""The limits of stored responses and conversations (spec 2, Limits), in one place."""

from __future__ import annotations

from typing import Any

__all__ = [
    "SCOPE_MAX",
    "OBJECT_ID_MAX",
    "ITEM_ID_MAX",
    "METADATA_MAX_PAIRS",
    "METADATA_KEY_MAX",
    "METADATA_VALUE_MAX",
    "ITEMS_PER_CREATE",
    "LIST_LIMIT_DEFAULT",
    "LIST_LIMIT_MAX",
    "HISTORY_CHAIN_MAX",
    "metadata_problem",
]

SCOPE_MAX = 300  # characters of a tenant scope (responses_api/scope.py keeps within it)
OBJECT_ID_MAX = 64  # resp_<48 hex>, conv_<48 hex>
ITEM_ID_MAX = 128  # generated item ids are shorter; a client may bring its own up to this
METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX = 64
METADATA_VALUE_MAX = 512
ITEMS_PER_CREATE = 20  # items in one POST /v1/conversations/{id}/items (or POST /v1/conversations)
LIST_LIMIT_DEFAULT = 100
LIST_LIMIT_MAX = 100
HISTORY_CHAIN_MAX = 10000  # responses followed back through previous_response_id


def metadata_problem(value: Any, *, deletions: bool = False) -> str | None:
    """What is wrong with a ``metadata`` object (spec 2, Limits: 16 pairs, keys up to 64 characters,
    string values up to 512; ``deletions``: a null value deletes a key), or None."""
    if not isinstance(value, dict):
        return "metadata must be an object"
    if len(value) > METADATA_MAX_PAIRS:
        return f"metadata cannot have more than {METADATA_MAX_PAIRS} properties"
    for key, item in value.items():
        if len(key) > METADATA_KEY_MAX:
            return f"metadata keys must be at most {METADATA_KEY_MAX} characters: '{key[:80]}'"
        if item is None and deletions:
            continue
        if not isinstance(item, str):
            return f"metadata['{key}'] must be {'a string or null' if deletions else 'a string'}"
        if len(item) > METADATA_VALUE_MAX:
            return f"metadata['{key}'] must be at most {METADATA_VALUE_MAX} characters"
    return None
