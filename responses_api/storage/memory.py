"""The memory history backend (``--history-backend memory``): this process's dicts, lost on restart and
not seen by other processes (a supervised gateway's processes each keep their own).

Bounded: at most ``--history-memory-max-entries`` objects (responses, conversations and items
together, each counted once). A write that goes over it evicts the oldest responses and conversations
(by creation) other than the one written, with the items nothing else holds; a conversation or
response that alone would exceed the bound is refused (:class:`HistoryFull`). Every method runs
without awaiting under one lock, so it is atomic on the event loop and across threads.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping, Sequence

from responses_api.ids import new_conversation_id
from responses_api.limits import HISTORY_CHAIN_MAX, LIST_LIMIT_DEFAULT
from responses_api.storage.base import (
    ConversationNotFound,
    ConversationRecord,
    CursorNotFound,
    HistoryFull,
    HistoryStore,
    ItemAlreadyInConversation,
    ItemNotFound,
    ItemPage,
    ItemReference,
    NewItem,
    Order,
    ReferencedItemNotFound,
    ResponseColumns,
    merge_metadata,
    output_items,
)

__all__ = ["MemoryHistoryStore"]

_Key = tuple[str, str]  # (scope, item id)


@dataclass(slots=True)
class _Item:
    body: dict[str, Any]
    created_at: int
    holders: int = 0  # response links and conversation memberships (deleted ones too)


@dataclass(slots=True)
class _Response:
    scope: str
    body: dict[str, Any]
    status: str
    conversation_id: str
    previous_response_id: str
    inputs: list[str]
    outputs: list[str]


@dataclass(slots=True)
class _Conversation:
    scope: str
    id: str
    created_at: int
    metadata: dict[str, str]
    # item id -> deleted; insertion order is the conversation's order (re-adding moves to the end)
    members: OrderedDict[str, bool] = field(default_factory=OrderedDict)

    def record(self) -> ConversationRecord:
        return ConversationRecord(self.id, self.created_at, dict(self.metadata))

    def active(self) -> list[str]:
        return [item_id for item_id, deleted in self.members.items() if not deleted]


def _now() -> int:
    return int(time.time())


class MemoryHistoryStore(HistoryStore):
    name = "memory"

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._items: dict[_Key, _Item] = {}
        self._responses: dict[str, _Response] = {}
        self._conversations: dict[str, _Conversation] = {}
        self._age: OrderedDict[tuple[str, str], None] = OrderedDict()  # ("response"|"conversation", id), oldest first

    @property
    def size(self) -> int:
        """Objects held: responses + conversations + items."""
        return len(self._responses) + len(self._conversations) + len(self._items)

    # --- items ---

    def _hold(self, scope: str, body: Mapping[str, Any], now: int) -> str:
        key = (scope, str(body["id"]))
        stored = self._items.get(key)
        if stored is None:
            stored = self._items[key] = _Item(copy.deepcopy(dict(body)), now)
        stored.holders += 1
        return key[1]

    def _release(self, scope: str, item_ids: Iterable[str]) -> None:
        for item_id in item_ids:
            stored = self._items.get((scope, item_id))
            if stored is None:
                continue
            stored.holders -= 1
            if stored.holders <= 0:
                del self._items[(scope, item_id)]

    def _body(self, scope: str, item_id: str) -> dict[str, Any]:
        return copy.deepcopy(self._items[(scope, item_id)].body)

    def _listed(self, scope: str, item_id: str) -> dict[str, Any]:
        stored = self._items[(scope, item_id)]
        return {**copy.deepcopy(stored.body), "created_at": stored.created_at}

    # --- bounds ---

    def _new_objects(self, scope: str, bodies: Iterable[Mapping[str, Any]]) -> int:
        return len({str(body["id"]) for body in bodies if (scope, str(body["id"])) not in self._items})

    def _check_fits(self, own: int) -> None:
        if own > self.max_entries:
            raise HistoryFull(
                f"the memory history backend holds at most {self.max_entries} objects "
                "(--history-memory-max-entries); this record alone needs more"
            )

    def _evict(self, keep: tuple[str, str]) -> None:
        for key in list(self._age):
            if self.size <= self.max_entries:
                return
            if key == keep:
                continue
            kind, record_id = key
            if kind == "response":
                self._drop_response(record_id)
            else:
                self._drop_conversation(record_id)

    def _drop_response(self, response_id: str) -> None:
        response = self._responses.pop(response_id)
        self._age.pop(("response", response_id), None)
        self._release(response.scope, [*response.inputs, *response.outputs])

    def _drop_conversation(self, conversation_id: str) -> None:
        conversation = self._conversations.pop(conversation_id)
        self._age.pop(("conversation", conversation_id), None)
        self._release(conversation.scope, list(conversation.members))

    # --- responses ---

    def _response(self, scope: str, response_id: str) -> _Response | None:
        response = self._responses.get(response_id)
        return response if response is not None and response.scope == scope else None

    def _append(self, scope: str, conversation_id: str, bodies: Sequence[Mapping[str, Any]], now: int) -> int:
        conversation = self._conversations.get(conversation_id)
        if conversation is None or conversation.scope != scope:
            raise ConversationNotFound(conversation_id)
        added = 0
        for body in bodies:
            item_id = str(body["id"])
            deleted = conversation.members.get(item_id)
            if deleted is False:
                continue
            if deleted is None:
                self._hold(scope, body, now)
            else:
                conversation.members.pop(item_id)
            conversation.members[item_id] = False
            added += 1
        return added

    async def asave_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        input_items: Sequence[Mapping[str, Any]],
        *,
        append_to_conversation: bool = False,
    ) -> None:
        columns = ResponseColumns.of(response)
        outputs = output_items(response)
        now = _now()
        with self._lock:
            self._check_fits(1 + self._new_objects(scope, [*input_items, *outputs]))
            if columns.id in self._responses:  # saved again: the new object replaces it
                self._drop_response(columns.id)
            self._responses[columns.id] = _Response(
                scope=scope,
                body=copy.deepcopy(dict(response)),
                status=columns.status,
                conversation_id=columns.conversation_id,
                previous_response_id=columns.previous_response_id,
                inputs=[self._hold(scope, item, now) for item in input_items],
                outputs=[self._hold(scope, item, now) for item in outputs],
            )
            self._age[("response", columns.id)] = None
            if append_to_conversation and columns.conversation_id:
                try:
                    self._append(scope, columns.conversation_id, [*input_items, *outputs], now)
                except ConversationNotFound:
                    pass
            self._evict(("response", columns.id))

    async def aget_response(self, scope: str, response_id: str) -> dict[str, Any] | None:
        with self._lock:
            response = self._response(scope, response_id)
            if response is None:
                return None
            return {**copy.deepcopy(response.body), "status": response.status}

    async def aupdate_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        *,
        only_from: Collection[str] = (),
        append_to_conversation: bool = False,
    ) -> bool:
        columns = ResponseColumns.of(response)
        outputs = output_items(response)
        now = _now()
        with self._lock:
            stored = self._response(scope, columns.id)
            if stored is None or (only_from and stored.status not in only_from):
                return False
            old_outputs = stored.outputs
            stored.outputs = [self._hold(scope, item, now) for item in outputs]
            self._release(scope, old_outputs)
            stored.body = copy.deepcopy(dict(response))
            stored.status = columns.status
            if append_to_conversation and stored.conversation_id:
                inputs = [self._body(scope, item_id) for item_id in stored.inputs]
                try:
                    self._append(scope, stored.conversation_id, [*inputs, *outputs], now)
                except ConversationNotFound:
                    pass
            self._evict(("response", columns.id))
            return True

    async def aset_response_status(
        self, scope: str, response_id: str, status: str, *, only_from: Collection[str] = ()
    ) -> bool:
        with self._lock:
            stored = self._response(scope, response_id)
            if stored is None or (only_from and stored.status not in only_from):
                return False
            stored.status = status
            return True

    async def adelete_response(self, scope: str, response_id: str) -> bool:
        with self._lock:
            if self._response(scope, response_id) is None:
                return False
            self._drop_response(response_id)
            return True

    async def alist_input_items(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            response = self._response(scope, response_id)
            if response is None:
                return None
            return [self._body(scope, item_id) for item_id in response.inputs]

    async def aget_items(self, scope: str, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {item_id: self._body(scope, item_id) for item_id in item_ids if (scope, item_id) in self._items}

    async def aresponse_history(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            chain: list[_Response] = []
            seen: set[str] = set()
            current: str = response_id
            while current and current not in seen and len(chain) < HISTORY_CHAIN_MAX:
                response = self._response(scope, current)
                if response is None:
                    break
                seen.add(current)
                chain.append(response)
                current = response.previous_response_id
            if not chain:
                return None
            items: list[dict[str, Any]] = []
            for response in reversed(chain):
                items.extend(self._body(scope, item_id) for item_id in [*response.inputs, *response.outputs])
            return items

    # --- conversations ---

    def _conversation(self, scope: str, conversation_id: str) -> _Conversation:
        conversation = self._conversations.get(conversation_id)
        if conversation is None or conversation.scope != scope:
            raise ConversationNotFound(conversation_id)
        return conversation

    def _resolve(self, scope: str, conversation: _Conversation, items: Sequence[NewItem]) -> list[Mapping[str, Any]]:
        """The bodies to add, checked before anything changes."""
        bodies: list[Mapping[str, Any]] = []
        seen: set[str] = set()
        for item in items:
            if isinstance(item, ItemReference):
                stored = self._items.get((scope, item.id))
                if stored is None:
                    raise ReferencedItemNotFound(item.id)
                body: Mapping[str, Any] = stored.body
            else:
                body = item
            item_id = str(body["id"])
            if item_id in seen or conversation.members.get(item_id) is False:
                raise ItemAlreadyInConversation(item_id)
            seen.add(item_id)
            bodies.append(body)
        new = self._new_objects(scope, bodies)
        self._check_fits(1 + len(conversation.members) + new)
        return bodies

    async def acreate_conversation(
        self, scope: str, metadata: Mapping[str, str], items: Sequence[NewItem] = ()
    ) -> ConversationRecord:
        conversation = _Conversation(scope, new_conversation_id(), _now(), dict(metadata))
        with self._lock:
            bodies = self._resolve(scope, conversation, items)
            self._conversations[conversation.id] = conversation
            self._age[("conversation", conversation.id)] = None
            self._append(scope, conversation.id, bodies, conversation.created_at)
            self._evict(("conversation", conversation.id))
            return conversation.record()

    async def aget_conversation(self, scope: str, conversation_id: str) -> ConversationRecord | None:
        with self._lock:
            conversation = self._conversations.get(conversation_id)
            return conversation.record() if conversation is not None and conversation.scope == scope else None

    async def aupdate_conversation(
        self, scope: str, conversation_id: str, changes: Mapping[str, str | None]
    ) -> ConversationRecord | None:
        with self._lock:
            try:
                conversation = self._conversation(scope, conversation_id)
            except ConversationNotFound:
                return None
            conversation.metadata = merge_metadata(conversation.metadata, changes)
            return conversation.record()

    async def adelete_conversation(self, scope: str, conversation_id: str) -> bool:
        with self._lock:
            try:
                self._conversation(scope, conversation_id)
            except ConversationNotFound:
                return False
            self._drop_conversation(conversation_id)
            return True

    async def aadd_items(self, scope: str, conversation_id: str, items: Sequence[NewItem]) -> list[dict[str, Any]]:
        now = _now()
        with self._lock:
            conversation = self._conversation(scope, conversation_id)
            bodies = self._resolve(scope, conversation, items)
            self._append(scope, conversation_id, bodies, now)
            self._evict(("conversation", conversation_id))
            return [self._listed(scope, str(body["id"])) for body in bodies]

    async def alist_items(
        self,
        scope: str,
        conversation_id: str,
        *,
        limit: int = LIST_LIMIT_DEFAULT,
        order: Order = "desc",
        after: str | None = None,
    ) -> ItemPage:
        with self._lock:
            ordered = self._conversation(scope, conversation_id).active()
            if order == "desc":
                ordered.reverse()
            start = 0
            if after is not None:
                try:
                    start = ordered.index(after) + 1
                except ValueError:
                    raise CursorNotFound(after) from None
            page = ordered[start : start + limit]
            return ItemPage([self._listed(scope, item_id) for item_id in page], start + limit < len(ordered))

    async def aget_item(self, scope: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        with self._lock:
            if self._conversation(scope, conversation_id).members.get(item_id) is not False:
                raise ItemNotFound(item_id)
            return self._listed(scope, item_id)

    async def adelete_item(self, scope: str, conversation_id: str, item_id: str) -> ConversationRecord:
        with self._lock:
            conversation = self._conversation(scope, conversation_id)
            if conversation.members.get(item_id) is not False:
                raise ItemNotFound(item_id)
            conversation.members[item_id] = True
            return conversation.record()

    async def aconversation_history(self, scope: str, conversation_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [self._body(scope, item_id) for item_id in self._conversation(scope, conversation_id).active()]

    async def aappend_items(self, scope: str, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> int:
        now = _now()
        with self._lock:
            conversation = self._conversation(scope, conversation_id)
            self._check_fits(1 + len(conversation.members) + self._new_objects(scope, items))
            added = self._append(scope, conversation_id, items, now)
            self._evict(("conversation", conversation_id))
            return added
