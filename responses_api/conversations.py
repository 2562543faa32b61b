"""The Conversations API's requests (spec 2): bodies and queries checked strictly before the store sees
them. Each reader returns what the store takes or raises :class:`RequestError` (answered 400 as
``{"error": <message>}``) or :class:`InvalidInclude` (the structured invalid_value error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from common.json_text import NUL_MESSAGE, nul_free
from responses_api.items import ItemError, parse_item, valid_item_id
from responses_api.limits import (
    ITEMS_PER_CREATE,
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    OBJECT_ID_MAX,
    metadata_problem,
)
from responses_api.storage.base import NewItem, Order

__all__ = [
    "INCLUDABLE",
    "RequestError",
    "InvalidInclude",
    "ListQuery",
    "CreateConversation",
    "parse_body",
    "read_create",
    "read_update",
    "read_items",
    "read_list_query",
    "read_include",
    "known_id",
]

# What an include query may name (OpenAI's includable values); items are answered whole either way.
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)


class RequestError(ValueError):
    """A request the API refuses with ``{"error": <message>}`` (400 unless ``status`` says)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class InvalidInclude(ValueError):
    def __init__(self, value: str) -> None:
        super().__init__(f"Invalid value: '{value}'. Supported values are: {', '.join(INCLUDABLE)}.")
        self.value = value


@dataclass(frozen=True, slots=True)
class CreateConversation:
    metadata: dict[str, str]
    items: list[NewItem]


@dataclass(frozen=True, slots=True)
class ListQuery:
    limit: int = LIST_LIMIT_DEFAULT
    order: Order = "desc"
    after: str | None = None


def known_id(value: str, limit: int = OBJECT_ID_MAX) -> bool:
    """Whether a path or cursor id could name a stored object (else it is unknown without a lookup)."""
    return valid_item_id(value) and len(value) <= limit


# --- bodies ---------------------------------------------------------------------------------------------


def parse_body(raw: bytes, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A JSON object body with no parameter outside ``allowed``."""
    if not raw.strip():
        raise RequestError("Request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"Request body is not valid JSON: {exc.msg}") from None
    if not isinstance(body, dict):
        raise RequestError("Request body must be a JSON object")
    for key in body:
        if key not in allowed:
            raise RequestError(f"Unknown parameter: '{key}'")
    if not nul_free(body):
        raise RequestError(NUL_MESSAGE)
    return body


def _metadata(value: Any, *, deletions: bool) -> dict[str, Any]:
    problem = metadata_problem(value, deletions=deletions)
    if problem is not None:
        raise RequestError(problem)
    return dict(value)


def _items(value: Any, *, required: bool) -> list[NewItem]:
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise RequestError("Missing or invalid 'items' field: expected an array of items")
    if required and not value:
        raise RequestError("'items' must contain at least one item")
    if len(value) > ITEMS_PER_CREATE:
        raise RequestError(f"Cannot add more than {ITEMS_PER_CREATE} items at a time")
    try:
        return [parse_item(raw, f"items[{index}]") for index, raw in enumerate(value)]
    except ItemError as exc:
        raise RequestError(f"Invalid item: {exc}") from None


def read_create(raw: bytes) -> CreateConversation:
    """POST /v1/conversations: ``{metadata?, items?}`` (an empty body creates an empty conversation)."""
    body = parse_body(raw, ("metadata", "items")) if raw.strip() else {}
    metadata = body.get("metadata")
    return CreateConversation(
        metadata=_metadata(metadata, deletions=False) if metadata is not None else {},
        items=_items(body.get("items"), required=False),
    )


def read_update(raw: bytes) -> dict[str, str | None]:
    """POST /v1/conversations/{id}: ``{metadata}``, merged (a null value deletes its key; a null
    metadata changes nothing)."""
    body = parse_body(raw, ("metadata",))
    if "metadata" not in body:
        raise RequestError("Missing required parameter: 'metadata'")
    metadata = body["metadata"]
    return {} if metadata is None else _metadata(metadata, deletions=True)


def read_items(raw: bytes) -> list[NewItem]:
    """POST /v1/conversations/{id}/items: ``{items}``, 1 to 20 of the accepted types."""
    body = parse_body(raw, ("items",))
    return _items(body.get("items"), required=True)


# --- queries ----------------------------------------------------------------------------------------------


def read_list_query(query: Mapping[str, str]) -> ListQuery:
    limit = LIST_LIMIT_DEFAULT
    raw_limit = query.get("limit")
    if raw_limit is not None:
        text = raw_limit.strip()
        limit = int(text) if text.isascii() and text.isdigit() and len(text) <= 4 else 0
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise RequestError(f"limit must be an integer from 1 to {LIST_LIMIT_MAX}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError("order must be 'asc' or 'desc'")
    after = query.get("after")
    return ListQuery(limit=limit, order="asc" if order == "asc" else "desc", after=after if after else None)


def read_include(values: list[str]) -> list[str]:
    """The include query (``include`` or ``include[]``, repeatable); an unknown value is refused."""
    for value in values:
        if value not in INCLUDABLE:
            raise InvalidInclude(value)
    return values
