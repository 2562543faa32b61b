"""The provider turn's pieces on their own: the upstream request a turn sends, the server-sent events
it reads (however the provider splits them), and those events as the pipeline's events."""

from __future__ import annotations

from typing import Any, AsyncIterator

import orjson
import pytest

from inference.pipeline.events import Finished, ReasoningDelta, TextDelta, ToolCallDelta
from inference.upstreams.failures import UpstreamFailure
from responses_api.mcp_tools import McpServers
from responses_api.provider_turns import (
    ProviderFailed, UpstreamEvents, _whole_events, sse_events, upstream_body, upstream_input,
)  # fmt: skip
from responses_api.to_chat import ToolNames
from responses_api.turns import ProviderItem


async def chunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def collect(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event async for event in events]


async def test_sse_events_across_any_chunking() -> None:
    raw = b": comment\n\nevent: a\ndata: {\"type\": \"a\"}\n\nevent: b\r\ndata: {\"type\":\r\n\r\ndata: [DONE]\n\ndata: {\"type\": \"c\"}\n\n"
    whole = await collect(sse_events(chunks_of(raw), 1 << 20))
    assert [event["type"] for event in whole] == ["a", "c"]  # the broken JSON of b is skipped
    split = await collect(sse_events(chunks_of(*(raw[i : i + 3] for i in range(0, len(raw), 3))), 1 << 20))
    assert split == whole
    with pytest.raises(UpstreamFailure):
        await collect(sse_events(chunks_of(b"data: " + b"x" * 100), 64))


def test_the_upstream_input_has_no_gateway_ids_and_replays_mcp_calls_as_function_calls() -> None:
    items = [
        {"id": "msg_1", "type": "message", "role": "user", "status": "completed",
         "content": [{"type": "input_text", "text": "hi"}]},
        {"id": "mcpl_1", "type": "mcp_list_tools", "server_label": "s", "tools": []},
        {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"id": "mcp_1", "type": "mcp_call", "name": "echo", "arguments": "{}", "output": "ok", "error": None},
        {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "done", "annotations": [], "logprobs": []}]},
        {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "namespace": "ns"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]  # fmt: skip
    assert upstream_input(items) == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "mcp_1", "name": "echo", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "mcp_1", "output": "ok"},
        {"type": "message", "role": "assistant", "content": "done"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "namespace": "ns"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]


def test_the_upstream_body_keeps_history_storage_and_mcp_here() -> None:
    body = {
        "model": "alias", "input": "x", "previous_response_id": "resp_1", "store": True, "background": True,
        "stream": False, "request_id": "r", "priority": 1, "max_tool_calls": 3, "temperature": 0.5,
        "include": ["reasoning.encrypted_content", "message.output_text.logprobs"], "metadata": {"a": "b"},
        "tools": [{"type": "mcp", "server_label": "s", "server_url": "http://x"}, {"type": "web_search"}],
        "tool_choice": {"type": "mcp", "server_label": "s"},
    }  # fmt: skip
    sent = upstream_body(body, "gpt-4o-mini", [{"type": "message", "role": "user", "content": "x"}], McpServers())
    assert sent == {
        "model": "gpt-4o-mini", "input": [{"type": "message", "role": "user", "content": "x"}], "temperature": 0.5,
        "metadata": {"a": "b"}, "tools": [{"type": "web_search"}], "tool_choice": "required",
        "include": ["message.output_text.logprobs"], "store": False, "stream": True,
    }  # fmt: skip


def test_events_become_pipeline_events() -> None:
    names = ToolNames()
    reader = UpstreamEvents(names)
    steps = [
        {"type": "response.created", "response": {}},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning"}},
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "think"},
        {"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]}},
        {"type": "response.output_item.done", "output_index": 1, "item": {"type": "message", "content": [{"type": "output_text", "text": "whole"}]}},
        {"type": "response.output_item.added", "output_index": 2,
         "item": {"type": "function_call", "call_id": "c9", "name": "lookup", "namespace": "crm", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "{}"},
        {"type": "response.output_item.done", "output_index": 3, "item": {"type": "web_search_call", "id": "ws_1", "status": "completed"}},
        {"type": "response.completed", "response": {"usage": {"input_tokens": 7, "output_tokens": 3,
         "input_tokens_details": {"cached_tokens": 2}, "output_tokens_details": {"reasoning_tokens": 1}}}},
    ]  # fmt: skip
    found = [event for step in steps for event in reader.step(step)]
    assert found[:5] == [
        ReasoningDelta("think"), TextDelta("whole"), ToolCallDelta(0, "c9", "crm.lookup"), ToolCallDelta(0, None, None, "{}"),
        ProviderItem({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
    ]  # fmt: skip
    finish = found[5]
    assert isinstance(finish, Finished) and finish.reason == "tool_calls"
    assert (reader.usage.prompt_tokens, reader.usage.cached_tokens, reader.usage.reasoning_tokens) == (7, 2, 1)
    assert names.resolve("crm.lookup") == ("crm", "lookup")


def test_the_providers_own_failure_keeps_its_code() -> None:
    reader = UpstreamEvents(ToolNames())
    with pytest.raises(ProviderFailed) as failed:
        reader.step({"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded", "message": "slow down"}}})
    assert (failed.value.code, failed.value.detail) == ("rate_limit_exceeded", "slow down")
    with pytest.raises(ProviderFailed) as errored:
        reader.step({"type": "error", "code": None, "message": "boom"})
    assert (errored.value.code, errored.value.detail) == ("server_error", "boom")
    incomplete = reader.step({"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}})
    assert incomplete == [Finished("length", reader.usage)]


async def test_a_whole_response_object_reads_as_its_events() -> None:
    whole = {"status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "text": "hey"}]}],
             "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    events = await collect(_whole_events(chunks_of(orjson.dumps(whole)), 1 << 20))
    reader = UpstreamEvents(ToolNames())
    assert [event for step in events for event in reader.step(step)] == [TextDelta("hey"), Finished("stop", reader.usage)]
    with pytest.raises(UpstreamFailure):
        await collect(_whole_events(chunks_of(b"x" * 100), 10))
