"""Property-based requests to the Conversations API (/v1/conversations...) through the whole ASGI app
on the db backend: hostile methods, ids in the path, query strings, header bytes and bodies (items and
metadata of every shape). Whatever comes in, the answer is never a 5xx, an error is the API's
``{"error": <message>}`` or one of its two structured errors (an unknown path: the router's 404
envelope), 401 has an empty body, and nothing escapes a route (the suite's log check fails a test on any escape)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_project.asgi import application
from responses_api.storage import install_history_store
from tests.conftest import ALICE, close_gateways, open_gateway
from tests.hostile.asgi_call import Answer, call_asgi
from tests.inference.schemas.test_fuzz import JSON

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = ((ALICE.tenant_id, ALICE.key),)
AUTH = (b"authorization", f"Bearer {ALICE.key}".encode())
STRUCTURED_CODES = {"item_already_in_conversation", "invalid_value"}

METHODS = st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS", "TRACE", "G3T"])
TEXT = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("/.%\\\x00?#;"), max_size=20)
IDS = TEXT | st.sampled_from(["{conv}", "{item}", "conv_" + "a" * 200, "msg_x", "", "%00", ".."])
SUFFIXES = st.sampled_from(["", "/items", "/items/{item}", "/items/", "/items/{item}/x", "/"])
PATHS = st.builds(lambda conv, suffix, item: f"/v1/conversations/{conv}{suffix}".replace("{item}", item),
                  IDS, SUFFIXES, IDS) | st.just("/v1/conversations")
QUERIES = st.binary(max_size=30) | st.sampled_from(
    [b"limit=0", b"limit=100", b"limit=1e3", b"limit=99999999999999999999", b"order=asc", b"order=%ff",
     b"after=%00", b"after={item}", b"include=bad", b"include[]=reasoning.encrypted_content", b"include[]=%ff"])
CONTENT = st.one_of(st.text(max_size=20), st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "refusal", "input_image", "x"])},
                          optional={"text": JSON, "annotations": JSON, "detail": JSON, "refusal": JSON}),
    max_size=3), JSON)
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "reasoning", "function_call", "function_call_output", "mcp_call",
                                 "mcp_list_tools", "item_reference", "web_search_call"]) | JSON,
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | JSON,
        "content": CONTENT, "id": IDS | JSON, "status": JSON, "call_id": JSON, "name": JSON, "arguments": JSON,
        "output": JSON, "server_label": JSON, "tools": JSON, "summary": JSON,
    },
)
METADATA = st.dictionaries(st.text(max_size=70), st.none() | st.text(max_size=600) | JSON, max_size=20) | JSON
BODIES = (
    st.fixed_dictionaries({}, optional={"items": st.lists(ITEM, max_size=22) | JSON, "metadata": METADATA,
                                        "extra": JSON}).map(orjson.dumps)
    | JSON.map(orjson.dumps)
    | st.binary(max_size=64)
    | st.sampled_from([b"", b"{", b"[" * 5000 + b"]" * 5000, b'{"items": [{"role": "user", "content": "\\ud800"}]}',
                       b'{"metadata": {"k": "\\u0000"}}', b'{"items": 1e999}'])
)
HEADERS = st.lists(st.tuples(st.sampled_from([b"authorization", b"content-type", b"accept", b"content-length"]),
                             st.binary(max_size=30) | st.sampled_from([b"Bearer ", b"text/html", b"-1"])), max_size=3)


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def check(answer: Answer, sent: dict[str, Any]) -> None:
    assert answer.status < 500, (sent, answer.status, answer.body[:300])
    if answer.status == 401:
        assert answer.body == b"", sent
        return
    if answer.status < 400 or sent["method"] == "HEAD":
        return
    if answer.status == 400 and answer.body == b"" and not _utf8(sent["query"]):
        return  # Django's ASGI handler refuses a query string that is not UTF-8 before any route
    body = answer.json()
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        assert error.get("code") in STRUCTURED_CODES or error.get("code") == "endpoint_not_found", (sent, body)
    else:
        assert isinstance(error, str) and error, (sent, answer.status, body)


async def _answers(requests: list[dict[str, Any]]) -> None:
    client = open_gateway(tenant_api_keys=KEYS)
    try:
        created = await call_asgi(application, "POST", "/v1/conversations", headers=[AUTH],
                                  body=b'{"items": [{"role": "user", "content": "hi", "id": "msg_known"}]}')
        conversation = created.json()["id"]
        for sent in requests:
            path = sent["path"].replace("{conv}", conversation).replace("{item}", "msg_known")
            query = sent["query"].replace(b"{item}", b"msg_known")
            headers = [AUTH, *sent["headers"]] if sent["auth"] else sent["headers"]
            answer = await call_asgi(application, sent["method"], path, query=query, headers=headers,
                                     body=sent["body"])
            check(answer, sent)
    finally:
        await close_gateways([client])
        install_history_store(None)


FUZZ = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])
REQUEST = st.fixed_dictionaries({"method": METHODS, "path": PATHS, "query": QUERIES, "headers": HEADERS,
                                 "body": BODIES, "auth": st.booleans()})


@FUZZ
@given(st.lists(REQUEST, min_size=10, max_size=10))
def test_conversation_routes(requests: list[dict[str, Any]]) -> None:
    asyncio.run(_answers(requests))


@FUZZ
@given(st.lists(REQUEST.map(lambda sent: {**sent, "method": "POST", "auth": True, "headers": []}),
                min_size=10, max_size=10))
def test_conversation_bodies(requests: list[dict[str, Any]]) -> None:
    asyncio.run(_answers(requests))
