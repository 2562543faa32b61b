"""The history store: where stored responses and conversations live (``--history-backend``).

One small async interface (:class:`HistoryStore`), three backends: ``db`` (the Django store,
responses_api/storage/db.py), ``memory`` (this process, bounded; memory.py) and ``none`` (nothing is
kept; none.py). Callers pass the tenant scope of the caller (responses_api/scope.py) to every call; a
record of another scope is unknown.

Items cross the interface as plain dicts in their API shape, each with an ``id`` and a ``type``
(responses_api/items.py normalizes client items and assigns ids). An item id names one item within a
scope: storing an item whose id is already stored in the scope links the stored item (its content
wins, as OpenAI does), so a response's output item appended to a conversation, or referenced by
another, is one item.

Each method is one logical read or write: the db backend runs it as one function on a worker thread
(one transaction for a write, never held across an await).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Collection, Literal, Mapping, Sequence, TypedDict

from responses_api.limits import LIST_LIMIT_DEFAULT, METADATA_MAX_PAIRS

__all__ = [
    "HistoryStore",
    "ConversationRecord",
    "ConversationObject",
    "ItemPage",
    "ItemListObject",
    "ItemReference",
    "NewItem",
    "Order",
    "ResponseColumns",
    "HistoryError",
    "ConversationNotFound",
    "ItemNotFound",
    "CursorNotFound",
    "ItemAlreadyInConversation",
    "ReferencedItemNotFound",
    "MetadataLimitExceeded",
    "HistoryFull",
    "merge_metadata",
    "output_items",
    "TERMINAL_STATUSES",
]

Order = Literal["asc", "desc"]
TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


# --- errors -------------------------------------------------------------------------------------------


class HistoryError(Exception):
    """A refusal of the store, answered as the API says (responses_api/api/errors.py)."""


class ConversationNotFound(HistoryError):
    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"Conversation not found: {conversation_id}")
        self.conversation_id = conversation_id


class ItemNotFound(HistoryError):
    """The item is not (or no longer) in the conversation."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"Item not found in this conversation: {item_id}")
        self.item_id = item_id


class CursorNotFound(HistoryError):
    """``after`` names no item of the conversation."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"No item found with id '{item_id}'")
        self.item_id = item_id


class ItemAlreadyInConversation(HistoryError):
    def __init__(self, item_id: str) -> None:
        super().__init__("Item already in conversation")
        self.item_id = item_id


class ReferencedItemNotFound(HistoryError):
    def __init__(self, item_id: str) -> None:
        super().__init__(f"Referenced item '{item_id}' not found")
        self.item_id = item_id


class MetadataLimitExceeded(HistoryError):
    def __init__(self) -> None:
        super().__init__(f"metadata cannot have more than {METADATA_MAX_PAIRS} properties")


class HistoryFull(HistoryError):
    """The memory backend cannot hold the record within its bound (one conversation alone beyond it)."""


# --- values -------------------------------------------------------------------------------------------


class ConversationObject(TypedDict):
    id: str
    object: Literal["conversation"]
    created_at: int
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    id: str
    created_at: int  # Unix seconds
    metadata: dict[str, str] = field(default_factory=dict)

    def to_object(self) -> ConversationObject:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": dict(self.metadata)}


class ItemListObject(TypedDict):
    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


@dataclass(frozen=True, slots=True)
class ItemPage:
    """A page of a conversation's items (each with its ``created_at``), in the order asked."""

    items: list[dict[str, Any]]
    has_more: bool = False

    def to_object(self) -> ItemListObject:
        return {
            "object": "list",
            "data": self.items,
            "first_id": self.items[0]["id"] if self.items else None,
            "last_id": self.items[-1]["id"] if self.items else None,
            "has_more": self.has_more,
        }


@dataclass(frozen=True, slots=True)
class ItemReference:
    """``{"type": "item_reference", "id": ...}``: an item stored in the scope, added by reference."""

    id: str


NewItem = Mapping[str, Any] | ItemReference


@dataclass(frozen=True, slots=True)
class ResponseColumns:
    """What the store indexes of a response object (the object itself is kept whole)."""

    id: str
    model: str
    status: str
    created_at: int
    background: bool
    store: bool
    previous_response_id: str
    conversation_id: str

    @classmethod
    def of(cls, response: Mapping[str, Any]) -> ResponseColumns:
        conversation = response.get("conversation")
        if isinstance(conversation, Mapping):
            conversation = conversation.get("id")
        created_at = response.get("created_at")
        return cls(
            id=str(response["id"]),
            model=str(response.get("model") or ""),
            status=str(response.get("status") or "completed"),
            created_at=int(created_at) if isinstance(created_at, (int, float)) else 0,
            background=bool(response.get("background")),
            store=response.get("store") is not False,
            previous_response_id=str(response.get("previous_response_id") or ""),
            conversation_id=str(conversation or ""),
        )


def merge_metadata(current: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """``current`` with ``changes`` merged (a None value deletes its key); at most 16 pairs."""
    merged = dict(current)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    if len(merged) > METADATA_MAX_PAIRS:
        raise MetadataLimitExceeded()
    return merged


def output_items(response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    output = response.get("output")
    return [item for item in output if isinstance(item, Mapping)] if isinstance(output, list) else []


# --- the interface --------------------------------------------------------------------------------------


class HistoryStore(abc.ABC):
    """Stored responses and conversations of every scope. Items passed in carry ``id`` and ``type``."""

    name: str = ""
    keeps_records: bool = True
    """False for a store that writes nothing (a response it does not find was never there, not
    deleted or cancelled)."""
    in_database: bool = False
    """True for a store in the gateway's database: its routes answer 503 at once while the database
    is known down (responses_api/api/admission.py)."""

    # --- responses ---

    @abc.abstractmethod
    async def asave_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        input_items: Sequence[Mapping[str, Any]],
        *,
        append_to_conversation: bool = False,
    ) -> None:
        """Store a new response object (its output items are ``response["output"]``) with its input
        items in order. ``append_to_conversation``: also append the input then output items to the
        response's ``conversation`` (items already there are skipped; a conversation gone meanwhile is
        ignored), in the same write."""

    @abc.abstractmethod
    async def aget_response(self, scope: str, response_id: str) -> dict[str, Any] | None:
        """The stored response object (its status as stored last), or None."""

    @abc.abstractmethod
    async def aupdate_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        *,
        only_from: Collection[str] = (),
        append_to_conversation: bool = False,
    ) -> bool:
        """Replace a stored response object and its output items (a background run finishing).
        With ``only_from``, only while its stored status is one of them (a cancelled run's result is
        dropped). False when nothing was updated."""

    @abc.abstractmethod
    async def aset_response_status(
        self, scope: str, response_id: str, status: str, *, only_from: Collection[str] = ()
    ) -> bool:
        """Set a response's status (cancel: ``only_from=("queued", "in_progress")``). False when the
        response is unknown or its status is not in ``only_from``."""

    @abc.abstractmethod
    async def adelete_response(self, scope: str, response_id: str) -> bool:
        """Delete a response and its items no conversation or other response holds."""

    @abc.abstractmethod
    async def alist_input_items(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        """A response's input items in order, or None for an unknown response."""

    @abc.abstractmethod
    async def aget_items(self, scope: str, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The stored items of ``item_ids`` this scope has, by id (an item_reference's target)."""

    @abc.abstractmethod
    async def aresponse_history(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        """What ``previous_response_id`` continues from: the input then output items of each response
        of the chain ending at ``response_id``, oldest first. None when ``response_id`` is unknown."""

    # --- conversations ---

    @abc.abstractmethod
    async def acreate_conversation(
        self, scope: str, metadata: Mapping[str, str], items: Sequence[NewItem] = ()
    ) -> ConversationRecord:
        """A new conversation (id generated), with its first items. Raises ReferencedItemNotFound,
        ItemAlreadyInConversation (an id twice) and nothing is created."""

    @abc.abstractmethod
    async def aget_conversation(self, scope: str, conversation_id: str) -> ConversationRecord | None: ...

    @abc.abstractmethod
    async def aupdate_conversation(
        self, scope: str, conversation_id: str, changes: Mapping[str, str | None]
    ) -> ConversationRecord | None:
        """Merge ``changes`` into the metadata (None deletes a key). None for an unknown conversation;
        raises MetadataLimitExceeded when the result has more than 16 pairs."""

    @abc.abstractmethod
    async def adelete_conversation(self, scope: str, conversation_id: str) -> bool:
        """Delete a conversation and its items nothing else holds. False when unknown."""

    @abc.abstractmethod
    async def aadd_items(self, scope: str, conversation_id: str, items: Sequence[NewItem]) -> list[dict[str, Any]]:
        """Append items (all or none) and answer them as stored (each with ``created_at``). An item
        deleted from the conversation before comes back at the end. Raises ConversationNotFound,
        ReferencedItemNotFound, ItemAlreadyInConversation."""

    @abc.abstractmethod
    async def alist_items(
        self,
        scope: str,
        conversation_id: str,
        *,
        limit: int = LIST_LIMIT_DEFAULT,
        order: Order = "desc",
        after: str | None = None,
    ) -> ItemPage:
        """A page of the conversation's items (not deleted ones) after the item ``after`` in ``order``.
        Raises ConversationNotFound, CursorNotFound."""

    @abc.abstractmethod
    async def aget_item(self, scope: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        """One item of the conversation, with ``created_at``. Raises ConversationNotFound, ItemNotFound."""

    @abc.abstractmethod
    async def adelete_item(self, scope: str, conversation_id: str, item_id: str) -> ConversationRecord:
        """Remove an item from the conversation (soft: the item persists while anything holds it) and
        answer the conversation. Raises ConversationNotFound, ItemNotFound."""

    @abc.abstractmethod
    async def aconversation_history(self, scope: str, conversation_id: str) -> list[dict[str, Any]]:
        """Every item of the conversation, oldest first (what a response with ``conversation`` continues
        from). Raises ConversationNotFound."""

    @abc.abstractmethod
    async def aappend_items(self, scope: str, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> int:
        """Append items a response used or made (items already in the conversation are skipped) and
        answer how many were added. Raises ConversationNotFound."""
