"""Stored responses and conversations in the admin console: staff only, read-only, filterable by
scope, model, status and time, searchable by id, the detail pages with their items; the list's query
count does not grow with its rows."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.test import Client

from responses_api.models import Conversation, ConversationItem, Item, ResponseItem, StoredResponse
from responses_api.storage.db import DatabaseHistoryStore
from responses_api.transcript import transcript
from tests.responses_api.test_storage import message, response_object

pytestmark = pytest.mark.django_db(transaction=True)

RESPONSES = "/admin/responses_api/storedresponse/"
CONVERSATIONS = "/admin/responses_api/conversation/"
STORE = DatabaseHistoryStore()


def save_response(scope: str = "tenant:acme", **fields: Any) -> dict[str, Any]:
    response = response_object([message("the answer", "assistant")], **fields)
    async_to_sync(STORE.asave_response)(scope, response, [message("the question")])
    return response


def save_conversation(scope: str = "tenant:acme", **metadata: str) -> str:
    record = async_to_sync(STORE.acreate_conversation)(scope, metadata, [message("hello there"), message("again")])
    return record.id


@pytest.mark.parametrize("path", [RESPONSES, CONVERSATIONS])
def test_the_pages_need_a_staff_login(client: Client, path: str) -> None:
    assert client.get(path).status_code == 302
    User.objects.create_user("carol", password="pw-not-staff-123")
    client.login(username="carol", password="pw-not-staff-123")
    assert client.get(path).status_code == 302


def test_responses_list_filters_and_search(admin_client: Client) -> None:
    first = save_response(model="llama-3", status="completed")
    second = save_response("tenant:globex", model="qwen", status="failed")
    page = admin_client.get(RESPONSES).content.decode()
    assert first["id"] in page and second["id"] in page
    assert "tenant:globex" in page and "By scope" in page and "By model" in page and "By status" in page

    for query, shown, hidden in (
        ("scope=tenant%3Aglobex", second, first),
        ("model=llama-3", first, second),
        ("status=failed", second, first),
        (f"q={first['id']}", first, second),
        (f"q={second['id']}", second, first),
    ):
        page = admin_client.get(f"{RESPONSES}?{query}").content.decode()
        assert shown["id"] in page and hidden["id"] not in page, query
    page = admin_client.get(f"{RESPONSES}?created_at__gte=2000-01-01T00:00:00%2B00:00").content.decode()
    assert first["id"] in page


def test_response_detail_shows_the_object_and_items_read_only(admin_client: Client) -> None:
    response = save_response(metadata={"ticket": "T-1"})
    answer = admin_client.get(f"{RESPONSES}{quote(response['id'])}/change/")
    page = answer.content.decode()
    assert answer.status_code == 200
    assert "the question" in page and "the answer" in page and "T-1" in page
    assert 'name="_save"' not in page and "/delete/" not in page
    assert admin_client.get(f"{RESPONSES}add/").status_code == 403
    assert admin_client.post(f"{RESPONSES}{quote(response['id'])}/delete/", {"post": "yes"}).status_code == 403
    assert StoredResponse.objects.filter(pk=response["id"]).exists()


def test_ids_are_linked_quoted_as_the_admin_reads_them(admin_client: Client) -> None:
    """An id like resp_22ab... reads as resp_"ab... to the admin unquoted ("_22" is its escape of '"')."""
    record = async_to_sync(STORE.acreate_conversation)("tenant:acme", {}, [])
    Conversation.objects.filter(pk=record.id).update(id="conv_22ab")
    page = admin_client.get(CONVERSATIONS).content.decode()
    assert f'href="{CONVERSATIONS}conv_5F22ab/change/' in page
    assert admin_client.get(f"{CONVERSATIONS}conv_5F22ab/change/").status_code == 200


def test_conversations_list_detail_and_search(admin_client: Client) -> None:
    mine = save_conversation(topic="billing")
    theirs = save_conversation("tenant:globex")
    page = admin_client.get(CONVERSATIONS).content.decode()
    assert mine in page and theirs in page and "By scope" in page
    page = admin_client.get(f"{CONVERSATIONS}?q={mine}").content.decode()
    assert mine in page and theirs not in page
    page = admin_client.get(f"{CONVERSATIONS}?scope=tenant%3Aglobex").content.decode()
    assert theirs in page and mine not in page

    answer = admin_client.get(f"{CONVERSATIONS}{quote(mine)}/change/")
    assert answer.status_code == 200, (answer.status_code, answer.get("Location"))
    detail = answer.content.decode()
    assert "billing" in detail and "hello there" in detail and 'name="_save"' not in detail
    assert admin_client.get(f"{CONVERSATIONS}add/").status_code == 403
    assert Conversation.objects.count() == 2


def test_list_query_counts_do_not_grow_with_rows(admin_client: Client, django_assert_max_num_queries: Any) -> None:
    save_response()
    save_conversation()
    for path in (RESPONSES, CONVERSATIONS):
        admin_client.get(path)  # warm up (content types, session)
    with django_assert_max_num_queries(20) as few:
        admin_client.get(RESPONSES)
        admin_client.get(CONVERSATIONS)
    for _ in range(5):
        save_response()
        save_conversation()
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert admin_client.get(RESPONSES).status_code == 200
        assert admin_client.get(CONVERSATIONS).status_code == 200


# --- items labelled, a response shown as its conversation --------------------------------------------------


def tool_exchange() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A second turn's response: the question, the model's reasoning and tool call, the tool's result
    (its input), then the answer (its output)."""
    question = message("What is the weather in Paris?", item_id="msg_question")
    thought = {"id": "rs_thought", "type": "reasoning", "status": "completed",
               "summary": [{"type": "summary_text", "text": "The user wants the weather; call the tool."}]}
    call = {"id": "fc_weather", "type": "function_call", "call_id": "call_x", "name": "get_weather",
            "arguments": '{"city": "Paris"}', "status": "completed"}
    result = {"id": "fco_weather", "type": "function_call_output", "call_id": "call_x", "output": "18 degrees, sunny"}
    answer = message("It is 18 degrees and sunny in Paris.", "assistant", item_id="msg_answer")
    response = response_object([answer], instructions="Answer briefly.")
    return response, [question, thought, call, result]


def test_items_are_labelled_by_type_role_and_id(admin_client: Client) -> None:
    response, inputs = tool_exchange()
    async_to_sync(STORE.asave_response)("tenant:acme", response, inputs)
    conversation = async_to_sync(STORE.acreate_conversation)("tenant:acme", {}, [message("hi", item_id="msg_hi")])
    labels = {str(link) for link in ResponseItem.objects.filter(response_id=response["id"])}
    assert labels == {"message · user · msg_question", "reasoning · rs_thought", "function_call · fc_weather",
                      "function_call_output · fco_weather", "message · assistant · msg_answer"}
    [member] = ConversationItem.objects.filter(conversation_id=conversation.id)
    assert str(member) == "message · user · msg_hi"

    pages = [admin_client.get(f"{RESPONSES}{quote(response['id'])}/change/").content.decode(),
             admin_client.get(f"{CONVERSATIONS}{quote(conversation.id)}/change/").content.decode()]
    assert "function_call · fc_weather" in pages[0] and "message · user · msg_hi" in pages[1]
    assert not any("ResponseItem object" in page or "ConversationItem object" in page for page in pages)


def test_a_stored_response_is_shown_as_its_conversation_with_the_raw_json_a_click_away(admin_client: Client) -> None:
    response, inputs = tool_exchange()
    async_to_sync(STORE.asave_response)("tenant:acme", response, inputs)
    page = admin_client.get(f"{RESPONSES}{quote(response['id'])}/change/").content.decode()
    start = page.index('<div class="gw-transcript">')
    shown = page[start:page.index("Raw JSON</summary><pre", page.index("msg_answer", start))]
    # In order: instructions, question, reasoning, tool call, its result, answer, each with its look.
    steps = ['gw-turn-system', "Answer briefly.",
             'gw-turn-user', "What is the weather in Paris?",
             'gw-turn-reasoning', "The user wants the weather; call the tool.",
             'gw-turn-tool-call', "tool call get_weather (call_x)", "&quot;city&quot;: &quot;Paris&quot;",
             'gw-turn-tool-result', "tool result (call_x)", "18 degrees, sunny",
             'gw-turn-assistant', "It is 18 degrees and sunny in Paris."]
    at = [shown.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), list(zip(steps, at))
    # Each item's JSON, and the whole response object, folded in a <details> element.
    assert page.count("<details") >= len(inputs) + 2
    assert '<details class="gw-raw"><summary>Raw JSON</summary><pre class="gw-spec">' in page
    assert "&quot;object&quot;: &quot;response&quot;" in page


def test_a_conversation_is_shown_in_order_without_its_deleted_items(admin_client: Client) -> None:
    record = async_to_sync(STORE.acreate_conversation)(
        "tenant:acme", {}, [message("first", item_id="msg_1"), message("second", "assistant", item_id="msg_2"),
                            message("gone", item_id="msg_3")])
    ConversationItem.objects.filter(conversation_id=record.id, item__item_id="msg_3").update(deleted=True)
    page = admin_client.get(f"{CONVERSATIONS}{quote(record.id)}/change/").content.decode()
    shown = page[page.index('<div class="gw-transcript">'):]
    shown = shown[: shown.index("</fieldset>")]
    assert shown.index("first") < shown.index("second") and "gone" not in shown
    assert "message · user · msg_3 (deleted)" in page  # the items table still lists it, marked


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_hostile_or_malformed_stored_content_is_escaped_and_still_shown(admin_client: Client) -> None:
    response, inputs = tool_exchange()
    inputs[0] = message(HOSTILE, item_id="msg_question")
    inputs[2] = {**inputs[2], "name": HOSTILE, "arguments": HOSTILE}
    response["instructions"] = HOSTILE
    async_to_sync(STORE.asave_response)("tenant:acme", response, inputs)
    # Bodies no API would write (a store written by another version, or by hand): read, never trusted.
    Item.objects.filter(item_id="rs_thought").update(body={"type": "reasoning", "summary": [42, None, {"x": HOSTILE}]})
    Item.objects.filter(item_id="fco_weather").update(body=["not", "an", "object", HOSTILE])
    Item.objects.filter(item_id="msg_answer").update(
        body={"type": "message", "role": HOSTILE, "content": {"text": HOSTILE}}, role="x" * 32)
    answer = admin_client.get(f"{RESPONSES}{quote(response['id'])}/change/")
    page = answer.content.decode()
    assert answer.status_code == 200
    assert '<script>alert("x")</script>' not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "tool call &lt;script&gt;" in page and "gw-turn-other" in page  # the odd role, shown plainly


def test_mcp_items_and_unknown_types_read_as_turns() -> None:
    def item(body: Any, item_type: str = "") -> Item:
        kind = item_type or body["type"]
        return Item(scope="tenant:acme", item_id=f"{kind}_1", type=kind, body=body)

    turns = transcript([
        ("output", item({"type": "mcp_list_tools", "server_label": "docs", "tools": [{"name": "search"}, "odd"]})),
        ("output", item({"type": "mcp_call", "server_label": "docs", "name": "search", "arguments": '{"q": "x"}',
                         "output": "found it"})),
        ("output", item({"type": "mcp_call", "server_label": "docs", "name": "search", "arguments": "not json",
                         "error": {"message": "boom"}})),
        ("output", item({"type": "image_generation_call", "result": "..."})),
        ("input", item(["a", "list"], "message")),
    ])
    assert [(t.css, t.heading) for t in turns] == [
        ("other", "MCP tools of docs"), ("tool-call", "MCP call docs.search"), ("tool-call", "MCP call docs.search"),
        ("other", "image_generation_call"), ("other", "message"),
    ]
    assert turns[0].text == "search"
    assert turns[1].text == '{\n  "q": "x"\n}\n\n→ found it'
    assert turns[2].text.startswith("not json\n\n→ {") and "boom" in turns[2].text
    assert turns[4].text == "a\n\nlist" and turns[4].label == "message · message_1"
