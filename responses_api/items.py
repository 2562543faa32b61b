"""Items a client gives (conversation items, response input): checked, normalized to the shape they are
answered in, and given an id by type (msg_, fc_, mcp_, rs_, ...; responses_api/ids.py).

Normalized shapes follow OpenAI's stored items, so a strict SDK reads them back: a message's string
content becomes one ``input_text`` part (``output_text`` with ``annotations`` for the assistant), a
missing ``status`` is ``completed``. Fields the checks do not model are kept.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from responses_api.ids import new_item_id
from responses_api.limits import ITEM_ID_MAX
from responses_api.storage.base import ItemReference, NewItem

__all__ = [
    "ACCEPTED_ITEM_TYPES",
    "MESSAGE_ROLES",
    "ItemError",
    "parse_item",
    "with_id",
    "valid_item_id",
]

# Item types POST /v1/conversations/{id}/items accepts (spec 2, Conversation and list shapes).
ACCEPTED_ITEM_TYPES = (
    "message",
    "reasoning",
    "mcp_list_tools",
    "mcp_call",
    "item_reference",
    "function_call",
    "function_call_output",
)
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
_ITEM_STATUSES = ("in_progress", "completed", "incomplete")
_MCP_CALL_STATUSES = ("in_progress", "completed", "incomplete", "calling", "failed")
_IMAGE_DETAILS = ("low", "high", "auto", "original")
_ITEM_ID = re.compile(r"[A-Za-z0-9_\-]+")


class ItemError(ValueError):
    """An item the API refuses (400); the message names the item and the field."""


def valid_item_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= ITEM_ID_MAX and _ITEM_ID.fullmatch(value) is not None


# --- field checks -----------------------------------------------------------------------------------------


def _string(item: Mapping[str, Any], key: str, where: str, *, empty: bool = True) -> None:
    value = item.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise ItemError(f"{where}.{key} must be a {'non-empty ' if not empty else ''}string")


def _optional_string(item: Mapping[str, Any], key: str, where: str) -> None:
    if item.get(key) is not None and not isinstance(item[key], str):
        raise ItemError(f"{where}.{key} must be a string")


def _status(item: dict[str, Any], where: str, allowed: tuple[str, ...] = _ITEM_STATUSES) -> None:
    status = item.get("status")
    if status is None:
        item["status"] = "completed"
    elif status not in allowed:
        raise ItemError(f"{where}.status must be one of {', '.join(allowed)}")


def _text_part(part: dict[str, Any], where: str) -> None:
    _string(part, "text", where)


def _output_text_part(part: dict[str, Any], where: str) -> None:
    _string(part, "text", where)
    annotations = part.setdefault("annotations", [])
    if not isinstance(annotations, list):
        raise ItemError(f"{where}.annotations must be an array")
    if "logprobs" in part and part["logprobs"] is not None and not isinstance(part["logprobs"], list):
        raise ItemError(f"{where}.logprobs must be an array")


def _refusal_part(part: dict[str, Any], where: str) -> None:
    _string(part, "refusal", where)


def _image_part(part: dict[str, Any], where: str) -> None:
    detail = part.setdefault("detail", "auto")
    if detail not in _IMAGE_DETAILS:
        raise ItemError(f"{where}.detail must be one of {', '.join(_IMAGE_DETAILS)}")
    for key in ("image_url", "file_id"):
        _optional_string(part, key, where)


def _file_part(part: dict[str, Any], where: str) -> None:
    for key in ("file_id", "file_data", "file_url", "filename"):
        _optional_string(part, key, where)


_PARTS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "input_text": _text_part,
    "output_text": _output_text_part,
    "text": _text_part,
    "summary_text": _text_part,
    "reasoning_text": _text_part,
    "refusal": _refusal_part,
    "input_image": _image_part,
    "input_file": _file_part,
}
_TOOL_OUTPUT_PARTS = ("input_text", "input_image", "input_file")


def _parts(value: Any, where: str, allowed: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ItemError(f"{where} must be a string or an array of content parts")
    parts: list[dict[str, Any]] = []
    for index, raw in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(raw, dict):
            raise ItemError(f"{at} must be an object")
        kind = raw.get("type")
        check = _PARTS.get(kind) if isinstance(kind, str) else None
        if check is None or (allowed is not None and kind not in allowed):
            names = ", ".join(allowed or tuple(_PARTS))
            raise ItemError(f"{at}.type must be one of {names}")
        part = dict(raw)
        check(part, at)
        parts.append(part)
    return parts


# --- item checks, by type -------------------------------------------------------------------------------


def _message(item: dict[str, Any], where: str) -> None:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise ItemError(f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        part_type = "output_text" if role == "assistant" else "input_text"
        part: dict[str, Any] = {"type": part_type, "text": content}
        if part_type == "output_text":
            part["annotations"] = []
        item["content"] = [part]
    else:
        item["content"] = _parts(content, f"{where}.content")
    _status(item, where)


def _reasoning(item: dict[str, Any], where: str) -> None:
    item["summary"] = _parts(item.get("summary", []), f"{where}.summary", ("summary_text",))
    if item.get("content") is not None:
        item["content"] = _parts(item["content"], f"{where}.content", ("reasoning_text",))
    _optional_string(item, "encrypted_content", where)
    _status(item, where)


def _function_call(item: dict[str, Any], where: str) -> None:
    _string(item, "call_id", where, empty=False)
    _string(item, "name", where, empty=False)
    _string(item, "arguments", where)
    _optional_string(item, "namespace", where)
    _status(item, where)


def _function_call_output(item: dict[str, Any], where: str) -> None:
    _string(item, "call_id", where, empty=False)
    output = item.get("output")
    if not isinstance(output, str):
        item["output"] = _parts(output, f"{where}.output", _TOOL_OUTPUT_PARTS)
    _status(item, where)


def _mcp_list_tools(item: dict[str, Any], where: str) -> None:
    _string(item, "server_label", where, empty=False)
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise ItemError(f"{where}.tools must be an array")
    checked = []
    for index, raw in enumerate(tools):
        at = f"{where}.tools[{index}]"
        if not isinstance(raw, dict):
            raise ItemError(f"{at} must be an object")
        tool = dict(raw)
        _string(tool, "name", at, empty=False)
        _optional_string(tool, "description", at)
        schema = tool.setdefault("input_schema", {})
        if not isinstance(schema, dict):
            raise ItemError(f"{at}.input_schema must be an object")
        checked.append(tool)
    item["tools"] = checked
    _optional_string(item, "error", where)


def _mcp_call(item: dict[str, Any], where: str) -> None:
    _string(item, "server_label", where, empty=False)
    _string(item, "name", where, empty=False)
    _string(item, "arguments", where)
    _optional_string(item, "output", where)
    _optional_string(item, "approval_request_id", where)
    error = item.get("error")
    if error is not None and not isinstance(error, (str, dict)):
        raise ItemError(f"{where}.error must be a string or an object")
    _status(item, where, _MCP_CALL_STATUSES)


_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "message": _message,
    "reasoning": _reasoning,
    "function_call": _function_call,
    "function_call_output": _function_call_output,
    "mcp_list_tools": _mcp_list_tools,
    "mcp_call": _mcp_call,
}


def parse_item(raw: Any, where: str, accepted: tuple[str, ...] = ACCEPTED_ITEM_TYPES) -> NewItem:
    """One client item, checked and normalized, with its id (the client's or a new one); an
    ``item_reference`` becomes an :class:`ItemReference`. Raises ItemError."""
    if not isinstance(raw, dict):
        raise ItemError(f"{where} must be an object")
    item_type = raw.get("type", "message" if "role" in raw else None)
    if not isinstance(item_type, str) or item_type not in accepted:
        raise ItemError(f"{where}.type must be one of {', '.join(accepted)}")
    item_id = raw.get("id")
    if item_id is not None and not valid_item_id(item_id):
        raise ItemError(f"{where}.id must be 1 to {ITEM_ID_MAX} letters, digits, '_' or '-'")
    if item_type == "item_reference":
        if item_id is None:
            raise ItemError(f"{where}.id is required for an item_reference")
        return ItemReference(item_id)
    item = dict(raw)
    item["type"] = item_type
    _CHECKS[item_type](item, where)
    return with_id(item)


def with_id(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` with an id (its own, else a new one by its type), id and type first as OpenAI shows them."""
    item_type = str(item.get("type") or "message")
    item_id = item.get("id")
    if not isinstance(item_id, str) or not item_id:
        item_id = new_item_id(item_type)
    rest = {key: value for key, value in item.items() if key not in ("id", "type")}
    return {"id": item_id, "type": item_type, **rest}
