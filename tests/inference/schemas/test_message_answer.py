"""A provider's whole Messages answer parsed into the gateway's schema and re-serialized (spec 1:
"non-streaming bodies are parsed into the gateway's messages schema and re-serialized (unparseable:
502 parse_error)")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from inference.errors import GatewayError
from inference.schemas.message_answer import reserialize_message

ANSWER: dict[str, Any] = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "hi"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2, "cache_creation_input_tokens": None, "cache_read_input_tokens": 0,
              "server_tool_use": {"web_search_requests": 0}},
    "container": None, "context_management": {"applied_edits": []},
}  # fmt: skip


def test_an_answer_comes_back_equal_with_the_fields_the_schema_does_not_model() -> None:
    raw = orjson.dumps(ANSWER, option=orjson.OPT_INDENT_2)
    assert orjson.loads(reserialize_message(raw)) == ANSWER


def test_an_absent_stop_sequence_becomes_null() -> None:
    answer = {key: value for key, value in ANSWER.items() if key != "stop_sequence"}
    assert orjson.loads(reserialize_message(orjson.dumps(answer)))["stop_sequence"] is None


@pytest.mark.parametrize(
    "change",
    [
        {"type": "error"}, {"role": "user"}, {"id": 1}, {"model": None}, {"content": "text"}, {"content": [1]},
        {"content": [{"type": "text"}]}, {"content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]},
        {"stop_reason": 3}, {"usage": None}, {"usage": {"input_tokens": 1}},
        {"usage": {"input_tokens": 1, "output_tokens": True}},
        {"usage": {"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": "0"}},
    ],
)  # fmt: skip
def test_an_answer_that_does_not_parse_is_502_parse_error(change: dict[str, Any]) -> None:
    with pytest.raises(GatewayError) as raised:
        reserialize_message(orjson.dumps({**ANSWER, **change}))
    assert raised.value.status == 502 and raised.value.code == "parse_error"


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'"message"'])
def test_a_body_that_is_not_a_json_object_is_502_parse_error(raw: bytes) -> None:
    with pytest.raises(GatewayError) as raised:
        reserialize_message(raw)
    assert raised.value.code == "parse_error"
