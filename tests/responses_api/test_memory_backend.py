"""The memory backend's bound (--history-memory-max-entries): responses, conversations and items count
together; the oldest records go first with the items only they held; a record that alone would not
fit is refused."""

from __future__ import annotations

import pytest

from common.config import GatewayConfig, install_config
from responses_api.storage import history_store
from responses_api.storage.base import HistoryFull, ItemReference, ReferencedItemNotFound
from responses_api.storage.memory import MemoryHistoryStore
from tests.responses_api.test_storage import A, message, response_object


async def test_the_oldest_records_are_evicted_past_the_bound() -> None:
    store = MemoryHistoryStore(max_entries=10)
    old = response_object([message("out", "assistant")])
    await store.asave_response(A, old, [message("in")])  # 3 objects
    conversation = await store.acreate_conversation(A, {}, [message("c1"), message("c2")])  # 3 more
    assert store.size == 6

    newer = response_object([message("out", "assistant")])
    await store.asave_response(A, newer, [message("a"), message("b")])  # 4 more: 10, still within
    assert store.size == 10 and await store.aget_response(A, old["id"]) is not None

    newest = response_object()
    await store.asave_response(A, newest, [message("z")])  # 12: the oldest response goes (3 objects)
    assert store.size == 9
    assert await store.aget_response(A, old["id"]) is None
    assert await store.aget_conversation(A, conversation.id) is not None
    assert await store.aget_response(A, newest["id"]) is not None


async def test_evicted_records_keep_items_others_hold() -> None:
    store = MemoryHistoryStore(max_entries=6)
    first = await store.acreate_conversation(A, {}, [message("shared", item_id="msg_shared")])
    second = await store.acreate_conversation(A, {}, [ItemReference("msg_shared")])
    assert store.size == 3
    await store.acreate_conversation(A, {}, [message("x"), message("y")])  # 6
    await store.acreate_conversation(A, {})  # 7: the first conversation goes, its item stays
    assert await store.aget_conversation(A, first.id) is None
    assert store.size == 6
    assert [item["id"] for item in await store.aconversation_history(A, second.id)] == ["msg_shared"]


async def test_the_record_written_is_never_the_one_evicted() -> None:
    store = MemoryHistoryStore(max_entries=5)
    older = await store.acreate_conversation(A, {}, [message("o")])
    growing = await store.acreate_conversation(A, {})
    await store.aadd_items(A, growing.id, [message("1"), message("2"), message("3")])  # 2 + 1 + 3 = 6
    assert await store.aget_conversation(A, older.id) is None  # the older one went
    assert len(await store.aconversation_history(A, growing.id)) == 3 and store.size == 4


async def test_a_record_that_alone_exceeds_the_bound_is_refused() -> None:
    store = MemoryHistoryStore(max_entries=3)
    conversation = await store.acreate_conversation(A, {}, [message("1"), message("2")])
    with pytest.raises(HistoryFull):
        await store.aadd_items(A, conversation.id, [message("3")])
    with pytest.raises(HistoryFull):
        await store.asave_response(A, response_object([message("o", "assistant")]), [message("a"), message("b")])
    with pytest.raises(HistoryFull):
        await store.acreate_conversation(A, {}, [message(str(i)) for i in range(3)])
    assert len(await store.aconversation_history(A, conversation.id)) == 2
    with pytest.raises(ReferencedItemNotFound):
        await store.aadd_items(A, conversation.id, [ItemReference("msg_none")])


def test_the_flag_sets_the_bound() -> None:
    install_config(GatewayConfig(history_backend="memory", history_memory_max_entries=42), export=False)
    store = history_store()
    assert isinstance(store, MemoryHistoryStore) and store.max_entries == 42
    assert history_store() is store  # one per process while the config stays
    install_config(GatewayConfig(history_backend="memory", history_memory_max_entries=42), export=False)
    assert history_store() is not store
