"""The history store's contract, the same on the db backend (SQLite here, Postgres with DATABASE_URL)
and the memory backend: responses with their input and output items, conversations, items shared
between conversations and responses, soft deletes, cursor pages, and tenant scopes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from responses_api.ids import new_item_id, new_response_id
from responses_api.storage.base import (
    ConversationNotFound,
    CursorNotFound,
    HistoryStore,
    ItemAlreadyInConversation,
    ItemNotFound,
    ItemReference,
    MetadataLimitExceeded,
    ReferencedItemNotFound,
)

A = "tenant:acme"
B = "tenant:globex"


def message(text: str, role: str = "user", item_id: str | None = None) -> dict[str, Any]:
    part_type = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id or new_item_id("message"), "type": "message", "role": role,
            "content": [{"type": part_type, "text": text}], "status": "completed"}


def response_object(output: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": new_response_id(), "object": "response", "created_at": int(time.time()),
                            "status": "completed", "model": "mock-model", "output": output or [], "background": False,
                            "store": True}
    body.update(fields)
    return body


def texts(items: list[dict[str, Any]]) -> list[str]:
    return [item["content"][0]["text"] for item in items]


# --- responses -------------------------------------------------------------------------------------------


async def test_a_response_is_saved_with_its_items_and_read_back(store: HistoryStore) -> None:
    answer = message("hello back", "assistant")
    response = response_object([answer], metadata={"k": "v"})
    await store.asave_response(A, response, [message("hi"), message("again")])

    stored = await store.aget_response(A, response["id"])
    assert stored == response
    assert texts(await store.alist_input_items(A, response["id"]) or []) == ["hi", "again"]


async def test_another_scope_sees_no_response(store: HistoryStore) -> None:
    response = response_object()
    await store.asave_response(A, response, [message("hi")])

    assert await store.aget_response(B, response["id"]) is None
    assert await store.alist_input_items(B, response["id"]) is None
    assert await store.aresponse_history(B, response["id"]) is None
    assert not await store.aset_response_status(B, response["id"], "cancelled")
    assert not await store.aupdate_response(B, {**response, "status": "failed"})
    assert not await store.adelete_response(B, response["id"])
    assert (await store.aget_response(A, response["id"]) or {})["status"] == "completed"


async def test_status_changes_only_from_the_given_statuses(store: HistoryStore) -> None:
    response = response_object(status="queued", background=True)
    await store.asave_response(A, response, [message("hi")])

    assert await store.aset_response_status(A, response["id"], "cancelled", only_from=("queued", "in_progress"))
    assert not await store.aset_response_status(A, response["id"], "cancelled", only_from=("queued", "in_progress"))
    assert (await store.aget_response(A, response["id"]) or {})["status"] == "cancelled"
    # The run finishing after the cancel: its result is dropped.
    finished = {**response, "status": "completed", "output": [message("late", "assistant")]}
    assert not await store.aupdate_response(A, finished, only_from=("queued", "in_progress"))
    assert (await store.aget_response(A, response["id"]) or {})["output"] == []


async def test_update_replaces_the_object_and_its_output(store: HistoryStore) -> None:
    response = response_object(status="queued", background=True)
    await store.asave_response(A, response, [message("question")])
    done = {**response, "status": "completed", "output": [message("answer", "assistant")]}

    assert await store.aupdate_response(A, done, only_from=("queued", "in_progress"))
    assert await store.aget_response(A, response["id"]) == done
    assert texts(await store.aresponse_history(A, response["id"]) or []) == ["question", "answer"]


async def test_history_follows_previous_response_id_oldest_first(store: HistoryStore) -> None:
    first = response_object([message("one-out", "assistant")])
    await store.asave_response(A, first, [message("one-in")])
    second = response_object([message("two-out", "assistant")], previous_response_id=first["id"])
    await store.asave_response(A, second, [message("two-in")])
    third = response_object([message("three-out", "assistant")], previous_response_id=second["id"])
    await store.asave_response(A, third, [message("three-in")])

    history = await store.aresponse_history(A, third["id"])
    assert texts(history or []) == ["one-in", "one-out", "two-in", "two-out", "three-in", "three-out"]
    assert texts(await store.aresponse_history(A, first["id"]) or []) == ["one-in", "one-out"]
    assert await store.aresponse_history(A, "resp_unknown") is None


async def test_deleting_a_response_keeps_items_a_conversation_holds(store: HistoryStore) -> None:
    conversation = await store.acreate_conversation(A, {})
    response = response_object([message("out", "assistant")], conversation={"id": conversation.id})
    await store.asave_response(A, response, [message("in")], append_to_conversation=True)

    assert await store.adelete_response(A, response["id"])
    assert await store.aget_response(A, response["id"]) is None
    assert not await store.adelete_response(A, response["id"])
    assert texts(await store.aconversation_history(A, conversation.id)) == ["in", "out"]


async def test_saving_with_append_adds_input_then_output_to_the_conversation(store: HistoryStore) -> None:
    conversation = await store.acreate_conversation(A, {}, [message("earlier")])
    response = response_object([message("reply", "assistant")], conversation={"id": conversation.id})
    await store.asave_response(A, response, [message("new question")], append_to_conversation=True)

    assert texts(await store.aconversation_history(A, conversation.id)) == ["earlier", "new question", "reply"]
    page = await store.alist_items(A, conversation.id, order="asc")
    assert [item["id"] for item in page.items][1:] == [
        (await store.alist_input_items(A, response["id"]) or [{}])[0]["id"], response["output"][0]["id"],
    ]


async def test_a_background_response_is_appended_when_it_finishes(store: HistoryStore) -> None:
    conversation = await store.acreate_conversation(A, {})
    queued = response_object(status="queued", background=True, conversation=conversation.id)
    await store.asave_response(A, queued, [message("q")])
    assert await store.aconversation_history(A, conversation.id) == []

    done = {**queued, "status": "completed", "output": [message("a", "assistant")]}
    assert await store.aupdate_response(A, done, only_from=("queued", "in_progress"), append_to_conversation=True)
    assert texts(await store.aconversation_history(A, conversation.id)) == ["q", "a"]


async def test_append_to_a_deleted_conversation_is_skipped(store: HistoryStore) -> None:
    conversation = await store.acreate_conversation(A, {})
    await store.adelete_conversation(A, conversation.id)
    response = response_object([message("out", "assistant")], conversation={"id": conversation.id})
    await store.asave_response(A, response, [message("in")], append_to_conversation=True)
    assert await store.aget_response(A, response["id"]) is not None


async def test_append_items_skips_items_already_there(store: HistoryStore) -> None:
    first = message("first")
    conversation = await store.acreate_conversation(A, {}, [first])
    assert await store.aappend_items(A, conversation.id, [first, message("second")]) == 1
    assert texts(await store.aconversation_history(A, conversation.id)) == ["first", "second"]
    with pytest.raises(ConversationNotFound):
        await store.aappend_items(B, conversation.id, [message("x")])


# --- conversations ---------------------------------------------------------------------------------------


async def test_conversation_create_get_update_delete(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {"topic": "demo", "owner": "alice"})
    assert created.id.startswith("conv_") and created.metadata == {"topic": "demo", "owner": "alice"}
    assert await store.aget_conversation(A, created.id) == created

    updated = await store.aupdate_conversation(A, created.id, {"topic": "changed", "owner": None, "new": "x"})
    assert updated is not None and updated.metadata == {"topic": "changed", "new": "x"}
    assert (await store.aget_conversation(A, created.id)) == updated

    assert await store.adelete_conversation(A, created.id)
    assert await store.aget_conversation(A, created.id) is None
    assert not await store.adelete_conversation(A, created.id)


async def test_metadata_merge_is_limited_to_16_pairs(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {f"k{i}": "v" for i in range(15)})
    with pytest.raises(MetadataLimitExceeded):
        await store.aupdate_conversation(A, created.id, {"a": "1", "b": "2"})
    assert (await store.aget_conversation(A, created.id)) == created  # unchanged
    # Deleting and adding in one merge counts the result.
    updated = await store.aupdate_conversation(A, created.id, {"k0": None, "a": "1", "b": "2"})
    assert updated is not None and len(updated.metadata) == 16


async def test_another_scope_cannot_touch_a_conversation(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {"x": "1"}, [message("secret")])
    item_id = (await store.alist_items(A, created.id)).items[0]["id"]

    assert await store.aget_conversation(B, created.id) is None
    assert await store.aupdate_conversation(B, created.id, {"x": "2"}) is None
    assert not await store.adelete_conversation(B, created.id)
    for call in (
        store.alist_items(B, created.id),
        store.aget_item(B, created.id, item_id),
        store.adelete_item(B, created.id, item_id),
        store.aadd_items(B, created.id, [message("intruder")]),
        store.aconversation_history(B, created.id),
    ):
        with pytest.raises(ConversationNotFound):
            await call
    # Nor reference its items: an item id names an item within one scope.
    other = await store.acreate_conversation(B, {})
    with pytest.raises(ReferencedItemNotFound):
        await store.aadd_items(B, other.id, [ItemReference(item_id)])
    assert (await store.aget_conversation(A, created.id)) == created
    assert texts((await store.alist_items(A, created.id)).items) == ["secret"]


async def test_the_same_item_id_in_two_scopes_is_two_items(store: HistoryStore) -> None:
    mine = await store.acreate_conversation(A, {}, [message("a's", item_id="msg_shared")])
    theirs = await store.acreate_conversation(B, {}, [message("b's", item_id="msg_shared")])
    assert texts([await store.aget_item(A, mine.id, "msg_shared")]) == ["a's"]
    assert texts([await store.aget_item(B, theirs.id, "msg_shared")]) == ["b's"]


async def test_added_items_are_answered_with_created_at(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {})
    added = await store.aadd_items(A, created.id, [message("one"), message("two")])
    assert texts(added) == ["one", "two"]
    assert all(isinstance(item["created_at"], int) for item in added)
    assert await store.aget_item(A, created.id, added[1]["id"]) == added[1]


async def test_an_item_already_in_the_conversation_is_refused_and_nothing_is_added(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {}, [message("first", item_id="msg_first")])
    with pytest.raises(ItemAlreadyInConversation) as refused:
        await store.aadd_items(A, created.id, [message("new"), message("again", item_id="msg_first")])
    assert refused.value.item_id == "msg_first"
    with pytest.raises(ItemAlreadyInConversation):
        await store.aadd_items(A, created.id, [ItemReference("msg_first")])
    with pytest.raises(ItemAlreadyInConversation):
        await store.aadd_items(A, created.id, [message("x", item_id="msg_twice"), message("y", item_id="msg_twice")])
    assert texts((await store.alist_items(A, created.id)).items) == ["first"]


async def test_an_unknown_reference_is_refused_and_nothing_is_added(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {})
    with pytest.raises(ReferencedItemNotFound):
        await store.aadd_items(A, created.id, [message("kept?"), ItemReference("msg_nowhere")])
    assert (await store.alist_items(A, created.id)).items == []
    with pytest.raises(ReferencedItemNotFound):
        await store.acreate_conversation(A, {}, [ItemReference("msg_nowhere")])


async def test_an_item_in_several_conversations_is_deleted_softly_from_one(store: HistoryStore) -> None:
    first = await store.acreate_conversation(A, {}, [message("shared", item_id="msg_shared"), message("own")])
    second = await store.acreate_conversation(A, {})
    [linked] = await store.aadd_items(A, second.id, [ItemReference("msg_shared")])
    assert texts([linked]) == ["shared"]
    # A known id brought again (with other content) is the stored item, as OpenAI keeps it.
    third = await store.acreate_conversation(A, {}, [message("other content", item_id="msg_shared")])
    assert texts([await store.aget_item(A, third.id, "msg_shared")]) == ["shared"]

    answered = await store.adelete_item(A, first.id, "msg_shared")
    assert answered == await store.aget_conversation(A, first.id)
    with pytest.raises(ItemNotFound):
        await store.aget_item(A, first.id, "msg_shared")
    with pytest.raises(ItemNotFound):
        await store.adelete_item(A, first.id, "msg_shared")
    assert texts((await store.alist_items(A, first.id)).items) == ["own"]
    assert texts([await store.aget_item(A, second.id, "msg_shared")]) == ["shared"]

    # Still referenceable (it persists), and back in the first conversation at its end.
    await store.aadd_items(A, first.id, [ItemReference("msg_shared")])
    assert texts(await store.aconversation_history(A, first.id)) == ["own", "shared"]


async def test_deleting_a_conversation_keeps_items_others_hold(store: HistoryStore) -> None:
    first = await store.acreate_conversation(A, {}, [message("shared", item_id="msg_shared"), message("only here",
                                                                                                        item_id="msg_own")])
    second = await store.acreate_conversation(A, {}, [ItemReference("msg_shared")])
    assert await store.adelete_conversation(A, first.id)
    assert texts(await store.aconversation_history(A, second.id)) == ["shared"]
    other = await store.acreate_conversation(A, {})
    with pytest.raises(ReferencedItemNotFound):  # the item no one held went with its conversation
        await store.aadd_items(A, other.id, [ItemReference("msg_own")])


async def test_item_pages_follow_the_cursor_both_ways(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {})
    ids = [item["id"] for item in await store.aadd_items(A, created.id, [message(str(i)) for i in range(7)])]

    page = await store.alist_items(A, created.id)  # default: newest first, up to 100
    assert [item["id"] for item in page.items] == ids[::-1] and not page.has_more
    listed = page.to_object()
    assert (listed["object"], listed["first_id"], listed["last_id"]) == ("list", ids[-1], ids[0])

    seen: list[str] = []
    after = None
    while True:
        page = await store.alist_items(A, created.id, limit=3, order="asc", after=after)
        seen.extend(item["id"] for item in page.items)
        if not page.has_more:
            break
        after = page.items[-1]["id"]
    assert seen == ids

    page = await store.alist_items(A, created.id, limit=3, order="desc", after=ids[4])
    assert [item["id"] for item in page.items] == [ids[3], ids[2], ids[1]] and page.has_more
    page = await store.alist_items(A, created.id, limit=3, order="desc", after=ids[2])
    assert [item["id"] for item in page.items] == [ids[1], ids[0]] and not page.has_more
    page = await store.alist_items(A, created.id, limit=7, order="asc")
    assert not page.has_more
    page = await store.alist_items(A, created.id, limit=3, order="asc", after=ids[-1])
    assert page.items == [] and page.to_object()["first_id"] is None

    await store.adelete_item(A, created.id, ids[3])
    page = await store.alist_items(A, created.id, order="asc", after=ids[2])
    assert [item["id"] for item in page.items] == ids[4:]
    with pytest.raises(CursorNotFound):  # a deleted item is no cursor any more
        await store.alist_items(A, created.id, after=ids[3])
    with pytest.raises(CursorNotFound):
        await store.alist_items(A, created.id, after="msg_unknown")


async def test_history_of_a_conversation_is_every_item_oldest_first(store: HistoryStore) -> None:
    created = await store.acreate_conversation(A, {}, [message(str(i)) for i in range(3)])
    await store.aadd_items(A, created.id, [message("3")])
    history = await store.aconversation_history(A, created.id)
    assert texts(history) == ["0", "1", "2", "3"]
    assert all("created_at" not in item for item in history)  # the items as a model input takes them


async def test_model_output_holding_nul_is_stored(store: HistoryStore) -> None:
    """Postgres cannot keep U+0000 in JSON: the db backend stores U+FFFD in its place."""
    conversation = await store.acreate_conversation(A, {})
    response = response_object([message("a\x00b \\u0000", "assistant")], conversation={"id": conversation.id})
    await store.asave_response(A, response, [message("in\x00")], append_to_conversation=True)
    stored = await store.aget_response(A, response["id"]) or {}
    assert texts(stored["output"])[0] in ("a\x00b \\u0000", "a\ufffdb \\u0000")
    assert texts(await store.aconversation_history(A, conversation.id))[1] == texts(stored["output"])[0]
