"""The Conversations API over HTTP (the whole ASGI app in-process), on the db and memory backends: the
shapes, every error of spec 2 for conversations ({error: <message>}, the two structured ones), client
keys and tenant scopes on every route, metadata merges, the 20-item cap and cursor pages."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import ALICE, BOB, CHARLIE, Actor
from tests.responses_api.conftest import SHARED


def user(text: str, **fields: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text, **fields}


async def create(api: httpx.AsyncClient, actor: Actor = ALICE, **body: Any) -> dict[str, Any]:
    answer = await api.post("/v1/conversations", json=body, headers=actor.headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def add(api: httpx.AsyncClient, conversation_id: str, items: list[Any], actor: Actor = ALICE) -> httpx.Response:
    return await api.post(f"/v1/conversations/{conversation_id}/items", json={"items": items}, headers=actor.headers)


def refused(answer: httpx.Response, status: int, message: str | None = None) -> str:
    """The answer is ``{"error": <message>}`` with ``status``; the message is returned."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    if message is not None:
        assert message in body["error"], body
    return str(body["error"])


def structured(answer: httpx.Response, code: str, param: str) -> None:
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": {"message": answer.json()["error"]["message"], "type": "invalid_request_error",
                                       "param": param, "code": code}}


# --- shapes ----------------------------------------------------------------------------------------------


async def test_create_get_update_delete(api: httpx.AsyncClient) -> None:
    created = await create(api, metadata={"topic": "demo"})
    assert set(created) == {"id", "object", "created_at", "metadata"}
    assert created["id"].startswith("conv_") and created["object"] == "conversation"
    assert isinstance(created["created_at"], int) and created["metadata"] == {"topic": "demo"}

    path = f"/v1/conversations/{created['id']}"
    assert (await api.get(path, headers=ALICE.headers)).json() == created
    updated = await api.post(path, json={"metadata": {"topic": None, "lang": "en"}}, headers=ALICE.headers)
    assert updated.status_code == 200 and updated.json() == {**created, "metadata": {"lang": "en"}}
    assert (await api.post(path, json={"metadata": None}, headers=ALICE.headers)).json() == updated.json()

    deleted = await api.delete(path, headers=ALICE.headers)
    assert deleted.json() == {"id": created["id"], "object": "conversation.deleted", "deleted": True}
    refused(await api.get(path, headers=ALICE.headers), 404, "Conversation not found")
    refused(await api.delete(path, headers=ALICE.headers), 404, "Conversation not found")


async def test_an_empty_body_creates_an_empty_conversation(api: httpx.AsyncClient) -> None:
    answer = await api.post("/v1/conversations", headers=ALICE.headers)
    assert answer.status_code == 200 and answer.json()["metadata"] == {}
    items = await api.get(f"/v1/conversations/{answer.json()['id']}/items", headers=ALICE.headers)
    assert items.json() == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


async def test_items_are_created_listed_read_and_deleted(api: httpx.AsyncClient) -> None:
    conversation = await create(api, items=[user("first")])
    added = await add(api, conversation["id"], [
        user("second"),
        {"role": "assistant", "content": "an answer"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "mcp_list_tools", "server_label": "docs", "tools": [{"name": "search", "input_schema": {}}]},
        {"type": "mcp_call", "server_label": "docs", "name": "search", "arguments": "{}", "output": "found"},
    ])
    assert added.status_code == 200, added.text
    listing = added.json()
    assert listing["object"] == "list" and listing["has_more"] is False
    prefixes = [item["id"].split("_")[0] + "_" for item in listing["data"]]
    assert prefixes == ["msg_", "msg_", "fc_", "fco_", "rs_", "mcpl_", "mcp_"]
    assert (listing["first_id"], listing["last_id"]) == (listing["data"][0]["id"], listing["data"][-1]["id"])
    second, answer = listing["data"][0], listing["data"][1]
    assert second["content"] == [{"type": "input_text", "text": "second"}] and second["status"] == "completed"
    assert answer["content"] == [{"type": "output_text", "text": "an answer", "annotations": []}]
    assert all(isinstance(item["created_at"], int) for item in listing["data"])

    items_path = f"/v1/conversations/{conversation['id']}/items"
    everything = (await api.get(items_path, headers=ALICE.headers)).json()
    assert len(everything["data"]) == 8 and everything["data"][-1]["content"][0]["text"] == "first"  # newest first

    item_path = f"{items_path}/{second['id']}"
    assert (await api.get(item_path, headers=ALICE.headers)).json() == second
    assert (await api.get(item_path, params={"include[]": "message.output_text.logprobs"},
                          headers=ALICE.headers)).json() == second
    deleted = await api.delete(item_path, headers=ALICE.headers)
    assert deleted.status_code == 200 and deleted.json()["id"] == conversation["id"]
    assert deleted.json()["object"] == "conversation"
    refused(await api.get(item_path, headers=ALICE.headers), 404, "Item not found")
    refused(await api.delete(item_path, headers=ALICE.headers), 404, "Item not found")


async def test_an_item_in_two_conversations_is_deleted_from_one_only(api: httpx.AsyncClient) -> None:
    first = await create(api, items=[user("shared", id="msg_shared_1"), user("own")])
    second = await create(api)
    linked = await add(api, second["id"], [{"type": "item_reference", "id": "msg_shared_1"}])
    assert linked.json()["data"][0]["content"][0]["text"] == "shared"

    await api.delete(f"/v1/conversations/{first['id']}/items/msg_shared_1", headers=ALICE.headers)
    first_items = (await api.get(f"/v1/conversations/{first['id']}/items", headers=ALICE.headers)).json()
    assert [item["content"][0]["text"] for item in first_items["data"]] == ["own"]
    kept = await api.get(f"/v1/conversations/{second['id']}/items/msg_shared_1", headers=ALICE.headers)
    assert kept.status_code == 200 and kept.json()["content"][0]["text"] == "shared"


async def test_cursor_pages(api: httpx.AsyncClient) -> None:
    conversation = await create(api)
    listing = (await add(api, conversation["id"], [user(str(i)) for i in range(5)])).json()
    ids = [item["id"] for item in listing["data"]]
    path = f"/v1/conversations/{conversation['id']}/items"

    page = (await api.get(path, params={"limit": 2, "order": "asc"}, headers=ALICE.headers)).json()
    assert ([i["id"] for i in page["data"]], page["first_id"], page["last_id"], page["has_more"]) == (
        ids[:2], ids[0], ids[1], True)
    page = (await api.get(path, params={"limit": 2, "order": "asc", "after": page["last_id"]},
                          headers=ALICE.headers)).json()
    assert [i["id"] for i in page["data"]] == ids[2:4] and page["has_more"]
    page = (await api.get(path, params={"limit": 2, "order": "asc", "after": page["last_id"]},
                          headers=ALICE.headers)).json()
    assert [i["id"] for i in page["data"]] == ids[4:] and not page["has_more"]

    page = (await api.get(path, params={"limit": 3}, headers=ALICE.headers)).json()  # desc by default
    assert [i["id"] for i in page["data"]] == ids[:1:-1] and page["has_more"]
    page = (await api.get(path, params={"limit": 3, "after": page["last_id"]}, headers=ALICE.headers)).json()
    assert [i["id"] for i in page["data"]] == [ids[1], ids[0]] and not page["has_more"]
    refused(await api.get(path, params={"after": "msg_unknown"}, headers=ALICE.headers), 404,
            "No item found with id 'msg_unknown'")


# --- metadata and item limits ------------------------------------------------------------------------------


async def test_metadata_limits(api: httpx.AsyncClient) -> None:
    sixteen = {f"k{i}": "v" for i in range(16)}
    assert (await create(api, metadata=sixteen))["metadata"] == sixteen
    refused(await api.post("/v1/conversations", json={"metadata": {**sixteen, "x": "v"}}, headers=ALICE.headers),
            400, "16")
    refused(await api.post("/v1/conversations", json={"metadata": {"k" * 65: "v"}}, headers=ALICE.headers), 400, "64")
    assert (await create(api, metadata={"k" * 64: "v" * 512}))["metadata"] == {"k" * 64: "v" * 512}
    refused(await api.post("/v1/conversations", json={"metadata": {"k": "v" * 513}}, headers=ALICE.headers),
            400, "512")
    for bad in ({"k": 1}, {"k": None}, {"k": ["v"]}):
        refused(await api.post("/v1/conversations", json={"metadata": bad}, headers=ALICE.headers), 400, "string")
    for bad in ([], "text", 3):
        refused(await api.post("/v1/conversations", json={"metadata": bad}, headers=ALICE.headers), 400,
                "metadata must be an object")


async def test_metadata_updates_merge_within_16_pairs(api: httpx.AsyncClient) -> None:
    conversation = await create(api, metadata={f"k{i}": "v" for i in range(15)})
    path = f"/v1/conversations/{conversation['id']}"
    refused(await api.post(path, json={"metadata": {"a": "1", "b": "2"}}, headers=ALICE.headers), 400,
            "metadata cannot have more than 16 properties")
    assert (await api.get(path, headers=ALICE.headers)).json() == conversation
    merged = await api.post(path, json={"metadata": {"k0": None, "k1": "changed", "a": "1", "b": "2"}},
                            headers=ALICE.headers)
    assert merged.status_code == 200 and len(merged.json()["metadata"]) == 16
    assert merged.json()["metadata"]["k1"] == "changed" and "k0" not in merged.json()["metadata"]
    refused(await api.post(path, json={}, headers=ALICE.headers), 400, "metadata")
    refused(await api.post(path, json={"metadata": {"k": 5}}, headers=ALICE.headers), 400, "string or null")
    refused(await api.post(path, json={"metadata": {"k": "v"}, "extra": 1}, headers=ALICE.headers), 400,
            "Unknown parameter: 'extra'")


async def test_at_most_20_items_per_request(api: httpx.AsyncClient) -> None:
    conversation = await create(api)
    assert len((await add(api, conversation["id"], [user(str(i)) for i in range(20)])).json()["data"]) == 20
    refused(await add(api, conversation["id"], [user(str(i)) for i in range(21)]), 400,
            "Cannot add more than 20 items at a time")
    refused(await api.post("/v1/conversations", json={"items": [user(str(i)) for i in range(21)]},
                           headers=ALICE.headers), 400, "20")
    listing = (await api.get(f"/v1/conversations/{conversation['id']}/items", headers=ALICE.headers)).json()
    assert len(listing["data"]) == 20


async def test_item_already_in_conversation(api: httpx.AsyncClient) -> None:
    conversation = await create(api, items=[user("first", id="msg_first")])
    structured(await add(api, conversation["id"], [{"type": "item_reference", "id": "msg_first"}]),
               "item_already_in_conversation", "items")
    structured(await add(api, conversation["id"], [user("again", id="msg_first")]),
               "item_already_in_conversation", "items")
    answer = await add(api, conversation["id"], [user("other")])
    assert answer.status_code == 200


async def test_invalid_include(api: httpx.AsyncClient) -> None:
    conversation = await create(api, items=[user("x", id="msg_x")])
    base = f"/v1/conversations/{conversation['id']}/items"
    for path in (f"{base}/msg_x", base):
        structured(await api.get(path, params={"include": "nonsense"}, headers=ALICE.headers), "invalid_value",
                   "include")
        structured(await api.get(path, params={"include[]": ["reasoning.encrypted_content", "bad"]},
                                 headers=ALICE.headers), "invalid_value", "include")
    structured(await api.post(base, params={"include[]": "bad"}, json={"items": [user("y")]}, headers=ALICE.headers),
               "invalid_value", "include")


# --- every error shape ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, message", [
    (b"{", "not valid JSON"),
    (b"[1]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"),
    (b'{"items": []}', "at least one item"),
    (b'{"items": {}}', "'items'"),
    (b'{}', "'items'"),
    (b'{"items": [{"type": "message"}]}', "role"),
    (b'{"items": [{"type": "message", "role": "tool", "content": "x"}]}', "role"),
    (b'{"items": [{"type": "message", "role": "user", "content": 5}]}', "content"),
    (b'{"items": [{"type": "message", "role": "user", "content": [{"type": "video"}]}]}', "content[0].type"),
    (b'{"items": [{"type": "message", "role": "user", "content": [{"type": "input_text"}]}]}', "text"),
    (b'{"items": [{"type": "web_search_call"}]}', "type must be one of"),
    (b'{"items": [{"content": "no type, no role"}]}', "type must be one of"),
    (b'{"items": [7]}', "must be an object"),
    (b'{"items": [{"type": "function_call", "name": "f", "arguments": "{}"}]}', "call_id"),
    (b'{"items": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}', "arguments"),
    (b'{"items": [{"type": "function_call_output", "call_id": "c", "output": 5}]}', "output"),
    (b'{"items": [{"type": "mcp_call", "name": "f", "arguments": "{}"}]}', "server_label"),
    (b'{"items": [{"type": "mcp_list_tools", "server_label": "s", "tools": [{}]}]}', "name"),
    (b'{"items": [{"type": "item_reference"}]}', "id"),
    (b'{"items": [{"type": "message", "role": "user", "content": "x", "id": "has space"}]}', ".id"),
    (b'{"items": [{"type": "message", "role": "user", "content": "x", "status": "done"}]}', "status"),
    (b'{"items": [{"type": "message", "role": "user", "content": "a\\u0000b"}]}', "NUL"),
    (b'{"items": [], "metadata": {}}', "Unknown parameter: 'metadata'"),
])
async def test_bad_item_bodies(api: httpx.AsyncClient, body: bytes, message: str) -> None:
    conversation = await create(api)
    answer = await api.post(f"/v1/conversations/{conversation['id']}/items", content=body,
                            headers={**ALICE.headers, "Content-Type": "application/json"})
    refused(answer, 400, message)


async def test_a_missing_reference_is_404_and_nothing_is_added(api: httpx.AsyncClient) -> None:
    conversation = await create(api)
    refused(await add(api, conversation["id"], [user("x"), {"type": "item_reference", "id": "msg_none"}]), 404,
            "Referenced item 'msg_none' not found")
    assert (await api.get(f"/v1/conversations/{conversation['id']}/items", headers=ALICE.headers)).json()["data"] == []


@pytest.mark.parametrize("query, message", [
    ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "ten"}, "limit"), ({"limit": "-1"}, "limit"),
    ({"order": "up"}, "order"),
])
async def test_bad_list_queries(api: httpx.AsyncClient, query: dict[str, str], message: str) -> None:
    conversation = await create(api)
    refused(await api.get(f"/v1/conversations/{conversation['id']}/items", params=query, headers=ALICE.headers),
            400, message)


@pytest.mark.parametrize("method, suffix", [
    ("GET", ""), ("POST", ""), ("DELETE", ""), ("GET", "/items"), ("POST", "/items"),
    ("GET", "/items/msg_x"), ("DELETE", "/items/msg_x"),
])
@pytest.mark.parametrize("conversation_id", ["conv_unknown", "conv_%00", "x" * 65, "conv_caf%C3%A9"])
async def test_unknown_conversations_are_404_on_every_route(
    api: httpx.AsyncClient, method: str, suffix: str, conversation_id: str
) -> None:
    body = {"metadata": {}} if suffix == "" else {"items": [user("x")]}
    answer = await api.request(method, f"/v1/conversations/{conversation_id}{suffix}", headers=ALICE.headers,
                               json=body if method == "POST" else None)
    refused(answer, 404)


async def test_unknown_and_malformed_item_ids_are_404(api: httpx.AsyncClient) -> None:
    conversation = await create(api)
    for item_id in ("msg_unknown", "msg_%00", "m" * 129):
        for method in ("GET", "DELETE"):
            answer = await api.request(method, f"/v1/conversations/{conversation['id']}/items/{item_id}",
                                       headers=ALICE.headers)
            refused(answer, 404, "Item not found")


async def test_other_methods_are_405(api: httpx.AsyncClient) -> None:
    conversation = await create(api)
    for method, path in (("GET", "/v1/conversations"), ("PUT", f"/v1/conversations/{conversation['id']}"),
                         ("PATCH", f"/v1/conversations/{conversation['id']}/items"),
                         ("POST", f"/v1/conversations/{conversation['id']}/items/msg_x"),
                         ("OPTIONS", "/v1/conversations")):
        refused(await api.request(method, path, headers=ALICE.headers), 405)


async def test_a_body_over_the_payload_limit_is_413(make_gateway: Any, backend: str) -> None:
    api = make_gateway(history_backend=backend, max_payload_size=64)
    refused(await api.post("/v1/conversations", json={"metadata": {"k": "v" * 100}}), 413)


# --- keys and tenant scopes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic x"},
                                     {"Authorization": "Bearer "}])
async def test_a_missing_or_unknown_key_is_401_with_an_empty_body(api: httpx.AsyncClient, headers: dict) -> None:
    conversation = await create(api)
    cid = conversation["id"]
    for method, path in (("POST", "/v1/conversations"), ("GET", f"/v1/conversations/{cid}"),
                         ("POST", f"/v1/conversations/{cid}"), ("DELETE", f"/v1/conversations/{cid}"),
                         ("GET", f"/v1/conversations/{cid}/items"), ("POST", f"/v1/conversations/{cid}/items"),
                         ("GET", f"/v1/conversations/{cid}/items/msg_x"),
                         ("DELETE", f"/v1/conversations/{cid}/items/msg_x")):
        answer = await api.request(method, path, headers=headers, json={} if method == "POST" else None)
        assert (answer.status_code, answer.content) == (401, b""), (method, path)
        assert "content-type" not in answer.headers
    assert (await api.get(f"/v1/conversations/{cid}", headers=ALICE.headers)).status_code == 200


async def test_another_tenant_cannot_see_update_or_delete(api: httpx.AsyncClient) -> None:
    conversation = await create(api, metadata={"owner": "acme"}, items=[user("secret", id="msg_secret")])
    cid = conversation["id"]
    for method, path, body in (
        ("GET", f"/v1/conversations/{cid}", None),
        ("POST", f"/v1/conversations/{cid}", {"metadata": {"owner": "globex"}}),
        ("DELETE", f"/v1/conversations/{cid}", None),
        ("GET", f"/v1/conversations/{cid}/items", None),
        ("POST", f"/v1/conversations/{cid}/items", {"items": [user("intruder")]}),
        ("GET", f"/v1/conversations/{cid}/items/msg_secret", None),
        ("DELETE", f"/v1/conversations/{cid}/items/msg_secret", None),
    ):
        for stranger in (CHARLIE.headers, SHARED):
            refused(await api.request(method, path, headers=stranger, json=body), 404, "Conversation not found")
    # Nor reach its items by reference from a conversation of its own.
    own = await create(api, CHARLIE)
    refused(await add(api, own["id"], [{"type": "item_reference", "id": "msg_secret"}], CHARLIE), 404)

    # A teammate (another key of the same tenant) shares the scope.
    assert (await api.get(f"/v1/conversations/{cid}", headers=BOB.headers)).json() == conversation
    listing = (await api.get(f"/v1/conversations/{cid}/items", headers=BOB.headers)).json()
    assert [item["id"] for item in listing["data"]] == ["msg_secret"]


async def test_the_shared_key_has_a_scope_of_its_own(api: httpx.AsyncClient) -> None:
    answer = await api.post("/v1/conversations", json={"items": [user("shared's", id="msg_s")]}, headers=SHARED)
    cid = answer.json()["id"]
    assert (await api.get(f"/v1/conversations/{cid}", headers=SHARED)).status_code == 200
    refused(await api.get(f"/v1/conversations/{cid}", headers=ALICE.headers), 404)
    refused(await api.get(f"/v1/conversations/{cid}/items/msg_s", headers=CHARLIE.headers), 404)


async def test_open_mode_needs_no_key(open_api: httpx.AsyncClient) -> None:
    created = (await open_api.post("/v1/conversations", json={"metadata": {"a": "b"}})).json()
    answer = await open_api.get(f"/v1/conversations/{created['id']}")
    assert answer.status_code == 200 and answer.json() == created
    assert (await open_api.get(f"/v1/conversations/{created['id']}",
                               headers={"Authorization": "Bearer anything"})).status_code == 200
