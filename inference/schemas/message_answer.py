"""The Messages API's answer (spec 1, "Messages-style API": Response), as the gateway reads an external
provider's whole answer before it reaches the client: parsed into the schema and re-serialized
(502 ``parse_error`` when it does not parse).

The schema: ``id`` a string, ``type`` "message", ``role`` "assistant", ``content`` an array of blocks
(each an object with a string ``type``; text, tool_use and thinking blocks with their typed fields;
further block types a provider may add are kept as they are), ``model`` a string, ``stop_reason`` and
``stop_sequence`` a string or null (absent: null), ``usage`` with integer ``input_tokens`` and
``output_tokens`` and the cache counters an integer or null. Fields the schema does not model (a
provider's newer ones) are kept, as they are on requests.
"""

from __future__ import annotations

from typing import Any

import orjson

from inference.errors import parse_error

__all__ = ["parse_message", "reserialize_message"]

_BLOCK_FIELDS: dict[str, tuple[tuple[str, type], ...]] = {
    "text": (("text", str),),
    "tool_use": (("id", str), ("name", str), ("input", dict)),
    "thinking": (("thinking", str), ("signature", str)),
    "redacted_thinking": (("data", str),),
}
_COUNTERS = ("input_tokens", "output_tokens")
_CACHE_COUNTERS = ("cache_creation_input_tokens", "cache_read_input_tokens")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_block(block: Any, i: int) -> None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise parse_error(f"content[{i}] is not a block with a type")
    for name, kind in _BLOCK_FIELDS.get(block["type"], ()):
        if not isinstance(block.get(name), kind):
            raise parse_error(f"content[{i}].{name} is missing or of the wrong type")


def _check_usage(usage: Any) -> None:
    if not isinstance(usage, dict):
        raise parse_error("usage is not an object")
    for name in _COUNTERS:
        if not _is_int(usage.get(name)):
            raise parse_error(f"usage.{name} is not an integer")
    for name in _CACHE_COUNTERS:
        value = usage.get(name)
        if value is not None and not _is_int(value):
            raise parse_error(f"usage.{name} is not an integer")


def parse_message(raw: bytes) -> dict[str, Any]:
    """``raw`` parsed as a Messages answer (stop_reason and stop_sequence null when absent). Raises
    GatewayError 502 parse_error."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise parse_error("not JSON") from None
    if not isinstance(message, dict):
        raise parse_error("not a JSON object")
    if message.get("type") != "message" or message.get("role") != "assistant":
        raise parse_error("not an assistant message")
    for name in ("id", "model"):
        if not isinstance(message.get(name), str):
            raise parse_error(f"{name} is not a string")
    content = message.get("content")
    if not isinstance(content, list):
        raise parse_error("content is not an array")
    for i, block in enumerate(content):
        _check_block(block, i)
    for name in ("stop_reason", "stop_sequence"):
        value = message.setdefault(name, None)
        if value is not None and not isinstance(value, str):
            raise parse_error(f"{name} is not a string or null")
    _check_usage(message.get("usage"))
    return message


def reserialize_message(raw: bytes) -> bytes:
    """``raw`` parsed as a Messages answer and serialized again. Raises GatewayError 502 parse_error."""
    return orjson.dumps(parse_message(raw))
