"""Any JSON body gets a ResponsesRequest or the spec's 400, never another exception (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inference.errors import GatewayError
from responses_api.request import validate_response_request
from responses_api.to_chat import ToolNames, chat_messages, chat_tools, responses_turn

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 40), st.floats(allow_nan=True), st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12)
KEYS = st.sampled_from(["input", "tools", "tool_choice", "reasoning", "text", "metadata", "conversation", "include",
                        "previous_response_id", "max_output_tokens", "top_p", "temperature", "stop", "instructions"])
ITEM = st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "mcp_call"]),
                              "role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": JSON,
                              "call_id": JSON, "name": JSON, "arguments": JSON, "output": JSON})  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, st.one_of(JSON, st.lists(ITEM, min_size=1, max_size=3)), max_size=6))
def test_any_body_is_a_request_or_a_400(fields: dict[str, Any]) -> None:
    body = {"model": "m", "input": "hi", **fields}
    try:
        checked = validate_response_request(body)
    except GatewayError as error:
        assert error.status == 400
        return
    names = ToolNames()
    try:
        items = [{"type": "message", "role": "user", "content": body["input"]}] if isinstance(body["input"], str) else body["input"]
        responses_turn(checked.body, "m", chat_messages(body.get("instructions"), items, names),
                       chat_tools(body.get("tools") or (), names), names, stream=False)  # fmt: skip
    except GatewayError as error:
        assert error.status == 400
