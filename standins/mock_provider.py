"""A stand-in for an external OpenAI-compatible provider (such as api.openai.com), for the gateway's tests.

The gateway's "external provider" path forwards requests to a hosted API that keeps its own models and
keys; this aiohttp application plays that API on loopback. Unlike :mod:`standins.mock_worker` (an
inference engine's own HTTP server) it behaves like OpenAI itself: ``Authorization: Bearer KEY`` on
every ``/v1/*`` route, OpenAI's error bodies and codes, and a ``/v1/responses`` that answers with a
scripted "model" and refuses what a stateless, ``store: false`` caller must never send.

Start it with ``python manage.py runmockprovider --port P`` or in-process with
:func:`build_provider_app` (any aiohttp runner); :func:`provider_state` gives the request log.

Routes:

* ``GET /v1/models`` (and ``GET /v1/models/{id}``): the configured models, ``owned_by: mock-provider``;
* ``POST /v1/chat/completions``: replies ``"heard: " + " | ".join(user message texts)``, whole or as
  ``chat.completion.chunk`` SSE (one chunk per word) ending with ``data: [DONE]``;
* ``POST /v1/responses``: the scripted model, deciding from the last input item:

  a) a ``function_call_output`` → one message ``"tool said: " + output``;
  b) the last user message holds ``[[call:NAME {json args}]]`` markers naming function tools of the
     request → one ``function_call`` item per such marker, in order;
  c) otherwise one message ``"heard: " + " | ".join(user message texts)``, prefixed with
     ``"[INSTRUCTIONS] "`` when ``instructions`` is given.

  Tokens are whitespace-separated words; ``max_output_tokens`` cuts the text and makes the response
  ``incomplete``. ``previous_response_id``, ``conversation`` and ``background: true`` are refused
  (``unsupported_parameter``: the stand-in keeps no state), as are fields OpenAI does not know
  (``unknown_parameter``), input item types other than message / function_call / function_call_output
  / reasoning, items carrying an ``id`` (OpenAI refuses unknown ids with ``store: false``) and a
  ``function_call_output`` with no earlier ``function_call`` of its ``call_id``. Streaming sends
  OpenAI's event sequence (``event: TYPE`` / ``data: {..., "sequence_number": n}``), no ``[DONE]``.

Per-request controls for tests, in the body's ``metadata`` (chat completions and responses):

* ``"provider_fail": "500"`` (any status >= 400): answer that status with a ``server_error`` body;
* ``"provider_break": "1"`` with ``stream: true``: send the opening events and the first delta, then
  close the connection abruptly (no terminal event, no ``[DONE]``);
* ``"provider_delay_ms": "50"`` with ``stream: true`` (responses): wait that long before each event.
  A streamed response whose client went away before its end is counted in
  ``ProviderState.disconnected``.

``POST /v1/messages`` answers as Anthropic's API does (x-api-key and anthropic-version required,
Anthropic's error bodies): see :mod:`standins.mock_anthropic`.

``ProviderConfig.flavour`` (``runmockprovider --flavour``) says whose API it plays beyond that:
``openai`` (the default, as above), ``xai`` (its models ``owned_by: xai``), ``anthropic`` (``GET
/v1/models`` asked and answered as Anthropic's: :mod:`standins.mock_anthropic`) or ``gemini`` (its
model list and ``POST /v1/interactions``: :mod:`standins.mock_gemini`).

Introspection, without auth and not recorded: ``GET /_provider/requests`` (every other request, newest
last, at most 200, each ``{method, path, query, headers (lowercase names), json}``), ``DELETE
/_provider/requests`` clears it.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from standins.mock_anthropic import ANTHROPIC_PATHS, CALL_MARKER as _CALL_MARKER, anthropic_models_route, anthropic_routes
from standins.mock_gemini import gemini_routes

__all__ = [
    "DEFAULT_API_KEY",
    "DEFAULT_MODELS",
    "FLAVOURS",
    "REQUEST_LOG_SIZE",
    "RESPONSE_CREATE_FIELDS",
    "ProviderConfig",
    "ProviderError",
    "ProviderState",
    "build_provider_app",
    "provider_state",
    "run_mock_provider",
]

DEFAULT_MODELS: tuple[str, ...] = ("gpt-4o-mini", "gpt-4.1")
DEFAULT_API_KEY = "sk-provider-test"
FLAVOURS = ("openai", "anthropic", "gemini", "xai")
"""Whose API the stand-in plays: how its /v1/models is asked and answered, and Gemini's Interactions."""
REQUEST_LOG_SIZE = 200
MODEL_CREATED = 1700000000
FUNCTION_CALL_TOKENS = 5
MIN_MAX_OUTPUT_TOKENS = 16  # OpenAI refuses max_output_tokens below 16

# The top-level fields of OpenAI's create-response request (CreateResponse in the OpenAPI document).
RESPONSE_CREATE_FIELDS = frozenset(
    {
        "background", "context_management", "conversation", "include", "input", "instructions",
        "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation", "parallel_tool_calls",
        "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
        "reasoning", "safety_identifier", "service_tier", "store", "stream", "stream_options", "temperature",
        "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    }
)  # fmt: skip
_INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")
_WORD = re.compile(r"\s*\S+")
_JSON_HEADERS = {"Content-Type": "application/json"}
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ProviderConfig:
    models: tuple[str, ...] = DEFAULT_MODELS
    api_key: str = DEFAULT_API_KEY
    flavour: str = "openai"

    def __post_init__(self) -> None:
        if self.flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}")
        object.__setattr__(self, "models", tuple(self.models))
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError("models must be a non-empty list of non-empty names")
        if not self.api_key:
            raise ValueError("api_key must not be empty")


@dataclass
class ProviderState:
    """The request log: every request but /_provider/*, newest last, at most REQUEST_LOG_SIZE."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    disconnected: int = 0  # streamed responses whose client left before their end

    def record(self, entry: dict[str, Any]) -> None:
        self.requests.append(entry)
        del self.requests[:-REQUEST_LOG_SIZE]


class ProviderError(Exception):
    """An OpenAI-style error answer: ``{"error": {message, type, param, code}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def response(self) -> web.Response:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return web.Response(body=orjson.dumps({"error": error}), status=self.status, headers=_JSON_HEADERS)


_STATE = web.AppKey("mock_provider_state", ProviderState)
_BODY = web.RequestKey("mock_provider_body", object)


def provider_state(app: web.Application) -> ProviderState:
    """The live request log of an app made by :func:`build_provider_app`."""
    return app[_STATE]


# --- small helpers ------------------------------------------------------------------------------


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), headers=_JSON_HEADERS)


def _hex() -> str:
    return os.urandom(12).hex()


def _words(text: str) -> int:
    return len(text.split())


def _chunks(text: str) -> list[str]:
    """The text cut into words, each with its leading whitespace; they concatenate back to ``text``."""
    chunks = _WORD.findall(text)
    if not chunks:
        return [text] if text else []
    tail = text[sum(map(len, chunks)) :]
    return [*chunks[:-1], chunks[-1] + tail]


def _truncate(text: str, limit: int | None) -> tuple[str, bool]:
    """``text`` cut to ``limit`` words, and whether it was cut."""
    chunks = _chunks(text)
    if limit is None or len(chunks) <= limit:
        return text, False
    return "".join(chunks[:limit]), True


def _model_not_found(model: str) -> ProviderError:
    message = f"The model `{model}` does not exist or you do not have access to it."
    return ProviderError(404, message, None, "model_not_found")


def _missing(name: str) -> ProviderError:
    return ProviderError(400, f"Missing required parameter: '{name}'.", name, "missing_required_parameter")


def _invalid_type(name: str, expected: str) -> ProviderError:
    return ProviderError(400, f"Invalid type for '{name}': expected {expected}.", name, "invalid_type")


def _check_model(body: dict[str, Any], config: ProviderConfig) -> str:
    model = body.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str):
        raise _invalid_type("model", "a string")
    if model not in config.models:
        raise _model_not_found(model)
    return model


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    metadata = body.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _check_fail(body: dict[str, Any]) -> None:
    """The ``provider_fail`` control: answer that status (>= 400) with a server_error."""
    value = _metadata(body).get("provider_fail")
    try:
        status = int(value) if value is not None else 0
    except (TypeError, ValueError):
        return
    if 400 <= status <= 599:
        raise ProviderError(status, "provider failure", None, None, "server_error")


def _breaks(body: dict[str, Any]) -> bool:
    return _metadata(body).get("provider_break") == "1"


def _body(request: web.Request) -> dict[str, Any]:
    body = request.get(_BODY)
    if not isinstance(body, dict):
        raise ProviderError(400, "We could not parse the JSON body of your request. Expected a JSON object.")
    return body


def _abort(request: web.Request) -> None:
    """Closes the connection: buffered bytes are flushed, then FIN, with no chunked terminator."""
    if request.transport is not None:
        request.transport.close()


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    return resp


# --- /v1/chat/completions -----------------------------------------------------------------------


def _content_text(content: Any, param: str) -> str:
    """A message's text: a string, or the concatenated text of its text parts (others are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid_type(param, "a string or an array of content parts")
    texts = []
    for part in content:
        if not isinstance(part, dict):
            raise _invalid_type(param, "an array of content parts")
        if part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "".join(texts)


def _chat_messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid_type("messages", "a non-empty array of messages")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid_type(f"messages[{i}]", "a message object with a role")
        parsed.append((message["role"], _content_text(message.get("content"), f"messages[{i}].content")))
    return parsed


def _chat_cap(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ProviderError(400, f"Invalid '{name}': expected an integer >= 1.", name, "invalid_value")
            return value
    return None


def _chat_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chat_chunk(rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
    }


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _chat_stream(
    request: web.Request, whole: dict[str, Any], include_usage: bool, broken: bool
) -> web.StreamResponse:
    rid, created, model = whole["id"], whole["created"], whole["model"]
    choice = whole["choices"][0]
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}
    resp = await _open_stream(request)
    opening = {"role": "assistant", "content": ""}
    await resp.write(_sse({**_chat_chunk(rid, created, model, opening, None), **usage_field}))
    for chunk in _chunks(choice["message"]["content"]):
        await resp.write(_sse({**_chat_chunk(rid, created, model, {"content": chunk}, None), **usage_field}))
        if broken:
            _abort(request)
            return resp
    await resp.write(_sse({**_chat_chunk(rid, created, model, {}, choice["finish_reason"]), **usage_field}))
    if include_usage:
        tail = {**_chat_chunk(rid, created, model, {}, None), "choices": [], "usage": whole["usage"]}
        await resp.write(_sse(tail))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _chat(request: web.Request, config: ProviderConfig) -> web.StreamResponse:
    body = _body(request)
    _check_fail(body)
    model = _check_model(body, config)
    messages = _chat_messages(body)
    heard = "heard: " + " | ".join(content for role, content in messages if role == "user")
    text, cut = _truncate(heard, _chat_cap(body))
    prompt_tokens = sum(_words(content) for _role, content in messages)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    whole: dict[str, Any] = {
        "id": "chatcmpl-" + _hex(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "service_tier": "default",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length" if cut else "stop"}],
        "usage": _chat_usage(prompt_tokens, _words(text)),
    }
    if body.get("stream"):
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return await _chat_stream(request, whole, include_usage, _breaks(body))
    return _json(whole)


# --- /v1/responses: the request -----------------------------------------------------------------


@dataclass(frozen=True)
class _Message:
    role: str
    text: str


@dataclass(frozen=True)
class _Call:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class _CallOutput:
    call_id: str
    text: str


_Item = _Message | _Call | _CallOutput


def _check_fields(body: dict[str, Any]) -> None:
    for name in body:
        if name not in RESPONSE_CREATE_FIELDS:
            raise ProviderError(400, f"Unknown parameter: '{name}'.", name, "unknown_parameter")
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            message = f"'{name}' is not supported by this provider stand-in: it keeps no state."
            raise ProviderError(400, message, name, "unsupported_parameter")
    if body.get("background"):
        message = "'background' is not supported by this provider stand-in: it keeps no state."
        raise ProviderError(400, message, "background", "unsupported_parameter")


def _max_output_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid_type("max_output_tokens", "an integer")
    if value < MIN_MAX_OUTPUT_TOKENS:
        message = (
            "Invalid 'max_output_tokens': integer below minimum value. "
            f"Expected a value >= {MIN_MAX_OUTPUT_TOKENS}, but got {value} instead."
        )
        raise ProviderError(400, message, "max_output_tokens", "integer_below_min_value")
    return value


def _instructions(body: dict[str, Any]) -> str | None:
    value = body.get("instructions")
    if value is not None and not isinstance(value, str):
        raise _invalid_type("instructions", "a string")
    return value


def _function_tools(body: dict[str, Any]) -> set[str]:
    tools = body.get("tools")
    if tools is None:
        return set()
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _invalid_type("tools", "an array of tool objects")
    return {t["name"] for t in tools if t.get("type") == "function" and isinstance(t.get("name"), str)}


def _invalid_input(message: str) -> ProviderError:
    return ProviderError(400, message, "input", "invalid_value")


def _output_text(output: Any) -> str:
    """A function_call_output's output: a string, or the concatenated text of its parts."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _content_text(output, "input")
    raise _invalid_type("input", "a string or an array of parts as a function_call_output's output")


def _string_field(item: dict[str, Any], name: str, kind: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _invalid_input(f"Invalid '{name}' in a {kind} input item: expected a string.")
    return value


def _parse_item(item: Any, calls: set[str]) -> _Item | None:
    """One input item (None for a reasoning item); ``calls`` collects the call_ids seen so far."""
    if not isinstance(item, dict):
        raise _invalid_type("input", "an array of input items")
    kind = item.get("type", "message")
    if kind not in _INPUT_ITEM_TYPES:
        supported = ", ".join(f"'{t}'" for t in _INPUT_ITEM_TYPES)
        raise _invalid_input(f"Invalid value: '{kind}'. Supported input item types are: {supported}.")
    if item.get("id") is not None:
        raise _invalid_input(
            f"Item with id '{item['id']}' not found. Items are not persisted when `store` is set to false. "
            "Try again with `store` set to true, or remove this item from your input."
        )
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise _invalid_input(f"Invalid value: '{role}'. Supported values are: {', '.join(_ROLES)}.")
        return _Message(role, _content_text(item.get("content"), "input"))
    if kind == "function_call":
        call = _Call(*(_string_field(item, name, kind) for name in ("call_id", "name", "arguments")))
        calls.add(call.call_id)
        return call
    if kind == "function_call_output":
        call_id = _string_field(item, "call_id", kind)
        if call_id not in calls:
            raise ProviderError(400, f"No tool call found for function call output with call_id {call_id}.", "input")
        return _CallOutput(call_id, _output_text(item.get("output")))
    return None  # reasoning: carried along, not read


def _parse_input(value: Any) -> list[_Item]:
    if value is None:
        raise _missing("input")
    if isinstance(value, str):
        return [_Message("user", value)]
    if not isinstance(value, list):
        raise _invalid_type("input", "a string or an array of input items")
    calls: set[str] = set()
    parsed = (_parse_item(item, calls) for item in value)
    return [item for item in parsed if item is not None]


def _item_text(item: _Item) -> str:
    return item.arguments if isinstance(item, _Call) else item.text


# --- /v1/responses: the scripted model and the response object ------------------------------------


def _script(items: list[_Item], tools: set[str], instructions: str | None) -> str | list[tuple[str, str]]:
    """The scripted model: a message's text, or the (name, arguments) of the function calls to make."""
    last = items[-1] if items else None
    if isinstance(last, _CallOutput):
        return "tool said: " + last.text
    user_texts = [item.text for item in items if isinstance(item, _Message) and item.role == "user"]
    if user_texts:
        calls = [(name, args) for name, args in _CALL_MARKER.findall(user_texts[-1]) if name in tools]
        if calls:
            return calls
    heard = "heard: " + " | ".join(user_texts)
    return f"[{instructions}] {heard}" if instructions is not None else heard


def _message_item(text: str, status: str) -> dict[str, Any]:
    return {
        "id": "msg_" + _hex(),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _function_call_item(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": "fc_" + _hex(),
        "type": "function_call",
        "status": "completed",
        "call_id": "call_" + _hex(),
        "name": name,
        "arguments": arguments,
    }


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _generate(body: dict[str, Any], items: list[_Item]) -> tuple[list[dict[str, Any]], int, bool]:
    """The output items, their output tokens, and whether max_output_tokens cut them."""
    limit = _max_output_tokens(body)
    decision = _script(items, _function_tools(body), _instructions(body))
    if not isinstance(decision, str):
        output = [_function_call_item(name, arguments) for name, arguments in decision]
        return output, FUNCTION_CALL_TOKENS * len(output), False
    text, cut = _truncate(decision, limit)
    return [_message_item(text, "incomplete" if cut else "completed")], _words(text), cut


def _response_object(
    body: dict[str, Any], model: str, output: list[dict[str, Any]], usage: dict[str, Any], cut: bool
) -> dict[str, Any]:
    """The whole, terminal response object; request fields are echoed (with OpenAI's defaults)."""
    now = int(time.time())
    status = "incomplete" if cut else "completed"
    reasoning = body.get("reasoning")
    return {
        "id": "resp_" + _hex(),
        "object": "response",
        "created_at": now,
        "status": status,
        "completed_at": now if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None, **(reasoning if isinstance(reasoning, dict) else {})},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


# --- /v1/responses: streaming -------------------------------------------------------------------


_Event = tuple[str, dict[str, Any]]


def _message_events(item: dict[str, Any], index: int) -> Iterator[_Event]:
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    part = item["content"][0]
    text = part["text"]
    yield "response.content_part.added", {**where, "part": {**part, "text": ""}}
    for chunk in _chunks(text):
        yield "response.output_text.delta", {**where, "delta": chunk, "logprobs": []}
    yield "response.output_text.done", {**where, "text": text, "logprobs": []}
    yield "response.content_part.done", {**where, "part": part}


def _function_call_events(item: dict[str, Any], index: int) -> Iterator[_Event]:
    where = {"item_id": item["id"], "output_index": index}
    arguments = item["arguments"]
    half = len(arguments) // 2
    for delta in (arguments[:half], arguments[half:]):
        yield "response.function_call_arguments.delta", {**where, "delta": delta}
    yield "response.function_call_arguments.done", {**where, "arguments": arguments, "name": item["name"]}


def _response_events(whole: dict[str, Any]) -> Iterator[_Event]:
    """OpenAI's event sequence for a finished response object (without sequence numbers)."""
    opening = {**whole, "status": "in_progress", "completed_at": None, "incomplete_details": None}
    opening.update(output=[], usage=None)
    yield "response.created", {"response": opening}
    yield "response.in_progress", {"response": opening}
    for index, item in enumerate(whole["output"]):
        if item["type"] == "message":
            started = {**item, "status": "in_progress", "content": []}
            yield "response.output_item.added", {"output_index": index, "item": started}
            yield from _message_events(item, index)
        else:
            started = {**item, "status": "in_progress", "arguments": ""}
            yield "response.output_item.added", {"output_index": index, "item": started}
            yield from _function_call_events(item, index)
        yield "response.output_item.done", {"output_index": index, "item": item}
    terminal = "response.completed" if whole["status"] == "completed" else "response.incomplete"
    yield terminal, {"response": whole}


def _event_block(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": sequence, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _delay_secs(body: dict[str, Any]) -> float:
    try:
        return max(0.0, float(_metadata(body).get("provider_delay_ms") or 0) / 1000)
    except (TypeError, ValueError):
        return 0.0


async def _responses_stream(request: web.Request, whole: dict[str, Any], broken: bool, delay: float) -> web.StreamResponse:
    """Writes (and so flushes) one event at a time, ``delay`` seconds apart; ``broken`` closes the
    connection after the first delta. A client that leaves first is counted."""
    resp = await _open_stream(request)
    try:
        for sequence, (kind, fields) in enumerate(_response_events(whole)):
            if delay:
                await asyncio.sleep(delay)
            await resp.write(_event_block(kind, sequence, fields))
            if broken and kind.endswith(".delta"):
                _abort(request)
                return resp
        await resp.write_eof()
    except ConnectionResetError:  # the client left: nothing more to write
        provider_state(request.app).disconnected += 1
    except asyncio.CancelledError:
        provider_state(request.app).disconnected += 1
        raise
    return resp


async def _responses(request: web.Request, config: ProviderConfig) -> web.StreamResponse:
    body = _body(request)
    _check_fail(body)
    _check_fields(body)
    model = _check_model(body, config)
    items = _parse_input(body.get("input"))
    output, output_tokens, cut = _generate(body, items)
    input_tokens = sum(_words(_item_text(item)) for item in items) + _words(body.get("instructions") or "")
    whole = _response_object(body, model, output, _usage(input_tokens, output_tokens), cut)
    if body.get("stream"):
        return await _responses_stream(request, whole, _breaks(body), _delay_secs(body))
    return _json(whole)


# --- the application ----------------------------------------------------------------------------


def _authorized(request: web.Request, api_key: str) -> bool:
    header = request.headers.get("Authorization", "")
    return header[:7].lower() == "bearer " and header[7:].strip() == api_key


async def _read_json(request: web.Request) -> Any:
    if not request.body_exists:
        return None
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return None


def _own_auth_paths(config: ProviderConfig) -> tuple[str, ...]:
    """The /v1 routes that check their own credentials (Anthropic's x-api-key), not a Bearer token."""
    return (*ANTHROPIC_PATHS, "/v1/models") if config.flavour == "anthropic" else ANTHROPIC_PATHS


def _middleware(config: ProviderConfig, state: ProviderState) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Records requests, checks the API key on /v1/*, and turns errors into OpenAI-style JSON."""

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        path = request.path
        try:
            if path.startswith("/_provider/"):
                return await handler(request)
            body = await _read_json(request)
            request[_BODY] = body
            headers = {name.lower(): value for name, value in request.headers.items()}
            state.record({
                "method": request.method, "path": path, "query": request.query_string, "headers": headers, "json": body,
            })  # fmt: skip
            if path.startswith("/v1/") and path not in _own_auth_paths(config) and not _authorized(request, config.api_key):
                raise ProviderError(401, "Incorrect API key provided.", None, "invalid_api_key")
            return await handler(request)
        except ProviderError as exc:
            return exc.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return ProviderError(exc.status, f"Invalid URL ({request.method} {path})").response()

    return middleware


def _routes(config: ProviderConfig) -> list[web.RouteDef]:
    owner = "xai" if config.flavour == "xai" else "mock-provider"
    cards = {
        name: {"id": name, "object": "model", "created": MODEL_CREATED, "owned_by": owner}
        for name in config.models
    }

    async def models(_request: web.Request) -> web.Response:
        return _json({"object": "list", "data": list(cards.values())})

    async def model(request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in cards:
            raise _model_not_found(name)
        return _json(cards[name])

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _chat(request, config)

    async def responses(request: web.Request) -> web.StreamResponse:
        return await _responses(request, config)

    if config.flavour == "anthropic":
        listing = anthropic_models_route(config.api_key, config.models)
    elif config.flavour == "gemini":
        listing, interactions = gemini_routes(config.models)
    else:
        listing = web.get("/v1/models", models)
    flavoured = [interactions] if config.flavour == "gemini" else []
    return [
        listing,
        *flavoured,
        web.get("/v1/models/{model:.+}", model),
        web.post("/v1/chat/completions", chat),
        web.post("/v1/responses", responses),
    ]


def _introspection_routes(state: ProviderState) -> list[web.RouteDef]:
    async def requests(_request: web.Request) -> web.Response:
        return _json(state.requests)

    async def clear(_request: web.Request) -> web.Response:
        state.requests.clear()
        return _json({"cleared": True})

    return [web.get("/_provider/requests", requests), web.delete("/_provider/requests", clear)]


def build_provider_app(config: ProviderConfig) -> web.Application:
    """The provider stand-in as an aiohttp application (serve it with any aiohttp runner)."""
    state = ProviderState()
    app = web.Application(middlewares=[_middleware(config, state)], client_max_size=64 * 1024 * 1024)
    app[_STATE] = state
    app.add_routes(_routes(config))
    app.add_routes(anthropic_routes(config.api_key, config.models))
    app.add_routes(_introspection_routes(state))
    return app


def run_mock_provider(config: ProviderConfig, host: str, port: int) -> None:
    """Serves until SIGINT/SIGTERM. Once listening, prints one line to stdout (flushed):
    ``mock provider serving M1, M2 on http://HOST:PORT``. Port 0 picks a free port, named in that line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=1024)
    url_host = f"[{host}]" if family == socket.AF_INET6 else host
    line = f"mock provider serving {', '.join(config.models)} on http://{url_host}:{sock.getsockname()[1]}\n"

    def announce(*_args: Any, **_kwargs: Any) -> None:  # replaces aiohttp's banner, after start-up
        sys.stdout.write(line)
        sys.stdout.flush()

    web.run_app(
        build_provider_app(config),
        sock=sock,
        access_log=None,
        print=announce,
        shutdown_timeout=1.0,
        handler_cancellation=True,
        loop=asyncio.new_event_loop(),
    )
