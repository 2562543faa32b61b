"""The stand-in provider's Anthropic side: ``POST /v1/messages`` answered the way Anthropic's API does,
served by :mod:`standins.mock_provider` (``manage.py runmockprovider``) beside its OpenAI routes, so
tests see the exact headers and bodies a real Anthropic API would receive (the provider's request
log records them).

- Authentication is Anthropic's: ``x-api-key`` must be the provider's key (401
  ``authentication_error`` otherwise; a Bearer token does not count), and ``anthropic-version`` is
  required (400 ``invalid_request_error``). Errors are Anthropic's body,
  ``{"type": "error", "error": {"type", "message"}}``.
- ``GET /v1/models`` (the ``anthropic`` flavour of the stand-in provider) answers Anthropic's list
  shape, a page of ``limit`` models (20 by default), with the same authentication.
- The model must be one of the provider's; ``max_tokens`` (an integer >= 1) and ``messages`` (a
  non-empty array) are required.
- The answer comes from a scripted model, deciding from the conversation:

  a) the last user text holds ``[[call:NAME {json input}]]`` markers naming custom tools the request
     offers, and fewer tool rounds ran than its ``[[rounds:N]]`` marker asks (1 without one; a round
     is a user message of tool_result blocks since that text) → one tool_use block per marker
     (``toolu_`` ids), stop_reason ``tool_use``;
  b) the last message answers tool calls → one text block ``"tool said: " + " | ".join(results)``;
  c) otherwise one text block ``"heard: " + " | ".join(user message texts)``.

  Words are tokens, and ``max_tokens`` cuts the text (stop_reason ``max_tokens``, else
  ``end_turn``). Streaming sends Anthropic's event sequence (message_start, then per block
  content_block_start, ping after the first, one text_delta per word or one input_json_delta,
  content_block_stop; message_delta with the usage, message_stop), each with an ``event:`` line.

Per-request controls, in the body's ``metadata``: ``"provider_fail": "529"`` (any status >= 400)
answers that status with an ``api_error`` body; ``"provider_break": "1"`` with ``stream: true``
closes the connection after the first delta; ``"provider_garble": "1"`` answers a whole request with
a 200 whose body is not a message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
from aiohttp import web

__all__ = ["ANTHROPIC_PATHS", "CALL_MARKER", "anthropic_models_route", "anthropic_routes"]

CALL_MARKER = re.compile(r"\[\[call:([\w.\-]+) (\{.*?\})\]\]")
"""``[[call:NAME {json}]]`` in a user text: the scripted models call tool NAME with that input."""
_ROUNDS_MARKER = re.compile(r"\[\[rounds:(\d+)\]\]")

ANTHROPIC_PATHS = ("/v1/messages",)
"""Routes that authenticate as Anthropic does (x-api-key), not with a Bearer token."""

_JSON_HEADERS = {"Content-Type": "application/json"}
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error", 529: "overloaded_error"}  # fmt: skip
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AnthropicError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> web.Response:
        kind = _ERROR_TYPES.get(self.status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": self.message}}
        return web.Response(body=orjson.dumps(body), status=self.status, headers=_JSON_HEADERS)


def _control(body: dict[str, Any], name: str) -> str | None:
    metadata = body.get("metadata")
    value = metadata.get(name) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None


def _user_texts(messages: list[Any]) -> list[str]:
    texts = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return texts


def _checked(request: web.Request, body: Any, api_key: str, models: tuple[str, ...]) -> dict[str, Any]:
    if request.headers.get("x-api-key") != api_key:
        raise AnthropicError(401, "invalid x-api-key")
    if not request.headers.get("anthropic-version"):
        raise AnthropicError(400, "anthropic-version: header is required")
    if not isinstance(body, dict):
        raise AnthropicError(400, "the request body must be a JSON object")
    if body.get("model") not in models:
        raise AnthropicError(404, f"model: {body.get('model')}")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise AnthropicError(400, "max_tokens: Field required to be an integer >= 1")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise AnthropicError(400, "messages: at least one message is required")
    fail = _control(body, "provider_fail")
    if fail is not None and fail.isdigit() and 400 <= int(fail) <= 599:
        raise AnthropicError(int(fail), "provider failure")
    return body


def _tool_results(message: Any) -> list[str] | None:
    """The result texts of a user message answering tool calls (None for any other message)."""
    content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
    if not isinstance(content, list):
        return None
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    if not results:
        return None
    texts = []
    for result in results:
        given = result.get("content")
        if isinstance(given, list):
            given = " ".join(str(b.get("text", "")) for b in given if isinstance(b, dict))
        texts.append(str(given or ""))
    return texts


def _script(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The scripted model's blocks (see the module's docstring)."""
    messages = body["messages"]
    offered = {t["name"] for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") in (None, "custom")
               and isinstance(t.get("name"), str)}  # fmt: skip
    rounds = 0
    for message in reversed(messages):  # user messages of tool results since the last other user message
        if isinstance(message, dict) and message.get("role") == "assistant":
            continue
        if _tool_results(message) is None:
            break
        rounds += 1
    texts = _user_texts(messages)
    if texts:
        wanted = _ROUNDS_MARKER.search(texts[-1])
        calls = [(name, args) for name, args in CALL_MARKER.findall(texts[-1]) if name in offered]
        if calls and rounds < (int(wanted.group(1)) if wanted else 1):
            return [{"type": "tool_use", "id": "toolu_" + os.urandom(12).hex(), "name": name, "input": orjson.loads(args)}
                    for name, args in calls]  # fmt: skip
    answered = _tool_results(messages[-1])
    text = "tool said: " + " | ".join(answered) if answered is not None else "heard: " + " | ".join(texts)
    return [{"type": "text", "text": text}]


def _message(body: dict[str, Any]) -> dict[str, Any]:
    blocks = _script(body)
    cut = False
    if blocks[0]["type"] == "text":
        words = blocks[0]["text"].split(" ")
        cut = len(words) > body["max_tokens"]
        blocks[0]["text"] = " ".join(words[: body["max_tokens"]])
        output_tokens = min(len(words), body["max_tokens"])
    else:
        output_tokens = len(blocks)
    return {
        "id": "msg_" + os.urandom(12).hex(), "type": "message", "role": "assistant", "model": body["model"],
        "content": blocks,
        "stop_reason": "tool_use" if blocks[0]["type"] == "tool_use" else "max_tokens" if cut else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": sum(len(t.split()) for t in _user_texts(body["messages"])),
                  "output_tokens": output_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }  # fmt: skip


def _event(kind: str, fields: dict[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


def _events(whole: dict[str, Any]) -> Iterator[bytes]:
    opening = {**whole, "content": [], "stop_reason": None, "usage": {**whole["usage"], "output_tokens": 0}}
    yield _event("message_start", {"message": opening})
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            yield _event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
            if index == 0:
                yield _event("ping", {})
            for i, word in enumerate(block["text"].split(" ")):
                yield _event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": word if i == 0 else " " + word}})  # fmt: skip
        else:
            yield _event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
            if index == 0:
                yield _event("ping", {})
            given = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
            yield _event("content_block_delta", {"index": index, "delta": given})
        yield _event("content_block_stop", {"index": index})
    delta = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    yield _event("message_delta", {"delta": delta, "usage": {"output_tokens": whole["usage"]["output_tokens"]}})
    yield _event("message_stop", {})


async def _stream(request: web.Request, whole: dict[str, Any], broken: bool) -> web.StreamResponse:
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    for event in _events(whole):
        await resp.write(event)
        if broken and event.startswith(b"event: content_block_delta"):
            if request.transport is not None:
                request.transport.close()  # flushed, then FIN: no terminal event
            return resp
    await resp.write_eof()
    return resp


MODEL_CREATED_AT = "2025-01-01T00:00:00Z"
_DEFAULT_PAGE = 20  # Anthropic lists 20 models a page unless asked for more (limit: 1 to 1000)


def anthropic_models_route(api_key: str, models: tuple[str, ...]) -> web.RouteDef:
    """``GET /v1/models`` as Anthropic answers it: x-api-key and anthropic-version required, one page
    of ``limit`` models (20 by default) in its shape, ``has_more`` telling whether more follow."""

    async def listing(request: web.Request) -> web.Response:
        if request.headers.get("x-api-key") != api_key:
            return AnthropicError(401, "invalid x-api-key").response()
        if not request.headers.get("anthropic-version"):
            return AnthropicError(400, "anthropic-version: header is required").response()
        limit_text = request.query.get("limit", str(_DEFAULT_PAGE))
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= 1000:
            return AnthropicError(400, "limit: Input should be between 1 and 1000").response()
        page = models[: int(limit_text)]
        data = [{"type": "model", "id": m, "display_name": m, "created_at": MODEL_CREATED_AT} for m in page]
        body = {"data": data, "has_more": len(models) > len(page),
                "first_id": page[0] if page else None, "last_id": page[-1] if page else None}  # fmt: skip
        return web.Response(body=orjson.dumps(body), headers=_JSON_HEADERS)

    return web.get("/v1/models", listing)


def anthropic_routes(api_key: str, models: tuple[str, ...]) -> list[web.RouteDef]:
    async def messages(request: web.Request) -> web.StreamResponse:
        try:
            body = _checked(request, orjson.loads(await request.read() or b"null"), api_key, models)
        except orjson.JSONDecodeError:
            return AnthropicError(400, "the request body is not valid JSON").response()
        except AnthropicError as error:
            return error.response()
        whole = _message(body)
        if body.get("stream") is True:
            return await _stream(request, whole, _control(body, "provider_break") == "1")
        if _control(body, "provider_garble") == "1":
            return web.Response(body=orjson.dumps({"type": "message", "content": "not blocks"}), headers=_JSON_HEADERS)
        return web.Response(body=orjson.dumps(whole), headers=_JSON_HEADERS)

    return [web.post("/v1/messages", messages)]
