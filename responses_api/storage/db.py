"""The db history backend (``--history-backend db``, the default): the gateway's database
(responses_api/models.py), shared by every gateway process on it.

Each method is one sync function run on a worker thread (:func:`common.db.arun_db`): a write is one transaction
there, so none is ever held across an await, and the thread's connections are closed afterwards (on
Postgres they go back to the pool). Failures of the store itself (Postgres down) are reported to
:data:`common.outages.STORE` and raised (the API answers 503).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any, Collection, Iterable, Iterator, Mapping, Sequence, TypeVar

import orjson
from django.db import IntegrityError, transaction
from django.utils import timezone

from common.json_text import storable
from common.db import STORE_ERRORS, arun_db as _arun
from responses_api.background import RUN_STALE_SECS
from responses_api.ids import new_conversation_id
from responses_api.limits import HISTORY_CHAIN_MAX, LIST_LIMIT_DEFAULT
from responses_api.models import Conversation, ConversationItem, Item, ItemKind, ResponseItem, StoredResponse
from responses_api.storage.base import (
    ConversationNotFound,
    ConversationRecord,
    CursorNotFound,
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

log = logging.getLogger(__name__)

__all__ = ["DatabaseHistoryStore", "purge_orphan_items"]

T = TypeVar("T")

_CHUNK = 500  # ids per IN (...) list


def _chunks(values: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())


def _moment(unix: int) -> datetime:
    return datetime.fromtimestamp(unix, tz=timezone.get_current_timezone()) if unix > 0 else timezone.now()


def _record(row: Conversation) -> ConversationRecord:
    return ConversationRecord(row.id, _unix(row.created_at), dict(row.metadata or {}))


def _listed(item: Item) -> dict[str, Any]:
    return {**item.body, "created_at": _unix(item.created_at)}


# --- items -------------------------------------------------------------------------------------------------


def _store_items(scope: str, bodies: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Item]:
    """The stored item of each body by id: new ids inserted, stored ones kept as they are."""
    if not bodies:
        return {}
    fresh: dict[str, Item] = {}
    for body in bodies:
        item_id = str(body["id"])
        if item_id not in fresh:
            fresh[item_id] = Item(
                scope=scope,
                item_id=item_id,
                type=str(body.get("type") or "message")[:64],
                role=str(body.get("role") or "")[:32],
                status=str(body.get("status") or "")[:32],
                body=dict(body),
                created_at=now,
            )
    Item.objects.bulk_create(fresh.values(), ignore_conflicts=True)
    return _items_by_id(scope, list(fresh))


def _items_by_id(scope: str, item_ids: Sequence[str]) -> dict[str, Item]:
    found: dict[str, Item] = {}
    for chunk in _chunks(item_ids):
        found.update((item.item_id, item) for item in Item.objects.filter(scope=scope, item_id__in=chunk))
    return found


def _item_bodies(scope: str, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {item_id: dict(item.body) for item_id, item in _items_by_id(scope, item_ids).items()}


def purge_orphan_items(pks: Iterable[int] | None = None) -> int:
    """Delete items that no response and no conversation holds (among ``pks``, or all); their count."""
    candidates = Item.objects.filter(response_links__isnull=True, conversation_links__isnull=True)
    if pks is None:
        orphans = list(candidates.values_list("pk", flat=True))
    else:
        wanted = list(dict.fromkeys(pks))
        orphans = []
        for chunk in _chunks(wanted):
            orphans.extend(candidates.filter(pk__in=chunk).values_list("pk", flat=True))
    deleted = 0
    for chunk in _chunks(orphans):
        deleted += Item.objects.filter(pk__in=chunk).delete()[1].get(Item._meta.label, 0)
    return deleted


def _link_response(response_id: str, kind: str, items: Sequence[Item]) -> None:
    ResponseItem.objects.bulk_create(
        ResponseItem(response_id=response_id, item=item, kind=kind, position=position)
        for position, item in enumerate(items)
    )


def _append(conversation_id: str, items: Sequence[Item], now: datetime) -> int:
    """Append ``items`` (already stored in the conversation's scope) in order; those already in it are
    skipped, soft-deleted ones come back at the end."""
    wanted = list({item.pk: item for item in items}.values())
    if not wanted:
        return 0
    present: dict[int, tuple[int, bool]] = {}
    for chunk in _chunks([item.pk for item in wanted]):
        rows = ConversationItem.objects.filter(conversation_id=conversation_id, item_id__in=chunk)
        present.update((item_pk, (pk, deleted)) for pk, item_pk, deleted in rows.values_list("pk", "item_id", "deleted"))
    revived = [pk for pk, deleted in present.values() if deleted]
    if revived:
        ConversationItem.objects.filter(pk__in=revived).delete()
    new = [item for item in wanted if item.pk not in present or present[item.pk][1]]
    ConversationItem.objects.bulk_create(
        ConversationItem(conversation_id=conversation_id, item=item, added_at=now) for item in new
    )
    return len(new)


def _touch_conversation(scope: str, conversation_id: str, now: datetime) -> bool:
    return Conversation.objects.filter(pk=conversation_id, scope=scope).update(updated_at=now) == 1


# --- responses ---------------------------------------------------------------------------------------------


def _save_response(
    scope: str, response: Mapping[str, Any], input_items: Sequence[Mapping[str, Any]], append: bool
) -> None:
    response, input_items = storable(dict(response)), storable(list(input_items))
    columns = ResponseColumns.of(response)
    now = timezone.now()
    outputs = output_items(response)
    with transaction.atomic():
        StoredResponse.objects.create(
            id=columns.id,
            scope=scope,
            model=columns.model[:512],
            status=columns.status,
            background=columns.background,
            store=columns.store,
            previous_response_id=columns.previous_response_id,
            conversation_id=columns.conversation_id,
            body=dict(response),
            created_at=_moment(columns.created_at),
            updated_at=now,
        )
        stored = _store_items(scope, [*input_items, *outputs], now)
        inputs = [stored[str(body["id"])] for body in input_items]
        made = [stored[str(body["id"])] for body in outputs]
        _link_response(columns.id, ItemKind.INPUT, inputs)
        _link_response(columns.id, ItemKind.OUTPUT, made)
        if append and columns.conversation_id and _touch_conversation(scope, columns.conversation_id, now):
            _append(columns.conversation_id, [*inputs, *made], now)


_RUNNING = ("queued", "in_progress")


def _get_response(scope: str, response_id: str) -> dict[str, Any] | None:
    rows = StoredResponse.objects.filter(pk=response_id, scope=scope)
    row = rows.values_list("body", "status", "background", "updated_at").first()
    if row is None:
        return None
    body, status, background, updated_at = row
    found = {**body, "status": status}
    if background and status in _RUNNING:
        stale = timezone.now() - timedelta(seconds=RUN_STALE_SECS)
        if updated_at < stale:  # its process stopped marking it: gone
            return _fail_abandoned(rows.filter(status__in=_RUNNING, updated_at__lt=stale), found) or _get_response(
                scope, response_id
            )
    return found


def _fail_abandoned(rows: Any, found: dict[str, Any]) -> dict[str, Any] | None:
    """Store a background response whose process is gone as failed; None when another writer got
    there first (a late heartbeat, a cancel)."""
    failed = {
        **found, "status": "failed", "completed_at": int(time.time()),
        "error": {"code": "server_error", "message": "The gateway process running this response stopped"},
    }  # fmt: skip
    if rows.update(body=failed, status="failed", updated_at=timezone.now()) != 1:
        return None
    log.warning("background response %s: its process stopped; stored as failed", found.get("id"))
    return failed


def _update_response(scope: str, response: Mapping[str, Any], only_from: Collection[str], append: bool) -> bool:
    response = storable(dict(response))
    columns = ResponseColumns.of(response)
    now = timezone.now()
    outputs = output_items(response)
    with transaction.atomic():
        rows = StoredResponse.objects.filter(pk=columns.id, scope=scope)
        if only_from:
            rows = rows.filter(status__in=list(only_from))
        if rows.update(body=dict(response), status=columns.status, model=columns.model[:512], updated_at=now) != 1:
            return False
        old = ResponseItem.objects.filter(response_id=columns.id, kind=ItemKind.OUTPUT)
        old_items = list(old.values_list("item_id", flat=True))
        old.delete()
        stored = _store_items(scope, outputs, now)
        made = [stored[str(body["id"])] for body in outputs]
        _link_response(columns.id, ItemKind.OUTPUT, made)
        purge_orphan_items(old_items)
        conversation_id = StoredResponse.objects.filter(pk=columns.id).values_list("conversation_id", flat=True).get()
        if append and conversation_id and _touch_conversation(scope, conversation_id, now):
            links = ResponseItem.objects.filter(response_id=columns.id, kind=ItemKind.INPUT).order_by("position")
            inputs = [link.item for link in links.select_related("item")]
            _append(conversation_id, [*inputs, *made], now)
    return True


def _set_response_status(scope: str, response_id: str, status: str, only_from: Collection[str]) -> bool:
    rows = StoredResponse.objects.filter(pk=response_id, scope=scope)
    if only_from:
        rows = rows.filter(status__in=list(only_from))
    return rows.update(status=status, updated_at=timezone.now()) == 1


def _delete_response(scope: str, response_id: str) -> bool:
    with transaction.atomic():
        rows = StoredResponse.objects.filter(pk=response_id, scope=scope)
        held = list(ResponseItem.objects.filter(response__in=rows).values_list("item_id", flat=True))
        if rows.delete()[0] == 0:
            return False
        purge_orphan_items(held)
    return True


def _list_input_items(scope: str, response_id: str) -> list[dict[str, Any]] | None:
    links = (
        ResponseItem.objects.filter(response_id=response_id, response__scope=scope, kind=ItemKind.INPUT)
        .order_by("position")
        .select_related("item")
    )
    items = [link.item.body for link in links]
    if not items and not StoredResponse.objects.filter(pk=response_id, scope=scope).exists():
        return None
    return items


def _response_history(scope: str, response_id: str) -> list[dict[str, Any]] | None:
    chain: list[str] = []
    current = response_id
    while current and current not in chain and len(chain) < HISTORY_CHAIN_MAX:
        previous = (
            StoredResponse.objects.filter(pk=current, scope=scope).values_list("previous_response_id", flat=True).first()
        )
        if previous is None:
            break
        chain.append(current)
        current = previous
    if not chain:
        return None
    by_response: dict[str, list[tuple[int, int, dict[str, Any]]]] = {response: [] for response in chain}
    for chunk in _chunks(chain):
        links = ResponseItem.objects.filter(response_id__in=chunk).values_list("response_id", "kind", "position", "item__body")
        for owner, kind, position, body in links:
            by_response[owner].append((0 if kind == ItemKind.INPUT else 1, position, body))
    items: list[dict[str, Any]] = []
    for response in reversed(chain):
        items.extend(body for _, _, body in sorted(by_response[response], key=lambda entry: entry[:2]))
    return items


# --- conversations -----------------------------------------------------------------------------------------


def _resolve(scope: str, conversation_id: str, items: Sequence[NewItem], now: datetime) -> list[Item]:
    """Store the new items and find the referenced ones; refuse an item already in the conversation
    (or twice in ``items``). Runs inside the caller's transaction."""
    order: list[str] = []
    bodies: list[Mapping[str, Any]] = []
    for item in items:
        item_id = item.id if isinstance(item, ItemReference) else str(item["id"])
        if item_id in order:
            raise ItemAlreadyInConversation(item_id)
        order.append(item_id)
        if not isinstance(item, ItemReference):
            bodies.append(item)
    stored = _store_items(scope, bodies, now)
    references = [item.id for item in items if isinstance(item, ItemReference) and item.id not in stored]
    stored.update(_items_by_id(scope, references))
    for item_id in order:
        if item_id not in stored:
            raise ReferencedItemNotFound(item_id)
    resolved = [stored[item_id] for item_id in order]
    active = ConversationItem.objects.filter(
        conversation_id=conversation_id, deleted=False, item_id__in=[item.pk for item in resolved]
    )
    already = active.values_list("item__item_id", flat=True).first()
    if already is not None:
        raise ItemAlreadyInConversation(already)
    return resolved


def _create_conversation(scope: str, metadata: Mapping[str, str], items: Sequence[NewItem]) -> ConversationRecord:
    now = timezone.now()
    with transaction.atomic():
        row = Conversation.objects.create(
            id=new_conversation_id(), scope=scope, metadata=dict(metadata), created_at=now, updated_at=now
        )
        if items:
            _append(row.id, _resolve(scope, row.id, items, now), now)
    return _record(row)


def _get_conversation(scope: str, conversation_id: str) -> ConversationRecord | None:
    row = Conversation.objects.filter(pk=conversation_id, scope=scope).first()
    return _record(row) if row is not None else None


def _update_conversation(
    scope: str, conversation_id: str, changes: Mapping[str, str | None]
) -> ConversationRecord | None:
    with transaction.atomic():
        row = Conversation.objects.select_for_update().filter(pk=conversation_id, scope=scope).first()
        if row is None:
            return None
        row.metadata = merge_metadata(row.metadata or {}, changes)
        row.updated_at = timezone.now()
        row.save(update_fields=["metadata", "updated_at"])
    return _record(row)


def _delete_conversation(scope: str, conversation_id: str) -> bool:
    with transaction.atomic():
        rows = Conversation.objects.filter(pk=conversation_id, scope=scope)
        held = list(ConversationItem.objects.filter(conversation__in=rows).values_list("item_id", flat=True))
        if rows.delete()[0] == 0:
            return False
        purge_orphan_items(held)
    return True


def _add_items(scope: str, conversation_id: str, items: Sequence[NewItem]) -> list[dict[str, Any]]:
    now = timezone.now()
    try:
        with transaction.atomic():
            if not _touch_conversation(scope, conversation_id, now):
                raise ConversationNotFound(conversation_id)
            resolved = _resolve(scope, conversation_id, items, now)
            _append(conversation_id, resolved, now)
    except IntegrityError:  # another request added one of them at the same moment
        raise ItemAlreadyInConversation(next(iter(_ids(items)), "")) from None
    return [_listed(item) for item in resolved]


def _ids(items: Sequence[NewItem]) -> list[str]:
    return [item.id if isinstance(item, ItemReference) else str(item["id"]) for item in items]


def _require_conversation(scope: str, conversation_id: str) -> None:
    if not Conversation.objects.filter(pk=conversation_id, scope=scope).exists():
        raise ConversationNotFound(conversation_id)


def _list_items(scope: str, conversation_id: str, limit: int, order: Order, after: str | None) -> ItemPage:
    _require_conversation(scope, conversation_id)
    rows = ConversationItem.objects.filter(conversation_id=conversation_id, deleted=False)
    if after is not None:
        cursor = rows.filter(item__item_id=after).values_list("pk", flat=True).first()
        if cursor is None:
            raise CursorNotFound(after)
        rows = rows.filter(pk__gt=cursor) if order == "asc" else rows.filter(pk__lt=cursor)
    page = list(rows.order_by("pk" if order == "asc" else "-pk").select_related("item")[: limit + 1])
    return ItemPage([_listed(row.item) for row in page[:limit]], len(page) > limit)


def _get_item(scope: str, conversation_id: str, item_id: str) -> dict[str, Any]:
    row = (
        ConversationItem.objects.filter(
            conversation_id=conversation_id, conversation__scope=scope, deleted=False, item__item_id=item_id
        )
        .select_related("item")
        .first()
    )
    if row is None:
        _require_conversation(scope, conversation_id)
        raise ItemNotFound(item_id)
    return _listed(row.item)


def _delete_item(scope: str, conversation_id: str, item_id: str) -> ConversationRecord:
    now = timezone.now()
    with transaction.atomic():
        conversation = Conversation.objects.filter(pk=conversation_id, scope=scope).first()
        if conversation is None:
            raise ConversationNotFound(conversation_id)
        member = ConversationItem.objects.filter(conversation=conversation, deleted=False, item__item_id=item_id)
        if member.update(deleted=True, deleted_at=now) == 0:
            raise ItemNotFound(item_id)
        conversation.updated_at = now
        conversation.save(update_fields=["updated_at"])
    return _record(conversation)


def _conversation_history(scope: str, conversation_id: str) -> list[dict[str, Any]]:
    _require_conversation(scope, conversation_id)
    rows = ConversationItem.objects.filter(conversation_id=conversation_id, deleted=False).order_by("pk")
    return list(rows.values_list("item__body", flat=True))


def _append_items(scope: str, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> int:
    items = storable(list(items))
    now = timezone.now()
    with transaction.atomic():
        if not _touch_conversation(scope, conversation_id, now):
            raise ConversationNotFound(conversation_id)
        stored = _store_items(scope, items, now)
        return _append(conversation_id, [stored[str(body["id"])] for body in items], now)


class DatabaseHistoryStore(HistoryStore):
    name = "db"
    in_database = True

    async def asave_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        input_items: Sequence[Mapping[str, Any]],
        *,
        append_to_conversation: bool = False,
    ) -> None:
        await _arun(_save_response, scope, response, input_items, append_to_conversation)

    async def aget_response(self, scope: str, response_id: str) -> dict[str, Any] | None:
        return await _arun(_get_response, scope, response_id)

    async def aupdate_response(
        self,
        scope: str,
        response: Mapping[str, Any],
        *,
        only_from: Collection[str] = (),
        append_to_conversation: bool = False,
    ) -> bool:
        return await _arun(_update_response, scope, response, only_from, append_to_conversation)

    async def aset_response_status(
        self, scope: str, response_id: str, status: str, *, only_from: Collection[str] = ()
    ) -> bool:
        return await _arun(_set_response_status, scope, response_id, status, only_from)

    async def adelete_response(self, scope: str, response_id: str) -> bool:
        return await _arun(_delete_response, scope, response_id)

    async def alist_input_items(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        return await _arun(_list_input_items, scope, response_id)

    async def aget_items(self, scope: str, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return await _arun(_item_bodies, scope, item_ids)

    async def aresponse_history(self, scope: str, response_id: str) -> list[dict[str, Any]] | None:
        return await _arun(_response_history, scope, response_id)

    async def acreate_conversation(
        self, scope: str, metadata: Mapping[str, str], items: Sequence[NewItem] = ()
    ) -> ConversationRecord:
        return await _arun(_create_conversation, scope, metadata, items)

    async def aget_conversation(self, scope: str, conversation_id: str) -> ConversationRecord | None:
        return await _arun(_get_conversation, scope, conversation_id)

    async def aupdate_conversation(
        self, scope: str, conversation_id: str, changes: Mapping[str, str | None]
    ) -> ConversationRecord | None:
        return await _arun(_update_conversation, scope, conversation_id, changes)

    async def adelete_conversation(self, scope: str, conversation_id: str) -> bool:
        return await _arun(_delete_conversation, scope, conversation_id)

    async def aadd_items(self, scope: str, conversation_id: str, items: Sequence[NewItem]) -> list[dict[str, Any]]:
        return await _arun(_add_items, scope, conversation_id, items)

    async def alist_items(
        self,
        scope: str,
        conversation_id: str,
        *,
        limit: int = LIST_LIMIT_DEFAULT,
        order: Order = "desc",
        after: str | None = None,
    ) -> ItemPage:
        return await _arun(_list_items, scope, conversation_id, limit, order, after)

    async def aget_item(self, scope: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        return await _arun(_get_item, scope, conversation_id, item_id)

    async def adelete_item(self, scope: str, conversation_id: str, item_id: str) -> ConversationRecord:
        return await _arun(_delete_item, scope, conversation_id, item_id)

    async def aconversation_history(self, scope: str, conversation_id: str) -> list[dict[str, Any]]:
        return await _arun(_conversation_history, scope, conversation_id)

    async def aappend_items(self, scope: str, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> int:
        return await _arun(_append_items, scope, conversation_id, items)
