"""Responses on external providers (spec 2, per worker kind): each model turn is a request to the
provider's own /v1/responses, and the gateway keeps what makes the response its own.

- **History is expanded**: the provider sees the resolved input (previous_response_id's or the
  conversation's items, item references, the request's own items, what earlier turns produced),
  never a gateway id: ``previous_response_id``, ``conversation``, ``background`` and ``store`` stay
  here (the provider is asked with ``store: false``), and items go without their ids.
- **MCP tools run here**: the request's mcp tools (and MCP-backed built-ins) reach the provider as
  function tools; a call of one comes back as a function call, which the surface's tool loop runs
  and answers in the next turn as the call and its output. Every other tool is forwarded as given.
- **Events become the pipeline's events**: text and reasoning deltas, function calls (a namespaced
  call as ``ns.name``, mapped back by the surface), the turn's finish and usage; items no event
  describes (a provider's own built-in calls) are kept whole. The surface builds its own items,
  events and stored response from them, so a response reads the same whoever ran its turns.
- **Only the worker's key goes upstream** (or, in open mode, the caller's own), with the client's
  tracing headers as a relay passes them (``ServedRequest.headers``: traceparent, tracestate, ...),
  by the external relay (:mod:`inference.upstreams.provider`), which also passes every connection through the SSRF
  guard. An upstream error on the first turn goes back to the client with its status and body.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

import orjson

from inference.accounting import Delivered
from inference.pipeline.events import Finished, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from inference.routing.workers import WorkerHandle
from inference.served.base import ServedAnswer, ServedRequest
from inference.upstreams import RelayAnswer, RelayRequest
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.provider import EXTERNAL
from inference.upstreams.sse import sse_events
from inference.writers import ResponseWriter
from responses_api.mcp_tools import McpServers
from responses_api.request import MCP_BUILTINS, ResponsesRequest
from responses_api.to_chat import ToolNames
from responses_api.turns import ModelTurn, ProviderItem, TurnEvent, TurnReader

__all__ = ["ProviderFailed", "ProviderTurns", "UpstreamEvents", "upstream_body", "upstream_input", "sse_events"]

PATH = "/v1/responses"

# Fields the gateway answers for itself (history, storage, background, streaming), its own fields,
# and what it replaces (input, tools, tool_choice); everything else is forwarded as the client sent it.
_KEPT_HERE = frozenset((
    "previous_response_id", "conversation", "background", "store", "stream", "stream_options", "request_id",
    "priority", "input", "tools", "tool_choice", "max_tool_calls", "include",
))  # fmt: skip
_OWN_INCLUDES = frozenset(("reasoning.encrypted_content",))  # the gateway's blob, not the provider's
_TEXT_PARTS = ("input_text", "output_text", "text")


def _text_of(content: Any) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS)


def _message(item: Mapping[str, Any]) -> dict[str, Any]:
    role = item["role"]
    content = item.get("content")
    if role == "assistant" or not isinstance(content, list):
        return {"type": "message", "role": role, "content": _text_of(content)}
    parts = []
    for part in content:  # input parts as the client gave them, without stored-only fields
        if isinstance(part, Mapping):
            parts.append({key: value for key, value in part.items() if key not in ("annotations", "logprobs")})
    return {"type": "message", "role": role, "content": parts}


def upstream_input(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The resolved input as a provider takes it without stored state: messages, function calls
    and their outputs, no gateway ids; a gateway-run MCP call as the function call the provider
    made and its output; listings and reasoning (opaque to another server) left out."""
    found: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            found.append(_message(item))
        elif kind == "function_call":
            call = {"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                    "arguments": item.get("arguments") or "{}"}  # fmt: skip
            if item.get("namespace"):
                call["namespace"] = item["namespace"]
            found.append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            found.append({"type": "function_call_output", "call_id": item["call_id"],
                          "output": output if isinstance(output, (str, list)) else ""})  # fmt: skip
        elif kind == "mcp_call":
            call_id = str(item.get("id"))
            error = item.get("error")
            output = str(item.get("output") or "") if error is None else json.dumps(error)
            found.append({"type": "function_call", "call_id": call_id, "name": item["name"],
                          "arguments": item.get("arguments") or "{}"})  # fmt: skip
            found.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return found


def _tool_choice(choice: Any) -> Any:
    """An MCP server's tool choice as the provider sees its tools (functions): required."""
    if isinstance(choice, Mapping) and (choice.get("type") == "mcp" or choice.get("type") in MCP_BUILTINS):
        return "required" if choice.get("type") == "mcp" else "auto"
    return choice


def upstream_body(body: Mapping[str, Any], model: str, items: Iterable[Mapping[str, Any]], mcp: McpServers) -> dict[str, Any]:
    """One turn's request to the provider (see the module's docstring)."""
    sent = {key: value for key, value in body.items() if key not in _KEPT_HERE}
    sent["model"] = model
    sent["input"] = upstream_input(items)
    tools = [tool for tool in body.get("tools") or () if tool.get("type") != "mcp" and tool.get("type") not in MCP_BUILTINS]
    tools.extend(mcp.function_tools())
    if tools:
        sent["tools"] = tools
        if body.get("tool_choice") is not None:
            sent["tool_choice"] = _tool_choice(body["tool_choice"])
    include = [value for value in body.get("include") or () if value not in _OWN_INCLUDES]
    if include:
        sent["include"] = include
    sent["store"] = False
    sent["stream"] = True
    return sent


def _usage(value: Any) -> Usage:
    if not isinstance(value, Mapping):
        return Usage(0, 0)
    given = value.get("input_tokens_details")
    made = value.get("output_tokens_details")
    return Usage(
        prompt_tokens=int(value.get("input_tokens") or 0),
        completion_tokens=int(value.get("output_tokens") or 0),
        cached_tokens=int((given or {}).get("cached_tokens") or 0) if isinstance(given, Mapping) else 0,
        reasoning_tokens=int((made or {}).get("reasoning_tokens") or 0) if isinstance(made, Mapping) else 0,
    )


class ProviderFailed(UpstreamFailure):
    """The provider ended the turn with its own failure (response.failed, or an error event): the
    response fails with the provider's code and message (spec 2, failed-response error mapping)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(FailureKind.BROKEN, message)
        self.code = code


def _failure(event: Mapping[str, Any]) -> ProviderFailed:
    error = event.get("error")
    if not isinstance(error, Mapping):
        response = event.get("response")
        error = response.get("error") if isinstance(response, Mapping) else None
    if not isinstance(error, Mapping):
        error = event  # an error event carries code and message itself
    code = error.get("code")
    message = error.get("message")
    return ProviderFailed(
        str(code) if code else "server_error", str(message) if message else "Upstream generation failed"
    )


class UpstreamEvents:
    """A provider's Responses events as the pipeline's events (see the module's docstring). A
    provider that sends an item's content only with its done event is read the same."""

    def __init__(self, names: ToolNames) -> None:
        self.names = names
        self.usage = Usage(0, 0)
        self._calls: dict[int, int] = {}  # output_index → this turn's call index
        self._streamed: set[int] = set()  # output indexes whose content arrived as deltas
        self.finished = False

    def _call(self, index: int, item: Mapping[str, Any]) -> list[TurnEvent]:
        position = self._calls[index] = len(self._calls)
        name = str(item.get("name", ""))
        namespace = item.get("namespace")
        visible = self.names.add(str(namespace), name) if namespace else name
        events: list[TurnEvent] = [ToolCallDelta(position, str(item.get("call_id") or "") or None, visible)]
        if item.get("arguments"):
            self._streamed.add(index)
            events.append(ToolCallDelta(position, None, None, str(item["arguments"])))
        return events

    def step(self, event: Mapping[str, Any]) -> list[TurnEvent]:
        kind = event.get("type")
        given = event.get("output_index")
        index = given if isinstance(given, int) else 0
        if kind == "response.output_text.delta":
            self._streamed.add(index)
            return [TextDelta(str(event.get("delta", "")))]
        if kind == "response.reasoning_text.delta":
            self._streamed.add(index)
            return [ReasoningDelta(str(event.get("delta", "")))]
        if kind == "response.function_call_arguments.delta" and index in self._calls:
            self._streamed.add(index)
            return [ToolCallDelta(self._calls[index], None, None, str(event.get("delta", "")))]
        item = event.get("item")
        if kind == "response.output_item.added" and isinstance(item, Mapping) and item.get("type") == "function_call":
            return self._call(index, item)
        if kind == "response.output_item.done" and isinstance(item, Mapping):
            return self._done(index, item)
        if kind in ("response.completed", "response.incomplete"):
            return [self._finish(kind, event.get("response"))]
        if kind in ("response.failed", "error"):
            raise _failure(event)
        return []

    def _done(self, index: int, item: Mapping[str, Any]) -> list[TurnEvent]:
        kind = item.get("type")
        if kind == "function_call":
            if index not in self._calls:
                return self._call(index, item)
            if index not in self._streamed and item.get("arguments"):
                return [ToolCallDelta(self._calls[index], None, None, str(item["arguments"]))]
            return []
        if index in self._streamed:
            return []
        if kind == "message":
            return [TextDelta(_text_of(item.get("content")))]
        if kind == "reasoning":
            text = _text_of([{**part, "type": "text"} for part in item.get("content") or () if isinstance(part, Mapping)])
            return [ReasoningDelta(text)] if text else []
        return [ProviderItem(dict(item))]

    def _finish(self, kind: str, response: Any) -> Finished:
        self.finished = True
        response = response if isinstance(response, Mapping) else {}
        self.usage = _usage(response.get("usage"))
        details = response.get("incomplete_details")
        if kind == "response.incomplete" and isinstance(details, Mapping) and details.get("reason") == "max_output_tokens":
            reason = "length"
        else:
            reason = "tool_calls" if self._calls else "stop"
        return Finished(reason, self.usage)


async def _whole_events(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[dict[str, Any]]:
    """A provider that answered a whole response object (not a stream) read as the events that
    end its items and the response."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise UpstreamFailure(FailureKind.BROKEN, f"the provider's answer is larger than {limit} bytes")
    try:
        whole = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamFailure(FailureKind.BROKEN, "the provider's answer is not JSON") from None
    if not isinstance(whole, dict):
        raise UpstreamFailure(FailureKind.BROKEN, "the provider's answer is not a response object")
    for index, item in enumerate(whole.get("output") or ()):
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    status = whole.get("status")
    kind = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(str(status), "response.completed")
    yield {"type": kind, "response": whole}


class _ProviderAnswer:
    """A provider turn whose status is 200: its events go to the surface's reader."""

    __slots__ = ("status", "_answer", "_read", "_names", "_streamed", "_limit")

    def __init__(self, answer: RelayAnswer, read: TurnReader, names: ToolNames, streamed: bool, limit: int) -> None:
        self.status = 200
        self._answer = answer
        self._read = read
        self._names = names
        self._streamed = streamed  # server-sent events, or one whole response object
        self._limit = limit  # --max-buffered-response-bytes: one event, or the whole object

    async def forward(self, writer: ResponseWriter) -> Delivered:
        events = UpstreamEvents(self._names)
        chunks = self._answer.chunks()
        read = sse_events(chunks, self._limit) if self._streamed else _whole_events(chunks, self._limit)

        async def batches() -> AsyncIterator[Sequence[TurnEvent]]:
            async for event in read:
                found = events.step(event)
                if found:
                    yield found
                if events.finished:
                    return
            raise UpstreamFailure(FailureKind.BROKEN, "the provider's stream ended before the response finished")

        return await self._read(batches(), lambda: events.usage, writer)

    async def discard(self) -> None:
        await self._answer.discard()


class _ProviderTurn:
    __slots__ = ("turns", "payload")

    def __init__(self, turns: ProviderTurns, payload: bytes) -> None:
        self.turns = turns
        self.payload = payload

    async def open(self, worker: WorkerHandle, read: TurnReader) -> ServedAnswer:
        request = self.turns.request
        relay = request.dp.relay_for(EXTERNAL, PATH)
        answer = await relay.open(RelayRequest(
            worker, PATH, self.payload, True, request.writer.request_id, request.headers, request.identity,
            request.caller_key,
        ))  # fmt: skip
        if answer.status != 200:
            return answer  # the provider's own error, relayed with its status and body (or retried)
        streamed = answer.content_type.startswith("text/event-stream")
        limit = request.dp.config.max_buffered_response_bytes
        return _ProviderAnswer(answer, read, self.turns.names, streamed, limit)


class ProviderTurns:
    """Turns on an external provider (see the module's docstring)."""

    def __init__(self, request: ServedRequest, responses: ResponsesRequest, names: ToolNames, mcp: McpServers) -> None:
        self.request = request
        self.responses = responses
        self.names = names
        self.mcp = mcp

    def prepare(self, items: list[dict[str, Any]]) -> ModelTurn:
        model = self.request.model or self.responses.model
        return _ProviderTurn(self, orjson.dumps(upstream_body(self.responses.body, model, items, self.mcp)))
