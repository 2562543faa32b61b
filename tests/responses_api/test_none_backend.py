"""--history-backend none: nothing is stored. Writes are no-ops (a new conversation is answered, not
kept) and every read answers as for an unknown object, on the store and through the API."""

from __future__ import annotations

import pytest

from responses_api.storage.base import ConversationNotFound
from responses_api.storage.none import NoHistoryStore
from tests.conftest import ALICE, GatewayFactory
from tests.responses_api.conftest import SHARED
from tests.responses_api.test_storage import A, message, response_object


async def test_nothing_is_kept() -> None:
    store = NoHistoryStore()
    response = response_object([message("out", "assistant")])
    await store.asave_response(A, response, [message("in")], append_to_conversation=True)
    assert await store.aget_response(A, response["id"]) is None
    assert await store.alist_input_items(A, response["id"]) is None
    assert await store.aresponse_history(A, response["id"]) is None
    assert not await store.aupdate_response(A, response)
    assert not await store.aset_response_status(A, response["id"], "cancelled")
    assert not await store.adelete_response(A, response["id"])

    conversation = await store.acreate_conversation(A, {"k": "v"}, [message("x")])
    assert conversation.id.startswith("conv_") and conversation.metadata == {"k": "v"}
    assert await store.aget_conversation(A, conversation.id) is None
    assert await store.aupdate_conversation(A, conversation.id, {"k": None}) is None
    assert not await store.adelete_conversation(A, conversation.id)
    for call in (
        store.aadd_items(A, conversation.id, [message("y")]),
        store.alist_items(A, conversation.id),
        store.aget_item(A, conversation.id, "msg_x"),
        store.adelete_item(A, conversation.id, "msg_x"),
        store.aconversation_history(A, conversation.id),
        store.aappend_items(A, conversation.id, [message("z")]),
    ):
        with pytest.raises(ConversationNotFound):
            await call


async def test_the_api_answers_created_conversations_but_finds_none(make_gateway: GatewayFactory) -> None:
    api = make_gateway(api_key="sk-shared-admin-key", tenant_api_keys=((ALICE.tenant_id, ALICE.key),),
                       history_backend="none")
    created = await api.post("/v1/conversations", json={"metadata": {"k": "v"}}, headers=ALICE.headers)
    assert created.status_code == 200 and created.json()["object"] == "conversation"
    conversation_id = created.json()["id"]
    for method, path in (("GET", ""), ("POST", ""), ("DELETE", ""), ("GET", "/items"), ("POST", "/items")):
        body = {"metadata": {}} if path == "" and method == "POST" else {"items": [{"role": "user", "content": "x"}]}
        answer = await api.request(method, f"/v1/conversations/{conversation_id}{path}", headers=SHARED,
                                   json=body if method == "POST" else None)
        assert (answer.status_code, answer.json()) == (404, {"error": "Conversation not found"})
