"""The none history backend (``--history-backend none``): nothing is stored. Writes do nothing (a new
conversation is answered but not kept), reads find nothing, so every stored object answers 404."""

from __future__ import annotations

import time
from typing import Any, Collection, Mapping, Sequence

from responses_api.ids import new_conversation_id
from responses_api.limits import LIST_LIMIT_DEFAULT
from responses_api.storage.base import (
    ConversationNotFound,
    ConversationRecord,
    HistoryStore,
    ItemPage,
    NewItem,
    Order,
)

__all__ = ["NoHistoryStore"]


class NoHistoryStore(HistoryStore):
    name = "none"
    keeps_records = False

    async def asave_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        input_items: Sequence[Mapping[str, Any]],
        *,
        append_to_conversation: bool = False,
    ) -> None:
        return None

    async def aget_response(self, scope: str, response_id: str) -> dict[str, Any] | None:
        return None

    async def aupdate_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        *,
        only_from: Collection[str] = (),
        append_to_conversation: bool = False,
    ) -> bool:
        return False

    async def aset_response_status(
        self, scope: str, response_id: str, status: str, *, only_from: Collection[str] = ()
    ) -> bool:
        return False

    async def adelete_response(self, scope: str, response_id: str) -> bool:
        return False

    async def alist_input_items(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        return None

    async def aget_items(self, scope: str, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {}

    async def aresponse_history(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        return None

    async def acreate_conversation(
        self, scope: str, metadata: Mapping[str, str], items: Sequence[NewItem] = ()
    ) -> ConversationRecord:
        return ConversationRecord(new_conversation_id(), int(time.time()), dict(metadata))

    async def aget_conversation(self, scope: str, conversation_id: str) -> ConversationRecord | None:
        return None

    async def aupdate_conversation(
        self, scope: str, conversation_id: str, changes: Mapping[str, str | None]
    ) -> ConversationRecord | None:
        return None

    async def adelete_conversation(self, scope: str, conversation_id: str) -> bool:
        return False

    async def aadd_items(self, scope: str, conversation_id: str, items: Sequence[NewItem]) -> list[dict[str, Any]]:
        raise ConversationNotFound(conversation_id)

    async def alist_items(
        self,
        scope: str,
        conversation_id: str,
        *,
        limit: int = LIST_LIMIT_DEFAULT,
        order: Order = "desc",
        after: str | None = None,
    ) -> ItemPage:
        raise ConversationNotFound(conversation_id)

    async def aget_item(self, scope: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        raise ConversationNotFound(conversation_id)

    async def adelete_item(self, scope: str, conversation_id: str, item_id: str) -> ConversationRecord:
        raise ConversationNotFound(conversation_id)

    async def aconversation_history(self, scope: str, conversation_id: str) -> list[dict[str, Any]]:
        raise ConversationNotFound(conversation_id)

    async def aappend_items(self, scope: str, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> int:
        raise ConversationNotFound(conversation_id)
