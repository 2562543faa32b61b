"""The Conversations API through the openai SDK in strict mode (every answer validated against the
SDK's models): conversations create, retrieve, update, delete and items create, list, retrieve,
delete, with a tenant key as the SDK's API key."""

from __future__ import annotations

from typing import AsyncIterator

import openai
import pytest

from tests.conftest import ALICE, CHARLIE, GatewayFactory
from tests.responses_api.conftest import TENANT_KEYS


@pytest.fixture
async def sdk(make_gateway: GatewayFactory, backend: str) -> AsyncIterator[openai.AsyncOpenAI]:
    http = make_gateway(tenant_api_keys=TENANT_KEYS, history_backend=backend)
    yield openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=ALICE.key, http_client=http,
                             _strict_response_validation=True, max_retries=0)


async def test_conversations_through_the_sdk(sdk: openai.AsyncOpenAI) -> None:
    conversation = await sdk.conversations.create(
        metadata={"topic": "sdk"}, items=[{"type": "message", "role": "user", "content": "hello"}]
    )
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "sdk"}

    fetched = await sdk.conversations.retrieve(conversation.id)
    assert fetched == conversation
    updated = await sdk.conversations.update(conversation.id, metadata={"topic": "changed", "lang": "en"})
    assert updated.metadata == {"topic": "changed", "lang": "en"}

    created = await sdk.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "assistant", "content": "hi there"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "found"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ])
    assert [item.type for item in created.data] == ["message", "function_call", "function_call_output", "message"]
    assert created.first_id == created.data[0].id and created.last_id == created.data[-1].id

    page = await sdk.conversations.items.list(conversation.id, limit=2, order="asc")
    assert [item.type for item in page.data] == ["message", "message"] and page.has_more
    everything = [item async for item in sdk.conversations.items.list(conversation.id, limit=2, order="asc")]
    assert len(everything) == 5  # the SDK's auto-pagination follows last_id with after
    newest_first = await sdk.conversations.items.list(conversation.id)
    assert [item.id for item in newest_first.data] == [item.id for item in reversed(everything)]

    call = created.data[1]
    item = await sdk.conversations.items.retrieve(call.id, conversation_id=conversation.id,
                                                  include=["message.output_text.logprobs"])
    assert item.type == "function_call" and item.id == call.id and item.name == "lookup"

    after_delete = await sdk.conversations.items.delete(call.id, conversation_id=conversation.id)
    assert after_delete.id == conversation.id and after_delete.object == "conversation"
    with pytest.raises(openai.NotFoundError):
        await sdk.conversations.items.retrieve(call.id, conversation_id=conversation.id)

    deleted = await sdk.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(openai.NotFoundError):
        await sdk.conversations.retrieve(conversation.id)


async def test_sdk_errors(sdk: openai.AsyncOpenAI) -> None:
    conversation = await sdk.conversations.create(items=[{"type": "message", "role": "user", "content": "x",
                                                          "id": "msg_known"}])
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.conversations.items.create(conversation.id, items=[{"type": "item_reference", "id": "msg_known"}])
    assert refused.value.code == "item_already_in_conversation"
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.conversations.items.retrieve("msg_known", conversation_id=conversation.id,
                                               include=["nonsense"])  # type: ignore[list-item]
    assert refused.value.code == "invalid_value"
    stranger = sdk.with_options(api_key=CHARLIE.key)
    with pytest.raises(openai.NotFoundError):
        await stranger.conversations.retrieve(conversation.id)
    with pytest.raises(openai.AuthenticationError):
        await sdk.with_options(api_key="sk-unknown").conversations.retrieve(conversation.id)


async def test_an_empty_conversation_lists_no_items(sdk: openai.AsyncOpenAI) -> None:
    conversation = await sdk.conversations.create()
    page = await sdk.conversations.items.list(conversation.id)
    assert page.data == [] and not page.has_more and page.last_id is None
