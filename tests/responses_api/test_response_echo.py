"""The response object echoes the request's settings as spec 2 gives them: a setting sent as null is
echoed as its default (parallel_tool_calls true, temperature and top_p 1.0, tool_choice none or auto,
tools [], text format text, truncation disabled, metadata {}), ``user`` only when given, so the
openai SDK in strict mode accepts every object: whole, streamed, queued and read back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.inference.served.conftest import QWEN_MODEL, Start, asgi_app, start_engine_gateway  # noqa: F401

# Every create-request field the response object echoes, and the optional others, sent as null.
NULLS: dict[str, Any] = {
    key: None
    for key in (
        "instructions", "max_output_tokens", "max_tool_calls", "temperature", "top_p", "store", "background",
        "tools", "tool_choice", "parallel_tool_calls", "previous_response_id", "conversation", "reasoning", "text",
        "include", "top_logprobs", "metadata", "user", "truncation", "service_tier", "prompt", "prompt_cache_key",
        "prompt_cache_retention", "safety_identifier", "stream_options",
    )
}  # fmt: skip
DEFAULTS = {
    "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0, "tool_choice": "none", "tools": [],
    "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {}, "store": True,
    "background": False, "instructions": None, "max_output_tokens": None, "max_tool_calls": None,
    "previous_response_id": None, "reasoning": None,
}  # fmt: skip
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def _echoed(response: dict[str, Any]) -> dict[str, Any]:
    return {key: response.get(key) for key in DEFAULTS}


async def test_null_settings_are_echoed_as_the_specs_defaults(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", **NULLS})
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert _echoed(response) == DEFAULTS
    assert "user" not in response  # the SDK's schema has a string or nothing, no null

    # The strict SDK accepts the object whole, streamed, and read back.
    sdk = gw.sdk(strict=True)
    whole = await sdk.responses.create(model=QWEN_MODEL, input="hi", extra_body=NULLS)
    assert whole.parallel_tool_calls is True and whole.tool_choice == "none" and whole.user is None
    stream = await sdk.responses.create(model=QWEN_MODEL, input="hi", stream=True, extra_body={**NULLS, "stream": True})
    events = [event async for event in stream]
    created, done = events[0], events[-1]
    assert created.type == "response.created" and done.type == "response.completed"
    assert created.response.parallel_tool_calls is True and done.response.truncation == "disabled"
    again = await sdk.responses.retrieve(whole.id)
    assert again.parallel_tool_calls is True and again.text is not None and again.text.format is not None


async def test_a_queued_background_object_echoes_the_defaults_too(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    queued = await gw.sdk(strict=True).responses.create(
        model=QWEN_MODEL, input="hi", extra_body={**NULLS, "background": True}
    )
    assert queued.status == "queued" and queued.background is True
    assert queued.parallel_tool_calls is True and queued.temperature == 1.0 and queued.truncation == "disabled"


@pytest.mark.parametrize(
    ("given", "echoed"),
    [
        ({"tools": [WEATHER], "tool_choice": None, "parallel_tool_calls": None}, {"tool_choice": "auto", "parallel_tool_calls": True}),
        ({"tools": [WEATHER], "parallel_tool_calls": False}, {"tool_choice": "auto", "parallel_tool_calls": False}),
        ({"temperature": 0.5, "top_p": 0.9, "truncation": "auto"}, {"temperature": 0.5, "top_p": 0.9, "truncation": "auto"}),
        ({"text": {"format": None, "verbosity": "low"}}, {"text": {"format": {"type": "text"}, "verbosity": "low"}}),
        ({"user": "user-1234"}, {"user": "user-1234"}),
    ],
)  # fmt: skip
async def test_given_settings_are_echoed_as_given(start_engine_gateway: Start, given: dict, echoed: dict) -> None:
    gw = await start_engine_gateway()
    answer = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", **given})
    assert answer.status_code == 200, answer.text
    assert {key: answer.json()[key] for key in echoed} == echoed
    assert (await gw.sdk(strict=True).responses.create(model=QWEN_MODEL, input="hi", extra_body=given)).id


async def test_a_truncation_the_sdk_would_refuse_is_the_specs_400(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway()
    answer = await gw.http.post("/v1/responses", json={"model": QWEN_MODEL, "input": "hi", "truncation": "sometimes"})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "truncation" and answer.json()["error"]["code"] == 400
    assert gw.engine.state.requests == []
