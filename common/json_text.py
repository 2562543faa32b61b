"""Text the store can hold: Postgres refuses U+0000 in text and jsonb columns. A named string a caller
gives (an id, a name, a path) that holds one is refused at the request with the caller's 400
(naming the field); free-form JSON (metadata, labels, model output) is stored with it
replaced by U+FFFD (:func:`storable`). Either way it never reaches a row, where it would be a 500."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import orjson

__all__ = ["NO_NUL", "NUL_MESSAGE", "nul_free", "storable"]

NUL_MESSAGE = "Strings in the request body must not contain the NUL character (\\u0000)"
NO_NUL = r"^[^\x00]*$"
"""A string without U+0000, as an OpenAPI pattern (the descriptions mark the fields that refuse it)."""

T = TypeVar("T")
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")  # an escaped U+0000, not an escaped backslash + "u0000"


def nul_free(value: Any) -> bool:
    """No string (key or value) holds U+0000. Iterative: a body may nest as deep as the parser allows."""
    pending = [value]
    while pending:
        current = pending.pop()
        if isinstance(current, str):
            if "\x00" in current:
                return False
        elif isinstance(current, dict):
            pending.extend(current.keys())
            pending.extend(current.values())
        elif isinstance(current, list):
            pending.extend(current)
    return True


def storable(value: T) -> T:
    """``value`` as the store can hold it: every U+0000 replaced by U+FFFD. For free-form JSON a
    caller or a model may fill (model output, a worker's metadata), where refusing would refuse the
    whole record for one character. One C-speed check in the usual case."""
    encoded = orjson.dumps(value)
    if b"\\u0000" not in encoded:
        return value
    stored: T = orjson.loads(_NUL_ESCAPE.sub(rb"\1\\ufffd", encoded))
    return stored
